// `coli perplexity`: a text's perplexity under the model, as llama.cpp's `llama-perplexity`
// computes it — the whole text tokenized, cut into chunks of --ctx tokens, each chunk read on
// its own and scored on its second half (every token from ctx/2 + 1 on, predicted from the
// tokens before it in the chunk). The prompt logprobs come from the host (plugin ABI 1.7,
// GenerateRequest.prompt_logprobs + prompt_only), so the figure is the model's as it serves.
//
//   coli perplexity [--model DIR] [--host ADDR] [--ctx N] [--chunks N] [--json] FILE|-
//
// Use it to check a quantization (K3_BITS=4 against 8) or a build against a reference figure.
// Per-chunk running estimates go to stderr ("[1]12.3456,[2]..."); the result to stdout:
// "PPL = X +/- E over N scored tokens (C chunks of CTX)", or with --json one object
// {"ppl", "ppl_stderr", "nll", "tokens", "scored", "chunks", "ctx"}. The uncertainty is
// llama.cpp's: PPL x the standard error of the mean negative log-likelihood. Ctrl-C cancels.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "tools/coli/cli_args.h"
#include "tools/coli/client.h"
#include "tools/coli/command.h"

namespace coli::cli {
namespace {

constexpr const char* kUsage =
    "usage: coli perplexity [--model DIR] [--host ADDR] [--ctx N] [--chunks N] [--json] FILE|-\n"
    "  the perplexity of FILE's text (- = stdin) as llama.cpp's llama-perplexity computes it:\n"
    "  chunks of --ctx tokens, each scored on its second half\n"
    "  --model DIR   the model (default $COLI_MODEL, else the embedded tiny fixture)\n"
    "  --host ADDR   a running coli-host (default: a private one)\n"
    "  --ctx N       tokens per chunk, 4 or more (default 512)\n"
    "  --chunks N    score at most N chunks (default: every whole chunk of the text)\n"
    "  --json        print one JSON object instead of the line\n"
    "  The K3_* switches apply as for coli run (K3_BITS=4 to measure int4's cost).\n";

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal.store(sig); }

int UsageError(const std::string& why) {
  std::fprintf(stderr, "coli perplexity: %s\n(coli perplexity --help lists the flags)\n",
               why.c_str());
  return 2;
}

int Fail(const std::string& why) {
  std::fprintf(stderr, "coli perplexity: %s\n", why.c_str());
  return 1;
}

// Running sums of the scored tokens' negative log-likelihoods.
struct Score {
  double nll = 0, nll2 = 0;
  int64_t count = 0;
  double Mean() const { return count > 0 ? nll / static_cast<double>(count) : 0; }
  double Ppl() const { return std::exp(Mean()); }
  // PPL x the standard error of the mean NLL (llama.cpp's estimate).
  double PplError() const {
    if (count < 2) return 0;
    const double mean = Mean();
    const double variance = nll2 / static_cast<double>(count) - mean * mean;
    return Ppl() * std::sqrt(std::max(0.0, variance) / static_cast<double>(count - 1));
  }
};

int RunPerplexity(int argc, char** argv) {
  std::string model_flag, host, path;
  bool model_given = false, path_given = false, json = false;
  int64_t ctx = 512, max_chunks = 0;
  ArgReader args(argc, argv);
  while (args.Next()) {
    absl::Status bad;
    if (args.Is("--model")) {
      absl::StatusOr<std::string> v = args.NonEmptyValue("DIR");
      if (!v.ok()) return UsageError(std::string(v.status().message()));
      model_flag = *v;
      model_given = true;
    } else if (args.Is("--host")) {
      absl::StatusOr<std::string> v = args.NonEmptyValue("ADDR");
      if (!v.ok()) return UsageError(std::string(v.status().message()));
      host = *v;
      bad = CheckGrpcAddress("--host", host, /*listening=*/false);
    } else if (args.Is("--ctx")) {
      absl::StatusOr<int64_t> v = args.Int(4, 1 << 24);
      if (!v.ok()) return UsageError(std::string(v.status().message()));
      ctx = *v;
    } else if (args.Is("--chunks")) {
      absl::StatusOr<int64_t> v = args.Int(1, 1 << 30);
      if (!v.ok()) return UsageError(std::string(v.status().message()));
      max_chunks = *v;
    } else if (args.Is("--json")) {
      bad = args.NoValue();
      json = true;
    } else if (args.Is("-h") || args.Is("--help")) {
      std::printf("%s", kUsage);
      return 0;
    } else if (args.IsFlag()) {
      return UsageError(std::string(args.Unknown().message()));
    } else if (path_given) {
      return UsageError("one FILE only (got '" + path + "' and '" + args.arg() + "')");
    } else {
      path = args.arg();
      path_given = true;
    }
    if (!bad.ok()) return UsageError(std::string(bad.message()));
  }
  if (!path_given) return UsageError("FILE is required (- reads stdin)");

  std::string text;
  if (path == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) return UsageError("cannot read '" + path + "': " + std::strerror(errno));
    std::ostringstream all;
    all << in.rdbuf();
    text = all.str();
  }
  if (absl::Status bad = CheckUtf8(path == "-" ? "stdin" : "'" + path + "'", text); !bad.ok()) {
    return UsageError(std::string(bad.message()));
  }
  const std::string model_dir = client::ResolveModelDir(model_flag);
  if (host.empty()) {
    const char* what = model_given ? "--model" : std::getenv("COLI_MODEL") ? "COLI_MODEL" : "model";
    if (absl::Status bad = CheckModelDir(what, model_dir); !bad.ok()) {
      return UsageError(std::string(bad.message()));
    }
  }

  for (int sig : {SIGINT, SIGTERM, SIGHUP}) CatchUnlessIgnored(sig, OnSignal);
  client::CancelToken load_cancel, cancel;
  client::CancelWhen watcher([] { return g_signal.load() != 0; }, {&load_cancel, &cancel});
  auto interrupted = [&] {
    std::fprintf(stderr, "\ncoli perplexity: interrupted\n");
    return 128 + g_signal.load();
  };

  auto connected = client::Client::Connect({.host = host});
  if (g_signal.load() != 0) return interrupted();
  if (!connected.ok()) return Fail(DescribeError(connected.status()));
  client::Client& c = **connected;
  auto options = client::ModelOptionsFromEnv(c);  // the plugins' switches; bad: usage error
  if (!options.ok()) {
    if (options.status().code() == absl::StatusCode::kInvalidArgument) {
      return UsageError(std::string(options.status().message()));
    }
    return Fail(DescribeError(options.status()));
  }
  auto model = client::LoadShowingProgress(c, model_dir, *options, &load_cancel);
  if (g_signal.load() != 0) return interrupted();
  if (!model.ok()) return Fail(DescribeError(model.status()));
  if (model->context_capacity() > 0 && ctx > model->context_capacity()) {
    return UsageError("--ctx " + std::to_string(ctx) + " is more than the model's context of " +
                      std::to_string(model->context_capacity()) + " tokens");
  }
  auto tokens = c.Tokenize(model->id(), text);
  if (!tokens.ok()) return Fail(DescribeError(tokens.status()));
  const int64_t whole = static_cast<int64_t>(tokens->size()) / ctx;
  if (whole == 0) {
    return Fail("the text is " + std::to_string(tokens->size()) +
                " tokens: at least one chunk of --ctx " + std::to_string(ctx) + " is needed");
  }
  const int64_t chunks = max_chunks > 0 ? std::min(max_chunks, whole) : whole;
  const int64_t first = ctx / 2;  // scored: positions first + 1 … ctx - 1 of each chunk
  std::fprintf(stderr, "coli perplexity: %zu tokens, %lld chunks of %lld, scoring %lld each\n",
               tokens->size(), static_cast<long long>(chunks), static_cast<long long>(ctx),
               static_cast<long long>(ctx - 1 - first));

  Score score;
  for (int64_t k = 0; k < chunks; ++k) {
    v1::GenerateRequest r;
    r.set_model(model->id());
    for (int64_t i = 0; i < ctx; ++i) r.add_prompt_ids((*tokens)[k * ctx + i]);
    r.set_prompt_logprobs(0);
    r.set_prompt_only(true);
    std::vector<float> logprobs;  // entry p - 1: prompt token p
    client::StreamCallbacks cb;
    cb.on_prompt_logprobs = [&](const v1::PromptLogprobs& piece) {
      for (const auto& e : piece.tokens()) logprobs.push_back(e.sampled().logprob());
    };
    auto finished = c.Generate(r, cb, &cancel);
    if (g_signal.load() != 0) return interrupted();
    if (!finished.ok()) return Fail(DescribeError(finished.status()));
    if (static_cast<int64_t>(logprobs.size()) != ctx - 1) {
      return Fail("the host returned " + std::to_string(logprobs.size()) +
                  " prompt logprobs for a chunk of " + std::to_string(ctx));
    }
    for (int64_t p = first + 1; p < ctx; ++p) {
      const double nll = -static_cast<double>(logprobs[p - 1]);
      score.nll += nll;
      score.nll2 += nll * nll;
      ++score.count;
    }
    std::fprintf(stderr, "[%lld]%.4f,", static_cast<long long>(k + 1), score.Ppl());
    std::fflush(stderr);
  }
  std::fprintf(stderr, "\n");
  if (json) {
    nlohmann::json out = {{"ppl", score.Ppl()},
                          {"ppl_stderr", score.PplError()},
                          {"nll", score.Mean()},
                          {"tokens", tokens->size()},
                          {"scored", score.count},
                          {"chunks", chunks},
                          {"ctx", ctx}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("PPL = %.4f +/- %.5f over %lld scored tokens (%lld chunks of %lld)\n", score.Ppl(),
                score.PplError(), static_cast<long long>(score.count),
                static_cast<long long>(chunks), static_cast<long long>(ctx));
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace

COLI_REGISTER_COMMAND(perplexity, "perplexity", "a text's perplexity (llama-perplexity's method)",
                      RunPerplexity);

}  // namespace coli::cli
