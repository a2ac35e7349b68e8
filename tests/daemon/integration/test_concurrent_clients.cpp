// Integration: one kestreld, many clients at once. 8 client threads, half on gRPC (Unix socket) and half on shm,
// each with its own connection, run the greedy workloads of workload.h at the same time; every one must get exactly
// the tokens that the same workload gets when it runs alone (batching and transport do not change results).
// Also: the embedded default model (no --model) served to the `kestrel` CLI (status, generate, bench).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "tests/daemon/integration/daemon_process.h"
#include "tests/daemon/integration/workload.h"

namespace kestrel::itest {
namespace {

const std::string kGoldenModel = KESTREL_SOURCE_DIR "/tests/golden/fixtures/golden-qwen35moe/golden-qwen35moe.gguf";

TEST(ConcurrentClients, MixedTransportsMatchSoloRuns) {
  auto daemon = DaemonProcess::start(model_options(kGoldenModel));
  ASSERT_TRUE(daemon) << daemon.error().message;
  DaemonProcess& d = **daemon;
  constexpr int kClients = 8;

  // Alone: one workload at a time, over gRPC.
  std::vector<std::vector<int32_t>> solo(kClients);
  {
    auto c = d.connect_grpc();
    ASSERT_TRUE(c) << c.error().message;
    for (int i = 0; i < kClients; ++i) {
      auto r = run_workload(**c, i);
      ASSERT_TRUE(r) << "workload " << i << ": " << r.error().message;
      ASSERT_EQ(r->size(), 7u + 10u + 6u);
      solo[i] = *r;
    }
  }
  // Together: 8 threads, even ones on gRPC, odd ones on shm, each running its workload twice.
  std::vector<std::vector<std::vector<int32_t>>> together(kClients);
  std::vector<std::string> errors(kClients);
  std::vector<std::string> transports(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto c = (i % 2 == 0) ? d.connect_grpc() : d.connect_shm();
      if (!c) {
        errors[i] = c.error().message;
        return;
      }
      transports[i] = (*c)->transport();
      for (int rep = 0; rep < 2; ++rep) {
        auto r = run_workload(**c, i);
        if (!r) {
          errors[i] = r.error().message;
          return;
        }
        together[i].push_back(*r);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    ASSERT_EQ(errors[i], "") << "client " << i;
    EXPECT_EQ(transports[i], i % 2 == 0 ? "grpc-unix" : "shm");
    ASSERT_EQ(together[i].size(), 2u);
    for (const auto& run : together[i]) EXPECT_EQ(run, solo[i]) << "client " << i << " (" << transports[i] << ")";
  }
  // Different workloads really differ (the comparison above is not vacuous).
  EXPECT_NE(solo[0], solo[1]);

  auto c = d.connect_grpc();
  ASSERT_TRUE(c);
  auto st = (*c)->server_status();
  ASSERT_TRUE(st) << st.error().message;
  EXPECT_EQ(st->sessions(), 0u);
  EXPECT_GT(st->tokens_generated(), 0u);
  double seconds = 0;
  EXPECT_EQ(d.terminate(std::chrono::seconds(15), &seconds), 0) << d.log();
}

TEST(DefaultModel, CliStatusGenerateBench) {
  // No --model: kestreld makes the embedded tiny model in its cache folder (inside the test's folder).
  auto daemon = DaemonProcess::start(DaemonOptions{});
  ASSERT_TRUE(daemon) << daemon.error().message;
  DaemonProcess& d = **daemon;
  const std::string cli = KESTREL_CLI_PATH;

  auto [rc, out] = run_command({cli, "status", "--json", "--connect", d.grpc_uri()});
  ASSERT_EQ(rc, 0) << out;
  const auto status = nlohmann::json::parse(out);
  EXPECT_EQ(status["health"], "SERVING");
  EXPECT_EQ(status["model"]["architecture"], "qwen35moe");
  EXPECT_GT(status["model"]["n_vocab"].get<int>(), 1000);

  auto [rc_text, text] = run_command({cli, "status", "--connect", d.grpc_uri()});
  EXPECT_EQ(rc_text, 0) << text;
  EXPECT_NE(text.find("health:       SERVING"), std::string::npos) << text;
  EXPECT_NE(text.find("qwen35moe"), std::string::npos) << text;

  // The CLI's greedy generation equals the library's, on both transports.
  std::vector<int32_t> expected;
  {
    auto c = d.connect_grpc();
    ASSERT_TRUE(c) << c.error().message;
    v1::GenerateRequest req;
    req.set_text("Hello");
    req.set_max_tokens(8);
    req.set_ignore_eos(true);
    req.mutable_sampling()->set_temperature(0.0f);
    auto last = (*c)->generate(req, [&](const v1::GenerateChunk& ch) {
      expected.insert(expected.end(), ch.tokens().begin(), ch.tokens().end());
      return true;
    });
    ASSERT_TRUE(last) << last.error().message;
    EXPECT_EQ(last->finish_reason(), v1::FINISH_REASON_MAX_TOKENS);
  }
  ASSERT_EQ(expected.size(), 8u);
  for (const std::string& uri : {d.grpc_uri(), d.shm_uri()}) {
    auto [grc, gout] = run_command(
        {cli, "generate", "--connect", uri, "--prompt", "Hello", "-n", "8", "--ignore-eos", "--temp", "0", "--json"});
    ASSERT_EQ(grc, 0) << uri << ": " << gout;
    const auto j = nlohmann::json::parse(gout);
    EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), expected) << uri;
    EXPECT_EQ(j["finish_reason"], "max_tokens");
    EXPECT_EQ(j["completion_tokens"], 8);
  }
  // The embedded model carries Qwen3's chat template: `kestrel chat` renders with it (no --chat-template needed).
  EXPECT_NE(status["model"]["chat_template"].get<std::string>().find("<|im_start|>"), std::string::npos);
  auto [crc, cout] = run_command(
      {"/bin/sh", "-c",
       "printf 'Hi\\n' | '" + cli + "' chat --temp 0 -n 4 --no-think --no-history --connect " + d.grpc_uri()});
  EXPECT_EQ(crc, 0) << cout;
  EXPECT_FALSE(cout.empty());
  // Bad input through the CLI: one error line with the status, exit 1.
  auto [brc, bout] = run_command({cli, "generate", "--connect", d.grpc_uri(), "--tokens", "-5"}, true);
  EXPECT_EQ(brc, 1);
  EXPECT_NE(bout.find("kestrel: error: INVALID_ARGUMENT"), std::string::npos) << bout;
  // A usage error exits 2.
  EXPECT_EQ(run_command({cli, "generate", "--connect", d.grpc_uri()}, true).first, 2);

  auto [bench_rc, bench_out] =
      run_command({cli, "bench", "--connect", d.grpc_uri(), "-n", "20", "--warmup", "2", "--json"});
  ASSERT_EQ(bench_rc, 0) << bench_out;
  const auto b = nlohmann::json::parse(bench_out);
  ASSERT_EQ(b["results"].size(), 2u);
  EXPECT_EQ(b["results"][0]["transport"], "grpc-unix");
  EXPECT_EQ(b["results"][1]["transport"], "shm");
  for (const auto& r : b["results"]) {
    for (const char* call : {"step", "status"}) {
      EXPECT_GT(r[call]["p50_us"].get<double>(), 0.0) << call;
      EXPECT_LE(r[call]["p50_us"].get<double>(), r[call]["p99_us"].get<double>()) << call;
    }
  }
  EXPECT_EQ(d.terminate(std::chrono::seconds(15)), 0) << d.log();
}

TEST(Cli, ChatResetStartsOver) {
  auto daemon = DaemonProcess::start(model_options(kGoldenModel));
  ASSERT_TRUE(daemon) << daemon.error().message;
  DaemonProcess& d = **daemon;
  // The golden fixture models carry no chat template: without one the chat refuses to start, naming the fix.
  auto [no_rc, no_out] = run_command({KESTREL_CLI_PATH, "chat", "--connect", d.grpc_uri()}, true);
  EXPECT_EQ(no_rc, 1) << no_out;
  EXPECT_NE(no_out.find("carries no chat template"), std::string::npos) << no_out;
  EXPECT_NE(no_out.find("--chat-template"), std::string::npos) << no_out;
  const std::string chat = std::string("'") + KESTREL_CLI_PATH + "' chat --temp 0 -n 6 --no-history --connect " +
                           d.grpc_uri() + " --chat-template '" + KESTREL_SOURCE_DIR +
                           "/tests/data/chat_templates/qwen3.jinja'";
  // The same turn after /reset gets the same greedy answer: stdout is that answer twice, one line each.
  auto [rc, out] = run_command({"/bin/sh", "-c", "printf 'Hi there\\n/reset\\nHi there\\n' | " + chat});
  ASSERT_EQ(rc, 0) << out;
  ASSERT_FALSE(out.empty());
  ASSERT_EQ(out.size() % 2, 0u) << out;
  const std::string first = out.substr(0, out.size() / 2);
  EXPECT_EQ(out.substr(out.size() / 2), first);
  EXPECT_GT(first.size(), 1u);
  // Without /reset the second answer continues the conversation (the session holds both turns), so the output is
  // not the first answer twice.
  auto [rc2, out2] = run_command({"/bin/sh", "-c", "printf 'Hi there\\nHi there\\n/quit\\n' | " + chat});
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_EQ(out2.substr(0, first.size()), first);
  EXPECT_NE(out2, out);
  // The chat closed its session when it left.
  auto c = d.connect_grpc();
  ASSERT_TRUE(c);
  auto st = (*c)->server_status();
  ASSERT_TRUE(st);
  EXPECT_EQ(st->sessions(), 0u);
  EXPECT_EQ(d.terminate(std::chrono::seconds(15)), 0) << d.log();
}

}  // namespace
}  // namespace kestrel::itest
