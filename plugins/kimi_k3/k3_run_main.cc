// k3-run: the Kimi K3 one-shot diagnostic (seed "standalone one-turn diagnostic").
//
//   k3-run [<model_dir>] "prompt" --ngen 64        # text prompt (needs the tokenizer files)
//   k3-run <model_dir> --ids 1,2,3 --ngen 8 --print-ids
//   K3_BITS=32 K3_MLA_BITS=32 K3_HEAD_BITS=32 K3_IDOT=0 K3_LOGITS=/tmp/l.f32 k3-run dir --ids ...
//   K3_X0=x0.f32 K3_LAYERS=4 K3_TRACE=/tmp/t.f32 k3-run dir --ngen 0
//
// Without a model folder it runs the tiny fixture made by the build (build/fixtures/k3_tiny:
// RANDOM WEIGHTS, not a real model — its text is noise). The prompt is encoded as plain text
// with no BOS (the vendor chat format adds none). Generation stops after --ngen tokens or at
// an end-of-sequence id from config.json. Greedy unless --temp (or COLI_TEMP) is set.
// COLI_K3_SPEC=K: speculative decoding by prompt lookup (spec_decode.h; greedy, or sampled with
// --temp: a copy of the sampler verifies, so a seed gives the same tokens), same tokens, fewer
// forward passes when the text repeats; the pass counts go to stderr.
// The K3_* environment switches are read here, once, into ModelOptions (options.h lists them).
// stdout: generated text (or ids with --print-ids); stderr: load/prefill/decode speed and the
// time split (attention / MoE / head / mix).
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/kernels/kernels.h"
#include "common/sampling/sampling.h"
#include "common/status/status.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/session.h"
#include "plugins/kimi_k3/spec_decode.h"
#include "plugins/kimi_k3/spec_lookup.h"
#include "plugins/kimi_k3/vk_tier.h"
#ifdef COLI_K3_HAVE_TOKENIZER
#include "common/tokenizer/tokenizer.h"
#endif

#ifndef COLI_K3_DEFAULT_MODEL
#define COLI_K3_DEFAULT_MODEL ""
#endif

namespace coli::k3 {
namespace {

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::Status EnvInt(const char* name, int* out) {
  const char* v = std::getenv(name);
  if (!v || !*v) return absl::OkStatus();
  if (!absl::SimpleAtoi(v, out))
    return absl::InvalidArgumentError(std::string(name) + "='" + v + "': expected an integer");
  return absl::OkStatus();
}
absl::Status EnvDouble(const char* name, double* out) {
  const char* v = std::getenv(name);
  if (!v || !*v) return absl::OkStatus();
  if (!absl::SimpleAtod(v, out))
    return absl::InvalidArgumentError(std::string(name) + "='" + v + "': expected a number");
  return absl::OkStatus();
}
// A 0/1 switch (K3_MMAP=2 or K3_IDOT=yes are refused, not read as on).
absl::Status EnvBool(const char* name, bool* out) {
  const char* v = std::getenv(name);
  if (!v || !*v) return absl::OkStatus();
  const std::string value = v;
  if (value != "0" && value != "1") {
    return absl::InvalidArgumentError(std::string(name) + "='" + value + "': expected 0 or 1");
  }
  *out = value == "1";
  return absl::OkStatus();
}
std::string EnvString(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

absl::StatusOr<ModelOptions> OptionsFromEnv() {
  ModelOptions o;
  int maxt = 0;
  COLI_RETURN_IF_ERROR(EnvInt("K3_BITS", &o.bits));
  COLI_RETURN_IF_ERROR(EnvInt("K3_MLA_BITS", &o.mla_bits));
  COLI_RETURN_IF_ERROR(EnvInt("K3_HEAD_BITS", &o.head_bits));
  // Set = explicit: a repacked container keeps its own format when they are unset (weights.h).
  o.bits_set = !EnvString("K3_BITS").empty();
  o.mla_bits_set = !EnvString("K3_MLA_BITS").empty();
  o.head_bits_set = !EnvString("K3_HEAD_BITS").empty();
  COLI_RETURN_IF_ERROR(EnvBool("K3_MMAP", &o.mmap));
  COLI_RETURN_IF_ERROR(EnvBool("K3_VERIFY", &o.verify_checksums));
  o.verify_mapped = EnvString("K3_VERIFY").empty() ? !o.mmap : o.verify_checksums;
  COLI_RETURN_IF_ERROR(EnvBool("K3_IDOT", &o.idot));
  COLI_RETURN_IF_ERROR(EnvInt("K3_CHUNK", &o.chunk));
  COLI_RETURN_IF_ERROR(EnvInt("K3_LOAD_THREADS", &o.load_threads));
  COLI_RETURN_IF_ERROR(EnvDouble("K3_TOPP", &o.topp));
  COLI_RETURN_IF_ERROR(EnvInt("K3_MAXT", &maxt));
  if (maxt < 0) {
    return absl::InvalidArgumentError("K3_MAXT='" + EnvString("K3_MAXT") +
                                      "': expected a context in tokens (0 = unbounded)");
  }
  o.max_context = maxt;
  COLI_RETURN_IF_ERROR(EnvInt("K3_LAYERS", &o.layers));
  for (absl::string_view d : absl::StrSplit(EnvString("K3_DIRS"), absl::ByAnyChar(",:"), absl::SkipEmpty()))
    o.extra_dirs.emplace_back(d);
  o.trace_path = EnvString("K3_TRACE");
  o.x0_path = EnvString("K3_X0");
  o.logits_path = EnvString("K3_LOGITS");
  // COLI_VULKAN / K3_VK, COLI_VK_TIER_GB / K3_VK_GB, COLI_VK_TIER_RATE / K3_VK_UP (vk_tier.h).
  COLI_RETURN_IF_ERROR(VkSwitches::FromEnv([](const char* n) { return std::getenv(n); }).Resolve(&o));
  return o;
}

// The K3_X0 rows: f32 little-endian, read before the model loads so that a wrong file is named
// at once (a folder read as empty: "prefill needs at least one token" after the whole load).
absl::StatusOr<std::vector<float>> ReadX0File(const std::string& path) {
  const std::string what = "K3_X0 '" + path + "'";
  if (IsDir(path)) {
    return absl::InvalidArgumentError(what + ": is a folder, not a file of f32 rows");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(what + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  if (bytes.empty()) return absl::InvalidArgumentError(what + ": empty (expected f32 rows [T, D])");
  if (bytes.size() % 4 != 0) {
    return absl::InvalidArgumentError(what + ": " + std::to_string(bytes.size()) +
                                      " bytes is not a whole number of f32 values");
  }
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

int Usage(std::ostream& out = std::cerr) {
  out << "usage: k3-run [<model_dir>] [\"prompt\"] [--ids 1,2,3] [--ngen N] [--print-ids]\n"
               "              [--temp T] [--top-p P] [--top-k K] [--seed S] [--logprobs K]\n"
               "env: K3_BITS K3_MLA_BITS K3_HEAD_BITS K3_MMAP K3_VERIFY K3_IDOT K3_CHUNK K3_LOAD_THREADS K3_TOPP\n"
               "     K3_DIRS K3_MAXT K3_LAYERS K3_TRACE K3_X0 K3_LOGITS COLI_TEMP\n"
               "     COLI_K3_SPEC (max prompt-lookup draft tokens), COLI_K3_SPEC_MIN,\n"
               "     COLI_K3_SPEC_SAMPLED_NGRAM, COLI_K3_SPEC_ADAPT (the draft policy)\n";
  return 2;
}

// A flag's value out of range: INVALID_ARGUMENT naming the flag and the value.
template <typename T>
absl::Status CheckRange(const std::string& flag, T v, T lo, T hi) {
  if (v >= lo && v <= hi) return absl::OkStatus();  // false for NaN too
  std::ostringstream m;
  m << flag << " " << v << ": expected a value in [" << lo << ", " << hi << "]";
  return absl::InvalidArgumentError(m.str());
}

// Set when Main fails on the command line itself (exit 2, not 1).
bool g_usage_error = false;

absl::Status Main(int argc, char** argv) {
  g_usage_error = true;  // until the command line and the switches are through
  std::string model_dir, prompt;
  std::vector<int32_t> ids;
  bool have_ids = false, print_ids = false;
  int ngen = 16;
  sampling::SamplerOptions sopt;
  double temp = 0;
  COLI_RETURN_IF_ERROR(EnvDouble("COLI_TEMP", &temp));
  sopt.temperature = static_cast<float>(temp);
  int spec_k = 0;
  COLI_RETURN_IF_ERROR(EnvInt("COLI_K3_SPEC", &spec_k));
  if (spec_k < 0 || spec_k > 16)
    return absl::InvalidArgumentError("COLI_K3_SPEC=" + std::to_string(spec_k) +
                                      ": expected a draft length in 0…16");
  DraftPolicy spec_policy;  // COLI_K3_SPEC_MIN, COLI_K3_SPEC_SAMPLED_NGRAM, COLI_K3_SPEC_ADAPT
  for (const DraftPolicySwitch& sw : kDraftPolicySwitches) {
    if (const char* v = std::getenv(sw.env); v != nullptr && *v != '\0') {
      COLI_RETURN_IF_ERROR(ParseDraftPolicySwitch(sw.option, v, &spec_policy).status());
    }
  }
  std::vector<std::string> positional;
  g_usage_error = true;  // until the command line is through
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    // `--flag=value` as well as `--flag value`.
    std::optional<std::string> inline_value;
    if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      inline_value = a.substr(a.find('=') + 1);
      a.resize(a.find('='));
    }
    auto next = [&]() -> absl::StatusOr<std::string> {
      if (inline_value.has_value()) return *inline_value;
      if (i + 1 >= argc) return absl::InvalidArgumentError(a + " needs a value");
      return std::string(argv[++i]);
    };
    auto num = [&](auto* out) -> absl::Status {
      COLI_ASSIGN_OR_RETURN(std::string v, next());
      bool ok;
      if constexpr (std::is_same_v<std::remove_pointer_t<decltype(out)>, float>) ok = absl::SimpleAtof(v, out);
      else ok = absl::SimpleAtoi(v, out);
      if (!ok) return absl::InvalidArgumentError(a + " '" + v + "': not a number");
      return absl::OkStatus();
    };
    if (inline_value.has_value() &&
        (a == "--print-ids" || a == "-h" || a == "--help")) {
      return absl::InvalidArgumentError(a + " takes no value");
    }
    if (a == "--ngen") COLI_RETURN_IF_ERROR(num(&ngen));
    else if (a == "--print-ids") print_ids = true;
    else if (a == "--temp") COLI_RETURN_IF_ERROR(num(&sopt.temperature));
    else if (a == "--top-p") COLI_RETURN_IF_ERROR(num(&sopt.top_p));
    else if (a == "--top-k") COLI_RETURN_IF_ERROR(num(&sopt.top_k));
    else if (a == "--seed") COLI_RETURN_IF_ERROR(num(&sopt.seed));
    else if (a == "--logprobs") COLI_RETURN_IF_ERROR(num(&sopt.logprobs));
    else if (a == "--ids") {
      COLI_ASSIGN_OR_RETURN(std::string v, next());
      have_ids = true;
      for (absl::string_view p : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        int32_t id;
        if (!absl::SimpleAtoi(p, &id)) return absl::InvalidArgumentError("--ids: bad id '" + std::string(p) + "'");
        ids.push_back(id);
      }
    } else if (a == "-h" || a == "--help") {
      Usage(std::cout);
      return absl::OkStatus();
    } else if (a.rfind("--", 0) == 0) {
      Usage();
      return absl::InvalidArgumentError("unknown flag " + a);
    } else {
      positional.push_back(a);
    }
  }
  COLI_RETURN_IF_ERROR(CheckRange("--ngen", ngen, 0, 1 << 30));
  COLI_RETURN_IF_ERROR(CheckRange("--temp", sopt.temperature, 0.0f, 100.0f));
  COLI_RETURN_IF_ERROR(CheckRange("--top-p", sopt.top_p, 0.0f, 1.0f));
  COLI_RETURN_IF_ERROR(CheckRange("--logprobs", sopt.logprobs, 0, 1 << 20));
  // The model folder is the first argument when it names one. It must, when a second argument
  // follows (the prompt) or when the prompt comes from --ids / K3_X0: a mistyped folder used to
  // become the prompt, and the tiny fixture ran instead (exit 0).
  const bool prompt_elsewhere = have_ids || !EnvString("K3_X0").empty();
  const bool first_is_model =
      !positional.empty() && (IsDir(positional[0]) || positional.size() >= 2 || prompt_elsewhere);
  if (first_is_model) {
    model_dir = positional[0];
    positional.erase(positional.begin());
    struct stat st;
    if (::stat(model_dir.c_str(), &st) != 0) {
      return absl::NotFoundError("model folder '" + model_dir + "': no such folder");
    }
    if (!S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError("model folder '" + model_dir + "' is a file, not a folder");
    }
  } else {
    model_dir = COLI_K3_DEFAULT_MODEL;
    std::cerr << "[k3-run] no model folder given: using the build's tiny fixture " << model_dir
              << " (RANDOM WEIGHTS, not a real model; its output is noise)\n";
  }
  if (positional.size() > 1) return absl::InvalidArgumentError("more than one prompt given");
  if (!positional.empty()) prompt = positional[0];
  if (have_ids && !prompt.empty()) {
    return absl::InvalidArgumentError("give a prompt or --ids, not both");
  }
  g_usage_error = false;

  COLI_ASSIGN_OR_RETURN(ModelOptions opt, OptionsFromEnv());
  std::vector<float> x0;
  if (!opt.x0_path.empty()) {
    COLI_ASSIGN_OR_RETURN(x0, ReadX0File(opt.x0_path));
  }
  const double t0 = Seconds();
  int last_pct = -1;
  VkExpertTier* vk_tier = nullptr;  // owned by the model; only with COLI_VULKAN=1 / K3_VK=1
  COLI_ASSIGN_OR_RETURN(
      std::unique_ptr<Model> model,
      Model::Load(model_dir, opt, [&](int done, int total) {
        const int pct = 100 * done / total;
        if (pct / 10 != last_pct / 10) std::cerr << "\r[k3-run] loading " << pct << "%" << std::flush;
        last_pct = pct;
      }, ExpertSourceFactoryFor(opt, model_dir, nullptr, &vk_tier)));
  const double t_load = Seconds() - t0;
  std::cerr << "\r[k3-run] loaded " << model->num_layers() << " layers in " << t_load << " s ("
            << model->weights().resident_bytes / 1e6 << " MB resident";
  if (model->weights().mapped_bytes > 0)
    std::cerr << " + " << model->weights().mapped_bytes / 1e6 << " MB mapped (K3_MMAP)";
  // The formats the matrices have, not the switches: an unset switch leaves a repacked
  // container's own format (weights.h), so "auto:8" misnamed a container made with 4. Shown for
  // the first KDA layer's q_proj, the first MLA layer's q_a_proj and lm_head.
  const Weights& w = model->weights();
  auto format_of = [&](bool kda) -> std::string {
    for (const LayerWeights& l : w.layers) {
      if (l.kda == kda) {
        return kernels::WeightFormatName((kda ? l.kda_w.q_proj : l.mla_w.q_a_proj).view().format);
      }
    }
    return "-";
  };
  std::cerr << "; matrices " << format_of(true) << "/" << format_of(false) << "/"
            << kernels::WeightFormatName(w.lm_head.view().format) << " (KDA/MLA/head"
            << (opt.bits_set || opt.mla_bits_set || opt.head_bits_set ? ", as K3_*BITS asked"
                                                                      : "")
            << "), idot " << opt.idot << ", chunk " << opt.chunk << ")\n";

#ifdef COLI_K3_HAVE_TOKENIZER
  std::unique_ptr<tok::Tokenizer> tokenizer;
  std::unique_ptr<tok::StreamDecoder> stream;
  if (!print_ids || (!have_ids && opt.x0_path.empty())) {
    auto loaded = tok::Tokenizer::LoadDir(model_dir);
    if (loaded.ok()) {
      tokenizer = std::move(loaded).value();
      stream = std::make_unique<tok::StreamDecoder>(*tokenizer);
    } else if (!have_ids && opt.x0_path.empty()) {
      return loaded.status();
    }
  }
  if (!have_ids && opt.x0_path.empty()) {
    // Plain text, special tokens not interpreted, and no BOS (the vendor chat renderer adds
    // none, spec §10).
    ids = tokenizer->Encode(prompt, /*allow_special=*/false);
  }
#else
  if (!have_ids && opt.x0_path.empty())
    return absl::UnimplementedError("this k3-run was built without common/tokenizer: pass --ids");
#endif

  std::unique_ptr<Session> session = model->NewSession();
  std::vector<float> logits;
  const double tp = Seconds();
  int64_t prefilled = 0;
  if (!opt.x0_path.empty()) {
    if (x0.size() % static_cast<size_t>(model->hidden_size()) != 0) {
      return absl::InvalidArgumentError(
          "K3_X0 '" + opt.x0_path + "': " + std::to_string(x0.size()) +
          " floats is not a whole number of rows of the hidden size " +
          std::to_string(model->hidden_size()));
    }
    COLI_ASSIGN_OR_RETURN(logits, session->PrefillRows(x0));
    prefilled = static_cast<int64_t>(x0.size()) / model->hidden_size();
  } else {
    if (ids.empty()) return absl::InvalidArgumentError("empty prompt");
    COLI_ASSIGN_OR_RETURN(logits, session->Prefill(ids));
    prefilled = static_cast<int64_t>(ids.size());
  }
  const double t_prefill = Seconds() - tp;
  Timings after_prefill = session->timings();

  sampling::Sampler sampler(sopt);
  std::vector<int32_t> generated;
  // COLI_K3_SPEC: off under K3_TRACE / K3_LOGITS (undelivered rows) and with penalties (none
  // in k3-run today; their tokens depend on a history a verify does not advance).
  const bool spec_on = spec_k > 0 && !sampling::HasPenalties(sopt) && opt.trace_path.empty() &&
                       opt.logits_path.empty();
  SpecDecoder spec;
  DraftBudget spec_budget(spec_policy);
  std::vector<int32_t> stop_ids;
  for (int64_t e : model->config().eos_token_ids) stop_ids.push_back(static_cast<int32_t>(e));
  int64_t spec_verifies = 0, spec_drafted = 0, spec_accepted = 0, spec_from_buffer = 0,
          spec_passes = 0, spec_replayed = 0;
  const double td = Seconds();
  for (int g = 0; g < ngen; ++g) {
    sampling::Sample s = sampler.Next(logits);
    generated.push_back(s.id);
    if (print_ids) {
      std::cout << (g ? "," : "") << s.id << std::flush;
    }
#ifdef COLI_K3_HAVE_TOKENIZER
    else if (stream) {
      std::cout << stream->Push(s.id) << std::flush;
    }
#endif
    else {
      std::cout << s.id << " " << std::flush;
    }
    if (sopt.logprobs > 0) {
      std::cerr << "[k3-run] token " << s.id << " logprob " << s.logprob << " top:";
      for (const auto& t : s.top) std::cerr << " " << t.id << ":" << t.logprob;
      std::cerr << "\n";
    }
    bool eos = false;
    for (int64_t e : model->config().eos_token_ids) eos |= (e == s.id);
    if (eos || g + 1 == ngen) break;
    if (spec_on) {
      // A verified token: its logits are buffered, no pass (the sampler drew exactly what its
      // copy drew in the verify).
      if (std::optional<std::vector<float>> buffered = spec.Take(s.id)) {
        logits = std::move(*buffered);
        ++spec_from_buffer;
        continue;
      }
      COLI_RETURN_IF_ERROR(spec.Rewind(*session).status());  // nothing buffered: no-op
      std::vector<int32_t> context = session->tokens();
      context.push_back(s.id);
      int64_t k = spec_k;
      if (opt.max_context > 0) k = std::min<int64_t>(k, opt.max_context - session->position() - 1);
      const std::vector<int32_t> draft = spec_budget.Propose(
          context, static_cast<int>(k), {}, sopt.temperature > 0, stop_ids);
      if (!draft.empty()) {
        // Greedy: the argmax accepts; sampled: draws of a copy of the sampler (its RNG state
        // included), and the real one later draws the same tokens from the same logits.
        COLI_ASSIGN_OR_RETURN(SpecDecoder::Verified v,
                              spec.VerifyWithSampler(*session, s.id, draft, sampler, nullptr));
        spec_budget.Observe(draft.size(), v.accepted);
        logits = std::move(v.logits);
        ++spec_verifies;
        spec_drafted += static_cast<int64_t>(draft.size());
        spec_accepted += v.accepted;
        spec_passes += 1;  // a rejected draft is replayed (spec_decode.h), no second pass
        spec_replayed += v.replayed;
        continue;
      }
    }
    COLI_ASSIGN_OR_RETURN(logits, session->Step(s.id));
    ++spec_passes;
  }
#ifdef COLI_K3_HAVE_TOKENIZER
  if (stream && !print_ids) std::cout << stream->Flush();
#endif
  std::cout << "\n";
  const double t_decode = Seconds() - td;
  const Timings& t = session->timings();
  auto split = [](const char* what, const Timings& a, const Timings& b) {
    std::fprintf(stderr, "[k3-run] %s split: attention %.3f s, MoE %.3f s, head %.3f s, mix %.3f s, embed %.3f s\n",
                 what, a.attention - b.attention, a.moe - b.moe, a.head - b.head, a.mix - b.mix,
                 a.embed - b.embed);
  };
  std::fprintf(stderr, "[k3-run] prefill: %lld tokens in %.3f s (%.2f tokens/s)\n",
               static_cast<long long>(prefilled), t_prefill, prefilled / std::max(t_prefill, 1e-9));
  split("prefill", after_prefill, Timings{});
  const int steps = static_cast<int>(generated.size()) > 0 ? static_cast<int>(generated.size()) - 1 : 0;
  std::fprintf(stderr, "[k3-run] decode: %d steps in %.3f s (%.2f tokens/s)\n", steps, t_decode,
               steps / std::max(t_decode, 1e-9));
  split("decode", t, after_prefill);
  if (spec_on) {
    std::fprintf(stderr, "[k3-run] spec: %lld forward passes for %d steps; %lld verify passes, "
                 "%lld draft tokens, %lld accepted, %lld from the buffer, %lld rows replayed\n",
                 static_cast<long long>(spec_passes), steps, static_cast<long long>(spec_verifies),
                 static_cast<long long>(spec_drafted), static_cast<long long>(spec_accepted),
                 static_cast<long long>(spec_from_buffer), static_cast<long long>(spec_replayed));
    const DraftBudget::Skips& k = spec_budget.skips();
    std::fprintf(stderr, "[k3-run] spec policy: matches not drafted: %lld paused, %lld short "
                 "(sampled row), %lld drafts below the minimum; %lld pauses ended by a full match\n",
                 static_cast<long long>(k.paused), static_cast<long long>(k.short_match),
                 static_cast<long long>(k.short_draft), static_cast<long long>(k.pause_ended));
  }
  std::fprintf(stderr, "[k3-run] experts: %lld unique expert computations for %lld (row, expert) pairs\n",
               static_cast<long long>(t.moe_stats.expert_calls),
               static_cast<long long>(t.moe_stats.expert_rows));
  if (vk_tier != nullptr) std::cerr << VkTierReport(vk_tier->Stats());
  return absl::OkStatus();
}

}  // namespace
}  // namespace coli::k3

int main(int argc, char** argv) {
  absl::Status s = coli::k3::Main(argc, argv);
  if (!s.ok()) {
    std::cerr << "k3-run: " << s << "\n";
    return coli::k3::g_usage_error ? 2 : 1;
  }
  return 0;
}
