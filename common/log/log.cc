#include "common/log/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace coli {
namespace {

std::mutex& SinkMutex() {
  static std::mutex mu;
  return mu;
}

LogSink& Sink() {
  static LogSink sink;
  return sink;
}

LogLevel InitialLevel() {
  LogLevel level = LogLevel::kInfo;
  if (const char* env = std::getenv("COLI_LOG_LEVEL")) ParseLogLevel(env, &level);
  return level;
}

std::atomic<int>& Threshold() {
  static std::atomic<int> threshold{static_cast<int>(InitialLevel())};
  return threshold;
}

}  // namespace

void SetLogSink(LogSink sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  Sink() = std::move(sink);
}

void SetLogLevel(LogLevel level) { Threshold().store(static_cast<int>(level)); }

LogLevel GetLogLevel() { return static_cast<LogLevel>(Threshold().load()); }

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  if (text == "debug") *level = LogLevel::kDebug;
  else if (text == "info") *level = LogLevel::kInfo;
  else if (text == "warning" || text == "warn") *level = LogLevel::kWarning;
  else if (text == "error") *level = LogLevel::kError;
  else return false;
  return true;
}

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "unknown";
}

void LogMessage(LogLevel level, std::string_view message) {
  if (level < GetLogLevel()) return;
  std::lock_guard<std::mutex> lock(SinkMutex());
  if (Sink()) {
    Sink()(level, message);
    return;
  }
  std::fprintf(stderr, "[%.*s] %.*s\n", static_cast<int>(LogLevelName(level).size()),
               LogLevelName(level).data(), static_cast<int>(message.size()), message.data());
}

}  // namespace coli
