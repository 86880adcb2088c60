// host/write_starter: one thread that starts gRPC stream writes on behalf of the engine's
// generation threads.
//
// A write started on the generation thread runs gRPC's send path (serialisation, the socket
// write, waking gRPC's threads) there, between two decode steps. Posted here instead, the send of
// token N overlaps the compute of token N+1 on another core. When posts come closer together than
// kMaxSpin (a small model's tokens), the thread waits for the next one spinning rather than
// sleeping (yielding its core to any thread that wants it), so the generation thread does not pay
// for a wake-up (on this 2-core VM: tiny-model tokens through gRPC 0.93 -> 0.94-0.99 of the
// in-process rate, one compute thread); when posts are far apart (a real model's tokens), it
// sleeps at once and costs nothing between tokens.
//
//   WriteStarter starter;
//   starter.Post([reactor] { reactor->StartWrite(&event); });  // runs on the starter's thread
#ifndef COLI_HOST_WRITE_STARTER_H_
#define COLI_HOST_WRITE_STARTER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace coli::host {

class WriteStarter {
 public:
  // The longest wait for the next post that is spent spinning.
  static constexpr std::chrono::microseconds kMaxSpin{2000};

  WriteStarter();
  ~WriteStarter();  // runs what is still queued, then joins
  WriteStarter(const WriteStarter&) = delete;
  WriteStarter& operator=(const WriteStarter&) = delete;

  // Runs `fn` on the starter's thread, in posting order.
  void Post(std::function<void()> fn);

 private:
  using Clock = std::chrono::steady_clock;
  void Loop();
  // Spins while the next post is expected soon; true if one arrived.
  bool SpinForPost(uint64_t seen, Clock::time_point last_post, Clock::duration gap);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::atomic<uint64_t> posts_{0};  // incremented under mu_, read without it while spinning
  bool stop_ = false;
  bool idle_ = false;  // the thread is waiting on cv_: only then does Post need to wake it
  std::thread thread_;
};

}  // namespace coli::host

#endif  // COLI_HOST_WRITE_STARTER_H_
