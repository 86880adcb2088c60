#include "host/openmp_policy.h"

#include <dlfcn.h>

#include <cstdlib>

namespace coli::host {

std::optional<std::string> OpenMpWaitPolicyToSet(const char* omp_wait_policy,
                                                 const char* gomp_spincount) {
  const auto set = [](const char* value) { return value != nullptr && *value != '\0'; };
  if (set(omp_wait_policy) || set(gomp_spincount)) return std::nullopt;
  return "passive";
}

bool SetOpenMpWaitPolicyDefault() {
  // RTLD_NOLOAD: a handle only if libgomp is already in the process (then it has read its
  // environment); nothing is loaded.
  if (void* gomp = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD); gomp != nullptr) {
    dlclose(gomp);
    return false;
  }
  if (const std::optional<std::string> value =
          OpenMpWaitPolicyToSet(std::getenv("OMP_WAIT_POLICY"), std::getenv("GOMP_SPINCOUNT"))) {
    setenv("OMP_WAIT_POLICY", value->c_str(), /*overwrite=*/1);
  }
  return true;
}

}  // namespace coli::host
