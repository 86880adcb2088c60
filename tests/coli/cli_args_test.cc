// The command-line pieces the `coli` subcommands share (tools/coli/cli_args.h) and `coli run`'s
// flags (tools/coli/run_flags.h): every refusal names the flag and the value.
#include "tools/coli/cli_args.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tools/coli/run_flags.h"

namespace coli::cli {
namespace {

// argv for a parser: {"run", args...}.
class Argv {
 public:
  explicit Argv(std::vector<std::string> args) : strings_(std::move(args)) {
    strings_.insert(strings_.begin(), "run");
    for (std::string& s : strings_) pointers_.push_back(s.data());
    pointers_.push_back(nullptr);
  }
  int argc() const { return static_cast<int>(strings_.size()); }
  char** argv() { return pointers_.data(); }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> pointers_;
};

absl::StatusOr<RunFlags> Parse(std::vector<std::string> args) {
  Argv a(std::move(args));
  return ParseRunFlags(a.argc(), a.argv());
}

// The parse fails and its message contains `needle`.
void ExpectRefused(std::vector<std::string> args, const std::string& needle) {
  std::string joined;
  for (const std::string& a : args) joined += a + " ";
  absl::StatusOr<RunFlags> f = Parse(std::move(args));
  ASSERT_FALSE(f.ok()) << joined;
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << joined;
  EXPECT_TRUE(absl::StrContains(f.status().message(), needle))
      << joined << "-> " << f.status().message();
}

TEST(ArgReader, TakesBothValueForms) {
  Argv a({"--ngen", "5", "--ngen=7", "--model=", "--model", "--x", "--", "--literal", "-"});
  ArgReader r(a.argc(), a.argv());
  ASSERT_TRUE(r.Next());
  EXPECT_TRUE(r.Is("--ngen"));
  EXPECT_EQ(*r.Int(1, 10), 5);
  ASSERT_TRUE(r.Next());
  EXPECT_TRUE(r.Is("--ngen"));
  EXPECT_EQ(*r.Int(1, 10), 7);
  ASSERT_TRUE(r.Next());
  EXPECT_TRUE(r.Is("--model"));
  EXPECT_EQ(*r.Value(), "");  // "--model=" is an explicit empty value
  ASSERT_TRUE(r.Next());
  absl::StatusOr<std::string> forgotten = r.Value();  // "--model --x": the value was forgotten
  ASSERT_FALSE(forgotten.ok());
  EXPECT_TRUE(absl::StrContains(forgotten.status().message(), "--model needs a value"));
  EXPECT_TRUE(absl::StrContains(forgotten.status().message(), "--model=--x"));
  ASSERT_TRUE(r.Next());  // --x itself
  EXPECT_TRUE(r.IsFlag());
  ASSERT_TRUE(r.Next());  // after "--" everything is positional
  EXPECT_EQ(r.arg(), "--literal");
  EXPECT_FALSE(r.IsFlag());
  EXPECT_FALSE(r.Is("--literal"));
  ASSERT_TRUE(r.Next());
  EXPECT_EQ(r.arg(), "-");
  EXPECT_FALSE(r.IsFlag());
  EXPECT_FALSE(r.Next());
}

TEST(ArgReader, MissingValueAndSwitchWithValue) {
  Argv a({"--print-ids=yes", "--ngen"});
  ArgReader r(a.argc(), a.argv());
  ASSERT_TRUE(r.Next());
  EXPECT_TRUE(absl::StrContains(r.NoValue().message(), "--print-ids takes no value"));
  ASSERT_TRUE(r.Next());
  EXPECT_EQ(r.Value().status().message(), "--ngen needs a value");
}

TEST(ArgReader, NegativeNumbersAreNotFlags) {
  Argv a({"-5", "-0.5", "-f", "-"});
  ArgReader r(a.argc(), a.argv());
  ASSERT_TRUE(r.Next());
  EXPECT_FALSE(r.IsFlag());
  ASSERT_TRUE(r.Next());
  EXPECT_FALSE(r.IsFlag());
  ASSERT_TRUE(r.Next());
  EXPECT_TRUE(r.IsFlag());
  ASSERT_TRUE(r.Next());
  EXPECT_FALSE(r.IsFlag());
}

TEST(ArgReader, WantsHelpAnywhereBeforeDashes) {
  Argv help({"--json", "-h"});
  EXPECT_TRUE(WantsHelp(help.argc(), help.argv()));
  Argv late({"--json", "--", "--help"});
  EXPECT_FALSE(WantsHelp(late.argc(), late.argv()));
  Argv none({"--json", "--helpful"});
  EXPECT_FALSE(WantsHelp(none.argc(), none.argv()));
}

void NoteSignal(int) {}

TEST(Signals, AnIgnoredSignalStaysIgnored) {
  // `nohup coli run …` ignores SIGHUP; catching it would end the run when the terminal closes.
  struct sigaction saved_hup = {}, saved_usr = {};
  sigaction(SIGHUP, nullptr, &saved_hup);
  sigaction(SIGUSR1, nullptr, &saved_usr);
  signal(SIGHUP, SIG_IGN);
  CatchUnlessIgnored(SIGHUP, NoteSignal);
  struct sigaction now = {};
  sigaction(SIGHUP, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
  signal(SIGUSR1, SIG_DFL);
  CatchUnlessIgnored(SIGUSR1, NoteSignal);
  sigaction(SIGUSR1, nullptr, &now);
  EXPECT_EQ(now.sa_handler, &NoteSignal);
  EXPECT_EQ(now.sa_flags & SA_RESTART, 0);
  sigaction(SIGHUP, &saved_hup, nullptr);
  sigaction(SIGUSR1, &saved_usr, nullptr);
}

// After its cleanup a command that caught Ctrl-C dies of SIGINT (a calling shell's loop stops
// too); other codes are plain exits.
TEST(Signals, ACaughtSignalEndsTheProcessAsThatSignal) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      signal(sig, NoteSignal);  // as run / chat leave it
      _exit(ExitLikeSignal(128 + sig) == 128 + sig ? 100 : 101);  // only if it did not die
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status)) << "signal " << sig << ": exit " << WEXITSTATUS(status);
    if (WIFSIGNALED(status)) {
      EXPECT_EQ(WTERMSIG(status), sig);
    }
  }
  EXPECT_EQ(ExitLikeSignal(0), 0);
  EXPECT_EQ(ExitLikeSignal(2), 2);
  EXPECT_EQ(ExitLikeSignal(128 + SIGPIPE), 128 + SIGPIPE);  // a closed pipe stays a quiet exit
}

TEST(Numbers, WholeNumbersSayWhatIsWrong) {
  EXPECT_EQ(*ParseWholeNumber("--n", "-1", -1, 5), -1);
  EXPECT_EQ(ParseWholeNumber("--n", "1e9", 0, 5).status().message(),
            "--n: '1e9' is not a whole number");
  EXPECT_EQ(ParseWholeNumber("--n", "3.5", 0, 5).status().message(),
            "--n: '3.5' is not a whole number");
  EXPECT_EQ(ParseWholeNumber("--n", "abc", 0, 5).status().message(), "--n: 'abc' is not a number");
  EXPECT_EQ(ParseWholeNumber("--n", "", 0, 5).status().message(), "--n: '' is not a number");
  EXPECT_EQ(ParseWholeNumber("--n", "99999999999999999999999", 0, 5).status().message(),
            "--n: '99999999999999999999999' is outside [0, 5]");
  EXPECT_EQ(ParseWholeNumber("--n", "6", 0, 5).status().message(), "--n: '6' is outside [0, 5]");
}

TEST(Numbers, RealsMustBeFiniteAndInRange) {
  EXPECT_DOUBLE_EQ(*ParseRealNumber("--t", "0.7", 0, 2), 0.7);
  EXPECT_EQ(ParseRealNumber("--t", "nan", 0, 2).status().message(),
            "--t: 'nan' is not a finite number");
  EXPECT_EQ(ParseRealNumber("--t", "inf", 0, 2).status().message(),
            "--t: 'inf' is not a finite number");
  EXPECT_EQ(ParseRealNumber("--t", "1e999", 0, 2).status().message(),
            "--t: '1e999' is not a finite number");
  EXPECT_EQ(ParseRealNumber("--t", "-1", 0, 2).status().message(), "--t: '-1' is outside [0, 2]");
  EXPECT_EQ(ParseRealNumber("--t", "warm", 0, 2).status().message(),
            "--t: 'warm' is not a number");
}

TEST(Numbers, SeedsTakeTheWholeRangeAndMinusOneIsRandom) {
  EXPECT_EQ(**ParseSeed("--seed", "18446744073709551615"), 18446744073709551615ull);
  EXPECT_EQ(**ParseSeed("--seed", "0"), 0u);
  EXPECT_FALSE(ParseSeed("--seed", "-1")->has_value());
  EXPECT_FALSE(ParseSeed("--seed", "18446744073709551616").ok());
  EXPECT_FALSE(ParseSeed("--seed", "-2").ok());
  EXPECT_FALSE(ParseSeed("--seed", "x").ok());
}

TEST(Utf8, FindsTheFirstBadByte) {
  EXPECT_FALSE(FirstInvalidUtf8("plain ascii").has_value());
  EXPECT_FALSE(FirstInvalidUtf8("h\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80").has_value());
  EXPECT_EQ(FirstInvalidUtf8("bad \xFF byte"), 4u);
  EXPECT_EQ(FirstInvalidUtf8("cut \xC3"), 4u);               // truncated sequence
  EXPECT_EQ(FirstInvalidUtf8("\xC0\xAF"), 0u);               // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8("x\xED\xA0\x80"), 1u);          // a surrogate
  EXPECT_EQ(FirstInvalidUtf8("\xF4\x90\x80\x80"), 0u);       // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("\xE2\x82"), 0u);
  EXPECT_EQ(CheckUtf8("the prompt", "ab\xFF").message(),
            "the prompt is not valid UTF-8: byte 0xFF at offset 2 (is the terminal or file in "
            "another encoding?)");
}

TEST(Paths, ModelDirNamesWhatIsWrong) {
  char dir_template[] = "/tmp/cli_args_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string file = dir + "/config.json";
  std::ofstream(file) << "{}";
  EXPECT_TRUE(CheckModelDir("--model", dir).ok());
  EXPECT_EQ(CheckModelDir("--model", "").message(), "--model is empty: give a folder");
  EXPECT_EQ(CheckModelDir("--model", dir + "/nope").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(CheckModelDir("--model", dir + "/nope").message(),
                                "no such folder"));
  EXPECT_TRUE(absl::StrContains(CheckModelDir("--model", file).message(),
                                "is a file, not a folder"));
  std::remove(file.c_str());
  rmdir(dir.c_str());
}

TEST(Paths, ExpandsHome) {
  const char* old = std::getenv("HOME");
  const std::string saved = old ? old : "";
  setenv("HOME", "/home/someone", 1);
  EXPECT_EQ(ExpandHome("~/x.json"), "/home/someone/x.json");
  EXPECT_EQ(ExpandHome("~"), "/home/someone");
  EXPECT_EQ(ExpandHome("~other/x"), "~other/x");
  EXPECT_EQ(ExpandHome("/abs/~/x"), "/abs/~/x");
  if (old) setenv("HOME", saved.c_str(), 1);
}

TEST(Errors, HostTokensBecomeSentences) {
  EXPECT_EQ(DescribeError(absl::ResourceExhaustedError(
                "CONTEXT_EXCEEDED prompt_tokens=402 capacity=64")),
            "the prompt is 402 tokens but the context holds 64 (shorten the prompt, or raise "
            "K3_MAXT)");
  EXPECT_EQ(DescribeError(absl::ResourceExhaustedError(
                "CONTEXT_EXCEEDED prompt_tokens=42 capacity=42")),
            "the prompt fills the whole context (42 tokens), leaving no room for a reply "
            "(shorten the prompt, or raise K3_MAXT)");
  EXPECT_EQ(DescribeError(absl::InvalidArgumentError("EMPTY_PROMPT")), "the prompt is empty");
  EXPECT_EQ(DescribeError(absl::UnimplementedError("")), "UNIMPLEMENTED");
  EXPECT_EQ(DescribeError(absl::NotFoundError("no such model")), "no such model");
}

// ---- coli run's flags -------------------------------------------------------------------------

TEST(RunFlags, Defaults) {
  unsetenv("COLI_TEMP");
  unsetenv("K3_THINK");
  absl::StatusOr<RunFlags> f = Parse({"hello"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->prompt, "hello");
  EXPECT_EQ(f->ngen, 64);
  EXPECT_FALSE(f->seed_given);
  EXPECT_FALSE(f->think.has_value());  // the request defaults' or the family's
}

// The think choice of the flags: --no-think only. K3_THINK is kimi_k3's request default (ABI
// 1.10), read with the host's tables after connecting (ModelOptionsEnv.KimiK3Declares…), not here.
TEST(RunFlags, ThinkIsUnsetUnlessNoThinkIsGiven) {
  unsetenv("COLI_TEMP");
  setenv("K3_THINK", "0", 1);
  absl::StatusOr<RunFlags> plain = Parse({"--chat", "hello"});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->think.has_value());
  setenv("K3_THINK", "no", 1);  // not this parser's to refuse
  absl::StatusOr<RunFlags> off = Parse({"--chat", "--no-think", "hello"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->think, std::optional<bool>(false));
  unsetenv("K3_THINK");
}

TEST(RunFlags, NgenMinusOneIsUntilTheContextAndZeroIsRefused) {
  EXPECT_EQ(Parse({"hi", "--ngen", "-1"})->ngen, 0);  // the host's "up to the context"
  EXPECT_EQ(Parse({"hi", "--ngen=3"})->ngen, 3);
  EXPECT_EQ(Parse({"hi", "-n", "2"})->ngen, 2);
  ExpectRefused({"hi", "--ngen", "0"}, "--ngen 0 would generate nothing");
  ExpectRefused({"hi", "--ngen", "-2"}, "--ngen: '-2' is outside [-1, 2147483647]");
  ExpectRefused({"hi", "--ngen", "1e9"}, "'1e9' is not a whole number");
  ExpectRefused({"hi", "--ngen", "99999999999"}, "is outside [-1, 2147483647]");
  ExpectRefused({"hi", "--ngen"}, "--ngen needs a value");
}

TEST(RunFlags, SamplingValuesAreCheckedHere) {
  ExpectRefused({"hi", "--temperature", "nan"}, "--temperature: 'nan' is not a finite number");
  ExpectRefused({"hi", "--temperature", "-1"}, "--temperature: '-1' is outside [0, 100]");
  ExpectRefused({"hi", "--temperature", "inf"}, "not a finite number");
  ExpectRefused({"hi", "--top-p", "2"}, "--top-p: '2' is outside [0, 1]");
  ExpectRefused({"hi", "--top-p", "nan"}, "--top-p: 'nan' is not a finite number");
  ExpectRefused({"hi", "--logprobs", "100"}, "--logprobs: '100' is outside [0, 20]");
  ExpectRefused({"hi", "--logprobs", "-1"}, "--logprobs: '-1' is outside [0, 20]");
  ExpectRefused({"hi", "--top-k", "-5"}, "--top-k: '-5' is outside");
  ExpectRefused({"hi", "--seed", "99999999999999999999999"}, "is not a seed");
  ExpectRefused({"hi", "--min-p", "x"}, "--min-p: 'x' is not a number");
  EXPECT_EQ(Parse({"hi", "--top-k", "-1"})->sampling.top_k(), 0);  // llama.cpp's "off"
  EXPECT_FLOAT_EQ(Parse({"hi", "--temp=0.5"})->sampling.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(Parse({"hi", "--min-p=0.25"})->sampling.min_p(), 0.25f);
  absl::StatusOr<RunFlags> seeded = Parse({"hi", "--seed", "18446744073709551615"});
  ASSERT_TRUE(seeded.ok());
  EXPECT_TRUE(seeded->seed_given);
  EXPECT_EQ(seeded->sampling.seed(), 18446744073709551615ull);
  EXPECT_FALSE(Parse({"hi", "--seed", "-1"})->seed_given);  // random
  setenv("COLI_TEMP", "hot", 1);
  ExpectRefused({"hi"}, "COLI_TEMP: 'hot' is not a number");
  unsetenv("COLI_TEMP");
}

TEST(RunFlags, PromptSources) {
  ExpectRefused({}, "no prompt");
  ExpectRefused({"hello", "world"}, "more than one prompt given");
  ExpectRefused({"hi", "--ids", "1,2"}, "more than one prompt given");
  ExpectRefused({"-", "-f", "x.txt"}, "more than one prompt given");
  ExpectRefused({"--ids", ","}, "has no token ids");
  ExpectRefused({"--ids", ""}, "has no token ids");
  ExpectRefused({"--ids", "1,junk"}, "--ids: 'junk' is not a number");
  ExpectRefused({"--ids", "-5"}, "--ids: '-5' is outside [0, 2147483647]");
  ExpectRefused({"--chat", "--ids", "1"}, "--chat takes a text prompt");
  ExpectRefused({"-x"}, "unknown flag '-x'");
  ExpectRefused({"hi", "--bogus"}, "unknown flag '--bogus'");
  ExpectRefused({"hi", "--model", ""}, "--model is empty");
  ExpectRefused({"hi", "--model="}, "--model is empty");
  EXPECT_EQ(Parse({"-"})->prompt_file, "-");
  EXPECT_EQ(Parse({"-f", "p.txt"})->prompt_file, "p.txt");
  EXPECT_EQ(Parse({"-p", "-starts with a dash"})->prompt, "-starts with a dash");  // llama.cpp
  EXPECT_EQ(Parse({"--prompt=x"})->prompt, "x");
  ExpectRefused({"-p", "x", "y"}, "more than one prompt given");
  EXPECT_EQ(Parse({"--", "-starts with a dash"})->prompt, "-starts with a dash");
  EXPECT_EQ(Parse({"-5"})->prompt, "-5");
  EXPECT_EQ(Parse({"--ids", "1, 2,3"})->ids, (std::vector<int32_t>{1, 2, 3}));
}

TEST(RunFlags, ChatOnlyFlagsNeedChat) {
  ExpectRefused({"hi", "--system", "x"}, "--system needs --chat");
  ExpectRefused({"hi", "--no-think"}, "--no-think needs --chat");
  ExpectRefused({"hi", "--chat", "--system", "\xC3"}, "--system is not valid UTF-8");
  ExpectRefused({"hi", "--json-object", "--json-schema", "s.json"}, "not both");
  ExpectRefused({"hi", "--chat=yes"}, "--chat takes no value");
  absl::StatusOr<RunFlags> f = Parse({"hi", "--chat", "--system=be brief", "--no-think"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->system, "be brief");
  EXPECT_EQ(f->think, std::optional<bool>(false));
}

TEST(RunFlags, HelpWinsOverEverythingElse) {
  EXPECT_TRUE(Parse({"--help"})->help);
  EXPECT_TRUE(Parse({"-h", "--bogus"})->help);
  EXPECT_TRUE(absl::StrContains(RunUsage(), "-f FILE"));
}

TEST(ReadPrompt, FromTextFileAndRefusals) {
  RunFlags f;
  f.prompt = "hello";
  EXPECT_EQ(*ReadPrompt(f), "hello");
  f.prompt = "";
  EXPECT_EQ(ReadPrompt(f).status().message(), "the prompt is empty");
  f.prompt = "bad \xFF";
  EXPECT_TRUE(absl::StrContains(ReadPrompt(f).status().message(),
                                "the prompt is not valid UTF-8: byte 0xFF at offset 4"));
  char path[] = "/tmp/cli_args_prompt.XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "from a file\nline 2\n", 19), 19);
  close(fd);
  f.prompt_file = path;
  EXPECT_EQ(*ReadPrompt(f), "from a file\nline 2\n");
  f.prompt_file = "/nonexistent/prompt.txt";
  EXPECT_EQ(ReadPrompt(f).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(ReadPrompt(f).status().message(), "/nonexistent/prompt.txt"));
  f.prompt_file = "/tmp";
  EXPECT_TRUE(absl::StrContains(ReadPrompt(f).status().message(), "is a folder"));
  std::remove(path);
}

}  // namespace
}  // namespace coli::cli
