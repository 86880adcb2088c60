// `coli run`: the one-shot job. Loads the model (--model, else $COLI_MODEL, else the embedded
// tiny model) in a host (--host, else a private one started and stopped here), generates, and
// streams the text to stdout; load progress and statistics go to stderr.
//
//   coli run [--model DIR] [--host ADDR] "prompt" [--ngen N] [--ids 1,2,3] [--print-ids]
//            [--temperature T] [--top-p P] [--top-k K] [--seed S] [--logprobs K]
//            [--frequency-penalty F] [--presence-penalty P] [--repetition-penalty R]
//            [--min-p M] [--logit-bias ID=BIAS,...]
//            [--chat [--system TEXT] [--no-think]] [--json-schema FILE | --json-object]
//
// --chat renders the prompt as one user turn with the family's template (K3_THINK=0 or
// --no-think opens the answer directly); reasoning goes to stderr, the answer to stdout.
// --json-schema FILE (a JSON schema, or a whole OpenAI response_format object) and --json-object
// enforce the output's form (plugin ABI 1.4): with --chat the answer, otherwise the whole output
// (docs/status/constrained.md).
// Ctrl-C cancels the request (the host stops within one token).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "tools/coli/client.h"
#include "tools/coli/command.h"

namespace coli::cli {
namespace {

std::atomic<bool> g_interrupted{false};

void OnSigint(int) { g_interrupted.store(true); }

int Usage() {
  std::fprintf(stderr,
               "usage: coli run [--model DIR] [--host ADDR] \"prompt\" [--ngen N] [--ids 1,2,3]\n"
               "                [--print-ids] [--temperature T] [--top-p P] [--top-k K]\n"
               "                [--seed S] [--logprobs K] [--chat [--system TEXT] [--no-think]]\n"
               "                [--json-schema FILE | --json-object] %s\n",
               client::kSamplingKnobUsage);
  return 2;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "coli run: %s\n", status.ToString().c_str());
  return 1;
}

// The response_format for --json-schema FILE: the file's JSON as a whole response_format object
// when it is one ({"type": ...}), else as the schema. INVALID_ARGUMENT naming the file.
absl::StatusOr<nlohmann::json> SchemaFormatFromFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return absl::InvalidArgumentError("--json-schema: cannot read '" + path + "'");
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  std::fclose(f);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("--json-schema: '" + path + "' is not a JSON object");
  }
  if (j.contains("json_schema") && j.value("type", nlohmann::json()) == "json_schema") return j;
  return nlohmann::json{{"type", "json_schema"},
                        {"json_schema", {{"name", "schema"}, {"schema", j}}}};
}

int RunCommand(int argc, char** argv) {
  std::string model_flag, host, prompt, system, ids_flag;
  nlohmann::json response_format;  // null: none
  bool print_ids = false, chat = false, think = true, have_prompt = false;
  int ngen = 64;
  v1::SamplingParams sampling;
  if (const char* t = std::getenv("COLI_TEMP")) {
    float temperature = 0;
    if (!absl::SimpleAtof(t, &temperature)) {
      std::fprintf(stderr, "coli run: COLI_TEMP='%s' is not a number\n", t);
      return 2;
    }
    sampling.set_temperature(temperature);
  }
  if (const char* t = std::getenv("K3_THINK")) think = std::string(t) != "0";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "coli run: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](auto* out) {
      const std::string v = value();
      bool ok;
      if constexpr (std::is_same_v<std::remove_pointer_t<decltype(out)>, float>) {
        ok = absl::SimpleAtof(v, out);
      } else {
        ok = absl::SimpleAtoi(v, out);
      }
      if (!ok) {
        std::fprintf(stderr, "coli run: %s: '%s' is not a number\n", arg.c_str(), v.c_str());
        std::exit(2);
      }
    };
    if (arg == "--model")
      model_flag = value();
    else if (arg == "--host")
      host = value();
    else if (arg == "--ngen")
      number(&ngen);
    else if (arg == "--ids")
      ids_flag = value();
    else if (arg == "--print-ids")
      print_ids = true;
    else if (arg == "--chat")
      chat = true;
    else if (arg == "--system")
      system = value();
    else if (arg == "--no-think")
      think = false;
    else if (arg == "--json-object")
      response_format = {{"type", "json_object"}};
    else if (arg == "--json-schema") {
      auto format = SchemaFormatFromFile(value());
      if (!format.ok()) {
        std::fprintf(stderr, "coli run: %s\n", std::string(format.status().message()).c_str());
        return 2;
      }
      response_format = *std::move(format);
    } else if (arg == "--temperature") {
      float t;
      number(&t);
      sampling.set_temperature(t);
    } else if (arg == "--top-p") {
      float p;
      number(&p);
      sampling.set_top_p(p);
    } else if (arg == "--top-k") {
      int32_t k;
      number(&k);
      sampling.set_top_k(k);
    } else if (arg == "--seed") {
      uint64_t s;
      number(&s);
      sampling.set_seed(s);
    } else if (arg == "--logprobs") {
      int32_t k;
      number(&k);
      sampling.set_logprobs(k);
    } else if (client::IsSamplingKnobFlag(arg)) {
      if (absl::Status bad = client::ParseSamplingKnobFlag(arg, value(), &sampling); !bad.ok()) {
        std::fprintf(stderr, "coli run: %s\n", std::string(bad.message()).c_str());
        return 2;
      }
    } else if (arg == "--help" || arg == "-h") {
      Usage();
      return 0;
    } else if (!arg.empty() && arg[0] == '-' && arg != "-") {
      std::fprintf(stderr, "coli run: unknown flag '%s'\n", arg.c_str());
      return Usage();
    } else if (!have_prompt) {
      prompt = arg;
      have_prompt = true;
    } else {
      std::fprintf(stderr, "coli run: more than one prompt given\n");
      return Usage();
    }
  }
  std::vector<int32_t> ids;
  if (!ids_flag.empty()) {
    for (absl::string_view piece : absl::StrSplit(ids_flag, ',', absl::SkipEmpty())) {
      int32_t id;
      if (!absl::SimpleAtoi(piece, &id)) {
        std::fprintf(stderr, "coli run: --ids: '%s' is not a token id\n",
                     std::string(piece).c_str());
        return 2;
      }
      ids.push_back(id);
    }
  }
  if (!have_prompt && ids.empty()) return Usage();
  if (chat && !ids.empty()) {
    std::fprintf(stderr, "coli run: --chat takes a text prompt, not --ids\n");
    return 2;
  }

  auto options = client::ModelOptionsFromEnv();
  if (!options.ok()) return Fail(options.status());
  auto connected = client::Client::Connect({.host = host});
  if (!connected.ok()) return Fail(connected.status());
  client::Client& c = **connected;
  client::ProgressDisplay bar(stderr);
  const std::string model_dir = client::ResolveModelDir(model_flag);
  auto model = c.LoadModel(model_dir, *options, [&](const v1::LoadProgress& p) { bar.Update(p); });
  bar.Done();
  if (!model.ok()) return Fail(model.status());
  // Test fixtures (tools/k3/make_fixture.py) mark themselves: say so, their text is noise.
  if (std::FILE* f = std::fopen((model_dir + "/config.json").c_str(), "r")) {
    nlohmann::json config = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    std::fclose(f);
    if (config.is_object() && config.contains("coli_fixture")) {
      std::fprintf(stderr,
                   "coli run: %s is a test fixture with random weights (its output is noise); "
                   "give --model DIR or COLI_MODEL for a real model\n",
                   model_dir.c_str());
    }
  }

  // Ctrl-C cancels the request; a watcher thread turns the flag into a cancel.
  client::CancelToken cancel;
  struct sigaction sa = {};
  sa.sa_handler = OnSigint;
  sigaction(SIGINT, &sa, nullptr);
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done.load()) {
      if (g_interrupted.load()) {
        cancel.Cancel();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  std::vector<int32_t> generated;
  int64_t prompt_tokens = 0, reused = 0;
  client::StreamCallbacks cb;
  cb.on_started = [&](const v1::Started& s) {
    prompt_tokens = s.prompt_tokens();
    reused = s.tokens_reused();
  };
  cb.on_token = [&](const v1::Token& t) {
    generated.push_back(t.id());
    if (!chat) {
      std::fwrite(t.text().data(), 1, t.text().size(), stdout);
      std::fflush(stdout);
    }
    if (t.has_logprobs()) {
      std::fprintf(stderr, "[logprob %d %.4f]", t.id(), t.logprobs().sampled().logprob());
    }
  };
  bool in_reasoning = false;
  cb.on_delta = [&](const v1::ChatDelta& d) {
    if (d.channel() == v1::CHANNEL_REASONING) {
      if (!in_reasoning) std::fprintf(stderr, "[thinking] ");
      in_reasoning = true;
      std::fwrite(d.text().data(), 1, d.text().size(), stderr);
    } else if (d.channel() == v1::CHANNEL_CONTENT) {
      if (in_reasoning) std::fprintf(stderr, "\n");
      in_reasoning = false;
      std::fwrite(d.text().data(), 1, d.text().size(), stdout);
      std::fflush(stdout);
    } else if (d.channel() == v1::CHANNEL_TOOL_CALL) {
      std::printf("\n[tool call] %s\n", d.text().c_str());
    }
  };

  absl::StatusOr<v1::Finished> finished;
  if (chat) {
    nlohmann::json request;
    request["messages"] = nlohmann::json::array();
    if (!system.empty()) request["messages"].push_back({{"role", "system"}, {"content", system}});
    request["messages"].push_back({{"role", "user"}, {"content", prompt}});
    request["enable_thinking"] = think;
    if (!response_format.is_null()) request["response_format"] = response_format;
    v1::ChatRequest r;
    r.set_model(model->id());
    r.set_request_json(request.dump());
    r.set_max_tokens(ngen);
    *r.mutable_sampling() = sampling;
    finished = c.Chat(r, cb, &cancel);
  } else {
    v1::GenerateRequest r;
    r.set_model(model->id());
    if (!ids.empty())
      r.mutable_prompt_ids()->Add(ids.begin(), ids.end());
    else
      r.set_prompt(prompt);
    if (!response_format.is_null()) r.set_response_format(response_format.dump());
    r.set_max_tokens(ngen);
    *r.mutable_sampling() = sampling;
    finished = c.Generate(r, cb, &cancel);
  }
  done.store(true);
  watcher.join();
  if (in_reasoning) std::fprintf(stderr, "\n");
  std::printf("\n");
  if (print_ids) {
    for (size_t i = 0; i < generated.size(); ++i) {
      std::printf("%s%d", i ? "," : "", generated[i]);
    }
    std::printf("\n");
  }
  std::fflush(stdout);
  if (!finished.ok()) return Fail(finished.status());
  const auto& st = finished->stats();
  std::fprintf(stderr,
               "coli run: %lld prompt tokens (%lld reused), %lld generated, %.2f tok/s, "
               "TTFT %.1f ms, finish %s\n",
               static_cast<long long>(prompt_tokens), static_cast<long long>(reused),
               static_cast<long long>(finished->usage().completion_tokens()),
               st.tokens_per_second(), st.ttft_seconds() * 1e3,
               v1::FinishReason_Name(finished->reason()).c_str());
  // The family's own statistics (for K3: the expert store's reads and hits over this request).
  const auto& p = st.plugin();
  auto stat = [&p](const char* name) {
    auto it = p.find(name);
    return it == p.end() ? 0.0 : it->second;
  };
  const double hits = stat("expert_hits"), misses = stat("expert_misses");
  if (hits + misses > 0) {
    const double tokens = std::max(1.0, stat("tokens_computed") + stat("tokens_generated"));
    const double read_s = stat("read_seconds"), compute_s = stat("compute_seconds");
    std::fprintf(stderr,
                 "coli run: experts %.0f hits / %.0f misses (hit rate %.1f%%), %.1f MB read "
                 "(%.2f MB/token, %.2f GB/s while reading), read %.3f s, compute %.3f s, "
                 "waited for reads %.3f s\n",
                 hits, misses, 100.0 * hits / (hits + misses), stat("bytes_read") / 1e6,
                 stat("bytes_read") / 1e6 / tokens,
                 read_s > 0 ? stat("bytes_read") / 1e9 / read_s : 0.0, read_s, compute_s,
                 stat("expert_wait_seconds"));
  }
  // Speculative decoding (COLI_K3_SPEC) and the Vulkan expert tier (COLI_VULKAN), when they ran.
  if (stat("spec_drafts") > 0) {
    std::fprintf(stderr,
                 "coli run: speculative decoding: %.0f forward passes, %.0f verify passes, %.0f "
                 "draft tokens, %.0f accepted, %.0f tokens without a pass, %.0f rejections "
                 "(%.0f rows replayed)\n",
                 stat("decode_passes"), stat("spec_drafts"), stat("spec_draft_tokens"),
                 stat("spec_accepted_tokens"), stat("spec_tokens_from_buffer"),
                 stat("spec_rejections"), stat("spec_replays"));
  }
  // What the Vulkan tier holds now is the model's current value (model stats), not the request's.
  std::map<std::string, double> resident;
  if (stat("vk_matmuls") > 0) {
    if (absl::StatusOr<v1::MetricsResponse> metrics = c.Metrics(); metrics.ok()) {
      for (const v1::ModelStat& ms : metrics->model_stats()) {
        if (ms.model() == model->id()) resident[ms.name()] = ms.value();
      }
    }
  }
  if (stat("vk_matmuls") > 0) {
    std::fprintf(stderr,
                 "coli run: [VK] %.0f matmuls on the GPU, tier %.0f experts resident (%.1f MB), "
                 "%.0f hits, %.0f promotions, %.0f evictions\n",
                 stat("vk_matmuls"), resident["vk_tier_resident"],
                 resident["vk_tier_bytes"] / 1e6, stat("vk_tier_hits"), stat("vk_tier_promotions"),
                 stat("vk_tier_evictions"));
  }
  if (stat("vk_dense_calls") > 0) {  // COLI_VK_DENSE
    std::fprintf(stderr,
                 "coli run: [VK] shared experts: %.0f blocks on the GPU, %.0f matrices resident "
                 "(%.1f MB)\n",
                 stat("vk_dense_calls"), resident["vk_dense_matrices"],
                 resident["vk_dense_bytes"] / 1e6);
  }
  return 0;
}

}  // namespace

COLI_REGISTER_COMMAND(run, "run", "one-shot generation: coli run [--model DIR] \"prompt\" --ngen N",
                      RunCommand);

}  // namespace coli::cli
