// tools/coli/serve_responses_stream: the kept event stream of a background response of
// `coli serve` (`background: true, stream: true` on POST /v1/responses), so that the POST's own
// stream and any number of resumed ones (GET /v1/responses/{id}?stream=true&starting_after=N)
// read the same events, with the same sequence numbers, whether they arrive live or replayed.
// Knows nothing of HTTP: the gateway writes the frames it reads to its sockets.
//
//   auto log = std::make_shared<ResponseEventLog>();
//   // the background job (one writer):
//   log->Append(0, "event: response.created\ndata: {...}\n\n");
//   ...
//   log->Close();                       // the response has ended (completed, failed, cancelled)
//   // each stream (any number of readers, any thread):
//   int64_t cursor = -1;                // = starting_after; -1: from the first event
//   std::vector<std::string> frames;
//   while (log->Next(&cursor, &frames) == ResponseEventLog::Read::kEvents) {
//     write(frames); frames.clear();
//   }
//
// Bounded: a log keeps at most `max_bytes` of frames (default 8 MiB); past it the oldest events
// are dropped (the newest is always kept). A reader that needs a dropped event gets kDropped.
#ifndef COLI_TOOLS_COLI_SERVE_RESPONSES_STREAM_H_
#define COLI_TOOLS_COLI_SERVE_RESPONSES_STREAM_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace coli::cli::serve {

class ResponseEventLog {
 public:
  static constexpr size_t kDefaultMaxBytes = size_t{8} << 20;

  explicit ResponseEventLog(size_t max_bytes = kDefaultMaxBytes) : max_bytes_(max_bytes) {}

  // Appends the event with sequence number `sequence` (0, 1, 2, ... in order: the writer's
  // ResponseBuilder numbers them) as its SSE frame, wakes the readers, and drops the oldest
  // events while more than max_bytes are kept. Ignored after Close.
  void Append(int64_t sequence, std::string frame);
  // No event will follow: readers that have read everything get kEnd. Idempotent.
  void Close();

  enum class Read {
    kEvents,   // *out got the frames after *cursor; *cursor is the last one's sequence number
    kEnd,      // the log is closed and everything after *cursor was read
    kDropped,  // the event after *cursor is no longer kept (max_bytes)
    kWaiting,  // (with a max_wait) nothing after *cursor came within it; the log is still open
  };
  // Waits until there is an event after *cursor or the log is closed, then appends the frames
  // of every kept event after *cursor to *out. Blocks only while the log is open.
  Read Next(int64_t* cursor, std::vector<std::string>* out) const;
  // The same, but returns kWaiting after `max_wait` without an event, so that a reader can see
  // whether its client is still there: a response waiting in the host's queue or in a long
  // prefill sends nothing for that long.
  Read Next(int64_t* cursor, std::vector<std::string>* out,
            std::chrono::milliseconds max_wait) const;

  bool closed() const;
  // The sequence number of the oldest kept event (0 until one is dropped), and the one the
  // next event will have (the number of events appended so far).
  int64_t first_kept() const;
  int64_t next_sequence() const;
  // Bytes of frames kept.
  size_t bytes() const;
  size_t max_bytes() const { return max_bytes_; }

 private:
  // Under mu_, once there is an event after *cursor or the log is closed: Next's result.
  Read TakeLocked(int64_t* cursor, std::vector<std::string>* out) const;

  const size_t max_bytes_;
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  std::deque<std::pair<int64_t, std::string>> events_;  // (sequence number, frame), oldest first
  int64_t first_kept_ = 0, next_ = 0;
  size_t bytes_ = 0;
  bool closed_ = false;
};

}  // namespace coli::cli::serve

#endif  // COLI_TOOLS_COLI_SERVE_RESPONSES_STREAM_H_
