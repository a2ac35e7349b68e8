// Who gets a place in the shm fast path, and what is logged about those who do not: ShmAdmission's bookkeeping
// (handshake places promoted to client slots, limits overall and per uid), LogThrottle, the outbox's "closed" versus
// "full" answer, and ShmServer end to end: silent connections that never finish their handshake hold no client slot
// and are dropped at the handshake deadline, a uid's handshake places are its own, floods of refusals are logged a
// few lines a period, and a client killed mid-generation is not reported as one that stopped reading.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/lib/client.h"
#include "daemon/server/rpc_handlers.h"
#include "daemon/shm/log_throttle.h"
#include "daemon/shm/shm_admission.h"
#include "daemon/shm/shm_outbox.h"
#include "daemon/shm/shm_server.h"
#include "fake_service.h"
#include "kestrel/shm/control_socket.h"

namespace kestrel::daemon {
namespace {

using namespace std::chrono_literals;
using client::Client;

std::string temp_socket_path() {
  static std::atomic<int> n{0};
  return "/tmp/kestrel-shm-adm-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".sock";
}

// Captures the default logger's lines for one test.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(4096)) {
    previous_ = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink_));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  size_t count(const std::string& needle) const {
    size_t n = 0;
    for (const std::string& line : sink_->last_formatted()) n += line.find(needle) != std::string::npos ? 1 : 0;
    return n;
  }
  std::string all() const {
    std::string out;
    for (const std::string& line : sink_->last_formatted()) out += line;
    return out;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

// One byte from a pipe within `limit`; false on EOF (the writer died) or timeout.
bool read_byte(int fd, std::chrono::milliseconds limit) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(limit.count())) != 1) return false;
  char b = 0;
  return read(fd, &b, 1) == 1;
}

bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}

// ---- ShmAdmission ----------------------------------------------------------------------------------------------

TEST(ShmAdmissionTest, HandshakePlacesAreNotClientSlots) {
  std::vector<uint32_t> reported;
  ShmAdmission a({/*max_clients=*/2, /*max_clients_per_uid=*/2, /*max_handshakes=*/3, /*max_handshakes_per_uid=*/3},
                 [&](uint32_t n) { reported.push_back(n); });
  ASSERT_TRUE(a.begin_handshake(1000));
  ASSERT_TRUE(a.begin_handshake(1000));
  ASSERT_TRUE(a.begin_handshake(1000));
  EXPECT_EQ(a.handshakes(), 3u);
  EXPECT_EQ(a.clients(), 0u);
  Status fourth = a.begin_handshake(1001);
  ASSERT_FALSE(fourth);
  EXPECT_EQ(fourth.error().code, ErrorCode::kUnavailable) << "handshake places free soon: a retryable refusal";
  EXPECT_EQ(fourth.error().message, "3 shm handshakes are in progress (max_handshakes); retry in a moment");
  ASSERT_TRUE(a.promote(1000));
  ASSERT_TRUE(a.promote(1000));
  EXPECT_EQ(a.clients(), 2u);
  EXPECT_EQ(a.handshakes(), 1u);
  // The third finished its handshake while the slots filled up: refused, and its place is given back.
  Status late = a.promote(1000);
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(late.error().message, "kestreld already serves 2 shm clients (max_clients); use gRPC or retry later");
  EXPECT_EQ(a.handshakes(), 0u);
  // With every slot taken a new connection is refused before its handshake.
  EXPECT_FALSE(a.begin_handshake(1002));
  a.release_client(1000);
  EXPECT_EQ(a.clients(), 1u);
  EXPECT_TRUE(a.begin_handshake(1002));
  a.abandon_handshake(1002);
  EXPECT_EQ(a.handshakes(), 0u);
  EXPECT_EQ(reported, (std::vector<uint32_t>{1, 2, 1}));
}

TEST(ShmAdmissionTest, EachUidHasItsOwnShare) {
  ShmAdmission a({/*max_clients=*/10, /*max_clients_per_uid=*/2, /*max_handshakes=*/10, /*max_handshakes_per_uid=*/2});
  ASSERT_TRUE(a.begin_handshake(7));
  ASSERT_TRUE(a.begin_handshake(7));
  Status third = a.begin_handshake(7);
  ASSERT_FALSE(third);
  EXPECT_EQ(third.error().message,
            "uid 7 already has 2 shm handshakes in progress (max_handshakes_per_uid); retry in a moment");
  EXPECT_TRUE(a.begin_handshake(8)) << "another uid is not held back by uid 7's handshakes";
  ASSERT_TRUE(a.promote(7));
  ASSERT_TRUE(a.promote(7));
  Status more = a.begin_handshake(7);
  ASSERT_FALSE(more);
  EXPECT_EQ(more.error().message, "uid 7 already has 2 shm clients (max_clients_per_uid); use gRPC or retry later");
  ASSERT_TRUE(a.promote(8));
  EXPECT_EQ(a.clients(), 3u);
  // Releases and abandons of unknown uids change nothing.
  a.release_client(99);
  a.abandon_handshake(99);
  EXPECT_EQ(a.clients(), 3u);
  EXPECT_EQ(a.handshakes(), 0u);
}

// ---- LogThrottle -----------------------------------------------------------------------------------------------

TEST(LogThrottleTest, ABurstPerPeriodThenOneSummary) {
  LogCapture log;
  LogThrottle t("refused things", 3, 300ms);
  for (int i = 0; i < 10; ++i) t.warn("refused thing " + std::to_string(i));
  EXPECT_EQ(log.count("refused thing "), 3u);
  EXPECT_EQ(t.suppressed_total(), 7u);
  t.flush();  // the period is not over: nothing yet
  EXPECT_EQ(log.count("more refused things"), 0u);
  std::this_thread::sleep_for(350ms);
  t.flush();
  EXPECT_EQ(log.count("7 more refused things in the last 0.3 s, not logged one by one"), 1u) << log.all();
  t.flush();
  EXPECT_EQ(log.count("more refused things"), 1u) << "a summary is logged once";
  t.warn("refused thing 10");
  EXPECT_EQ(log.count("refused thing 10"), 1u) << "a new period logs again";
}

// ---- ShmOutbox / ShmGenerateSink -------------------------------------------------------------------------------

TEST(ShmOutboxTest, AClosedOutboxEndsStreamsQuietlyAndAFullOneWithAWarning) {
  LogCapture log;
  auto segment = ShmSegment::create(1);
  ASSERT_TRUE(segment) << segment.error().message;
  v1::GenerateChunk chunk;
  chunk.add_tokens(5);
  {
    auto outbox = std::make_shared<ShmOutbox>(*segment, /*max_bytes=*/0);
    ShmGenerateSink sink(outbox, 1, "shm client pid 1 uid 2");
    sink.on_chunk(chunk);  // nothing queued yet: goes in
    EXPECT_FALSE(sink.cancelled());
    sink.on_chunk(chunk);  // over 0 bytes queued: the client is not reading
    EXPECT_TRUE(sink.cancelled());
    EXPECT_EQ(log.count("not reading its responses"), 1u);
    sink.on_done(RpcStatus{}, v1::GenerateChunk{});
    std::deque<ShmOutRecord> records;
    outbox->take_all(&records);
    ASSERT_EQ(records.size(), 2u);
    EXPECT_EQ(records.back().header.kind, shm::kKindError);
    EXPECT_EQ(records.back().header.status, rpc_code::kResourceExhausted);
  }
  {
    auto outbox = std::make_shared<ShmOutbox>(*segment, /*max_bytes=*/1 << 20);
    ShmGenerateSink sink(outbox, 2, "shm client pid 1 uid 2");
    sink.on_chunk(chunk);
    outbox->close();  // the connection ended (the client died)
    EXPECT_TRUE(sink.cancelled());
    for (int i = 0; i < 100; ++i) sink.on_chunk(chunk);
    sink.on_done(RpcStatus{rpc_code::kCancelled, "gone"}, v1::GenerateChunk{});
    EXPECT_EQ(outbox->push(ShmOutRecord{}, false), ShmPush::kClosed);
    EXPECT_EQ(log.count("not reading its responses"), 1u) << "a closed outbox is not a client that stopped reading";
  }
}

// ---- ShmServer -------------------------------------------------------------------------------------------------

// A connection that never answers the daemon's hello (or any connection, until closed).
struct SilentPeer {
  int fd = -1;
  explicit SilentPeer(const std::string& path) {
    auto s = shm::connect_control_socket(path);
    EXPECT_TRUE(s) << s.error().message;
    if (s) fd = *s;
  }
  ~SilentPeer() {
    if (fd >= 0) close(fd);
  }
  SilentPeer(const SilentPeer&) = delete;
  SilentPeer& operator=(const SilentPeer&) = delete;
  // What the daemon sent first: its hello, or a refusal.
  Expected<shm::ControlMessage> first_message() const {
    int segment = -1;
    auto m = shm::recv_control(fd, &segment, 5000ms);
    if (segment >= 0) close(segment);
    return m;
  }
};

class ShmServerAdmissionTest : public ::testing::Test {
 protected:
  void start(ShmServerOptions options) {
    options.socket_path = temp_socket_path();
    auto server = ShmServer::start(options, service_, handlers_);
    ASSERT_TRUE(server) << server.error().message;
    server_ = std::move(server).value();
  }
  void TearDown() override {
    if (server_) server_->stop();
  }
  Expected<std::unique_ptr<Client>> connect() const { return Client::connect("shm://" + server_->socket_path()); }

  LogCapture log_;
  testing::FakeService service_;
  RpcHandlers handlers_{service_};
  std::unique_ptr<ShmServer> server_;
};

TEST_F(ShmServerAdmissionTest, SilentConnectionsDoNotLockClientsOut) {
  ShmServerOptions options;
  options.admission = {/*max_clients=*/2, /*max_clients_per_uid=*/2, /*max_handshakes=*/8,
                       /*max_handshakes_per_uid=*/8};
  options.handshake_timeout = 400ms;
  start(options);
  std::vector<std::unique_ptr<SilentPeer>> silent;
  for (int i = 0; i < 6; ++i) silent.push_back(std::make_unique<SilentPeer>(server_->socket_path()));
  ASSERT_TRUE(eventually([&] { return server_->handshake_count() == 6; }));
  // Six connections sit in their handshake; both client slots are still free.
  auto a = connect();
  ASSERT_TRUE(a) << a.error().message;
  auto b = connect();
  ASSERT_TRUE(b) << b.error().message;
  ASSERT_TRUE((*a)->server_status()) << "a served client";
  ASSERT_TRUE((*b)->server_status());
  EXPECT_EQ(server_->client_count(), 2u);
  auto c = connect();
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(c.error().message.find("(max_clients)"), std::string::npos) << c.error().message;
  // The handshake deadline drops the silent ones.
  EXPECT_TRUE(eventually([&] { return server_->handshake_count() == 0; }));
  EXPECT_GE(log_.count("shm handshake failed: the client did not confirm the mapping within 400 ms"), 1u) << log_.all();
  auto st = (*a)->server_status();
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(st->shm_clients(), 2u) << "ServerStatus counts clients, not handshakes";
}

// Many connections of one program at once: those over the handshake places are refused as busy and the client
// library tries them again, so all of them get in.
TEST_F(ShmServerAdmissionTest, ABurstOfOneUidsClientsAllConnect) {
  ShmServerOptions options;
  options.admission = {/*max_clients=*/64, /*max_clients_per_uid=*/64, /*max_handshakes=*/4,
                       /*max_handshakes_per_uid=*/2};
  start(options);
  std::vector<std::thread> threads;
  std::atomic<int> served{0};
  std::vector<std::string> errors(24);
  for (int i = 0; i < 24; ++i) {
    threads.emplace_back([&, i] {
      auto c = connect();
      if (!c) {
        errors[static_cast<size_t>(i)] = c.error().message;
        return;
      }
      if ((*c)->server_status()) ++served;
    });
  }
  for (auto& t : threads) t.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(served.load(), 24);
  EXPECT_GE(server_->suppressed_warnings() + log_.count("refused: "), 1u) << "the burst met the handshake limit";
}

TEST_F(ShmServerAdmissionTest, FloodOfRefusalsIsLoggedAFewLinesAPeriod) {
  ShmServerOptions options;
  options.admission = {/*max_clients=*/4, /*max_clients_per_uid=*/4, /*max_handshakes=*/2,
                       /*max_handshakes_per_uid=*/2};
  options.handshake_timeout = 5000ms;
  options.refusal_log_burst = 3;
  options.refusal_log_period = 60000ms;
  start(options);
  SilentPeer first(server_->socket_path());
  SilentPeer second(server_->socket_path());
  ASSERT_TRUE(eventually([&] { return server_->handshake_count() == 2; }));
  for (int i = 0; i < 40; ++i) {
    SilentPeer p(server_->socket_path());
    auto m = p.first_message();
    ASSERT_TRUE(m) << m.error().message;
    EXPECT_EQ(m->type, shm::kControlRefused);
    EXPECT_EQ(m->status, rpc_code::kUnavailable);
  }
  EXPECT_EQ(log_.count("refused: "), 3u) << log_.all();
  EXPECT_TRUE(eventually([&] { return server_->suppressed_warnings() == 37u; }));
}

TEST_F(ShmServerAdmissionTest, AUidsHandshakesDoNotHoldOtherUidsBack) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
#if defined(__SANITIZE_THREAD__)
  // The forked child starts the client's threads, and ThreadSanitizer cannot follow threads started after a fork of
  // a multi-threaded process (it stops the child); the admission logic this checks has no threads of its own.
  GTEST_SKIP() << "ThreadSanitizer does not support threads started in a forked child";
#endif
  // Fork before the server's threads exist; the child connects as uid 65534 when told to.
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const std::string path = temp_socket_path();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(go[1]);
    if (!read_byte(go[0], 60s)) _exit(2);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    auto c = Client::connect("shm://" + path);
    if (!c) _exit(4);
    if (!(*c)->server_status()) _exit(5);
    _exit(0);
  }
  close(go[0]);
  ShmServerOptions options;
  options.socket_path = path;
  options.socket_mode = 0666;
  options.admission = {/*max_clients=*/8, /*max_clients_per_uid=*/8, /*max_handshakes=*/8,
                       /*max_handshakes_per_uid=*/2};
  auto server = ShmServer::start(options, service_, handlers_);
  ASSERT_TRUE(server) << server.error().message;
  // Root's two handshake places are taken by silent connections: root's next client is refused...
  SilentPeer s1(path), s2(path);
  ASSERT_TRUE(eventually([&] { return (*server)->handshake_count() == 2; }));
  client::ClientOptions brief;
  brief.connect_timeout = 300ms;  // the client retries a busy refusal until then; the silent ones hold for 2 s
  auto mine = Client::connect("shm://" + path, brief);
  ASSERT_FALSE(mine);
  EXPECT_EQ(mine.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(mine.error().message.find("uid 0 already has 2 shm handshakes in progress"), std::string::npos)
      << mine.error().message;
  // ...while another uid connects and is served.
  ASSERT_EQ(write(go[1], "g", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the other uid's client failed (exit " << WEXITSTATUS(status) << ")";
  (*server)->stop();
  close(go[1]);
}

// A client killed with SIGKILL while its generations stream: the daemon closes its outbox and cancels its streams;
// chunks the engine delivers meanwhile must not be reported as a client that does not read its responses.
TEST(ShmServerKill, KilledClientIsNotReportedAsNotReading) {
  int go[2], ready[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(ready), 0);
  const std::string path = temp_socket_path();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(go[1]);
    close(ready[0]);
    if (!read_byte(go[0], 60s)) _exit(2);
    auto c = Client::connect("shm://" + path);
    if (!c) _exit(3);
    std::vector<std::thread> streams;
    std::atomic<int> chunks{0};
    for (int i = 0; i < 8; ++i) {
      streams.emplace_back([&] {
        v1::GenerateRequest req;
        req.set_text("x");
        req.set_max_tokens(100000000);
        (void)(*c)->generate(req, [&](const v1::GenerateChunk&) {
          if (chunks.fetch_add(1) == 800 && write(ready[1], "k", 1) != 1) _exit(5);
          return true;
        });
      });
    }
    for (auto& t : streams) t.join();
    _exit(0);
  }
  close(go[0]);
  close(ready[1]);
  LogCapture log;
  testing::FakeService service;
  service.forward_us = 2000;  // chunks keep coming for a while after the streams are cancelled
  RpcHandlers handlers(service);
  ShmServerOptions options;
  options.socket_path = path;
  auto server = ShmServer::start(options, service, handlers);
  ASSERT_TRUE(server) << server.error().message;
  ASSERT_EQ(write(go[1], "g", 1), 1);
  const bool streaming = read_byte(ready[0], 60s);
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(streaming) << "the client process did not get its generations going";
  ASSERT_TRUE(eventually([&] { return (*server)->client_count() == 0; }));
  ASSERT_TRUE(eventually([&] { return log.count("disconnected") == 1; })) << log.all();
  std::this_thread::sleep_for(200ms);  // chunks the engine still delivers to the cancelled streams
  EXPECT_EQ(log.count("not reading its responses"), 0u) << log.all();
  (*server)->stop();
  close(go[1]);
  close(ready[0]);
}

}  // namespace
}  // namespace kestrel::daemon
