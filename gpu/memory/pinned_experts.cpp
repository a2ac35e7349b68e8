// PinnedExperts (pinned_experts.h).
#include "gpu/memory/pinned_experts.h"

#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <thread>

#include "core/base/byte_size.h"
#include "gpu/cuda_check.h"

namespace kestrel::gpu {
namespace {

constexpr uint64_t kHugePage = uint64_t{2} << 20;

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// One stack's bytes in the file and its place in the copy.
struct Piece {
  std::span<const uint8_t> source;
  uint64_t offset;
};

// Copies every piece to base + offset with `threads` threads started once, thread i taking the i-th of `threads`
// contiguous parts of each piece.
void copy_pieces(const std::vector<Piece>& pieces, uint8_t* base, int threads) {
  const auto t = static_cast<uint64_t>(threads);
  auto part = [&](uint64_t i) {
    for (const Piece& p : pieces) {
      const uint64_t n = p.source.size(), from = n * i / t;
      std::memcpy(base + p.offset + from, p.source.data() + from, n * (i + 1) / t - from);
    }
  };
  std::vector<std::thread> workers;
  for (uint64_t i = 1; i < t; ++i) workers.emplace_back(part, i);
  part(0);
  for (std::thread& w : workers) w.join();
}

// The host's MemAvailable (/proc/meminfo) in bytes; 0 when it cannot be read.
uint64_t host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (f >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace

Expected<std::unique_ptr<PinnedExperts>> PinnedExperts::create(const Model& model, const std::vector<bool>& layers,
                                                               int threads) {
  const WeightCatalog& catalog = model.catalog();
  const uint32_t n_layer = catalog.hparams().n_layer;
  if (layers.size() != n_layer) {
    return make_error(ErrorCode::kInvalidArgument, "pinned experts: " + std::to_string(layers.size()) +
                                                       " layer flags for a model of " + std::to_string(n_layer));
  }
  if (threads < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "pinned experts: " + std::to_string(threads) + " copy threads (at least 1)");
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<PinnedExperts> p(new PinnedExperts());
  p->layers_.resize(n_layer);
  p->device_layers_.resize(n_layer);
  // Where each chosen stack goes: 2 MiB apart (kernel-friendly alignment, whole huge pages).
  std::vector<Piece> pieces;
  std::vector<const uint8_t**> into;
  uint64_t size = 0;
  for (uint32_t l = 0; l < n_layer; ++l) {
    if (!layers[l]) continue;
    const FfnWeights& f = catalog.layer(l).ffn;
    if (!f.is_moe() || !f.gate_exps.present() || !f.up_exps.present() || !f.down_exps.present()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "pinned experts: layer " + std::to_string(l) + " has no routed experts");
    }
    Layer& out = p->layers_[l];
    for (auto [t, view] : {std::pair{&f.gate_exps, &out.gate}, {&f.up_exps, &out.up}, {&f.down_exps, &out.down}}) {
      pieces.push_back({t->data, size});
      into.push_back(view);
      p->bytes_ += t->data.size();
      size = align_up(size + t->data.size(), kHugePage);
    }
  }
  if (size == 0) return p;
  const uint64_t available = host_available_bytes();
  if (available != 0 && size + kPinnedHeadroomBytes > available) {
    return make_error(ErrorCode::kResourceExhausted, "pinned experts: " + format_byte_size(size) +
                                                         " of page-locked experts would leave less than " +
                                                         format_byte_size(kPinnedHeadroomBytes) + " of the host's " +
                                                         format_byte_size(available) + " available");
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    return make_error(ErrorCode::kInternal,
                      "pinned experts: mapping " + format_byte_size(size) + " failed: " + std::strerror(errno));
  }
  p->base_ = base;
  p->mapped_ = size;
  (void)madvise(base, size, MADV_HUGEPAGE);  // a hint: without transparent huge pages the copy is the same
  auto* at = static_cast<uint8_t*>(base);
  copy_pieces(pieces, at, threads);
  for (size_t i = 0; i < pieces.size(); ++i) *into[i] = at + pieces[i].offset;
  KESTREL_CUDA_TRY(cudaHostRegister(base, size, cudaHostRegisterMapped));
  p->registered_ = true;
  void* dev = nullptr;
  KESTREL_CUDA_TRY(cudaHostGetDevicePointer(&dev, base, 0));
  auto device_of = [&](const uint8_t* host) {
    return host == nullptr ? nullptr : static_cast<const uint8_t*>(dev) + (host - static_cast<const uint8_t*>(base));
  };
  for (uint32_t l = 0; l < n_layer; ++l) {
    const Layer& h = p->layers_[l];
    p->device_layers_[l] = Layer{device_of(h.gate), device_of(h.up), device_of(h.down)};
  }
  p->seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

PinnedExperts::~PinnedExperts() {
  if (registered_) cudaHostUnregister(base_);
  if (base_ != nullptr) munmap(base_, mapped_);
}

}  // namespace kestrel::gpu
