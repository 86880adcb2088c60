// k3-repack: converts a Kimi K3 Hugging Face snapshot into a repacked container (repack.h,
// spec §4.4).
//
//   k3-repack <src> <dst> [--bits 8|4] [--mla-bits N] [--head-bits N] [--shards 1,2,94]
//             [--verify-full] [--threads N] [--in-flight N] [--piece-mib N] [--buffered]
//   k3-repack --check <dst> [--threads N]    (each tensor against the CRC-32 written with it)
//
// Progress on stderr; exit 0 on success, 1 on an error (message naming file and tensor),
// 2 on a usage error.
#include <sys/stat.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "plugins/kimi_k3/repack.h"

namespace {

int Usage(const std::string& why, std::ostream& out = std::cerr) {
  if (!why.empty()) std::cerr << "k3-repack: " << why << "\n";
  out << "usage: k3-repack <src> <dst> [--bits 8|4] [--mla-bits 8|4] [--head-bits 8|4]\n"
         "                 [--shards 1,2,94] [--verify-full] [--threads N] [--in-flight N]\n"
         "                 [--piece-mib N] [--buffered]\n"
         "       k3-repack --check <dst> [--threads N]\n"
         "  --check      read every shard of a container and compare each tensor with the\n"
         "               CRC-32 recorded when it was written (no source needed)\n"
         "  --bits       KDA q/k/v/o/g, latent down/up, shared experts, dense MLP (default 8)\n"
         "  --mla-bits   MLA q_a, q_b, kv_a, kv_b, o, g (default max(bits, 8))\n"
         "  --head-bits  lm_head (default max(bits, 8))\n"
         "  --shards     convert only these shard numbers (the index still covers all\n"
         "               converted shards in <dst>)\n"
         "  --verify-full  compare every byte with the source (experts and pass-through as\n"
         "               they are, matrices quantized again)\n"
         "  --threads    quantization threads (default: one per hardware thread)\n"
         "  --in-flight  pieces between reading, quantizing and writing (default 3;\n"
         "               1 = the three stages never overlap); the bytes do not depend on it\n"
         "  --piece-mib  piece size in MiB (default 32; peak memory ~ in-flight x 1.5 x piece)\n"
         "  --buffered   read the source through the page cache (default: O_DIRECT)\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  coli::k3::RepackOptions o;
  bool check = false;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    // `--flag=value` as well as `--flag value`.
    std::optional<std::string> inline_value;
    if (a.rfind("--", 0) == 0 && a.find('=') != std::string::npos) {
      inline_value = a.substr(a.find('=') + 1);
      a.resize(a.find('='));
    }
    auto text = [&]() -> std::optional<std::string> {
      if (inline_value.has_value()) return inline_value;
      if (i + 1 < argc) return std::string(argv[++i]);
      return std::nullopt;
    };
    auto value = [&](int* out) {
      std::optional<std::string> v = text();
      return v.has_value() && absl::SimpleAtoi(*v, out);
    };
    const bool is_switch = a == "--buffered" || a == "--verify-full" || a == "--check" ||
                           a == "-h" || a == "--help";
    if (is_switch && inline_value.has_value()) return Usage(a + " takes no value");
    if (a == "--bits") {
      if (!value(&o.bits)) return Usage("--bits needs 4 or 8");
    } else if (a == "--mla-bits") {
      if (!value(&o.mla_bits)) return Usage("--mla-bits needs 4 or 8");
    } else if (a == "--head-bits") {
      if (!value(&o.head_bits)) return Usage("--head-bits needs 4 or 8");
    } else if (a == "--shards") {
      std::optional<std::string> list = text();
      if (!list.has_value()) return Usage("--shards needs a list like 1,2,94");
      for (absl::string_view s : absl::StrSplit(*list, ',', absl::SkipEmpty())) {
        int n = 0;
        if (!absl::SimpleAtoi(s, &n) || n < 1) {
          return Usage("--shards: '" + std::string(s) + "' is not a shard number (1, 2, ...)");
        }
        o.shards.push_back(n);
      }
      if (o.shards.empty()) return Usage("--shards '" + *list + "' lists no shard");
    } else if (a == "--threads") {
      if (!value(&o.threads) || o.threads < 1) return Usage("--threads needs a count >= 1");
    } else if (a == "--in-flight") {
      if (!value(&o.in_flight) || o.in_flight < 1) return Usage("--in-flight needs a count >= 1");
    } else if (a == "--piece-mib") {
      int mib = 0;
      if (!value(&mib) || mib < 1 || mib > 4096) return Usage("--piece-mib needs 1..4096");
      o.piece_bytes = static_cast<uint64_t>(mib) << 20;
    } else if (a == "--buffered") {
      o.direct = false;
    } else if (a == "--verify-full") {
      o.verify_full = true;
    } else if (a == "--check") {
      check = true;
    } else if (a == "-h" || a == "--help") {
      Usage("", std::cout);
      return 0;
    } else if (a.size() > 1 && a[0] == '-') {
      return Usage("unknown option " + a);
    } else {
      positional.push_back(a);
    }
  }
  if (check) {
    if (positional.size() != 1) {
      return Usage("--check needs one container folder, got " + std::to_string(positional.size()) +
                   " names");
    }
    auto checked = coli::k3::CheckContainer(
        positional[0], o.threads, [](std::string_view line) { std::cerr << line << "\n"; });
    if (!checked.ok()) {
      std::cerr << "k3-repack: " << checked.status() << "\n";
      return 1;
    }
    std::cerr << "k3-repack: " << checked->shards << " shard(s) intact, " << checked->bytes
              << " tensor bytes checked\n";
    return 0;
  }
  if (positional.size() != 2) {
    return Usage("need <src> and <dst>, got " + std::to_string(positional.size()) +
                 " names");
  }
  struct stat st;
  if (::stat(positional[0].c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::cerr << "k3-repack: source '" << positional[0] << "' is not a folder (a Hugging Face "
              << "snapshot: config.json + model-*.safetensors)\n";
    return 1;
  }
  if (::stat(positional[1].c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    std::cerr << "k3-repack: destination '" << positional[1] << "' is a file, not a folder\n";
    return 1;
  }
  o.progress = [](std::string_view line) { std::cerr << line << "\n"; };
  auto summary = coli::k3::Repack(positional[0], positional[1], o);
  if (!summary.ok()) {
    std::cerr << "k3-repack: " << summary.status() << "\n";
    return 1;
  }
  std::cerr << "k3-repack: " << summary->written << " written, " << summary->existing
            << " already there, " << summary->missing_source << " source missing, "
            << summary->dropped << " dropped (vision), " << summary->verified << " verified\n";
  if (summary->written > 0) {
    char line[256];
    std::snprintf(line, sizeof(line),
                  "k3-repack: %.1f MB read; stages busy: read %.2f s, quantize %.2f s, write "
                  "%.2f s (overlapping), then fsync + rename %.2f s\n",
                  summary->read_bytes / 1e6, summary->read_seconds, summary->quantize_seconds,
                  summary->write_seconds, summary->finish_seconds);
    std::cerr << line;
  }
  return 0;
}
