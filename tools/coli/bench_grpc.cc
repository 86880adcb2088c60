// `coli bench grpc [--json] [--model DIR] [--ngen N] [--prompt TEXT] [--reps R]`
//
// What the gRPC hop costs: the same greedy generation run in-process (host Engine, callbacks on
// its generation thread) and through gRPC (the coli client over a Unix socket to a HostServer
// on its own Engine in this process), alternating, R times each. Reported per mode (medians):
// decode tokens/s measured at the consumer ((n-1) / (last token - first token)) and time to
// first token (submit -> first token at the consumer). The baseline this benchmark compares
// against is the machine's own in-process rate on the same model, measured in the same run
// (goals: gRPC >= 0.98x of it, added TTFT <= 5 ms). On a shared machine single runs are noisy,
// so the ratio is the median of per-pair ratios (each gRPC run against the in-process run just
// before it) and also best-of-N against best-of-N. Default model: the embedded tiny K3 fixture.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "host/engine.h"
#include "host/model_options_env.h"
#include "host/service.h"
#include "nlohmann/json.hpp"
#include "tools/coli/cli_args.h"
#include "tools/coli/client.h"
#include "tools/coli/command.h"

namespace coli::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Run {
  double tokens_per_second = 0;
  double ttft_ms = 0;
  size_t tokens = 0;
  std::vector<int32_t> ids;
};

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

Run Summarise(Clock::time_point submit, const std::vector<Clock::time_point>& at,
              std::vector<int32_t> ids) {
  Run r;
  r.tokens = at.size();
  r.ids = std::move(ids);
  if (!at.empty()) r.ttft_ms = Ms(at.front() - submit);
  if (at.size() > 1) {
    r.tokens_per_second = static_cast<double>(at.size() - 1) / (Ms(at.back() - at.front()) / 1e3);
  }
  return r;
}

absl::StatusOr<Run> InProcess(host::Engine& engine, const v1::GenerateRequest& request) {
  std::vector<Clock::time_point> at;
  std::vector<int32_t> ids;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::Status status;
  host::EventSink sink;
  sink.on_token = [&](const v1::Token& t, std::span<const v1::ChatDelta>) {
    at.push_back(Clock::now());
    ids.push_back(t.id());
  };
  sink.on_done = [&](const absl::Status& s, const v1::Finished&) {
    std::lock_guard<std::mutex> lock(mu);
    status = s;
    done = true;
    cv.notify_all();
  };
  const auto submit = Clock::now();
  auto r = engine.Submit(host::GenerationInput::From(request), std::move(sink));
  if (!r.ok()) return r.status();
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (!status.ok()) return status;
  return Summarise(submit, at, std::move(ids));
}

absl::StatusOr<Run> ThroughGrpc(client::Client& c, const v1::GenerateRequest& request) {
  std::vector<Clock::time_point> at;
  std::vector<int32_t> ids;
  client::StreamCallbacks cb;
  cb.on_token = [&](const v1::Token& t) {
    at.push_back(Clock::now());
    ids.push_back(t.id());
  };
  const auto submit = Clock::now();
  auto finished = c.Generate(request, cb);
  if (!finished.ok()) return finished.status();
  return Summarise(submit, at, std::move(ids));
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "coli bench grpc: %s\n", s.ToString().c_str());
  return 1;
}

int RunBenchGrpc(int argc, char** argv) {
  bool json = false;
  std::string model_flag, prompt = "The quick brown fox jumps over the lazy dog.";
  int ngen = 64, reps = 9;
  constexpr const char* kUsage =
      "usage: coli bench grpc [--json] [--model DIR] [--ngen N] [--prompt TEXT] [--reps R]\n";
  auto usage_error = [&](const std::string& why) {
    std::fprintf(stderr, "coli bench grpc: %s\n%s", why.c_str(), kUsage);
    return 2;
  };
  if (WantsHelp(argc, argv)) {
    std::printf("%s", kUsage);
    return 0;
  }
  ArgReader args(argc, argv);
  while (args.Next()) {
    // A missing value used to mean the default: `--model` alone benchmarked the tiny fixture.
    absl::Status bad;
    if (args.Is("--json")) {
      bad = args.NoValue();
      json = true;
    } else if (args.Is("--model") || args.Is("--prompt")) {
      const bool is_model = args.Is("--model");
      absl::StatusOr<std::string> v = args.Value();
      if (!v.ok()) return usage_error(std::string(v.status().message()));
      if (v->empty()) return usage_error(args.arg() + " is empty");
      (is_model ? model_flag : prompt) = *v;
    } else if (args.Is("--ngen") || args.Is("--reps")) {
      const bool is_ngen = args.Is("--ngen");
      absl::StatusOr<int64_t> v = args.Int(1, 1 << 20);
      if (!v.ok()) return usage_error(std::string(v.status().message()));
      (is_ngen ? ngen : reps) = static_cast<int>(*v);
    } else {
      return usage_error("unknown argument '" + args.arg() + "'");
    }
    if (!bad.ok()) return usage_error(std::string(bad.message()));
  }
  if (reps < 1) reps = 1;
  const std::string model_dir = client::ResolveModelDir(model_flag);
  std::string plugin_dir =
      std::getenv("COLI_PLUGIN_DIR") ? std::getenv("COLI_PLUGIN_DIR") : COLI_CLIENT_PLUGIN_DIR;

  // Two engines with the same model: one called directly, one behind the gRPC server.
  host::Engine local({.plugin_dir = plugin_dir});
  host::Engine served({.plugin_dir = plugin_dir});
  // The model switches of the environment, read with the tables the plugins declare.
  auto options = host::ModelOptionsFromEnv(host::WithHostSwitches(local.plugins().Switches()));
  if (!options.ok()) return Fail(options.status());
  v1::LoadModelRequest load;
  load.set_model_dir(model_dir);
  load.set_id("bench");
  *load.mutable_options() = *options;
  if (auto s = local.LoadModel(load, nullptr); !s.ok()) return Fail(s.status());
  if (auto s = served.LoadModel(load, nullptr); !s.ok()) return Fail(s.status());
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("coli-bench-" + std::to_string(getpid())))
          .string();
  std::filesystem::create_directories(dir);
  auto server = host::HostServer::Start(&served, {.listen = "unix:" + dir + "/h.sock"});
  if (!server.ok()) return Fail(server.status());
  auto c = client::Client::Connect({.host = (*server)->address()});
  if (!c.ok()) return Fail(c.status());

  v1::GenerateRequest request;
  request.set_model("bench");
  request.set_prompt(prompt);
  request.set_max_tokens(ngen);
  std::vector<double> tps[2], ttft[2];
  bool identical = true;
  std::vector<int32_t> reference;
  size_t tokens = 0;
  for (int rep = 0; rep < reps + 1; ++rep) {  // rep 0 warms both paths up and is not counted
    for (int mode = 0; mode < 2; ++mode) {
      auto run = mode == 0 ? InProcess(local, request) : ThroughGrpc(**c, request);
      if (!run.ok()) return Fail(run.status());
      if (reference.empty()) reference = run->ids;
      identical = identical && run->ids == reference;
      tokens = run->tokens;
      if (rep == 0) continue;
      tps[mode].push_back(run->tokens_per_second);
      ttft[mode].push_back(run->ttft_ms);
    }
  }
  (*server)->Shutdown();
  std::filesystem::remove_all(dir);

  const double tps_local = Median(tps[0]), tps_grpc = Median(tps[1]);
  const double ttft_local = Median(ttft[0]), ttft_grpc = Median(ttft[1]);
  std::vector<double> pair_ratio, pair_added;
  for (size_t i = 0; i < tps[0].size(); ++i) {
    if (tps[0][i] > 0) pair_ratio.push_back(tps[1][i] / tps[0][i]);
    pair_added.push_back(ttft[1][i] - ttft[0][i]);
  }
  const double ratio = Median(pair_ratio);
  const double added_ttft = Median(pair_added);
  const double best_local = *std::max_element(tps[0].begin(), tps[0].end());
  const double best_grpc = *std::max_element(tps[1].begin(), tps[1].end());
  const double best_ratio = best_local > 0 ? best_grpc / best_local : 0;
  const double best_ttft_local = *std::min_element(ttft[0].begin(), ttft[0].end());
  const double best_ttft_grpc = *std::min_element(ttft[1].begin(), ttft[1].end());
  if (json) {
    nlohmann::json out = {{"area", "grpc"},
                          {"model", model_dir},
                          {"tokens", tokens},
                          {"reps", reps},
                          {"identical_tokens", identical},
                          {"inprocess_tokens_per_second", tps_local},
                          {"grpc_tokens_per_second", tps_grpc},
                          {"grpc_vs_inprocess", ratio},
                          {"grpc_vs_inprocess_best", best_ratio},
                          {"inprocess_ttft_ms", ttft_local},
                          {"grpc_ttft_ms", ttft_grpc},
                          {"added_ttft_ms", added_ttft},
                          {"added_ttft_ms_best", best_ttft_grpc - best_ttft_local},
                          {"goal_ratio", 0.98},
                          {"goal_added_ttft_ms", 5.0}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("model %s, %zu tokens, median of %d runs\n", model_dir.c_str(), tokens, reps);
    std::printf("  in-process: %9.1f tok/s  TTFT %7.2f ms\n", tps_local, ttft_local);
    std::printf("  gRPC:       %9.1f tok/s  TTFT %7.2f ms\n", tps_grpc, ttft_grpc);
    std::printf("  paired median: ratio %.3f (goal >= 0.98), added TTFT %.2f ms (goal <= 5)\n",
                ratio, added_ttft);
    std::printf("  best of %d:    ratio %.3f, added TTFT %.2f ms; tokens %s\n", reps, best_ratio,
                best_ttft_grpc - best_ttft_local, identical ? "identical" : "DIFFER");
  }
  return identical ? 0 : 1;
}

}  // namespace

COLI_REGISTER_BENCH(grpc, "grpc", "tokens/s and TTFT through gRPC vs in-process", RunBenchGrpc);

}  // namespace coli::cli
