// Mixed passes through the kimi_k3 plugin ABI (tiny fixture, K3_CHUNK 4): while session A
// prefills a prompt of several chunks, sessions B and C decode on other threads; their plain
// rows ride A's chunk passes instead of running passes of their own. The overlap is arranged
// without sleeps: A's host progress callback (called between chunks, without the model's lock)
// starts one decode call per decoder and waits until the plugin reports their rows queued
// (model stat mix_queued_rows), so the next chunk pass carries them. The reference is the
// same sessions run alone, one row per call: tokens, logprobs, top logprobs, text and finish
// must be equal bit for bit, A's own decode after its prefill too. Edges: the per-pass bound
// (mix_rows) leaves a row queued when the prefill ends (it runs alone), a group over the bound
// never rides, a cancel with riders aboard lands at the chunk's end and releases the rows still
// queued, mix_rows 0 turns riding off, the checkpoint split of the prompt (ckpt).
#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugin_api/coli_plugin.h"
#include "plugin_api/cpp/abi_util.h"
#include "tests/kimi_k3/batched_decode_util.h"
#include "tests/kimi_k3/plugin_abi_test_util.h"

namespace coli {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

using ::coli::k3::batched_test::Ids;
using k3::abi_test::ExpectSameOuts;
using k3::abi_test::Knobs;
using k3::abi_test::Out;

constexpr int kChunk = 4;

const Knobs kGreedy = {.logprobs = 3};
const Knobs kSampled = {.temperature = 0.9f, .top_p = 0.95f, .logprobs = 4, .seed = 7};

class MixedPrefillTest : public k3::abi_test::PluginAbiTest {
 protected:
  coli_model_t* OpenChunked(const Extra& extra = {}) {
    auto m = TryOpen(extra, -1, [](coli_model_options_t* o) { o->chunk = kChunk; });
    EXPECT_OK(m.status());
    return m.ok() ? *m : nullptr;
  }

  static std::map<std::string, double> ModelStats(coli_model_t* m) {
    coli_stat_t stats[64];
    size_t count = 0;
    Error err;
    EXPECT_OK(err.Status(api().model_stats(m, stats, 64, &count, &err.e)));
    std::map<std::string, double> out;
    for (size_t i = 0; i < std::min<size_t>(count, 64); ++i) out[stats[i].name] = stats[i].value;
    return out;
  }

  // Waits (bounded) until `want` decode rows are queued for the running prefill of `m`.
  static bool WaitQueued(coli_model_t* m, double want) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (ModelStats(m)["mix_queued_rows"] != want) {
      if (std::chrono::steady_clock::now() > until) {
        ADD_FAILURE() << "rows never queued: " << ModelStats(m)["mix_queued_rows"] << " of "
                      << want;
        return false;
      }
      std::this_thread::yield();
    }
    return true;
  }

  // One decode call of one row, on another thread.
  static std::future<Out> Async(coli_session_t* s, const Knobs& k) {
    return std::async(std::launch::async, [s, k] { return Call({s}, {k})[0]; });
  }

  // Prefills `s` with `prompt`; `on_report(done, total)` is the host's progress callback
  // (non-zero cancels). Returns the call's status.
  static absl::Status PrefillReporting(coli_session_t* s, const std::vector<int32_t>& prompt,
                                       std::function<int32_t(uint64_t, uint64_t)> on_report) {
    auto args = abi::Init<coli_prefill_args_t>();
    args.tokens = prompt.data();
    args.n_tokens = prompt.size();
    args.progress = [](void* user, uint64_t done, uint64_t total, const char*, size_t) {
      return (*static_cast<std::function<int32_t(uint64_t, uint64_t)>*>(user))(done, total);
    };
    args.progress_user = &on_report;
    auto result = abi::Init<coli_prefill_result_t>();
    Error err;
    return err.Status(api().prefill(s, &args, &result, &err.e));
  }

  // A prefilled session that has sampled its first token (so its next call feeds one).
  coli_session_t* Decoding(coli_model_t* m, const std::vector<int32_t>& prompt, const Knobs& k,
                           std::vector<Out>* outs) {
    coli_session_t* s = NewSession(m);
    Prefill(s, prompt, k.seed);
    outs->push_back(Call({s}, {k})[0]);
    return s;
  }
};

// The main scenario on `m`: A prefills `prompt_a` while B (greedy) and C (seeded sampling) each
// ride `rides` of its chunk passes (one per chunk from the first), then each decodes 3 more
// steps alone and A decodes 5; everything against lone runs on the same model.
class MixedPrefillScenario : public MixedPrefillTest {
 public:
  void Run(coli_model_t* m, const std::vector<int32_t>& prompt_a, int rides) {
    constexpr int kAfter = 3, kAGen = 5;
    const std::vector<int32_t> prompt_b = Ids(5, 1), prompt_c = Ids(7, 2);
    // Lone runs (one row per call, nothing else running).
    coli_session_t* lb = NewSession(m);
    Prefill(lb, prompt_b, kGreedy.seed);
    const std::vector<Out> lone_b = Generate(lb, 1 + rides + kAfter, kGreedy);
    coli_session_t* lc = NewSession(m);
    Prefill(lc, prompt_c, kSampled.seed);
    const std::vector<Out> lone_c = Generate(lc, 1 + rides + kAfter, kSampled);
    coli_session_t* la = NewSession(m);
    Prefill(la, prompt_a);
    const std::vector<Out> lone_a = Generate(la, kAGen);
    ASSERT_EQ(lone_b.size(), static_cast<size_t>(1 + rides + kAfter));  // no early stop
    ASSERT_EQ(lone_c.size(), static_cast<size_t>(1 + rides + kAfter));
    ASSERT_EQ(lone_a.size(), static_cast<size_t>(kAGen));

    std::vector<Out> got_b, got_c;
    coli_session_t* b = Decoding(m, prompt_b, kGreedy, &got_b);
    coli_session_t* c = Decoding(m, prompt_c, kSampled, &got_c);
    coli_session_t* a = NewSession(m);
    auto before_b = Stats(b);
    std::future<Out> fb, fc;
    int left = rides;
    int64_t last = -1;
    auto collect = [&] {
      if (fb.valid()) got_b.push_back(fb.get());
      if (fc.valid()) got_c.push_back(fc.get());
    };
    // At each chunk boundary (its first report): the rows carried by the pass just run have
    // their results (collect), then B and C start their next step and A goes on once both rows
    // are queued, so the next pass carries them.
    ASSERT_OK(PrefillReporting(a, prompt_a, [&](uint64_t done, uint64_t total) -> int32_t {
      if (static_cast<int64_t>(done) == last || done >= total) return 0;
      last = static_cast<int64_t>(done);
      collect();
      if (left > 0) {
        --left;
        fb = Async(b, kGreedy);
        fc = Async(c, kSampled);
        WaitQueued(m, 2);
      }
      return 0;
    }));
    collect();
    EXPECT_EQ(left, 0);
    // B ran no pass of its own meanwhile: what it was charged are its shares of A's passes.
    auto ridden_b = Stats(b);
    EXPECT_EQ(ridden_b["decode_passes"], before_b["decode_passes"]);
    EXPECT_GT(ridden_b["expert_hits"] + ridden_b["expert_misses"],
              before_b["expert_hits"] + before_b["expert_misses"]);
    EXPECT_GT(ridden_b["compute_seconds"], before_b["compute_seconds"]);
    for (int i = 0; i < kAfter; ++i) {
      got_b.push_back(Call({b}, {kGreedy})[0]);
      got_c.push_back(Call({c}, {kSampled})[0]);
    }
    {
      SCOPED_TRACE("B");
      ExpectSameOuts(got_b, lone_b);
    }
    {
      SCOPED_TRACE("C");
      ExpectSameOuts(got_c, lone_c);
    }
    {
      SCOPED_TRACE("A");
      ExpectSameOuts(Generate(a, kAGen), lone_a);
    }
    EXPECT_EQ(Record(a), Record(la));
    EXPECT_EQ(Record(b), Record(lb));
    // Every ride was a pass saved: B's and C's own decode passes fell by their rides.
    auto sa = Stats(a), sb = Stats(b), sc = Stats(c);
    EXPECT_EQ(sa["mixed_passes"], rides);
    EXPECT_EQ(sa["mixed_rows"], 2 * rides);
    EXPECT_EQ(sb["decode_rides"], rides);
    EXPECT_EQ(sc["decode_rides"], rides);
    EXPECT_EQ(sb["decode_passes"], Stats(lb)["decode_passes"] - rides);
    EXPECT_EQ(sc["decode_passes"], Stats(lc)["decode_passes"] - rides);
    EXPECT_EQ(Stats(la)["mixed_passes"], 0);
    EXPECT_EQ(Stats(lb)["decode_rides"], 0);
    EXPECT_EQ(ModelStats(m)["mix_queued_rows"], 0);
  }
};

TEST_F(MixedPrefillScenario, DecodeRowsRideThePrefillAndMatchLoneRuns) {
  coli_model_t* m = OpenChunked();
  ASSERT_NE(m, nullptr);
  Run(m, Ids(40, 9), 6);  // 10 chunks, 6 of them carry B and C
}

// With checkpoints on and a message end inside the prompt, the plugin prefills it in two parts
// (split where the last message starts); the rides go on across the split.
TEST_F(MixedPrefillScenario, RidesGoOnAcrossTheCheckpointSplit) {
  coli_model_t* m = OpenChunked({{"ckpt", "2"}});
  ASSERT_NE(m, nullptr);
  std::vector<int32_t> eom(4);
  auto out = abi::Init<coli_token_buffer_t>();
  out.ids = eom.data();
  out.capacity = eom.size();
  Error err;
  ASSERT_OK(err.Status(api().tokenize(m, abi::Str("<|end_of_msg|>"), 1, &out, &err.e)));
  ASSERT_EQ(out.count, 1u);
  std::vector<int32_t> prompt = Ids(30, 9);
  prompt[13] = eom[0];  // the split: after the second message end from the back
  prompt[25] = eom[0];  // parts of 14 and 16 tokens: chunks 4 4 4 2 | 4 4 4 4
  Run(m, prompt, 7);
}

// mix_rows 1: the last chunk pass boards one of two queued rows; the other is still queued when
// the prefill ends and runs on its own. A call of two rows (over the bound) never rides.
TEST_F(MixedPrefillTest, RowsLeftQueuedAtThePrefillEndRunAlone) {
  coli_model_t* m = OpenChunked({{"mix_rows", "1"}});
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> pb = Ids(5, 1), pc = Ids(7, 2);
  auto lone = [&](const std::vector<int32_t>& p, const Knobs& k) { return Fresh(m, p, 3, k); };
  const std::vector<Out> lone_b = lone(pb, kGreedy), lone_c = lone(pc, kSampled);
  std::vector<Out> got_b, got_c;
  coli_session_t* b = Decoding(m, pb, kGreedy, &got_b);
  coli_session_t* c = Decoding(m, pc, kSampled, &got_c);
  coli_session_t* a = NewSession(m);
  std::future<Out> fb, fc;
  int64_t last = -1;
  ASSERT_OK(PrefillReporting(a, Ids(8, 9), [&](uint64_t done, uint64_t) -> int32_t {
    if (static_cast<int64_t>(done) == last) return 0;
    last = static_cast<int64_t>(done);
    if (done == 0) {
      // Two rows in one call: over the bound, so it takes the model's lock itself (free now:
      // the callback runs between chunks).
      auto both = std::async(std::launch::async, [&] {
                    return Call({b, c}, {kGreedy, kSampled});
                  }).get();
      got_b.push_back(both[0]);
      got_c.push_back(both[1]);
    } else if (done == kChunk) {
      fb = Async(b, kGreedy);
      WaitQueued(m, 1);
      fc = Async(c, kSampled);
      WaitQueued(m, 2);
    }
    return 0;
  }));
  got_b.push_back(fb.get());
  got_c.push_back(fc.get());
  ExpectSameOuts(got_b, lone_b);
  ExpectSameOuts(got_c, lone_c);
  auto sb = Stats(b), sc = Stats(c);
  EXPECT_EQ(sb["decode_rides"], 1);  // B queued first, so it boarded the last pass
  EXPECT_EQ(sc["decode_rides"], 0);  // C waited past the prefill's end, then ran alone
  EXPECT_EQ(sc["decode_passes"], 2);
  EXPECT_EQ(Stats(a)["mixed_rows"], 1);
  EXPECT_EQ(ModelStats(m)["mix_queued_rows"], 0);
}

// A cancel answered between the layers of a pass with riders aboard lands at that chunk's end:
// the riders get their rows, the chunk is kept, the prefill answers CANCELLED, and a row that
// queued during that pass runs on its own after it. A's next prefill reuses the kept chunk.
TEST_F(MixedPrefillTest, CancelWithRidersAboardLandsAtTheChunkEnd) {
  coli_model_t* m = OpenChunked();
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> pa = Ids(16, 9), pb = Ids(5, 1), pc = Ids(7, 2), pd = Ids(6, 3);
  const std::vector<Out> lone_b = Fresh(m, pb, 2, kGreedy), lone_c = Fresh(m, pc, 2, kSampled),
                         lone_d = Fresh(m, pd, 2, kGreedy), lone_a = Fresh(m, pa, 4);
  std::vector<Out> got_b, got_c, got_d;
  coli_session_t* b = Decoding(m, pb, kGreedy, &got_b);
  coli_session_t* c = Decoding(m, pc, kSampled, &got_c);
  coli_session_t* d = Decoding(m, pd, kGreedy, &got_d);
  coli_session_t* a = NewSession(m);
  std::future<Out> fb, fc, fd;
  bool queued = false;
  EXPECT_THAT(PrefillReporting(a, pa,
                               [&](uint64_t done, uint64_t) -> int32_t {
                                 if (!queued) {
                                   queued = true;
                                   fb = Async(b, kGreedy);
                                   fc = Async(c, kSampled);
                                   WaitQueued(m, 2);
                                   return 0;
                                 }
                                 // The first report after B and C boarded is between two layers of
                                 // their pass.
                                 if (ModelStats(m)["mix_queued_rows"] != 0 || fd.valid())
                                   return fd.valid();
                                 fd = Async(d, kGreedy);
                                 WaitQueued(m, 1);
                                 return 1;
                               }),
              StatusIs(absl::StatusCode::kCancelled));
  got_b.push_back(fb.get());
  got_c.push_back(fc.get());
  got_d.push_back(fd.get());
  ExpectSameOuts(got_b, lone_b);
  ExpectSameOuts(got_c, lone_c);
  ExpectSameOuts(got_d, lone_d);
  EXPECT_EQ(Record(a), std::vector<int32_t>(pa.begin(), pa.begin() + kChunk));
  EXPECT_EQ(Stats(a)["mixed_rows"], 2);
  EXPECT_EQ(Stats(b)["decode_rides"], 1);
  EXPECT_EQ(Stats(d)["decode_rides"], 0);
  EXPECT_EQ(Prefill(a, pa).tokens_reused, static_cast<size_t>(kChunk));
  ExpectSameOuts(Generate(a, 4), lone_a);
}

TEST_F(MixedPrefillTest, MixRowsZeroNeverRidesAndBadValuesAreRefused) {
  EXPECT_THAT(TryOpen({{"mix_rows", "-1"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mix_rows")));
  EXPECT_THAT(TryOpen({{"mix_rows", "many"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_K3_MIX_ROWS")));
  coli_model_t* m = OpenChunked({{"mix_rows", "0"}});
  ASSERT_NE(m, nullptr);
  const std::vector<Out> lone_b = Fresh(m, Ids(5, 1), 3, kGreedy);
  std::vector<Out> got_b;
  coli_session_t* b = Decoding(m, Ids(5, 1), kGreedy, &got_b);
  coli_session_t* a = NewSession(m);
  int64_t last = -1;
  ASSERT_OK(PrefillReporting(a, Ids(12, 9), [&](uint64_t done, uint64_t total) -> int32_t {
    if (static_cast<int64_t>(done) == last || done >= total || got_b.size() == 3) return 0;
    last = static_cast<int64_t>(done);
    got_b.push_back(Async(b, kGreedy).get());  // between chunks: the lock is free, it runs
    return 0;
  }));
  ExpectSameOuts(got_b, lone_b);
  EXPECT_EQ(Stats(b)["decode_rides"], 0);
  EXPECT_EQ(Stats(a)["mixed_passes"], 0);
}

}  // namespace
}  // namespace coli
