// response_format rows riding another session's prefill chunk passes (mixed passes, K3_CHUNK 4)
// through the kimi_k3 C table on the tiny fixture: a constrained row samples after the pass
// like any rider, so its tokens, logprobs and text equal those of the same row run alone, bit for
// bit, and the answer still ends after a complete value. The overlap is arranged as in
// mixed_prefill_test.cc: the prefill's progress callback starts the rider's decode call and waits
// until the plugin reports the row queued (model stat mix_queued_rows).
#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/status/status_matchers.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "plugin_api/coli_plugin.h"
#include "plugin_api/cpp/abi_util.h"
#include "tests/kimi_k3/batched_decode_util.h"
#include "tests/kimi_k3/plugin_abi_test_util.h"

namespace coli {
namespace {

using ::coli::k3::batched_test::Ids;
using k3::abi_test::ExpectSameOuts;
using k3::abi_test::Knobs;
using k3::abi_test::Out;

constexpr char kFormat[] =
    R"({"type":"json_schema","json_schema":{"name":"t","schema":{"type":"object",)"
    R"("properties":{"word":{"type":"string","maxLength":6},"ok":{"type":"boolean"}},)"
    R"("required":["word","ok"],"additionalProperties":false}}})";

class K3ConstrainedRideTest : public k3::abi_test::PluginAbiTest {
 protected:
  static void PrefillFormat(coli_session_t* s, const std::vector<int32_t>& prompt, uint64_t seed) {
    auto args = abi::Init<coli_prefill_args_t>();
    args.tokens = prompt.data();
    args.n_tokens = prompt.size();
    args.seed = seed;
    args.response_format = abi::Str(kFormat);
    auto result = abi::Init<coli_prefill_result_t>();
    Error err;
    EXPECT_OK(err.Status(api().prefill(s, &args, &result, &err.e)));
  }
  static double QueuedRows(coli_model_t* m) {
    coli_stat_t stats[64];
    size_t count = 0;
    Error err;
    EXPECT_OK(err.Status(api().model_stats(m, stats, 64, &count, &err.e)));
    for (size_t i = 0; i < std::min<size_t>(count, 64); ++i) {
      if (std::string(stats[i].name) == "mix_queued_rows") return stats[i].value;
    }
    return -1;
  }
  static std::string Text(const std::vector<Out>& outs) {
    std::string text;
    for (const Out& o : outs) text += o.text;
    return text;
  }
};

TEST_F(K3ConstrainedRideTest, ConstrainedRowsRideAPrefillAndMatchLoneRuns) {
  auto opened = TryOpen({}, -1, [](coli_model_options_t* o) {
    o->chunk = 4;
    o->threads = 1;
  });
  ASSERT_OK(opened.status());
  coli_model_t* m = *opened;
  constexpr int kRides = 6;
  for (const Knobs& k :
       {Knobs{.logprobs = 3}, Knobs{.temperature = 0.9f, .logprobs = 3, .seed = 5}}) {
    SCOPED_TRACE(::testing::Message() << "temperature " << k.temperature);
    const std::vector<int32_t> prompt_b = Ids(5, 1);
    coli_session_t* lone = NewSession(m);
    PrefillFormat(lone, prompt_b, k.seed);
    const std::vector<Out> want = Generate(lone, 400, k);
    ASSERT_GT(want.size(), static_cast<size_t>(kRides + 1));
    ASSERT_EQ(want.back().finish, COLI_FINISH_STOP);
    const nlohmann::json value = nlohmann::json::parse(Text(want), nullptr, false);
    ASSERT_TRUE(value.is_object()) << Text(want);
    EXPECT_TRUE(value["ok"].is_boolean());

    coli_session_t* b = NewSession(m);
    PrefillFormat(b, prompt_b, k.seed);
    std::vector<Out> got = {Call({b}, {k})[0]};
    coli_session_t* a = NewSession(m);
    std::future<Out> fb;
    int left = kRides;
    int64_t last = -1;
    const std::function<int32_t(uint64_t, uint64_t)> report = [&](uint64_t done,
                                                                  uint64_t total) -> int32_t {
      if (static_cast<int64_t>(done) == last || done >= total) return 0;
      last = static_cast<int64_t>(done);
      if (fb.valid()) got.push_back(fb.get());
      if (left > 0) {
        --left;
        fb = std::async(std::launch::async, [b, k] { return Call({b}, {k})[0]; });
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (QueuedRows(m) != 1 && std::chrono::steady_clock::now() < until) {
          std::this_thread::yield();
        }
      }
      return 0;
    };
    // A's prompt is unconstrained and plain; 40 tokens = 10 chunks, 6 carry B.
    auto args_a = Ids(40, 9);
    {
      auto args = abi::Init<coli_prefill_args_t>();
      args.tokens = args_a.data();
      args.n_tokens = args_a.size();
      args.progress = [](void* user, uint64_t done, uint64_t total, const char*, size_t) {
        return (*static_cast<const std::function<int32_t(uint64_t, uint64_t)>*>(user))(done, total);
      };
      args.progress_user = const_cast<std::function<int32_t(uint64_t, uint64_t)>*>(&report);
      auto result = abi::Init<coli_prefill_result_t>();
      Error err;
      ASSERT_OK(err.Status(api().prefill(a, &args, &result, &err.e)));
    }
    if (fb.valid()) got.push_back(fb.get());
    EXPECT_EQ(left, 0);
    EXPECT_EQ(Stats(b)["decode_rides"], kRides);
    while (got.back().finish == COLI_FINISH_NONE && got.size() < want.size() + 1) {
      got.push_back(Call({b}, {k})[0]);
    }
    ExpectSameOuts(got, want);
  }
}

}  // namespace
}  // namespace coli
