// `kestrel inspect` as a user runs it: on files the test writes (a small qwen35moe model with an MTP block and
// tokenizer metadata; a tied-output qwen35) it exits 0 and prints the key lines; on a corrupt file, a missing file
// or a file with a bad tensor it exits 1 with exactly one line "kestrel: error: <path>: <message>" on stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/core/model/model_test_util.h"

namespace kestrel {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `kestrel <args>` with stdout and stderr captured in files (args are single-quoted for the shell).
RunResult run_kestrel(const std::vector<std::string>& args) {
  const std::string out_path = ::testing::TempDir() + "kestrel_cli.out";
  const std::string err_path = ::testing::TempDir() + "kestrel_cli.err";
  std::string cmd = "'" KESTREL_CLI_PATH "'";
  for (const std::string& a : args) cmd += " '" + a + "'";
  cmd += " >'" + out_path + "' 2>'" + err_path + "'";
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_all(out_path);
  r.err = read_all(err_path);
  return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A qwen35moe model with one MTP block and a 96-token vocabulary in the metadata.
std::string write_moe_model() {
  ModelHparams hp = test::tiny_hparams(Arch::kQwen35Moe);
  hp.n_block = 5;
  hp.n_nextn = 1;
  test::Metadata md = test::hparams_metadata(hp);
  std::vector<std::string> tokens;
  for (uint32_t i = 0; i < hp.n_vocab; ++i) tokens.push_back("tok" + std::to_string(i));
  tokens.back() = "<|im_end|>";
  md.emplace_back("tokenizer.ggml.model", GgufValue::string("gpt2"));
  md.emplace_back("tokenizer.ggml.pre", GgufValue::string("qwen35"));
  md.emplace_back("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
  md.emplace_back("tokenizer.ggml.eos_token_id", GgufValue::u32(hp.n_vocab - 1));
  auto defs = test::model_tensors(hp);
  defs.push_back({"blk.4.attn_norm.weight", {hp.n_embd}, GgmlType::kF32});
  defs.push_back({"blk.4.nextn.eh_proj.weight", {2 * uint64_t{hp.n_embd}, hp.n_embd}, GgmlType::kF32});
  test::find_def(defs, "blk.0.attn_qkv.weight")->type = GgmlType::kF16;
  return test::write_gguf("cli_moe.gguf", md, defs);
}

TEST(CliInspect, DescribesAModel) {
  const std::string path = write_moe_model();
  ASSERT_FALSE(path.empty());
  const RunResult r = run_kestrel({"inspect", path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const std::string& line : {
           "file:         " + path,
           std::string("version 3, alignment 32"),
           std::string("architecture: qwen35moe"),
           std::string("layer kinds:  4 layers: 3 gated-deltanet, 1 full-attention (3)"),
           std::string("mtp:          1 block skipped (blk.4): 2 tensors"),
           std::string(
               "layout:       gdn inputs split attn_qkv + attn_gate + ssm_beta + ssm_alpha; output output.weight"),
           std::string("tokenizer:    model gpt2, pre qwen35, 96 tokens, eos 95 \"<|im_end|>\""),
           std::string("moe, 4 experts, 2 used, expert_ff 16, shared_expert_ff 32"),
           std::string("by type:"),
           std::string("    f16 "),
           std::string("by placement:"),
           std::string("    routed-experts "),
           std::string("  blk.3    full-attention"),
       }) {
    EXPECT_TRUE(contains(r.out, line)) << "missing '" << line << "' in:\n" << r.out;
  }
  // Compact by default: no per-tensor lines, no metadata.
  EXPECT_FALSE(contains(r.out, "blk.0.attn_qkv.weight")) << r.out;
  EXPECT_FALSE(contains(r.out, "metadata (")) << r.out;
}

TEST(CliInspect, TensorsAndMetadataFlags) {
  const std::string path = write_moe_model();
  ASSERT_FALSE(path.empty());
  const RunResult r = run_kestrel({"inspect", path, "--tensors", "--metadata"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "blk.0.attn_qkv.weight")) << r.out;
  EXPECT_TRUE(contains(r.out, "{64, 64}")) << r.out;
  EXPECT_TRUE(contains(r.out, "skipped (mtp)")) << r.out;
  EXPECT_TRUE(contains(r.out, "metadata (28 keys):")) << r.out;
  EXPECT_TRUE(contains(r.out, "tokenizer.ggml.tokens = [string x 96]")) << r.out;
  EXPECT_TRUE(contains(r.out, "qwen35moe.expert_count (u32) = 4")) << r.out;
}

TEST(CliInspect, TiedOutputModel) {
  const ModelHparams hp = test::tiny_hparams(Arch::kQwen35);
  LayoutOptions tied;
  tied.tied_output = true;
  const std::string path = test::write_gguf("cli_tied.gguf", test::hparams_metadata(hp), test::model_tensors(hp, tied));
  ASSERT_FALSE(path.empty());
  const RunResult r = run_kestrel({"inspect", path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "dense, feed_forward 48")) << r.out;
  EXPECT_TRUE(contains(r.out, "global (tied)")) << r.out;
  EXPECT_TRUE(contains(r.out, "; output tied to token_embd.weight")) << r.out;
  EXPECT_TRUE(contains(r.out, "mtp:          none")) << r.out;
  EXPECT_TRUE(contains(r.out, "tokenizer:    none in metadata")) << r.out;
}

void expect_one_error_line(const RunResult& r, const std::string& path, const std::string& message_part) {
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "");
  const std::string prefix = "kestrel: error: " + path + ": ";
  EXPECT_EQ(r.err.rfind(prefix, 0), 0u) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.back(), '\n');
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line:\n" << r.err;
  EXPECT_TRUE(contains(r.err, message_part)) << r.err;
  EXPECT_FALSE(contains(r.err.substr(prefix.size()), path + ": ")) << "path repeated: " << r.err;
}

TEST(CliInspect, CorruptFileIsOneErrorLine) {
  const std::string good = write_moe_model();
  ASSERT_FALSE(good.empty());
  std::string bytes = read_all(good);
  ASSERT_GT(bytes.size(), 64u);
  const std::string path = ::testing::TempDir() + "cli_corrupt.gguf";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));  // truncated
  }
  expect_one_error_line(run_kestrel({"inspect", path}), path, "");
  {
    std::ofstream f(path, std::ios::binary);
    f << "this is not a gguf file at all";
  }
  expect_one_error_line(run_kestrel({"inspect", path}), path, "");
}

TEST(CliInspect, MissingFileIsOneErrorLine) {
  const std::string path = ::testing::TempDir() + "does_not_exist.gguf";
  expect_one_error_line(run_kestrel({"inspect", path}), path, "");
}

TEST(CliInspect, BadWeightsListEveryProblem) {
  const ModelHparams hp = test::tiny_hparams(Arch::kQwen3Next);
  auto defs = test::model_tensors(hp);
  ASSERT_TRUE(test::erase_def(defs, "blk.2.ssm_a"));
  test::find_def(defs, "blk.0.ssm_norm.weight")->type = GgmlType::kF16;
  const std::string path = test::write_gguf("cli_bad.gguf", test::hparams_metadata(hp), defs);
  ASSERT_FALSE(path.empty());
  expect_one_error_line(run_kestrel({"inspect", path}), path,
                        "2 problems: blk.0.ssm_norm.weight has type f16, expected f32; missing blk.2.ssm_a");
}

TEST(CliInspect, PlanShowsWhereWeightsLiveAndRefusesASmallBudget) {
  const std::string path = write_moe_model();
  ASSERT_FALSE(path.empty());
  RunResult cpu_only = run_kestrel({"inspect", path, "--plan", "--host-bandwidth", "20"});
  EXPECT_EQ(cpu_only.exit_code, 0) << cpu_only.err;
  EXPECT_TRUE(contains(cpu_only.out, "placement plan (no GPU; host read 20.0 GB/s, given)")) << cpu_only.out;
  EXPECT_TRUE(contains(cpu_only.out, "routed experts     cpu")) << cpu_only.out;
  EXPECT_TRUE(contains(cpu_only.out, "predicted decode")) << cpu_only.out;

  RunResult hybrid = run_kestrel({"inspect", path, "--plan", "--gpu-memory", "1G", "--gpu-bandwidth", "3000",
                                  "--host-bandwidth", "20", "-o", "blk\\.0\\.=cpu"});
  EXPECT_EQ(hybrid.exit_code, 0) << hybrid.err;
  EXPECT_TRUE(contains(hybrid.out, "GPU read 3000 GB/s, given")) << hybrid.out;
  EXPECT_TRUE(contains(hybrid.out, "routed experts     gpu")) << hybrid.out;
  EXPECT_TRUE(contains(hybrid.out, "routed experts     cpu")) << hybrid.out;
  EXPECT_TRUE(contains(hybrid.out, "routed experts: 3 of 4 MoE layers wholly on the GPU, 0 split (none), 1 wholly"))
      << hybrid.out;

  expect_one_error_line(run_kestrel({"inspect", path, "--plan", "--gpu-memory", "1K", "--host-bandwidth", "20"}), path,
                        "cannot hold the weights that must live on the GPU");
  expect_one_error_line(run_kestrel({"inspect", path, "--plan", "--gpu-memory", "lots", "--host-bandwidth", "20"}),
                        path, "is not a byte size");
  expect_one_error_line(run_kestrel({"inspect", path, "--plan", "--n-cpu-moe", "2", "--host-bandwidth", "20"}), path,
                        "needs a GPU");
}

TEST(CliInspect, HelpListsInspect) {
  const RunResult r = run_kestrel({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "inspect")) << r.out;
  const RunResult none = run_kestrel({});
  EXPECT_NE(none.exit_code, 0);
}

}  // namespace
}  // namespace kestrel
