// host/openmp_policy: the OpenMP wait policy coli-host gives the plugins' compute threads.
//
// libgomp's default lets an idle team thread spin (GOMP_SPINCOUNT, 300000 pauses: ~10-20 ms on
// this project's machines) before it sleeps. On a machine whose cores are all busy (a compile in
// the background, other jobs) every parallel region then waits for a thread the scheduler has
// put at the back of the queue, because it spent its share spinning: an empty 2-thread region
// costs ~10 ms instead of ~10 µs, and the tiny fixture's decode drops from ~500 to ~15 tokens/s
// (docs/status/threads.md). Passive threads sleep at once and are woken by the kernel.
//
//   int main(int argc, char** argv) {
//     coli::host::SetOpenMpWaitPolicyDefault();  // before any plugin (and libgomp) loads
//
// libgomp reads OMP_WAIT_POLICY / GOMP_SPINCOUNT once, when it is loaded. coli-host does not
// link it; it arrives with the first plugin (dlopen), so setting the variable at the top of
// main() takes effect. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is left alone.
#ifndef COLI_HOST_OPENMP_POLICY_H_
#define COLI_HOST_OPENMP_POLICY_H_

#include <optional>
#include <string>

namespace coli::host {

// The OMP_WAIT_POLICY value coli-host sets given the user's OMP_WAIT_POLICY and GOMP_SPINCOUNT
// (null or empty when unset): "passive" when neither is set, nullopt (leave the environment as
// it is) when either is.
std::optional<std::string> OpenMpWaitPolicyToSet(const char* omp_wait_policy,
                                                 const char* gomp_spincount);

// Applies OpenMpWaitPolicyToSet to this process' environment. Returns false when libgomp is already
// loaded in this process (the setting can no longer take effect), true otherwise. Call once, before
// any plugin is loaded and before other threads start (setenv).
bool SetOpenMpWaitPolicyDefault();

}  // namespace coli::host

#endif  // COLI_HOST_OPENMP_POLICY_H_
