// k3_session_reuse_bench: what an n = 4 request costs in its three choice sessions, made anew per
// request (the host before session 18: a new session each, the state copied through a
// PrefixState), made anew with the direct copy (Session::CopyFrom), or taken from the host's
// spares (Session::Reset keeps the KDA buffers, CopyFrom writes into them).
//
//   build-X/bin/k3_session_reuse_bench [model_dir=fixtures/k3_tiny] [requests=10] [choices=4]
//
// Not a test (run by hand; docs/status/host-batching.md). The tiny fixture's state is small; a
// fixture with K3's KDA widths (96 heads x 128^2, 6.3 MB a layer, as the real model's 69 layers)
// shows the real allocation pattern. Output: one JSON object per line: per request, the wall
// milliseconds and the minor page faults of the choice sessions' set-up (getrusage), mean of
// `requests` after one warm-up.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/session.h"

namespace {

using coli::k3::Model;
using coli::k3::ModelOptions;
using coli::k3::Session;

long MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "k3_session_reuse_bench: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : COLI_K3_TINY_DIR;
  const int requests = argc > 2 ? std::atoi(argv[2]) : 10;
  const int choices = argc > 3 ? std::atoi(argv[3]) : 4;
  if (requests < 1 || choices < 2) return Fail("requests >= 1 and choices >= 2");
  ModelOptions options;
  options.threads = 1;
  auto model = Model::Load(dir, options);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 24; ++i) prompt.push_back(100 + i);
  std::unique_ptr<Session> source = (*model)->NewSession();
  if (auto p = source->Prefill(prompt); !p.ok()) return Fail(std::string(p.status().message()));

  size_t state_bytes = 0;
  for (const auto& k : source->state().kda) {
    state_bytes += (k.S.size() + k.q_win.size() + k.k_win.size() + k.v_win.size()) * sizeof(float);
  }
  std::printf("{\"model\": \"%s\", \"kda_state_bytes_per_session\": %zu, \"choices\": %d}\n",
              dir.c_str(), state_bytes, choices);

  // One request's set-up of its choice sessions; `spares` is empty for the old flow.
  auto made_anew = [&]() -> bool {
    std::vector<std::unique_ptr<Session>> made;
    for (int i = 1; i < choices; ++i) {
      made.push_back((*model)->NewSession());
      if (!made.back()->RestorePrefix(source->TakePrefixState({})).ok()) return false;
    }
    return true;  // `made` is destroyed with the request
  };
  // New sessions with the direct copy (what the plugin's copy alone saves, without spares).
  auto made_anew_direct_copy = [&]() -> bool {
    std::vector<std::unique_ptr<Session>> made;
    for (int i = 1; i < choices; ++i) {
      made.push_back((*model)->NewSession());
      if (!made.back()->CopyFrom(*source).ok()) return false;
    }
    return true;
  };
  std::vector<std::unique_ptr<Session>> spares;
  for (int i = 1; i < choices; ++i) spares.push_back((*model)->NewSession());
  auto from_spares = [&]() -> bool {
    for (auto& spare : spares) {
      spare->Reset();
      if (!spare->CopyFrom(*source).ok()) return false;
    }
    return true;
  };
  for (const auto& [name, run] :
       {std::pair<const char*, std::function<bool()>>{"made_anew", made_anew},
        {"made_anew_direct_copy", made_anew_direct_copy},
        {"from_spares", from_spares}}) {
    if (!run()) return Fail(std::string(name) + ": a copy failed");  // warm-up
    const long faults = MinorFaults();
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < requests; ++r) {
      if (!run()) return Fail(std::string(name) + ": a copy failed");
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "{\"flow\": \"%s\", \"ms_per_request\": %.2f, \"minor_faults_per_request\": %.0f}\n", name,
        ms / requests, static_cast<double>(MinorFaults() - faults) / requests);
  }
  return 0;
}
