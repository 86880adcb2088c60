#include "plugins/kimi_k3/prefix_cache_tag.h"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/io.h"
#include "common/kernels/kernels.h"
#include "common/status/status.h"
#include "plugins/kimi_k3/checkpoints.h"

namespace coli::k3 {
namespace {

// The file this code was loaded from: the plugin's shared library, or the executable that
// links the engine in (tests, k3-run).
std::string OwnBinary() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&PrefixCacheSwitches), &info) != 0 &&
      info.dli_fname != nullptr && info.dli_fname[0] == '/') {
    return info.dli_fname;
  }
  return "/proc/self/exe";
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
  return absl::StrCat("bits ", o.bits, " mla_bits ", o.mla_bits, " head_bits ", o.head_bits,
                      " idot ", o.idot, " topp ", o.topp, " layers ", o.layers, " mla_eps ",
                      o.mla_latent_norm_eps, " mmap ", o.mmap, " vulkan ", o.vulkan, " vk_dense ",
                      o.vk_dense, " vk_tier ", o.vk_tier, " isa ",
                      kernels::IsaName(kernels::ActiveIsa()), "\n");
}

absl::StatusOr<std::string> PrefixCacheTag(const std::string& model_dir,
                                           const ModelOptions& options) {
  const std::string binary = OwnBinary();
  COLI_ASSIGN_OR_RETURN(std::unique_ptr<io::MappedFile> code, io::MappedFile::Map(binary));
  std::string described = absl::StrCat(
      "coli-k3-prefix-tag 1\nbinary ",
      StableHash64(std::string_view(reinterpret_cast<const char*>(code->data()), code->size())),
      "\n", PrefixCacheSwitches(options));
  COLI_ASSIGN_OR_RETURN(std::string folder, DescribeFolder(model_dir));
  described += folder;
  for (const std::string& dir : options.extra_dirs) {
    COLI_ASSIGN_OR_RETURN(std::string extra, DescribeFolder(dir));
    described += extra;
  }
  return absl::StrCat(absl::Hex(StableHash64(described), absl::kZeroPad16));
}

}  // namespace coli::k3
