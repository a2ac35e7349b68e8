// sd_notify: READY=1, STATUS=, STOPPING=1 and WATCHDOG=1 reach the socket named by $NOTIFY_SOCKET (a datagram socket
// this test binds); the watchdog pings only while the engine loop is alive; nothing is sent outside systemd.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "daemon/ops/systemd_notify.h"

namespace kestrel::daemon::ops {
namespace {

namespace fs = std::filesystem;

// A datagram socket standing in for systemd's notification socket; sets $NOTIFY_SOCKET while it lives.
class NotifySocket {
 public:
  NotifySocket() {
    path_ = (fs::temp_directory_path() / ("kestrel-notify-" + std::to_string(::getpid()) + ".sock")).string();
    ::unlink(path_.c_str());
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    timeval tv{0, 200000};  // recv waits at most 200 ms
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  }
  ~NotifySocket() {
    ::unsetenv("NOTIFY_SOCKET");
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  bool bound() const { return bound_; }
  // The next datagram, or "" after 200 ms.
  std::string next() {
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }
  std::vector<std::string> drain() {
    std::vector<std::string> out;
    for (std::string m = next(); !m.empty(); m = next()) out.push_back(m);
    return out;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

TEST(SystemdNotify, MessagesArrive) {
  NotifySocket sock;
  ASSERT_TRUE(sock.bound());
  EXPECT_TRUE(notify_enabled());
  notify_status("loading model /m/tiny.gguf 40%");
  EXPECT_EQ(sock.next(), "STATUS=loading model /m/tiny.gguf 40%");
  notify_ready("serving tiny on /run/kestrel/kestreld.sock");
  EXPECT_EQ(sock.next(), "READY=1\nSTATUS=serving tiny on /run/kestrel/kestreld.sock");
  notify_watchdog();
  EXPECT_EQ(sock.next(), "WATCHDOG=1");
  notify_stopping("draining");
  EXPECT_EQ(sock.next(), "STOPPING=1\nSTATUS=draining");
}

TEST(SystemdNotify, NoSocketNoMessagesNoErrors) {
  ::unsetenv("NOTIFY_SOCKET");
  EXPECT_FALSE(notify_enabled());
  notify_ready("x");  // a no-op; nothing to observe but that it returns
  EXPECT_EQ(watchdog_interval().count(), 0);
}

TEST(SystemdNotify, WatchdogIntervalFromEnvironment) {
  ::setenv("WATCHDOG_USEC", "30000000", 1);
  ::setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
  EXPECT_EQ(watchdog_interval(), std::chrono::seconds(30));
  ::setenv("WATCHDOG_PID", "1", 1);  // meant for another process
  EXPECT_EQ(watchdog_interval().count(), 0);
  ::unsetenv("WATCHDOG_USEC");
  ::unsetenv("WATCHDOG_PID");
}

TEST(SystemdNotify, WatchdogPingsOnlyWhileAlive) {
  NotifySocket sock;
  ASSERT_TRUE(sock.bound());
  std::atomic<bool> alive{true};
  Watchdog dog(std::chrono::milliseconds(20), [&] { return alive.load(); });
  ASSERT_TRUE(dog.running());
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  alive = false;
  const uint64_t pings_while_alive = dog.pings();
  EXPECT_GE(pings_while_alive, 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // At most one ping was already past its probe when alive turned false.
  EXPECT_LE(dog.pings(), pings_while_alive + 1);
  EXPECT_GE(dog.missed(), 2u);
  dog.stop();
  EXPECT_FALSE(dog.running());
  const std::vector<std::string> msgs = sock.drain();
  EXPECT_EQ(msgs.size(), dog.pings());
  for (const std::string& m : msgs) EXPECT_EQ(m, "WATCHDOG=1");
}

TEST(SystemdNotify, WatchdogWithZeroPeriodStartsNothing) {
  Watchdog dog(std::chrono::microseconds(0), [] { return true; });
  EXPECT_FALSE(dog.running());
}

TEST(EngineProgressProbe, StalledOnlyWhenWorkWaitsAndTicksStandStill) {
  EngineProgressProbe probe;
  ServiceStats s;
  s.ticks = 10;
  s.queued_steps = 3;
  EXPECT_TRUE(probe(s));   // first look
  EXPECT_FALSE(probe(s));  // work waiting, no tick since
  s.ticks = 11;
  EXPECT_TRUE(probe(s));  // ticked
  s.queued_steps = 0;
  EXPECT_TRUE(probe(s));  // idle: nothing to tick for
  EXPECT_TRUE(probe(s));
}

}  // namespace
}  // namespace kestrel::daemon::ops
