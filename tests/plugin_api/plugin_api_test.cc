// The plugin ABI: layout frozen (and equal in C and C++), status codes equal absl's, the C++
// helpers, and the loader refusing every broken fake plugin by name while keeping the good ones.
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "common/log/log.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "host/engine.h"
#include "host/plugin.h"
#include "plugin_api/coli_plugin.h"
#include "plugin_api/cpp/abi_util.h"

extern "C" size_t coli_test_c_layout(size_t* out, size_t capacity);
extern "C" int coli_test_c_defaults_chunk(void);

namespace coli {
namespace {

using ::coli::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

struct Frozen {
  const char* field;
  size_t offset, struct_size;
};

// ABI 1.11 on LP64 (x86-64, aarch64; 1.5 and 1.6 moved nothing; 1.7 grew the prefill structs;
// 1.8 appended the switch table and added coli_switch_t; 1.9 grew the prefill result; 1.10 only
// added a switch target; 1.11 appended session_copy).
// Append-only: a change here breaks every built plugin (the function table grows with each minor,
// at its end; no existing offset moves).
const Frozen kFrozen[] = {
    {"coli_error_t.struct_size", 0, 32},
    {"coli_error_t.message", 8, 32},
    {"coli_error_t.capacity", 16, 32},
    {"coli_error_t.length", 24, 32},
    {"coli_string_t.data", 0, 16},
    {"coli_string_t.size", 8, 16},
    {"coli_kv_t.key", 0, 32},
    {"coli_kv_t.value", 16, 32},
    {"coli_token_buffer_t.struct_size", 0, 32},
    {"coli_token_buffer_t.ids", 8, 32},
    {"coli_token_buffer_t.capacity", 16, 32},
    {"coli_token_buffer_t.count", 24, 32},
    {"coli_byte_buffer_t.struct_size", 0, 32},
    {"coli_byte_buffer_t.data", 8, 32},
    {"coli_byte_buffer_t.capacity", 16, 32},
    {"coli_byte_buffer_t.count", 24, 32},
    {"coli_abi_version_t.struct_size", 0, 16},
    {"coli_abi_version_t.major", 8, 16},
    {"coli_abi_version_t.minor", 12, 16},
    {"coli_host_api_t.struct_size", 0, 32},
    {"coli_host_api_t.abi_major", 8, 32},
    {"coli_host_api_t.abi_minor", 12, 32},
    {"coli_host_api_t.host_data", 16, 32},
    {"coli_host_api_t.log", 24, 32},
    {"coli_model_options_t.struct_size", 0, 160},
    {"coli_model_options_t.bits", 8, 160},
    {"coli_model_options_t.mla_bits", 12, 160},
    {"coli_model_options_t.head_bits", 16, 160},
    {"coli_model_options_t.idot", 20, 160},
    {"coli_model_options_t.chunk", 24, 160},
    {"coli_model_options_t.direct", 28, 160},
    {"coli_model_options_t.pipe", 32, 160},
    {"coli_model_options_t.load_threads", 36, 160},
    {"coli_model_options_t.expert_gb", 40, 160},
    {"coli_model_options_t.topp", 48, 160},
    {"coli_model_options_t.max_context", 56, 160},
    {"coli_model_options_t.layers", 64, 160},
    {"coli_model_options_t.threads", 68, 160},
    {"coli_model_options_t.mla_norm_eps", 72, 160},
    {"coli_model_options_t.extra_dirs", 80, 160},
    {"coli_model_options_t.n_extra_dirs", 88, 160},
    {"coli_model_options_t.trace_path", 96, 160},
    {"coli_model_options_t.x0_path", 112, 160},
    {"coli_model_options_t.logits_path", 128, 160},
    {"coli_model_options_t.extra", 144, 160},
    {"coli_model_options_t.n_extra", 152, 160},
    {"coli_model_open_args_t.struct_size", 0, 48},
    {"coli_model_open_args_t.model_dir", 8, 48},
    {"coli_model_open_args_t.options", 24, 48},
    {"coli_model_open_args_t.progress", 32, 48},
    {"coli_model_open_args_t.progress_user", 40, 48},
    {"coli_special_token_t.text", 0, 24},
    {"coli_special_token_t.id", 16, 24},
    {"coli_model_info_t.struct_size", 0, 96},
    {"coli_model_info_t.family", 8, 96},
    {"coli_model_info_t.name", 24, 96},
    {"coli_model_info_t.vocab_size", 40, 96},
    {"coli_model_info_t.bos_id", 44, 96},
    {"coli_model_info_t.eos_id", 48, 96},
    {"coli_model_info_t.chat_capabilities", 52, 96},
    {"coli_model_info_t.context_capacity", 56, 96},
    {"coli_model_info_t.special_tokens", 64, 96},
    {"coli_model_info_t.n_special_tokens", 72, 96},
    {"coli_model_info_t.stop_ids", 80, 96},
    {"coli_model_info_t.n_stop_ids", 88, 96},
    {"coli_chat_render_args_t.struct_size", 0, 32},
    {"coli_chat_render_args_t.request_json", 8, 32},
    {"coli_chat_render_args_t.add_generation_prompt", 24, 32},
    {"coli_chat_render_result_t.struct_size", 0, 80},
    {"coli_chat_render_result_t.tokens", 8, 80},
    {"coli_chat_render_result_t.text", 40, 80},
    {"coli_chat_render_result_t.chat_parse_mode", 72, 80},
    {"coli_session_options_t.struct_size", 0, 16},
    {"coli_session_options_t.max_context", 8, 16},
    {"coli_prefill_args_t.struct_size", 0, 80},
    {"coli_prefill_args_t.tokens", 8, 80},
    {"coli_prefill_args_t.n_tokens", 16, 80},
    {"coli_prefill_args_t.chat_parse_mode", 24, 80},
    {"coli_prefill_args_t.seed", 32, 80},
    {"coli_prefill_args_t.progress", 40, 80},
    {"coli_prefill_args_t.progress_user", 48, 80},
    {"coli_prefill_args_t.response_format", 56, 80},        // v1.4 input
    {"coli_prefill_args_t.want_prompt_logprobs", 72, 80},   // v1.7 input
    {"coli_prefill_args_t.prompt_logprobs_top_k", 76, 80},  // v1.7 input
    {"coli_prefill_result_t.struct_size", 0, 72},
    {"coli_prefill_result_t.tokens_reused", 8, 72},
    {"coli_prefill_result_t.tokens_computed", 16, 72},
    {"coli_prefill_result_t.context_used", 24, 72},
    {"coli_prefill_result_t.context_capacity", 32, 72},
    {"coli_prefill_result_t.prompt_logprobs", 40, 72},         // v1.7 output
    {"coli_prefill_result_t.n_prompt_logprobs", 48, 72},       // v1.7 output
    {"coli_prefill_result_t.prompt_logprob_ranks", 56, 72},    // v1.9 output
    {"coli_prefill_result_t.n_prompt_logprob_ranks", 64, 72},  // v1.9 output
    {"coli_chat_event_t.struct_size", 0, 32},
    {"coli_chat_event_t.channel", 8, 32},
    {"coli_chat_event_t.end_of_message", 12, 32},
    {"coli_chat_event_t.text", 16, 32},
    {"coli_logprob_t.id", 0, 8},
    {"coli_logprob_t.logprob", 4, 8},
    {"coli_decode_row_t.struct_size", 0, 128},
    {"coli_decode_row_t.session", 8, 128},
    {"coli_decode_row_t.temperature", 16, 128},
    {"coli_decode_row_t.top_p", 20, 128},
    {"coli_decode_row_t.top_k", 24, 128},
    {"coli_decode_row_t.logprobs_top_k", 28, 128},
    {"coli_decode_row_t.token", 32, 128},
    {"coli_decode_row_t.finish", 36, 128},
    {"coli_decode_row_t.text", 40, 128},
    {"coli_decode_row_t.logprob", 56, 128},
    {"coli_decode_row_t.top_logprobs", 64, 128},
    {"coli_decode_row_t.n_top_logprobs", 72, 128},
    {"coli_decode_row_t.events", 80, 128},
    {"coli_decode_row_t.n_events", 88, 128},
    {"coli_decode_row_t.repetition_penalty", 96, 128},  // v1.3 inputs
    {"coli_decode_row_t.frequency_penalty", 100, 128},
    {"coli_decode_row_t.presence_penalty", 104, 128},
    {"coli_decode_row_t.min_p", 108, 128},
    {"coli_decode_row_t.logit_bias", 112, 128},
    {"coli_decode_row_t.n_logit_bias", 120, 128},
    {"coli_logit_bias_t.id", 0, 8},
    {"coli_logit_bias_t.bias", 4, 8},
    {"coli_decode_args_t.struct_size", 0, 24},
    {"coli_decode_args_t.rows", 8, 24},
    {"coli_decode_args_t.n_rows", 16, 24},
    {"coli_stat_t.name", 0, 16},
    {"coli_stat_t.value", 8, 16},
    {"coli_plugin_api_t.struct_size", 0, 184},
    {"coli_plugin_api_t.family", 8, 184},
    {"coli_plugin_api_t.plugin_version", 16, 184},
    {"coli_plugin_api_t.shutdown", 24, 184},
    {"coli_plugin_api_t.probe", 32, 184},
    {"coli_plugin_api_t.model_open", 40, 184},
    {"coli_plugin_api_t.model_close", 48, 184},
    {"coli_plugin_api_t.model_info", 56, 184},
    {"coli_plugin_api_t.tokenize", 64, 184},
    {"coli_plugin_api_t.detokenize", 72, 184},
    {"coli_plugin_api_t.render_chat", 80, 184},
    {"coli_plugin_api_t.session_create", 88, 184},
    {"coli_plugin_api_t.session_destroy", 96, 184},
    {"coli_plugin_api_t.session_reset", 104, 184},
    {"coli_plugin_api_t.prefill", 112, 184},
    {"coli_plugin_api_t.decode", 120, 184},
    {"coli_plugin_api_t.session_stats", 128, 184},
    {"coli_plugin_api_t.session_record", 136, 184},
    {"coli_plugin_api_t.model_stats", 144, 184},
    {"coli_plugin_api_t.session_reusable", 152, 184},
    {"coli_plugin_api_t.switches", 160, 184},      // v1.8
    {"coli_plugin_api_t.n_switches", 168, 184},    // v1.8
    {"coli_plugin_api_t.session_copy", 176, 184},  // v1.11
    {"coli_switch_t.struct_size", 0, 104},         // v1.8
    {"coli_switch_t.name", 8, 104},
    {"coli_switch_t.field", 16, 104},
    {"coli_switch_t.kind", 20, 104},
    {"coli_switch_t.extra_key", 24, 104},
    {"coli_switch_t.int_min", 32, 104},
    {"coli_switch_t.int_max", 40, 104},
    {"coli_switch_t.int_values", 48, 104},
    {"coli_switch_t.n_int_values", 56, 104},
    {"coli_switch_t.real_min", 64, 104},
    {"coli_switch_t.real_max", 72, 104},
    {"coli_switch_t.real_min_exclusive", 80, 104},
    {"coli_switch_t.expected", 88, 104},
    {"coli_switch_t.help", 96, 104},
};

TEST(AbiLayout, MatchesFrozenOffsetsInCpp) {
  std::vector<Frozen> now;
#define X(type, field) now.push_back({#type "." #field, offsetof(type, field), sizeof(type)});
#include "tests/plugin_api/abi_layout.inc"
#undef X
  ASSERT_EQ(now.size(), std::size(kFrozen));
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_STREQ(now[i].field, kFrozen[i].field);
    EXPECT_EQ(now[i].offset, kFrozen[i].offset) << kFrozen[i].field;
    EXPECT_EQ(now[i].struct_size, kFrozen[i].struct_size) << kFrozen[i].field;
  }
}

TEST(AbiLayout, CompiledAsCGivesTheSameLayout) {
  std::vector<size_t> c(2 * std::size(kFrozen));
  ASSERT_EQ(coli_test_c_layout(c.data(), c.size()), c.size());
  for (size_t i = 0; i < std::size(kFrozen); ++i) {
    EXPECT_EQ(c[2 * i], kFrozen[i].offset) << kFrozen[i].field;
    EXPECT_EQ(c[2 * i + 1], kFrozen[i].struct_size) << kFrozen[i].field;
  }
  EXPECT_EQ(coli_test_c_defaults_chunk(), 32);
}

TEST(AbiLayout, TableSizesPerMinor) {
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_0, offsetof(coli_plugin_api_t, session_record));
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_1, offsetof(coli_plugin_api_t, model_stats));
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_2, offsetof(coli_plugin_api_t, session_reusable));
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_3, COLI_PLUGIN_API_SIZE_V1_2);  // 1.3 added no entry
  // 1.3 appended the sampling knobs to the decode row; 1.0's row ends at n_events.
  EXPECT_EQ(COLI_DECODE_ROW_SIZE_V1_0, 96u);
  EXPECT_EQ(COLI_DECODE_ROW_SIZE_V1_3, sizeof(coli_decode_row_t));
  // 1.4 appended response_format to the prefill args and added no entry.
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_4, COLI_PLUGIN_API_SIZE_V1_2);
  EXPECT_EQ(COLI_PREFILL_ARGS_SIZE_V1_0, 56u);
  EXPECT_EQ(COLI_PREFILL_ARGS_SIZE_V1_4, 72u);
  // 1.7 appended the prompt-logprobs inputs to the prefill args (and outputs to the result).
  EXPECT_EQ(COLI_PREFILL_ARGS_SIZE_V1_7, sizeof(coli_prefill_args_t));
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_7, COLI_PLUGIN_API_SIZE_V1_6);
  // 1.5 added a chat event channel: no entry, no field; the event keeps its 1.0 layout.
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_5, COLI_PLUGIN_API_SIZE_V1_2);
  // 1.6 appended session_reusable.
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_6, COLI_PLUGIN_API_SIZE_V1_2 + sizeof(void*));
  // 1.8 appended the switch table (pointer and count); a switch is read up to its struct_size.
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_8, offsetof(coli_plugin_api_t, session_copy));
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_8, COLI_PLUGIN_API_SIZE_V1_6 + 2 * sizeof(void*));
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_9, COLI_PLUGIN_API_SIZE_V1_8);   // 1.9 added no entry
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_10, COLI_PLUGIN_API_SIZE_V1_8);  // nor did 1.10
  // 1.11 appended session_copy.
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_11, sizeof(coli_plugin_api_t));
  EXPECT_EQ(COLI_PLUGIN_API_SIZE_V1_11, COLI_PLUGIN_API_SIZE_V1_8 + sizeof(void*));
  EXPECT_EQ(COLI_SWITCH_SIZE_V1_8, sizeof(coli_switch_t));
  EXPECT_EQ(COLI_CHANNEL_TOOL_CALL_DELTA, 4);
  EXPECT_EQ(sizeof(coli_chat_event_t), offsetof(coli_chat_event_t, text) + sizeof(coli_string_t));
}

TEST(AbiStatus, CodesAreAbslCodes) {
  EXPECT_EQ(COLI_STATUS_OK, static_cast<int>(absl::StatusCode::kOk));
  EXPECT_EQ(COLI_STATUS_CANCELLED, static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(COLI_STATUS_UNKNOWN, static_cast<int>(absl::StatusCode::kUnknown));
  EXPECT_EQ(COLI_STATUS_INVALID_ARGUMENT, static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(COLI_STATUS_DEADLINE_EXCEEDED, static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(COLI_STATUS_NOT_FOUND, static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(COLI_STATUS_ALREADY_EXISTS, static_cast<int>(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(COLI_STATUS_PERMISSION_DENIED, static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(COLI_STATUS_RESOURCE_EXHAUSTED, static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(COLI_STATUS_FAILED_PRECONDITION,
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(COLI_STATUS_ABORTED, static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_EQ(COLI_STATUS_OUT_OF_RANGE, static_cast<int>(absl::StatusCode::kOutOfRange));
  EXPECT_EQ(COLI_STATUS_UNIMPLEMENTED, static_cast<int>(absl::StatusCode::kUnimplemented));
  EXPECT_EQ(COLI_STATUS_INTERNAL, static_cast<int>(absl::StatusCode::kInternal));
  EXPECT_EQ(COLI_STATUS_UNAVAILABLE, static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(COLI_STATUS_DATA_LOSS, static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_EQ(COLI_STATUS_UNAUTHENTICATED, static_cast<int>(absl::StatusCode::kUnauthenticated));
}

TEST(AbiUtil, ErrorTextRoundTripsCodeAndMessage) {
  abi::ErrorText err;
  coli_status_t code = abi::FromStatus(absl::DataLossError("tensor 'w': short read"), err.get());
  EXPECT_THAT(err.ToStatus(code),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("tensor 'w': short read")));
  EXPECT_OK(err.ToStatus(COLI_STATUS_OK));
  EXPECT_THAT(abi::ErrorText().ToStatus(99), StatusIs(absl::StatusCode::kUnknown));
}

TEST(AbiUtil, WriteErrorTruncatesAndReportsFullLength) {
  char buffer[6];
  auto err = abi::Init<coli_error_t>();
  err.message = buffer;
  err.capacity = sizeof(buffer);
  abi::WriteError(&err, "0123456789");
  EXPECT_STREQ(buffer, "01234");
  EXPECT_EQ(err.length, 10u);
  abi::WriteError(nullptr, "ignored");  // a NULL error buffer is allowed
}

TEST(AbiUtil, GuardTurnsExceptionsIntoInternal) {
  abi::ErrorText err;
  coli_status_t code =
      abi::Guard(err.get(), []() -> absl::Status { throw std::runtime_error("boom"); });
  EXPECT_THAT(err.ToStatus(code), StatusIs(absl::StatusCode::kInternal, HasSubstr("boom")));
  code = abi::Guard(err.get(), []() -> absl::Status { throw 7; });
  EXPECT_THAT(err.ToStatus(code), StatusIs(absl::StatusCode::kInternal));
}

TEST(AbiUtil, BuffersReportTheSizeTheyNeed) {
  int32_t small[2];
  auto tokens = abi::Init<coli_token_buffer_t>();
  tokens.ids = small;
  tokens.capacity = 2;
  const int32_t ids[] = {5, 6, 7};
  abi::FillTokens(&tokens, ids);
  EXPECT_EQ(tokens.count, 3u);
  EXPECT_EQ(small[1], 6);
  int calls = 0;
  auto read = abi::ReadTokens(
      [&](coli_token_buffer_t* out) {
        ++calls;
        abi::FillTokens(out, ids);
        return absl::OkStatus();
      },
      1);
  ASSERT_OK(read.status());
  EXPECT_EQ(*read, std::vector<int32_t>({5, 6, 7}));
  EXPECT_EQ(calls, 2);
}

// ---- the loader -----------------------------------------------------------------------------

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetLogSink([this](LogLevel, std::string_view message) {
      std::lock_guard<std::mutex> lock(mu_);
      log_.emplace_back(message);
    });
  }
  void TearDown() override { SetLogSink(nullptr); }
  std::vector<std::string> Log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  bool Logged(const std::string& a, const std::string& b = "", const std::string& c = "") {
    for (const auto& line : Log()) {
      if (absl::StrContains(line, a) && absl::StrContains(line, b) && absl::StrContains(line, c)) {
        return true;
      }
    }
    return false;
  }
  // A model directory the echo plugins serve.
  static std::string EchoModelDir(const std::string& name) {
    const std::string dir = ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/config.json") << R"({"model_type": "coli_echo"})";
    return dir;
  }
  static const host::PluginReport* Report(const host::PluginSet& set, const std::string& stem) {
    for (const auto& r : set.reports()) {
      if (absl::EndsWith(r.file, "/libcoli_" + stem + ".so")) return &r;
    }
    return nullptr;
  }

  std::mutex mu_;
  std::vector<std::string> log_;
};

TEST_F(LoaderTest, RefusesEveryBrokenPluginByNameAndKeepsTheGoodOnes) {
  host::PluginSet set = host::PluginSet::LoadDir(COLI_FAKE_PLUGIN_DIR);
  struct Case {
    const char* stem;
    const char* why;
  } refused[] = {
      {"fake_wrong_major", "ABI major version mismatch: plugin 2.7, host 1.11"},
      {"fake_returns_null", "returned NULL (plugin ABI 1.11, host 1.11)"},
      {"fake_throws", "threw: fake entry failure"},
      {"fake_no_entry", "no exported symbol 'coli_plugin_entry'"},
      {"fake_small_table", "struct_size 24 is smaller than ABI 1.11 needs"},
      {"fake_null_entry", "leaves NULL: decode"},
      {"fake_null_model_stats", "leaves NULL: model_stats"},
      {"fake_null_session_reusable", "leaves NULL: session_reusable"},
      {"fake_table_of_1_5", "struct_size 152 is smaller than ABI 1.11 needs (184 bytes"},
      // ABI 1.8: a malformed switch table refuses the plugin, naming the switch.
      {"fake_bad_switch", "switch FAKE_BITS: kind 3 cannot set field 'bits'"},
      {"fake_null_switches", "n_switches 2 with switches NULL"},
  };
  for (const auto& c : refused) {
    const host::PluginReport* r = Report(set, c.stem);
    ASSERT_NE(r, nullptr) << c.stem;
    EXPECT_FALSE(r->loaded) << c.stem;
    EXPECT_THAT(r->error, HasSubstr(c.why)) << c.stem;
    EXPECT_TRUE(Logged(std::string("libcoli_") + c.stem + ".so", "refused", c.why)) << c.stem;
  }
  EXPECT_TRUE(Logged("fake: refusing to run"));  // the plugin's own log line came through
  ASSERT_EQ(set.plugins().size(), 4u);           // the echo family at ABI 1.0, 1.1, 1.2 and 1.7
  for (const auto& p : set.plugins()) EXPECT_EQ(p->family(), "coli_echo");
}

TEST_F(LoaderTest, OlderMinorUsesTheShorterTable) {
  host::PluginReport report;
  auto old =
      host::Plugin::Load(std::string(COLI_FAKE_PLUGIN_DIR) + "/libcoli_fake_echo_v1_0.so", &report);
  ASSERT_OK(old.status());
  EXPECT_EQ(report.major, 1u);
  EXPECT_EQ(report.minor, 0u);
  EXPECT_EQ((*old)->minor(), 0u);
  EXPECT_EQ((*old)->api().struct_size, COLI_PLUGIN_API_SIZE_V1_0);

  const std::string dir = EchoModelDir("echo_model_old");
  ASSERT_OK_AND_ASSIGN(bool serves, (*old)->Probe(dir));
  EXPECT_TRUE(serves);
  ASSERT_OK_AND_ASSIGN(auto model, (*old)->Open(dir, host::ModelOptions(), nullptr));
  ASSERT_OK_AND_ASSIGN(auto session, model->NewSession());
  const int32_t prompt[] = {'h', 'i'};
  ASSERT_OK(session->Prefill(prompt, 0, 0, nullptr).status());
  ASSERT_OK_AND_ASSIGN(host::StepResult step, session->Step({}));
  EXPECT_EQ(step.token, 'h');
  // session_record is 1.1: the host never calls past the negotiated table.
  EXPECT_THAT(session->Record(), StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("1.1")));
  // model_stats is 1.2: none from an older table.
  ASSERT_OK_AND_ASSIGN(auto stats, model->Stats());
  EXPECT_TRUE(stats.empty());
}

// ABI 1.8: a family declares its environment switches; a 1.7 plugin (a table that ends before
// them) still loads and serves, and declares none.
TEST_F(LoaderTest, A17PluginLoadsWithNoSwitchesAndA18PluginDeclaresItsOwn) {
  host::PluginReport old_report;
  auto v17 = host::Plugin::Load(std::string(COLI_FAKE_PLUGIN_DIR) + "/libcoli_fake_echo_v1_7.so",
                                &old_report);
  ASSERT_OK(v17.status());
  EXPECT_EQ((*v17)->minor(), 7u);
  EXPECT_EQ((*v17)->api().struct_size, COLI_PLUGIN_API_SIZE_V1_7);
  EXPECT_TRUE((*v17)->switches().empty());
  EXPECT_TRUE(old_report.switches.empty());
  const std::string dir = EchoModelDir("echo_model_v17");
  ASSERT_OK_AND_ASSIGN(auto model, (*v17)->Open(dir, host::ModelOptions(), nullptr));
  ASSERT_OK_AND_ASSIGN(auto session, model->NewSession());
  const int32_t prompt[] = {'o', 'k'};
  ASSERT_OK(session->Prefill(prompt, 0, 0, nullptr).status());
  ASSERT_OK_AND_ASSIGN(host::StepResult step, session->Step({}));
  EXPECT_EQ(step.token, 'o');

  host::PluginReport report;
  auto v18 = host::Plugin::Load(COLI_ECHO_PLUGIN, &report);
  ASSERT_OK(v18.status());
  EXPECT_EQ((*v18)->minor(), 11u);  // the echo family is built at the current minor (1.11)
  ASSERT_EQ((*v18)->switches().size(), 2u);
  const v1::ModelSwitch& knob = (*v18)->switches()[0];
  EXPECT_EQ(knob.name(), "TEST_FAMILY_KNOB");
  EXPECT_EQ(knob.family(), "coli_echo");
  EXPECT_EQ(knob.field(), COLI_SWITCH_FIELD_EXTRA);
  EXPECT_EQ(knob.extra_key(), "knob");
  EXPECT_EQ(knob.kind(), COLI_SWITCH_INT);
  EXPECT_EQ(knob.int_min(), 1);
  EXPECT_EQ(knob.int_max(), 9);
  const v1::ModelSwitch& greeting = (*v18)->switches()[1];  // a request default (ABI 1.10)
  EXPECT_EQ(greeting.name(), "TEST_FAMILY_GREETING");
  EXPECT_EQ(greeting.field(), COLI_SWITCH_FIELD_REQUEST);
  EXPECT_EQ(greeting.extra_key(), "echo_greeting");
  EXPECT_EQ(greeting.kind(), COLI_SWITCH_STRING);
  EXPECT_EQ(report.switches.size(), 2u);
}

// ABI 1.2: a model's current values come from model_stats; a 1.1 plugin (table ending at
// session_record) still loads and reports none.
TEST_F(LoaderTest, ModelStatsAreReadFromA12TableOnly) {
  const std::string dir = EchoModelDir("echo_model_stats");

  host::PluginReport report;
  auto v11 =
      host::Plugin::Load(std::string(COLI_FAKE_PLUGIN_DIR) + "/libcoli_fake_echo_v1_1.so", &report);
  ASSERT_OK(v11.status());
  EXPECT_EQ((*v11)->minor(), 1u);
  EXPECT_EQ((*v11)->api().struct_size, COLI_PLUGIN_API_SIZE_V1_1);
  ASSERT_OK_AND_ASSIGN(auto old_model, (*v11)->Open(dir, host::ModelOptions(), nullptr));
  ASSERT_OK_AND_ASSIGN(auto old_session, old_model->NewSession());
  ASSERT_OK_AND_ASSIGN(auto none, old_model->Stats());
  EXPECT_TRUE(none.empty());

  auto current =
      host::Plugin::Load(std::string(COLI_FAKE_PLUGIN_DIR) + "/libcoli_fake_echo_v1_2.so", &report);
  ASSERT_OK(current.status());
  EXPECT_EQ((*current)->minor(), 2u);
  ASSERT_OK_AND_ASSIGN(auto model, (*current)->Open(dir, host::ModelOptions(), nullptr));
  ASSERT_OK_AND_ASSIGN(auto s1, model->NewSession());
  ASSERT_OK_AND_ASSIGN(auto s2, model->NewSession());
  ASSERT_OK_AND_ASSIGN(auto stats, model->Stats());
  EXPECT_EQ(stats, (std::map<std::string, double>{{"sessions_created", 2}}));
}

// ABI 1.3: the sampling knobs (logit_bias, penalties, min_p) are decode-row inputs a 1.2 plugin
// does not know. The host refuses a request that sets them for such a plugin, naming the knob
// and both versions, instead of letting the plugin ignore them; neutral knobs still serve.
TEST_F(LoaderTest, A12PluginGetsAClearRefusalForTheAbi13SamplingKnobs) {
  const std::string dir = EchoModelDir("echo_model_knobs");
  host::PluginReport report;
  auto v12 =
      host::Plugin::Load(std::string(COLI_FAKE_PLUGIN_DIR) + "/libcoli_fake_echo_v1_2.so", &report);
  ASSERT_OK(v12.status());
  ASSERT_EQ((*v12)->minor(), 2u);
  ASSERT_OK_AND_ASSIGN(auto model, (*v12)->Open(dir, host::ModelOptions(), nullptr));
  ASSERT_OK_AND_ASSIGN(auto session, model->NewSession());
  const int32_t prompt[] = {'h', 'i'};
  ASSERT_OK(session->Prefill(prompt, 0, 0, nullptr).status());

  EXPECT_OK(model->CheckSampling({.temperature = 0.5f, .repetition_penalty = 1.0f}));
  struct Knob {
    const char* name;
    host::Sampling sampling;
  } knobs[] = {
      {"frequency_penalty", {.frequency_penalty = 0.5f}},
      {"presence_penalty", {.presence_penalty = -0.5f}},
      {"repetition_penalty", {.repetition_penalty = 1.2f}},
      {"min_p", {.min_p = 0.1f}},
      {"logit_bias", {.logit_bias = {{'x', 5.0f}}}},
  };
  for (const Knob& k : knobs) {
    EXPECT_THAT(model->CheckSampling(k.sampling),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(std::string(k.name) + ": needs plugin ABI 1.3"),
                               HasSubstr("speaks 1.2"), HasSubstr("libcoli_fake_echo_v1_2.so"))))
        << k.name;
    // Step refuses too (a caller that skipped the check), before the plugin is called.
    EXPECT_THAT(session->Step(k.sampling),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(k.name)));
  }
  // Out-of-range values are named whatever the plugin.
  EXPECT_THAT(model->CheckSampling({.frequency_penalty = 3.0f}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("frequency_penalty 3")));
  EXPECT_THAT(model->CheckSampling({.logit_bias = {{260, 1.0f}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token id 260")));
  // The refusals changed nothing: the neutral step still echoes.
  ASSERT_OK_AND_ASSIGN(host::StepResult step, session->Step({}));
  EXPECT_EQ(step.token, 'h');
}

// ABI 1.4: response_format travels in the prefill args. A 1.2 plugin never receives one: the
// host refuses the request (naming the field, the plugin and both versions) before calling it;
// a 1.4 plugin receives the text as given (the echo family quotes it in its own refusal).
TEST_F(LoaderTest, ResponseFormatReachesOnlyA14Plugin) {
  const std::string dir = EchoModelDir("echo_model_format");
  const std::string format = R"({"type":"json_object"})";
  const int32_t prompt[] = {'h', 'i'};
  host::PluginReport report;
  auto v12 =
      host::Plugin::Load(std::string(COLI_FAKE_PLUGIN_DIR) + "/libcoli_fake_echo_v1_2.so", &report);
  ASSERT_OK(v12.status());
  ASSERT_OK_AND_ASSIGN(auto old_model, (*v12)->Open(dir, host::ModelOptions(), nullptr));
  ASSERT_OK_AND_ASSIGN(auto old_session, old_model->NewSession());
  const auto needs =
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("response_format: needs plugin ABI 1.4"), HasSubstr("speaks 1.2"),
                     HasSubstr("libcoli_fake_echo_v1_2.so")));
  EXPECT_THAT(old_model->CheckResponseFormat(format), needs);
  EXPECT_THAT(old_session->Prefill(prompt, 0, 0, nullptr, nullptr, format).status(), needs);
  EXPECT_OK(old_model->CheckResponseFormat(""));
  // Unconstrained, the old plugin still serves (the refusal changed nothing).
  ASSERT_OK(old_session->Prefill(prompt, 0, 0, nullptr).status());
  ASSERT_OK_AND_ASSIGN(host::StepResult step, old_session->Step({}));
  EXPECT_EQ(step.token, 'h');

  auto current = host::Plugin::Load(COLI_ECHO_PLUGIN, &report);
  ASSERT_OK(current.status());
  ASSERT_GE((*current)->minor(), 4u);  // 1.4 or later
  ASSERT_OK_AND_ASSIGN(auto model, (*current)->Open(dir, host::ModelOptions(), nullptr));
  ASSERT_OK_AND_ASSIGN(auto session, model->NewSession());
  EXPECT_OK(model->CheckResponseFormat(format));
  EXPECT_THAT(session->Prefill(prompt, 0, 0, nullptr, nullptr, format).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the echo family cannot enforce " + format)));
  ASSERT_OK(session->Prefill(prompt, 0, 0, nullptr).status());
}

// Every chat offering tools carries the coli_tool_calls extension (tool_choice auto / none are
// enforced lazily where the family can). A plugin older than ABI 1.4 cannot receive it: such a
// request runs unconstrained on it, as before 1.4, instead of being refused; a FORCED call
// (tool_choice required) is still refused by name, since it would silently not be enforced.
TEST_F(LoaderTest, AnOlderPluginServesToolRequestsUnderAutoAndRefusesForcedCalls) {
  const std::string plugins = ::testing::TempDir() + "/old_plugin_only_" + std::to_string(getpid());
  std::filesystem::create_directories(plugins);
  std::filesystem::copy_file(std::string(COLI_FAKE_PLUGIN_DIR) + "/libcoli_fake_echo_v1_2.so",
                             plugins + "/libcoli_fake_echo_v1_2.so",
                             std::filesystem::copy_options::overwrite_existing);
  host::Engine engine(host::EngineOptions{.plugin_dir = plugins, .workers = 1});
  v1::LoadModelRequest load;
  load.set_model_dir(EchoModelDir("echo_model_tools"));
  load.set_id("echo");
  ASSERT_OK(engine.LoadModel(load, nullptr).status());
  auto run = [&](const std::string& tool_choice) {
    host::GenerationInput in;
    in.model = "echo";
    in.chat = true;
    in.request_json =
        R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",)"
        R"("function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":")" +
        tool_choice + R"("})";
    in.max_tokens = 2;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    absl::Status status;
    host::EventSink sink;
    sink.on_done = [&](const absl::Status& st, const v1::Finished&) {
      std::lock_guard<std::mutex> lock(mu);
      status = st;
      done = true;
      cv.notify_all();
    };
    auto submitted = engine.Submit(std::move(in), std::move(sink));
    if (!submitted.ok()) return submitted.status();
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return status;
  };
  EXPECT_OK(run("auto"));
  EXPECT_OK(run("none"));
  EXPECT_THAT(run("required"), StatusIs(absl::StatusCode::kInvalidArgument,
                                        HasSubstr("response_format: needs plugin ABI 1.4")));
  engine.Shutdown();
  std::filesystem::remove_all(plugins);
}

TEST_F(LoaderTest, MissingDirectoryIsLoggedNotFatal) {
  host::PluginSet set = host::PluginSet::LoadDir("/nonexistent/coli/plugins");
  EXPECT_TRUE(set.plugins().empty());
  EXPECT_TRUE(Logged("/nonexistent/coli/plugins"));
  EXPECT_THAT(set.ForModel("/tmp"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("/tmp")));
}

}  // namespace
}  // namespace coli
