#include "plugins/kimi_k3/prefix_cache_tag.h"

#include <link.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernels/kernels.h"
#include "common/status/status.h"
#include "plugins/kimi_k3/checkpoints.h"

namespace coli::k3 {
namespace {

// A hash of the code that is running: the read-only segments (code and constants; relocations
// live in the writable ones) of the loaded object holding this function — the plugin's shared
// library, or the executable that links the engine in (tests, k3-run). The memory, not the file
// on disk: a relative plugin path, or a library replaced under a running host, cannot make it
// describe other code.
struct CodeHash {
  uint64_t hash = 0;
  bool found = false;
};

int HashOwnObject(dl_phdr_info* info, size_t, void* data) {
  auto* out = static_cast<CodeHash*>(data);
  const auto here = reinterpret_cast<uintptr_t>(&PrefixCacheSwitches);
  bool mine = false;
  for (int i = 0; i < info->dlpi_phnum && !mine; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t begin = info->dlpi_addr + ph.p_vaddr;
    mine = ph.p_type == PT_LOAD && here >= begin && here < begin + ph.p_memsz;
  }
  if (!mine) return 0;
  std::string digests;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_W) != 0) continue;
    const char* begin = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    absl::StrAppend(&digests, StableHash64(std::string_view(begin, ph.p_memsz)), " ");
  }
  out->hash = StableHash64(digests);
  out->found = true;
  return 1;
}

// "name size mtime_ns\n" for each weight / config file of `dir`, sorted by name.
absl::StatusOr<std::string> DescribeFolder(const std::string& dir) {
  std::vector<std::string> lines;
  std::error_code ec;
  for (const std::filesystem::directory_entry& f : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    if (!name.ends_with(".safetensors") && !name.ends_with(".json")) continue;
    std::error_code fec;
    const uintmax_t size = f.file_size(fec);
    const auto written = f.last_write_time(fec);
    if (fec) {
      return absl::FailedPreconditionError(
          absl::StrCat("prefix cache tag: cannot stat ", f.path().string(), ": ", fec.message()));
    }
    lines.push_back(absl::StrCat(name, " ", size, " ", written.time_since_epoch().count(), "\n"));
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("prefix cache tag: cannot list ", dir, ": ", ec.message()));
  }
  std::sort(lines.begin(), lines.end());
  std::string out = absl::StrCat("folder ", dir, "\n");
  for (const std::string& line : lines) out += line;
  return out;
}

}  // namespace

std::string PrefixCacheSwitches(const ModelOptions& o) {
  // Floats by their bits: StrCat's six digits would make near values one switch.
  return absl::StrCat("bits ", o.bits, " mla_bits ", o.mla_bits, " head_bits ", o.head_bits,
                      " idot ", o.idot, " topp ", std::bit_cast<uint64_t>(o.topp), " layers ",
                      o.layers, " mla_eps ", std::bit_cast<uint32_t>(o.mla_latent_norm_eps),
                      " mmap ", o.mmap, " vulkan ", o.vulkan, " vk_dense ", o.vk_dense,
                      " vk_tier ", o.vk_tier, " isa ", kernels::IsaName(kernels::ActiveIsa()),
                      "\n");
}

absl::StatusOr<std::string> PrefixCacheTag(const std::string& model_dir,
                                           const ModelOptions& options) {
  CodeHash code;
  dl_iterate_phdr(HashOwnObject, &code);
  if (!code.found) {
    return absl::FailedPreconditionError("prefix cache tag: the engine's own code was not found");
  }
  std::string described = absl::StrCat("coli-k3-prefix-tag 2\ncode ", code.hash, "\n",
                                       PrefixCacheSwitches(options));
  COLI_ASSIGN_OR_RETURN(std::string folder, DescribeFolder(model_dir));
  described += folder;
  for (const std::string& dir : options.extra_dirs) {
    COLI_ASSIGN_OR_RETURN(std::string extra, DescribeFolder(dir));
    described += extra;
  }
  return absl::StrCat(absl::Hex(StableHash64(described), absl::kZeroPad16));
}

}  // namespace coli::k3
