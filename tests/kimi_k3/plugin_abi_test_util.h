// A gtest fixture for tests that drive the kimi_k3 plugin through its C ABI on the tiny fixture:
// loads build/plugins/libcoli_kimi_k3.so once per suite (host/plugin.h Plugin::Load, then the raw
// table, since host::Session sends one row per decode call), opens models with family options
// ("extra") and K3_LAYERS, creates/prefills sessions, runs decode calls of any rows and copies
// their outputs, reads session stats and records. Everything it opens is closed in TearDown.
//
//   class MyTest : public coli::k3::abi_test::PluginAbiTest {};
//   TEST_F(MyTest, X) {
//     coli_model_t* m = Open({{"spec", "4"}});
//     coli_session_t* s = NewSession(m);
//     Prefill(s, {5, 6, 7});
//     std::vector<Out> outs = Generate(s, 8);   // one row per call, stops after a finish
//   }
//
// Needs COLI_PLUGIN_DIR_FOR_TEST and COLI_K3_TINY_DIR (compile definitions).
#ifndef COLI_TESTS_KIMI_K3_PLUGIN_ABI_TEST_UTIL_H_
#define COLI_TESTS_KIMI_K3_PLUGIN_ABI_TEST_UTIL_H_

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status/status.h"
#include "common/status/status_matchers.h"
#include "gtest/gtest.h"
#include "host/plugin.h"
#include "plugin_api/coli_plugin.h"
#include "plugin_api/cpp/abi_util.h"

namespace coli::k3::abi_test {

// One decode row's sampling knobs (and the prefill seed of its generation).
struct Knobs {
  float temperature = 0, top_p = 0;
  int32_t top_k = 0, logprobs = 3;
  uint64_t seed = 0;
  // ABI 1.3 (zero = neutral); logit_bias is lent to the row for the call.
  float repetition_penalty = 0, frequency_penalty = 0, presence_penalty = 0, min_p = 0;
  std::vector<coli_logit_bias_t> logit_bias;
};

// One row's outputs, copied out of the plugin.
struct Out {
  int32_t token = -1, finish = COLI_FINISH_NONE;
  float logprob = 0;
  std::vector<coli_logprob_t> top;
  std::string text;
};

inline bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// Token, finish and text equal; logprob and every top entry equal bit for bit.
inline void ExpectSameOuts(const std::vector<Out>& got, const std::vector<Out>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t t = 0; t < got.size(); ++t) {
    SCOPED_TRACE(::testing::Message() << "step " << t);
    EXPECT_EQ(got[t].token, want[t].token);
    EXPECT_EQ(got[t].finish, want[t].finish);
    EXPECT_EQ(got[t].text, want[t].text);
    EXPECT_TRUE(SameBits(got[t].logprob, want[t].logprob))
        << got[t].logprob << " vs " << want[t].logprob;
    ASSERT_EQ(got[t].top.size(), want[t].top.size());
    for (size_t k = 0; k < got[t].top.size(); ++k) {
      EXPECT_EQ(got[t].top[k].id, want[t].top[k].id);
      EXPECT_TRUE(SameBits(got[t].top[k].logprob, want[t].top[k].logprob));
    }
  }
}

class PluginAbiTest : public ::testing::Test {
 protected:
  using Extra = std::vector<std::pair<std::string, std::string>>;

  static void SetUpTestSuite() {
    host::PluginReport report;
    auto plugin =
        host::Plugin::Load(std::string(COLI_PLUGIN_DIR_FOR_TEST) + "/libcoli_kimi_k3.so", &report);
    ASSERT_OK(plugin.status());
    plugin_ = std::move(plugin).value().release();
  }
  static void TearDownTestSuite() {
    delete plugin_;
    plugin_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(plugin_, nullptr); }
  void TearDown() override {
    for (coli_session_t* s : sessions_) api().session_destroy(s);
    for (coli_model_t* m : models_) api().model_close(m);
  }
  static const coli_plugin_api_t& api() { return plugin_->api(); }

  // A caller-owned error buffer and its status.
  struct Error {
    char text[1024] = {};
    coli_error_t e = abi::Init<coli_error_t>();
    Error() {
      e.message = text;
      e.capacity = sizeof(text);
    }
    absl::Status Status(coli_status_t code) const {
      if (code == 0) return absl::OkStatus();
      return absl::Status(abi::FromCode(code),
                          std::string(e.message, std::min(e.length, e.capacity - 1)));
    }
  };

  // The tiny fixture with these family options and K3_LAYERS (-1 = all); `adjust`, when given,
  // changes the other model options first (e.g. idot = 0 for K3_IDOT=0).
  absl::StatusOr<coli_model_t*> TryOpen(
      const Extra& extra, int32_t layers = -1,
      const std::function<void(coli_model_options_t*)>& adjust = nullptr) {
    coli_model_options_t options;
    coli_model_options_defaults(&options);
    if (adjust) adjust(&options);
    options.layers = layers;
    std::vector<coli_kv_t> kv;
    for (const auto& [k, v] : extra) kv.push_back({abi::Str(k), abi::Str(v)});
    options.extra = kv.data();
    options.n_extra = kv.size();
    auto args = abi::Init<coli_model_open_args_t>();
    args.model_dir = abi::Str(COLI_K3_TINY_DIR);
    args.options = &options;
    Error err;
    coli_model_t* m = nullptr;
    COLI_RETURN_IF_ERROR(err.Status(api().model_open(&args, &m, &err.e)));
    models_.push_back(m);
    return m;
  }
  coli_model_t* Open(const Extra& extra, int32_t layers = -1) {
    auto m = TryOpen(extra, layers);
    EXPECT_OK(m.status());
    return m.ok() ? *m : nullptr;
  }
  coli_session_t* NewSession(coli_model_t* m, int64_t max_context = 0) {
    auto options = abi::Init<coli_session_options_t>();
    options.max_context = max_context;
    Error err;
    coli_session_t* s = nullptr;
    EXPECT_OK(err.Status(api().session_create(m, &options, &s, &err.e)));
    if (s != nullptr) sessions_.push_back(s);
    return s;
  }
  static coli_prefill_result_t Prefill(coli_session_t* s, const std::vector<int32_t>& prompt,
                                       uint64_t seed = 0) {
    auto args = abi::Init<coli_prefill_args_t>();
    args.tokens = prompt.data();
    args.n_tokens = prompt.size();
    args.seed = seed;
    auto result = abi::Init<coli_prefill_result_t>();
    Error err;
    EXPECT_OK(err.Status(api().prefill(s, &args, &result, &err.e)));
    return result;
  }
  static coli_decode_row_t Row(coli_session_t* s, const Knobs& k) {
    auto row = abi::Init<coli_decode_row_t>();
    row.session = s;
    row.temperature = k.temperature;
    row.top_p = k.top_p;
    row.top_k = k.top_k;
    row.logprobs_top_k = k.logprobs;
    row.repetition_penalty = k.repetition_penalty;
    row.frequency_penalty = k.frequency_penalty;
    row.presence_penalty = k.presence_penalty;
    row.min_p = k.min_p;
    row.logit_bias = k.logit_bias.empty() ? nullptr : k.logit_bias.data();
    row.n_logit_bias = k.logit_bias.size();
    return row;
  }
  static Out Copy(const coli_decode_row_t& row) {
    Out o;
    o.token = row.token;
    o.finish = row.finish;
    o.logprob = row.logprob;
    o.top.assign(row.top_logprobs, row.top_logprobs + row.n_top_logprobs);
    o.text = std::string(abi::View(row.text));
    return o;
  }
  // One decode call with one row per session (every call must succeed); the outputs copied.
  static std::vector<Out> Call(const std::vector<coli_session_t*>& sessions,
                               const std::vector<Knobs>& knobs) {
    std::vector<coli_decode_row_t> rows;
    for (size_t i = 0; i < sessions.size(); ++i) rows.push_back(Row(sessions[i], knobs[i]));
    auto args = abi::Init<coli_decode_args_t>();
    args.rows = rows.data();
    args.n_rows = rows.size();
    Error err;
    EXPECT_OK(err.Status(api().decode(&args, &err.e)));
    std::vector<Out> out;
    for (const auto& r : rows) out.push_back(Copy(r));
    return out;
  }
  // Up to n steps of one session, one row per call, stopping after a finish.
  static std::vector<Out> Generate(coli_session_t* s, int n, const Knobs& k = {}) {
    std::vector<Out> out;
    for (int i = 0; i < n; ++i) {
      out.push_back(Call({s}, {k})[0]);
      if (out.back().finish != COLI_FINISH_NONE) break;
    }
    return out;
  }
  // A new session of `m`, prefilled with `prompt` (seed k.seed), then Generate.
  std::vector<Out> Fresh(coli_model_t* m, const std::vector<int32_t>& prompt, int n,
                         const Knobs& k = {}, int64_t max_context = 0) {
    coli_session_t* s = NewSession(m, max_context);
    Prefill(s, prompt, k.seed);
    return Generate(s, n, k);
  }
  static std::map<std::string, double> Stats(coli_session_t* s) {
    coli_stat_t stats[128];
    size_t count = 0;
    Error err;
    EXPECT_OK(err.Status(api().session_stats(s, stats, 128, &count, &err.e)));
    std::map<std::string, double> out;
    for (size_t i = 0; i < std::min<size_t>(count, 128); ++i) out[stats[i].name] = stats[i].value;
    return out;
  }
  // The model's current values (ABI 1.2 model_stats).
  static std::map<std::string, double> ModelStats(coli_model_t* m) {
    coli_stat_t stats[128];
    size_t count = 0;
    Error err;
    EXPECT_OK(err.Status(api().model_stats(m, stats, 128, &count, &err.e)));
    std::map<std::string, double> out;
    for (size_t i = 0; i < std::min<size_t>(count, 128); ++i) out[stats[i].name] = stats[i].value;
    return out;
  }
  static std::vector<int32_t> Record(coli_session_t* s) {
    std::vector<int32_t> ids(1 << 14);
    auto out = abi::Init<coli_token_buffer_t>();
    out.ids = ids.data();
    out.capacity = ids.size();
    Error err;
    EXPECT_OK(err.Status(api().session_record(s, &out, &err.e)));
    ids.resize(std::min(out.count, ids.size()));
    return ids;
  }

  static inline host::Plugin* plugin_ = nullptr;
  std::vector<coli_model_t*> models_;
  std::vector<coli_session_t*> sessions_;
};

// PluginAbiTest with the tiny model opened once per suite through the host's wrapper
// (host::Model), so requests go through host::Session like the engine's. One thread: the tiny
// model's passes are too small to share, and OpenMP's spinning on a loaded 2-core CI machine
// costs more than it saves.
class TinyHostModelTest : public PluginAbiTest {
 protected:
  static void SetUpTestSuite() {
    PluginAbiTest::SetUpTestSuite();
    ASSERT_NE(plugin_, nullptr);
    auto model = OpenTiny({});
    ASSERT_OK(model.status());
    model_ = std::move(model).value().release();
  }
  // The tiny model opened (again) with family options `extra`, e.g. {{"spec", "4"}}; one thread.
  static absl::StatusOr<std::unique_ptr<host::Model>> OpenTiny(
      const std::map<std::string, std::string>& extra) {
    host::ModelOptions options;
    options.fields.threads = 1;
    options.extra = extra;
    return plugin_->Open(COLI_K3_TINY_DIR, options, nullptr);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    PluginAbiTest::TearDownTestSuite();
  }
  void SetUp() override {
    PluginAbiTest::SetUp();
    ASSERT_NE(model_, nullptr);
  }

  static inline host::Model* model_ = nullptr;
};

}  // namespace coli::k3::abi_test

#endif  // COLI_TESTS_KIMI_K3_PLUGIN_ABI_TEST_UTIL_H_
