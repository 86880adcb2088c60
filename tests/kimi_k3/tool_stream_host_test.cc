// Tool-call deltas through the plugin ABI and the host (ABI 1.5, COLI_CHANNEL_TOOL_CALL_DELTA),
// on the k3_scripted test family: K3's real tokenizer, renderer and output parser around a
// scripted reply (tools/k3_scripted/script.json), so a tool call really comes out.
//  * ABI: a host that says minor 4 at coli_plugin_entry gets the complete call only (exactly the
//    events it got before 1.5); a 1.5 host gets deltas first, then the same complete call.
//  * Host: the engine forwards the deltas as ChatDelta CHANNEL_TOOL_CALL_DELTA, all before the
//    CHANNEL_TOOL_CALL event, and their pieces join to the call's arguments.
#include <dlfcn.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "common/status/status_matchers.h"
#include "gtest/gtest.h"
#include "host/engine.h"
#include "nlohmann/json.hpp"
#include "plugin_api/coli_plugin.h"
#include "plugin_api/cpp/abi_util.h"

namespace coli {
namespace {

using Json = nlohmann::ordered_json;

const char kWeather[] =
    R"({"messages":[{"role":"user","content":"What is the weather in Paris?"}],)"
    R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}]})";

std::string ArgumentsText(const std::string& call_text) {
  const Json a = Json::parse(call_text).at("arguments");
  return a.is_string() ? a.get<std::string>() : a.dump();
}

struct Event {
  int32_t channel;
  std::string text;
};

// One chat generation of the scripted model through the raw table of a plugin entered with
// host minor `host_minor`: every event of every step, in order.
std::vector<Event> RunThroughAbi(uint32_t host_minor) {
  std::vector<Event> events;
  void* so = dlopen(COLI_K3_SCRIPTED_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  EXPECT_NE(so, nullptr) << dlerror();
  if (so == nullptr) return events;
  auto entry = reinterpret_cast<coli_plugin_entry_fn>(dlsym(so, COLI_PLUGIN_ENTRY_SYMBOL));
  EXPECT_NE(entry, nullptr);
  coli_abi_version_t version = {sizeof version, COLI_ABI_VERSION_MAJOR, host_minor};
  const coli_plugin_api_t* api = entry(nullptr, &version);
  EXPECT_NE(api, nullptr);
  EXPECT_EQ(version.minor, static_cast<uint32_t>(COLI_ABI_VERSION_MINOR));

  char text[512] = {};
  coli_error_t err = abi::Init<coli_error_t>();
  err.message = text;
  err.capacity = sizeof text;
  auto open = abi::Init<coli_model_open_args_t>();
  open.model_dir = abi::Str(COLI_K3_SCRIPTED_DIR);
  coli_model_t* model = nullptr;
  EXPECT_EQ(api->model_open(&open, &model, &err), COLI_STATUS_OK) << text;
  if (model == nullptr) return events;

  std::vector<int32_t> ids(4096);
  auto render = abi::Init<coli_chat_render_args_t>();
  render.request_json = abi::Str(kWeather);
  render.add_generation_prompt = 1;
  auto rendered = abi::Init<coli_chat_render_result_t>();
  rendered.tokens = abi::Init<coli_token_buffer_t>();
  rendered.tokens.ids = ids.data();
  rendered.tokens.capacity = ids.size();
  rendered.text = abi::Init<coli_byte_buffer_t>();
  EXPECT_EQ(api->render_chat(model, &render, &rendered, &err), COLI_STATUS_OK) << text;
  EXPECT_LE(rendered.tokens.count, ids.size());

  auto options = abi::Init<coli_session_options_t>();
  coli_session_t* session = nullptr;
  EXPECT_EQ(api->session_create(model, &options, &session, &err), COLI_STATUS_OK) << text;
  auto prefill = abi::Init<coli_prefill_args_t>();
  prefill.tokens = ids.data();
  prefill.n_tokens = rendered.tokens.count;
  prefill.chat_parse_mode = rendered.chat_parse_mode;
  auto result = abi::Init<coli_prefill_result_t>();
  EXPECT_EQ(api->prefill(session, &prefill, &result, &err), COLI_STATUS_OK) << text;

  for (int step = 0; step < 1000; ++step) {
    auto row = abi::Init<coli_decode_row_t>();
    row.session = session;
    auto args = abi::Init<coli_decode_args_t>();
    args.rows = &row;
    args.n_rows = 1;
    EXPECT_EQ(api->decode(&args, &err), COLI_STATUS_OK) << text;
    for (size_t i = 0; i < row.n_events; ++i) {
      events.push_back({row.events[i].channel, std::string(abi::View(row.events[i].text))});
    }
    if (row.finish != COLI_FINISH_NONE) break;
  }
  api->session_destroy(session);
  api->model_close(model);
  dlclose(so);
  return events;
}

TEST(ToolCallDeltasAbi, AnOlderHostGetsTheCompleteCallOnly) {
  const std::vector<Event> old = RunThroughAbi(4);
  std::vector<std::string> calls;
  for (const Event& e : old) {
    EXPECT_NE(e.channel, COLI_CHANNEL_TOOL_CALL_DELTA) << e.text;
    if (e.channel == COLI_CHANNEL_TOOL_CALL) calls.push_back(e.text);
  }
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0], R"({"name":"get_weather","arguments":{"city":"Paris","days":3}})");

  // A 1.5 host: the same events plus deltas before the call, whose pieces join to its arguments.
  const std::vector<Event> now = RunThroughAbi(COLI_ABI_VERSION_MINOR);
  std::vector<Event> without_deltas;
  std::string joined;
  int pieces = 0;
  bool call_seen = false;
  for (const Event& e : now) {
    if (e.channel == COLI_CHANNEL_TOOL_CALL_DELTA) {
      EXPECT_FALSE(call_seen) << "a delta after the complete call";
      const Json d = Json::parse(e.text);
      EXPECT_EQ(d.at("index"), 0);
      EXPECT_EQ(d.contains("name"), pieces == 0) << e.text;
      joined += d.at("arguments").get<std::string>();
      ++pieces;
    } else {
      if (e.channel == COLI_CHANNEL_TOOL_CALL) call_seen = true;
      without_deltas.push_back(e);
    }
  }
  EXPECT_GT(pieces, 2);
  EXPECT_EQ(joined, ArgumentsText(calls[0]));
  ASSERT_EQ(without_deltas.size(), old.size());
  for (size_t i = 0; i < old.size(); ++i) {
    EXPECT_EQ(without_deltas[i].channel, old[i].channel);
    EXPECT_EQ(without_deltas[i].text, old[i].text);
  }
}

TEST(ToolCallDeltasHost, DeltasArriveAsChatDeltasBeforeTheCompleteCall) {
  host::EngineOptions options;
  options.plugin_dir = COLI_K3_SCRIPTED_PLUGIN_DIR;
  host::Engine engine(options);
  v1::LoadModelRequest load;
  load.set_model_dir(COLI_K3_SCRIPTED_DIR);
  load.set_id("scripted");
  ASSERT_OK(engine.LoadModel(load, nullptr).status());

  v1::ChatRequest request;
  request.set_model("scripted");
  request.set_request_json(kWeather);
  request.set_max_tokens(200);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::Status status;
  std::vector<v1::ChatDelta> deltas;
  host::EventSink sink;
  sink.on_token = [&](const v1::Token&, std::span<const v1::ChatDelta> d) {
    std::lock_guard<std::mutex> lock(mu);
    deltas.insert(deltas.end(), d.begin(), d.end());
  };
  sink.on_done = [&](const absl::Status& s, const v1::Finished&) {
    std::lock_guard<std::mutex> lock(mu);
    status = s;
    done = true;
    cv.notify_all();
  };
  ASSERT_OK(engine.Submit(host::GenerationInput::From(request), std::move(sink)).status());
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  ASSERT_OK(status);

  std::string joined, call;
  int pieces = 0;
  for (const v1::ChatDelta& d : deltas) {
    if (d.channel() == v1::CHANNEL_TOOL_CALL_DELTA) {
      EXPECT_TRUE(call.empty()) << "a delta after the complete call";
      const std::string piece = Json::parse(d.text()).at("arguments").get<std::string>();
      if (!piece.empty()) ++pieces;
      joined += piece;
    } else if (d.channel() == v1::CHANNEL_TOOL_CALL) {
      call = d.text();
    }
  }
  ASSERT_FALSE(call.empty());
  EXPECT_GT(pieces, 1);
  EXPECT_EQ(joined, ArgumentsText(call));
  EXPECT_EQ(joined, R"({"city":"Paris","days":3})");
}

}  // namespace
}  // namespace coli
