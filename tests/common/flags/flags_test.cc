// common/flags beyond what tests/coli/cli_args_test.cc pins through the `coli` parsers
// (ArgReader's value forms, numbers, the model-folder check): the empty-value refusal and the
// gRPC address check coli-host --listen and coli serve --connect use.
#include "common/flags/flags.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace coli::flags {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ArgReaderNonEmptyValue, RefusesAnEmptyValueInEitherFormAndNamesTheFlag) {
  std::vector<std::string> args = {"coli-host", "--listen=", "--host", "", "--key", "k"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ArgReader r(static_cast<int>(argv.size()), argv.data());
  ASSERT_TRUE(r.Next());
  EXPECT_THAT(r.NonEmptyValue("an address").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--listen is empty: give an address")));
  ASSERT_TRUE(r.Next());
  EXPECT_THAT(r.NonEmptyValue("a host").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--host is empty")));
  ASSERT_TRUE(r.Next());  // the empty value was consumed: the walk goes on at --key
  EXPECT_TRUE(r.Is("--key"));
  absl::StatusOr<std::string> key = r.NonEmptyValue("a key");
  ASSERT_OK(key.status());
  EXPECT_EQ(*key, "k");
  EXPECT_FALSE(r.Next());
}

// A flag followed by another flag: the advice fits the flag ('=' splits only long flags).
TEST(ArgReaderValue, AFlagWhereAValueShouldBeSaysHowToGiveIt) {
  std::vector<std::string> args = {"coli", "--prompt", "--in", "-p", "--in"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ArgReader r(static_cast<int>(argv.size()), argv.data());
  ASSERT_TRUE(r.Next());
  EXPECT_THAT(r.Value().status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("(write --prompt=--in if that is the value)")));
  ASSERT_TRUE(r.Next());  // --in
  ASSERT_TRUE(r.Next());  // -p
  EXPECT_THAT(r.Value().status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a value starting with '--' needs the flag's long form with '='")));
}

TEST(CheckGrpcAddress, TakesSocketsAndPortsInRange) {
  for (const char* ok : {"unix:/tmp/h.sock", "unix-abstract:coli", "127.0.0.1:50051", "localhost:1",
                         "[::1]:65535", "ipv4:127.0.0.1:8000", "dns:///example.org:443"}) {
    EXPECT_OK(CheckGrpcAddress("--connect", ok, /*listening=*/false)) << ok;
  }
  EXPECT_OK(CheckGrpcAddress("--listen", "127.0.0.1:0", /*listening=*/true));
}

TEST(CheckGrpcAddress, NamesTheFlagAndWhatIsWrong) {
  struct Case {
    const char* address;
    bool listening;
    const char* message;
  };
  // gRPC took 127.0.0.1:99999 as port 34463 (99999 - 65536) and listened there.
  for (const Case& c : {
           Case{"127.0.0.1:99999", true,
                "--x '127.0.0.1:99999': the port: '99999' is outside [0, 65535]"},
           Case{"127.0.0.1:0", false, "'0' is outside [1, 65535]"},
           Case{"127.0.0.1:-1", true, "'-1' is outside [0, 65535]"},
           Case{"localhost:http", false, "'http' is not a number"},
           Case{"localhost:", false, "'' is not a number"},
           Case{"garbage", true, "--x 'garbage' is not unix:/path or HOST:PORT"},
           Case{":8000", true, "is not unix:/path or HOST:PORT"},
           Case{"unix:", true, "--x 'unix:' names no socket"},
           Case{"", false, "--x is empty"},
       }) {
    EXPECT_THAT(CheckGrpcAddress("--x", c.address, c.listening),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.address;
  }
}

}  // namespace
}  // namespace coli::flags
