// Integration: requests that would make kestreld build a response far larger than themselves. A Detokenize of
// 4 MiB of the vocabulary's longest token would decode to hundreds of MB (and a few copies of that in RSS); it is
// refused with RESOURCE_EXHAUSTED before anything is built, on gRPC and on shm, and the daemon's peak RSS barely
// moves. Calls of a sensible size go on working on both transports.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/gguf/gguf_reader.h"
#include "core/tokenizer/tokenizer.h"
#include "kestrel/v1/kestrel.pb.h"
#include "tests/daemon/integration/daemon_process.h"
#include "tests/daemon/integration/workload.h"

namespace kestrel::itest {
namespace {

const std::string kGoldenModel = KESTREL_SOURCE_DIR "/tests/golden/fixtures/golden-qwen35moe/golden-qwen35moe.gguf";

// Peak resident set (VmHWM) of a process in bytes; 0 when unreadable.
uint64_t peak_rss_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// The id whose piece is longest, and that length.
std::pair<int32_t, size_t> longest_token(const std::string& model) {
  auto file = GgufFile::open(model);
  EXPECT_TRUE(file) << file.error().message;
  auto tok = Tokenizer::from_gguf(*file);
  EXPECT_TRUE(tok) << tok.error().message;
  std::pair<int32_t, size_t> best{0, 0};
  for (int32_t id = 0; id < tok->n_vocab(); ++id) {
    const size_t n = tok->token_bytes(id)->size();
    if (n > best.second) best = {id, n};
  }
  return best;
}

// A DetokenizeRequest of `id` repeated until the message is about `bytes` long.
v1::DetokenizeRequest detokenize_request(int32_t id, size_t bytes) {
  v1::DetokenizeRequest req;
  req.add_tokens(id);
  const size_t per_token = req.ByteSizeLong() - 2;  // tag and length byte of the packed field
  const size_t n = (bytes - 16) / per_token;
  req.mutable_tokens()->Reserve(static_cast<int>(n));
  for (size_t i = 1; i < n; ++i) req.add_tokens(id);
  return req;
}

TEST(ResourceLimits, HugeDetokenizeIsRefusedBeforeItIsBuilt) {
  const auto [id, piece] = longest_token(kGoldenModel);
  ASSERT_GE(piece, 16u) << "the fixture's vocabulary has no long token";
  auto daemon = DaemonProcess::start(model_options(kGoldenModel));
  ASSERT_TRUE(daemon) << daemon.error().message;
  DaemonProcess& d = **daemon;
  auto grpc = d.connect_grpc();
  ASSERT_TRUE(grpc) << grpc.error().message;
  ASSERT_TRUE((*grpc)->server_status());
  const uint64_t rss_before = peak_rss_bytes(d.pid());
  ASSERT_GT(rss_before, 0u);

  // Just under gRPC's 4 MiB request limit: ~1.4 M tokens, each `piece` bytes as text and again as raw bytes.
  const v1::DetokenizeRequest big = detokenize_request(id, (4u << 20) - 1024);
  const double would_be = 2.0 * static_cast<double>(big.tokens_size()) * static_cast<double>(piece);
  auto r = (*grpc)->detokenize(big);
  ASSERT_FALSE(r) << "a " << would_be / 1e6 << " MB response was built";
  EXPECT_EQ(r.error().code, ErrorCode::kResourceExhausted) << r.error().message;
  EXPECT_EQ(r.error().message.rfind("RESOURCE_EXHAUSTED: Detokenize: the " + std::to_string(big.tokens_size()) +
                                        " tokens decode to " +
                                        std::to_string(static_cast<size_t>(big.tokens_size()) * piece) + " bytes",
                                    0),
            0u)
      << r.error().message;
  EXPECT_NE(r.error().message.find("over the limit of 16777216 bytes per response"), std::string::npos)
      << r.error().message;
  const uint64_t rss_after = peak_rss_bytes(d.pid());
  // The request's own copies (the message, its parsed ids, the vector of ids) are ~15 MB; the response it asked for
  // would have been hundreds of MB.
  EXPECT_LT(rss_after - rss_before, uint64_t{64} << 20)
      << "peak RSS grew from " << rss_before / 1e6 << " MB to " << rss_after / 1e6 << " MB";

  // Over shm the record limit (256 KiB) is the smaller one, and is named.
  auto shm = d.connect_shm();
  ASSERT_TRUE(shm) << shm.error().message;
  auto s = (*shm)->detokenize(detokenize_request(id, 200000));
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kResourceExhausted) << s.error().message;
  EXPECT_NE(s.error().message.find("bytes per message on this transport (gRPC allows 16777216)"), std::string::npos)
      << s.error().message;

  // Reasonable calls still work on both, and the daemon serves on.
  v1::DetokenizeRequest small;
  for (int i = 0; i < 1000; ++i) small.add_tokens(id);
  auto ok = (*grpc)->detokenize(small);
  ASSERT_TRUE(ok) << ok.error().message;
  EXPECT_EQ(ok->raw().size(), 1000 * piece);
  auto ok_shm = (*shm)->detokenize(small);
  ASSERT_TRUE(ok_shm) << ok_shm.error().message;
  EXPECT_EQ(ok_shm->raw(), ok->raw());
  v1::TokenizeRequest text;
  for (int i = 0; i < 50000; ++i) text.mutable_text()->append("The quick brown fox. ");
  auto tokens = (*grpc)->tokenize(text);
  ASSERT_TRUE(tokens) << tokens.error().message;
  EXPECT_GT(tokens->tokens_size(), 0);
  auto work = run_workload(**grpc, 1);
  ASSERT_TRUE(work) << work.error().message;
  EXPECT_EQ(d.terminate(std::chrono::seconds(15)), 0) << d.log();
}

}  // namespace
}  // namespace kestrel::itest
