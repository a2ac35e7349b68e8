// Signal handling: SIGTERM (sent to the process, as systemd does) wakes wait_for_stop(); a second one runs the force
// stop; SIGHUP is counted and ignored. Its own executable: the signals must be blocked before any thread exists.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>

#include "daemon/ops/signals.h"

namespace kestrel::daemon::ops {
namespace {

using namespace std::chrono_literals;

TEST(SignalWatcher, FirstTermDrainsSecondForcesHupIgnored) {
  std::atomic<int> forced{0};
  auto watcher = SignalWatcher::start([&](int sig) { forced = sig; });
  ASSERT_TRUE(watcher) << watcher.error().to_string();
  SignalWatcher& w = **watcher;

  EXPECT_EQ(w.wait_for_stop_for(20ms), 0);
  ASSERT_EQ(::kill(::getpid(), SIGHUP), 0);
  for (int i = 0; i < 200 && w.hangups() == 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(w.hangups(), 1u);
  EXPECT_EQ(w.wait_for_stop_for(20ms), 0);  // SIGHUP does not stop

  ASSERT_EQ(::kill(::getpid(), SIGTERM), 0);
  EXPECT_EQ(w.wait_for_stop_for(2s), SIGTERM);
  EXPECT_EQ(w.wait_for_stop(), SIGTERM);
  EXPECT_EQ(forced.load(), 0);

  ASSERT_EQ(::kill(::getpid(), SIGINT), 0);
  for (int i = 0; i < 200 && forced.load() == 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(forced.load(), SIGINT);
  EXPECT_EQ(w.stop_signals(), 2u);
}

TEST(SignalWatcher, RequestStopWithoutASignal) {
  auto watcher = SignalWatcher::start(nullptr);
  ASSERT_TRUE(watcher);
  (*watcher)->request_stop(SIGINT);
  EXPECT_EQ((*watcher)->wait_for_stop_for(1s), SIGINT);
}

}  // namespace
}  // namespace kestrel::daemon::ops
