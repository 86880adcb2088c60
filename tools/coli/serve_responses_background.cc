// Background responses of `coli serve`: bounded, cancellable, joined at shutdown (see the
// header).
#include "tools/coli/serve_responses_background.h"

#include <utility>

namespace coli::cli::serve {

bool BackgroundJobs::Job::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

void BackgroundJobs::Job::OnCancel(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  hook_ = std::move(hook);
  if (cancelled_ && hook_) hook_();  // cancelled before the work could be stopped
}

void BackgroundJobs::Job::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return;
  cancelled_ = true;
  if (hook_) hook_();
}

void BackgroundJobs::ReapLocked(std::vector<std::thread>* to_join) {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->second.done && it->second.thread.joinable()) {
      to_join->push_back(std::move(it->second.thread));
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
}

bool BackgroundJobs::Start(const std::string& id, std::function<void(Job&)> fn) {
  std::vector<std::thread> to_join;
  bool started = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!shutting_down_) ReapLocked(&to_join);
    size_t running = 0;
    for (const auto& [name, entry] : jobs_) running += entry.done ? 0 : 1;
    if (!shutting_down_ && running < max_jobs_ && jobs_.find(id) == jobs_.end()) {
      auto job = std::make_shared<Job>();
      Entry& entry = jobs_[id];
      entry.job = job;
      entry.thread = std::thread([this, id, job, fn = std::move(fn)] {
        fn(*job);
        {
          std::lock_guard<std::mutex> lock(mu_);
          jobs_.find(id)->second.done = true;  // the entry lives until this thread is joined
        }
        finished_.notify_all();
      });
      started = true;
    }
  }
  for (std::thread& t : to_join) t.join();  // finished: returns at once
  return started;
}

bool BackgroundJobs::CancelAndWait(const std::string& id) {
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end() || it->second.done) return false;
    job = it->second.job;
  }
  job->Cancel();
  std::unique_lock<std::mutex> lock(mu_);
  finished_.wait(lock, [&] {
    auto it = jobs_.find(id);
    return it == jobs_.end() || it->second.done;
  });
  return true;
}

bool BackgroundJobs::Running(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  return it != jobs_.end() && !it->second.done;
}

size_t BackgroundJobs::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [name, entry] : jobs_) n += entry.done ? 0 : 1;
  return n;
}

void BackgroundJobs::Shutdown() {
  std::vector<std::shared_ptr<Job>> to_cancel;
  std::vector<std::thread> to_join;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
    for (auto& [name, entry] : jobs_) {
      to_cancel.push_back(entry.job);
      if (entry.thread.joinable()) to_join.push_back(std::move(entry.thread));
    }
  }
  for (const auto& job : to_cancel) job->Cancel();
  for (std::thread& t : to_join) t.join();
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.clear();  // every thread has set its done flag and returned
}

}  // namespace coli::cli::serve
