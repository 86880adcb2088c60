// Broken plugins, one per FAKE_* variant (each built as its own MODULE): the host must refuse
// every one cleanly, name the file in its log, and keep serving with the good ones.
#include <stdexcept>

#include "plugin_api/coli_plugin.h"
#include "plugin_api/cpp/abi_util.h"
#include "plugin_api/cpp/switches.h"

namespace {

// A table whose entries are all present but never called (the host refuses before).
coli_plugin_api_t MakeTable() {
  auto api = coli::abi::Init<coli_plugin_api_t>();
  api.family = "fake";
  api.plugin_version = "broken";
  api.probe = [](coli_string_t, int32_t* serves, coli_error_t*) -> coli_status_t {
    *serves = 0;
    return COLI_STATUS_OK;
  };
  api.model_open = [](const coli_model_open_args_t*, coli_model_t**,
                      coli_error_t*) -> coli_status_t { return COLI_STATUS_UNIMPLEMENTED; };
  api.model_close = [](coli_model_t*) {};
  api.model_info = [](coli_model_t*, coli_model_info_t*, coli_error_t*) -> coli_status_t {
    return COLI_STATUS_UNIMPLEMENTED;
  };
  api.tokenize = [](coli_model_t*, coli_string_t, int32_t, coli_token_buffer_t*,
                    coli_error_t*) -> coli_status_t { return COLI_STATUS_UNIMPLEMENTED; };
  api.detokenize = [](coli_model_t*, const int32_t*, size_t, coli_byte_buffer_t*,
                      coli_error_t*) -> coli_status_t { return COLI_STATUS_UNIMPLEMENTED; };
  api.render_chat = [](coli_model_t*, const coli_chat_render_args_t*, coli_chat_render_result_t*,
                       coli_error_t*) -> coli_status_t { return COLI_STATUS_UNIMPLEMENTED; };
  api.session_create = [](coli_model_t*, const coli_session_options_t*, coli_session_t**,
                          coli_error_t*) -> coli_status_t { return COLI_STATUS_UNIMPLEMENTED; };
  api.session_destroy = [](coli_session_t*) {};
  api.session_reset = [](coli_session_t*, coli_error_t*) -> coli_status_t {
    return COLI_STATUS_UNIMPLEMENTED;
  };
  api.prefill = [](coli_session_t*, const coli_prefill_args_t*, coli_prefill_result_t*,
                   coli_error_t*) -> coli_status_t { return COLI_STATUS_UNIMPLEMENTED; };
  api.decode = [](const coli_decode_args_t*, coli_error_t*) -> coli_status_t {
    return COLI_STATUS_UNIMPLEMENTED;
  };
  api.session_stats = [](coli_session_t*, coli_stat_t*, size_t, size_t*,
                         coli_error_t*) -> coli_status_t { return COLI_STATUS_UNIMPLEMENTED; };
  api.session_record = [](coli_session_t*, coli_token_buffer_t*, coli_error_t*) -> coli_status_t {
    return COLI_STATUS_UNIMPLEMENTED;
  };
  api.model_stats = [](coli_model_t*, coli_stat_t*, size_t, size_t*,
                       coli_error_t*) -> coli_status_t { return COLI_STATUS_UNIMPLEMENTED; };
  api.session_reusable = [](coli_model_t*, coli_session_t*, const int32_t*, size_t, uint64_t*,
                            coli_error_t*) -> coli_status_t { return COLI_STATUS_UNIMPLEMENTED; };
#if defined(FAKE_SMALL_TABLE)
  api.struct_size = 3 * sizeof(void*);  // claims the current minor but holds almost nothing
#endif
#if defined(FAKE_TABLE_OF_1_5)
  api.struct_size = COLI_PLUGIN_API_SIZE_V1_5;  // claims 1.6 but ends before session_reusable
#endif
#if defined(FAKE_NULL_MODEL_STATS)
  api.model_stats = nullptr;  // a 1.2 table must have it
#endif
#if defined(FAKE_NULL_SESSION_REUSABLE)
  api.session_reusable = nullptr;  // a 1.6 table must have it
#endif
#if defined(FAKE_NULL_ENTRY)
  api.decode = nullptr;
#endif
#if defined(FAKE_BAD_SWITCH)
  // A real-number switch aimed at an integer field (ABI 1.8): refused, naming the switch.
  static const coli_switch_t kBad =
      coli::abi::RealSwitch("FAKE_BITS", COLI_SWITCH_FIELD_BITS, 0, 1, "not a real-number field");
  static const coli_switch_t* const kSwitches[] = {&kBad};
  api.switches = kSwitches;
  api.n_switches = 1;
#endif
#if defined(FAKE_NULL_SWITCHES)
  api.n_switches = 2;  // with switches NULL
#endif
  return api;
}

const coli_plugin_api_t kTable = MakeTable();

}  // namespace

#if !defined(FAKE_NO_ENTRY)
extern "C" COLI_PLUGIN_EXPORT const coli_plugin_api_t* coli_plugin_entry(
    const coli_host_api_t* host, coli_abi_version_t* version) {
  version->major = COLI_ABI_VERSION_MAJOR;
  version->minor = COLI_ABI_VERSION_MINOR;
#if defined(FAKE_WRONG_MAJOR)
  version->major = COLI_ABI_VERSION_MAJOR + 1;
  version->minor = 7;
#endif
#if defined(FAKE_THROWS)
  throw std::runtime_error("fake entry failure");
#endif
#if defined(FAKE_RETURNS_NULL)
  if (host != nullptr && host->log != nullptr) {
    const char why[] = "fake: refusing to run";
    host->log(host->host_data, COLI_LOG_ERROR, why, sizeof(why) - 1);
  }
  return nullptr;
#endif
  return &kTable;
}
#else
// No entry symbol at all: an unrelated export so the module is not empty.
extern "C" COLI_PLUGIN_EXPORT int coli_not_a_plugin(void) { return 42; }
#endif
