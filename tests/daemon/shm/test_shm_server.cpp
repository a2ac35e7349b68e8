// Tests of the daemon's ShmServer driven by the shm Client (client/lib/shm_client.cpp) and by a raw test peer that
// writes garbage into its segment: every call over shm, concurrency, cancellation, errors as kestrel::Error with
// the gRPC status name, a dropped connection for a corrupt ring while other clients keep being served, and a
// SIGKILLed client process whose sessions are closed and whose segment leaves nothing behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "client/lib/client.h"
#include "daemon/server/rpc_handlers.h"
#include "daemon/shm/shm_server.h"
#include "fake_service.h"
#include "kestrel/shm/control_socket.h"
#include "kestrel/shm/spsc_ring.h"

namespace kestrel::daemon {
namespace {

using namespace std::chrono_literals;
using client::Client;

std::string temp_socket_path() {
  static std::atomic<int> n{0};
  return "/tmp/kestrel-shm-test-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".sock";
}

class ShmServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_ = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", log_));
    handlers_ = std::make_unique<RpcHandlers>(service_);
    ShmServerOptions options;
    options.socket_path = temp_socket_path();
    options.max_queued_response_bytes = 64 << 10;
    options.handshake_timeout = 2000ms;
    auto server = ShmServer::start(options, service_, *handlers_);
    ASSERT_TRUE(server) << server.error().message;
    server_ = std::move(server).value();
  }
  void TearDown() override {
    if (server_) server_->stop();
  }

  std::unique_ptr<Client> connect(client::ClientOptions options = {}) {
    auto c = Client::connect("shm://" + server_->socket_path(), options);
    EXPECT_TRUE(c) << c.error().message;
    return c ? std::move(c).value() : nullptr;
  }

  bool logged(const std::string& needle) {
    for (const std::string& line : log_->last_formatted()) {
      if (line.find(needle) != std::string::npos) return true;
    }
    return false;
  }

  // Waits up to 5 s for pred().
  static bool eventually(const std::function<bool()>& pred) {
    const auto end = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < end) {
      if (pred()) return true;
      std::this_thread::sleep_for(5ms);
    }
    return pred();
  }

  testing::FakeService service_;
  std::unique_ptr<RpcHandlers> handlers_;
  std::unique_ptr<ShmServer> server_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> log_;
};

// Checks one client with every operation; returns false (with gtest failures) when something is wrong.
void exercise_client(Client& c) {
  auto info = c.model_info();
  ASSERT_TRUE(info) << info.error().message;
  EXPECT_EQ(info->architecture(), "fake");
  EXPECT_EQ(info->n_vocab(), testing::FakeService::kVocab);
  auto session = c.create_session(v1::CreateSessionRequest{});
  ASSERT_TRUE(session) << session.error().message;
  v1::StepRequest step;
  step.set_session_id(session->session_id());
  step.add_tokens(10);
  step.add_tokens(41);
  auto r = c.step(step);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->token(), 42);
  EXPECT_EQ(r->n_past(), 2);
  v1::CloseSessionRequest close;
  close.set_session_id(session->session_id());
  ASSERT_TRUE(c.close_session(close));
}

TEST_F(ShmServerTest, EveryOperationRoundTrips) {
  auto c = connect();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->transport(), "shm");
  exercise_client(*c);

  v1::TokenizeRequest tok;
  tok.set_text("hi!");
  auto tokens = c->tokenize(tok);
  ASSERT_TRUE(tokens) << tokens.error().message;
  ASSERT_EQ(tokens->tokens_size(), 3);
  EXPECT_EQ(tokens->tokens(0), 'h');
  v1::DetokenizeRequest detok;
  detok.add_tokens('o');
  detok.add_tokens('k');
  auto text = c->detokenize(detok);
  ASSERT_TRUE(text) << text.error().message;
  EXPECT_EQ(text->text(), "ok");

  auto s = c->create_session(v1::CreateSessionRequest{});
  ASSERT_TRUE(s);
  v1::CloneSessionRequest clone;
  clone.set_session_id(s->session_id());
  auto s2 = c->clone_session(clone);
  ASSERT_TRUE(s2) << s2.error().message;
  EXPECT_NE(s2->session_id(), s->session_id());
  v1::ResetSessionRequest reset;
  reset.set_session_id(s2->session_id());
  ASSERT_TRUE(c->reset_session(reset));
  v1::AbortRequest abort;
  abort.set_session_id(s->session_id());
  auto aborted = c->abort(abort);
  ASSERT_TRUE(aborted) << aborted.error().message;
  EXPECT_FALSE(aborted->aborted());

  auto status = c->server_status();
  ASSERT_TRUE(status) << status.error().message;
  EXPECT_EQ(status->shm_clients(), 1u);
  EXPECT_EQ(status->sessions(), 2u);
  EXPECT_EQ(server_->client_count(), 1u);

  v1::GenerateRequest gen;
  gen.set_session_id(s->session_id());
  gen.mutable_tokens()->add_ids(1);
  gen.set_max_tokens(12);
  std::string streamed;
  auto last = c->generate(gen, [&](const v1::GenerateChunk& chunk) {
    streamed += chunk.text();
    return true;
  });
  ASSERT_TRUE(last) << last.error().message;
  EXPECT_EQ(streamed.size(), 12u);
  EXPECT_EQ(streamed.substr(0, 3), "bcd");
  EXPECT_EQ(last->finish_reason(), v1::FINISH_REASON_MAX_TOKENS);
  EXPECT_EQ(last->completion_tokens(), 12u);
}

// Prints the step round trip (client → daemon → engine thread → daemon → client) over the fake Service; checks only
// the answers (timing on a shared CI machine is not a test condition; bench/ measures it properly).
TEST_F(ShmServerTest, StepRoundTripTiming) {
  auto c = connect();
  ASSERT_TRUE(c);
  auto s = c->create_session(v1::CreateSessionRequest{});
  ASSERT_TRUE(s);
  std::vector<double> us;
  v1::StepRequest step;
  step.set_session_id(s->session_id());
  step.add_tokens(0);
  for (int i = 0; i < 2000; ++i) {
    step.set_tokens(0, i % 200);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c->step(step);
    const auto t1 = std::chrono::steady_clock::now();
    ASSERT_TRUE(r);
    ASSERT_EQ(r->token(), i % 200 + 1);
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  std::printf("shm step round trip over the fake Service: p50 %.1f us, p99 %.1f us (%zu steps)\n", us[us.size() / 2],
              us[us.size() * 99 / 100], us.size());
}

TEST_F(ShmServerTest, ErrorsCarryTheStatusNameAndCode) {
  auto c = connect();
  ASSERT_TRUE(c);
  v1::StepRequest step;
  step.set_session_id(987654);
  step.add_tokens(1);
  auto r = c->step(step);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kNotFound);
  EXPECT_EQ(r.error().message, "NOT_FOUND: session 987654 does not exist");
  step.set_session_id(1);
  step.set_tokens(0, -5);  // validated by RpcHandlers before the Service sees it
  r = c->step(step);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(r.error().message.starts_with("INVALID_ARGUMENT: ")) << r.error().message;
  v1::GenerateRequest gen;  // no prompt
  gen.set_max_tokens(3);
  auto g = c->generate(gen, [](const v1::GenerateChunk&) { return true; });
  ASSERT_FALSE(g);
  EXPECT_EQ(g.error().code, ErrorCode::kInvalidArgument);
  // The connection is still fine.
  exercise_client(*c);
}

TEST_F(ShmServerTest, OversizedRequestIsRefusedLocally) {
  auto c = connect();
  ASSERT_TRUE(c);
  v1::TokenizeRequest tok;
  tok.set_text(std::string(300 << 10, 'x'));
  auto r = c->tokenize(tok);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kResourceExhausted);
  exercise_client(*c);
}

TEST_F(ShmServerTest, ConcurrentCallsAreMultiplexed) {
  auto c = connect();
  ASSERT_TRUE(c);
  constexpr int kThreads = 6, kSteps = 150;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto s = c->create_session(v1::CreateSessionRequest{});
      if (!s) {
        ++bad;
        return;
      }
      for (int i = 0; i < kSteps; ++i) {
        v1::StepRequest step;
        step.set_session_id(s->session_id());
        step.add_tokens((t * 31 + i) % 200);
        auto r = c->step(step);
        if (!r || r->token() != (t * 31 + i) % 200 + 1 || r->n_past() != i + 1) ++bad;
        if (i % 50 == 0) {
          v1::GenerateRequest gen;
          gen.set_session_id(s->session_id());
          gen.mutable_tokens()->add_ids(3);
          gen.set_max_tokens(5);
          int chunks = 0;
          auto last = c->generate(gen, [&](const v1::GenerateChunk&) { return ++chunks > 0; });
          if (!last || chunks != 5) ++bad;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(service_.stats().sessions, static_cast<uint32_t>(kThreads));
}

TEST_F(ShmServerTest, CancellingAGenerationStopsIt) {
  service_.tick_ms = 2;
  auto c = connect();
  ASSERT_TRUE(c);
  v1::GenerateRequest gen;
  gen.set_text("x");
  gen.set_max_tokens(100000);
  int chunks = 0;
  auto last = c->generate(gen, [&](const v1::GenerateChunk&) { return ++chunks < 3; });
  ASSERT_FALSE(last);
  EXPECT_EQ(last.error().code, ErrorCode::kCancelled) << last.error().message;
  EXPECT_LT(chunks, 1000);
  exercise_client(*c);
}

TEST_F(ShmServerTest, ClientGoneClosesItsSessions) {
  auto other = connect();
  ASSERT_TRUE(other);
  auto keep = other->create_session(v1::CreateSessionRequest{});
  ASSERT_TRUE(keep);
  {
    auto c = connect();
    ASSERT_TRUE(c);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(c->create_session(v1::CreateSessionRequest{}));
    EXPECT_EQ(service_.stats().sessions, 4u);
  }
  EXPECT_TRUE(eventually([&] { return service_.stats().sessions == 1; }));
  EXPECT_TRUE(eventually([&] { return server_->client_count() == 1; }));
  exercise_client(*other);
}

TEST_F(ShmServerTest, DaemonStopFailsCallsWithUnavailable) {
  auto c = connect();
  ASSERT_TRUE(c);
  server_->stop();
  server_.reset();
  v1::StepRequest step;
  step.set_session_id(1);
  step.add_tokens(1);
  auto r = c->step(step);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kUnavailable);
  EXPECT_TRUE(r.error().message.starts_with("UNAVAILABLE: ")) << r.error().message;
}

TEST_F(ShmServerTest, ConnectToMissingSocketIsUnavailable) {
  auto c = Client::connect("shm:///tmp/kestrel-no-such-socket.sock");
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, ErrorCode::kUnavailable);
}

TEST(ShmServerLimits, ClientsOverTheLimitAreRefusedWithResourceExhausted) {
  testing::FakeService service;
  RpcHandlers handlers(service);
  ShmServerOptions options;
  options.socket_path = temp_socket_path();
  options.admission.max_clients = 1;
  auto server = ShmServer::start(options, service, handlers);
  ASSERT_TRUE(server) << server.error().message;
  auto first = Client::connect("shm://" + options.socket_path);
  ASSERT_TRUE(first) << first.error().message;
  // The first takes its client slot once the daemon has read its "mapped" message (a moment after connect returns).
  ASSERT_TRUE((*first)->server_status());
  EXPECT_EQ((*server)->client_count(), 1u);
  auto second = Client::connect("shm://" + options.socket_path);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, ErrorCode::kResourceExhausted);
  EXPECT_TRUE(second.error().message.starts_with("RESOURCE_EXHAUSTED: ")) << second.error().message;
  exercise_client(**first);
}

TEST(ShmServerLimits, StaleSocketFileIsReplacedAndOtherFilesAreNot) {
  testing::FakeService service;
  RpcHandlers handlers(service);
  ShmServerOptions options;
  options.socket_path = temp_socket_path();
  {
    auto server = ShmServer::start(options, service, handlers);
    ASSERT_TRUE(server);
  }
  // A socket file left by a crashed daemon (simulated: bind without unlink).
  auto stale = shm::listen_control_socket(options.socket_path, 0600);
  ASSERT_TRUE(stale);
  close(*stale);
  auto server = ShmServer::start(options, service, handlers);
  ASSERT_TRUE(server) << server.error().message;
  EXPECT_EQ(std::filesystem::status(options.socket_path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                std::filesystem::perms::group_read | std::filesystem::perms::group_write);
  (*server)->stop();
  EXPECT_FALSE(std::filesystem::exists(options.socket_path));
  // A regular file at the path is not removed.
  { std::ofstream(options.socket_path) << "not a socket"; }
  auto refused = ShmServer::start(options, service, handlers);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kFailedPrecondition);
  std::filesystem::remove(options.socket_path);
}

// ---- garbage from a raw peer -----------------------------------------------------------------------------------

// A peer that does the handshake by hand and then writes whatever a test wants into its segment.
struct RawPeer {
  int fd = -1;
  int segment_fd = -1;
  uint8_t* base = nullptr;
  shm::SegmentView view;
  shm::RingProducer requests;
  shm::RingConsumer responses;

  explicit RawPeer(const std::string& path) {
    auto s = shm::connect_control_socket(path);
    EXPECT_TRUE(s);
    fd = *s;
    auto hello = shm::recv_control(fd, &segment_fd, 5000ms);
    EXPECT_TRUE(hello) << hello.error().message;
    EXPECT_GE(segment_fd, 0);
    base = static_cast<uint8_t*>(mmap(nullptr, shm::kSegmentSize, PROT_READ | PROT_WRITE, MAP_SHARED, segment_fd, 0));
    EXPECT_NE(base, MAP_FAILED);
    view = shm::SegmentView{base};
    EXPECT_TRUE(shm::validate_segment_header(view, shm::kSegmentSize));
    EXPECT_TRUE(shm::send_control(fd, shm::make_control(shm::kControlMapped)));
    requests = shm::RingProducer(view.request_ring(), view.request_data());
    responses = shm::RingConsumer(view.response_ring(), view.response_data(), &view.request_ring()->bell);
  }
  ~RawPeer() {
    munmap(base, shm::kSegmentSize);
    close(segment_fd);
    close(fd);
  }
  void push(uint16_t kind, uint64_t id, const std::string& payload) {
    shm::RecordHeader h{};
    h.kind = kind;
    h.request_id = id;
    auto pushed = requests.push(h, {reinterpret_cast<const uint8_t*>(payload.data()), payload.size()});
    ASSERT_TRUE(pushed && *pushed);
  }
  // The next response within 5 s.
  std::optional<shm::Record> response() {
    shm::Record r;
    const auto end = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < end) {
      auto got = responses.pop(&r);
      if (!got) return std::nullopt;
      if (*got) return r;
      std::this_thread::sleep_for(1ms);
    }
    return std::nullopt;
  }
  // True once the daemon dropped the connection; *why gets the message it sent over the control socket.
  bool dropped(std::string* why) {
    auto msg = shm::recv_control(fd, nullptr, 5000ms);
    if (!msg || msg->type != shm::kControlRefused) return false;
    *why = msg->message;
    return shm::shm_load(view.header()->daemon_state) == shm::kStateClosed;
  }
};

TEST_F(ShmServerTest, UnknownKindAndBadPayloadGetErrorsAndTheConnectionLives) {
  RawPeer peer(server_->socket_path());
  peer.push(0x0777, 5, "");
  auto r = peer.response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header.kind, shm::kKindError);
  EXPECT_EQ(r->header.request_id, 5u);
  EXPECT_EQ(r->header.status, rpc_code::kInvalidArgument);
  EXPECT_NE(std::string(r->payload.begin(), r->payload.end()).find("unknown shm record kind"), std::string::npos);

  peer.push(shm::request_kind(shm::Op::kStep), 6, std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11));
  r = peer.response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header.kind, shm::kKindError);
  EXPECT_EQ(r->header.status, rpc_code::kInvalidArgument);

  // A valid request on the same connection still works.
  v1::CreateSessionRequest create;
  peer.push(shm::request_kind(shm::Op::kCreateSession), 7, create.SerializeAsString());
  r = peer.response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header.kind, shm::response_kind(shm::Op::kCreateSession));
  v1::SessionInfo info;
  EXPECT_TRUE(info.ParseFromArray(r->payload.data(), static_cast<int>(r->payload.size())));
  EXPECT_NE(info.session_id(), 0u);
  EXPECT_TRUE(logged("unknown kind"));
}

// Each corruption drops only the corrupt connection: the peer learns why, the log says so, its sessions are closed,
// and a well-behaved client connected all along keeps working.

class ShmGarbageTest : public ShmServerTest {
 protected:
  void check_dropped(const std::function<void(RawPeer&)>& corrupt, const std::string& reason) {
    auto good = connect();
    ASSERT_TRUE(good);
    const uint32_t sessions_before = service_.stats().sessions;
    {
      RawPeer peer(server_->socket_path());
      v1::CreateSessionRequest create;
      peer.push(shm::request_kind(shm::Op::kCreateSession), 1, create.SerializeAsString());
      ASSERT_TRUE(peer.response());
      EXPECT_EQ(service_.stats().sessions, sessions_before + 1);
      corrupt(peer);
      shm::ring_bell(peer.view.request_ring()->bell);
      std::string why;
      ASSERT_TRUE(peer.dropped(&why));
      EXPECT_NE(why.find(reason), std::string::npos) << why;
    }
    EXPECT_TRUE(eventually([&] { return service_.stats().sessions == sessions_before; }));
    EXPECT_TRUE(eventually([&] { return logged("connection dropped"); })) << "no log line about the dropped connection";
    exercise_client(*good);
  }
};

TEST_F(ShmGarbageTest, TruncatedRecord) {
  check_dropped(
      [](RawPeer& p) {
        shm::RecordHeader h{};
        h.total_size = 1000;  // but only 64 bytes are published
        h.kind = shm::request_kind(shm::Op::kStep);
        h.request_id = 2;
        const uint64_t head = p.requests.head();
        std::memcpy(p.view.request_data() + head % shm::kRingCapacity, &h, sizeof(h));
        shm::shm_store(p.view.request_ring()->head, head + 64);
      },
      "only 64 bytes were published");
}

TEST_F(ShmGarbageTest, HugeRecordSize) {
  check_dropped(
      [](RawPeer& p) {
        shm::RecordHeader h{};
        h.total_size = 0xFFFFFFF0u;
        h.kind = shm::request_kind(shm::Op::kGenerate);
        h.request_id = 2;
        const uint64_t head = p.requests.head();
        std::memcpy(p.view.request_data() + head % shm::kRingCapacity, &h, sizeof(h));
        shm::shm_store(p.view.request_ring()->head, head + 512);
      },
      "over the limit");
}

TEST_F(ShmGarbageTest, RandomBytes) {
  check_dropped(
      [](RawPeer& p) {
        std::mt19937 rng(7);
        const uint64_t head = p.requests.head();
        for (uint32_t i = 0; i < 4096; ++i) p.view.request_data()[(head + i) % shm::kRingCapacity] = rng() & 0xff;
        // Make the header's size field large (random bytes could by chance form a valid record).
        const uint32_t size = 0x7F000000u | (rng() & 0xffff);
        std::memcpy(p.view.request_data() + head % shm::kRingCapacity, &size, sizeof(size));
        shm::shm_store(p.view.request_ring()->head, head + 4096);
      },
      "shm ring corrupt");
}

TEST_F(ShmGarbageTest, CorruptHead) {
  check_dropped(
      [](RawPeer& p) { shm::shm_store(p.view.request_ring()->head, p.requests.head() + 3 * shm::kRingCapacity); },
      "producer published head");
}

TEST_F(ShmGarbageTest, CorruptTailOfTheResponseRing) {
  check_dropped(
      [](RawPeer& p) {
        shm::shm_store(p.view.response_ring()->tail, uint64_t{1} << 50);
        p.push(shm::request_kind(shm::Op::kGetModelInfo), 3, "");  // the daemon finds out when it answers
      },
      "consumer published tail");
}

TEST_F(ShmGarbageTest, SegmentCannotBeShrunk) {
  RawPeer peer(server_->socket_path());
  EXPECT_NE(ftruncate(peer.segment_fd, 4096), 0);  // sealed: the daemon's mapping can never SIGBUS
  EXPECT_EQ(errno, EPERM);
}

TEST_F(ShmServerTest, ClientThatNeverReadsGetsItsGenerationAborted) {
  RawPeer peer(server_->socket_path());
  v1::GenerateRequest gen;
  gen.set_text("x");
  gen.set_max_tokens(1000000);
  peer.push(shm::request_kind(shm::Op::kGenerate), 9, gen.SerializeAsString());
  // Never read: the response ring (1 MiB) and then the daemon-side queue (64 KiB in this test) fill up.
  ASSERT_TRUE(eventually([&] { return logged("not reading its responses"); }));
  // Reading now, the stream ends with RESOURCE_EXHAUSTED.
  shm::Record r;
  bool ended = false;
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (!ended && std::chrono::steady_clock::now() < end) {
    auto got = peer.responses.pop(&r);
    ASSERT_TRUE(got);
    if (!*got) {
      std::this_thread::sleep_for(1ms);
      continue;
    }
    if ((r.header.flags & shm::kFlagFinal) != 0) {
      ended = true;
      EXPECT_EQ(r.header.kind, shm::kKindError);
      EXPECT_EQ(r.header.status, rpc_code::kResourceExhausted);
    }
  }
  EXPECT_TRUE(ended);
}

// ---- a client process killed with SIGKILL ----------------------------------------------------------------------

std::set<std::string> dev_shm_entries() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) names.insert(e.path().filename());
  return names;
}

TEST(ShmKill, KilledClientLeavesNoSessionAndNoSegment) {
  // Fork first, while this process has no other threads; the child waits for the server to listen.
  int go[2], ready[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(ready), 0);
  const std::string path = temp_socket_path();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char b;
    if (read(go[0], &b, 1) != 1) _exit(2);
    auto c = Client::connect("shm://" + path);
    if (!c) _exit(3);
    for (int i = 0; i < 3; ++i) {
      if (!(*c)->create_session(v1::CreateSessionRequest{})) _exit(4);
    }
    if (write(ready[1], "k", 1) != 1) _exit(5);
    for (;;) pause();
  }
  const auto shm_before = dev_shm_entries();
  testing::FakeService service;
  RpcHandlers handlers(service);
  ShmServerOptions options;
  options.socket_path = path;
  auto server = ShmServer::start(options, service, handlers);
  ASSERT_TRUE(server) << server.error().message;
  ASSERT_EQ(write(go[1], "g", 1), 1);
  char b = 0;
  ASSERT_EQ(read(ready[0], &b, 1), 1);
  EXPECT_EQ(service.stats().sessions, 3u);
  EXPECT_EQ((*server)->client_count(), 1u);
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (service.stats().sessions != 0 && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(service.stats().sessions, 0u);
  EXPECT_GE(service.close_owned_calls(), 1u);
  while ((*server)->client_count() != 0 && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(5ms);
  EXPECT_EQ((*server)->client_count(), 0u);
  // Nothing new in /dev/shm (other processes may add their own entries: only kestrel names count).
  for (const std::string& name : dev_shm_entries()) {
    if (!shm_before.contains(name)) {
      EXPECT_EQ(name.find("kestrel"), std::string::npos) << name;
    }
  }
  (*server)->stop();
  for (int fd : {go[0], go[1], ready[0], ready[1]}) close(fd);
}

}  // namespace
}  // namespace kestrel::daemon
