// gpu/gdn_decode against core/reference's recurrent GDN path (what ref::gdn_forward does with GdnMode::kRecurrent
// after the projections: gdn_deinterleave_qkvz / gdn_split_ba where they apply, gdn_conv_step, gdn_split_qkv,
// gdn_gates, delta_rule_step on the V-head's K-head, rms_norm_gated) for several sessions, three consecutive
// decode steps from random non-zero states, on the tiny presets' head shapes (qwen35 tiled, qwen3next grouped with
// ba and with the legacy ssm_in qkvz), the 35B-A3B shape (Kh 16, Vh 32, dk = dv = 128, tiled) and odd shapes (r = 3,
// dk 48 / dv 40, conv kernel 3; dk 200 / dv 72), each layout at 1 and 3 sessions, V-heads per K-head of 3 to 5 at
// dv 128, and heads larger than the per-V-head kernel holds. Every case runs on each kernel that can serve its shape
// (GdnDecodeTuning::kernel: the two-kernel path serves all). Sessions use slots in a shuffled order; the workspace
// must come back zero.
//
// Tolerance: per (session, V-head), |gpu − ref| <= 2e-5 · max|ref| over that head, for the output and for S and the
// conv history after the last step. The kernels differ from the reference only in summation order (column sums of
// S in 8 or 16 partial sums, L2/RMS statistics lane-strided and summed per warp / per column block) and in
// expf/log1pf (≤ 2 ulp), ~1e-6 relative. Repeated runs from the same state are bit-identical. Argument checks run
// without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/reference/delta_rule.h"
#include "core/reference/gdn_conv.h"
#include "core/reference/gdn_layout.h"
#include "core/reference/gdn_prepare.h"
#include "core/reference/norm.h"
#include "gpu/kernels/gdn_decode.h"
#include "gpu/kernels/gemv_imma.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;

constexpr double kTol = 2e-5;
constexpr int kSteps = 3;

void upload(float* dst, const std::vector<float>& src) {
  ASSERT_EQ(memcpy_synced(dst, src.data(), src.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
}

std::vector<float> download(const float* src, size_t n) {
  std::vector<float> v(n, std::nanf(""));
  EXPECT_EQ(memcpy_synced(v.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

std::vector<float> normal_vec(size_t n, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Case {
  std::string name;
  int kh, vh, dk, dv, kernel;
  HeadMapping mapping;
  ref::GdnProjection proj;
  int n_seq;
};

std::string case_name(const Case& c) {
  std::ostringstream os;
  os << c.name << " Kh " << c.kh << " Vh " << c.vh << " dk " << c.dk << " dv " << c.dv << " K " << c.kernel
     << (c.mapping == HeadMapping::kTiled ? " tiled" : " grouped") << " n_seq " << c.n_seq;
  return os.str();
}

ref::GdnDims dims_of(const Case& c) {
  ref::GdnDims d;
  d.n_embd = 64;
  d.n_k_heads = c.kh;
  d.n_v_heads = c.vh;
  d.d_k = c.dk;
  d.d_v = c.dv;
  d.conv_kernel = c.kernel;
  d.eps = 1e-6f;
  d.mapping = c.mapping;
  return d;
}

// Everything one run needs on the host.
struct Problem {
  ref::GdnDims d;
  ref::GdnProjection proj;
  int n_seq;
  std::vector<float> conv1d, dt_bias, ssm_a, ssm_norm;                          // layer weights
  std::vector<std::vector<float>> s0, conv0;                                    // per session initial state
  std::vector<float> qkv[kSteps], z[kSteps], b[kSteps], a[kSteps], ba[kSteps];  // per step, [n_seq, ...]
  int qkv_width() const { return proj == ref::GdnProjection::kSsmInBa ? d.conv_dim() + d.value_dim() : d.conv_dim(); }
};

Problem make_problem(const Case& c, unsigned seed) {
  std::mt19937 rng(seed);
  Problem p;
  p.d = dims_of(c);
  p.proj = c.proj;
  p.n_seq = c.n_seq;
  const size_t C = static_cast<size_t>(p.d.conv_dim()), Vd = static_cast<size_t>(p.d.value_dim());
  const size_t Vh = static_cast<size_t>(c.vh), K = static_cast<size_t>(c.kernel), N = static_cast<size_t>(c.n_seq);
  p.conv1d = normal_vec(C * K, 0.5f, rng);
  p.dt_bias = normal_vec(Vh, 0.5f, rng);
  std::uniform_real_distribution<float> alog(-2.0f, 1.0f);
  p.ssm_a.resize(Vh);
  for (auto& x : p.ssm_a) x = -std::exp(alog(rng));
  p.ssm_norm = normal_vec(static_cast<size_t>(c.dv), 0.3f, rng);
  for (auto& x : p.ssm_norm) x += 1.0f;
  for (size_t n = 0; n < N; ++n) {
    p.s0.push_back(normal_vec(Vh * static_cast<size_t>(c.dk) * static_cast<size_t>(c.dv), 0.2f, rng));
    p.conv0.push_back(normal_vec(C * (K - 1), 1.0f, rng));
  }
  for (int t = 0; t < kSteps; ++t) {
    p.qkv[t] = normal_vec(N * static_cast<size_t>(p.qkv_width()), 1.0f, rng);
    p.z[t] = normal_vec(N * Vd, 1.0f, rng);
    p.b[t] = normal_vec(N * Vh, 1.5f, rng);
    p.a[t] = normal_vec(N * Vh, 2.0f, rng);
    p.ba[t] = normal_vec(N * 2 * Vh, 2.0f, rng);
  }
  return p;
}

// Host result: outputs per step [n_seq, Vd], and the final states.
struct Result {
  std::vector<float> out[kSteps];
  std::vector<std::vector<float>> s, conv;
};

// The reference path of ref::gdn_forward (kRecurrent) after gdn_project, session by session.
Result run_reference(const Problem& p) {
  const ref::GdnDims& d = p.d;
  const size_t C = static_cast<size_t>(d.conv_dim()), Vd = static_cast<size_t>(d.value_dim());
  const size_t Kd = static_cast<size_t>(d.key_dim()), Vh = static_cast<size_t>(d.n_v_heads);
  const size_t dk = static_cast<size_t>(d.d_k), dv = static_cast<size_t>(d.d_v);
  const size_t W = static_cast<size_t>(p.qkv_width());
  Result r;
  for (int t = 0; t < kSteps; ++t) r.out[t].assign(static_cast<size_t>(p.n_seq) * Vd, 0.0f);
  for (int n = 0; n < p.n_seq; ++n) {
    ref::GdnState st;
    st.s = p.s0[static_cast<size_t>(n)];
    st.conv = p.conv0[static_cast<size_t>(n)];
    const size_t sn = static_cast<size_t>(n);
    for (int t = 0; t < kSteps; ++t) {
      std::vector<float> mixed(C), z(Vd), b(Vh), a(Vh);
      const float* row = p.qkv[t].data() + sn * W;
      if (p.proj == ref::GdnProjection::kSsmInBa) {
        ref::gdn_deinterleave_qkvz(d, row, mixed.data(), z.data());
      } else {
        std::copy(row, row + C, mixed.begin());
        std::copy(p.z[t].data() + sn * Vd, p.z[t].data() + (sn + 1) * Vd, z.begin());
      }
      if (p.proj == ref::GdnProjection::kQkvGateBetaAlpha) {
        std::copy(p.b[t].data() + sn * Vh, p.b[t].data() + (sn + 1) * Vh, b.begin());
        std::copy(p.a[t].data() + sn * Vh, p.a[t].data() + (sn + 1) * Vh, a.begin());
      } else {
        ref::gdn_split_ba(d, p.ba[t].data() + sn * 2 * Vh, b.data(), a.data());
      }
      std::vector<float> u(C), q(Kd), k(Kd), v(Vd), beta(Vh), g(Vh), o(Vd);
      ref::gdn_conv_step(p.conv1d.data(), d.conv_dim(), d.conv_kernel, mixed.data(), st.conv.data(), u.data());
      ref::gdn_split_qkv(d, u.data(), q.data(), k.data(), v.data());
      ref::gdn_gates(b.data(), a.data(), p.dt_bias.data(), p.ssm_a.data(), d.n_v_heads, beta.data(), g.data());
      for (int h = 0; h < d.n_v_heads; ++h) {
        const size_t kh = static_cast<size_t>(ref::gdn_k_head(d, h));
        const size_t hv = static_cast<size_t>(h) * dv;
        ref::delta_rule_step(q.data() + kh * dk, k.data() + kh * dk, v.data() + hv, g[static_cast<size_t>(h)],
                             beta[static_cast<size_t>(h)], d.d_k, d.d_v, st.head(d, h), o.data() + hv);
        ref::rms_norm_gated(o.data() + hv, z.data() + hv, p.ssm_norm.data(), d.d_v, d.eps,
                            r.out[t].data() + sn * Vd + hv);
      }
    }
    r.s.push_back(st.s);
    r.conv.push_back(st.conv);
  }
  return r;
}

// Runs the kSteps steps on the device for n_sets copies of the sessions' states (each from p's start) on one stream.
// Session n of set j lives in slot j·N + perm[n] of one state allocation, off 16-byte boundaries. chain == false: a
// host sync after each step. chain == true: no sync until the end; per step set 0 by a plain launch, then the other
// sets as programmatic dependents (gpu/kernels/pdl.cuh). A programmatic step loads its states before it waits, so a set
// is never written by the launch just before its own; the plain launch of set 0 waits for everything before it, so a
// set's previous step has completed by then. Returns each set's results.
// stacked: the inputs of each step as one [n_seq, W] buffer (qkv | z | b | a, or qkv | z | ba, or qkv | ba: the
// output of one GEMV over the stacked projections) with GdnDecodeInputs::row_stride = W. tuning: gdn_decode's.
// prepared: every step also writes its output's prepared form (out_prepared), checked here against
// gemv_imma_prepare_x of that output.
std::vector<Result> run_device_sets(const Problem& p, int n_sets, bool chain, bool stacked = false,
                                    const GdnDecodeTuning& tuning = {}, bool prepared = false) {
  const ref::GdnDims& d = p.d;
  const size_t C = static_cast<size_t>(d.conv_dim()), Vd = static_cast<size_t>(d.value_dim());
  const size_t Vh = static_cast<size_t>(d.n_v_heads), N = static_cast<size_t>(p.n_seq);
  const size_t sets = static_cast<size_t>(n_sets);
  const size_t s_elems = Vh * static_cast<size_t>(d.d_k) * static_cast<size_t>(d.d_v);
  const size_t c_elems = C * static_cast<size_t>(d.conv_kernel - 1);
  const size_t slot_elems = s_elems + c_elems + 3;  // +3: slots start off 16-byte boundaries
  std::vector<Result> r(sets);
  std::vector<size_t> perm(N);
  for (size_t n = 0; n < N; ++n) perm[n] = (n * 7 + 3) % N;  // 7 is coprime with every n_seq used
  DeviceBuffer states((sets * N * slot_elems + 1) * sizeof(float));
  DeviceBuffer slots(sets * N * sizeof(GdnSlot));
  DeviceBuffer conv1d(p.conv1d.size() * 4), dt(p.dt_bias.size() * 4), sa(p.ssm_a.size() * 4);
  DeviceBuffer sn(p.ssm_norm.size() * 4), out(kSteps * sets * N * Vd * 4);
  const size_t ws_bytes = gdn_decode_workspace_bytes(d, p.n_seq);
  DeviceBuffer ws(ws_bytes);
  // Every step's inputs at once (a chain runs without host syncs).
  const size_t qkv_n = p.qkv[0].size(), z_n = p.z[0].size(), b_n = p.b[0].size(), ba_n = p.ba[0].size();
  DeviceBuffer qkv(kSteps * qkv_n * 4), z(kSteps * z_n * 4), b(kSteps * b_n * 4), a(kSteps * b_n * 4);
  DeviceBuffer ba(kSteps * ba_n * 4);
  cudaStream_t stream = nullptr;
  if (states.as() == nullptr || ws.as() == nullptr || out.as() == nullptr ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    ADD_FAILURE() << "cudaMalloc or cudaStreamCreate failed";
    return r;
  }
  std::vector<GdnSlot> host_slots(sets * N);
  for (size_t j = 0; j < sets; ++j) {
    for (size_t n = 0; n < N; ++n) {
      float* base = states.as<float>() + 1 + (j * N + perm[n]) * slot_elems;
      host_slots[j * N + n] = GdnSlot{base, base + s_elems};
      upload(base, p.s0[n]);
      upload(base + s_elems, p.conv0[n]);
    }
  }
  EXPECT_EQ(memcpy_synced(slots.as(), host_slots.data(), host_slots.size() * sizeof(GdnSlot), cudaMemcpyHostToDevice),
            cudaSuccess);
  upload(conv1d.as<float>(), p.conv1d);
  upload(dt.as<float>(), p.dt_bias);
  upload(sa.as<float>(), p.ssm_a);
  upload(sn.as<float>(), p.ssm_norm);
  for (int t = 0; t < kSteps; ++t) {
    upload(qkv.as<float>() + t * qkv_n, p.qkv[t]);
    upload(z.as<float>() + t * z_n, p.z[t]);
    upload(b.as<float>() + t * b_n, p.b[t]);
    upload(a.as<float>() + t * b_n, p.a[t]);
    upload(ba.as<float>() + t * ba_n, p.ba[t]);
  }
  EXPECT_EQ(memset_synced(out.as(), 0xFF, kSteps * sets * N * Vd * 4), cudaSuccess);  // NaN until written
  EXPECT_EQ(memset_synced(ws.as(), 0, ws_bytes), cudaSuccess);                        // zero before the first call
  const GdnDecodeWeights w{conv1d.as<float>(), dt.as<float>(), sa.as<float>(), sn.as<float>()};
  auto out_of = [&](int t, size_t j) { return out.as<float>() + (static_cast<size_t>(t) * sets + j) * N * Vd; };
  // The stacked layout: per session row [qkv | z | b | a] (or [qkv | z | ba], [qkv | ba]).
  const bool has_z = p.proj != ref::GdnProjection::kSsmInBa, has_ab = p.proj == ref::GdnProjection::kQkvGateBetaAlpha;
  const size_t qw = static_cast<size_t>(p.qkv_width());
  const size_t W = qw + (has_z ? Vd : 0) + 2 * Vh;
  DeviceBuffer rows(stacked ? kSteps * N * W * 4 : 4);
  if (stacked) {
    for (int t = 0; t < kSteps; ++t) {
      std::vector<float> h(N * W);
      for (size_t n = 0; n < N; ++n) {
        float* row = h.data() + n * W;
        std::copy_n(p.qkv[t].data() + n * qw, qw, row);
        size_t at = qw;
        if (has_z) std::copy_n(p.z[t].data() + n * Vd, Vd, row + at), at += Vd;
        if (has_ab) {
          std::copy_n(p.b[t].data() + n * Vh, Vh, row + at);
          std::copy_n(p.a[t].data() + n * Vh, Vh, row + at + Vh);
        } else {
          std::copy_n(p.ba[t].data() + n * 2 * Vh, 2 * Vh, row + at);
        }
      }
      upload(rows.as<float>() + t * N * W, h);
    }
  }
  const uint64_t prep_bytes = prepared ? imma_x_bytes(static_cast<int64_t>(Vd), p.n_seq) : 0;
  EXPECT_TRUE(!prepared || prep_bytes > 0);
  DeviceBuffer preps(std::max<uint64_t>(kSteps * sets * prep_bytes, 16)), want_preps(preps.bytes());
  EXPECT_EQ(memset_synced(preps.as(), 0xA5, preps.bytes()), cudaSuccess);
  auto prep_of = [&](DeviceBuffer& buf, int t, size_t j) {
    return static_cast<uint8_t*>(buf.as()) + (static_cast<size_t>(t) * sets + j) * prep_bytes;
  };
  for (int t = 0; t < kSteps; ++t) {
    GdnDecodeInputs in;
    in.qkv = qkv.as<float>() + t * qkv_n;
    if (p.proj != ref::GdnProjection::kSsmInBa) in.z = z.as<float>() + t * z_n;
    if (p.proj == ref::GdnProjection::kQkvGateBetaAlpha) {
      in.b = b.as<float>() + t * b_n;
      in.a = a.as<float>() + t * b_n;
    } else {
      in.ba = ba.as<float>() + t * ba_n;
    }
    if (stacked) {
      float* row0 = rows.as<float>() + t * N * W;
      in.qkv = row0;
      in.z = has_z ? row0 + qw : nullptr;
      in.b = has_ab ? row0 + qw + Vd : nullptr;
      in.a = has_ab ? row0 + qw + Vd + Vh : nullptr;
      in.ba = has_ab ? nullptr : row0 + qw + (has_z ? Vd : 0);
      in.row_stride = static_cast<int>(W);
    }
    for (size_t j = 0; j < sets; ++j) {
      const Status s =
          gdn_decode(d, p.proj, w, in, static_cast<const GdnSlot*>(slots.as()) + j * N, p.n_seq, out_of(t, j), ws.as(),
                     stream, /*programmatic=*/chain && j > 0, tuning, prepared ? prep_of(preps, t, j) : nullptr);
      EXPECT_TRUE(s) << s.error().to_string();
    }
    if (!chain) {
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    }
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  std::vector<unsigned char> ws_after(ws_bytes, 0xAB);
  EXPECT_EQ(memcpy_synced(ws_after.data(), ws.as(), ws_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::count(ws_after.begin(), ws_after.end(), 0), static_cast<std::ptrdiff_t>(ws_bytes))
      << "gdn_decode must leave its workspace zero";
  if (prepared) {
    for (size_t j = 0; j < sets; ++j) {
      for (int t = 0; t < kSteps; ++t) {
        EXPECT_TRUE(
            gemv_imma_prepare_x(out_of(t, j), static_cast<int64_t>(Vd), p.n_seq, prep_of(want_preps, t, j), nullptr));
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_TRUE(test::download<uint8_t>(prep_of(preps, t, j), prep_bytes) ==
                    test::download<uint8_t>(prep_of(want_preps, t, j), prep_bytes))
            << "step " << t << " set " << j << ": the prepared output differs from gemv_imma_prepare_x's";
      }
    }
  }
  for (size_t j = 0; j < sets; ++j) {
    for (int t = 0; t < kSteps; ++t) r[j].out[t] = download(out_of(t, j), N * Vd);
    for (size_t n = 0; n < N; ++n) {
      r[j].s.push_back(download(host_slots[j * N + n].s, s_elems));
      r[j].conv.push_back(download(host_slots[j * N + n].conv, c_elems));
    }
  }
  return r;
}

// The kSteps steps of one set of states, plain launches, a host sync after each.
Result run_device(const Problem& p, const GdnDecodeTuning& tuning = {}) {
  return run_device_sets(p, 1, false, false, tuning).front();
}

// Compares per block of `block` elements (a head); reports the worst ratio err / (kTol · max|want| of the block)
// and the first element over the bound. Returns the number of elements over it.
int compare(const std::string& what, const std::vector<float>& got, const std::vector<float>& want, size_t block,
            const std::string& where, const std::string& index_note, double& case_worst) {
  if (got.size() != want.size()) {
    ADD_FAILURE() << what << ": size " << got.size() << " vs " << want.size();
    return 1;
  }
  int bad = 0;
  double worst = 0.0;
  size_t worst_at = 0;
  for (size_t b0 = 0; b0 < got.size(); b0 += block) {
    double scale = 0.0;
    for (size_t i = b0; i < b0 + block && i < got.size(); ++i) scale = std::max(scale, std::fabs(double{want[i]}));
    for (size_t i = b0; i < b0 + block && i < got.size(); ++i) {
      const double err = std::fabs(double{got[i]} - double{want[i]});
      const double ratio = err / (kTol * scale + 1e-30);
      if (!(ratio <= worst)) {
        worst = std::isnan(ratio) ? 1e30 : ratio;
        worst_at = i;
      }
      if (!(ratio <= 1.0)) {
        if (bad == 0) {
          ADD_FAILURE() << where << " " << what << ": first mismatch at flat index " << i << " (block " << i / block
                        << " = " << index_note << ", element " << i % block << ") got " << got[i] << " want " << want[i]
                        << " |err| " << err << " head max|ref| " << scale;
        }
        ++bad;
      }
    }
  }
  case_worst = std::max(case_worst, worst);
  if (bad > 0 || worst > 0.5) {
    std::printf("  %s %s: worst err = %.3g x tolerance at index %zu (got %.9g want %.9g), %d over\n", where.c_str(),
                what.c_str(), worst, worst_at, static_cast<double>(got[worst_at]), static_cast<double>(want[worst_at]),
                bad);
  }
  return bad;
}

bool bit_identical(const Result& x, const Result& y) {
  for (int t = 0; t < kSteps; ++t) {
    if (x.out[t].size() != y.out[t].size() || std::memcmp(x.out[t].data(), y.out[t].data(), x.out[t].size() * 4) != 0) {
      return false;
    }
  }
  for (size_t n = 0; n < x.s.size(); ++n) {
    if (std::memcmp(x.s[n].data(), y.s[n].data(), x.s[n].size() * 4) != 0) return false;
    if (std::memcmp(x.conv[n].data(), y.conv[n].data(), x.conv[n].size() * 4) != 0) return false;
  }
  return true;
}

// A tuning that forces gdn_decode onto `kernel` wherever it serves the shape.
GdnDecodeTuning forced(GdnKernel kernel) {
  GdnDecodeTuning t;
  t.kernel = kernel;
  return t;
}

constexpr GdnKernel kKernels[] = {GdnKernel::kPerHead, GdnKernel::kTwoKernel};

// Whether gdn_decode, forced onto `kernel`, can run the problem's shape on it.
bool serves(GdnKernel kernel, const ref::GdnDims& d) {
  const Expected<GdnKernel> k = gdn_decode_kernel(d, forced(kernel));
  EXPECT_TRUE(k) << k.error().to_string();
  return k && *k == kernel;
}

void check_kernel(const Case& c, const Problem& p, const Result& want, GdnKernel kernel) {
  const std::string where = case_name(c) + " on " + gdn_kernel_name(kernel);
  SCOPED_TRACE(where);
  const Result got = run_device(p, forced(kernel));
  if (got.s.size() != want.s.size()) return;
  const size_t dv = static_cast<size_t>(c.dv);
  int bad = 0;
  double worst = 0.0;
  for (int t = 0; t < kSteps; ++t) {
    bad +=
        compare("output step " + std::to_string(t), got.out[t], want.out[t], dv, where, "session * Vh + v-head", worst);
  }
  for (size_t n = 0; n < want.s.size(); ++n) {
    bad += compare("state S of session " + std::to_string(n), got.s[n], want.s[n], static_cast<size_t>(c.dk) * dv,
                   where, "v-head; element = i * dv + j", worst);
    bad += compare("conv history of session " + std::to_string(n), got.conv[n], want.conv[n], want.conv[n].size(),
                   where, "whole history; element = channel * (K-1) + i", worst);
  }
  std::printf("  %s: worst error %.3g x tolerance, %d over\n", where.c_str(), worst, bad);
  EXPECT_EQ(bad, 0);
  const Result again = run_device(p, forced(kernel));
  EXPECT_TRUE(bit_identical(got, again)) << "repeated run differs";
}

// The case on every kernel that serves its shape (the two-kernel path serves all).
void check_case(const Case& c) {
  SCOPED_TRACE(case_name(c));
  const Problem p = make_problem(c, 1234u + static_cast<unsigned>(c.dk * 7 + c.vh + c.n_seq));
  const Result want = run_reference(p);
  for (const GdnKernel kernel : kKernels) {
    if (serves(kernel, p.d)) check_kernel(c, p, want, kernel);
  }
}

constexpr auto kTiled = HeadMapping::kTiled;
constexpr auto kGrouped = HeadMapping::kGrouped;
constexpr auto kBetaAlpha = ref::GdnProjection::kQkvGateBetaAlpha;
constexpr auto kBa = ref::GdnProjection::kQkvGateBa;
constexpr auto kSsmIn = ref::GdnProjection::kSsmInBa;

TEST(GdnDecode, TinyQwen35Tiled) {
  KESTREL_REQUIRE_DEVICE();
  check_case({"tiny qwen35", 4, 8, 32, 32, 4, kTiled, kBetaAlpha, 3});
}

TEST(GdnDecode, TinyQwen3NextGroupedBa) {
  KESTREL_REQUIRE_DEVICE();
  check_case({"tiny qwen3next", 4, 8, 32, 32, 4, kGrouped, kBa, 3});
}

TEST(GdnDecode, TinyQwen3NextLegacySsmIn) {
  KESTREL_REQUIRE_DEVICE();
  check_case({"tiny qwen3next legacy ssm_in", 4, 8, 32, 32, 4, kGrouped, kSsmIn, 2});
}

TEST(GdnDecode, Qwen35Moe35BShape) {
  KESTREL_REQUIRE_DEVICE();
  check_case({"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha, 1});
  check_case({"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha, 3});
  check_case({"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha, 8});
}

TEST(GdnDecode, Qwen3NextShapeGrouped) {
  KESTREL_REQUIRE_DEVICE();
  check_case({"80B-A3B-like", 16, 32, 128, 128, 4, kGrouped, kBa, 4});
}

TEST(GdnDecode, OddShapes) {
  KESTREL_REQUIRE_DEVICE();
  check_case({"odd r=3", 3, 9, 48, 40, 3, kGrouped, kBa, 5});
  check_case({"odd r=3 tiled", 3, 9, 48, 40, 3, kTiled, kBetaAlpha, 2});
  check_case({"odd wide dk", 2, 4, 200, 72, 4, kTiled, kBetaAlpha, 3});
  check_case({"odd kernel 1", 1, 1, 8, 33, 1, kGrouped, kSsmIn, 1});
  check_case({"kernel 8", 2, 4, 40, 48, 8, kTiled, kBetaAlpha, 2});
  check_case({"kernel 6 r=5", 1, 5, 24, 128, 6, kGrouped, kBa, 2});
}

// One and three sessions (an odd batch) for each projection layout, on each kernel.
TEST(GdnDecode, OneAndThreeSessionsEachLayout) {
  KESTREL_REQUIRE_DEVICE();
  for (const int n_seq : {1, 3}) {
    check_case({"qwen35 layout", 4, 8, 64, 64, 4, kTiled, kBetaAlpha, n_seq});
    check_case({"qwen3next ba layout", 4, 8, 64, 64, 4, kGrouped, kBa, n_seq});
    check_case({"legacy ssm_in layout", 4, 8, 64, 64, 4, kGrouped, kSsmIn, n_seq});
  }
}

// The choice by shape, and V-heads per K-head of 3 (the Qwen3.5-27B ratio at dv 128), 4 (the 397B ratio) and 5 on
// both kernels, which must agree just as well.
TEST(GdnDecode, KernelChoiceAndLargeHeadRatios) {
  const auto chosen = [](int kh, int vh, int dk, int dv, GdnKernel force) {
    ref::GdnDims d = dims_of({"", kh, vh, dk, dv, 4, kTiled, kBetaAlpha, 1});
    const Expected<GdnKernel> k = gdn_decode_kernel(d, forced(force));
    EXPECT_TRUE(k) << k.error().to_string();
    return k ? *k : GdnKernel::kAuto;
  };
  EXPECT_EQ(chosen(4, 8, 32, 128, GdnKernel::kAuto), GdnKernel::kPerHead) << "dk, dv <= 128: the per-V-head kernel";
  EXPECT_EQ(chosen(4, 8, 128, 128, GdnKernel::kTwoKernel), GdnKernel::kTwoKernel) << "forced onto the two kernels";
  EXPECT_EQ(chosen(4, 8, 160, 128, GdnKernel::kAuto), GdnKernel::kTwoKernel) << "dk 160: the two-kernel path";
  EXPECT_EQ(chosen(1, 5, 32, 160, GdnKernel::kPerHead), GdnKernel::kTwoKernel)
      << "dv 160: the per-V-head kernel cannot serve it, forced or not";
  KESTREL_REQUIRE_DEVICE();
  for (const int n_seq : {1, 3}) {
    check_case({"r=3 dv 128", 2, 6, 128, 128, 4, kTiled, kBetaAlpha, n_seq});
    check_case({"r=4 dv 128", 1, 4, 64, 128, 4, kGrouped, kBa, n_seq});
    check_case({"r=5 dv 128", 1, 5, 64, 128, 4, kTiled, kBetaAlpha, n_seq});
    check_case({"legacy r=5", 1, 5, 32, 128, 4, kGrouped, kSsmIn, n_seq});
  }
}

// The problem of p's first session alone (its state, weights and inputs; the same bits as in p).
Problem first_session(const Problem& p) {
  Problem one = p;
  one.n_seq = 1;
  one.s0.resize(1);
  one.conv0.resize(1);
  const size_t Vd = static_cast<size_t>(p.d.value_dim()), Vh = static_cast<size_t>(p.d.n_v_heads);
  for (int t = 0; t < kSteps; ++t) {
    one.qkv[t].resize(static_cast<size_t>(p.qkv_width()));
    one.z[t].resize(Vd);
    one.b[t].resize(Vh);
    one.a[t].resize(Vh);
    one.ba[t].resize(2 * Vh);
  }
  return one;
}

// A session's steps give the same bits whichever batch it runs in (gdn_decode picks its kernel by shape alone):
// session 0 of 3 and 8 sessions against the same session alone, in each projection layout and on a head the
// per-V-head kernel does not hold (the two-kernel path); outputs, S and history.
TEST(GdnDecode, SessionBitsDoNotDependOnTheBatch) {
  KESTREL_REQUIRE_DEVICE();
  for (const Case& c : std::vector<Case>{{"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha, 8},
                                         {"80B-A3B-like", 16, 32, 128, 128, 4, kGrouped, kBa, 3},
                                         {"legacy ssm_in dk 64", 4, 8, 64, 64, 4, kGrouped, kSsmIn, 3},
                                         {"dk 160", 2, 4, 160, 128, 4, kTiled, kBetaAlpha, 3}}) {
    SCOPED_TRACE(case_name(c));
    const Problem batch = make_problem(c, 555u + static_cast<unsigned>(c.n_seq));
    const Problem alone = first_session(batch);
    const Result rb = run_device(batch);
    const Result r1 = run_device(alone);
    ASSERT_EQ(r1.s.size(), 1u);
    ASSERT_FALSE(rb.s.empty());
    const size_t Vd = static_cast<size_t>(batch.d.value_dim());
    for (int t = 0; t < kSteps; ++t) {
      ASSERT_GE(rb.out[t].size(), Vd);
      EXPECT_EQ(std::memcmp(r1.out[t].data(), rb.out[t].data(), Vd * 4), 0) << "output of step " << t;
    }
    ASSERT_EQ(r1.s[0].size(), rb.s[0].size());
    ASSERT_EQ(r1.conv[0].size(), rb.conv[0].size());
    EXPECT_EQ(std::memcmp(r1.s[0].data(), rb.s[0].data(), r1.s[0].size() * 4), 0) << "state S after the steps";
    EXPECT_EQ(std::memcmp(r1.conv[0].data(), rb.conv[0].data(), r1.conv[0].size() * 4), 0)
        << "conv history after the steps";
  }
}

// Programmatic launches give the bits of plain ones (outputs of every step, final S and conv history), on each
// kernel, in each projection layout, at 1–3 sessions and at 8 (the per-V-head kernel's two programmatic forms).
TEST(GdnDecode, StackedInputRowsGivePlainBits) {
  KESTREL_REQUIRE_DEVICE();
  for (const Case& c : {Case{"stacked 35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha, 3},
                        Case{"stacked grouped ba", 4, 8, 32, 32, 4, kGrouped, kBa, 3},
                        Case{"stacked legacy ssm_in", 4, 8, 32, 32, 4, kGrouped, kSsmIn, 2}}) {
    SCOPED_TRACE(case_name(c));
    const Problem p = make_problem(c, 11);
    const Result plain = run_device_sets(p, 1, false).front();
    const Result stacked = run_device_sets(p, 1, false, /*stacked=*/true).front();
    EXPECT_TRUE(bit_identical(plain, stacked)) << "row_stride must only move where the inputs are read";
  }
}

TEST(GdnDecode, ProgrammaticChainGivesPlainBits) {
  KESTREL_REQUIRE_DEVICE();
  for (const Case& c : std::vector<Case>{{"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha, 1},
                                         {"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha, 8},
                                         {"tiny qwen3next", 4, 8, 32, 32, 4, kGrouped, kBa, 3},
                                         {"tiny legacy ssm_in", 4, 8, 32, 32, 4, kGrouped, kSsmIn, 2},
                                         {"r=5", 1, 5, 64, 128, 4, kTiled, kBetaAlpha, 3},
                                         // conv kernels of 1, 2 and 5 taps (programmatic launches of up to 4 sessions
                                         // load up to 4 taps and their history before the wait; 5 reads them after)
                                         {"conv kernel 1", 4, 8, 32, 32, 1, kTiled, kBetaAlpha, 2},
                                         {"conv kernel 2", 4, 8, 32, 32, 2, kTiled, kBetaAlpha, 3},
                                         {"conv kernel 5", 4, 8, 32, 32, 5, kTiled, kBetaAlpha, 2}}) {
    const Problem p = make_problem(c, 4321u + static_cast<unsigned>(c.n_seq));
    for (const GdnKernel kernel : kKernels) {
      if (!serves(kernel, p.d)) continue;
      SCOPED_TRACE(case_name(c) + " on " + gdn_kernel_name(kernel));
      const Result plain = run_device(p, forced(kernel));
      const std::vector<Result> chained = run_device_sets(p, 3, true, false, forced(kernel));
      for (size_t j = 0; j < chained.size(); ++j) {
        EXPECT_TRUE(bit_identical(plain, chained[j]))
            << "set " << j << (j == 0 ? " (plain launches)" : " (programmatic)")
            << " of the chain differs from plain synchronous steps";
      }
    }
  }
}

// out_prepared: the prepared bytes are gemv_imma_prepare_x's of the output, and everything else keeps the bits of a
// call without it, on each kernel, plain and programmatic: heads of 128 columns (two a group), of 64 (four) and of 96
// (a head across two groups; the last group partial), 1, 3 and 8 sessions.
TEST(GdnDecode, PreparedOutputIsThePreparationOfTheOutput) {
  KESTREL_REQUIRE_DEVICE();
  for (const Case& c : std::vector<Case>{{"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha, 1},
                                         {"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha, 3},
                                         {"35B-A3B", 16, 32, 128, 128, 4, kTiled, kBetaAlpha, 8},
                                         {"dv 64", 4, 8, 32, 64, 4, kGrouped, kBa, 3},
                                         {"dv 96", 4, 8, 32, 96, 4, kTiled, kBetaAlpha, 2}}) {
    const Problem p = make_problem(c, 99u + static_cast<unsigned>(c.n_seq));
    for (const GdnKernel kernel : kKernels) {
      if (!serves(kernel, p.d)) continue;
      SCOPED_TRACE(case_name(c) + " on " + gdn_kernel_name(kernel));
      const Result plain = run_device(p, forced(kernel));
      for (const bool chain : {false, true}) {
        const std::vector<Result> with_prep = run_device_sets(p, 2, chain, false, forced(kernel), /*prepared=*/true);
        for (const Result& r : with_prep) {
          EXPECT_TRUE(bit_identical(plain, r)) << "the step's results change with out_prepared";
        }
      }
    }
  }
}

TEST(GdnDecode, RefusesBadArguments) {
  ref::GdnDims d = dims_of({"", 4, 8, 32, 32, 4, kTiled, kBetaAlpha, 1});
  alignas(16) float dummy[4] = {};
  GdnSlot slot;
  const GdnDecodeWeights w{dummy, dummy, dummy, dummy};
  GdnDecodeInputs in;
  in.qkv = dummy;
  in.z = dummy;
  in.b = dummy;
  // a missing for kQkvGateBetaAlpha
  Status s = gdn_decode(d, kBetaAlpha, w, in, &slot, 1, dummy, dummy, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  in.a = dummy;
  s = gdn_decode(d, kBetaAlpha, GdnDecodeWeights{}, in, &slot, 1, dummy, dummy, nullptr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
  ref::GdnDims big = d;
  big.d_k = kGdnMaxDk + 1;
  s = gdn_decode(big, kBetaAlpha, w, in, &slot, 1, dummy, dummy, nullptr);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("d_k"), std::string::npos) << s.error().message;
  ref::GdnDims bad = d;
  bad.n_v_heads = 6;  // not a multiple of Kh = 4
  s = gdn_decode(bad, kBetaAlpha, w, in, &slot, 1, dummy, dummy, nullptr);
  EXPECT_FALSE(s);
  EXPECT_TRUE(gdn_decode(d, kBetaAlpha, w, in, &slot, 0, dummy, dummy, nullptr));  // nothing to do
  // out_prepared not 16-byte aligned; a value_dim (8 · 33) with no prepared form.
  s = gdn_decode(d, kBetaAlpha, w, in, &slot, 1, dummy, dummy, nullptr, false, {}, dummy + 1);
  EXPECT_FALSE(s);
  ref::GdnDims odd = d;
  odd.d_v = 33;
  s = gdn_decode(odd, kBetaAlpha, w, in, &slot, 1, dummy, dummy, nullptr, false, {}, dummy);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("value_dim"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace kestrel::gpu
