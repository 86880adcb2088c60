#include "common/log/log.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace coli {
namespace {

TEST(Log, SinkReceivesMessagesAtOrAboveThreshold) {
  std::vector<std::pair<LogLevel, std::string>> seen;
  SetLogSink([&](LogLevel level, std::string_view msg) { seen.emplace_back(level, msg); });
  SetLogLevel(LogLevel::kInfo);
  COLI_LOG(kDebug) << "hidden";
  COLI_LOG(kInfo) << "loaded " << 3 << " tensors";
  COLI_LOG(kError) << "bad";
  SetLogSink(nullptr);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].first, LogLevel::kInfo);
  EXPECT_EQ(seen[0].second, "loaded 3 tensors");
  EXPECT_EQ(seen[1].first, LogLevel::kError);
}

TEST(Log, ParsesLevelNames) {
  LogLevel level = LogLevel::kInfo;
  EXPECT_TRUE(ParseLogLevel("warn", &level));
  EXPECT_EQ(level, LogLevel::kWarning);
  EXPECT_TRUE(ParseLogLevel("debug", &level));
  EXPECT_EQ(level, LogLevel::kDebug);
  EXPECT_FALSE(ParseLogLevel("loud", &level));
  EXPECT_EQ(LogLevelName(LogLevel::kError), "error");
}

}  // namespace
}  // namespace coli
