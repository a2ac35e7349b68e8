// ExpertSet and the batch checks every ExpertBackend makes (expert_backend.h).
#include "core/engine/expert_backend.h"

#include <algorithm>
#include <cstddef>
#include <string>

namespace kestrel {
namespace {

size_t sz(int64_t v) { return static_cast<size_t>(v); }

// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

std::string at(int32_t layer) { return "expert batch for layer " + std::to_string(layer) + ": "; }

}  // namespace

bool ExpertSet::holds(int32_t layer, int32_t expert) const {
  if (layer < 0 || sz(layer) >= held.size()) return false;
  const std::vector<uint8_t>& row = held[sz(layer)];
  return expert >= 0 && sz(expert) < row.size() && row[sz(expert)] != 0;
}

uint64_t ExpertSet::count() const {
  uint64_t n = 0;
  for (const std::vector<uint8_t>& row : held)
    n += static_cast<uint64_t>(std::count_if(row.begin(), row.end(), [](uint8_t h) { return h != 0; }));
  return n;
}

std::vector<bool> ExpertSet::layers() const {
  std::vector<bool> out(held.size(), false);
  for (size_t l = 0; l < held.size(); ++l) {
    out[l] = std::any_of(held[l].begin(), held[l].end(), [](uint8_t h) { return h != 0; });
  }
  return out;
}

ExpertSet ExpertSet::all(const ModelHparams& hp) {
  ExpertSet s;
  s.held.assign(hp.n_layer, hp.is_moe() ? std::vector<uint8_t>(hp.n_expert, 1) : std::vector<uint8_t>());
  return s;
}

ExpertSet ExpertSet::on_device(const PlacementDecision& decision, WeightDevice device) {
  ExpertSet s;
  const uint8_t want = device == WeightDevice::kGpu ? 1 : 0;
  for (const std::vector<uint8_t>& on_gpu : decision.expert_on_gpu) {
    std::vector<uint8_t> row(on_gpu.size());
    for (size_t e = 0; e < on_gpu.size(); ++e) row[e] = (on_gpu[e] != 0 ? 1 : 0) == want ? 1 : 0;
    if (std::find(row.begin(), row.end(), uint8_t{1}) == row.end()) row.clear();
    s.held.push_back(std::move(row));
  }
  return s;
}

Status check_expert_batch(const ExpertBatch& b, const ExpertSet& held, int32_t hidden) {
  if (b.layer < 0 || sz(b.layer) >= held.held.size()) {
    return make_error(ErrorCode::kOutOfRange, "expert batch: layer " + std::to_string(b.layer) + " is outside [0, " +
                                                  std::to_string(held.held.size()) + ")");
  }
  const std::vector<uint8_t>& row = held.held[sz(b.layer)];
  if (b.hidden != hidden) {
    return make_error(ErrorCode::kInvalidArgument, at(b.layer) + "rows of " + std::to_string(b.hidden) +
                                                       " elements, the model's are " + std::to_string(hidden));
  }
  if (b.n_tokens < 0) {
    return make_error(ErrorCode::kInvalidArgument, at(b.layer) + "negative token count " + std::to_string(b.n_tokens));
  }
  // A layer whose row is empty holds nothing here: its id range is unknown, so any choice not marked is refused
  // below as not held; k is bounded by kMaxExpertChoices alone.
  const int32_t n_expert = static_cast<int32_t>(row.size());
  const int32_t k_max = row.empty() ? kMaxExpertChoices : std::min(n_expert, kMaxExpertChoices);
  if (b.k < 1 || b.k > k_max) {
    return make_error(
        ErrorCode::kInvalidArgument,
        at(b.layer) + std::to_string(b.k) + " choices per token, outside [1, " + std::to_string(k_max) + "]");
  }
  if (b.n_tokens == 0) return ok_status();
  if (b.x == nullptr || b.choices == nullptr || b.y == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, at(b.layer) + "a null input, choices or output buffer");
  }
  const size_t rows_bytes = sz(b.n_tokens) * sz(b.hidden) * sizeof(float);
  const size_t choice_bytes = sz(b.n_tokens) * sz(b.k) * sizeof(ExpertChoice);
  if (overlaps(b.y, rows_bytes, b.x, rows_bytes) || overlaps(b.y, rows_bytes, b.choices, choice_bytes)) {
    return make_error(ErrorCode::kInvalidArgument, at(b.layer) + "the output rows overlap the input or the choices");
  }
  for (int32_t t = 0; t < b.n_tokens; ++t) {
    const ExpertChoice* c = b.choices + sz(t) * sz(b.k);
    for (int32_t j = 0; j < b.k; ++j) {
      const int32_t e = c[j].expert;
      if (e == kExpertNotHere) continue;
      auto where = [&] { return at(b.layer) + "token " + std::to_string(t) + " choice " + std::to_string(j) + ": "; };
      if (e < 0 || (!row.empty() && e >= n_expert)) {
        return make_error(ErrorCode::kOutOfRange, where() + "expert id " + std::to_string(e) + " is outside [0, " +
                                                      std::to_string(n_expert) + ") (and is not kExpertNotHere)");
      }
      if (!held.holds(b.layer, e)) {
        return make_error(ErrorCode::kNotFound,
                          where() + "expert " + std::to_string(e) + " is not held by this backend");
      }
      for (int32_t i = 0; i < j; ++i) {
        if (c[i].expert == e) {
          return make_error(ErrorCode::kInvalidArgument,
                            where() + "expert " + std::to_string(e) + " is also choice " + std::to_string(i));
        }
      }
    }
  }
  return ok_status();
}

}  // namespace kestrel
