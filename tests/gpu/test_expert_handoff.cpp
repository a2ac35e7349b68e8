// The hybrid MoE hand-off through mapped memory: expert_handoff_publish / expert_handoff_join (gpu/kernels/
// expert_handoff.h) with HostExpertLink (gpu/engine/host_expert_link.h) serving a recording ExpertBackend whose rows
// are a known function of its batch (y = x · Σ weights of the batch's choices + layer). Checks:
//   - the device's rows come back exactly, for 1, 7 and 32 rows, layer after layer on one stream, and the backend saw
//     each layer's number, rows and choices as published; take_times() counts the batches and both sides' time;
//   - the same launches captured in a CUDA graph and replayed with new inputs publish a fresh batch each replay;
//   - a backend error comes back from end_pass() naming the layer, the join does not wait on it, and the next pass
//     is clean;
//   - a join whose host does not answer gives up after its timeout with NaN rows, end_pass() says so
//     (kDeadlineExceeded), and the link serves the next pass;
//   - the kernels and the link refuse bad arguments.
// Device tests skip without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "core/engine/expert_backend.h"
#include "gpu/engine/host_expert_link.h"
#include "gpu/kernels/expert_handoff.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;
using test::DeviceStream;

constexpr int kHidden = 2048;
constexpr int kK = 8;
constexpr int kMaxRows = 32;

// y[t][c] = x[t][c] · Σ_j weight(t, j) over the choices not marked kExpertNotHere, + layer.
float expected_row_value(float x, const ExpertChoice* choices, int k, int layer) {
  float w = 0.0f;
  for (int j = 0; j < k; ++j) {
    if (choices[j].expert != kExpertNotHere) w += choices[j].weight;
  }
  return x * w + static_cast<float>(layer);
}

// An ExpertBackend that computes expected_row_value and records what it was given; fails the layer `fail_layer`.
class RecordingBackend : public ExpertBackend {
 public:
  const ExpertSet& experts() const override { return set_; }
  int32_t hidden() const override { return kHidden; }
  Status check(const ExpertBatch&) const override { return ok_status(); }
  Status run(const ExpertBatch& b) override {
    std::lock_guard<std::mutex> lk(mu_);
    layers.push_back(b.layer);
    rows.push_back(b.n_tokens);
    first_choice.push_back(b.n_tokens > 0 ? b.choices[0] : ExpertChoice{});
    if (b.layer == fail_layer) {
      return make_error(ErrorCode::kInternal, "recording backend: layer " + std::to_string(b.layer) + " fails");
    }
    for (int t = 0; t < b.n_tokens; ++t) {
      for (int c = 0; c < b.hidden; ++c) {
        const size_t i = static_cast<size_t>(t) * b.hidden + c;
        b.y[i] = expected_row_value(b.x[i], b.choices + static_cast<size_t>(t) * b.k, b.k, b.layer);
      }
    }
    return ok_status();
  }

  std::mutex mu_;
  std::vector<int32_t> layers, rows;
  std::vector<ExpertChoice> first_choice;
  int32_t fail_layer = -1;

 private:
  ExpertSet set_;
};

struct Inputs {
  std::vector<float> x;
  std::vector<ExpertChoice> choices;
};

Inputs random_inputs(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  Inputs in;
  in.x.resize(static_cast<size_t>(n) * kHidden);
  for (float& v : in.x) v = nd(rng);
  in.choices.resize(static_cast<size_t>(n) * kK);
  for (size_t i = 0; i < in.choices.size(); ++i) {
    const bool here = (rng() % 3) != 0;
    in.choices[i] = here ? ExpertChoice{static_cast<int32_t>(i % 256), ud(rng)} : ExpertChoice{kExpertNotHere, 0.0f};
  }
  return in;
}

std::vector<float> expected(const Inputs& in, int n, int layer) {
  std::vector<float> y(static_cast<size_t>(n) * kHidden);
  for (int t = 0; t < n; ++t) {
    for (int c = 0; c < kHidden; ++c) {
      const size_t i = static_cast<size_t>(t) * kHidden + c;
      y[i] = expected_row_value(in.x[i], in.choices.data() + static_cast<size_t>(t) * kK, kK, layer);
    }
  }
  return y;
}

struct Rig {
  RecordingBackend backend;
  std::unique_ptr<HostExpertLink> link;
  DeviceStream stream;
  DeviceBuffer x{static_cast<size_t>(kMaxRows) * kHidden * sizeof(float)};
  DeviceBuffer choices{static_cast<size_t>(kMaxRows) * kK * sizeof(ExpertChoice)};
  DeviceBuffer y{static_cast<size_t>(kMaxRows) * kHidden * sizeof(float)};

  bool make() {
    auto l = HostExpertLink::create(backend, kMaxRows, kHidden, kK);
    if (!l) return false;
    link = std::move(*l);
    return stream.get() != nullptr && x.as() != nullptr && choices.as() != nullptr && y.as() != nullptr;
  }
  bool upload(const Inputs& in) { return test::upload(x, in.x) && test::upload(choices, in.choices); }
  Status layer(int32_t l, int n, uint64_t timeout_ns = HostExpertLink::kJoinTimeoutNs) {
    KESTREL_TRY(expert_handoff_publish(link->handoff(), l, x.as<float>(), choices.as<ExpertChoice>(), n, kHidden, kK,
                                       stream.get()));
    return expert_handoff_join(link->handoff(), n, kHidden, y.as<float>(), timeout_ns, stream.get());
  }
  std::vector<float> result(int n) { return test::download<float>(y.as(), static_cast<size_t>(n) * kHidden); }
};

TEST(ExpertHandoff, RowsComeBackLayerAfterLayer) {
  KESTREL_REQUIRE_DEVICE();
  Rig rig;
  ASSERT_TRUE(rig.make());
  int32_t layer = 0;
  for (int n : {1, 7, 32}) {
    for (int rep = 0; rep < 3; ++rep, ++layer) {
      const Inputs in = random_inputs(n, static_cast<uint32_t>(100 * n + rep));
      ASSERT_TRUE(rig.upload(in));
      rig.link->begin_pass();
      ASSERT_TRUE(rig.layer(layer, n)) << "n " << n;
      KESTREL_CUDA_OK(cudaStreamSynchronize(rig.stream.get()));
      const Status s = rig.link->end_pass();
      ASSERT_TRUE(s) << s.error().message;
      const std::vector<float> got = rig.result(n), want = expected(in, n, layer);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "n " << n << " layer " << layer;
      std::lock_guard<std::mutex> lk(rig.backend.mu_);
      ASSERT_EQ(rig.backend.layers.size(), static_cast<size_t>(layer + 1));
      EXPECT_EQ(rig.backend.layers.back(), layer);
      EXPECT_EQ(rig.backend.rows.back(), n);
      EXPECT_EQ(rig.backend.first_choice.back().expert, in.choices[0].expert);
      EXPECT_EQ(rig.backend.first_choice.back().weight, in.choices[0].weight);
    }
  }
  // Nine batches, each computed on the host; the device waited on every one (nothing else ran between publish and
  // join), never longer in all than the host's time plus the round trips.
  const auto times = rig.link->take_times();
  ASSERT_TRUE(times);
  EXPECT_EQ(times->batches, 9u);
  EXPECT_GT(times->host_ns, 0u);
  EXPECT_GT(times->device_wait_ns, 0u);
  const auto again = rig.link->take_times();
  ASSERT_TRUE(again);
  EXPECT_EQ(again->batches, 0u);
  EXPECT_EQ(again->device_wait_ns, 0u);
}

TEST(ExpertHandoff, SeveralLayersInOnePassAndAGraphReplay) {
  KESTREL_REQUIRE_DEVICE();
  Rig rig;
  ASSERT_TRUE(rig.make());
  constexpr int n = 5;
  // Three layers in one pass, the rows of each feeding the next (x ← y by a device copy), captured as a graph.
  cudaGraph_t graph = nullptr;
  KESTREL_CUDA_OK(cudaStreamBeginCapture(rig.stream.get(), cudaStreamCaptureModeThreadLocal));
  for (int32_t l = 0; l < 3; ++l) {
    ASSERT_TRUE(rig.layer(l, n));
    KESTREL_CUDA_OK(cudaMemcpyAsync(rig.x.as(), rig.y.as(), static_cast<size_t>(n) * kHidden * sizeof(float),
                                    cudaMemcpyDeviceToDevice, rig.stream.get()));
  }
  KESTREL_CUDA_OK(cudaStreamEndCapture(rig.stream.get(), &graph));
  cudaGraphExec_t exec = nullptr;
  KESTREL_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    Inputs in = random_inputs(n, static_cast<uint32_t>(7 + replay));
    ASSERT_TRUE(rig.upload(in));
    rig.link->begin_pass();
    KESTREL_CUDA_OK(cudaGraphLaunch(exec, rig.stream.get()));
    KESTREL_CUDA_OK(cudaStreamSynchronize(rig.stream.get()));
    const Status s = rig.link->end_pass();
    ASSERT_TRUE(s) << s.error().message;
    std::vector<float> want;
    for (int32_t l = 0; l < 3; ++l) {
      want = expected(in, n, l);
      in.x = want;
    }
    const std::vector<float> got = rig.result(n);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "replay " << replay;
  }
  std::lock_guard<std::mutex> lk(rig.backend.mu_);
  EXPECT_EQ(rig.backend.layers, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0, 1, 2}));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(ExpertHandoff, BackendErrorComesBackAndTheNextPassIsClean) {
  KESTREL_REQUIRE_DEVICE();
  Rig rig;
  ASSERT_TRUE(rig.make());
  rig.backend.fail_layer = 3;
  const Inputs in = random_inputs(4, 11);
  ASSERT_TRUE(rig.upload(in));
  rig.link->begin_pass();
  ASSERT_TRUE(rig.layer(2, 4));
  ASSERT_TRUE(rig.layer(3, 4));
  ASSERT_TRUE(rig.layer(4, 4));
  KESTREL_CUDA_OK(cudaStreamSynchronize(rig.stream.get()));
  const Status s = rig.link->end_pass();
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("layer 3"), std::string::npos) << s.error().message;
  const std::vector<float> last = rig.result(4), want = expected(in, 4, 4);
  EXPECT_EQ(std::memcmp(last.data(), want.data(), last.size() * sizeof(float)), 0);

  rig.link->begin_pass();
  ASSERT_TRUE(rig.layer(5, 4));
  KESTREL_CUDA_OK(cudaStreamSynchronize(rig.stream.get()));
  const Status again = rig.link->end_pass();
  EXPECT_TRUE(again) << again.error().message;
}

TEST(ExpertHandoff, SilentHostTimesOutThenTheLinkServesAgain) {
  KESTREL_REQUIRE_DEVICE();
  Rig rig;
  ASSERT_TRUE(rig.make());
  const Inputs in = random_inputs(3, 21);
  ASSERT_TRUE(rig.upload(in));
  // No begin_pass: the link's thread sleeps, so nobody answers; the join gives up after 2 ms.
  ASSERT_TRUE(rig.layer(0, 3, 2'000'000));
  KESTREL_CUDA_OK(cudaStreamSynchronize(rig.stream.get()));
  const Status s = rig.link->end_pass();
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, ErrorCode::kDeadlineExceeded) << s.error().message;
  for (float v : rig.result(3)) ASSERT_TRUE(std::isnan(v));

  rig.link->begin_pass();
  ASSERT_TRUE(rig.layer(1, 3));
  KESTREL_CUDA_OK(cudaStreamSynchronize(rig.stream.get()));
  const Status again = rig.link->end_pass();
  EXPECT_TRUE(again) << again.error().message;
  const std::vector<float> got = rig.result(3), want = expected(in, 3, 1);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

TEST(ExpertHandoff, RefusesBadArguments) {
  RecordingBackend backend;
  EXPECT_FALSE(HostExpertLink::create(backend, 0, kHidden, kK));
  EXPECT_FALSE(HostExpertLink::create(backend, 4, 6, kK));
  EXPECT_FALSE(HostExpertLink::create(backend, 4, kHidden, 0));
  ExpertHandoff none;
  float f = 0.0f;
  ExpertChoice c;
  EXPECT_EQ(expert_handoff_publish(none, 0, &f, &c, 1, kHidden, kK, nullptr).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(expert_handoff_join(none, 1, kHidden, &f, 1, nullptr).error().code, ErrorCode::kInvalidArgument);
  KESTREL_REQUIRE_DEVICE();
  Rig rig;
  ASSERT_TRUE(rig.make());
  const ExpertHandoff& h = rig.link->handoff();
  EXPECT_FALSE(expert_handoff_publish(h, 0, rig.x.as<float>(), rig.choices.as<ExpertChoice>(), 0, kHidden, kK,
                                      rig.stream.get()));
  EXPECT_FALSE(expert_handoff_publish(h, 0, rig.x.as<float>(), rig.choices.as<ExpertChoice>(), 1, kHidden - 2, kK,
                                      rig.stream.get()));
  EXPECT_FALSE(expert_handoff_publish(h, 0, rig.x.as<float>(), nullptr, 1, kHidden, kK, rig.stream.get()));
  EXPECT_FALSE(expert_handoff_join(h, 1, kHidden, rig.y.as<float>(), 0, rig.stream.get()));
  EXPECT_FALSE(expert_handoff_join(h, 1, kHidden, nullptr, 1, rig.stream.get()));
}

}  // namespace
}  // namespace kestrel::gpu
