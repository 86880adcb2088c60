#include "host/write_starter.h"

#include <sched.h>

#include <algorithm>
#include <utility>

namespace coli::host {

WriteStarter::WriteStarter() : thread_([this] { Loop(); }) {}

WriteStarter::~WriteStarter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void WriteStarter::Post(std::function<void()> fn) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
    posts_.fetch_add(1, std::memory_order_release);
    wake = idle_;
  }
  if (wake) cv_.notify_one();
}

bool WriteStarter::SpinForPost(uint64_t seen, Clock::time_point last_post, Clock::duration gap) {
  // Wait up to twice the last gap (a token's time varies), never past kMaxSpin after the post.
  const Clock::time_point until = last_post + std::min<Clock::duration>(2 * gap, kMaxSpin);
  while (Clock::now() < until) {
    sched_yield();  // a woken compute thread on this core runs at once
    if (posts_.load(std::memory_order_acquire) != seen) return true;
  }
  return false;
}

void WriteStarter::Loop() {
  Clock::time_point last_post = Clock::now();
  Clock::duration gap = Clock::duration::max();
  uint64_t last_count = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (queue_.empty()) {
      if (stop_) return;
      if (gap < kMaxSpin) {
        const uint64_t seen = posts_.load(std::memory_order_relaxed);  // counted under mu_
        lock.unlock();
        const bool arrived = SpinForPost(seen, last_post, gap);
        lock.lock();
        if (arrived) continue;
      }
      if (!queue_.empty() || stop_) continue;
      idle_ = true;
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      idle_ = false;
      continue;
    }
    // Posts are timed as they are taken: a burst (several queued) counts as one.
    const uint64_t count = posts_.load(std::memory_order_acquire);
    if (count != last_count) {
      const Clock::time_point now = Clock::now();
      gap = now - last_post;
      last_post = now;
      last_count = count;
    }
    std::function<void()> fn = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
}

}  // namespace coli::host
