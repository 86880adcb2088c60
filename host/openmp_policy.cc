#include "host/openmp_policy.h"

#include <dlfcn.h>

#include <cstdlib>

namespace coli::host {

std::optional<std::string> GompSpinCountToSet(const char* omp_wait_policy,
                                              const char* gomp_spincount) {
  const auto set = [](const char* value) { return value != nullptr && *value != '\0'; };
  if (set(omp_wait_policy) || set(gomp_spincount)) return std::nullopt;
  return kDefaultGompSpinCount;
}

bool SetOpenMpSpinDefault() {
  // RTLD_NOLOAD: a handle only if libgomp is already in the process (then it has read its
  // environment); nothing is loaded.
  if (void* gomp = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD); gomp != nullptr) {
    dlclose(gomp);
    return false;
  }
  if (const std::optional<std::string> value =
          GompSpinCountToSet(std::getenv("OMP_WAIT_POLICY"), std::getenv("GOMP_SPINCOUNT"))) {
    setenv("GOMP_SPINCOUNT", value->c_str(), /*overwrite=*/1);
  }
  return true;
}

}  // namespace coli::host
