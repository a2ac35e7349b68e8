// Logging: the journal format prefixes each line with its syslog priority and nothing else; the text format carries
// a timestamp and the level; auto picks journal only when $JOURNAL_STREAM names stderr.
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
