#include "tools/coli/run_flags.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status/status.h"
#include "tools/coli/cli_args.h"

namespace coli::cli {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// All of an open stream; INVALID_ARGUMENT naming `what` on a read error.
absl::StatusOr<std::string> ReadAll(std::FILE* f, const std::string& what) {
  std::string text;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
  if (std::ferror(f)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", what, ": ", std::strerror(errno)));
  }
  return text;
}

}  // namespace

absl::StatusOr<bool> TakeCommonFlag(ArgReader& args, CommonFlags* f) {
  constexpr int64_t kMax = kMaxInt32;
  if (args.Is("--model")) {
    COLI_ASSIGN_OR_RETURN(f->model, args.Value());
    if (f->model.empty()) return absl::InvalidArgumentError("--model is empty: give a folder");
    f->model_given = true;
  } else if (args.Is("--host")) {
    COLI_ASSIGN_OR_RETURN(f->host, args.Value());
    COLI_RETURN_IF_ERROR(CheckGrpcAddress("--host", f->host, /*listening=*/false));
  } else if (args.Is("--temperature") || args.Is("--temp")) {
    COLI_ASSIGN_OR_RETURN(double t, args.Real(0, 100));
    f->sampling.set_temperature(static_cast<float>(t));
  } else if (args.Is("--top-p")) {
    COLI_ASSIGN_OR_RETURN(double p, args.Real(0, 1));
    f->sampling.set_top_p(static_cast<float>(p));
  } else if (args.Is("--top-k")) {
    // llama.cpp: 0 or less = off; the host's off is 0.
    COLI_ASSIGN_OR_RETURN(int64_t k, args.Int(-1, kMax));
    f->sampling.set_top_k(static_cast<int32_t>(std::max<int64_t>(k, 0)));
  } else if (args.Is("--seed") || args.Is("-s")) {
    const std::string flag = args.arg();
    COLI_ASSIGN_OR_RETURN(std::string v, args.Value());
    COLI_ASSIGN_OR_RETURN(std::optional<uint64_t> seed, ParseSeed(flag, v));
    f->seed_given = seed.has_value();
    f->sampling.set_seed(seed.value_or(0));
  } else if (args.IsFlag() && client::IsSamplingKnobFlag(args.arg())) {
    const std::string flag = args.arg();
    COLI_ASSIGN_OR_RETURN(std::string v, args.Value());
    COLI_RETURN_IF_ERROR(client::ParseSamplingKnobFlag(flag, v, &f->sampling));
  } else {
    return false;
  }
  return true;
}

absl::Status CheckLocalModelDir(const CommonFlags& flags, const std::string& model_dir) {
  if (!flags.host.empty()) return absl::OkStatus();
  const char* env = std::getenv("COLI_MODEL");
  const char* from = flags.model_given                    ? "--model"
                     : env != nullptr && *env != '\0' ? "COLI_MODEL"
                                                          : "the embedded tiny model";
  return CheckModelDir(from, model_dir);
}

std::string RunUsage() {
  return std::string(
      "usage: coli run [--model DIR] [--host ADDR] PROMPT [--ngen N] [flags]\n"
      "  PROMPT is the text itself (or -p TEXT), - (read stdin) or -f FILE / --file FILE\n"
      "  --model DIR        the model folder (default $COLI_MODEL, else the tiny test fixture)\n"
      "  --host ADDR        a running coli-host (default: a private one, started and stopped here)\n"
      "  --ngen N           tokens to generate (default 64; -1 = until the context is full or\n"
      "                     the model ends its turn)\n"
      "  --ids 1,2,3        a prompt of token ids instead of text; --print-ids prints the ids made\n"
      "  --chat             render PROMPT as one user turn with the model's chat template;\n"
      "                     --system TEXT, --no-think (reasoning goes to stderr)\n"
      "  --temperature T    0 = greedy (default); sampled runs get a random seed unless --seed S\n"
      "                     (-1 = random) is given\n"
      "  --top-p P  --top-k K  --min-p M  --logprobs K (0-20)\n"
      "  --frequency-penalty F  --presence-penalty P  --repetition-penalty R\n"
      "  --logit-bias ID=BIAS[,ID=BIAS...]\n"
      "  --ignore-eos       the model's stop tokens are never drawn: exactly --ngen tokens\n"
      "                     (benchmarks; llama.cpp's flag)\n"
      "  --min-tokens N     the stop tokens are not drawn before N tokens\n"
      "  --json-schema FILE | --json-object   enforce the output's form (with --chat, the answer's)\n"
      "  Flags take --flag VALUE or --flag=VALUE. Ctrl-C stops the reply (exit 130).\n");
}

absl::StatusOr<RunFlags> ParseRunFlags(int argc, char** argv) {
  RunFlags f;
  if (const char* t = std::getenv("COLI_TEMP"); t != nullptr && *t != '\0') {
    COLI_ASSIGN_OR_RETURN(double temperature, ParseRealNumber("COLI_TEMP", t, 0, 100));
    f.sampling.set_temperature(static_cast<float>(temperature));
  }
  bool system_given = false, no_think_given = false;
  int prompt_sources = 0;
  ArgReader args(argc, argv);
  while (args.Next()) {
    COLI_ASSIGN_OR_RETURN(bool taken, TakeCommonFlag(args, &f));
    if (taken) continue;
    if (args.Is("--help") || args.Is("-h")) {
      f.help = true;
      return f;
    } else if (args.Is("--ngen") || args.Is("-n")) {
      COLI_ASSIGN_OR_RETURN(int64_t n, args.Int(-1, kMaxInt32));
      if (n == 0) {
        return absl::InvalidArgumentError(
            "--ngen 0 would generate nothing: give N >= 1, or -1 to generate until the context "
            "is full or the model ends its turn");
      }
      f.ngen = n < 0 ? 0 : static_cast<int32_t>(n);  // the host's 0 = up to the context
    } else if (args.Is("--ignore-eos")) {  // llama.cpp's flag
      COLI_RETURN_IF_ERROR(args.NoValue());
      f.sampling.set_ignore_eos(true);
    } else if (args.Is("--min-tokens")) {
      COLI_ASSIGN_OR_RETURN(int64_t n, args.Int(0, kMaxInt32));
      f.sampling.set_min_tokens(static_cast<int32_t>(n));
    } else if (args.Is("--ids")) {
      COLI_ASSIGN_OR_RETURN(std::string list, args.Value());
      for (absl::string_view piece : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
        COLI_ASSIGN_OR_RETURN(
            int64_t id, ParseWholeNumber("--ids", std::string(piece), 0, kMaxInt32));
        f.ids.push_back(static_cast<int32_t>(id));
      }
      if (f.ids.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--ids '", list, "' has no token ids (e.g. 1,2,3)"));
      }
      ++prompt_sources;
    } else if (args.Is("--prompt") || args.Is("-p")) {  // llama.cpp's -p
      COLI_ASSIGN_OR_RETURN(f.prompt, args.Value());
      f.have_prompt = true;
      ++prompt_sources;
    } else if (args.Is("--file") || args.Is("-f")) {
      COLI_ASSIGN_OR_RETURN(f.prompt_file, args.Value());
      if (f.prompt_file.empty()) return absl::InvalidArgumentError("--file is empty");
      f.have_prompt = true;
      ++prompt_sources;
    } else if (args.Is("--print-ids")) {
      COLI_RETURN_IF_ERROR(args.NoValue());
      f.print_ids = true;
    } else if (args.Is("--chat")) {
      COLI_RETURN_IF_ERROR(args.NoValue());
      f.chat = true;
    } else if (args.Is("--system")) {
      COLI_ASSIGN_OR_RETURN(f.system, args.Value());
      system_given = true;
    } else if (args.Is("--no-think")) {
      COLI_RETURN_IF_ERROR(args.NoValue());
      f.think = false;
      no_think_given = true;
    } else if (args.Is("--json-object")) {
      COLI_RETURN_IF_ERROR(args.NoValue());
      f.json_object = true;
    } else if (args.Is("--json-schema")) {
      COLI_ASSIGN_OR_RETURN(f.json_schema_path, args.Value());
    } else if (args.Is("--logprobs")) {
      COLI_ASSIGN_OR_RETURN(int64_t k, args.Int(0, 20));
      f.sampling.set_logprobs(static_cast<int32_t>(k));
    } else if (!args.IsFlag() || args.arg() == "-") {
      // Positional: the prompt ("-" = stdin).
      (args.arg() == "-" ? f.prompt_file : f.prompt) = args.arg();
      f.have_prompt = true;
      ++prompt_sources;
    } else {
      return args.Unknown();
    }
  }
  if (prompt_sources > 1) {
    return absl::InvalidArgumentError(
        "more than one prompt given: give one of \"TEXT\", - (stdin), -f FILE or --ids (quote a "
        "prompt with spaces)");
  }
  if (prompt_sources == 0) {
    return absl::InvalidArgumentError(
        "no prompt: give \"TEXT\", - (read stdin), -f FILE or --ids 1,2,3");
  }
  if (f.chat && !f.ids.empty()) {
    return absl::InvalidArgumentError("--chat takes a text prompt, not --ids");
  }
  if (!f.chat && system_given) {
    return absl::InvalidArgumentError("--system needs --chat (a plain prompt has no system turn)");
  }
  if (!f.chat && no_think_given) {
    return absl::InvalidArgumentError("--no-think needs --chat (a plain prompt has no template)");
  }
  if (f.json_object && !f.json_schema_path.empty()) {
    return absl::InvalidArgumentError("give --json-schema FILE or --json-object, not both");
  }
  COLI_RETURN_IF_ERROR(CheckUtf8("--system", f.system));
  return f;
}

absl::StatusOr<std::string> ReadPrompt(const RunFlags& flags) {
  std::string text, from;
  if (flags.prompt_file.empty()) {
    text = flags.prompt;
    from = "the prompt";
  } else if (flags.prompt_file == "-") {
    COLI_ASSIGN_OR_RETURN(text, ReadAll(stdin, "the prompt from stdin"));
    from = "the prompt read from stdin";
  } else {
    const std::string& path = flags.prompt_file;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      return absl::NotFoundError(
          absl::StrCat("--file '", path, "': ", std::strerror(errno)));
    }
    if (S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat("--file '", path, "' is a folder"));
    }
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("--file '", path, "': ", std::strerror(errno)));
    }
    absl::StatusOr<std::string> read = ReadAll(f, absl::StrCat("--file '", path, "'"));
    std::fclose(f);
    COLI_ASSIGN_OR_RETURN(text, std::move(read));
    from = absl::StrCat("--file '", path, "'");
  }
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat(from, " is empty"));
  COLI_RETURN_IF_ERROR(CheckUtf8(from, text));
  return text;
}

}  // namespace coli::cli
