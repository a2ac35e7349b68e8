// gpu/WeightPool: registration copies raw blocks byte for byte at aligned offsets with exact shapes; a bad batch
// (wrong byte count, ne0 not a multiple of the block, duplicate key, unsupported type) or one that does not fit is
// refused before anything is copied and leaves the pool unchanged, with an error naming the tensor, its bytes and
// the free bytes; clear() invalidates every key and every PoolRef (generation); byte accounting per placement
// class; a registered matrix feeds gemv (result vs ref::matvec_batch); a whole tiny model registers from its
// WeightCatalog with the catalog's own accounting. Tests that need a device skip where there is none.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/gguf/gguf_reader.h"
#include "core/model/weight_catalog.h"
#include "core/quant/quant.h"
#include "core/reference/matvec.h"
#include "gpu/kernels/gemv.h"
#include "gpu/kernels/gemv_imma.h"
#include "gpu/memory/weight_pool.h"
#include "tests/core/model/model_test_util.h"
#include "tests/gpu/gpu_test_util.h"

namespace kestrel::gpu {
namespace {

using test::DeviceBuffer;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

uint64_t bytes_for(GgmlType t, const std::vector<uint64_t>& ne) {
  uint64_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
  return *ggml_row_bytes(t, ne[0]) * rows;
}

// A batch description plus the host bytes it borrows.
struct HostTensor {
  PoolTensorDesc desc;
  std::vector<uint8_t> bytes;
};

HostTensor make_tensor(std::string key, GgmlType t, std::vector<uint64_t> ne, PlacementClass pc, uint32_t seed) {
  HostTensor h;
  h.bytes = random_bytes(bytes_for(t, ne), seed);
  h.desc.key = std::move(key);
  h.desc.type = t;
  h.desc.ne = std::move(ne);
  h.desc.placement = pc;
  return h;
}

std::vector<PoolTensorDesc> descs(std::vector<HostTensor>& ts) {
  std::vector<PoolTensorDesc> d;
  for (HostTensor& t : ts) {
    t.desc.data = t.bytes;
    d.push_back(t.desc);
  }
  return d;
}

std::vector<uint8_t> read_back(const WeightPool& pool, const std::string& key) {
  auto ref = pool.find(key);
  if (!ref) return {};
  auto e = pool.entry(*ref);
  auto v = pool.view(*ref);
  if (!e || !v) return {};
  return test::download<uint8_t>(v->data, (*e)->bytes);
}

// Everything observable about the pool's contents, to check that a refused call changed nothing.
struct Snapshot {
  size_t n = 0;
  uint64_t used = 0, padding = 0, generation = 0;
  std::vector<uint64_t> per_class;
  bool operator==(const Snapshot&) const = default;
};
Snapshot snap(const WeightPool& p) {
  Snapshot s{p.n_tensors(), p.used_bytes(), p.padding_bytes(), p.generation(), {}};
  for (size_t c = 0; c < kNumPlacementClasses; ++c) s.per_class.push_back(p.bytes_in(static_cast<PlacementClass>(c)));
  return s;
}

TEST(WeightPool, RegistersRawBytesAtAlignedOffsetsWithExactShapes) {
  KESTREL_REQUIRE_DEVICE();
  auto pool = WeightPool::create(1 << 20);
  ASSERT_TRUE(pool) << pool.error().to_string();
  std::vector<HostTensor> ts;
  ts.push_back(make_tensor("blk.0.attn_q.weight", GgmlType::kQ4_0, {64, 3}, PlacementClass::kDense, 1));
  ts.push_back(make_tensor("blk.0.attn_norm.weight", GgmlType::kF32, {5}, PlacementClass::kDense, 2));
  ts.push_back(
      make_tensor("blk.0.ffn_up_exps.weight", GgmlType::kQ4_K, {256, 2, 3}, PlacementClass::kRoutedExperts, 3));
  ts.push_back(make_tensor("token_embd.weight", GgmlType::kQ6_K, {256, 7}, PlacementClass::kEmbedding, 4));
  ts.push_back(make_tensor("blk.0.ffn_up_shexp.weight", GgmlType::kBF16, {33, 3}, PlacementClass::kSharedExpert, 5));
  const auto batch = descs(ts);
  const auto st = pool->register_tensors(batch, nullptr);
  ASSERT_TRUE(st) << st.error().to_string();
  ASSERT_EQ(pool->n_tensors(), ts.size());

  uint64_t raw = 0;
  for (const HostTensor& t : ts) {
    auto ref = pool->find(t.desc.key);
    ASSERT_TRUE(ref) << ref.error().to_string();
    auto e = pool->entry(*ref);
    ASSERT_TRUE(e);
    EXPECT_EQ((*e)->offset % kPoolAlignment, 0u) << t.desc.key;
    EXPECT_EQ((*e)->ne, t.desc.ne) << t.desc.key;
    EXPECT_EQ((*e)->type, t.desc.type) << t.desc.key;
    EXPECT_EQ((*e)->bytes, t.bytes.size()) << t.desc.key;
    auto v = pool->view(*ref);
    ASSERT_TRUE(v);
    EXPECT_EQ(v->type, t.desc.type);
    EXPECT_EQ(v->n_cols, static_cast<int64_t>(t.desc.ne[0]));
    uint64_t rows = 1;
    for (size_t i = 1; i < t.desc.ne.size(); ++i) rows *= t.desc.ne[i];
    EXPECT_EQ(v->n_rows, static_cast<int64_t>(rows));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data) % kPoolAlignment, 0u);
    const std::vector<uint8_t> back = read_back(*pool, t.desc.key);
    EXPECT_TRUE(back == t.bytes) << t.desc.key << ": bytes read back differ from the bytes registered";
    raw += t.bytes.size();
  }
  // Accounting: per class, raw bytes; used = raw + padding.
  EXPECT_EQ(pool->bytes_in(PlacementClass::kDense), ts[0].bytes.size() + ts[1].bytes.size());
  EXPECT_EQ(pool->bytes_in(PlacementClass::kRoutedExperts), ts[2].bytes.size());
  EXPECT_EQ(pool->bytes_in(PlacementClass::kEmbedding), ts[3].bytes.size());
  EXPECT_EQ(pool->bytes_in(PlacementClass::kSharedExpert), ts[4].bytes.size());
  EXPECT_EQ(pool->used_bytes(), raw + pool->padding_bytes());
  EXPECT_EQ(pool->free_bytes(), pool->budget_bytes() - pool->used_bytes());

  // 3-D slices: expert e of {256, 2, 3} Q4_K is rows [2e, 2e+2).
  auto ref = pool->find("blk.0.ffn_up_exps.weight");
  ASSERT_TRUE(ref);
  const uint64_t row_bytes = *ggml_row_bytes(GgmlType::kQ4_K, 256);
  for (uint64_t e = 0; e < 3; ++e) {
    auto s = pool->slice(*ref, e);
    ASSERT_TRUE(s) << s.error().to_string();
    EXPECT_EQ(s->n_cols, 256);
    EXPECT_EQ(s->n_rows, 2);
    const auto back = test::download<uint8_t>(s->data, 2 * row_bytes);
    EXPECT_TRUE(
        std::equal(back.begin(), back.end(), ts[2].bytes.begin() + static_cast<std::ptrdiff_t>(e * 2 * row_bytes)))
        << "expert " << e;
  }
  EXPECT_EQ(pool->slice(*ref, 3).error().code, ErrorCode::kOutOfRange);
  EXPECT_EQ(pool->slice(*pool->find("token_embd.weight"), 0).error().code, ErrorCode::kInvalidArgument);
}

TEST(WeightPool, BadBatchIsRefusedBeforeAnyCopyAndLeavesThePoolUnchanged) {
  KESTREL_REQUIRE_DEVICE();
  auto pool = WeightPool::create(1 << 16);
  ASSERT_TRUE(pool) << pool.error().to_string();
  std::vector<HostTensor> first;
  first.push_back(make_tensor("a", GgmlType::kF32, {16, 2}, PlacementClass::kDense, 7));
  ASSERT_TRUE(pool->register_tensors(descs(first), nullptr));
  const Snapshot before = snap(*pool);
  const std::vector<uint8_t> a_bytes = read_back(*pool, "a");

  struct Case {
    const char* what;
    std::vector<HostTensor> batch;
    ErrorCode code;
    const char* names;  // the key the error must name
  };
  std::vector<Case> cases;
  {  // good tensor first, then one whose buffer is one byte short
    Case c{"short buffer", {}, ErrorCode::kInvalidArgument, "short"};
    c.batch.push_back(make_tensor("good", GgmlType::kQ8_0, {64, 2}, PlacementClass::kDense, 8));
    HostTensor bad = make_tensor("short", GgmlType::kQ4_0, {64, 2}, PlacementClass::kDense, 9);
    bad.bytes.pop_back();
    c.batch.push_back(std::move(bad));
    cases.push_back(std::move(c));
  }
  {  // ne0 not a multiple of the Q4_0 block
    Case c{"ne0 not a block multiple", {}, ErrorCode::kInvalidArgument, "odd"};
    c.batch.push_back(make_tensor("good", GgmlType::kF32, {3}, PlacementClass::kDense, 10));
    HostTensor bad = make_tensor("odd", GgmlType::kF32, {33, 1}, PlacementClass::kDense, 11);
    bad.desc.type = GgmlType::kQ4_0;  // 33 elements cannot be Q4_0 rows
    c.batch.push_back(std::move(bad));
    cases.push_back(std::move(c));
  }
  {  // key already registered
    Case c{"duplicate of a registered key", {}, ErrorCode::kInvalidArgument, "'a'"};
    c.batch.push_back(make_tensor("good", GgmlType::kF32, {3}, PlacementClass::kDense, 12));
    c.batch.push_back(make_tensor("a", GgmlType::kF32, {3}, PlacementClass::kDense, 13));
    cases.push_back(std::move(c));
  }
  {  // key twice in the batch
    Case c{"duplicate inside the batch", {}, ErrorCode::kInvalidArgument, "twice"};
    c.batch.push_back(make_tensor("twice", GgmlType::kF32, {3}, PlacementClass::kDense, 14));
    c.batch.push_back(make_tensor("twice", GgmlType::kF32, {3}, PlacementClass::kDense, 15));
    cases.push_back(std::move(c));
  }
  {  // a type the kernels cannot read
    Case c{"unsupported type", {}, ErrorCode::kUnsupported, "iq"};
    HostTensor bad = make_tensor("iq", GgmlType::kF32, {256}, PlacementClass::kDense, 16);
    bad.desc.type = GgmlType::kQ2_K;
    bad.bytes.resize(*ggml_row_bytes(GgmlType::kQ2_K, 256));
    c.batch.push_back(std::move(bad));
    cases.push_back(std::move(c));
  }
  for (Case& c : cases) {
    const auto st = pool->register_tensors(descs(c.batch), nullptr);
    ASSERT_FALSE(st) << c.what << ": accepted";
    EXPECT_EQ(st.error().code, c.code) << c.what << ": " << st.error().to_string();
    EXPECT_TRUE(contains(st.error().message, c.names)) << c.what << ": " << st.error().message;
    EXPECT_TRUE(snap(*pool) == before) << c.what << ": the pool changed";
    EXPECT_FALSE(pool->find("good")) << c.what << ": the good tensor of a refused batch was registered";
    EXPECT_TRUE(read_back(*pool, "a") == a_bytes) << c.what;
  }
}

TEST(WeightPool, BatchThatDoesNotFitNamesTheTensorAndTheFreeBytes) {
  KESTREL_REQUIRE_DEVICE();
  auto pool = WeightPool::create(4096);
  ASSERT_TRUE(pool) << pool.error().to_string();
  std::vector<HostTensor> first;
  first.push_back(make_tensor("first", GgmlType::kF32, {750}, PlacementClass::kDense, 20));  // 3000 bytes
  ASSERT_TRUE(pool->register_tensors(descs(first), nullptr));
  EXPECT_EQ(pool->used_bytes(), 3000u);
  const Snapshot before = snap(*pool);

  std::vector<HostTensor> batch;
  batch.push_back(make_tensor("small", GgmlType::kF32, {8}, PlacementClass::kDense, 21));  // fits alone (at 3072)
  batch.push_back(make_tensor("big", GgmlType::kF32, {250}, PlacementClass::kDense, 22));  // 1000 bytes: no room
  const auto st = pool->register_tensors(descs(batch), nullptr);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ErrorCode::kResourceExhausted) << st.error().to_string();
  EXPECT_TRUE(contains(st.error().message, "'big'")) << st.error().message;
  EXPECT_TRUE(contains(st.error().message, "1000 bytes")) << st.error().message;
  EXPECT_TRUE(contains(st.error().message, "1096 of 4096 bytes are free")) << st.error().message;
  EXPECT_TRUE(snap(*pool) == before);
  EXPECT_FALSE(pool->find("small"));

  // The smaller tensor alone fits.
  batch.pop_back();
  EXPECT_TRUE(pool->register_tensors(descs(batch), nullptr));
  EXPECT_EQ(pool->used_bytes(), 3072u + 32u);
  EXPECT_EQ(pool->padding_bytes(), 72u);
}

TEST(WeightPool, ClearInvalidatesEveryKeyAndEveryOldRef) {
  KESTREL_REQUIRE_DEVICE();
  auto pool = WeightPool::create(1 << 16);
  ASSERT_TRUE(pool) << pool.error().to_string();
  std::vector<HostTensor> ts;
  ts.push_back(make_tensor("w", GgmlType::kQ8_0, {64, 4}, PlacementClass::kDense, 30));
  ts.push_back(make_tensor("e", GgmlType::kF32, {8}, PlacementClass::kEmbedding, 31));
  ASSERT_TRUE(pool->register_tensors(descs(ts), nullptr));
  auto old_ref = pool->find("w");
  ASSERT_TRUE(old_ref);
  ASSERT_TRUE(pool->view(*old_ref));
  const uint64_t gen = pool->generation();

  pool->clear();
  EXPECT_GT(pool->generation(), gen);
  EXPECT_EQ(pool->n_tensors(), 0u);
  EXPECT_EQ(pool->used_bytes(), 0u);
  EXPECT_EQ(pool->bytes_in(PlacementClass::kDense), 0u);
  EXPECT_EQ(pool->bytes_in(PlacementClass::kEmbedding), 0u);
  EXPECT_EQ(pool->find("w").error().code, ErrorCode::kNotFound);
  EXPECT_EQ(pool->find("e").error().code, ErrorCode::kNotFound);
  auto stale = pool->view(*old_ref);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, ErrorCode::kFailedPrecondition) << stale.error().to_string();

  // Rebuilt under the same key: new refs work, the old one stays refused.
  std::vector<HostTensor> again;
  again.push_back(make_tensor("w", GgmlType::kQ8_0, {64, 4}, PlacementClass::kDense, 32));
  ASSERT_TRUE(pool->register_tensors(descs(again), nullptr));
  auto new_ref = pool->find("w");
  ASSERT_TRUE(new_ref);
  EXPECT_TRUE(pool->view(*new_ref));
  EXPECT_EQ(pool->view(*old_ref).error().code, ErrorCode::kFailedPrecondition);
  EXPECT_TRUE(read_back(*pool, "w") == again[0].bytes);
}

TEST(WeightPool, RegisteredMatrixFeedsGemv) {
  KESTREL_REQUIRE_DEVICE();
  auto pool = WeightPool::create(1 << 20);
  ASSERT_TRUE(pool) << pool.error().to_string();
  // F32 weights with finite values (random bytes could be NaN/inf).
  const int64_t n_in = 96, n_out = 37;
  std::mt19937 rng(40);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<HostTensor> ts(1);
  ts[0].desc = PoolTensorDesc{"blk.1.attn_k.weight", GgmlType::kF32, {96, 37}, PlacementClass::kDense, {}};
  std::vector<float> w(static_cast<size_t>(n_in * n_out));
  for (float& x : w) x = u(rng);
  ts[0].bytes.resize(w.size() * 4);
  std::memcpy(ts[0].bytes.data(), w.data(), ts[0].bytes.size());
  ASSERT_TRUE(pool->register_tensors(descs(ts), nullptr));
  auto view = pool->matrix("blk.1.attn_k.weight");
  ASSERT_TRUE(view) << view.error().to_string();

  std::vector<float> x(static_cast<size_t>(n_in));
  for (float& v : x) v = u(rng);
  DeviceBuffer dx(x.size() * 4), dy(static_cast<size_t>(n_out) * 4);
  ASSERT_TRUE(test::upload(dx, x));
  const auto st = gemv(*view, dx.as<float>(), 1, dy.as<float>(), nullptr);
  ASSERT_TRUE(st) << st.error().to_string();
  KESTREL_CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> want(static_cast<size_t>(n_out)), bound(static_cast<size_t>(n_out));
  ASSERT_TRUE(ref::matvec(ref::f32_matrix(w.data(), n_in, n_out), x.data(), want.data()));
  for (int64_t o = 0; o < n_out; ++o) {
    double s = 0;
    for (int64_t i = 0; i < n_in; ++i) s += std::fabs(w[static_cast<size_t>(o * n_in + i)] * x[static_cast<size_t>(i)]);
    bound[static_cast<size_t>(o)] = static_cast<float>(s);
  }
  const auto got = test::download<float>(dy.as(), static_cast<size_t>(n_out));
  const std::string diff = test::compare_close(got, want, bound, 1e-5);
  EXPECT_TRUE(diff.empty()) << diff;
}

TEST(WeightPool, RegistersAWholeModelFromItsCatalog) {
  KESTREL_REQUIRE_DEVICE();
  for (Arch arch : {Arch::kQwen35Moe, Arch::kQwen35, Arch::kQwen3Next}) {
    SCOPED_TRACE(std::string(arch_name(arch)));
    const ModelHparams hp = kestrel::test::tiny_hparams(arch);
    const std::string path =
        kestrel::test::write_gguf("pool_" + std::string(arch_name(arch)) + ".gguf", kestrel::test::hparams_metadata(hp),
                                  kestrel::test::model_tensors(hp));
    ASSERT_FALSE(path.empty());
    auto file = GgufFile::open(path);
    ASSERT_TRUE(file) << file.error().to_string();
    auto hp_read = ModelHparams::from_gguf(*file);
    ASSERT_TRUE(hp_read) << hp_read.error().to_string();
    auto cat = WeightCatalog::build(*file, *hp_read);
    ASSERT_TRUE(cat) << cat.error().to_string();

    // Too small a budget: refused as a whole.
    auto tiny = WeightPool::create(cat->total_bytes() / 2);
    ASSERT_TRUE(tiny);
    const auto no = tiny->register_catalog(*cat, *file, nullptr);
    ASSERT_FALSE(no);
    EXPECT_EQ(no.error().code, ErrorCode::kResourceExhausted) << no.error().to_string();
    EXPECT_EQ(tiny->n_tensors(), 0u);

    auto pool = WeightPool::create(cat->total_bytes() + cat->n_used_tensors() * kPoolAlignment);
    ASSERT_TRUE(pool);
    const auto st = pool->register_catalog(*cat, *file, nullptr);
    ASSERT_TRUE(st) << st.error().to_string();
    EXPECT_EQ(pool->n_tensors(), cat->n_used_tensors());
    for (size_t c = 0; c < kNumPlacementClasses; ++c) {
      const auto pc = static_cast<PlacementClass>(c);
      EXPECT_EQ(pool->bytes_in(pc), cat->bytes_in(pc)) << placement_class_name(pc);
    }
    // Every tensor's bytes are the file's.
    for (const CatalogEntry& e : cat->entries()) {
      if (e.skipped) continue;
      const auto want = file->tensor_data(*e.info);
      const auto got = read_back(*pool, e.info->name);
      EXPECT_TRUE(got.size() == want.size() && std::equal(got.begin(), got.end(), want.begin())) << e.info->name;
    }
    EXPECT_TRUE(pool->matrix("blk.3.attn_q.weight"));
    EXPECT_TRUE(pool->matrix("token_embd.weight"));
  }
}

// Q4 weights quantized from random floats (finite scales), n_mat matrices of n_rows × n_cols.
std::vector<uint8_t> q4_weights(GgmlType t, uint64_t n_cols, uint64_t n_rows, uint64_t n_mat, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const uint64_t row_bytes = *ggml_row_bytes(t, n_cols);
  std::vector<uint8_t> out(row_bytes * n_rows * n_mat);
  std::vector<float> row(n_cols);
  for (uint64_t r = 0; r < n_rows * n_mat; ++r) {
    for (float& v : row) v = u(rng);
    EXPECT_TRUE(quantize_row(t, row.data(), out.data() + r * row_bytes, static_cast<int64_t>(n_cols)));
  }
  return out;
}

std::vector<uint8_t> tiled_host(GgmlType t, const std::vector<uint8_t>& raw, uint64_t n_cols, uint64_t n_rows,
                                uint64_t n_mat) {
  std::vector<uint8_t> out(raw.size());
  const uint64_t slice = raw.size() / n_mat;
  for (uint64_t j = 0; j < n_mat; ++j) {
    EXPECT_TRUE(tile_matrix(t, raw.data() + j * slice, static_cast<int64_t>(n_cols), static_cast<int64_t>(n_rows),
                            std::span<uint8_t>(out.data() + j * slice, slice)));
  }
  return out;
}

// y = W x through the pool's tiled view and GEMV v4, against ref::matvec on the raw bytes.
void expect_gemv_imma_matches(const TiledView& v, const std::vector<uint8_t>& raw_slice) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(v.n_cols));
  for (float& e : x) e = u(rng);
  DeviceBuffer dx(x.size() * 4), dp(imma_x_bytes(v.n_cols, 1)), dy(static_cast<size_t>(v.n_rows) * 4);
  ASSERT_TRUE(test::upload(dx, x));
  ASSERT_TRUE(gemv_imma_prepare_x(dx.as<float>(), v.n_cols, 1, dp.as<unsigned char>(), nullptr));
  const auto st = gemv_imma(v, dp.as<unsigned char>(), 1, dy.as<float>(), nullptr);
  ASSERT_TRUE(st) << st.error().to_string();
  KESTREL_CUDA_OK(cudaDeviceSynchronize());
  const ref::QuantMatrix qm{v.type, raw_slice.data(), static_cast<uint64_t>(v.n_cols), static_cast<uint64_t>(v.n_rows)};
  std::vector<float> want(static_cast<size_t>(v.n_rows)), bound(static_cast<size_t>(v.n_rows));
  ASSERT_TRUE(ref::matvec(qm, x.data(), want.data()));
  std::vector<float> w(static_cast<size_t>(v.n_cols));
  const uint64_t row_bytes = *ggml_row_bytes(v.type, static_cast<uint64_t>(v.n_cols));
  for (int64_t o = 0; o < v.n_rows; ++o) {
    ASSERT_TRUE(dequantize_row(v.type, raw_slice.data() + static_cast<uint64_t>(o) * row_bytes, w.data(), v.n_cols));
    double s = 0;
    for (int64_t i = 0; i < v.n_cols; ++i) s += std::fabs(w[static_cast<size_t>(i)] * x[static_cast<size_t>(i)]);
    bound[static_cast<size_t>(o)] = static_cast<float>(s);
  }
  const auto got = test::download<float>(dy.as(), static_cast<size_t>(v.n_rows));
  const std::string diff = test::compare_close(got, want, bound, 1e-5);
  EXPECT_TRUE(diff.empty()) << diff;
}

TEST(WeightPool, TiledTensorsAreReorderedBytesThatFeedGemvImma) {
  KESTREL_REQUIRE_DEVICE();
  auto pool = WeightPool::create(4 << 20);
  ASSERT_TRUE(pool) << pool.error().to_string();
  std::vector<HostTensor> ts(3);
  ts[0].desc =
      PoolTensorDesc{"blk.0.attn_q.weight", GgmlType::kQ4_0, {256, 48}, PlacementClass::kDense, {}, PoolLayout::kTiled};
  ts[0].bytes = q4_weights(GgmlType::kQ4_0, 256, 48, 1, 1);
  ts[1].desc =
      PoolTensorDesc{"blk.0.ffn_up_exps.weight", GgmlType::kQ4_K, {512, 32, 3}, PlacementClass::kRoutedExperts, {},
                     PoolLayout::kTiled};
  ts[1].bytes = q4_weights(GgmlType::kQ4_K, 512, 32, 3, 2);
  ts[2] = make_tensor("blk.0.attn_norm.weight", GgmlType::kF32, {256}, PlacementClass::kDense, 3);
  ASSERT_TRUE(pool->register_tensors(descs(ts), nullptr));
  EXPECT_EQ(pool->bytes_in(PlacementClass::kRoutedExperts), ts[1].bytes.size());

  const auto q = pool->find("blk.0.attn_q.weight");
  const auto ex = pool->find("blk.0.ffn_up_exps.weight");
  const auto nm = pool->find("blk.0.attn_norm.weight");
  ASSERT_TRUE(q && ex && nm);
  // The device bytes are tile_matrix's output, slice by slice.
  const auto qv = pool->tiled_view(*q);
  ASSERT_TRUE(qv) << qv.error().to_string();
  EXPECT_EQ(qv->n_cols, 256);
  EXPECT_EQ(qv->n_rows, 48);
  EXPECT_EQ(test::download<uint8_t>(qv->data, ts[0].bytes.size()),
            tiled_host(GgmlType::kQ4_0, ts[0].bytes, 256, 48, 1));
  const auto e0 = pool->tiled_slice(*ex, 0);
  ASSERT_TRUE(e0) << e0.error().to_string();
  EXPECT_EQ(test::download<uint8_t>(e0->data, ts[1].bytes.size()),
            tiled_host(GgmlType::kQ4_K, ts[1].bytes, 512, 32, 3));
  // The layouts are not interchangeable.
  EXPECT_EQ(pool->view(*q).error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(pool->slice(*ex, 0).error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(pool->tiled_view(*nm).error().code, ErrorCode::kFailedPrecondition);
  EXPECT_EQ(pool->tiled_view(*ex).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(pool->tiled_slice(*ex, 3).error().code, ErrorCode::kOutOfRange);
  EXPECT_TRUE(pool->view(*nm));
  // GEMV v4 reads them: the matrix, and expert 2 of the stack.
  expect_gemv_imma_matches(*qv, ts[0].bytes);
  const auto e2 = pool->tiled_slice(*ex, 2);
  ASSERT_TRUE(e2);
  const size_t slice = ts[1].bytes.size() / 3;
  expect_gemv_imma_matches(
      *e2, std::vector<uint8_t>(ts[1].bytes.begin() + 2 * static_cast<ptrdiff_t>(slice), ts[1].bytes.end()));
}

TEST(WeightPool, UntileableTensorsAreRefusedBeforeAnyCopy) {
  KESTREL_REQUIRE_DEVICE();
  auto pool = WeightPool::create(1 << 20);
  ASSERT_TRUE(pool);
  std::vector<HostTensor> ok(1);
  ok[0] = make_tensor("a", GgmlType::kF32, {64, 2}, PlacementClass::kDense, 1);
  ASSERT_TRUE(pool->register_tensors(descs(ok), nullptr));
  const Snapshot before = snap(*pool);
  for (const auto& [t, ne] : std::vector<std::pair<GgmlType, std::vector<uint64_t>>>{
           {GgmlType::kBF16, {256, 16}},        // a type gemv_imma does not take
           {GgmlType::kQ4_0, {256, 17}},        // rows not a multiple of 16
           {GgmlType::kQ4_K, {256, 16, 2, 2}},  // 4-D
           {GgmlType::kQ4_0, {256}}}) {         // a vector
    std::vector<HostTensor> ts(2);
    ts[0] = make_tensor("b", GgmlType::kF32, {64}, PlacementClass::kDense, 2);
    ts[1] = make_tensor("c", t, ne, PlacementClass::kDense, 3);
    ts[1].desc.layout = PoolLayout::kTiled;
    const auto st = pool->register_tensors(descs(ts), nullptr);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument) << st.error().to_string();
    EXPECT_TRUE(contains(st.error().message, "'c'")) << st.error().to_string();
    EXPECT_EQ(snap(*pool), before);
  }
}

TEST(WeightPool, CatalogTilesItsMatricesButNotTheEmbedding) {
  KESTREL_REQUIRE_DEVICE();
  const ModelHparams hp = kestrel::test::tiny_hparams(Arch::kQwen35Moe);
  std::vector<kestrel::test::TensorDef> defs = kestrel::test::model_tensors(hp);
  // Q4_0 for the big matrices and the gate expert stacks whose shapes tile (and the embedding, which must stay raw);
  // Q8_0 for the attention output and the up expert stacks (gemv_imma and moe_imma take Q8_0 too).
  int tileable = 0;
  for (auto& d : defs) {
    const bool q8 = d.name.find("attn_output") != std::string::npos || d.name.find("ffn_up_exps") != std::string::npos;
    const bool big = d.name.find("attn_q") != std::string::npos || d.name.find("attn_qkv") != std::string::npos ||
                     d.name.find("exps") != std::string::npos || d.name == "token_embd.weight" || q8;
    if (!big || d.ne.size() < 2 || d.ne[0] % 64 != 0 || d.ne[1] % 16 != 0) continue;
    d.type = q8 ? GgmlType::kQ8_0 : GgmlType::kQ4_0;
    if (d.name != "token_embd.weight") ++tileable;
  }
  ASSERT_GT(tileable, 0) << "the tiny model has no tileable matrix: the test would check nothing";
  const std::string path = kestrel::test::write_gguf("pool_tiled.gguf", kestrel::test::hparams_metadata(hp), defs);
  ASSERT_FALSE(path.empty());
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file) << file.error().to_string();
  auto cat = WeightCatalog::build(*file, hp);
  ASSERT_TRUE(cat) << cat.error().to_string();
  auto pool = WeightPool::create(cat->total_bytes() + cat->n_used_tensors() * kPoolAlignment);
  ASSERT_TRUE(pool);
  const auto st = pool->register_catalog(*cat, *file, nullptr, /*tile=*/true);
  ASSERT_TRUE(st) << st.error().to_string();
  int tiled = 0;
  for (const PoolEntry& e : pool->entries()) {
    if (e.layout != PoolLayout::kTiled) continue;
    ++tiled;
    EXPECT_NE(e.key, "token_embd.weight");
    EXPECT_TRUE(e.type == GgmlType::kQ4_0 || e.type == GgmlType::kQ8_0) << e.key;
  }
  EXPECT_EQ(tiled, tileable);
  const auto embd = pool->matrix("token_embd.weight");
  EXPECT_TRUE(embd) << "the embedding stays raw for get_rows";
  for (size_t c = 0; c < kNumPlacementClasses; ++c) {
    const auto pc = static_cast<PlacementClass>(c);
    EXPECT_EQ(pool->bytes_in(pc), cat->bytes_in(pc)) << placement_class_name(pc);
  }
}

TEST(WeightPool, ArgumentErrorsWithoutDevice) {
  EXPECT_EQ(WeightPool::create(0).error().code, ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kestrel::gpu
