// gpu/gdn_runs against gpu/gdn_decode (itself tested against the reference in test_gdn_decode): sessions with runs of
// 1 to 32 consecutive tokens, rows in a shuffled order, from random non-zero states, on the tiny presets' head shapes
// (qwen35 tiled, qwen3next grouped with ba and with the legacy ssm_in qkvz), the 35B-A3B shape (Kh 16, Vh 32, dk =
// dv = 128) and odd shapes (r = 3, dk 48 / dv 40, conv kernels 1 to 3). The oracle is gdn_decode called once per
// token (plain launches; test_cuda_engine compares runs with the engine's programmatic decode passes); gdn_runs must
// give the same bits — every output row, S and the conv
// history after the last token — whether a session's tokens come as one run or cut into pieces over several calls,
// with unused entries in the table, and on stacked input rows. Its workspace must come back zero. gdn_chunked (the
// chunked delta rule for one session's prompt) against gdn_runs over the same tokens: T = 1, 63, 64, 65, 300, 2048.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/kernels/gdn_chunked.h"
#include "gpu/kernels/gdn_decode.h"
#include "gpu/kernels/gdn_runs.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;

constexpr auto kTiled = HeadMapping::kTiled;
constexpr auto kGrouped = HeadMapping::kGrouped;
constexpr auto kBetaAlpha = ref::GdnProjection::kQkvGateBetaAlpha;
constexpr auto kBa = ref::GdnProjection::kQkvGateBa;
constexpr auto kSsmIn = ref::GdnProjection::kSsmInBa;

struct Shape {
  std::string name;
  int kh, vh, dk, dv, kernel;
  HeadMapping mapping;
  ref::GdnProjection proj;
};

ref::GdnDims dims_of(const Shape& s) {
  ref::GdnDims d;
  d.n_embd = 64;
  d.n_k_heads = s.kh;
  d.n_v_heads = s.vh;
  d.d_k = s.dk;
  d.d_v = s.dv;
  d.conv_kernel = s.kernel;
  d.eps = 1e-6f;
  d.mapping = s.mapping;
  return d;
}

std::vector<float> normal_vec(size_t n, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

void upload(float* dst, const std::vector<float>& src) {
  ASSERT_EQ(memcpy_synced(dst, src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
}

std::vector<float> download(const float* src, size_t n) {
  std::vector<float> v(n);
  EXPECT_EQ(memcpy_synced(v.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Sessions with lens[n] tokens each; token t of session n is row rows[n][t] of the pass's inputs, rows shuffled.
struct Problem {
  ref::GdnDims d;
  ref::GdnProjection proj = kBetaAlpha;
  std::vector<int> lens;
  std::vector<std::vector<int>> rows;
  int n_rows = 0;
  std::vector<float> conv1d, dt_bias, ssm_a, ssm_norm;
  std::vector<std::vector<float>> s0, conv0;
  std::vector<float> qkv, z, b, a, ba;  // [n_rows, width]
  size_t qkv_width() const { return static_cast<size_t>(proj == kSsmIn ? d.conv_dim() + d.value_dim() : d.conv_dim()); }
};

Problem make_problem(const Shape& s, std::vector<int> lens, unsigned seed, bool in_order = false) {
  std::mt19937 rng(seed);
  Problem p;
  p.d = dims_of(s);
  p.proj = s.proj;
  p.lens = std::move(lens);
  p.n_rows = std::accumulate(p.lens.begin(), p.lens.end(), 0);
  std::vector<int> perm(static_cast<size_t>(p.n_rows));
  std::iota(perm.begin(), perm.end(), 0);
  if (!in_order) std::shuffle(perm.begin(), perm.end(), rng);
  size_t at = 0;
  for (const int len : p.lens) {
    p.rows.emplace_back(perm.begin() + static_cast<std::ptrdiff_t>(at),
                        perm.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(len)));
    at += static_cast<size_t>(len);
  }
  const size_t C = static_cast<size_t>(p.d.conv_dim()), Vd = static_cast<size_t>(p.d.value_dim());
  const size_t Vh = static_cast<size_t>(s.vh), K = static_cast<size_t>(s.kernel), R = static_cast<size_t>(p.n_rows);
  p.conv1d = normal_vec(C * K, 0.5f, rng);
  p.dt_bias = normal_vec(Vh, 0.5f, rng);
  std::uniform_real_distribution<float> alog(-2.0f, 1.0f);
  p.ssm_a.resize(Vh);
  for (auto& x : p.ssm_a) x = -std::exp(alog(rng));
  p.ssm_norm = normal_vec(static_cast<size_t>(s.dv), 0.3f, rng);
  for (auto& x : p.ssm_norm) x += 1.0f;
  for (size_t n = 0; n < p.lens.size(); ++n) {
    p.s0.push_back(normal_vec(Vh * static_cast<size_t>(s.dk) * static_cast<size_t>(s.dv), 0.2f, rng));
    p.conv0.push_back(normal_vec(C * (K - 1), 1.0f, rng));
  }
  p.qkv = normal_vec(R * p.qkv_width(), 1.0f, rng);
  p.z = normal_vec(R * Vd, 1.0f, rng);
  p.b = normal_vec(R * Vh, 1.5f, rng);
  p.a = normal_vec(R * Vh, 2.0f, rng);
  p.ba = normal_vec(R * 2 * Vh, 2.0f, rng);
  return p;
}

struct Result {
  std::vector<float> out;  // [n_rows, Vd]
  std::vector<std::vector<float>> s, conv;
};

// The device side of a problem: weights, inputs (dense or stacked), one state slot per session, out, workspace.
class DeviceProblem {
 public:
  DeviceProblem(const Problem& p, bool stacked)
      : p_(p),
        s_elems_(static_cast<size_t>(p.d.n_v_heads) * p.d.d_k * p.d.d_v),
        c_elems_(static_cast<size_t>(p.d.conv_dim()) * (p.d.conv_kernel - 1)),
        states_((p.lens.size() * (s_elems_ + c_elems_ + 3) + 1) * sizeof(float)),
        conv1d_(p.conv1d.size() * 4),
        dt_(p.dt_bias.size() * 4),
        sa_(p.ssm_a.size() * 4),
        sn_(p.ssm_norm.size() * 4),
        out_(static_cast<size_t>(p.n_rows) * p.d.value_dim() * 4),
        ws_(gdn_runs_workspace_bytes(p.d, std::max(p.n_rows, 1))),
        slots_(static_cast<size_t>(p.n_rows) * sizeof(GdnSlot)) {
    const size_t R = static_cast<size_t>(p.n_rows), Vd = static_cast<size_t>(p.d.value_dim());
    const size_t Vh = static_cast<size_t>(p.d.n_v_heads), qw = p.qkv_width();
    const bool has_z = p.proj != kSsmIn, has_ab = p.proj == kBetaAlpha;
    upload(conv1d_.as<float>(), p.conv1d);
    upload(dt_.as<float>(), p.dt_bias);
    upload(sa_.as<float>(), p.ssm_a);
    upload(sn_.as<float>(), p.ssm_norm);
    w_ = GdnDecodeWeights{conv1d_.as<float>(), dt_.as<float>(), sa_.as<float>(), sn_.as<float>()};
    width_ = stacked ? qw + (has_z ? Vd : 0) + 2 * Vh : 0;
    if (stacked) {
      std::vector<float> h(R * width_);
      for (size_t r = 0; r < R; ++r) {
        float* row = h.data() + r * width_;
        std::copy_n(p.qkv.data() + r * qw, qw, row);
        size_t at = qw;
        if (has_z) std::copy_n(p.z.data() + r * Vd, Vd, row + at), at += Vd;
        if (has_ab) {
          std::copy_n(p.b.data() + r * Vh, Vh, row + at);
          std::copy_n(p.a.data() + r * Vh, Vh, row + at + Vh);
        } else {
          std::copy_n(p.ba.data() + r * 2 * Vh, 2 * Vh, row + at);
        }
      }
      inputs_.emplace_back(h.size() * 4);
      upload(inputs_.back().as<float>(), h);
      float* row0 = inputs_.back().as<float>();
      in_.qkv = row0;
      in_.z = has_z ? row0 + qw : nullptr;
      in_.b = has_ab ? row0 + qw + Vd : nullptr;
      in_.a = has_ab ? row0 + qw + Vd + Vh : nullptr;
      in_.ba = has_ab ? nullptr : row0 + qw + (has_z ? Vd : 0);
      in_.row_stride = static_cast<int>(width_);
    } else {
      for (const std::vector<float>* v : {&p.qkv, &p.z, &p.b, &p.a, &p.ba}) {
        inputs_.emplace_back(v->size() * 4);
        upload(inputs_.back().as<float>(), *v);
      }
      in_.qkv = inputs_[0].as<float>();
      if (has_z) in_.z = inputs_[1].as<float>();
      if (has_ab) {
        in_.b = inputs_[2].as<float>();
        in_.a = inputs_[3].as<float>();
      } else {
        in_.ba = inputs_[4].as<float>();
      }
    }
    // Session n's state at an odd float offset (off 16-byte boundaries), its GdnSlot at each of its rows.
    std::vector<GdnSlot> row_slots(R);
    for (size_t n = 0; n < p.lens.size(); ++n) {
      float* base = states_.as<float>() + 1 + n * (s_elems_ + c_elems_ + 3);
      session_slots_.push_back(GdnSlot{base, base + s_elems_});
      upload(base, p.s0[n]);
      upload(base + s_elems_, p.conv0[n]);
      for (const int r : p.rows[n]) row_slots[static_cast<size_t>(r)] = session_slots_.back();
    }
    EXPECT_EQ(memcpy_synced(slots_.as(), row_slots.data(), R * sizeof(GdnSlot), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(memset_synced(out_.as(), 0xFF, out_.bytes()), cudaSuccess);  // NaN until written
    EXPECT_EQ(memset_synced(ws_.as(), 0, ws_.bytes()), cudaSuccess);
  }

  // The oracle: gdn_decode once per token, session after session, each call's inputs the token's row. Plain launches:
  // a programmatic one loads the state before it waits for the launch before it, which here is the same session's
  // previous token (gdn_decode.h rules that out; the engine's passes never do it).
  void run_decode() {
    const size_t Vd = static_cast<size_t>(p_.d.value_dim()), Vh = static_cast<size_t>(p_.d.n_v_heads);
    DeviceBuffer one_slot(sizeof(GdnSlot));
    for (size_t n = 0; n < p_.lens.size(); ++n) {
      ASSERT_EQ(memcpy_synced(one_slot.as(), &session_slots_[n], sizeof(GdnSlot), cudaMemcpyHostToDevice), cudaSuccess);
      for (const int r : p_.rows[n]) {
        const size_t row = static_cast<size_t>(r);
        GdnDecodeInputs in = in_;
        if (width_ > 0) {
          const size_t off = row * width_;
          in.qkv += off;
          if (in.z != nullptr) in.z += off;
          if (in.b != nullptr) in.b += off, in.a += off;
          if (in.ba != nullptr) in.ba += off;
        } else {
          in.qkv += row * p_.qkv_width();
          if (in.z != nullptr) in.z += row * Vd;
          if (in.b != nullptr) in.b += row * Vh, in.a += row * Vh;
          if (in.ba != nullptr) in.ba += row * 2 * Vh;
        }
        const Status st = gdn_decode(p_.d, p_.proj, w_, in, static_cast<const GdnSlot*>(one_slot.as()), 1,
                                     out_.as<float>() + row * Vd, ws_.as(), stream_.get());
        ASSERT_TRUE(st) << st.error().to_string();
      }
      ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
    }
  }

  // gdn_runs over passes: pass k holds, for each session, its k-th piece of at most `piece` tokens (all of them
  // when piece is 0); the table has n_rows entries, the unused ones of length 0, the runs in a rotated order.
  void run_runs(int piece) {
    const int R = p_.n_rows;
    DeviceBuffer table(3 * static_cast<size_t>(R) * sizeof(int32_t));
    for (int k = 0;; ++k) {
      std::vector<int32_t> start(static_cast<size_t>(R), 0), len(static_cast<size_t>(R), 0), order;
      int entry = (k * 3) % R;
      for (size_t n = 0; n < p_.lens.size(); ++n) {
        const int size = piece > 0 ? piece : p_.lens[n];
        const int first = k * size;
        if (first >= p_.lens[n]) continue;
        const int count = std::min(size, p_.lens[n] - first);
        start[static_cast<size_t>(entry)] = static_cast<int32_t>(order.size());
        len[static_cast<size_t>(entry)] = count;
        for (int t = first; t < first + count; ++t) order.push_back(p_.rows[n][static_cast<size_t>(t)]);
        entry = (entry + 1) % R;
      }
      if (order.empty()) break;
      order.resize(static_cast<size_t>(R), -1);  // past the runs: never read
      std::vector<int32_t> host(start);
      host.insert(host.end(), len.begin(), len.end());
      host.insert(host.end(), order.begin(), order.end());
      ASSERT_EQ(memcpy_synced(table.as(), host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
                cudaSuccess);
      const int32_t* t0 = table.as<int32_t>();
      const GdnRunTable runs{t0, t0 + R, t0 + 2 * R};
      const Status st = gdn_runs(p_.d, p_.proj, w_, in_, static_cast<const GdnSlot*>(slots_.as()), runs, R,
                                 out_.as<float>(), ws_.as(), stream_.get());
      ASSERT_TRUE(st) << st.error().to_string();
      ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess);
      if (piece == 0) break;
    }
  }

  // gdn_chunked over the one session's rows (rows 0 .. n_rows − 1 in position order).
  void run_chunked() {
    ASSERT_EQ(p_.lens.size(), 1u);
    DeviceBuffer ws(gdn_chunked_workspace_bytes(p_.d, p_.n_rows));
    ASSERT_NE(ws.as(), nullptr);
    ASSERT_EQ(memset_synced(ws.as(), 0xFF, ws.bytes()), cudaSuccess);  // NaN: no reliance on a zeroed workspace
    const Status st =
        gdn_chunked(p_.d, p_.proj, w_, in_, session_slots_[0], p_.n_rows, out_.as<float>(), ws.as(), stream_.get());
    ASSERT_TRUE(st) << st.error().to_string();
    ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  }

  Result result() const {
    Result r;
    r.out = download(out_.as<float>(), static_cast<size_t>(p_.n_rows) * p_.d.value_dim());
    for (const GdnSlot& s : session_slots_) {
      r.s.push_back(download(s.s, s_elems_));
      r.conv.push_back(download(s.conv, c_elems_));
    }
    std::vector<unsigned char> ws(ws_.bytes(), 0xAB);
    EXPECT_EQ(memcpy_synced(ws.data(), ws_.as(), ws.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::count(ws.begin(), ws.end(), 0), static_cast<std::ptrdiff_t>(ws.size()))
        << "the workspace must come back zero";
    return r;
  }

 private:
  const Problem& p_;
  size_t s_elems_, c_elems_;
  DeviceBuffer states_, conv1d_, dt_, sa_, sn_, out_, ws_, slots_;
  std::deque<DeviceBuffer> inputs_;  // a deque: DeviceBuffer does not move
  GdnDecodeWeights w_;
  GdnDecodeInputs in_;
  size_t width_ = 0;
  std::vector<GdnSlot> session_slots_;
  test::DeviceStream stream_;
};

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// First differing index, for the failure message.
size_t first_diff(const std::vector<float>& x, const std::vector<float>& y) {
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) return i;
  }
  return std::min(x.size(), y.size());
}

void expect_same(const Result& got, const Result& want, const std::string& what) {
  EXPECT_TRUE(same_bits(got.out, want.out)) << what << ": output differs first at " << first_diff(got.out, want.out);
  for (size_t n = 0; n < want.s.size(); ++n) {
    EXPECT_TRUE(same_bits(got.s[n], want.s[n]))
        << what << ": S of session " << n << " differs first at " << first_diff(got.s[n], want.s[n]);
    EXPECT_TRUE(same_bits(got.conv[n], want.conv[n])) << what << ": conv history of session " << n;
  }
}

void check(const Shape& shape, const std::vector<int>& lens, bool stacked = false) {
  ASSERT_TRUE(gdn_runs_supported(dims_of(shape))) << shape.name;
  const Problem p = make_problem(shape, lens, 1234u + static_cast<unsigned>(lens.size()));
  const std::string what = shape.name + (stacked ? " (stacked rows)" : "");
  Result oracle;
  {
    DeviceProblem d(p, stacked);
    d.run_decode();
    oracle = d.result();
  }
  for (const int piece : {0, 3, 1}) {
    DeviceProblem d(p, stacked);
    d.run_runs(piece);
    expect_same(d.result(), oracle, what + ", gdn_runs in pieces of " + std::to_string(piece));
  }
}

TEST(GdnRuns, TinyPresetShapes) {
  KESTREL_REQUIRE_DEVICE();
  check({"tiny qwen35", 4, 8, 32, 32, 4, kTiled, kBetaAlpha}, {1, 5, 17, 2});
  check({"tiny qwen3next", 4, 8, 32, 32, 4, kGrouped, kBa}, {7, 1, 32});
  check({"tiny qwen3next legacy ssm_in", 4, 8, 32, 32, 4, kGrouped, kSsmIn}, {4, 9});
}

TEST(GdnRuns, Qwen35Moe35BShape) {
  KESTREL_REQUIRE_DEVICE();
  check({"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha}, {32});
  check({"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha}, {1, 1, 12, 3, 1, 6});
  check({"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha}, {5, 11}, /*stacked=*/true);
  check({"80B-A3B-like", 16, 32, 128, 128, 4, kGrouped, kBa}, {9, 2});
}

TEST(GdnRuns, OddShapes) {
  KESTREL_REQUIRE_DEVICE();
  check({"odd r=3", 3, 9, 48, 40, 3, kGrouped, kBa}, {6, 1, 4});
  check({"odd r=3 tiled", 3, 9, 48, 40, 3, kTiled, kBetaAlpha}, {2, 13}, /*stacked=*/true);
  check({"odd kernel 1", 1, 1, 8, 33, 1, kGrouped, kSsmIn}, {5, 3});
  check({"kernel 2", 2, 4, 40, 48, 2, kTiled, kBetaAlpha}, {8, 1});
}

// ---- gdn_chunked: the chunked delta rule for one session's prompt, against gdn_runs over the same tokens ----------

// max |got − want| / max |want| over a vector (NaN in got counts as infinite).
double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0.0, mag = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(double{got[i]} - double{want[i]});
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    mag = std::max(mag, std::fabs(double{want[i]}));
  }
  return diff / (mag + 1e-30);
}

// Tolerance: the chunked products and the recurrence add the same terms in different orders in f32; the reference's
// own chunked form agrees with its recurrent one to ~1e-5 relative (tests/core). The outputs and the state after the
// prompt are held to 2e-4 of their largest magnitude (measured values printed); the conv history is the same inputs
// moved, so bit-identical.
constexpr double kChunkTol = 2e-4;

void check_chunked(const Shape& shape, int n_tok, bool stacked = false) {
  ASSERT_TRUE(gdn_chunked_supported(dims_of(shape))) << shape.name;
  const Problem p = make_problem(shape, {n_tok}, 4321u + static_cast<unsigned>(n_tok), /*in_order=*/true);
  const std::string what = shape.name + " T " + std::to_string(n_tok) + (stacked ? " (stacked rows)" : "");
  Result oracle;
  {
    DeviceProblem d(p, stacked);
    d.run_runs(0);
    oracle = d.result();
  }
  DeviceProblem d(p, stacked);
  d.run_chunked();
  const Result got = d.result();
  const double e_out = rel_err(got.out, oracle.out);
  const double e_s = rel_err(got.s[0], oracle.s[0]);
  std::printf("  %s: out %.3g, state %.3g of their largest magnitude\n", what.c_str(), e_out, e_s);
  EXPECT_LE(e_out, kChunkTol) << what << ": outputs";
  EXPECT_LE(e_s, kChunkTol) << what << ": state after the prompt";
  EXPECT_TRUE(same_bits(got.conv[0], oracle.conv[0])) << what << ": conv history";
  DeviceProblem again(p, stacked);
  again.run_chunked();
  const Result r2 = again.result();
  EXPECT_TRUE(same_bits(r2.out, got.out) && same_bits(r2.s[0], got.s[0])) << what << ": a repeated run differs";
}

TEST(GdnChunked, Qwen35Moe35BShapeAgreesWithRuns) {
  KESTREL_REQUIRE_DEVICE();
  for (const int n : {1, 63, 64, 65, 300, 2048}) check_chunked({"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha}, n);
  check_chunked({"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha}, 130, /*stacked=*/true);
  check_chunked({"80B-A3B-like", 16, 32, 128, 128, 4, kGrouped, kBa}, 200);
}

TEST(GdnChunked, TinyAndOddShapesAgreeWithRuns) {
  KESTREL_REQUIRE_DEVICE();
  check_chunked({"tiny qwen35", 4, 8, 32, 32, 4, kTiled, kBetaAlpha}, 65);
  check_chunked({"tiny qwen3next legacy ssm_in", 4, 8, 32, 32, 4, kGrouped, kSsmIn}, 129);
  check_chunked({"odd r=3", 3, 9, 48, 40, 3, kGrouped, kBa}, 100);
  check_chunked({"odd kernel 1", 1, 1, 8, 33, 1, kGrouped, kSsmIn}, 70);
  check_chunked({"kernel 2, two tokens", 2, 4, 40, 48, 2, kTiled, kBetaAlpha}, 2);
}

TEST(GdnRuns, RefusesWhatItDoesNotServe) {
  // Heads the per-V-head kernel does not hold, and conv kernels past 4 taps: callers run a token per gdn_decode.
  EXPECT_FALSE(gdn_runs_supported(dims_of({"wide dk", 2, 4, 200, 72, 4, kTiled, kBetaAlpha})));
  EXPECT_FALSE(gdn_runs_supported(dims_of({"kernel 8", 2, 4, 40, 48, 8, kTiled, kBetaAlpha})));
  GdnDecodeTuning two;
  two.kernel = GdnKernel::kTwoKernel;
  EXPECT_FALSE(gdn_runs_supported(dims_of({"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha}), two));
  const ref::GdnDims wide = dims_of({"wide dk", 2, 4, 200, 72, 4, kTiled, kBetaAlpha});
  const Status st = gdn_runs(wide, kBetaAlpha, GdnDecodeWeights{}, GdnDecodeInputs{}, nullptr, GdnRunTable{}, 1,
                             nullptr, nullptr, nullptr);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ErrorCode::kUnsupported);
  const ref::GdnDims ok = dims_of({"tiny", 4, 8, 32, 32, 4, kTiled, kBetaAlpha});
  const Status bad = gdn_runs(ok, kBetaAlpha, GdnDecodeWeights{}, GdnDecodeInputs{}, nullptr, GdnRunTable{}, 1, nullptr,
                              nullptr, nullptr);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kestrel::gpu
