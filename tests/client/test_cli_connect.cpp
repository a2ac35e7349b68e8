// `kestrel status` pointed at a daemon that is not there fails at once (not after the 5 s connect timeout) with one
// line on stderr that says what it found and gives the hint exactly once: for a socket path that does not exist, for
// a socket file nobody listens on (left by a stopped kestreld), and for an shm control socket that does not exist.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace kestrel {
namespace {

struct Run {
  int exit_code = -1;
  std::string err;
  double seconds = 0.0;
};

Run run_status(const std::string& uri) {
  const std::string err_path = ::testing::TempDir() + "kestrel_cli_connect.err";
  const std::string cmd = "'" KESTREL_CLI_PATH "' status --connect '" + uri + "' >/dev/null 2>'" + err_path + "'";
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  Run r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream f(err_path);
  std::stringstream ss;
  ss << f.rdbuf();
  r.err = ss.str();
  return r;
}

size_t count(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

void expect_quick_single_hint(const Run& r, const std::string& found) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_LT(r.seconds, 2.0) << "failed only after " << r.seconds << " s: " << r.err;
  EXPECT_EQ(count(r.err, "\n"), 1u) << "one line: " << r.err;
  EXPECT_NE(r.err.find(found), std::string::npos) << r.err;
  EXPECT_EQ(count(r.err, "is kestreld running"), 1u) << "the hint once: " << r.err;
}

TEST(CliConnect, MissingSocketFailsAtOnceWithOneHint) {
  const std::string path = ::testing::TempDir() + "kestrel-no-daemon-here.sock";
  std::filesystem::remove(path);
  expect_quick_single_hint(run_status("unix://" + path), "there is no socket at " + path);
  expect_quick_single_hint(run_status(path), "there is no socket at " + path);
}

TEST(CliConnect, SocketNobodyListensOn) {
  const std::string path = ::testing::TempDir() + "kestrel-stale.sock";
  std::filesystem::remove(path);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);  // the file stays, like the socket of a daemon that was killed
  expect_quick_single_hint(run_status("unix://" + path), "nothing listens on " + path);
  std::filesystem::remove(path);
}

TEST(CliConnect, MissingShmSocket) {
  const std::string path = ::testing::TempDir() + "kestrel-no-shm-here.sock";
  std::filesystem::remove(path);
  expect_quick_single_hint(run_status("shm://" + path), path);
}

}  // namespace
}  // namespace kestrel
