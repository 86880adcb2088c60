#include "host/model_options_env.h"

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags/flags.h"
#include "common/status/status.h"

namespace coli::host {
namespace {

// The flags library's messages ("K3_CHUNK: '0' is outside [1, 512]"), said to be about the
// environment: the user never typed a flag of that name.
absl::Status FromEnvironment(const absl::Status& status) {
  return absl::InvalidArgumentError(
      absl::StrCat("environment variable ", std::string(status.message())));
}

absl::StatusOr<int64_t> WholeNumber(const char* name, const std::string& value, int64_t lo,
                                    int64_t hi) {
  absl::StatusOr<int64_t> n = flags::ParseWholeNumber(name, value, lo, hi);
  if (!n.ok()) return FromEnvironment(n.status());
  return n;
}

absl::StatusOr<double> RealNumber(const char* name, const std::string& value, double lo,
                                  double hi) {
  absl::StatusOr<double> x = flags::ParseRealNumber(name, value, lo, hi);
  if (!x.ok()) return FromEnvironment(x.status());
  return x;
}

}  // namespace

absl::StatusOr<v1::ModelOptions> ModelOptionsFromEnv(const EnvLookup& getenv) {
  auto env = [&getenv](const char* name) {
    const char* v = getenv(name);
    return v == nullptr ? std::string() : std::string(v);
  };
  auto bad = [](const char* name, const std::string& value, const char* wanted) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable ", name, "='", value, "': expected ", wanted));
  };
  v1::ModelOptions o;
  // Load-time bits: 0 would read as "unset" on the way to the plugin, so it is refused here
  // with the others the engine has no format for.
  struct BitsVar {
    const char* name;
    void (v1::ModelOptions::*set)(int32_t);
  };
  for (const BitsVar& v : {BitsVar{"K3_BITS", &v1::ModelOptions::set_bits},
                           BitsVar{"K3_MLA_BITS", &v1::ModelOptions::set_mla_bits},
                           BitsVar{"K3_HEAD_BITS", &v1::ModelOptions::set_head_bits}}) {
    const std::string s = env(v.name);
    if (s.empty()) continue;
    COLI_ASSIGN_OR_RETURN(int64_t bits, WholeNumber(v.name, s, INT32_MIN, INT32_MAX));
    if (bits != 4 && bits != 8 && bits != 32) return bad(v.name, s, "4, 8 or 32");
    (o.*v.set)(static_cast<int32_t>(bits));
  }
  // Counts: the plugin reads 0 or a negative value as "unset" (its default), so a value outside
  // the range must be refused here, not passed on.
  struct IntVar {
    const char* name;
    int64_t lo, hi;
    void (v1::ModelOptions::*set)(int32_t);
  };
  const IntVar ints[] = {
      {"K3_CHUNK", 1, 512, &v1::ModelOptions::set_chunk},
      {"K3_LOAD_THREADS", 1, 16, &v1::ModelOptions::set_load_threads},
      {"K3_LAYERS", 0, 1 << 20, &v1::ModelOptions::set_layers},
      {"COLI_THREADS", 0, 1024, &v1::ModelOptions::set_threads},  // 0 = all
  };
  for (const IntVar& v : ints) {
    const std::string s = env(v.name);
    if (s.empty()) continue;
    COLI_ASSIGN_OR_RETURN(int64_t n, WholeNumber(v.name, s, v.lo, v.hi));
    (o.*v.set)(static_cast<int32_t>(n));
  }
  struct BoolVar {
    const char* name;
    void (v1::ModelOptions::*set)(bool);
  };
  for (const BoolVar& v : {BoolVar{"K3_IDOT", &v1::ModelOptions::set_idot},
                           BoolVar{"K3_DIRECT", &v1::ModelOptions::set_direct},
                           BoolVar{"K3_PIPE", &v1::ModelOptions::set_pipe}}) {
    const std::string s = env(v.name);
    if (s.empty()) continue;
    if (s != "0" && s != "1") return bad(v.name, s, "0 or 1");
    (o.*v.set)(s == "1");
  }
  // Reals: finite, in range (nan passed every `x < lo || x > hi` check downstream).
  if (std::string s = env("K3_EXPERT_GB"); !s.empty()) {
    COLI_ASSIGN_OR_RETURN(double gb, RealNumber("K3_EXPERT_GB", s, 0, 1e6));
    o.set_expert_gb(gb);
  }
  if (std::string s = env("K3_TOPP"); !s.empty()) {
    COLI_ASSIGN_OR_RETURN(double p, RealNumber("K3_TOPP", s, 0, 1));
    o.set_topp(p);
  }
  if (std::string s = env("K3_MLA_NORM_EPS"); !s.empty()) {
    COLI_ASSIGN_OR_RETURN(double eps, RealNumber("K3_MLA_NORM_EPS", s, 0, 1));
    if (eps == 0) return bad("K3_MLA_NORM_EPS", s, "a positive epsilon (the vendor's is 1e-6)");
    o.set_mla_norm_eps(eps);
  }
  if (std::string s = env("K3_MAXT"); !s.empty()) {
    COLI_ASSIGN_OR_RETURN(int64_t tokens, WholeNumber("K3_MAXT", s, 1, int64_t{1} << 40));
    o.set_max_context(tokens);
  }
  if (std::string s = env("K3_DIRS"); !s.empty()) {
    for (absl::string_view dir : absl::StrSplit(s, absl::ByAnyChar(":,"), absl::SkipEmpty())) {
      o.add_extra_dirs(std::string(dir));
    }
  }
  // Family-only switches travel by name in `extra`; only set ones are sent (other families
  // refuse names they do not know).
  if (std::string s = env("COLI_K3_CKPT"); !s.empty()) {
    int32_t value = 0;
    if (!absl::SimpleAtoi(s, &value) || value < 0) {
      return bad("COLI_K3_CKPT", s, "a number of checkpoints, 0 or more");
    }
    (*o.mutable_extra())["ckpt"] = s;
  }
  if (std::string s = env("COLI_K3_CKPT_DIR"); !s.empty()) (*o.mutable_extra())["ckpt_dir"] = s;
  // The kimi_k3 model-wide prefix cache: MiB (0 = off) and the shortest prefix kept (tokens).
  for (const auto& [name, key] : {std::pair{"COLI_K3_PREFIX_CACHE_MB", "prefix_cache"},
                                  std::pair{"COLI_K3_PREFIX_CACHE_MIN", "prefix_cache_min"}}) {
    if (std::string s = env(name); !s.empty()) {
      int64_t value = 0;
      if (!absl::SimpleAtoi(s, &value) || value < 0) return bad(name, s, "0 or more");
      (*o.mutable_extra())[key] = s;
    }
  }
  // The Vulkan switches (expert tier, shared experts) and the old K3_VK* aliases, sent as set;
  // the family resolves them (explicit COLI_* wins) and names the variable of a bad value.
  // COLI_VK_DEVICE is read by the Vulkan context itself where the device is opened.
  for (const auto& [name, key] :
       {std::pair{"COLI_VULKAN", "vulkan"}, std::pair{"K3_VK", "vk"},
        std::pair{"COLI_VK_TIER_GB", "vk_tier_gb"}, std::pair{"K3_VK_GB", "vk_gb"},
        std::pair{"COLI_VK_TIER_RATE", "vk_tier_rate"}, std::pair{"K3_VK_UP", "vk_up"},
        std::pair{"COLI_VK_DENSE", "vk_dense"}, std::pair{"COLI_VK_TIER", "vk_tier"},
        std::pair{"COLI_K3_MIX_ROWS", "mix_rows"}, std::pair{"COLI_K3_SPEC_MIN", "spec_min"},
        std::pair{"COLI_K3_SPEC_SAMPLED_NGRAM", "spec_sampled_ngram"},
        std::pair{"COLI_K3_SPEC_ADAPT", "spec_adapt"},
        std::pair{"COLI_K3_PREFIX_CACHE_KEEP", "prefix_cache_keep"}, std::pair{"K3_MMAP", "mmap"},
        std::pair{"K3_VERIFY", "verify"}}) {
    if (std::string s = env(name); !s.empty()) (*o.mutable_extra())[key] = s;
  }
  if (std::string s = env("COLI_K3_SPEC"); !s.empty()) {
    int32_t value = 0;
    if (!absl::SimpleAtoi(s, &value) || value < 0 || value > 16) {
      return bad("COLI_K3_SPEC", s, "a draft length in 0…16");
    }
    (*o.mutable_extra())["spec"] = s;
  }
  o.set_trace_path(env("K3_TRACE"));
  o.set_x0_path(env("K3_X0"));
  o.set_logits_path(env("K3_LOGITS"));
  return o;
}

absl::StatusOr<v1::ModelOptions> ModelOptionsFromEnv() {
  return ModelOptionsFromEnv([](const char* name) { return std::getenv(name); });
}

}  // namespace coli::host
