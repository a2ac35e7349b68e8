// Integration: every kind of bad input gets its documented status (docs/api.md "Status codes") on both transports,
// while a healthy client on another connection keeps generating the same greedy tokens as before, undisturbed.
// Also raw shared-memory peers (handshake by hand, proto/kestrel/shm): a truncated record or random bytes in the
// request ring make the daemon drop that connection only; a well-framed record with a garbage payload or an unknown
// kind is answered with an INVALID_ARGUMENT error record and that connection keeps serving. The shm clients count
// comes back down and everyone else goes on.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "kestrel/shm/control_socket.h"
#include "kestrel/shm/shm_layout.h"
#include "kestrel/shm/spsc_ring.h"
#include "kestrel/v1/kestrel.pb.h"
#include "tests/daemon/integration/daemon_process.h"
#include "tests/daemon/integration/workload.h"

namespace kestrel::itest {
namespace {

const std::string kGoldenModel = KESTREL_SOURCE_DIR "/tests/golden/fixtures/golden-qwen35moe/golden-qwen35moe.gguf";

// Runs workload 3 in a loop on its own connection until stopped; every result must equal `expected`.
class HealthyClient {
 public:
  HealthyClient(const DaemonProcess& d, std::vector<int32_t> expected) : expected_(std::move(expected)) {
    thread_ = std::thread([this, &d] {
      auto c = d.connect_grpc();
      if (!c) {
        error_ = c.error().message;
        return;
      }
      while (!stop_.load()) {
        auto r = run_workload(**c, 3);
        if (!r) {
          error_ = r.error().message;
          return;
        }
        if (*r != expected_) {
          error_ = "healthy client got different tokens";
          return;
        }
        ++runs_;
      }
    });
  }
  // Stops after at least one full run; returns the first problem ("" = none).
  std::string finish() {
    while (runs_.load() == 0 && error_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stop_.store(true);
    thread_.join();
    return error_;
  }
  int runs() const { return runs_.load(); }

 private:
  std::vector<int32_t> expected_;
  std::atomic<bool> stop_{false};
  std::atomic<int> runs_{0};
  std::string error_;
  std::thread thread_;
};

template <class T>
void expect_status(const Expected<T>& r, const std::string& status, const std::string& what) {
  ASSERT_FALSE(r.has_value()) << what << ": succeeded, expected " << status;
  EXPECT_EQ(status_name(r.error()), status) << what << ": " << r.error().message;
  EXPECT_GT(r.error().message.size(), status.size() + 4) << what << ": the message should say what was wrong";
}

Expected<v1::GenerateChunk> generate(client::Client& c, const v1::GenerateRequest& req) {
  return c.generate(req, [](const v1::GenerateChunk&) { return true; });
}

void check_bad_inputs(client::Client& c, int32_t n_vocab) {
  const std::string t = c.transport() + ": ";
  v1::CreateSessionRequest create;
  create.set_n_ctx(64);
  auto s = c.create_session(create);
  ASSERT_TRUE(s) << s.error().message;
  const uint64_t sid = s->session_id();

  v1::StepRequest step;
  step.set_session_id(sid);
  step.add_tokens(n_vocab);
  expect_status(c.step(step), "INVALID_ARGUMENT", t + "step with token id n_vocab");
  step.set_tokens(0, -1);
  expect_status(c.step(step), "INVALID_ARGUMENT", t + "step with token id -1");
  step.clear_tokens();
  expect_status(c.step(step), "INVALID_ARGUMENT", t + "step with no tokens");
  for (int i = 0; i < 65; ++i) step.add_tokens(1);
  expect_status(c.step(step), "OUT_OF_RANGE", t + "step of 65 tokens on a 64-token session");
  step.clear_tokens();
  step.add_tokens(1);
  step.set_top_logprobs(50);
  expect_status(c.step(step), "INVALID_ARGUMENT", t + "top_logprobs 50");
  step.set_top_logprobs(0);
  step.mutable_sampling()->set_temperature(-1.0f);
  expect_status(c.step(step), "INVALID_ARGUMENT", t + "temperature -1");
  step.mutable_sampling()->Clear();
  step.mutable_sampling()->set_top_p(0.0f);
  expect_status(c.step(step), "INVALID_ARGUMENT", t + "top_p 0");
  step.mutable_sampling()->Clear();
  step.set_session_id(sid + 1000003);
  expect_status(c.step(step), "NOT_FOUND", t + "step on an unknown session");
  v1::CloseSessionRequest close_unknown;
  close_unknown.set_session_id(sid + 1000003);
  expect_status(c.close_session(close_unknown), "NOT_FOUND", t + "close an unknown session");
  // After all that the session is untouched and works.
  step.set_session_id(sid);
  auto ok = c.step(step);
  ASSERT_TRUE(ok) << t << ok.error().message;
  EXPECT_EQ(ok->n_past(), 1);

  v1::GenerateRequest gen;
  gen.set_max_tokens(4);
  gen.set_text("");
  expect_status(generate(c, gen), "INVALID_ARGUMENT", t + "generate with an empty prompt");
  gen.mutable_tokens()->add_ids(-7);
  expect_status(generate(c, gen), "INVALID_ARGUMENT", t + "generate with token id -7");
  gen.mutable_tokens()->set_ids(0, n_vocab + 5);
  expect_status(generate(c, gen), "INVALID_ARGUMENT", t + "generate with token id past the vocabulary");
  gen.mutable_tokens()->set_ids(0, 1);
  gen.set_max_tokens(0);
  expect_status(generate(c, gen), "INVALID_ARGUMENT", t + "max_tokens 0");
  gen.set_max_tokens(4);
  gen.set_top_logprobs(50);
  expect_status(generate(c, gen), "INVALID_ARGUMENT", t + "generate top_logprobs 50");
  gen.set_top_logprobs(0);
  gen.mutable_sampling()->set_temperature(-1.0f);
  expect_status(generate(c, gen), "INVALID_ARGUMENT", t + "generate temperature -1");
  gen.mutable_sampling()->Clear();
  gen.set_session_id(sid + 1000003);
  expect_status(generate(c, gen), "NOT_FOUND", t + "generate on an unknown session");
  gen.set_session_id(0);
  gen.set_n_ctx(32);
  for (int i = 0; i < 40; ++i) gen.mutable_tokens()->add_ids(1);
  expect_status(generate(c, gen), "OUT_OF_RANGE", t + "41-token prompt on a 32-token temporary session");

  v1::CloseSessionRequest close;
  close.set_session_id(sid);
  EXPECT_TRUE(c.close_session(close));
}

TEST(BadInputs, DocumentedStatusWhileOthersAreServed) {
  auto daemon = DaemonProcess::start(model_options(kGoldenModel));
  ASSERT_TRUE(daemon) << daemon.error().message;
  DaemonProcess& d = **daemon;
  std::vector<int32_t> expected;
  int32_t n_vocab = 0;
  {
    auto c = d.connect_grpc();
    ASSERT_TRUE(c) << c.error().message;
    auto r = run_workload(**c, 3);
    ASSERT_TRUE(r) << r.error().message;
    expected = *r;
    auto mi = (*c)->model_info();
    ASSERT_TRUE(mi);
    n_vocab = mi->n_vocab();
  }
  HealthyClient healthy(d, expected);
  for (const bool shm : {false, true}) {
    auto c = shm ? d.connect_shm() : d.connect_grpc();
    ASSERT_TRUE(c) << c.error().message;
    check_bad_inputs(**c, n_vocab);
  }
  EXPECT_EQ(healthy.finish(), "");
  EXPECT_EQ(d.terminate(std::chrono::seconds(15)), 0) << d.log();
}

// A raw shm peer: handshake by hand, then write into the request ring what no honest client writes.
struct RawPeer {
  int sock = -1;
  uint8_t* base = nullptr;
  size_t size = 0;
  ~RawPeer() {
    if (base != nullptr) munmap(base, size);
    if (sock >= 0) close(sock);
  }
};

Status raw_connect(const std::string& control_path, RawPeer* p) {
  KESTREL_TRY_ASSIGN(p->sock, shm::connect_control_socket(control_path));
  int fd = -1;
  KESTREL_TRY_ASSIGN(const shm::ControlMessage hello, shm::recv_control(p->sock, &fd, std::chrono::seconds(5)));
  if (hello.type != shm::kControlHello || fd < 0) return make_error(ErrorCode::kInternal, "no hello with an fd");
  p->size = hello.segment_size;
  void* m = mmap(nullptr, p->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return make_error(ErrorCode::kIo, "mmap failed");
  p->base = static_cast<uint8_t*>(m);
  KESTREL_TRY(shm::validate_segment_header(shm::SegmentView{p->base}, p->size));
  shm::shm_store(shm::SegmentView{p->base}.header()->client_state, shm::kStateReady);
  return shm::send_control(p->sock, shm::make_control(shm::kControlMapped));
}

// Waits until the daemon ends the raw connection: EOF on the control socket or daemon_state closed.
bool wait_dropped(RawPeer& p, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (shm::shm_load(shm::SegmentView{p.base}.header()->daemon_state) == shm::kStateClosed) return true;
    int fd = -1;
    auto m = shm::recv_control(p.sock, &fd, std::chrono::milliseconds(50));
    if (fd >= 0) close(fd);
    if (!m && m.error().code == ErrorCode::kUnavailable) return true;
  }
  return false;
}

TEST(BadInputs, GarbageInTheShmRingDropsOnlyThatPeer) {
  auto daemon = DaemonProcess::start(model_options(kGoldenModel));
  ASSERT_TRUE(daemon) << daemon.error().message;
  DaemonProcess& d = **daemon;
  std::vector<int32_t> expected;
  auto probe = d.connect_grpc();
  ASSERT_TRUE(probe);
  {
    auto r = run_workload(**probe, 3);
    ASSERT_TRUE(r) << r.error().message;
    expected = *r;
  }
  const uint32_t shm_before = (*probe)->server_status()->shm_clients();
  HealthyClient healthy(d, expected);
  const std::string control = d.shm_uri().substr(std::strlen("shm://"));
  std::mt19937 rng(1234);

  {  // 1. A truncated record: the header promises 1000 bytes, the head publishes 40.
    RawPeer p;
    Status st = raw_connect(control, &p);
    ASSERT_TRUE(st) << st.error().message;
    shm::SegmentView v{p.base};
    shm::RecordHeader h{};
    h.total_size = 1000;
    h.kind = shm::request_kind(shm::Op::kStep);
    h.request_id = 1;
    std::memcpy(v.request_data(), &h, sizeof h);
    shm::shm_store(v.request_ring()->head, uint64_t{40});
    shm::ring_bell(v.request_ring()->bell);
    EXPECT_TRUE(wait_dropped(p, std::chrono::seconds(10))) << "truncated record: connection not dropped";
  }
  {  // 2. Random bytes over the first 4 KiB, published.
    RawPeer p;
    Status st = raw_connect(control, &p);
    ASSERT_TRUE(st) << st.error().message;
    shm::SegmentView v{p.base};
    for (size_t i = 0; i < 4096; ++i) v.request_data()[i] = static_cast<uint8_t>(rng());
    shm::shm_store(v.request_ring()->head, uint64_t{4096});
    shm::ring_bell(v.request_ring()->bell);
    EXPECT_TRUE(wait_dropped(p, std::chrono::seconds(10))) << "random bytes: connection not dropped";
  }
  {  // 3. Well-framed records the daemon cannot use: a Step whose payload is random bytes, then an unknown kind.
     // Each gets an INVALID_ARGUMENT error record and the connection goes on serving (a GetServerStatus after them).
    RawPeer p;
    Status st = raw_connect(control, &p);
    ASSERT_TRUE(st) << st.error().message;
    shm::SegmentView v{p.base};
    shm::RingProducer prod(v.request_ring(), v.request_data());
    shm::RingConsumer cons(v.response_ring(), v.response_data(), &v.request_ring()->bell);
    auto send = [&](uint16_t kind, uint64_t id, const std::vector<uint8_t>& payload) {
      shm::RecordHeader h{};
      h.kind = kind;
      h.request_id = id;
      auto pushed = prod.push(h, payload);
      return pushed && *pushed;
    };
    auto receive = [&](shm::Record* rec) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (std::chrono::steady_clock::now() < deadline) {
        auto got = cons.pop(rec);
        if (!got) return false;
        if (*got) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      return false;
    };
    std::vector<uint8_t> garbage(100);
    for (auto& b : garbage) b = static_cast<uint8_t>(rng());
    ASSERT_TRUE(send(shm::request_kind(shm::Op::kStep), 7, garbage));
    shm::Record rec;
    ASSERT_TRUE(receive(&rec)) << "no answer to a garbage Step payload";
    EXPECT_EQ(rec.header.kind, shm::kKindError);
    EXPECT_EQ(rec.header.request_id, 7u);
    EXPECT_EQ(rec.header.status, 3) << "expected INVALID_ARGUMENT (3)";
    ASSERT_TRUE(send(0x0042, 8, {}));
    ASSERT_TRUE(receive(&rec)) << "no answer to an unknown record kind";
    EXPECT_EQ(rec.header.kind, shm::kKindError);
    EXPECT_EQ(rec.header.request_id, 8u);
    EXPECT_EQ(rec.header.status, 3) << "expected INVALID_ARGUMENT (3)";
    std::string req;
    ASSERT_TRUE(v1::GetServerStatusRequest().SerializeToString(&req));
    ASSERT_TRUE(send(shm::request_kind(shm::Op::kGetServerStatus), 9, std::vector<uint8_t>(req.begin(), req.end())));
    ASSERT_TRUE(receive(&rec)) << "no answer to GetServerStatus after the bad records";
    EXPECT_EQ(rec.header.kind, shm::response_kind(shm::Op::kGetServerStatus));
    EXPECT_EQ(rec.header.request_id, 9u);
    v1::ServerStatus status;
    ASSERT_TRUE(status.ParseFromArray(rec.payload.data(), static_cast<int>(rec.payload.size())));
    EXPECT_TRUE(status.serving());
  }
  // Every raw connection is gone from the daemon's count; the healthy client never noticed.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  uint32_t shm_now = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    auto st = (*probe)->server_status();
    ASSERT_TRUE(st) << st.error().message;
    shm_now = st->shm_clients();
    if (shm_now == shm_before) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(shm_now, shm_before);
  EXPECT_EQ(healthy.finish(), "");
  auto after = run_workload(**probe, 3);
  ASSERT_TRUE(after) << after.error().message;
  EXPECT_EQ(*after, expected);
  EXPECT_EQ(d.terminate(std::chrono::seconds(15)), 0) << d.log();
}

}  // namespace
}  // namespace kestrel::itest
