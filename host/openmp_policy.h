// host/openmp_policy: how long the plugins' idle OpenMP threads spin before they sleep.
//
// libgomp's default lets an idle team thread spin 300000 times (GOMP_SPINCOUNT; ~6 ms on this
// project's 2-core VM, ~20 ns a pause) before it sleeps. When every core is busy (a compile in
// the background, other jobs) each parallel region then waits for a thread the scheduler has put
// at the back of its queue for spinning: an empty 2-thread region took ~8-12 ms instead of
// ~3 µs, K3's KDA decode step 14-27 ms instead of ~0.1-0.3 ms, and the tiny fixture decoded at
// ~14 tokens/s instead of ~300 (docs/status/threads.md). Threads that sleep at once
// (OMP_WAIT_POLICY=passive) do not collapse, but every region then pays a wake-up (~20-70 µs on
// the VM): back-to-back K3-shaped regions ran 2x slower on a quiet machine. A short spin keeps
// back-to-back regions hot and bounds what a busy machine costs:
//
//   int main(int argc, char** argv) {
//     coli::host::SetOpenMpSpinDefault();  // before any plugin (and libgomp) loads
//
// libgomp reads OMP_WAIT_POLICY / GOMP_SPINCOUNT once, when it is loaded. coli-host does not
// link it; it arrives with the first plugin (dlopen), so setting the variable at the top of
// main() takes effect. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is left alone.
#ifndef COLI_HOST_OPENMP_POLICY_H_
#define COLI_HOST_OPENMP_POLICY_H_

#include <optional>
#include <string>

namespace coli::host {

// libgomp's own spin count for a team with more threads than CPUs (~20 µs here).
inline constexpr char kDefaultGompSpinCount[] = "1000";

// The GOMP_SPINCOUNT value coli-host sets given the user's OMP_WAIT_POLICY and GOMP_SPINCOUNT
// (null or empty when unset): kDefaultGompSpinCount when neither is set, nullopt (leave the
// environment as it is) when either is.
std::optional<std::string> GompSpinCountToSet(const char* omp_wait_policy,
                                              const char* gomp_spincount);

// Applies GompSpinCountToSet to this process' environment. Returns false when libgomp is
// already loaded in this process (the setting can no longer take effect), true otherwise. Call
// once, before any plugin is loaded and before other threads start (setenv).
bool SetOpenMpSpinDefault();

}  // namespace coli::host

#endif  // COLI_HOST_OPENMP_POLICY_H_
