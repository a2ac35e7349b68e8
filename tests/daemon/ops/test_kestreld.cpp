// kestreld the executable: --help/--print-config/--check-config, one-line start-up errors with status 1 (bad config,
// corrupt model, unwritable socket folder, a fallback socket folder another user created), and a full life under a fake
// systemd: STATUS= while loading, READY=1 once serving, STOPPING=1 on SIGTERM, exit 0, socket files removed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "tests/daemon/scratch_dir.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

const std::string kKestreld = std::string(KESTREL_BINARY_DIR) + "/bin/kestreld";
// Shared by the runs of this test so that the default model is written once per build tree.
const std::string kCacheDir = std::string(KESTREL_BINARY_DIR) + "/test-cache/kestreld";

std::string read_all(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A started kestreld with stdout/stderr in files.
struct Process {
  pid_t pid = -1;
  fs::path out, err;
};

Process spawn(const std::vector<std::string>& args, const fs::path& out, const fs::path& err,
              const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> argv_s = {kKestreld};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v(*e);
    if (v.rfind("NOTIFY_SOCKET=", 0) == 0 || v.rfind("JOURNAL_STREAM=", 0) == 0) continue;
    env_s.push_back(v);
  }
  env_s.insert(env_s.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (std::string& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  Process p{-1, out, err};
  const int rc = posix_spawn(&p.pid, kKestreld.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) p.pid = -1;
  return p;
}

// Waits up to `limit` for the process; returns its exit status, or -1 (then it is killed).
int wait_exit(pid_t pid, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::steady_clock::now() > end) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(10ms);
  }
}

struct Result {
  int status = -1;
  std::string out, err;
};

Result run(const std::vector<std::string>& args, const ::kestrel::test::ScratchDir& s) {
  Process p = spawn(args, s / "out", s / "err");
  Result r;
  if (p.pid < 0) return r;
  r.status = wait_exit(p.pid, 60s);
  r.out = read_all(p.out);
  r.err = read_all(p.err);
  return r;
}

size_t line_count(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

TEST(Kestreld, HelpPrintAndCheck) {
  ::kestrel::test::ScratchDir s("kestreld-test");
  Result help = run({"--help"}, s);
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.out.find("--max-sessions"), std::string::npos);
  EXPECT_NE(help.out.find("--print-config"), std::string::npos);

  const fs::path conf = s / "k.toml";
  std::ofstream(conf) << "[limits]\nmax_sessions = 3\n";
  Result print = run({"--config", conf.string(), "--temperature", "0.25", "--print-config"}, s);
  EXPECT_EQ(print.status, 0) << print.err;
  EXPECT_NE(print.out.find("max_sessions = 3"), std::string::npos) << print.out;
  EXPECT_NE(print.out.find(conf.string() + ":2"), std::string::npos) << print.out;
  EXPECT_NE(print.out.find("temperature = 0.25"), std::string::npos) << print.out;

  Result check = run({"--config", conf.string(), "--check-config"}, s);
  EXPECT_EQ(check.status, 0) << check.err;

  Result usage = run({"--frobnicate"}, s);
  EXPECT_EQ(usage.status, 2);
}

TEST(Kestreld, BadConfigIsOneLineAndStatus1) {
  ::kestrel::test::ScratchDir s("kestreld-test");
  const fs::path conf = s / "bad.toml";
  std::ofstream(conf) << "[limits]\n\nmax_sessions = 0\n";
  Result r = run({"--config", conf.string()}, s);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(line_count(r.err), 1u) << r.err;
  EXPECT_NE(r.err.find(conf.string() + ":3: [limits] max_sessions"), std::string::npos) << r.err;
}

TEST(Kestreld, CorruptModelIsOneLineAndStatus1) {
  ::kestrel::test::ScratchDir s("kestreld-test");
  const fs::path model = s / "corrupt.gguf";
  std::ofstream(model) << "GGUF this is not a model";
  Result r = run({"--model", model.string(), "--socket", (s / "k.sock").string(), "--log-format", "text"}, s);
  EXPECT_EQ(r.status, 1);
  const size_t at = r.err.find("cannot start: ");
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_NE(r.err.find(model.string(), at), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n', at), r.err.size() - 1) << "the error is the last line: " << r.err;
}

TEST(Kestreld, UnwritableSocketFolderIsOneLineAndStatus1) {
  ::kestrel::test::ScratchDir s("kestreld-test");
  std::ofstream(s / "file") << "x";
  // A socket "folder" that is a file cannot be created, whoever runs the test.
  Result r = run({"--cache-dir", kCacheDir, "--socket", (s / "file" / "k.sock").string()}, s);
  EXPECT_EQ(r.status, 1);
  const size_t at = r.err.find("cannot start: socket folder " + (s / "file").string());
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n', at), r.err.size() - 1) << r.err;
}

// Another user created kestreld's fallback socket folder first (/tmp/kestrel-$UID, used without XDG_RUNTIME_DIR),
// world-writable, so that it could later move kestreld's socket away and listen in its place: kestreld refuses to
// start and says what to fix. Runs kestreld as a spare uid, so it needs root.
TEST(Kestreld, SquattedFallbackSocketFolderIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run kestreld as another uid";
  ::kestrel::test::ScratchDir s("kestreld-test");
  ASSERT_EQ(::chmod(s.path().c_str(), 0777), 0);  // the spare uid writes its output here
  const uid_t uid = 64977;
  const fs::path squatted = "/tmp/kestrel-" + std::to_string(uid);
  fs::remove_all(squatted);
  ASSERT_EQ(::mkdir(squatted.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(squatted.c_str(), 0777), 0);  // root's, mode 0777: another user's folder
  std::vector<std::string> env_s = {"PATH=/usr/bin:/bin"};
  std::vector<char*> envp;
  for (std::string& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string arg0 = kKestreld;
  std::string arg1 = "--cache-dir";
  std::string arg2 = (s / "cache").string();
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  const fs::path err = s / "err";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(90);
    const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) ::_exit(91);
    ::dup2(fd, 2);
    ::execve(arg0.c_str(), argv, envp.data());
    ::_exit(92);
  }
  const int status = wait_exit(pid, 60s);
  const std::string text = read_all(err);
  fs::remove_all(squatted);
  EXPECT_EQ(status, 1) << text;
  EXPECT_NE(text.find("cannot start: socket folder " + squatted.string() + ": private folder " + squatted.string() +
                      " is not safe to use: it belongs to uid 0, not to this program's uid " + std::to_string(uid)),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("set XDG_RUNTIME_DIR"), std::string::npos) << text;
}

// A datagram socket standing in for systemd's notification socket.
class FakeSystemd {
 public:
  explicit FakeSystemd(const fs::path& path) : path_(path.string()) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    timeval tv{0, 100000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~FakeSystemd() { ::close(fd_); }
  bool bound() const { return bound_; }
  const std::string& path() const { return path_; }
  // Collects messages until one contains `what` or `limit` passes; true when found.
  bool wait_for(const std::string& what, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n > 0) {
        messages.emplace_back(buf, static_cast<size_t>(n));
        if (messages.back().find(what) != std::string::npos) return true;
      }
    }
    return false;
  }
  std::vector<std::string> messages;

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

TEST(Kestreld, NotifiesSystemdAndDrainsOnSigterm) {
  ::kestrel::test::ScratchDir s("kestreld-test");
  FakeSystemd systemd(s / "notify.sock");
  ASSERT_TRUE(systemd.bound());
  const fs::path sock = s / "run" / "kestreld.sock";
  Process p = spawn({"--cache-dir", kCacheDir, "--socket", sock.string(), "--stop-timeout", "5"}, s / "out", s / "err",
                    {"NOTIFY_SOCKET=" + systemd.path()});
  ASSERT_GT(p.pid, 0);
  const bool ready = systemd.wait_for("READY=1", 60s);
  if (!ready) {
    ::kill(p.pid, SIGKILL);
    wait_exit(p.pid, 5s);
    FAIL() << "no READY=1; stderr:\n" << read_all(p.err);
  }
  bool saw_loading = false;
  for (const std::string& m : systemd.messages) saw_loading |= m.find("STATUS=loading model ") != std::string::npos;
  EXPECT_TRUE(saw_loading);
  EXPECT_NE(systemd.messages.back().find("STATUS=serving "), std::string::npos) << systemd.messages.back();
  EXPECT_TRUE(fs::exists(sock));
  EXPECT_TRUE(fs::exists(s / "run" / "kestreld-shm.sock"));

  ASSERT_EQ(::kill(p.pid, SIGTERM), 0);
  EXPECT_TRUE(systemd.wait_for("STOPPING=1", 10s));
  EXPECT_EQ(wait_exit(p.pid, 20s), 0) << read_all(p.err);
  EXPECT_FALSE(fs::exists(sock));
  EXPECT_FALSE(fs::exists(s / "run" / "kestreld-shm.sock"));
  const std::string log = read_all(p.err);
  EXPECT_NE(log.find("draining"), std::string::npos) << log;
  EXPECT_NE(log.find("stopped"), std::string::npos) << log;
}

}  // namespace
