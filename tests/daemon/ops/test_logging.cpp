// Logging: the journal format prefixes each line with its syslog priority and nothing else; the text format carries
// a timestamp and the level; auto picks journal only when $JOURNAL_STREAM names stderr.
#include <google/protobuf/stubs/logging.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "daemon/ops/logging.h"

namespace kestrel::daemon::ops {
namespace {

// Runs `fn` with stderr (fd 2) redirected into a file; returns what was written.
template <class Fn>
std::string capture_stderr(Fn fn) {
  char path[] = "/tmp/kestrel-log-XXXXXX";
  const int fd = ::mkstemp(path);
  const int saved = ::dup(2);
  std::fflush(stderr);
  ::dup2(fd, 2);
  fn();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ::unlink(path);
  return text;
}

TEST(Logging, JournalFormatCarriesPriorities) {
  const std::string out = capture_stderr([] {
    ASSERT_TRUE(setup_logging(LogConfig{"debug", "journal"}));
    spdlog::debug("d {}", 1);
    spdlog::info("i");
    spdlog::warn("w");
    spdlog::error("e");
  });
  EXPECT_EQ(out, "<7>d 1\n<6>i\n<4>w\n<3>e\n");
}

TEST(Logging, TextFormatAndLevelFilter) {
  const std::string out = capture_stderr([] {
    ASSERT_TRUE(setup_logging(LogConfig{"warn", "text"}));
    spdlog::info("hidden");
    spdlog::warn("shown");
  });
  EXPECT_EQ(out.find("hidden"), std::string::npos) << out;
  ASSERT_NE(out.find(" warning shown"), std::string::npos) << out;
  EXPECT_EQ(out[4], '-');  // "2026-..." timestamp first
}

// A client's string field that is not UTF-8 makes protobuf log an ERROR as the parse fails: a debug line of
// kestreld's logger, never a line per request at the default level. Protobuf's other errors stay errors.
TEST(Logging, ProtobufLinesGoThroughTheLogger) {
  const std::string quiet = capture_stderr([] {
    ASSERT_TRUE(setup_logging(LogConfig{"info", "journal"}));
    GOOGLE_LOG(ERROR) << "String field 'kestrel.v1.TokenizeRequest.text' contains invalid UTF-8 data when parsing";
    GOOGLE_LOG(ERROR) << "something else";
  });
  EXPECT_EQ(quiet.find("invalid UTF-8"), std::string::npos) << quiet;
  EXPECT_NE(quiet.find("<3>protobuf "), std::string::npos) << quiet;
  EXPECT_NE(quiet.find(": something else\n"), std::string::npos) << quiet;
  const std::string debug = capture_stderr([] {
    ASSERT_TRUE(setup_logging(LogConfig{"debug", "journal"}));
    GOOGLE_LOG(ERROR) << "String field 'x' contains invalid UTF-8 data when parsing";
  });
  EXPECT_EQ(debug.rfind("<7>protobuf ", 0), 0u) << debug;
}

TEST(Logging, AutoFollowsJournalStream) {
  ::unsetenv("JOURNAL_STREAM");
  EXPECT_EQ(resolve_log_format("auto"), "text");
  struct stat st {};
  ASSERT_EQ(::fstat(2, &st), 0);
  const std::string stream = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  ::setenv("JOURNAL_STREAM", stream.c_str(), 1);
  EXPECT_EQ(resolve_log_format("auto"), "journal");
  ::setenv("JOURNAL_STREAM", "1:2", 1);
  EXPECT_EQ(resolve_log_format("auto"), "text");
  ::unsetenv("JOURNAL_STREAM");
  EXPECT_EQ(resolve_log_format("text"), "text");
}

TEST(Logging, UnknownLevelIsRefused) { EXPECT_FALSE(setup_logging(LogConfig{"loud", "text"})); }

}  // namespace
}  // namespace kestrel::daemon::ops
