// plugins/kimi_k3/prefix_cache_tag: what names a prefix cache kept across restarts
// (COLI_K3_PREFIX_CACHE_KEEP=1; prefix_cache.h).
//
// A kept entry may be restored only by a process whose forward pass would have computed the very
// same state, so its file is named by a hash of everything that state depends on: the code of
// the loaded object holding the engine (its read-only segments as mapped in memory, whatever
// path it was loaded by: any rebuild that changes the math changes them), each weight and config
// file of the model folder and of K3_DIRS (name, size, modification time: a replaced shard
// changes them; the files are not read, which would take hours on K3), the kernels' ISA (float
// paths sum in another order), and every switch that changes values (K3_BITS, K3_MLA_BITS,
// K3_HEAD_BITS, K3_IDOT, K3_TOPP, K3_LAYERS, K3_MLA_NORM_EPS, K3_MMAP, the Vulkan switches).
// Thread count and chunk size are not in it: results do not depend on them (session.h).
// Conservative by design: a changed tag costs one prefill, a wrong match would be a silently
// wrong answer.
#ifndef COLI_PLUGINS_KIMI_K3_PREFIX_CACHE_TAG_H_
#define COLI_PLUGINS_KIMI_K3_PREFIX_CACHE_TAG_H_

#include <string>

#include "absl/status/statusor.h"
#include "plugins/kimi_k3/options.h"

namespace coli::k3 {

// 16 lowercase hex digits. An error (a folder cannot be read) means: do not keep.
absl::StatusOr<std::string> PrefixCacheTag(const std::string& model_dir,
                                           const ModelOptions& options);

// The part of the tag that comes from the switches alone (tests compare it across options).
std::string PrefixCacheSwitches(const ModelOptions& options);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_PREFIX_CACHE_TAG_H_
