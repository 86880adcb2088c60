// k3_prefix_cache_bench: what the model-wide prefix cache saves per new conversation.
//
//   build-prefix/bin/k3_prefix_cache_bench [conversations=4] [system_tokens=1500] [user_tokens=50]
//
// 1. Through the host and the plugin ABI (gRPC on a private unix socket, the tiny fixture): N new
//    conversations, each on its own session, share one system prompt of ~system_tokens tokens
//    and each has its own user message of ~user_tokens tokens (rendered by the XTML renderer);
//    run once on a model loaded without the cache and once with prefix_cache=1024 MiB. Prints
//    per conversation the tokens computed / reused and the prefill time from the Started event.
// 2. K3's real entry size for that prompt shape (spec: 69 KDA layers of 96 heads × 128² state +
//    3 conv rows × 3 × 12288; 24 MLA layers × 576 floats per token; logits 163,840 floats) and
//    the time of one memcpy of that many bytes here (the restore's copy), best of 5.
// Output: one JSON object per line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "host/engine.h"
#include "host/service.h"
#include "nlohmann/json.hpp"

namespace {

using coli::host::Engine;
using coli::host::EngineOptions;
using coli::host::HostServer;
namespace v1 = coli::v1;

struct Bench {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<HostServer> server;
  std::unique_ptr<v1::Coli::Stub> stub;

  bool Load(const std::string& id, const std::string& cache_mb) {
    grpc::ClientContext ctx;
    v1::LoadModelRequest load;
    load.set_model_dir(COLI_K3_TINY_DIR);
    load.set_id(id);
    if (!cache_mb.empty()) (*load.mutable_options()->mutable_extra())["prefix_cache"] = cache_mb;
    auto reader = stub->LoadModel(&ctx, load);
    v1::LoadModelEvent e;
    while (reader->Read(&e)) {
    }
    grpc::Status s = reader->Finish();
    if (!s.ok()) std::fprintf(stderr, "load %s: %s\n", id.c_str(), s.error_message().c_str());
    return s.ok();
  }

  std::vector<int32_t> Render(const std::string& system, const std::string& user) {
    nlohmann::json body = {{"messages",
                            {{{"role", "system"}, {"content", system}},
                             {{"role", "user"}, {"content", user}}}}};
    grpc::ClientContext ctx;
    v1::ApplyTemplateRequest apply;
    apply.set_model("plain");
    apply.set_request_json(body.dump());
    apply.set_add_generation_prompt(true);
    v1::ApplyTemplateResponse rendered;
    if (!stub->ApplyTemplate(&ctx, apply, &rendered).ok()) return {};
    return std::vector<int32_t>(rendered.ids().begin(), rendered.ids().end());
  }

  int64_t Tokens(const std::string& text) {
    grpc::ClientContext ctx;
    v1::TokenizeRequest r;
    r.set_model("plain");
    r.set_text(text);
    v1::TokenizeResponse out;
    if (!stub->Tokenize(&ctx, r, &out).ok()) return 0;
    return out.ids_size();
  }

  // Text of about `n` tokens (sentences added until the tokenizer says so).
  std::string TextOf(int64_t n, const std::string& what) {
    std::string s;
    for (int i = 0; Tokens(s) < n; ++i) {
      absl::StrAppend(&s, i == 0 ? "" : " ", what, " ", i,
                      ": answer briefly, cite the manual, never guess prices.");
    }
    return s;
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int conversations = argc > 1 ? std::atoi(argv[1]) : 4;
  const int64_t system_tokens = argc > 2 ? std::atoll(argv[2]) : 1500;
  const int64_t user_tokens = argc > 3 ? std::atoll(argv[3]) : 50;
  Bench b;
  b.engine = std::make_unique<Engine>(EngineOptions{.plugin_dir = COLI_PLUGIN_DIR_FOR_TEST});
  const std::string dir = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                       "/k3_prefix_bench_", getpid());
  std::filesystem::create_directories(dir);
  auto server = HostServer::Start(b.engine.get(), {.listen = "unix:" + dir + "/h.sock"});
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  b.server = std::move(server).value();
  b.stub = v1::Coli::NewStub(
      grpc::CreateChannel(b.server->address(), grpc::InsecureChannelCredentials()));
  if (!b.Load("plain", "") || !b.Load("cached", "1024")) return 1;

  const std::string system = b.TextOf(system_tokens, "Rule");
  std::vector<std::vector<int32_t>> prompts;
  for (int c = 0; c < conversations; ++c) {
    prompts.push_back(b.Render(system, b.TextOf(user_tokens, absl::StrCat("Question ", c, " part"))));
  }
  for (const std::string model : {"plain", "cached"}) {
    for (int c = 0; c < conversations; ++c) {
      v1::GenerateRequest r;
      r.set_model(model);
      r.set_session(absl::StrCat("conversation-", c));
      r.mutable_prompt_ids()->Add(prompts[c].begin(), prompts[c].end());
      r.set_max_tokens(2);
      grpc::ClientContext ctx;
      auto reader = b.stub->Generate(&ctx, r);
      v1::GenerateEvent e;
      v1::Started started;
      const auto t0 = std::chrono::steady_clock::now();
      double to_started = 0;
      while (reader->Read(&e)) {
        if (e.has_started()) {
          started = e.started();
          to_started =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
      }
      grpc::Status s = reader->Finish();
      if (!s.ok()) {
        std::fprintf(stderr, "%s: %s\n", model.c_str(), s.error_message().c_str());
        return 1;
      }
      nlohmann::json out = {{"model", model},
                            {"conversation", c},
                            {"prompt_tokens", prompts[c].size()},
                            {"tokens_computed", started.tokens_computed()},
                            {"tokens_reused", started.tokens_reused()},
                            {"seconds_to_started", to_started}};
      std::printf("%s\n", out.dump().c_str());
    }
  }
  b.server->Shutdown();
  std::filesystem::remove_all(dir);

  // K3's entry for the same shape: the restore copies this many bytes.
  const int64_t kda_layers = 69, mla_layers = 24, heads = 96, d = 128, channels = 12288;
  const int64_t kda_bytes = kda_layers * (heads * d * d + 3 * 3 * channels) * 4;
  // The entry sits where the user message starts: about system_tokens into the prompt on K3
  // (its template adds a few tokens; the tiny tokenizer's 512-token BPE spells the tags in many).
  const int64_t mla_per_token = mla_layers * 576 * 4;
  const int64_t entry = kda_bytes + system_tokens * mla_per_token + 163840 * 4;
  std::vector<char> src(static_cast<size_t>(entry), 1), dst(static_cast<size_t>(entry), 0);
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), src.size());
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    src[static_cast<size_t>(i)] = static_cast<char>(dst[static_cast<size_t>(entry - 1 - i)] + i);
  }
  nlohmann::json k3 = {{"k3_kda_state_bytes", kda_bytes},
                       {"k3_mla_bytes_per_token", mla_per_token},
                       {"k3_entry_tokens", system_tokens},
                       {"k3_entry_bytes", entry},
                       {"memcpy_seconds_best_of_5", best},
                       {"memcpy_gb_per_s", static_cast<double>(entry) / best / 1e9}};
  std::printf("%s\n", k3.dump().c_str());
  return 0;
}
