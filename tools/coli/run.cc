// `coli run`: the one-shot job. Loads the model (--model, else $COLI_MODEL, else the embedded
// tiny model) in a host (--host, else a private one started and stopped here), generates, and
// streams the text to stdout; load progress and statistics go to stderr.
//
//   coli run [--model DIR] [--host ADDR] "prompt" [--ngen N] [--ids 1,2,3] [--print-ids]
//            [--temperature T] [--top-p P] [--top-k K] [--seed S] [--logprobs K]
//            [--frequency-penalty F] [--presence-penalty P] [--repetition-penalty R]
//            [--min-p M] [--logit-bias ID=BIAS,...] [--ignore-eos] [--min-tokens N]
//            [--chat [--system TEXT] [--no-think]] [--json-schema FILE | --json-object]
//
// --chat renders the prompt as one user turn with the family's template (K3_THINK=0 or
// --no-think opens the answer directly); reasoning goes to stderr, the answer to stdout.
// --json-schema FILE (a JSON schema, or a whole OpenAI response_format object) and --json-object
// enforce the output's form (plugin ABI 1.4): with --chat the answer, otherwise the whole output
// (docs/status/constrained.md).
// The prompt may also come from stdin (`-`) or a file (`-f FILE`); flags take `--flag VALUE` or
// `--flag=VALUE` (tools/coli/run_flags.h). Ctrl-C, SIGTERM and SIGHUP cancel the load or the
// request (the host stops within one token), stop the private host and exit 128 + the signal; a
// reader that leaves the pipe (`| head`) ends the run quietly with 141, as `cat` does. Usage
// errors exit 2, a failed load or request 1.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "host/model_options_env.h"
#include "nlohmann/json.hpp"
#include "tools/coli/cli_args.h"
#include "tools/coli/client.h"
#include "tools/coli/command.h"
#include "tools/coli/reply_tail.h"
#include "tools/coli/run_flags.h"

namespace coli::cli {
namespace {

// The signal that asked this run to end (SIGINT, SIGTERM, SIGHUP), 0 while none did.
std::atomic<int> g_signal{0};

void OnSignal(int sig) { g_signal.store(sig); }

int UsageError(const std::string& why) {
  std::fprintf(stderr, "coli run: %s\n(coli run --help lists the flags)\n", why.c_str());
  return 2;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "coli run: %s\n", DescribeError(status).c_str());
  return 1;
}

// The response_format for --json-schema FILE: the file's JSON as a whole response_format object
// when it is one ({"type": ...}), else as the schema. INVALID_ARGUMENT naming the file.
absl::StatusOr<nlohmann::json> SchemaFormatFromFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) {
    return absl::InvalidArgumentError("--json-schema: cannot read '" + path +
                                      "': " + std::strerror(errno));
  }
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  std::fclose(f);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError("--json-schema: '" + path + "' is not valid JSON");
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError("--json-schema: '" + path + "' is not a JSON object");
  }
  if (j.contains("json_schema") && j.value("type", nlohmann::json()) == "json_schema") return j;
  return nlohmann::json{{"type", "json_schema"},
                        {"json_schema", {{"name", "schema"}, {"schema", j}}}};
}

// Writes generated text to stdout; after the reader of a pipe went away (EPIPE) or the disk
// filled, it writes nothing more and remembers why (the run then cancels and exits).
class Output {
 public:
  void Write(std::string_view text) {
    if (error_.load() != 0 || text.empty()) return;
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() ||
        std::fflush(stdout) != 0) {
      error_ = errno != 0 ? errno : EIO;
    }
  }
  int error() const { return error_.load(); }

 private:
  std::atomic<int> error_{0};  // read by the watcher thread
};

int RunCommand(int argc, char** argv) {
  absl::StatusOr<RunFlags> parsed = ParseRunFlags(argc, argv);
  if (!parsed.ok()) return UsageError(std::string(parsed.status().message()));
  RunFlags& flags = *parsed;
  if (flags.help) {
    std::printf("%s", RunUsage().c_str());
    return 0;
  }
  std::string prompt;
  if (flags.ids.empty()) {
    absl::StatusOr<std::string> read = ReadPrompt(flags);
    if (!read.ok()) return UsageError(std::string(read.status().message()));
    prompt = *std::move(read);
  }
  nlohmann::json response_format;  // null: none
  if (flags.json_object) response_format = {{"type", "json_object"}};
  if (!flags.json_schema_path.empty()) {
    auto format = SchemaFormatFromFile(flags.json_schema_path);
    if (!format.ok()) return UsageError(std::string(format.status().message()));
    response_format = *std::move(format);
  }
  // A sampled run without a seed gets a fresh one each time (llama.cpp's default); greedy runs
  // do not sample, so theirs does not matter.
  v1::SamplingParams& sampling = flags.sampling;
  if (!flags.seed_given) sampling.set_seed(RandomSeed());

  const std::string model_dir = client::ResolveModelDir(flags.model);
  if (absl::Status bad = CheckLocalModelDir(flags, model_dir); !bad.ok()) {
    return UsageError(std::string(bad.message()));
  }

  // Ctrl-C (and SIGTERM, SIGHUP) cancel the load or the request; the watcher thread turns the
  // flag into a cancel, and the private host is stopped and its folder removed on the way out.
  // A closed stdout is noticed by its write error, not by SIGPIPE.
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) CatchUnlessIgnored(sig, OnSignal);
  signal(SIGPIPE, SIG_IGN);
  client::CancelToken load_cancel, cancel;
  Output out;
  client::CancelWhen watcher([&] { return g_signal.load() != 0 || out.error() != 0; },
                             {&load_cancel, &cancel});
  auto interrupted = [&]() {
    const int sig = g_signal.load();
    std::fprintf(stderr, "\ncoli run: interrupted (%s)\n",
                 sig == SIGINT ? "Ctrl-C" : sig == SIGTERM ? "SIGTERM" : "SIGHUP");
    return 128 + sig;
  };

  auto connected = client::Client::Connect({.host = flags.host});
  if (g_signal.load() != 0) return interrupted();
  if (!connected.ok()) return Fail(connected.status());
  client::Client& c = **connected;
  // The model switches of the environment, read with the tables the host's plugins declare: a
  // bad value is a usage error, refused before anything loads. With them come the chat-request
  // defaults the families declare (K3_THINK).
  auto environment = client::ReadEnvironment(c);
  if (!environment.ok()) {
    if (environment.status().code() == absl::StatusCode::kInvalidArgument) {
      return UsageError(std::string(environment.status().message()));
    }
    return Fail(environment.status());
  }
  auto model = client::LoadShowingProgress(c, model_dir, environment->options, &load_cancel);
  if (g_signal.load() != 0) return interrupted();
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

  std::vector<int32_t> generated;
  int64_t prompt_tokens = 0, reused = 0;
  client::StreamCallbacks cb;
  cb.on_started = [&](const v1::Started& s) {
    prompt_tokens = s.prompt_tokens();
    reused = s.tokens_reused();
  };
  const bool chat = flags.chat;
  bool printed_logprobs = false;  // then the statistics start on a line of their own
  // The reply's last tokens, and (--chat) the channel their text continues: NONE after a special
  // token or a tool call, where the model's parser placed the bytes (as coli serve decides it).
  client::ReplyTail last_tokens(client::FirstSpecialId(*model));
  v1::Channel tail_channel = v1::CHANNEL_NONE;
  cb.on_token = [&](const v1::Token& t) {
    generated.push_back(t.id());
    last_tokens.Push(t.id());
    if (last_tokens.empty()) tail_channel = v1::CHANNEL_NONE;
    if (!chat) out.Write(t.text());
    if (t.has_logprobs()) {
      std::fprintf(stderr, "[logprob %d %.4f]", t.id(), t.logprobs().sampled().logprob());
      printed_logprobs = true;
    }
  };
  bool in_reasoning = false;
  cb.on_delta = [&](const v1::ChatDelta& d) {
    if (d.channel() == v1::CHANNEL_REASONING || d.channel() == v1::CHANNEL_CONTENT) {
      // An event without text names the channel that holds a character's first bytes.
      tail_channel = last_tokens.empty() ? v1::CHANNEL_NONE : d.channel();
    } else {
      tail_channel = v1::CHANNEL_NONE;
    }
    if (d.channel() == v1::CHANNEL_REASONING) {
      if (!in_reasoning) std::fprintf(stderr, "[thinking] ");
      in_reasoning = true;
      std::fwrite(d.text().data(), 1, d.text().size(), stderr);
    } else if (d.channel() == v1::CHANNEL_CONTENT) {
      if (in_reasoning) std::fprintf(stderr, "\n");
      in_reasoning = false;
      out.Write(d.text());
    } else if (d.channel() == v1::CHANNEL_TOOL_CALL) {
      out.Write("\n[tool call] " + d.text() + "\n");
    }
  };

  absl::StatusOr<v1::Finished> finished;
  if (chat) {
    nlohmann::json request;
    request["messages"] = nlohmann::json::array();
    if (!flags.system.empty()) {
      request["messages"].push_back({{"role", "system"}, {"content", flags.system}});
    }
    request["messages"].push_back({{"role", "user"}, {"content", prompt}});
    if (flags.think) request["enable_thinking"] = *flags.think;
    host::ApplyRequestDefaults(environment->request, &request);
    if (!response_format.is_null()) request["response_format"] = response_format;
    v1::ChatRequest r;
    r.set_model(model->id());
    r.set_request_json(request.dump());  // all text was checked to be UTF-8
    r.set_max_tokens(flags.ngen);
    *r.mutable_sampling() = sampling;
    finished = c.Chat(r, cb, &cancel);
  } else {
    v1::GenerateRequest r;
    r.set_model(model->id());
    if (!flags.ids.empty())
      r.mutable_prompt_ids()->Add(flags.ids.begin(), flags.ids.end());
    else
      r.set_prompt(prompt);
    if (!response_format.is_null()) r.set_response_format(response_format.dump());
    r.set_max_tokens(flags.ngen);
    *r.mutable_sampling() = sampling;
    finished = c.Generate(r, cb, &cancel);
  }
  watcher.Stop();
  // A reply cut inside a character (by --ngen or the context; the model's stop token flushes the
  // decoder) ends with U+FFFD rather than losing the character's first bytes, as coli serve's.
  if (finished.ok() && finished->reason() != v1::FINISH_REASON_STOP &&
      finished->reason() != v1::FINISH_REASON_TOOL_CALLS && !last_tokens.empty() &&
      (!chat || tail_channel != v1::CHANNEL_NONE)) {
    absl::StatusOr<std::string> bytes = c.Detokenize(model->id(), last_tokens.ids());
    const std::string marker = bytes.ok() ? client::ReplyTail::Marker(*bytes) : "";
    if (chat && tail_channel == v1::CHANNEL_REASONING) {
      std::fwrite(marker.data(), 1, marker.size(), stderr);
    } else {
      out.Write(marker);
    }
  }
  if (in_reasoning || printed_logprobs) std::fprintf(stderr, "\n");
  if (out.error() == EPIPE) return 128 + SIGPIPE;  // the reader left: quietly, as `cat` does
  out.Write("\n");
  if (flags.print_ids) {
    std::string list;
    for (size_t i = 0; i < generated.size(); ++i) {
      list += (i ? "," : "") + std::to_string(generated[i]);
    }
    out.Write(list + "\n");
  }
  if (out.error() == EPIPE) return 128 + SIGPIPE;
  if (out.error() != 0) {
    std::fprintf(stderr, "coli run: cannot write the output: %s\n", std::strerror(out.error()));
    return 1;
  }
  if (g_signal.load() != 0) {
    std::fprintf(stderr, "coli run: %zu tokens generated before the interruption", generated.size());
    return interrupted();
  }
  if (!finished.ok()) return Fail(finished.status());
  const auto& st = finished->stats();
  if (sampling.temperature() > 0) {
    std::fprintf(stderr, "coli run: sampled with seed %llu (--seed repeats it)\n",
                 static_cast<unsigned long long>(sampling.seed()));
  }
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
