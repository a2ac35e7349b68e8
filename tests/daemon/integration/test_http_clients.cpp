// Integration: kestreld's OpenAI-compatible HTTP API (--http) with real clients, on the embedded default model (the
// real Qwen3 vocabulary and chat template).
//   - OpenAiSdk.*: the official OpenAI Node SDK (tests/daemon/integration/openai_sdk), registered as its own CTest
//     test when node and the SDK installed from package-lock.json are there (tools/setup-debian.sh runs npm ci).
//   - curl: bad JSON, wrong types, unknown fields, unsupported features, a huge body, a wrong API key, too many
//     concurrent streams: each a 4xx with OpenAI's error JSON and a message, while a gRPC client keeps generating the
//     same greedy tokens and HTTP keeps serving; a stream whose curl is killed frees its session; SIGTERM ends a
//     stream with an error event and [DONE], answers new requests 503, and kestreld exits 0.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/daemon/integration/daemon_process.h"
#include "tests/daemon/integration/workload.h"

namespace kestrel::itest {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Json = nlohmann::json;

const std::string kCurl = KESTREL_CURL_PATH;
const std::string kSdkDir = KESTREL_SOURCE_DIR "/tests/daemon/integration/openai_sdk";

// The port kestreld bound for --http 127.0.0.1:0 (its log says "HTTP listening on ... (port N)").
int http_port(const DaemonProcess& d) {
  std::smatch m;
  const std::string log = d.log();
  static const std::regex line(R"(HTTP listening on \S+ \(port (\d+)\))");
  return std::regex_search(log, m, line) ? std::stoi(m[1]) : -1;
}

struct CurlReply {
  int status = 0;  // HTTP status; -1 when curl failed
  std::string body;
};

// curl with `args`, the body and then the status on a line of its own.
CurlReply curl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kCurl, "-sS", "-o", "-", "-w", "\n%{http_code}", "--max-time", "60"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto [rc, out] = run_command(argv);
  const size_t nl = out.rfind('\n');
  if (rc != 0 || nl == std::string::npos) return CurlReply{-1, out};
  return CurlReply{std::stoi(out.substr(nl + 1)), out.substr(0, nl)};
}

class HttpClients : public ::testing::Test {
 protected:
  // `api_key`: the key the daemon is started with ("" = none).
  void start(int stop_timeout_s = 10, const std::string& api_key = "") {
    DaemonOptions o;
    o.stop_timeout_s = stop_timeout_s;
    o.extra_args = {"--http", "127.0.0.1:0", "--http-max-concurrent", "2", "--http-max-body-bytes", "65536"};
    if (!api_key.empty()) {
      o.extra_args.push_back("--http-api-key");
      o.extra_args.push_back(api_key);
    }
    auto d = DaemonProcess::start(o);
    ASSERT_TRUE(d) << d.error().message;
    daemon_ = std::move(*d);
    port_ = http_port(*daemon_);
    ASSERT_GT(port_, 0) << daemon_->log();
    const CurlReply models = curl({"-H", "Authorization: Bearer " + api_key, url("/v1/models")});
    ASSERT_EQ(models.status, 200) << models.body;
    model_ = Json::parse(models.body)["data"][0]["id"];
  }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
  CurlReply post(const std::string& path, const std::string& body, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"-H", "Content-Type: application/json", "--data-binary", body};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back(url(path));
    return curl(args);
  }
  // A streaming completion run by curl in the background, read line by line.
  std::unique_ptr<ChildProcess> stream(const std::string& body) {
    auto c = ChildProcess::spawn(
        {kCurl, "-sS", "-N", "-H", "Content-Type: application/json", "--data-binary", body, url("/v1/completions")});
    EXPECT_TRUE(c) << c.error().message;
    return c ? std::move(*c) : nullptr;
  }
  // The value of one sample of GET /metrics (-1 when absent).
  double metric(const std::string& sample) {
    const CurlReply r = curl({url("/metrics")});
    const size_t at = r.body.find("\n" + sample + " ");
    if (at == std::string::npos) return -1;
    return std::stod(r.body.substr(at + sample.size() + 2));
  }

  std::unique_ptr<DaemonProcess> daemon_;
  int port_ = -1;
  std::string model_;
};

void expect_error(const CurlReply& r, int status, const std::string& param, const std::string& words) {
  EXPECT_EQ(r.status, status) << r.body;
  const Json j = Json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  const Json& e = j["error"];
  EXPECT_TRUE(e["type"].is_string()) << r.body;
  EXPECT_EQ(e["param"].is_null() ? std::string() : e["param"].get<std::string>(), param) << r.body;
  EXPECT_NE(e["message"].get<std::string>().find(words), std::string::npos) << r.body;
}

TEST(OpenAiSdk, NodeClientAgainstKestreld) {
  DaemonOptions o;
  o.extra_args = {"--http", "127.0.0.1:0"};
  auto d = DaemonProcess::start(o);
  ASSERT_TRUE(d) << d.error().message;
  const int port = http_port(**d);
  ASSERT_GT(port, 0);
  const CurlReply models = curl({"http://127.0.0.1:" + std::to_string(port) + "/v1/models"});
  ASSERT_EQ(models.status, 200) << models.body;
  auto [rc, out] = run_command({KESTREL_NODE_PATH, kSdkDir + "/openai_sdk_test.mjs", "--base-url",
                                "http://127.0.0.1:" + std::to_string(port) + "/v1", "--model",
                                Json::parse(models.body)["data"][0]["id"].get<std::string>()},
                               /*merge_stderr=*/true);
  std::printf("%s", out.c_str());
  EXPECT_EQ(rc, 0) << out << "\nkestreld log:\n" << (*d)->log();
  EXPECT_EQ((*d)->terminate(seconds(15)), 0);
}

TEST_F(HttpClients, CurlErrorsWhileOthersAreServed) {
  start(10, "k3y");
  const std::vector<std::string> key = {"-H", "Authorization: Bearer k3y"};

  // A gRPC client generating throughout: the same greedy tokens every time.
  auto probe = daemon_->connect_grpc();
  ASSERT_TRUE(probe) << probe.error().message;
  auto expected = run_workload(**probe, 2);
  ASSERT_TRUE(expected) << expected.error().message;
  std::atomic<bool> stop{false};
  std::string healthy_error;
  std::atomic<int> healthy_runs{0};
  std::thread healthy([&] {
    auto c = daemon_->connect_grpc();
    while (c && !stop.load()) {
      auto r = run_workload(**c, 2);
      if (!r || *r != *expected) {
        healthy_error = r ? "different tokens" : r.error().message;
        return;
      }
      ++healthy_runs;
    }
  });

  const std::string ok = R"({"prompt": "Hello", "max_tokens": 4})";
  expect_error(post("/v1/completions", ok), 401, "", "API key");
  expect_error(post("/v1/completions", ok, {"-H", "Authorization: Bearer nope"}), 401, "", "Incorrect API key");
  expect_error(post("/v1/completions", R"({"prompt": "Hello", "max_tokens": )", key), 400, "", "not valid JSON");
  expect_error(post("/v1/completions", R"({"prompt": "Hello", "max_tokens": "four"})", key), 400, "max_tokens",
               "must be an integer");
  expect_error(post("/v1/completions", R"({"prompt": "Hello", "temperature": [1]})", key), 400, "temperature",
               "must be a number");
  expect_error(post("/v1/completions", R"({"prompt": "Hello", "max_tokenz": 4})", key), 400, "max_tokenz",
               "Unrecognized request argument");
  expect_error(post("/v1/completions", R"({"prompt": "Hello", "n": 4})", key), 400, "n", "one choice per request");
  expect_error(post("/v1/completions", R"({"prompt": "Hello", "logit_bias": {"1": 5}})", key), 400, "logit_bias",
               "not supported");
  expect_error(post("/v1/completions", R"({"prompt": [999999999]})", key), 400, "", "outside the vocabulary");
  expect_error(post("/v1/completions", R"({"prompt": "Hello", "model": "gpt-4"})", key), 404, "model",
               "does not exist");
  expect_error(post("/v1/completions", R"({"prompt": ")" + std::string(100000, 'x') + R"("})", key), 413, "",
               "at most 65536 bytes");
  expect_error(
      post("/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})", key),
      400, "messages[0].content[0].type", "text only");
  expect_error(post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{}]})", key),
               400, "tools", "cannot honour");
  expect_error(curl({"-X", "DELETE", url("/v1/completions")}), 405, "", "not allowed");
  expect_error(curl({url("/v1/embeddings")}), 404, "", "no route");

  const CurlReply good = post("/v1/completions", ok, key);
  EXPECT_EQ(good.status, 200) << good.body;
  EXPECT_EQ(Json::parse(good.body)["usage"]["completion_tokens"], 4);

  stop = true;
  healthy.join();
  EXPECT_EQ(healthy_error, "");
  EXPECT_GT(healthy_runs.load(), 0);
  EXPECT_EQ(metric("kestrel:request_failure_total{transport=\"http\",code=\"invalid_argument\"}"), 1.0)
      << "the id outside the vocabulary reached the Service; the other refusals never did";
  EXPECT_GE(metric("kestrel:request_success_total{transport=\"grpc\",finished_reason=\"length\"}"), 1.0);
}

TEST_F(HttpClients, TooManyConcurrentStreamsAnd429) {
  start();
  const std::string endless = R"({"prompt": "Once", "max_tokens": 100000, "ignore_eos": true, "stream": true})";
  std::vector<std::unique_ptr<ChildProcess>> streams;
  for (int i = 0; i < 2; ++i) {
    streams.push_back(stream(endless));
    ASSERT_NE(streams.back(), nullptr);
    std::string line;
    ASSERT_TRUE(streams.back()->read_line(&line, milliseconds(30000)));
    EXPECT_EQ(line.rfind("data: {", 0), 0u) << line;
  }
  expect_error(post("/v1/completions", endless), 429, "", "max_concurrent_requests");
  const CurlReply models = curl({url("/v1/models")});
  EXPECT_EQ(models.status, 200) << "other routes are served while the completions are full";
  EXPECT_EQ(metric("kestrel:num_requests_running{transport=\"http\"}"), 2.0);
  for (auto& s : streams) s->kill_now(SIGKILL);
  streams.clear();
  const std::string cancelled = "kestrel:request_failure_total{transport=\"http\",code=\"cancelled\"}";
  const auto deadline = std::chrono::steady_clock::now() + seconds(20);
  while ((metric("kestrel:num_sessions") != 0.0 || metric(cancelled) != 2.0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(metric("kestrel:num_sessions"), 0.0) << "killed streams free their sessions";
  EXPECT_EQ(metric(cancelled), 2.0);
  EXPECT_EQ(post("/v1/completions", R"({"prompt": "Once", "max_tokens": 2})").status, 200) << "slots are back";
}

TEST_F(HttpClients, StreamFormatWithUsage) {
  start();
  auto s = stream(R"({"prompt": "The kestrel", "max_tokens": 5, "ignore_eos": true, "stream": true,
                      "stream_options": {"include_usage": true}})");
  ASSERT_NE(s, nullptr);
  std::string out;
  EXPECT_EQ(s->wait(&out), 0);
  std::vector<std::string> data;
  size_t pos = 0;
  while (pos < out.size()) {
    const size_t end = out.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos) << out;
    data.push_back(out.substr(pos, end - pos));
    pos = end + 2;
  }
  ASSERT_GE(data.size(), 4u) << out;
  EXPECT_EQ(data.back(), "data: [DONE]");
  const Json usage = Json::parse(data[data.size() - 2].substr(6));
  EXPECT_EQ(usage["choices"], Json::array());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 5);
  const Json finish = Json::parse(data[data.size() - 3].substr(6));
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length");
}

TEST_F(HttpClients, SigtermEndsStreamsAndRefusesNewWork) {
  start(/*stop_timeout_s=*/2);
  auto s = stream(R"({"prompt": "Once", "max_tokens": 100000, "ignore_eos": true, "stream": true})");
  ASSERT_NE(s, nullptr);
  std::string line;
  ASSERT_TRUE(s->read_line(&line, milliseconds(30000)));
  int exit_status = -2;
  std::thread stopper([&] { exit_status = daemon_->terminate(seconds(20)); });
  std::this_thread::sleep_for(milliseconds(300));
  expect_error(post("/v1/completions", R"({"prompt": "late", "max_tokens": 2})"), 503, "", "draining");
  EXPECT_EQ(curl({url("/health")}).status, 503);
  std::string rest;
  EXPECT_EQ(s->wait(&rest), 0);
  stopper.join();
  EXPECT_EQ(exit_status, 0);
  EXPECT_NE(rest.find("shutting down"), std::string::npos) << rest.substr(rest.size() > 600 ? rest.size() - 600 : 0);
  EXPECT_NE(rest.find("data: [DONE]\n\n"), std::string::npos);
}

}  // namespace
}  // namespace kestrel::itest
