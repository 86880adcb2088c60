// common/log: a small leveled logger with one pluggable sink.
//
//   COLI_LOG(kInfo) << "loaded " << n << " tensors from " << path;
//   coli::SetLogSink([](coli::LogLevel level, std::string_view msg) { ... });
//
// Plugins log through the host: the host installs a sink that forwards into its own log, and
// the plugin's copy of this library is pointed at it through the plugin ABI's log callback.
// The level threshold comes from COLI_LOG_LEVEL (debug|info|warning|error), default info.
#ifndef COLI_COMMON_LOG_LOG_H_
#define COLI_COMMON_LOG_LOG_H_

#include <functional>
#include <sstream>
#include <string>
#include <string_view>

namespace coli {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Receives each finished message (no trailing newline). Must be callable from any thread.
using LogSink = std::function<void(LogLevel level, std::string_view message)>;

// Replaces the sink; an empty function restores the default (stderr). Thread-safe.
void SetLogSink(LogSink sink);
// Messages below `level` are dropped before formatting.
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug", "info", "warning"/"warn", "error"; returns false for anything else.
bool ParseLogLevel(std::string_view text, LogLevel* level);
std::string_view LogLevelName(LogLevel level);
// Sends one message to the current sink (if `level` passes the threshold).
void LogMessage(LogLevel level, std::string_view message);

namespace internal_log {
// Collects one message and hands it to the sink on destruction.
class LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level) {}
  ~LogLine() { LogMessage(level_, stream_.str()); }
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal_log

}  // namespace coli

#define COLI_LOG(level)                                                     \
  if (::coli::LogLevel::level < ::coli::GetLogLevel()) {                    \
  } else                                                                    \
    ::coli::internal_log::LogLine(::coli::LogLevel::level).stream()

#endif  // COLI_COMMON_LOG_LOG_H_
