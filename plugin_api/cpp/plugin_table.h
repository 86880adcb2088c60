// plugin_api/cpp: the C function table of a model family written in C++.
//
// A family gives one traits struct of static functions on its own Model and Session types;
// MakePluginTable<Family>() fills coli_plugin_api_t with entries that cast the opaque handles,
// guard every body (no exception crosses the ABI) and copy outputs into the host's buffers. So a
// family writes its model, never the table (and a new family is one folder under plugins/).
//
//   struct MyFamily {
//     using Model = MyModel;
//     using Session = MySession;
//     static constexpr const char* kFamily = "my_family";
//     static constexpr const char* kVersion = "1.0.0";
//     static absl::Status Probe(std::string_view dir, int32_t* serves);
//     static constexpr const char* kServes = "model_type 'my_family'";  // optional: what
//         // Probe accepts, quoted by the host when no plugin serves a folder
//     static absl::StatusOr<std::unique_ptr<Model>> Open(const coli_model_open_args_t& args);
//     static absl::Status Info(Model& m, coli_model_info_t* info);
//     static absl::StatusOr<std::vector<int32_t>> Tokenize(Model& m, std::string_view text,
//                                                          bool allow_special);
//     static absl::StatusOr<std::string> Detokenize(Model& m, std::span<const int32_t> ids);
//     static absl::Status Render(Model& m, const coli_chat_render_args_t& args,
//                                coli_chat_render_result_t* result);
//     static absl::StatusOr<std::unique_ptr<Session>> NewSession(
//         Model& m, const coli_session_options_t* options);  // options may be null
//     static absl::Status Reset(Session& s);
//     static absl::Status Prefill(Session& s, const coli_prefill_args_t& args,
//                                 coli_prefill_result_t* result);
//     static absl::Status Step(Session& s, coli_decode_row_t* row);  // one row of a decode call
//     static std::vector<coli_stat_t> Stats(const Session& s);       // names: static strings
//     static std::span<const int32_t> Record(const Session& s);
//   };
//   // Optional: static void Shutdown(); for families that batch the rows of several
//   // sessions into one forward pass, static absl::Status Decode(std::span<coli_decode_row_t>),
//   // which replaces the row-by-row Step loop; and static std::vector<coli_stat_t>
//   // ModelStats(const Model&) for the model's current values (ABI 1.2; none without it); and
//   // static size_t Reusable(Model&, const Session* s, std::span<const int32_t> prompt) for
//   // families that keep more than their record (checkpoints, state shared between sessions):
//   // without it a session keeps its record when the prompt strictly extends it, a new one
//   // nothing (ABI 1.6); and static std::span<const coli_switch_t> Switches() for the
//   // environment switches the family declares (ABI 1.8, plugin_api/cpp/switches.h; static
//   // storage), none without it; and static absl::Status Copy(Session& dst, Session& src)
//   // (ABI 1.11 session_copy: dst takes src's state, one prefill forked into n choices;
//   // without it the entry is NULL and the host prefills each choice).
//
//   const coli_plugin_api_t kApi = coli::abi::MakePluginTable<MyFamily>();
#ifndef COLI_PLUGIN_API_CPP_PLUGIN_TABLE_H_
#define COLI_PLUGIN_API_CPP_PLUGIN_TABLE_H_

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plugin_api/coli_plugin.h"
#include "plugin_api/cpp/abi_util.h"

namespace coli::abi {

// Statistics as the table returns them: one name (a static string) per value.
template <size_t N>
std::vector<coli_stat_t> NamedStats(const char* const (&names)[N], const double (&values)[N]) {
  std::vector<coli_stat_t> out(N);
  for (size_t i = 0; i < N; ++i) out[i] = coli_stat_t{names[i], values[i]};
  return out;
}

// What a session keeps of `prompt` from its record alone: all of it when the prompt strictly
// extends it, else nothing (state that only extends cannot be rewound).
inline size_t RecordReusable(std::span<const int32_t> record, std::span<const int32_t> prompt) {
  return record.size() < prompt.size() && std::equal(record.begin(), record.end(), prompt.begin())
             ? record.size()
             : 0;
}

template <typename Family>
coli_plugin_api_t MakePluginTable() {
  using Model = typename Family::Model;
  using Session = typename Family::Session;
  // The table's entries are plain function pointers: the lambdas capture nothing and reach the
  // family through the template argument.
  static constexpr auto M = [](coli_model_t* m) -> Model& { return *reinterpret_cast<Model*>(m); };
  static constexpr auto S = [](coli_session_t* s) -> Session& {
    return *reinterpret_cast<Session*>(s);
  };

  auto api = Init<coli_plugin_api_t>();
  api.family = Family::kFamily;
  api.plugin_version = Family::kVersion;
  if constexpr (requires { Family::Shutdown(); }) {
    api.shutdown = [] { Family::Shutdown(); };
  }
  api.probe = [](coli_string_t dir, int32_t* serves, coli_error_t* e) {
    return Guard(e, [&] {
      *serves = 0;
      absl::Status status = Family::Probe(View(dir), serves);
      // What the family serves, for the host's "no plugin serves" message (optional member).
      if constexpr (requires { Family::kServes; }) {
        if (status.ok() && *serves == 0) WriteError(e, Family::kServes);
      }
      return status;
    });
  };
  api.model_open = [](const coli_model_open_args_t* a, coli_model_t** out, coli_error_t* e) {
    return Guard(e, [&]() -> absl::Status {
      absl::StatusOr<std::unique_ptr<Model>> model = Family::Open(*a);
      if (!model.ok()) return model.status();
      *out = reinterpret_cast<coli_model_t*>(model->release());
      return absl::OkStatus();
    });
  };
  api.model_close = [](coli_model_t* m) { delete &M(m); };
  api.model_info = [](coli_model_t* m, coli_model_info_t* info, coli_error_t* e) {
    return Guard(e, [&] { return Family::Info(M(m), info); });
  };
  api.tokenize = [](coli_model_t* m, coli_string_t text, int32_t allow_special,
                    coli_token_buffer_t* out, coli_error_t* e) {
    return Guard(e, [&]() -> absl::Status {
      absl::StatusOr<std::vector<int32_t>> ids =
          Family::Tokenize(M(m), View(text), allow_special != 0);
      if (!ids.ok()) return ids.status();
      FillTokens(out, *ids);
      return absl::OkStatus();
    });
  };
  api.detokenize = [](coli_model_t* m, const int32_t* ids, size_t n, coli_byte_buffer_t* out,
                      coli_error_t* e) {
    return Guard(e, [&]() -> absl::Status {
      absl::StatusOr<std::string> bytes =
          Family::Detokenize(M(m), std::span<const int32_t>(ids, n));
      if (!bytes.ok()) return bytes.status();
      FillBytes(out, *bytes);
      return absl::OkStatus();
    });
  };
  api.render_chat = [](coli_model_t* m, const coli_chat_render_args_t* a,
                       coli_chat_render_result_t* r, coli_error_t* e) {
    return Guard(e, [&] { return Family::Render(M(m), *a, r); });
  };
  api.session_create = [](coli_model_t* m, const coli_session_options_t* o, coli_session_t** out,
                          coli_error_t* e) {
    return Guard(e, [&]() -> absl::Status {
      absl::StatusOr<std::unique_ptr<Session>> session = Family::NewSession(M(m), o);
      if (!session.ok()) return session.status();
      *out = reinterpret_cast<coli_session_t*>(session->release());
      return absl::OkStatus();
    });
  };
  api.session_destroy = [](coli_session_t* s) { delete &S(s); };
  api.session_reset = [](coli_session_t* s, coli_error_t* e) {
    return Guard(e, [&] { return Family::Reset(S(s)); });
  };
  api.prefill = [](coli_session_t* s, const coli_prefill_args_t* a, coli_prefill_result_t* r,
                   coli_error_t* e) {
    return Guard(e, [&] { return Family::Prefill(S(s), *a, r); });
  };
  api.decode = [](const coli_decode_args_t* a, coli_error_t* e) {
    return Guard(e, [&]() -> absl::Status {
      std::span<coli_decode_row_t> rows(a->rows, a->n_rows);
      if constexpr (requires { Family::Decode(rows); }) {
        return Family::Decode(rows);
      } else {
        for (coli_decode_row_t& row : rows) {
          if (absl::Status s = Family::Step(S(row.session), &row); !s.ok()) return s;
        }
        return absl::OkStatus();
      }
    });
  };
  api.session_stats = [](coli_session_t* s, coli_stat_t* stats, size_t capacity, size_t* count,
                         coli_error_t* e) {
    return Guard(e, [&] {
      const std::vector<coli_stat_t> values = Family::Stats(S(s));
      *count = values.size();
      std::copy_n(values.begin(), std::min(capacity, values.size()), stats);
      return absl::OkStatus();
    });
  };
  api.session_record = [](coli_session_t* s, coli_token_buffer_t* out, coli_error_t* e) {
    return Guard(e, [&] {
      FillTokens(out, Family::Record(S(s)));
      return absl::OkStatus();
    });
  };
  api.model_stats = [](coli_model_t* m, coli_stat_t* stats, size_t capacity, size_t* count,
                       coli_error_t* e) {
    return Guard(e, [&] {
      *count = 0;
      if constexpr (requires { Family::ModelStats(M(m)); }) {
        const std::vector<coli_stat_t> values = Family::ModelStats(M(m));
        *count = values.size();
        std::copy_n(values.begin(), std::min(capacity, values.size()), stats);
      }
      return absl::OkStatus();
    });
  };
  api.session_reusable = [](coli_model_t* m, coli_session_t* s, const int32_t* prompt, size_t n,
                            uint64_t* tokens, coli_error_t* e) {
    return Guard(e, [&] {
      const std::span<const int32_t> p(prompt, n);
      if constexpr (requires { Family::Reusable(M(m), &S(s), p); }) {
        *tokens = Family::Reusable(M(m), s != nullptr ? &S(s) : nullptr, p);
      } else {
        *tokens = s != nullptr ? RecordReusable(Family::Record(S(s)), p) : 0;
      }
      return absl::OkStatus();
    });
  };
  // ABI 1.11: only a family that can copy a session's state says so (NULL: the host prefills).
  if constexpr (requires { Family::Copy(std::declval<Session&>(), std::declval<Session&>()); }) {
    api.session_copy = [](coli_session_t* dst, coli_session_t* src, coli_error_t* e) {
      return Guard(e, [&] { return Family::Copy(S(dst), S(src)); });
    };
  }
  if constexpr (requires { Family::Switches(); }) {
    // The ABI hands out pointers (each entry is read up to its own struct_size); they point
    // into the family's static table.
    static const std::vector<const coli_switch_t*> switches = [] {
      std::vector<const coli_switch_t*> out;
      for (const coli_switch_t& s : Family::Switches()) out.push_back(&s);
      return out;
    }();
    api.switches = switches.data();
    api.n_switches = switches.size();
  }
  return api;
}

}  // namespace coli::abi

#endif  // COLI_PLUGIN_API_CPP_PLUGIN_TABLE_H_
