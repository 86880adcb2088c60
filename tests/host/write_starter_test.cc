// host::WriteStarter: posted calls run in posting order on one thread that is not the poster's,
// whether they come one at a time (the thread sleeps or spins in between) or in a burst, and the
// destructor runs what is still queued.
#include "host/write_starter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace coli::host {
namespace {

struct Record {
  std::mutex mu;
  std::vector<int> order;
  std::set<std::thread::id> threads;
  void Add(int i) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(i);
    threads.insert(std::this_thread::get_id());
  }
};

std::vector<int> Iota(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(WriteStarter, RunsPostsInOrderOnItsOwnThread) {
  Record record;
  {
    WriteStarter starter;
    for (int i = 0; i < 200; ++i) {
      starter.Post([&record, i] { record.Add(i); });
      // Gaps below, inside and above the spin window: spun-for, slept-for and burst posts.
      if (i % 50 == 10) std::this_thread::sleep_for(std::chrono::microseconds(300));
      if (i % 50 == 20) std::this_thread::sleep_for(WriteStarter::kMaxSpin * 3);
    }
  }  // the destructor runs what is left
  EXPECT_EQ(record.order, Iota(200));
  ASSERT_EQ(record.threads.size(), 1u);
  EXPECT_NE(*record.threads.begin(), std::this_thread::get_id());
}

TEST(WriteStarter, PostsFromManyThreadsAllRun) {
  Record record;
  {
    WriteStarter starter;
    std::vector<std::thread> posters;
    for (int t = 0; t < 4; ++t) {
      posters.emplace_back([&starter, &record, t] {
        for (int i = 0; i < 100; ++i) starter.Post([&record, t, i] { record.Add(t * 100 + i); });
      });
    }
    for (auto& p : posters) p.join();
  }
  std::vector<int> sorted = record.order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, Iota(400));
  // Each poster's own posts keep their order.
  for (int t = 0; t < 4; ++t) {
    int last = -1;
    for (int v : record.order) {
      if (v / 100 != t) continue;
      EXPECT_GT(v, last);
      last = v;
    }
  }
}

}  // namespace
}  // namespace coli::host
