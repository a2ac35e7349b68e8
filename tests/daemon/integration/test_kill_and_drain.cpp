// Integration: clients that die and a daemon that is told to stop.
//   - 20 client processes (itest_client) killed with SIGKILL while they generate or step, on gRPC and shm: the daemon
//     frees their sessions and segments (ServerStatus back to its baseline, no new kestrel entry in /dev/shm) and a
//     healthy client running alongside sees nothing.
//   - SIGTERM while streams are in flight: with a long stop timeout they all finish normally and kestreld exits 0;
//     with a short one they end with FINISH_REASON_SHUTDOWN and a finish_message naming the drain time (not ABORTED,
//     which is a user's Abort), and kestreld still exits 0 within the timeout.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <thread>

#include "tests/daemon/integration/daemon_process.h"
#include "tests/daemon/integration/workload.h"

namespace kestrel::itest {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

const std::string kGoldenModel = KESTREL_SOURCE_DIR "/tests/golden/fixtures/golden-qwen35moe/golden-qwen35moe.gguf";

TEST(KillClients, SigkillMidGenerationLeavesNothingBehind) {
  const std::vector<std::string> shm_before = kestrel_shm_entries();
  auto daemon = DaemonProcess::start(model_options(kGoldenModel));
  ASSERT_TRUE(daemon) << daemon.error().message;
  DaemonProcess& d = **daemon;
  auto probe = d.connect_grpc();
  ASSERT_TRUE(probe) << probe.error().message;
  auto base = (*probe)->server_status();
  ASSERT_TRUE(base) << base.error().message;
  auto expected = run_workload(**probe, 5);
  ASSERT_TRUE(expected) << expected.error().message;

  std::atomic<bool> stop{false};
  std::string healthy_error;
  int healthy_runs = 0;
  std::thread healthy([&] {
    auto c = d.connect_shm();
    if (!c) {
      healthy_error = c.error().message;
      return;
    }
    while (!stop.load()) {
      auto r = run_workload(**c, 5);
      if (!r) {
        healthy_error = r.error().message;
        return;
      }
      if (*r != *expected) {
        healthy_error = "different tokens while clients were killed";
        return;
      }
      ++healthy_runs;
    }
  });

  // 10 gRPC Generate on temporary sessions, 5 shm Generate, 5 shm Step loops on their own sessions.
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (int i = 0; i < 20; ++i) {
    const bool shm = i % 2 == 1;
    const std::string mode = (shm && i % 4 == 3) ? "steps" : "generate";
    auto c = ChildProcess::spawn({KESTREL_ITEST_CLIENT_PATH, shm ? d.shm_uri() : d.grpc_uri(), mode});
    ASSERT_TRUE(c) << c.error().message;
    children.push_back(std::move(*c));
  }
  for (size_t i = 0; i < children.size(); ++i) {
    std::string line;
    ASSERT_TRUE(children[i]->read_line(&line, seconds(60))) << "client " << i << " never got going";
    ASSERT_EQ(line, "ready") << "client " << i;
  }
  auto busy = (*probe)->server_status();
  ASSERT_TRUE(busy);
  EXPECT_GE(busy->sessions(), base->sessions() + 15) << "the killed clients should hold sessions";
  EXPECT_GE(busy->shm_clients(), base->shm_clients() + 10);
  for (auto& c : children) c->kill_now(SIGKILL);
  for (auto& c : children) EXPECT_EQ(c->wait(nullptr), 128 + SIGKILL);
  children.clear();

  // The daemon notices every death (stream cancelled, control socket EOF) and frees what they held.
  const auto deadline = std::chrono::steady_clock::now() + seconds(20);
  v1::ServerStatus now;
  while (std::chrono::steady_clock::now() < deadline) {
    auto st = (*probe)->server_status();
    ASSERT_TRUE(st) << st.error().message;
    now = *st;
    // The healthy client holds at most one session of its own at any moment, and one shm connection.
    if (now.sessions() <= base->sessions() + 1 && now.shm_clients() == base->shm_clients() + 1) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  stop.store(true);
  healthy.join();
  EXPECT_EQ(healthy_error, "");
  EXPECT_GT(healthy_runs, 0);
  auto after = (*probe)->server_status();
  ASSERT_TRUE(after);
  EXPECT_EQ(after->sessions(), base->sessions()) << "sessions left by killed clients";
  EXPECT_LE(now.shm_clients(), base->shm_clients() + 1);
  EXPECT_EQ(kestrel_shm_entries(), shm_before) << "a kestrel segment stayed in /dev/shm";
  EXPECT_EQ(d.terminate(seconds(15)), 0) << d.log();
  EXPECT_EQ(kestrel_shm_entries(), shm_before);
}

// Starts `n` Generate streams (alternating gRPC and shm), waits for each one's first chunk, sends SIGTERM, and
// returns each stream's result with the daemon's exit status and drain time.
struct DrainOutcome {
  std::vector<Expected<v1::GenerateChunk>> results;
  std::vector<size_t> tokens;
  int exit_status = -1;
  double seconds = 0;
};

DrainOutcome drain_with_streams(DaemonProcess& d, int n, int32_t max_tokens, int32_t n_ctx, milliseconds limit) {
  DrainOutcome out;
  out.results.assign(static_cast<size_t>(n), make_error(ErrorCode::kInternal, "not run"));
  out.tokens.assign(static_cast<size_t>(n), 0);
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      auto c = i % 2 == 0 ? d.connect_grpc() : d.connect_shm();
      if (!c) {
        out.results[i] = c.error();
        ++started;
        return;
      }
      v1::GenerateRequest req;
      req.set_text("Stream " + std::to_string(i) + " keeps going while the daemon stops");
      req.set_max_tokens(max_tokens);
      req.set_ignore_eos(true);
      req.set_n_ctx(n_ctx);
      req.mutable_sampling()->set_temperature(0.0f);
      bool first = true;
      out.results[i] = (*c)->generate(req, [&](const v1::GenerateChunk& ch) {
        out.tokens[i] += static_cast<size_t>(ch.tokens_size());
        if (first) {
          first = false;
          ++started;
        }
        return true;
      });
      if (first) ++started;
    });
  }
  while (started.load() < n) std::this_thread::sleep_for(milliseconds(2));
  out.exit_status = d.terminate(limit, &out.seconds);
  for (auto& t : threads) t.join();
  return out;
}

TEST(Drain, SigtermLetsInFlightStreamsFinish) {
  auto daemon = DaemonProcess::start(model_options(kGoldenModel, 20));
  ASSERT_TRUE(daemon) << daemon.error().message;
  DrainOutcome o = drain_with_streams(**daemon, 4, 48, 256, seconds(25));
  EXPECT_EQ(o.exit_status, 0) << (*daemon)->log();
  EXPECT_LT(o.seconds, 20.0);
  for (size_t i = 0; i < o.results.size(); ++i) {
    ASSERT_TRUE(o.results[i]) << "stream " << i << ": " << o.results[i].error().message;
    EXPECT_EQ(o.results[i]->finish_reason(), v1::FINISH_REASON_MAX_TOKENS) << "stream " << i;
    EXPECT_EQ(o.tokens[i], 48u) << "stream " << i;
  }
}

TEST(Drain, ShortStopTimeoutAbortsStreams) {
  auto daemon = DaemonProcess::start(model_options(kGoldenModel, 1));
  ASSERT_TRUE(daemon) << daemon.error().message;
  // Streams far longer than a second (the largest context a session may have): the drain deadline ends them.
  auto c = (*daemon)->connect_grpc();
  ASSERT_TRUE(c) << c.error().message;
  auto mi = (*c)->model_info();
  ASSERT_TRUE(mi) << mi.error().message;
  DrainOutcome o = drain_with_streams(**daemon, 4, 1000000, mi->max_session_ctx(), seconds(10));
  EXPECT_EQ(o.exit_status, 0) << (*daemon)->log();
  EXPECT_LT(o.seconds, 1.0 + 5.0) << "kestreld took too long past its 1 s stop timeout";
  for (size_t i = 0; i < o.results.size(); ++i) {
    ASSERT_TRUE(o.results[i]) << "stream " << i << ": " << o.results[i].error().message;
    EXPECT_EQ(o.results[i]->finish_reason(), v1::FINISH_REASON_SHUTDOWN) << "stream " << i;
    EXPECT_EQ(o.results[i]->finish_message(),
              "kestreld is shutting down: its drain time of 1 s ran out before this generation finished")
        << "stream " << i;
    EXPECT_GT(o.tokens[i], 0u);
  }
}

}  // namespace
}  // namespace kestrel::itest
