// The kimi_k3 model-wide prefix cache end to end: requests through the host (Engine, gRPC, the
// plugin ABI) on the tiny fixture, the model loaded with extra["prefix_cache"] (what
// COLI_K3_PREFIX_CACHE_MB sends). Prompts are rendered by the host's ApplyTemplate (the XTML
// renderer). The reference for every token is kimi_k3_core called directly in this process
// (a cold session, greedy), never the plugin.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sampling/sampling.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "host/engine.h"
#include "host/service.h"
#include "nlohmann/json.hpp"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/session.h"

namespace coli::host {
namespace {

using ::testing::HasSubstr;

std::string LongSystemPrompt() {
  std::string s = "You are the help desk of a hardware shop.";
  for (int i = 0; i < 6; ++i) {
    absl::StrAppend(&s, " Rule ", i, ": answer briefly, cite the manual, never guess prices.");
  }
  return s;
}

class K3PrefixCacheHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(std::string(COLI_K3_TINY_DIR) + "/config.json"))
        << "tiny fixture missing: build target k3_tiny_fixture";
    engine_ = std::make_unique<Engine>(
        EngineOptions{.plugin_dir = COLI_PLUGIN_DIR_FOR_TEST, .workers = 4});
    const std::string dir = ::testing::TempDir() + "/k3_prefix_" + std::to_string(getpid());
    std::filesystem::create_directories(dir);
    auto server = HostServer::Start(engine_.get(), {.listen = "unix:" + dir + "/h.sock"});
    ASSERT_OK(server.status());
    server_ = std::move(server).value();
    stub_ = v1::Coli::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
    ASSERT_TRUE(Load("k3pc", {{"prefix_cache", "64"}}).ok());
    ASSERT_TRUE(Load("k3", {}).ok());
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  grpc::Status Load(const std::string& id, const std::map<std::string, std::string>& extra,
                    int bits = 0) {
    grpc::ClientContext ctx;
    v1::LoadModelRequest load;
    load.set_model_dir(COLI_K3_TINY_DIR);
    load.set_id(id);
    load.mutable_options()->set_chunk(8);
    if (bits != 0) load.mutable_options()->set_bits(bits);
    for (const auto& [k, v] : extra) (*load.mutable_options()->mutable_extra())[k] = v;
    auto reader = stub_->LoadModel(&ctx, load);
    v1::LoadModelEvent e;
    while (reader->Read(&e)) {
      if (e.has_loaded()) stops_.assign(e.loaded().stop_ids().begin(), e.loaded().stop_ids().end());
    }
    return reader->Finish();
  }

  // [system, user] (user empty: the system message alone, no generation prompt).
  std::vector<int32_t> Render(const std::string& user) {
    nlohmann::json body = {{"messages", {{{"role", "system"}, {"content", LongSystemPrompt()}}}}};
    if (!user.empty()) body["messages"].push_back({{"role", "user"}, {"content", user}});
    grpc::ClientContext ctx;
    v1::ApplyTemplateRequest apply;
    apply.set_model("k3pc");
    apply.set_request_json(body.dump());
    apply.set_add_generation_prompt(!user.empty());
    v1::ApplyTemplateResponse rendered;
    EXPECT_TRUE(stub_->ApplyTemplate(&ctx, apply, &rendered).ok());
    return std::vector<int32_t>(rendered.ids().begin(), rendered.ids().end());
  }

  struct Out {
    grpc::Status status;
    v1::Started started;
    std::vector<int32_t> ids;
    v1::Finished finished;
  };
  Out Generate(const std::string& model, const std::string& session,
               const std::vector<int32_t>& prompt) {
    v1::GenerateRequest r;
    r.set_model(model);
    r.set_session(session);
    r.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
    r.set_max_tokens(kTokens);
    grpc::ClientContext ctx;
    Out out;
    auto reader = stub_->Generate(&ctx, r);
    v1::GenerateEvent e;
    while (reader->Read(&e)) {
      if (e.has_started()) out.started = e.started();
      if (e.has_token()) out.ids.push_back(e.token().id());
      if (e.has_finished()) out.finished = e.finished();
    }
    out.status = reader->Finish();
    return out;
  }

  double ModelStat(const std::string& model, const std::string& name) {
    grpc::ClientContext ctx;
    v1::MetricsResponse metrics;
    EXPECT_TRUE(stub_->GetMetrics(&ctx, v1::MetricsRequest(), &metrics).ok());
    for (const v1::ModelStat& stat : metrics.model_stats()) {
      if (stat.model() == model && stat.name() == name) return stat.value();
    }
    return -1;
  }

  // The direct reference: a cold kimi_k3_core session, greedy, stopping at the stop ids.
  std::vector<int32_t> DirectGreedy(const std::vector<int32_t>& prompt) {
    auto model = k3::Model::Load(COLI_K3_TINY_DIR, k3::ModelOptions());
    EXPECT_TRUE(model.ok()) << model.status();
    auto session = (*model)->NewSession();
    auto logits = session->Prefill(prompt);
    EXPECT_TRUE(logits.ok()) << logits.status();
    std::vector<int32_t> out;
    for (int i = 0; i < kTokens && logits.ok(); ++i) {
      const int32_t next = sampling::Greedy(*logits);
      out.push_back(next);
      if (std::find(stops_.begin(), stops_.end(), next) != stops_.end()) break;
      logits = session->Step(next);
    }
    return out;
  }

  static constexpr int kTokens = 6;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<HostServer> server_;
  std::unique_ptr<v1::Coli::Stub> stub_;
  std::vector<int32_t> stops_;
};

TEST_F(K3PrefixCacheHostTest, ANewConversationOnAnotherSessionPrefillsOnlyItsOwnMessage) {
  const std::vector<int32_t> first = Render("Do you sell drills?");
  const std::vector<int32_t> second = Render("How much is a hammer today, please?");
  const std::vector<int32_t> system = Render("");
  ASSERT_GE(system.size(), 64u);
  ASSERT_TRUE(std::equal(system.begin(), system.end(), first.begin()));
  ASSERT_TRUE(std::equal(system.begin(), system.end(), second.begin()));
  EXPECT_EQ(ModelStat("k3pc", "prefix_cache_entries"), 0);

  const Out a = Generate("k3pc", "a", first);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.started.tokens_reused(), 0);
  EXPECT_EQ(a.ids, DirectGreedy(first));
  EXPECT_EQ(ModelStat("k3pc", "prefix_cache_entries"), 1);
  EXPECT_GT(ModelStat("k3pc", "prefix_cache_bytes"), 0);
  EXPECT_EQ(ModelStat("k3pc", "prefix_cache_hits"), 0);

  // Another session, another conversation with the same system prompt: only the user message
  // (and the generation prompt) is computed; the tokens are a cold session's.
  const Out b = Generate("k3pc", "b", second);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.started.tokens_reused(), static_cast<int64_t>(system.size()));
  EXPECT_EQ(b.started.tokens_computed(), static_cast<int64_t>(second.size() - system.size()));
  EXPECT_EQ(b.ids, DirectGreedy(second));
  EXPECT_EQ(b.finished.stats().plugin().at("prefix_cache_restores"), 1);
  EXPECT_EQ(b.finished.stats().plugin().at("prefix_cache_tokens_restored"),
            static_cast<double>(system.size()));
  EXPECT_EQ(b.finished.stats().plugin().at("tokens_reused"), static_cast<double>(system.size()));
  EXPECT_EQ(ModelStat("k3pc", "prefix_cache_hits"), 1);
  EXPECT_EQ(ModelStat("k3pc", "prefix_cache_entries"), 1);  // the same prefix: no second entry

  // The same request on the model without the cache: prefilled from the first token, same ids.
  const Out plain = Generate("k3", "b", second);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  EXPECT_EQ(plain.started.tokens_reused(), 0);
  EXPECT_EQ(plain.ids, b.ids);
  EXPECT_EQ(ModelStat("k3", "prefix_cache_entries"), 0);
}

TEST_F(K3PrefixCacheHostTest, ConcurrentConversationsShareTheEntryAndMatchColdSessions) {
  const std::vector<std::string> users = {"One?", "Two, please.", "Three!", "Four and more."};
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& u : users) prompts.push_back(Render(u));
  const size_t system = Render("").size();
  // Warm the entry, then four new conversations at once on four sessions (four workers).
  ASSERT_TRUE(Generate("k3pc", "warm", prompts[0]).status.ok());
  std::vector<Out> outs(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string session = absl::StrCat("c", i);
    threads.emplace_back([&, i, session] { outs[i] = Generate("k3pc", session, prompts[i]); });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(outs[i].status.ok()) << outs[i].status.error_message();
    EXPECT_EQ(outs[i].started.tokens_reused(), static_cast<int64_t>(system))
        << "conversation " << i;
    EXPECT_EQ(outs[i].ids, DirectGreedy(prompts[i])) << "conversation " << i;
  }
  EXPECT_EQ(ModelStat("k3pc", "prefix_cache_hits"), 4);
}

// With COLI_K3_CKPT_DIR (extra["ckpt_dir"]) the entries are parked in that folder and still
// serve another session; the files go when the model is unloaded.
TEST_F(K3PrefixCacheHostTest, ParkedEntriesServeAnotherSession) {
  const std::string dir = ::testing::TempDir() + "/k3_prefix_host_park_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // A parked file of a process that is gone (a killed server): removed when a model loads.
  const std::string orphan = dir + "/coli-k3-ckpt-2147483000-1-0.bin";
  std::ofstream(orphan) << "left behind";
  ASSERT_TRUE(Load("k3park", {{"prefix_cache", "64"}, {"ckpt_dir", dir}}).ok());
  EXPECT_FALSE(std::filesystem::exists(orphan));
  const std::vector<int32_t> first = Render("Do you sell drills?");
  const std::vector<int32_t> second = Render("What about saws?");
  const size_t system = Render("").size();
  ASSERT_TRUE(Generate("k3park", "a", first).status.ok());
  size_t files = 0, on_disk = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    ++files;
    on_disk += std::filesystem::file_size(f.path());
  }
  EXPECT_EQ(files, 1u);
  EXPECT_EQ(ModelStat("k3park", "prefix_cache_bytes"), static_cast<double>(on_disk));
  const Out b = Generate("k3park", "b", second);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.started.tokens_reused(), static_cast<int64_t>(system));
  EXPECT_EQ(b.ids, DirectGreedy(second));
  {
    grpc::ClientContext ctx;
    v1::UnloadModelRequest unload;
    unload.set_model("k3park");
    v1::UnloadModelResponse done;
    ASSERT_TRUE(stub_->UnloadModel(&ctx, unload, &done).ok());
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "entries' files are removed with the model";
  std::filesystem::remove_all(dir);
}

// COLI_K3_PREFIX_CACHE_KEEP=1 (extra["prefix_cache_keep"]): the entry's file stays when the
// model is unloaded, and the same model loaded again with the same switches — a restarted server
// — continues the next conversation from it; loaded with another K3_BITS it starts cold (and
// leaves the file alone).
TEST_F(K3PrefixCacheHostTest, AKeptEntryServesTheModelLoadedAgain) {
  const std::string dir = ::testing::TempDir() + "/k3_prefix_host_keep_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::map<std::string, std::string> keep = {
      {"prefix_cache", "64"}, {"ckpt_dir", dir}, {"prefix_cache_keep", "1"}};
  const std::vector<int32_t> first = Render("Do you sell drills?");
  const std::vector<int32_t> second = Render("What about saws?");
  const size_t system = Render("").size();
  auto unload = [&](const std::string& id) {
    grpc::ClientContext ctx;
    v1::UnloadModelRequest request;
    request.set_model(id);
    v1::UnloadModelResponse done;
    return stub_->UnloadModel(&ctx, request, &done).ok();
  };
  auto files = [&] {
    return std::distance(std::filesystem::directory_iterator(dir),
                         std::filesystem::directory_iterator());
  };
  ASSERT_TRUE(Load("k3keep", keep).ok());
  ASSERT_TRUE(Generate("k3keep", "a", first).status.ok());
  ASSERT_TRUE(unload("k3keep"));
  EXPECT_EQ(files(), 1) << "a kept entry's file outlives the model";

  ASSERT_TRUE(Load("k3keep", keep).ok());
  EXPECT_EQ(ModelStat("k3keep", "prefix_cache_entries"), 1);
  const Out b = Generate("k3keep", "b", second);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.started.tokens_reused(), static_cast<int64_t>(system));
  EXPECT_EQ(b.ids, DirectGreedy(second));
  EXPECT_EQ(ModelStat("k3keep", "prefix_cache_hits"), 1);
  ASSERT_TRUE(unload("k3keep"));

  ASSERT_TRUE(Load("k3keep8", keep, /*bits=*/8).ok());
  EXPECT_EQ(ModelStat("k3keep8", "prefix_cache_entries"), 0);
  const Out c = Generate("k3keep8", "c", second);
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.started.tokens_reused(), 0) << "another K3_BITS computes other states";
  ASSERT_TRUE(unload("k3keep8"));
  EXPECT_EQ(files(), 2) << "each configuration keeps its own entry";
  std::filesystem::remove_all(dir);
}

TEST_F(K3PrefixCacheHostTest, BadOptionValuesAreRefusedByName) {
  grpc::Status bad = Load("k3bad", {{"prefix_cache", "lots"}});
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("COLI_K3_PREFIX_CACHE_MB"));
  bad = Load("k3bad2", {{"prefix_cache", "64"}, {"prefix_cache_min", "0"}});
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("COLI_K3_PREFIX_CACHE_MIN"));
  bad = Load("k3bad3", {{"prefix_cache", "64"}, {"prefix_cache_keep", "yes"}});
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("COLI_K3_PREFIX_CACHE_KEEP"));
  bad = Load("k3bad4", {{"prefix_cache", "64"}, {"prefix_cache_keep", "1"}});
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("COLI_K3_CKPT_DIR"));
}

}  // namespace
}  // namespace coli::host
