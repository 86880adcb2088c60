// BackgroundJobs (tools/coli/serve_responses_background.h): the bound, cancellation through
// the job's hook, waiting for a cancelled job, and shutdown joining jobs that would otherwise
// run forever. Jobs block on their own cancellation, never on time.
#include "tools/coli/serve_responses_background.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace coli::cli::serve {
namespace {

// A stand-in for a generation: runs until its hook (the gRPC TryCancel) fires.
struct Work {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  int started = 0;
  std::atomic<int> ended{0};
  std::atomic<int> saw_cancelled{0};

  std::function<void(BackgroundJobs::Job&)> Fn() {
    return [this](BackgroundJobs::Job& job) {
      bool local_stop = false;
      job.OnCancel([this, &local_stop] {
        std::lock_guard<std::mutex> lock(mu);
        local_stop = true;
        cv.notify_all();
      });
      {
        std::unique_lock<std::mutex> lock(mu);
        ++started;
        cv.notify_all();
        cv.wait(lock, [&] { return local_stop || stop; });
      }
      job.OnCancel(nullptr);  // `local_stop` goes away with this frame
      if (job.cancelled()) ++saw_cancelled;
      ++ended;
    };
  }
  void WaitStarted(int n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return started >= n; });
  }
};

TEST(BackgroundJobs, BoundedAndCancelledOneByOne) {
  Work work;
  BackgroundJobs jobs(2);
  ASSERT_TRUE(jobs.Start("a", work.Fn()));
  EXPECT_FALSE(jobs.Start("a", work.Fn()));  // the same id twice
  ASSERT_TRUE(jobs.Start("b", work.Fn()));
  work.WaitStarted(2);
  EXPECT_FALSE(jobs.Start("c", work.Fn()));  // full
  EXPECT_EQ(jobs.running(), 2u);
  EXPECT_TRUE(jobs.Running("a"));

  EXPECT_TRUE(jobs.CancelAndWait("a"));  // returns once the job has ended
  EXPECT_EQ(work.ended.load(), 1);
  EXPECT_EQ(work.saw_cancelled.load(), 1);
  EXPECT_FALSE(jobs.Running("a"));
  EXPECT_FALSE(jobs.CancelAndWait("a"));  // finished: nothing to cancel
  EXPECT_FALSE(jobs.CancelAndWait("nobody"));
  EXPECT_EQ(jobs.running(), 1u);
  ASSERT_TRUE(jobs.Start("c", work.Fn()));  // a slot is free again
  work.WaitStarted(3);

  // A job that ends by itself is not cancelled, and frees its slot.
  {
    std::lock_guard<std::mutex> lock(work.mu);
    work.stop = true;
    work.cv.notify_all();
  }
  jobs.Shutdown();
  EXPECT_EQ(work.ended.load(), 3);
  EXPECT_EQ(jobs.running(), 0u);
}

TEST(BackgroundJobs, ShutdownCancelsAndJoinsEveryJob) {
  Work work;
  {
    BackgroundJobs jobs(4);
    for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(jobs.Start(id, work.Fn()));
    work.WaitStarted(3);
    jobs.Shutdown();
    EXPECT_EQ(work.ended.load(), 3);
    EXPECT_EQ(work.saw_cancelled.load(), 3);
    EXPECT_FALSE(jobs.Start("d", work.Fn()));  // no new work after shutdown
    jobs.Shutdown();                           // idempotent
  }
  // The destructor shuts down too.
  Work more;
  {
    BackgroundJobs jobs(1);
    ASSERT_TRUE(jobs.Start("x", more.Fn()));
    more.WaitStarted(1);
  }
  EXPECT_EQ(more.ended.load(), 1);
}

TEST(BackgroundJobs, AHookSetAfterCancellationRunsAtOnce) {
  BackgroundJobs jobs(1);
  std::atomic<bool> hook_ran{false};
  ASSERT_TRUE(jobs.Start("late", [&](BackgroundJobs::Job& job) {
    while (!job.cancelled()) std::this_thread::yield();  // cancelled before it set a hook
    job.OnCancel([&] { hook_ran = true; });
    job.OnCancel(nullptr);
  }));
  EXPECT_TRUE(jobs.CancelAndWait("late"));
  EXPECT_TRUE(hook_ran.load());
}

}  // namespace
}  // namespace coli::cli::serve
