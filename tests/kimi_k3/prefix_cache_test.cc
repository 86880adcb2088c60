// The model-wide prefix cache on the tiny fixture. Prompts are real XTML renderings (the
// renderer, chat.h) of a long system prompt and different user messages, so the entries sit at
// the real "last message start" (checkpoints.h, LastMessageStart). The reference for every
// restored session is a cold session of the same model that prefilled the whole prompt from
// token 0 without any cache: logits and greedy tokens must match bit for bit.
#include "plugins/kimi_k3/prefix_cache.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/sampling/sampling.h"
#include "common/status/status_matchers.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/chat.h"
#include "plugins/kimi_k3/checkpoints.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/prefix_cache_tag.h"
#include "plugins/kimi_k3/session.h"
#include "tests/kimi_k3/core_test_util.h"

namespace coli::k3 {
namespace {

using ::coli::testing::StatusIs;

using core_test::SameBits;

std::string LongSystemPrompt(int sentences) {
  std::string s = "You are a careful assistant for a hardware shop.";
  for (int i = 0; i < sentences; ++i) {
    s += " Rule " + std::to_string(i) + ": answer briefly, cite the manual, never guess prices.";
  }
  return s;
}

class PrefixCacheSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelOptions o;
    o.chunk = 5;  // chunk borders away from the message borders
    auto model = Model::Load(K3_TEST_TINY, o);
    ASSERT_OK(model.status());
    model_ = std::move(model).value();
    auto tokenizer = tok::Tokenizer::LoadDir(K3_TEST_TINY);
    ASSERT_OK(tokenizer.status());
    tokenizer_ = std::move(tokenizer).value();
    auto eom = tokenizer_->TokenId(kEndOfMsgToken);
    ASSERT_TRUE(eom.has_value());
    end_of_msg_ = *eom;
  }

  // [system, user] rendered by the XTML renderer with the generation prompt.
  std::vector<int32_t> Render(const std::string& system, const std::string& user) {
    Json request;
    request["messages"] = Json::array();
    request["messages"].push_back({{"role", "system"}, {"content", system}});
    request["messages"].push_back({{"role", "user"}, {"content", user}});
    auto chat = RenderChat(request, *tokenizer_);
    EXPECT_OK(chat.status());
    return chat.ok() ? chat->ids : std::vector<int32_t>();
  }

  int64_t Split(const std::vector<int32_t>& prompt) const {
    return LastMessageStart(prompt, end_of_msg_);
  }

  // A cold session: the whole prompt from token 0, then `steps` greedy tokens. Returns the
  // prompt's logits followed by each step's.
  std::vector<std::vector<float>> Cold(const std::vector<int32_t>& prompt, int steps) {
    auto s = model_->NewSession();
    return Continue(*s, prompt, steps);
  }

  // Prefills `tokens` on `s` and decodes `steps` greedy tokens.
  static std::vector<std::vector<float>> Continue(Session& s, std::span<const int32_t> tokens,
                                                  int steps) {
    std::vector<std::vector<float>> out;
    auto logits = s.Prefill(tokens);
    EXPECT_OK(logits.status());
    if (!logits.ok()) return out;
    out.push_back(*logits);
    for (int i = 0; i < steps; ++i) {
      auto next = s.Step(sampling::Greedy(out.back()));
      EXPECT_OK(next.status());
      if (!next.ok()) return out;
      out.push_back(*std::move(next));
    }
    return out;
  }

  // Session A's first turn as the plugin runs it: to the last message start (an entry goes to
  // the cache there), then the rest, and two greedy tokens.
  void FirstTurn(Session& a, const std::vector<int32_t>& prompt, PrefixCache& cache) {
    const int64_t split = Split(prompt);
    ASSERT_GT(split, 0);
    auto head = a.Prefill(std::span(prompt).first(split));
    ASSERT_OK(head.status());
    ASSERT_TRUE(cache.Wants(std::span(prompt).first(split)));
    ASSERT_TRUE(cache.Insert(a.TakePrefixState(*head)));
    EXPECT_FALSE(cache.Wants(std::span(prompt).first(split)));  // held now
    EXPECT_EQ(Continue(a, std::span(prompt).subspan(split), 2).size(), 3u);
  }

  // The deepest entry for `prompt` is `at` tokens long, and a fresh session restored from it
  // continues like `cold` (the prompt's and two greedy steps' logits) bit for bit.
  void ExpectServesLikeCold(PrefixCache& cache, const std::vector<int32_t>& prompt, int64_t at,
                            const std::vector<std::vector<float>>& cold) {
    std::shared_ptr<const PrefixState> e = cache.Deepest(prompt, 0);
    ASSERT_NE(e, nullptr);
    ASSERT_EQ(static_cast<int64_t>(e->at.tokens.size()), at);
    auto b = model_->NewSession();
    ASSERT_OK(b->RestorePrefix(*e));
    const std::vector<std::vector<float>> warm = Continue(*b, std::span(prompt).subspan(at), 2);
    ASSERT_EQ(warm.size(), cold.size());
    for (size_t i = 0; i < cold.size(); ++i) EXPECT_TRUE(SameBits(warm[i], cold[i]));
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<tok::Tokenizer> tokenizer_;
  int32_t end_of_msg_ = -1;
};

TEST_F(PrefixCacheSessionTest, AnotherSessionContinuesFromTheSharedSystemPromptBitForBit) {
  const std::string system = LongSystemPrompt(6);
  const std::vector<int32_t> p1 = Render(system, "Do you sell drills?");
  const std::vector<int32_t> p2 = Render(system, "How much is a hammer today, please?");
  const int64_t split = Split(p1);
  ASSERT_EQ(Split(p2), split);
  ASSERT_GE(split, 64) << "the system prompt must be long enough to be worth an entry";
  // The entry sits where the user message starts: the rendered system message ends there.
  ASSERT_EQ(p1[split - 1], end_of_msg_);

  PrefixCache cache(size_t{1} << 30);
  auto a = model_->NewSession();
  FirstTurn(*a, p1, cache);
  EXPECT_EQ(cache.entries(), 1u);
  EXPECT_GT(cache.bytes(), static_cast<size_t>(split) * sizeof(int32_t));

  // Session B, never used: restores the entry and prefills only the user message.
  auto b = model_->NewSession();
  std::shared_ptr<const PrefixState> e = cache.Deepest(p2, 0);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(static_cast<int64_t>(e->at.tokens.size()), split);
  ASSERT_OK(b->RestorePrefix(*e));
  EXPECT_EQ(b->position(), split);
  const std::vector<std::vector<float>> warm = Continue(*b, std::span(p2).subspan(split), 6);
  const std::vector<std::vector<float>> cold = Cold(p2, 6);
  ASSERT_EQ(warm.size(), cold.size());
  for (size_t i = 0; i < cold.size(); ++i) {
    EXPECT_TRUE(SameBits(warm[i], cold[i])) << "logits after step " << i << " differ";
  }
  EXPECT_EQ(b->tokens().size(), p2.size() + 6);
  // The entry's own logits are the ones after its last token.
  EXPECT_TRUE(SameBits(e->at.logits, Cold(std::vector<int32_t>(p2.begin(), p2.begin() + split),
                                          0)[0]));

  // Reset after a restore: back to an empty sequence, a cold prefill again matches.
  b->Reset();
  EXPECT_EQ(b->position(), 0);
  const std::vector<std::vector<float>> again = Continue(*b, p2, 2);
  ASSERT_EQ(again.size(), 3u);
  for (size_t i = 0; i < again.size(); ++i) EXPECT_TRUE(SameBits(again[i], cold[i]));
}

TEST_F(PrefixCacheSessionTest, ARestoreReplacesAUsedSessionsState) {
  const std::string system = LongSystemPrompt(5);
  const std::vector<int32_t> p1 = Render(system, "First question?");
  const std::vector<int32_t> p2 = Render(system, "A different second question.");
  PrefixCache cache(size_t{1} << 30);
  auto a = model_->NewSession();
  FirstTurn(*a, p1, cache);
  // B has run something else (longer than the prefix) before it restores.
  auto b = model_->NewSession();
  ASSERT_OK(b->Prefill(Render("Another system prompt entirely.", "Hi")).status());
  ASSERT_OK(b->Prefill(p1).status());
  std::shared_ptr<const PrefixState> e = cache.Deepest(p2, 0);
  ASSERT_NE(e, nullptr);
  ASSERT_OK(b->RestorePrefix(*e));
  const std::vector<std::vector<float>> warm = Continue(*b, std::span(p2).subspan(Split(p2)), 3);
  const std::vector<std::vector<float>> cold = Cold(p2, 3);
  ASSERT_EQ(warm.size(), cold.size());
  for (size_t i = 0; i < cold.size(); ++i) EXPECT_TRUE(SameBits(warm[i], cold[i]));
}

// The tiny tokenizer spends ~200 tokens on the rendering's own system messages, so the minimum
// is set just above the shared part here (the real default, 32, is checked on its own below).
TEST_F(PrefixCacheSessionTest, APromptSharingLessThanTheMinimumGetsNoEntry) {
  const std::vector<int32_t> p1 = Render("Be brief.", "Do you sell drills?");
  const int64_t split = Split(p1);
  ASSERT_GT(split, 0);
  PrefixCache cache(size_t{1} << 30, /*min_tokens=*/split + 1);
  auto a = model_->NewSession();
  auto head = a->Prefill(std::span(p1).first(split));
  ASSERT_OK(head.status());
  EXPECT_FALSE(cache.Wants(std::span(p1).first(split)));
  EXPECT_FALSE(cache.Insert(a->TakePrefixState(*head)));
  EXPECT_EQ(cache.entries(), 0u);
  EXPECT_EQ(cache.Deepest(Render("Be brief.", "Anything else?"), 0), nullptr);
  EXPECT_EQ(cache.hits(), 0u);
  // At exactly the minimum it is kept and serves the other conversation.
  PrefixCache at_min(size_t{1} << 30, /*min_tokens=*/split);
  EXPECT_TRUE(at_min.Insert(a->TakePrefixState(*head)));
  EXPECT_NE(at_min.Deepest(Render("Be brief.", "Anything else?"), 0), nullptr);
}

TEST_F(PrefixCacheSessionTest, RestoreRefusesAStateThatDoesNotFitAndChangesNothing) {
  const std::vector<int32_t> p = Render(LongSystemPrompt(4), "Hello?");
  auto a = model_->NewSession();
  ASSERT_OK(a->Prefill(p).status());
  const PrefixState good = a->TakePrefixState({});
  auto b = model_->NewSession();
  const std::vector<int32_t> mine = {7, 8, 9};
  ASSERT_OK(b->Prefill(mine).status());

  PrefixState short_rows = good;
  size_t mla_layer = 0;
  while (mla_layer < short_rows.mla.size() && short_rows.mla[mla_layer].empty()) ++mla_layer;
  ASSERT_LT(mla_layer, short_rows.mla.size()) << "the fixture has an MLA layer";
  short_rows.mla[mla_layer].pop_back();
  EXPECT_THAT(b->RestorePrefix(short_rows),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr("layer " + std::to_string(mla_layer))));
  PrefixState no_layers = good;
  no_layers.at.kda.pop_back();
  EXPECT_THAT(b->RestorePrefix(no_layers), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(b->tokens(), mine);
  // Still usable and unchanged: one more token matches a cold session on the same tokens.
  auto next = b->Step(11);
  ASSERT_OK(next.status());
  EXPECT_TRUE(SameBits(*next, Cold({7, 8, 9, 11}, 0)[0]));

  // K3_MAXT: a context smaller than the prefix refuses it.
  ModelOptions small;
  small.max_context = static_cast<int64_t>(p.size()) - 1;
  auto model = Model::Load(K3_TEST_TINY, small);
  ASSERT_OK(model.status());
  EXPECT_THAT((*model)->NewSession()->RestorePrefix(good),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::HasSubstr("K3_MAXT")));
}

// Several sessions on their own threads use the cache at once while entries are inserted and
// evicted: each restores (copying from its shared entry without the cache's lock), then
// prefills its tail and must match its cold reference. Forward passes are serialised as the
// plugin does (one per model at a time); restores, inserts and evictions are not.
TEST_F(PrefixCacheSessionTest, ConcurrentSessionsRestoreWhileEntriesComeAndGo) {
  const std::string system = LongSystemPrompt(6);
  const std::vector<std::string> users = {"One?", "Two, please.", "Three!", "And four?"};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<float>> cold;
  for (const std::string& u : users) {
    prompts.push_back(Render(system, u));
    cold.push_back(Cold(prompts.back(), 0)[0]);
  }
  const int64_t split = Split(prompts[0]);
  // Room for about three entries: the churn below evicts all the time.
  auto probe = model_->NewSession();
  auto head = probe->Prefill(std::span(prompts[0]).first(split));
  ASSERT_OK(head.status());
  PrefixState shared = probe->TakePrefixState(*head);
  const size_t entry_bytes = shared.bytes();
  PrefixCache cache(entry_bytes * 3 + entry_bytes / 2);
  ASSERT_TRUE(cache.Insert(std::move(shared)));
  std::mutex forward;
  std::atomic<bool> stop{false};
  std::atomic<int> mismatches{0}, served{0};
  // The churn: other prefixes (the system prompt cut shorter) inserted over and over.
  std::thread churn([&] {
    auto s = model_->NewSession();
    std::vector<PrefixState> others;
    {
      std::lock_guard<std::mutex> lock(forward);
      for (int64_t cut = split - 1; cut > split - 6; --cut) {
        s->Reset();
        auto l = s->Prefill(std::span(prompts[0]).first(cut));
        if (l.ok()) others.push_back(s->TakePrefixState(*l));
      }
    }
    while (!stop.load()) {
      for (const PrefixState& o : others) cache.Insert(o);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::vector<std::thread> workers;
  for (size_t w = 0; w < prompts.size(); ++w) {
    workers.emplace_back([&, w] {
      auto s = model_->NewSession();
      for (int round = 0; round < 2; ++round) {
        std::shared_ptr<const PrefixState> e = cache.Deepest(prompts[w], 0);
        if (e == nullptr) {  // evicted by the churn: publish it again, as a prefill would
          std::lock_guard<std::mutex> lock(forward);
          s->Reset();
          auto l = s->Prefill(std::span(prompts[w]).first(split));
          if (l.ok()) cache.Insert(s->TakePrefixState(*l));
          continue;
        }
        if (!s->RestorePrefix(*e).ok()) {
          mismatches.fetch_add(1);
          continue;
        }
        const size_t at = e->at.tokens.size();
        e.reset();
        std::lock_guard<std::mutex> lock(forward);
        auto l = s->Prefill(std::span(prompts[w]).subspan(at));
        if (!l.ok() || !SameBits(*l, cold[w])) mismatches.fetch_add(1);
        served.fetch_add(1);
      }
    });
  }
  for (std::thread& t : workers) t.join();
  stop.store(true);
  churn.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_GT(served.load(), 0);
  EXPECT_LE(cache.bytes(), cache.max_bytes());
}

// Parked in a folder (COLI_K3_CKPT_DIR): the entry is read back from its file and serves
// another session bit for bit; a damaged file is dropped (never restored), the next deepest
// entry serves instead; the files go when entries are dropped and with the cache.
TEST_F(PrefixCacheSessionTest, ParkedEntriesServeFromTheirFilesAndADamagedOneIsDropped) {
  const std::string dir = ::testing::TempDir() + "/k3_prefix_park_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto files = [&] {
    std::vector<std::string> out;
    for (const auto& f : std::filesystem::directory_iterator(dir)) out.push_back(f.path());
    return out;
  };
  const std::string system = LongSystemPrompt(5);
  const std::vector<int32_t> p1 = Render(system, "Do you sell drills?");
  const std::vector<int32_t> p2 = Render(system, "What about saws?");
  const int64_t split = Split(p1);
  const std::vector<std::vector<float>> cold = Cold(p2, 2);
  {
    auto cache = std::make_unique<PrefixCache>(size_t{1} << 30, PrefixCache::kDefaultMinTokens,
                                               dir);
    auto a = model_->NewSession();
    FirstTurn(*a, p1, *cache);
    // A shallower entry too (the system prompt without its last 8 tokens).
    auto shallow = model_->NewSession();
    auto l = shallow->Prefill(std::span(p1).first(split - 8));
    ASSERT_OK(l.status());
    ASSERT_TRUE(cache->Insert(shallow->TakePrefixState(*l)));
    ASSERT_EQ(files().size(), 2u);
    EXPECT_EQ(cache->entries(), 2u);
    size_t on_disk = 0;
    for (const std::string& f : files()) on_disk += std::filesystem::file_size(f);
    EXPECT_EQ(cache->bytes(), on_disk);

    ExpectServesLikeCold(*cache, p2, split, cold);

    // Damage the deeper entry's file (the larger one): dropped with its file, the shallower one
    // serves, and the restored session still matches the cold one.
    std::vector<std::string> now = files();
    std::sort(now.begin(), now.end(), [](const std::string& x, const std::string& y) {
      return std::filesystem::file_size(x) > std::filesystem::file_size(y);
    });
    {
      std::fstream f(now[0], std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(64);
      f.put('\x5a');
    }
    ExpectServesLikeCold(*cache, p2, split - 8, cold);
    EXPECT_EQ(cache->entries(), 1u);
    EXPECT_FALSE(std::filesystem::exists(now[0]));
    // A file that went missing: dropped too, nothing served.
    std::filesystem::remove(files().at(0));
    EXPECT_EQ(cache->Deepest(p2, 0), nullptr);
    EXPECT_EQ(cache->entries(), 0u);
    EXPECT_EQ(cache->bytes(), 0u);
    ASSERT_TRUE(cache->Insert(shallow->TakePrefixState(*l)));
    EXPECT_EQ(files().size(), 1u);
  }
  EXPECT_TRUE(files().empty()) << "the cache removes its files when destroyed";
  std::filesystem::remove_all(dir);
}

// Kept across restarts (COLI_K3_PREFIX_CACHE_KEEP): the entry's file outlives its cache, and a
// cache created later with the same tag — a restarted server — serves it to a fresh session of
// a freshly loaded model bit for bit; a cache of another tag neither serves nor deletes it.
TEST_F(PrefixCacheSessionTest, AKeptEntryServesAfterARestartBitForBit) {
  const std::string dir = ::testing::TempDir() + "/k3_prefix_keep_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string system = LongSystemPrompt(5);
  const std::vector<int32_t> p1 = Render(system, "Do you sell drills?");
  const std::vector<int32_t> p2 = Render(system, "What about saws?");
  const int64_t split = Split(p1);
  {
    PrefixCache cache(size_t{1} << 30, PrefixCache::kDefaultMinTokens, dir, "00000000000000aa");
    auto a = model_->NewSession();
    FirstTurn(*a, p1, cache);
  }
  ASSERT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            1)
      << "a kept entry's file stays when its cache goes";
  {
    PrefixCache other(size_t{1} << 30, PrefixCache::kDefaultMinTokens, dir, "00000000000000bb");
    EXPECT_EQ(other.entries(), 0u);
    EXPECT_EQ(other.Deepest(p2, 0), nullptr);
  }
  const std::vector<std::vector<float>> cold = Cold(p2, 2);
  SetUp();  // the model loaded again
  PrefixCache again(size_t{1} << 30, PrefixCache::kDefaultMinTokens, dir, "00000000000000aa");
  EXPECT_EQ(again.entries(), 1u);
  ExpectServesLikeCold(again, p2, split, cold);
  again.Clear();
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "Clear deletes kept files too";
  std::filesystem::remove_all(dir);
}

TEST(PrefixCacheFile, RoundTripAndRefusals) {
  PrefixState p;
  p.at.tokens = {1, 2, 3};
  p.at.kda.resize(2);
  p.at.kda[0].S = {1.5f, -2.0f};
  p.at.kda[0].q_win = {3.0f};
  p.at.logits = {0.25f, 0.75f};
  p.mla = {{}, {4.0f, 5.0f, 6.0f}};
  const std::string bytes = SerializePrefixState(p);
  auto back = ParsePrefixState(bytes);
  ASSERT_OK(back.status());
  EXPECT_EQ(back->at.tokens, p.at.tokens);
  EXPECT_EQ(back->at.kda[0].S, p.at.kda[0].S);
  EXPECT_EQ(back->at.kda[0].q_win, p.at.kda[0].q_win);
  EXPECT_TRUE(back->at.kda[1].S.empty());
  EXPECT_EQ(back->at.logits, p.at.logits);
  EXPECT_EQ(back->mla, p.mla);
  std::string flipped = bytes;
  flipped[20] ^= 1;
  EXPECT_THAT(ParsePrefixState(flipped),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("checksum")));
  EXPECT_THAT(ParsePrefixState(bytes.substr(0, bytes.size() - 5)),
              StatusIs(absl::StatusCode::kDataLoss));
  // A checkpoint file is not an entry.
  EXPECT_THAT(ParsePrefixState(SerializeCheckpoint(p.at)),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("prefix cache file")));
}

TEST(PrefixCacheFile, PeekReadsTokensAndLogitsPresenceWithoutReadingTheRest) {
  PrefixState p;
  p.at.tokens = {7, 8, 9, 10};
  p.at.kda.resize(3);
  p.at.kda[1].S = {1.0f, 2.0f, 3.0f};
  p.at.kda[2].v_win = {4.0f};
  p.mla = {{}, {}, {5.0f, 6.0f}};
  std::string bytes = SerializePrefixState(p);
  auto head = PeekPrefixState(bytes);
  ASSERT_OK(head.status());
  EXPECT_EQ(head->tokens, p.at.tokens);
  EXPECT_FALSE(head->has_logits);
  p.at.logits = {0.5f};
  head = PeekPrefixState(SerializePrefixState(p));
  ASSERT_OK(head.status());
  EXPECT_TRUE(head->has_logits);
  // A damaged payload passes the peek (the checksum is the full read's job) ...
  bytes[bytes.size() - 12] ^= 1;
  EXPECT_OK(PeekPrefixState(bytes).status());
  EXPECT_THAT(ParsePrefixState(bytes), StatusIs(absl::StatusCode::kDataLoss));
  // ... a broken layout does not, nor a checkpoint file or a truncated head.
  EXPECT_THAT(PeekPrefixState(bytes.substr(0, 40)), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(PeekPrefixState(SerializeCheckpoint(p.at)),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("prefix cache file")));
  EXPECT_THAT(PeekPrefixState("COLIK3PX"), StatusIs(absl::StatusCode::kDataLoss));
}

// ---- the cache alone, on synthetic states ------------------------------------------------

PrefixState State(std::vector<int32_t> tokens, size_t payload_floats, bool logits = false) {
  PrefixState p;
  p.at.tokens = std::move(tokens);
  p.at.kda.resize(1);  // one layer (an MLA one), as a file must hold
  p.mla = {std::vector<float>(payload_floats, 1.0f)};
  if (logits) p.at.logits = {0.5f};
  return p;
}

std::vector<int32_t> Ids(int n, int32_t first) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

std::vector<int32_t> Plus(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(PrefixCacheEntries, DeepestEntryTheWholePromptBeginsWith) {
  PrefixCache cache(1 << 20, /*min_tokens=*/4);
  const std::vector<int32_t> sys = Ids(40, 100), longer = Plus(sys, Ids(20, 500));
  ASSERT_TRUE(cache.Insert(State(sys, 10)));
  ASSERT_TRUE(cache.Insert(State(longer, 10)));
  ASSERT_TRUE(cache.Insert(State(Plus(sys, Ids(30, 900)), 10)));  // another branch
  // A prompt on the first branch: the 60-token entry.
  auto e = cache.Deepest(Plus(longer, Ids(5, 7)), 0);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->at.tokens, longer);
  // Deeper than 60 asked: none; deeper than 39: the 60 one; off both branches: the system one.
  EXPECT_EQ(cache.Deepest(Plus(longer, Ids(5, 7)), 60), nullptr);
  EXPECT_EQ(cache.Deepest(Plus(longer, Ids(5, 7)), 39)->at.tokens, longer);
  EXPECT_EQ(cache.Deepest(Plus(sys, Ids(5, 7)), 0)->at.tokens, sys);
  // A prompt that differs in its first token: none.
  std::vector<int32_t> other = Plus(sys, Ids(5, 7));
  other[0] = 1;
  EXPECT_EQ(cache.Deepest(other, 0), nullptr);
  // The whole prompt is an entry: only served with logits (else nothing would be left to run).
  EXPECT_EQ(cache.Deepest(longer, 0)->at.tokens, sys);
  ASSERT_TRUE(cache.Insert(State(longer, 10, /*logits=*/true)));  // replaces the logit-less one
  EXPECT_EQ(cache.Deepest(longer, 0)->at.tokens, longer);
  EXPECT_FALSE(cache.Insert(State(longer, 10)));  // never replaces one with logits
  EXPECT_EQ(cache.entries(), 3u);
}

TEST(PrefixCacheEntries, LeastRecentlyUsedDroppedUnderTheByteBudget) {
  const std::vector<int32_t> a = Ids(40, 100), b = Ids(40, 200), c = Ids(40, 300);
  const size_t one = State(a, 1000).bytes();
  PrefixCache cache(one * 2 + one / 2, 8);
  ASSERT_TRUE(cache.Insert(State(a, 1000)));
  ASSERT_TRUE(cache.Insert(State(b, 1000)));
  EXPECT_EQ(cache.bytes(), 2 * one);
  // Using `a` makes `b` the least recently used: the third entry drops `b`.
  std::shared_ptr<const PrefixState> held = cache.Deepest(Plus(a, {1}), 0);
  ASSERT_NE(held, nullptr);
  ASSERT_TRUE(cache.Insert(State(c, 1000)));
  EXPECT_EQ(cache.entries(), 2u);
  EXPECT_EQ(cache.bytes(), 2 * one);
  EXPECT_EQ(cache.Deepest(Plus(b, {1}), 0), nullptr);
  EXPECT_NE(cache.Deepest(Plus(c, {1}), 0), nullptr);
  // Wants() marks a held entry used too: now `a` is the oldest, and goes next.
  EXPECT_FALSE(cache.Wants(c));
  EXPECT_TRUE(cache.Wants(b));
  ASSERT_TRUE(cache.Insert(State(b, 1000)));
  EXPECT_EQ(cache.Deepest(Plus(a, {1}), 0), nullptr);
  // An evicted entry stays whole for whoever still holds it.
  EXPECT_EQ(held->at.tokens, a);
  EXPECT_EQ(held->mla[0].size(), 1000u);
  // An entry larger than the whole budget is never kept (nor does it evict anything).
  EXPECT_FALSE(cache.Insert(State(Ids(40, 400), 4000)));
  EXPECT_EQ(cache.entries(), 2u);
  cache.Clear();
  EXPECT_EQ(cache.bytes(), 0u);
  EXPECT_EQ(cache.entries(), 0u);
}

// A parking cache counts an entry as coming from the first true Wants until Insert or Abandon:
// concurrent first turns of one system prompt make one copy and one file; a RAM cache inserts
// at once, so it needs no such mark.
TEST(PrefixCacheEntries, AParkedEntryOnItsWayIsWantedOnce) {
  const std::string dir = ::testing::TempDir() + "/k3_prefix_coming_" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::vector<int32_t> sys = Ids(40, 100);
  {
    PrefixCache parking(1 << 20, 4, dir);
    EXPECT_TRUE(parking.Wants(sys));
    EXPECT_FALSE(parking.Wants(sys)) << "another session's copy is on its way";
    EXPECT_TRUE(parking.Wants(Ids(40, 500))) << "other tokens are not";
    parking.Abandon(sys);
    EXPECT_TRUE(parking.Wants(sys)) << "abandoned: wanted again";
    ASSERT_TRUE(parking.Insert(State(sys, 10)));
    EXPECT_FALSE(parking.Wants(sys)) << "held now";
    parking.Clear();
    EXPECT_TRUE(parking.Wants(sys)) << "Insert ended the wait";
  }
  PrefixCache ram(1 << 20, 4);
  EXPECT_TRUE(ram.Wants(sys));
  EXPECT_TRUE(ram.Wants(sys));
  std::filesystem::remove_all(dir);
}

TEST(PrefixCacheEntries, ShortPrefixesAndAZeroBudgetKeepNothing) {
  PrefixCache cache(1 << 20);
  EXPECT_EQ(cache.min_tokens(), PrefixCache::kDefaultMinTokens);
  EXPECT_FALSE(cache.Wants(Ids(31, 1)));
  EXPECT_FALSE(cache.Insert(State(Ids(31, 1), 1)));
  EXPECT_TRUE(cache.Wants(Ids(32, 1)));
  EXPECT_TRUE(cache.Insert(State(Ids(32, 1), 1)));
  PrefixCache off(0);
  EXPECT_FALSE(off.Wants(Ids(64, 1)));
  EXPECT_FALSE(off.Insert(State(Ids(64, 1), 1)));
}

// Kept files: adopted by tag, most recently written first while the budget holds (the rest of
// the tag deleted), damaged heads and stale temp files of the tag deleted, other tags and
// unkept caches' files untouched.
TEST(PrefixCacheKept, AdoptionFollowsTagRecencyAndBudget) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/k3_prefix_adopt_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string tag = "0123456789abcdef", other_tag = "fedcba9876543210";
  auto kept_files = [&](const std::string& t) {
    std::vector<std::string> out;
    for (const auto& f : fs::directory_iterator(dir)) {
      const std::string name = f.path().filename().string();
      if (name[0] != '.' && name.find("-keep-" + t + "-") != std::string::npos) {
        out.push_back(f.path());
      }
    }
    return out;
  };
  const std::vector<int32_t> a = Ids(40, 100), b = Ids(41, 200), c = Ids(42, 300);
  {
    PrefixCache writer(1 << 20, 4, dir, tag);
    ASSERT_TRUE(writer.Insert(State(a, 1000)));
    ASSERT_TRUE(writer.Insert(State(b, 1000)));
    ASSERT_TRUE(writer.Insert(State(c, 1000, /*logits=*/true)));
    PrefixCache stranger(1 << 20, 4, dir, other_tag);
    ASSERT_TRUE(stranger.Insert(State(a, 10)));
    PrefixCache unkept(1 << 20, 4, dir);
    ASSERT_TRUE(unkept.Insert(State(b, 10)));
  }
  ASSERT_EQ(kept_files(tag).size(), 3u);
  ASSERT_EQ(kept_files(other_tag).size(), 1u);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 4)
      << "an unkept cache deletes its own files, and only those";
  // Written a, b, c; make the order explicit: c oldest, a newest.
  const auto now = fs::file_time_type::clock::now();
  std::map<int32_t, size_t> size_of;  // by first token
  for (const std::string& f : kept_files(tag)) {
    auto parsed = ParsePrefixState([&] {
      std::ifstream in(f, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    }());
    ASSERT_OK(parsed.status());
    const int32_t first = parsed->at.tokens.front();
    fs::last_write_time(f, now - std::chrono::minutes(first == 100 ? 1 : first == 200 ? 2 : 3));
    size_of[first] = fs::file_size(f);
  }
  {
    PrefixCache all(1 << 20, 4, dir, tag);
    EXPECT_EQ(all.entries(), 3u);
    EXPECT_EQ(all.bytes(), size_of[100] + size_of[200] + size_of[300]);
    auto e = all.Deepest(Plus(c, Ids(3, 1)), 0);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->at.tokens, c);
    EXPECT_EQ(e->mla, State(c, 1000).mla);
    EXPECT_EQ(all.Deepest(c, 0)->at.tokens, c) << "its logits came with it";
  }
  // A budget of two files: the two most recently written or used (c was just read back, a was
  // written last) are adopted, b is deleted; the other tag's file stays.
  {
    PrefixCache two(size_of[100] + size_of[300], 4, dir, tag);
    EXPECT_EQ(two.entries(), 2u);
    EXPECT_NE(two.Deepest(Plus(c, Ids(3, 1)), 0), nullptr);
    EXPECT_NE(two.Deepest(Plus(a, Ids(3, 1)), 0), nullptr);
    EXPECT_EQ(two.Deepest(Plus(b, Ids(3, 1)), 0), nullptr);
  }
  EXPECT_EQ(kept_files(tag).size(), 2u);
  EXPECT_EQ(kept_files(other_tag).size(), 1u);
  // A file whose head is cut off is deleted at adoption; a link named like a kept file (a state
  // planted in a shared folder) is neither served nor deleted.
  const std::vector<std::string> two = kept_files(tag);
  fs::resize_file(two.at(0), 20);
  const std::string planted = dir + "/coli-k3-prefix-keep-" + tag + "-planted-0.bin";
  fs::create_symlink(two.at(1), planted);
  {
    PrefixCache after(1 << 20, 4, dir, tag);
    EXPECT_EQ(after.entries(), 1u);
  }
  EXPECT_FALSE(fs::exists(two.at(0)));
  EXPECT_TRUE(fs::is_symlink(planted));
  EXPECT_TRUE(fs::exists(two.at(1))) << "the real file is adopted, not dropped as the link's twin";
  EXPECT_EQ(kept_files(other_tag).size(), 1u);
  fs::remove_all(dir);
}

// The tag names what a kept state depends on: the weight / config files (name, size, time),
// the numeric switches and the ISA (and the binary, the same in one test process) — not the
// thread count, the chunk size or other files.
TEST(PrefixCacheTag, ChangesWithWhatTheStatesDependOnAndOnlyThat) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/k3_prefix_tag_" + std::to_string(getpid());
  const std::string extra = dir + "_extra";
  fs::remove_all(dir);
  fs::remove_all(extra);
  fs::create_directories(dir);
  fs::create_directories(extra);
  std::ofstream(dir + "/config.json") << "{}";
  const std::string shard = dir + "/model-00001-of-00002.safetensors";
  std::ofstream(shard) << "weights";
  std::ofstream(extra + "/model-00002-of-00002.safetensors") << "more weights";
  ModelOptions o;
  auto tag = PrefixCacheTag(dir, o);
  ASSERT_OK(tag.status());
  EXPECT_THAT(*tag, ::testing::MatchesRegex("[0-9a-f]{16}"));
  auto same = [&](const ModelOptions& options) {
    auto t = PrefixCacheTag(dir, options);
    EXPECT_OK(t.status());
    return t.ok() && *t == *tag;
  };
  EXPECT_TRUE(same(o));
  ModelOptions changed = o;
  changed.threads = 7;
  changed.chunk = 3;
  changed.expert_gb = 1;
  EXPECT_TRUE(same(changed)) << "threads, chunk and cache sizes do not change values";
  for (auto edit : std::vector<std::function<void(ModelOptions&)>>{
           [](ModelOptions& m) { m.bits = 8; }, [](ModelOptions& m) { m.mla_bits = 32; },
           [](ModelOptions& m) { m.head_bits = 4; }, [](ModelOptions& m) { m.idot = false; },
           [](ModelOptions& m) { m.topp = 0.9; }, [](ModelOptions& m) { m.layers = 5; },
           [](ModelOptions& m) { m.mla_latent_norm_eps = 1e-5f; },
           [](ModelOptions& m) { m.mmap = true; }, [](ModelOptions& m) { m.vulkan = true; },
           [](ModelOptions& m) { m.vk_dense = 1; }}) {
    ModelOptions m = o;
    edit(m);
    EXPECT_FALSE(same(m)) << PrefixCacheSwitches(m);
  }
  ModelOptions with_extra = o;
  with_extra.extra_dirs = {extra};
  EXPECT_FALSE(same(with_extra)) << "K3_DIRS' shards count";
  std::ofstream(dir + "/README.txt") << "not a weight";
  EXPECT_TRUE(same(o));
  const auto written = fs::last_write_time(shard);
  fs::last_write_time(shard, written + std::chrono::seconds(1));
  EXPECT_FALSE(same(o)) << "a replaced shard";
  fs::last_write_time(shard, written);
  EXPECT_TRUE(same(o));
  std::ofstream(shard, std::ios::app) << "!";
  fs::last_write_time(shard, written);
  EXPECT_FALSE(same(o)) << "another size";
  EXPECT_THAT(PrefixCacheTag(dir + "_missing", o), StatusIs(absl::StatusCode::kFailedPrecondition));
  fs::remove_all(dir);
  fs::remove_all(extra);
}

}  // namespace
}  // namespace coli::k3
