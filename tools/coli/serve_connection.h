// tools/coli/serve_connection: tells a `coli serve` handler whether its HTTP client is still
// there. cpp-httplib (0.11) gives a handler no way to see its socket, and a non-streaming reply
// writes nothing until the generation ends, so a client that went away was noticed only then —
// after up to a whole context of tokens. ConnectionWatch finds the handler's own TCP socket by its
// two endpoints and peeks at it without reading.
//
//   ConnectionWatch watch(req.local_port, req.remote_addr, req.remote_port);
//   ... per token: if (watch.PeerClosed()) cancel the generation;
//
// The socket is the calling thread's own connection for the duration of the handler (httplib
// closes it only after the handler returns), so the descriptor stays valid while it is used.
#ifndef COLI_TOOLS_COLI_SERVE_CONNECTION_H_
#define COLI_TOOLS_COLI_SERVE_CONNECTION_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace coli::cli::serve {

class ConnectionWatch {
 public:
  // Finds the connected TCP socket of this process whose local port is `local_port` and whose
  // peer is `remote_addr`:`remote_port` (numeric address as httplib reports it). When none is
  // found (or several match and the address does not single one out) the watch is inert:
  // PeerClosed() is always false.
  ConnectionWatch(int local_port, const std::string& remote_addr, int remote_port);

  // True once the peer has closed its end (an orderly EOF with no request bytes pending, or a
  // reset). Never blocks and never consumes input.
  bool PeerClosed() const;

  // The socket found, or -1.
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// Watches the connections of requests that wait on the host — in its queue, in a long prefill, or
// generating a non-streaming reply — and runs a request's cancel function once its client has
// gone. One thread polls every watched connection every `period`.
//
//   ConnectionMonitor monitor;
//   auto guard = monitor.Watch(watch, [ctx] { ctx->TryCancel(); });
//   ... the host call; `guard` going away ends the watch (the cancel function is never called
//   after that) ...
class ConnectionMonitor {
 public:
  explicit ConnectionMonitor(std::chrono::milliseconds period = std::chrono::milliseconds(100));
  ~ConnectionMonitor();  // stops and joins the thread
  ConnectionMonitor(const ConnectionMonitor&) = delete;
  ConnectionMonitor& operator=(const ConnectionMonitor&) = delete;

  // Ends its watch when destroyed (waiting for a cancel function that is running).
  class Guard {
   public:
    Guard() = default;
    Guard(Guard&& other) noexcept : monitor_(other.monitor_), id_(other.id_) {
      other.monitor_ = nullptr;
    }
    Guard& operator=(Guard&& other) noexcept;
    ~Guard();

   private:
    friend class ConnectionMonitor;
    Guard(ConnectionMonitor* monitor, uint64_t id) : monitor_(monitor), id_(id) {}
    ConnectionMonitor* monitor_ = nullptr;
    uint64_t id_ = 0;
  };

  // Calls `cancel` (on the monitor's thread, at most once) when `watch` sees its peer gone. An
  // inert watch (fd -1) is not registered.
  [[nodiscard]] Guard Watch(const ConnectionWatch& watch, std::function<void()> cancel);
  // The server stops: calls every watched cancel function now (a request still queued in the
  // host or reading a long prompt would otherwise hold the stop until its first token), and
  // from then on Watch calls its `cancel` at once.
  void CancelAll();
  // Connections watched now (tests).
  size_t watched() const;

 private:
  struct Entry {
    ConnectionWatch watch;
    std::function<void()> cancel;
  };
  void Unwatch(uint64_t id);
  void Run();

  const std::chrono::milliseconds period_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::map<uint64_t, Entry> entries_;
  uint64_t next_id_ = 1;
  bool stop_ = false;
  bool cancelled_all_ = false;  // CancelAll was called
  std::thread thread_;
};

}  // namespace coli::cli::serve

#endif  // COLI_TOOLS_COLI_SERVE_CONNECTION_H_
