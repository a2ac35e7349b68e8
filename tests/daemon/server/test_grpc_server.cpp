// GrpcServer on a temporary Unix socket (and TCP on 127.0.0.1) in front of a fake Service, driven through
// libkestrel-client's gRPC transport and raw stubs: listeners and socket mode, health NOT_SERVING → SERVING →
// NOT_SERVING, the 4 MiB receive limit, requests that do not parse, deadline propagation, status codes and messages on
// the wire, Generate streaming with a slow reader, and cancellation reaching the engine.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "client/lib/client.h"
#include "daemon/server/grpc_server.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kestrel/v1/kestrel.grpc.pb.h"
#include "tests/daemon/scratch_dir.h"
#include "tests/daemon/server/fake_service.h"

// ThreadSanitizer cannot judge these tests: the system's gRPC, Abseil and Protobuf are not built with it, so the
// synchronization inside gRPC core is invisible and every call through grpc++'s inlined code reports races. The
// server's own concurrency (GenerateCall's state machine) synchronizes through std::mutex and atomics only.
#if defined(__SANITIZE_THREAD__)
#define KESTREL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KESTREL_TSAN 1
#endif
#endif

namespace kestrel::daemon {
namespace {

using testing::FakeService;

#ifdef KESTREL_TSAN
// Skips every test of this binary under ThreadSanitizer (the note above).
class SkipUnderTsan : public ::testing::Environment {
 public:
  void SetUp() override { GTEST_SKIP() << "gRPC is not built with ThreadSanitizer; its synchronization is invisible"; }
};
[[maybe_unused]] ::testing::Environment* const kSkipUnderTsan = ::testing::AddGlobalTestEnvironment(new SkipUnderTsan);
#endif

class GrpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.unix_socket_path = (dir_ / "k.sock").string();
    auto server = GrpcServer::create(handlers_, options_);
    ASSERT_TRUE(server) << server.error().to_string();
    server_ = std::move(server).value();
  }
  void TearDown() override {
    if (server_) server_->shutdown(Clock::now() + std::chrono::seconds(2));
  }

  std::unique_ptr<client::Client> connect(client::ClientOptions o = {}) {
    auto c = client::Client::connect("unix://" + options_.unix_socket_path, o);
    EXPECT_TRUE(c) << c.error().to_string();
    return c ? std::move(c).value() : nullptr;
  }

  std::shared_ptr<grpc::Channel> channel() {
    return grpc::CreateChannel("unix:" + options_.unix_socket_path, grpc::InsecureChannelCredentials());
  }

  grpc::health::v1::HealthCheckResponse::ServingStatus health(const std::string& service) {
    auto stub = grpc::health::v1::Health::NewStub(channel());
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    const grpc::Status s = stub->Check(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.status();
  }

  ::kestrel::test::ScratchDir dir_{"kestrel-grpc"};
  FakeService service_;
  RpcHandlers handlers_{service_};
  GrpcServerOptions options_;
  std::unique_ptr<GrpcServer> server_;
};

TEST_F(GrpcServerTest, SocketHasTheConfiguredMode) {
  struct stat st {};
  ASSERT_EQ(stat(options_.unix_socket_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  server_->shutdown(Clock::now());
  EXPECT_FALSE(std::filesystem::exists(options_.unix_socket_path));  // removed on shutdown
}

TEST_F(GrpcServerTest, HealthFollowsSetServing) {
  using HS = grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(health(""), HS::NOT_SERVING);
  EXPECT_EQ(health("kestrel.v1.Kestrel"), HS::NOT_SERVING);
  server_->set_serving(true);
  EXPECT_EQ(health(""), HS::SERVING);
  EXPECT_EQ(health("kestrel.v1.Kestrel"), HS::SERVING);
  server_->set_serving(false);  // draining
  EXPECT_EQ(health("kestrel.v1.Kestrel"), HS::NOT_SERVING);
}

TEST_F(GrpcServerTest, UnaryCallsRoundTrip) {
  auto c = connect();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->transport(), "grpc-unix");
  auto info = c->model_info();
  ASSERT_TRUE(info) << info.error().to_string();
  EXPECT_EQ(info->n_vocab(), FakeService::kVocab);

  v1::TokenizeRequest treq;
  treq.set_text("hey");
  auto toks = c->tokenize(treq);
  ASSERT_TRUE(toks);
  EXPECT_EQ(toks->tokens_size(), 3);

  auto session = c->create_session({});
  ASSERT_TRUE(session);
  v1::StepRequest sreq;
  sreq.set_session_id(session->session_id());
  sreq.add_tokens(10);
  auto step = c->step(sreq);
  ASSERT_TRUE(step) << step.error().to_string();
  EXPECT_EQ(step->token(), 11);
  EXPECT_EQ(step->n_past(), 1);

  v1::CloseSessionRequest close;
  close.set_session_id(session->session_id());
  EXPECT_TRUE(c->close_session(close));
  auto status = c->server_status();
  ASSERT_TRUE(status);
  EXPECT_EQ(status->sessions(), 0u);
}

TEST_F(GrpcServerTest, ErrorsCarryCodeAndStatusName) {
  auto c = connect();
  ASSERT_TRUE(c);
  v1::StepRequest sreq;
  sreq.set_session_id(42);
  sreq.add_tokens(1);
  auto r = c->step(sreq);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kNotFound);
  EXPECT_EQ(r.error().message, "NOT_FOUND: session 42 does not exist");

  v1::DetokenizeRequest dreq;
  dreq.add_tokens(999999);
  auto d = c->detokenize(dreq);
  ASSERT_FALSE(d);
  EXPECT_EQ(d.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(d.error().message,
            "INVALID_ARGUMENT: tokens: token id 999999 at index 0 is outside the vocabulary [0, 1000)");

  service_.fail_next(make_error(ErrorCode::kOutOfRange, "step would pass the context (4096 tokens)"));
  auto s = c->create_session({});
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(s.error().message, "OUT_OF_RANGE: step would pass the context (4096 tokens)");
}

TEST_F(GrpcServerTest, FiveMebibyteRequestIsResourceExhausted) {
  auto c = connect();
  ASSERT_TRUE(c);
  v1::TokenizeRequest req;
  req.set_text(std::string(5 * 1024 * 1024, 'a'));
  auto r = c->tokenize(req);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kResourceExhausted) << r.error().message;
  EXPECT_EQ(r.error().message.rfind("RESOURCE_EXHAUSTED: ", 0), 0u) << r.error().message;
  EXPECT_NE(r.error().message.find("larger than max"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("4194304"), std::string::npos) << r.error().message;
  // Just under the limit still works.
  req.set_text(std::string(4 * 1024 * 1024 - 64, 'a'));
  EXPECT_TRUE(c->tokenize(req));
}

// Bytes that are not the method's request message: INVALID_ARGUMENT with a message, for unary calls and for the
// Generate stream (grpc++'s generated handlers would answer UNIMPLEMENTED with an empty message).
TEST_F(GrpcServerTest, MalformedRequestBytesAreInvalidArgument) {
  grpc::GenericStub stub(channel());
  const std::string garbage("\x0f\x01\x02", 3);  // field 1 with wire type 7, which does not exist
  for (const char* method : {"Step", "Tokenize", "CreateSession", "GetModelInfo"}) {
    grpc::ClientContext ctx;
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, std::string("/kestrel.v1.Kestrel/") + method, grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status st) { done.set_value(std::move(st)); });
    const grpc::Status st = done.get_future().get();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method << ": " << st.error_message();
    EXPECT_NE(st.error_message().find("does not parse as a kestrel.v1."), std::string::npos)
        << method << ": " << st.error_message();
  }
  {  // A method the service does not have is gRPC's to answer (docs/api.md "What gRPC itself answers").
    grpc::ClientContext ctx;
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, "/kestrel.v1.Kestrel/NoSuchMethod", grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status st) { done.set_value(std::move(st)); });
    const grpc::Status st = done.get_future().get();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED) << st.error_message();
    EXPECT_EQ(st.error_message(), "") << "docs/api.md says gRPC answers an unknown method without a message";
  }
  // Generate: a generic stream sends the one request and half-closes, as a server-streaming client does.
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  auto call = stub.PrepareCall(&ctx, "/kestrel.v1.Kestrel/Generate", &cq);
  auto wait = [&cq] {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(wait());
  grpc::Slice slice(garbage);
  call->Write(grpc::ByteBuffer(&slice, 1), reinterpret_cast<void*>(2));
  wait();
  call->WritesDone(reinterpret_cast<void*>(3));
  wait();
  grpc::ByteBuffer chunk;
  call->Read(&chunk, reinterpret_cast<void*>(4));
  EXPECT_FALSE(wait()) << "no chunk for a request that does not parse";
  grpc::Status st;
  call->Finish(&st, reinterpret_cast<void*>(5));
  wait();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_EQ(st.error_message(),
            "the request does not parse as a kestrel.v1.GenerateRequest (malformed protobuf bytes, or a string "
            "field that is not UTF-8)");
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(GrpcServerTest, DeadlineReachesTheService) {
  client::ClientOptions o;
  o.timeout = std::chrono::milliseconds(3000);
  auto c = connect(o);
  ASSERT_TRUE(c);
  auto session = c->create_session({});
  ASSERT_TRUE(session);
  v1::StepRequest sreq;
  sreq.set_session_id(session->session_id());
  sreq.add_tokens(1);
  const auto before = Clock::now();
  ASSERT_TRUE(c->step(sreq));
  ASSERT_TRUE(service_.last_step.has_value());
  ASSERT_TRUE(service_.last_step->deadline.has_value());
  const auto left = *service_.last_step->deadline - before;
  EXPECT_GT(left, std::chrono::milliseconds(2000));
  EXPECT_LE(left, std::chrono::milliseconds(3100));

  // Without a timeout the Service gets no deadline.
  auto c2 = connect();
  ASSERT_TRUE(c2->step(sreq));
  EXPECT_FALSE(service_.last_step->deadline.has_value());
}

TEST_F(GrpcServerTest, GenerateDeadlineExceeded) {
  client::ClientOptions o;
  o.timeout = std::chrono::milliseconds(300);
  auto c = connect(o);
  ASSERT_TRUE(c);
  service_.token_delay = std::chrono::milliseconds(20);
  v1::GenerateRequest req;
  req.mutable_tokens()->add_ids(1);
  req.set_max_tokens(1000);
  auto r = c->generate(req, [](const v1::GenerateChunk&) { return true; });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kDeadlineExceeded) << r.error().message;
  service_.wait_idle();
  EXPECT_LT(service_.generate_tokens_emitted.load(), 100);  // the engine stopped long before max_tokens
}

TEST_F(GrpcServerTest, GenerateStreamsEveryChunkInOrder) {
  auto c = connect();
  ASSERT_TRUE(c);
  v1::GenerateRequest req;
  req.set_text("hello");
  req.set_max_tokens(500);  // produced faster than read: the server queues, the engine never waits
  std::string text;
  int chunks = 0;
  auto last = c->generate(req, [&](const v1::GenerateChunk& ch) {
    if (chunks == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ++chunks;
    text += ch.text();
    return true;
  });
  ASSERT_TRUE(last) << last.error().to_string();
  EXPECT_EQ(chunks, 501);  // 500 token chunks and the final one
  ASSERT_EQ(text.size(), 500u);
  for (size_t i = 0; i < text.size(); ++i) ASSERT_EQ(text[i], 'a' + static_cast<char>(i % 26)) << i;
  EXPECT_EQ(last->finish_reason(), v1::FINISH_REASON_MAX_TOKENS);
  EXPECT_EQ(last->prompt_tokens(), 5u);
  EXPECT_EQ(last->completion_tokens(), 500u);
}

TEST_F(GrpcServerTest, GenerateRefusedBeforeTheEngine) {
  auto c = connect();
  ASSERT_TRUE(c);
  v1::GenerateRequest req;
  req.set_text("x");
  int chunks = 0;
  auto r = c->generate(req, [&](const v1::GenerateChunk&) { return ++chunks > 0; });
  ASSERT_FALSE(r);
  EXPECT_EQ(chunks, 0);
  EXPECT_EQ(r.error().message, "INVALID_ARGUMENT: max_tokens must be > 0, got 0");
}

TEST_F(GrpcServerTest, CancellingGenerateStopsTheEngine) {
  auto c = connect();
  ASSERT_TRUE(c);
  service_.token_delay = std::chrono::milliseconds(5);
  v1::GenerateRequest req;
  req.mutable_tokens()->add_ids(1);
  req.set_max_tokens(10000);
  int chunks = 0;
  auto r = c->generate(req, [&](const v1::GenerateChunk&) { return ++chunks < 3; });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kCancelled);
  EXPECT_EQ(chunks, 3);
  service_.wait_idle();
  EXPECT_TRUE(service_.generate_saw_cancel);
  EXPECT_LT(service_.generate_tokens_emitted.load(), 10000);
}

TEST_F(GrpcServerTest, ShutdownEndsAnInFlightStream) {
  auto c = connect();
  ASSERT_TRUE(c);
  service_.token_delay = std::chrono::milliseconds(5);
  v1::GenerateRequest req;
  req.mutable_tokens()->add_ids(1);
  req.set_max_tokens(100000);
  std::atomic<int> chunks{0};
  std::thread reader([&] {
    auto r = c->generate(req, [&](const v1::GenerateChunk&) {
      ++chunks;
      return true;
    });
    EXPECT_FALSE(r);
  });
  while (chunks.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server_->shutdown(Clock::now() + std::chrono::milliseconds(50));  // cancels the stream; returns once it ended
  reader.join();
  service_.wait_idle();
  EXPECT_TRUE(service_.generate_saw_cancel);
}

TEST(GrpcServerListenTest, StaleSocketIsReplacedLiveOrRegularFileRefused) {
  ::kestrel::test::ScratchDir dir("kestrel-grpc");
  FakeService service;
  RpcHandlers handlers(service);
  GrpcServerOptions o;
  o.unix_socket_path = (dir / "s.sock").string();

  // A stale socket: bound, then its owner went away without unlinking.
  {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, o.unix_socket_path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    close(fd);
  }
  auto first = GrpcServer::create(handlers, o);
  ASSERT_TRUE(first) << first.error().to_string();

  // A second server on the live socket is refused.
  auto second = GrpcServer::create(handlers, o);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(second.error().message.find("another process is listening"), std::string::npos);
  (*first)->shutdown(Clock::now());

  // A regular file is never removed.
  std::ofstream(o.unix_socket_path) << "precious";
  auto third = GrpcServer::create(handlers, o);
  ASSERT_FALSE(third);
  EXPECT_EQ(third.error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(std::filesystem::exists(o.unix_socket_path));

  o.unix_socket_path = (dir / "missing/s.sock").string();
  auto fourth = GrpcServer::create(handlers, o);
  ASSERT_FALSE(fourth);
  EXPECT_NE(fourth.error().message.find("does not exist"), std::string::npos);
}

TEST(GrpcServerListenTest, TcpListenerAndCustomMode) {
  ::kestrel::test::ScratchDir dir("kestrel-grpc");
  FakeService service;
  RpcHandlers handlers(service);
  GrpcServerOptions o;
  o.unix_socket_path = (dir / "t.sock").string();
  o.unix_socket_mode = 0600;
  o.tcp_address = "127.0.0.1:0";
  auto server = GrpcServer::create(handlers, o);
  ASSERT_TRUE(server) << server.error().to_string();
  ASSERT_GT((*server)->tcp_port(), 0);
  struct stat st {};
  ASSERT_EQ(stat(o.unix_socket_path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  auto c = client::Client::connect("tcp://127.0.0.1:" + std::to_string((*server)->tcp_port()));
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ((*c)->transport(), "grpc-tcp");
  auto info = (*c)->model_info();
  ASSERT_TRUE(info);
  EXPECT_EQ(info->name(), "fake");
  (*server)->shutdown(Clock::now() + std::chrono::seconds(1));
}

TEST(GrpcClientTest, ConnectFailsWithUnavailable) {
  client::ClientOptions o;
  o.connect_timeout = std::chrono::milliseconds(200);
  auto c = client::Client::connect("unix:///tmp/kestrel-no-such-socket-xyz.sock", o);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(c.error().message.find("could not connect"), std::string::npos) << c.error().message;
}

}  // namespace
}  // namespace kestrel::daemon
