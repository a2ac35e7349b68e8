// itest_client: a client process for the integration tests that generates until it is killed.
//
//   itest_client URI generate   Generate on a temporary session (greedy, ignore_eos, long), again and again
//   itest_client URI steps      a session of its own, one-token Steps fed back, reset when full, again and again
//
// It prints "ready" (one line, flushed) once the first chunk or step has come back, so the test knows the daemon
// holds work for it, then goes on until killed. Any error: "error: <message>" and exit status 1.
#include <cstdio>
#include <cstring>
#include <string>

#include "client/lib/client.h"

using kestrel::client::Client;

int fail(const std::string& message) {
  std::printf("error: %s\n", message.c_str());
  std::fflush(stdout);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: itest_client URI generate|steps");
  auto c = Client::connect(argv[1]);
  if (!c) return fail(c.error().message);
  Client& client = **c;
  bool announced = false;
  auto announce = [&] {
    if (!announced) {
      std::puts("ready");
      std::fflush(stdout);
      announced = true;
    }
  };
  if (std::strcmp(argv[2], "generate") == 0) {
    kestrel::v1::GenerateRequest req;
    req.set_text("The daemon keeps serving while this client is killed.");
    req.set_max_tokens(100000);
    req.set_ignore_eos(true);
    req.set_n_ctx(4096);
    req.mutable_sampling()->set_temperature(0.0f);
    for (;;) {
      auto last = client.generate(req, [&](const kestrel::v1::GenerateChunk&) {
        announce();
        return true;
      });
      if (!last) return fail(last.error().message);
    }
  }
  if (std::strcmp(argv[2], "steps") == 0) {
    kestrel::v1::CreateSessionRequest create;
    create.set_n_ctx(4096);
    create.mutable_sampling()->set_temperature(0.0f);
    auto s = client.create_session(create);
    if (!s) return fail(s.error().message);
    kestrel::v1::StepRequest step;
    step.set_session_id(s->session_id());
    step.add_tokens(1);
    for (;;) {
      auto r = client.step(step);
      if (!r) return fail(r.error().message);
      announce();
      step.set_tokens(0, r->token());
      if (r->n_past() + 1 >= s->n_ctx()) {
        kestrel::v1::ResetSessionRequest reset;
        reset.set_session_id(s->session_id());
        if (auto rr = client.reset_session(reset); !rr) return fail(rr.error().message);
      }
    }
  }
  return fail(std::string("unknown mode ") + argv[2]);
}
