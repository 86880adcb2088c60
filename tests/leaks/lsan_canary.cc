// Loses one allocation on purpose: tests/leaks/leak_check.py runs it first and requires
// LeakSanitizer to report it, so a leak check that is not active cannot pass.
#include <cstdlib>
#include <cstring>

namespace {

void* volatile lost;

// Out of line, and its stack scrubbed afterwards: a stale copy of the pointer in a register or
// on the stack would make LeakSanitizer count the block as reachable.
[[gnu::noinline]] void LoseOneAllocation() {
  lost = std::malloc(4096);
  lost = nullptr;
}

[[gnu::noinline]] void ScrubStack() {
  volatile char scratch[4096];
  std::memset(const_cast<char*>(scratch), 0, sizeof(scratch));
}

}  // namespace

int main() {
  LoseOneAllocation();
  ScrubStack();
  return 0;
}
