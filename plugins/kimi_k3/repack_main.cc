// k3-repack: converts a Kimi K3 Hugging Face snapshot into a repacked container (repack.h,
// spec §4.4).
//
//   k3-repack <src> <dst> [--bits 8|4] [--mla-bits N] [--head-bits N] [--shards 1,2,94]
//             [--verify-full] [--threads N] [--in-flight N] [--piece-mib N] [--buffered]
//
// Progress on stderr; exit 0 on success, 1 on an error (message naming file and tensor),
// 2 on a usage error.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "plugins/kimi_k3/repack.h"

namespace {

int Usage(const std::string& why) {
  if (!why.empty()) std::cerr << "k3-repack: " << why << "\n";
  std::cerr
      << "usage: k3-repack <src> <dst> [--bits 8|4] [--mla-bits 8|4] [--head-bits 8|4]\n"
         "                 [--shards 1,2,94] [--verify-full] [--threads N] [--in-flight N]\n"
         "                 [--piece-mib N] [--buffered]\n"
         "  --bits       KDA q/k/v/o/g, latent down/up, shared experts, dense MLP (default 8)\n"
         "  --mla-bits   MLA q_a, q_b, kv_a, kv_b, o, g (default max(bits, 8))\n"
         "  --head-bits  lm_head (default max(bits, 8))\n"
         "  --shards     convert only these shard numbers (the index still covers all\n"
         "               converted shards in <dst>)\n"
         "  --verify-full  compare every expert and pass-through byte with the source\n"
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
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](int* out) { return i + 1 < argc && absl::SimpleAtoi(argv[++i], out); };
    if (a == "--bits") {
      if (!value(&o.bits)) return Usage("--bits needs 4 or 8");
    } else if (a == "--mla-bits") {
      if (!value(&o.mla_bits)) return Usage("--mla-bits needs 4 or 8");
    } else if (a == "--head-bits") {
      if (!value(&o.head_bits)) return Usage("--head-bits needs 4 or 8");
    } else if (a == "--shards") {
      if (i + 1 >= argc) return Usage("--shards needs a list like 1,2,94");
      for (absl::string_view s : absl::StrSplit(argv[++i], ',', absl::SkipEmpty())) {
        int n = 0;
        if (!absl::SimpleAtoi(s, &n) || n < 1) return Usage("--shards: bad shard number");
        o.shards.push_back(n);
      }
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
    } else if (a == "-h" || a == "--help") {
      return Usage("");
    } else if (a.rfind("--", 0) == 0) {
      return Usage("unknown option " + a);
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 2) return Usage("need <src> and <dst>");
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
