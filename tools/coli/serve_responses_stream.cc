// The kept event stream of a background response (see serve_responses_stream.h).
#include "tools/coli/serve_responses_stream.h"

namespace coli::cli::serve {

void ResponseEventLog::Append(int64_t sequence, std::string frame) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    bytes_ += frame.size();
    events_.emplace_back(sequence, std::move(frame));
    next_ = sequence + 1;
    while (events_.size() > 1 && bytes_ > max_bytes_) {
      bytes_ -= events_.front().second.size();
      events_.pop_front();
    }
    first_kept_ = events_.front().first;
  }
  changed_.notify_all();
}

void ResponseEventLog::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  changed_.notify_all();
}

ResponseEventLog::Read ResponseEventLog::Next(int64_t* cursor,
                                              std::vector<std::string>* out) const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return closed_ || next_ > *cursor + 1; });
  return TakeLocked(cursor, out);
}

ResponseEventLog::Read ResponseEventLog::Next(int64_t* cursor, std::vector<std::string>* out,
                                              std::chrono::milliseconds max_wait) const {
  std::unique_lock<std::mutex> lock(mu_);
  if (!changed_.wait_for(lock, max_wait, [&] { return closed_ || next_ > *cursor + 1; })) {
    return Read::kWaiting;
  }
  return TakeLocked(cursor, out);
}

ResponseEventLog::Read ResponseEventLog::TakeLocked(int64_t* cursor,
                                                    std::vector<std::string>* out) const {
  if (next_ <= *cursor + 1) return Read::kEnd;  // closed, nothing after the cursor
  if (*cursor + 1 < first_kept_) return Read::kDropped;
  for (const auto& [sequence, frame] : events_) {
    if (sequence <= *cursor) continue;
    out->push_back(frame);
    *cursor = sequence;
  }
  return Read::kEvents;
}

bool ResponseEventLog::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

int64_t ResponseEventLog::first_kept() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_kept_;
}

int64_t ResponseEventLog::next_sequence() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_;
}

size_t ResponseEventLog::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace coli::cli::serve
