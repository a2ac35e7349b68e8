// The shm fast path over the real Service (daemon/engine: reference engine on the golden-qwen35 fixture model):
// steps and a generation over shm give exactly what the in-process Service gives (greedy), and a client process
// killed with SIGKILL leaves the real Service with no session of it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "client/lib/client.h"
#include "daemon/server/rpc_handlers.h"
#include "daemon/shm/shm_server.h"
#include "tests/daemon/engine/engine_test_util.h"

namespace kestrel::daemon {
namespace {

using namespace std::chrono_literals;

std::string socket_path(const char* tag) {
  return "/tmp/kestrel-shm-real-" + std::to_string(getpid()) + "-" + tag + ".sock";
}

TEST(ShmRealService, StepsAndGenerateMatchTheInProcessService) {
  auto f = test::ServiceFixture::make("golden-qwen35", test::test_limits());
  ASSERT_TRUE(f.service);
  RpcHandlers handlers(*f.service);
  ShmServerOptions options;
  options.socket_path = socket_path("match");
  auto server = ShmServer::start(options, *f.service, handlers);
  ASSERT_TRUE(server) << server.error().message;
  auto c = client::Client::connect("shm://" + options.socket_path);
  ASSERT_TRUE(c) << c.error().message;

  const std::vector<int32_t> prompt = test::iota_tokens(6);
  // In process.
  auto local = f.service->create_session(SessionOptions{});
  ASSERT_TRUE(local);
  std::vector<int32_t> want;
  auto r = test::step_tokens(*f.service, local->id, prompt);
  ASSERT_TRUE(r) << r.error().message;
  want.push_back(r->token);
  for (int i = 0; i < 4; ++i) {
    r = test::step_tokens(*f.service, local->id, {want.back()});
    ASSERT_TRUE(r);
    want.push_back(r->token);
  }
  // Over shm.
  auto remote = (*c)->create_session(v1::CreateSessionRequest{});
  ASSERT_TRUE(remote) << remote.error().message;
  std::vector<int32_t> got;
  v1::StepRequest step;
  step.set_session_id(remote->session_id());
  for (int32_t t : prompt) step.add_tokens(t);
  for (int i = 0; i < 5; ++i) {
    auto s = (*c)->step(step);
    ASSERT_TRUE(s) << s.error().message;
    got.push_back(s->token());
    step.clear_tokens();
    step.add_tokens(s->token());
  }
  EXPECT_EQ(got, want);

  // Generate: a temporary session over shm against the same greedy continuation in process.
  auto sink = test::generate_sync(*f.service, test::gen_request(0, prompt, 5));
  ASSERT_TRUE(sink->result());
  v1::GenerateRequest gen;
  for (int32_t t : prompt) gen.mutable_tokens()->add_ids(t);
  gen.set_max_tokens(5);
  gen.set_ignore_eos(false);
  std::vector<int32_t> streamed;
  auto last = (*c)->generate(gen, [&](const v1::GenerateChunk& chunk) {
    streamed.insert(streamed.end(), chunk.tokens().begin(), chunk.tokens().end());
    return true;
  });
  ASSERT_TRUE(last) << last.error().message;
  EXPECT_EQ(streamed, sink->tokens());
  EXPECT_EQ(last->completion_tokens(), sink->tokens().size());
  (*server)->stop();
}

TEST(ShmRealService, KilledClientProcessLeavesNoSession) {
  int go[2], ready[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(ready), 0);
  const std::string path = socket_path("kill");
  const pid_t child = fork();  // before the Service starts its engine thread
  ASSERT_GE(child, 0);
  if (child == 0) {
    char b;
    if (read(go[0], &b, 1) != 1) _exit(2);
    auto c = client::Client::connect("shm://" + path);
    if (!c) _exit(3);
    for (int i = 0; i < 2; ++i) {
      auto s = (*c)->create_session(v1::CreateSessionRequest{});
      if (!s) _exit(4);
      v1::StepRequest step;
      step.set_session_id(s->session_id());
      step.add_tokens(5);
      if (!(*c)->step(step)) _exit(5);
    }
    if (write(ready[1], "k", 1) != 1) _exit(6);
    for (;;) pause();
  }
  auto f = test::ServiceFixture::make("golden-qwen35", test::test_limits());
  ASSERT_TRUE(f.service);
  RpcHandlers handlers(*f.service);
  ShmServerOptions options;
  options.socket_path = path;
  auto server = ShmServer::start(options, *f.service, handlers);
  ASSERT_TRUE(server) << server.error().message;
  const uint32_t before = f.service->stats().sessions;
  ASSERT_EQ(write(go[1], "g", 1), 1);
  char b = 0;
  ASSERT_EQ(read(ready[0], &b, 1), 1);
  EXPECT_EQ(f.service->stats().sessions, before + 2);
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (f.service->stats().sessions != before && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(f.service->stats().sessions, before);
  (*server)->stop();
  for (int fd : {go[0], go[1], ready[0], ready[1]}) close(fd);
}

}  // namespace
}  // namespace kestrel::daemon
