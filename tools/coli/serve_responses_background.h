// tools/coli/serve_responses_background: the background responses of `coli serve`
// (`background: true` on POST /v1/responses) — a bounded set of jobs, each on its own thread,
// that can be cancelled one by one (POST /v1/responses/{id}/cancel) and are all cancelled and
// joined when the server stops. Knows nothing of gRPC or HTTP: a job registers how to stop
// its work (e.g. grpc::ClientContext::TryCancel) with OnCancel.
//
//   BackgroundJobs jobs(/*max_jobs=*/16);
//   if (!jobs.Start(id, [&](BackgroundJobs::Job& job) {
//         job.OnCancel([&] { ctx.TryCancel(); });
//         ... generate; job.cancelled() says whether to record "cancelled" ...
//         job.OnCancel(nullptr);   // before ctx goes away
//       })) reply 429;
//   jobs.CancelAndWait(id);       // true: the job has returned
//   jobs.Shutdown();              // cancels every job and joins every thread
#ifndef COLI_TOOLS_COLI_SERVE_RESPONSES_BACKGROUND_H_
#define COLI_TOOLS_COLI_SERVE_RESPONSES_BACKGROUND_H_

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace coli::cli::serve {

class BackgroundJobs {
 public:
  // One job's cancellation state. Thread-safe.
  class Job {
   public:
    bool cancelled() const;
    // Sets how to stop the job's work (called at most once, by Cancel, under this job's lock);
    // if the job is already cancelled it runs now. nullptr removes it: after OnCancel(nullptr)
    // returns, the old hook is not running and never will.
    void OnCancel(std::function<void()> hook);

   private:
    friend class BackgroundJobs;
    void Cancel();
    mutable std::mutex mu_;
    bool cancelled_ = false;
    std::function<void()> hook_;
  };

  explicit BackgroundJobs(size_t max_jobs) : max_jobs_(max_jobs) {}
  ~BackgroundJobs() { Shutdown(); }
  BackgroundJobs(const BackgroundJobs&) = delete;
  BackgroundJobs& operator=(const BackgroundJobs&) = delete;

  // Runs fn(job) on a new thread under `id`. False, running nothing, when max_jobs jobs are
  // running, `id` is already running, or Shutdown has begun.
  bool Start(const std::string& id, std::function<void(Job&)> fn);
  // Cancels the running job `id` and waits until fn has returned. False when no job `id` runs.
  bool CancelAndWait(const std::string& id);
  bool Running(const std::string& id) const;
  size_t running() const;
  size_t max_jobs() const { return max_jobs_; }
  // Cancels every job and joins every thread; later Starts fail. Idempotent.
  void Shutdown();

 private:
  struct Entry {
    std::shared_ptr<Job> job;
    std::thread thread;
    bool done = false;  // fn has returned
  };
  // Joins the threads of jobs that have finished (called with mu_ held).
  void ReapLocked(std::vector<std::thread>* to_join);

  const size_t max_jobs_;
  mutable std::mutex mu_;
  std::condition_variable finished_;
  bool shutting_down_ = false;
  std::map<std::string, Entry> jobs_;  // running, and finished but not yet joined
};

}  // namespace coli::cli::serve

#endif  // COLI_TOOLS_COLI_SERVE_RESPONSES_BACKGROUND_H_
