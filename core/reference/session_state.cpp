#include "core/reference/session_state.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace kestrel::ref {
namespace {

// Little helpers for the snapshot byte format: native little-endian PODs appended/read in order.
// resize + memcpy rather than vector::insert: GCC 12 at -O3 reports a false -Wstringop-overflow for the latter.
void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  if (n == 0) return;
  const size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, p, n);
}

template <class T>
void put(std::vector<uint8_t>& out, const T& v) {
  put_bytes(out, &v, sizeof(T));
}

void put_floats(std::vector<uint8_t>& out, const float* v, size_t n) { put_bytes(out, v, n * sizeof(float)); }

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  template <class T>
  bool get(T& v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool get_floats(std::vector<float>& v) {
    const size_t n = v.size() * sizeof(float);
    if (b_.size() - pos_ < n) return false;
    std::memcpy(v.data(), b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h;
}

bool same_bits(const float* a, const float* b, size_t n) { return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0; }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && same_bits(a.data(), b.data(), a.size());
}

Error corrupt(const std::string& what) { return make_error(ErrorCode::kDataLoss, "session snapshot: " + what); }

}  // namespace

Expected<SessionState> SessionState::create(const ModelHparams& hp, int n_ctx) {
  if (n_ctx < 1 || (hp.n_ctx_train > 0 && static_cast<uint32_t>(n_ctx) > hp.n_ctx_train)) {
    return make_error(ErrorCode::kOutOfRange, "context of " + std::to_string(n_ctx) + " tokens is outside 1.." +
                                                  std::to_string(hp.n_ctx_train) + " (the model's context_length)");
  }
  SessionState s;
  s.n_ctx_ = n_ctx;
  s.kinds_ = hp.layer_kinds;
  s.gdn_.resize(hp.n_layer);
  s.kv_.resize(hp.n_layer);
  const GdnDims dims = GdnDims::from_hparams(hp);
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    if (hp.layer_kinds[l] == LayerKind::kGatedDeltaNet) {
      s.gdn_[l] = GdnState::zeros(dims);
    } else {
      KESTREL_TRY_ASSIGN(s.kv_[l], KvCache::make(n_ctx, static_cast<int>(hp.n_head_kv), static_cast<int>(hp.head_dim)));
    }
  }
  return s;
}

void SessionState::reset() {
  for (GdnState& g : gdn_) {
    std::fill(g.s.begin(), g.s.end(), 0.0f);
    std::fill(g.conv.begin(), g.conv.end(), 0.0f);
  }
  for (KvCache& c : kv_) c.clear();
  n_past_ = 0;
}

Status SessionState::copy_from(const SessionState& src) {
  if (this == &src) return ok_status();
  if (src.kinds_ != kinds_) return make_error(ErrorCode::kInvalidArgument, "slot clone: the source is a state of another model");
  if (src.n_past_ > n_ctx_) {
    return make_error(ErrorCode::kOutOfRange, "slot clone: the source holds " + std::to_string(src.n_past_) +
                                                  " tokens, the destination only " + std::to_string(n_ctx_));
  }
  if (src.n_ctx_ == n_ctx_) {
    *this = src;
    return ok_status();
  }
  for (size_t l = 0; l < kinds_.size(); ++l) {
    if (kinds_[l] == LayerKind::kGatedDeltaNet) {
      gdn_[l] = src.gdn_[l];
      continue;
    }
    const KvCache& from = src.kv_[l];
    KvCache& to = kv_[l];
    const size_t n = static_cast<size_t>(from.n_used) * static_cast<size_t>(from.n_head_kv) *
                     static_cast<size_t>(from.head_dim);  // f32 [n_used, n_head_kv, head_dim]
    std::copy_n(from.k.begin(), n, to.k.begin());
    std::copy_n(from.v.begin(), n, to.v.begin());
    to.n_used = from.n_used;
  }
  n_past_ = src.n_past_;
  return ok_status();
}

uint64_t SessionState::geometry_hash() const {
  uint64_t h = mix(0, static_cast<uint64_t>(n_ctx_));
  h = mix(h, kinds_.size());
  for (size_t l = 0; l < kinds_.size(); ++l) {
    h = mix(h, static_cast<uint64_t>(kinds_[l]));
    h = mix(h, gdn_[l].s.size());
    h = mix(h, gdn_[l].conv.size());
    h = mix(h, static_cast<uint64_t>(kv_[l].n_head_kv));
    h = mix(h, static_cast<uint64_t>(kv_[l].head_dim));
  }
  return h;
}

// Layout: magic u32, version u32, geometry hash u64, n_past u64, then per layer in order:
// GDN: s f32[...], conv f32[...]; attention: K and V of the first n_past positions.
std::vector<uint8_t> SessionState::snapshot() const {
  std::vector<uint8_t> out;
  put(out, kSnapshotMagic);
  put(out, kSnapshotVersion);
  put(out, geometry_hash());
  put(out, static_cast<uint64_t>(n_past_));
  for (size_t l = 0; l < kinds_.size(); ++l) {
    if (kinds_[l] == LayerKind::kGatedDeltaNet) {
      put_floats(out, gdn_[l].s.data(), gdn_[l].s.size());
      put_floats(out, gdn_[l].conv.data(), gdn_[l].conv.size());
    } else {
      const KvCache& c = kv_[l];
      const size_t n = static_cast<size_t>(c.n_used) * c.n_head_kv * c.head_dim;
      put_floats(out, c.k.data(), n);
      put_floats(out, c.v.data(), n);
    }
  }
  return out;
}

Status SessionState::restore(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  uint32_t magic = 0, version = 0;
  uint64_t hash = 0, n_past = 0;
  if (!r.get(magic) || magic != kSnapshotMagic) return corrupt("bad magic (not a Kestrel session snapshot)");
  if (!r.get(version) || version != kSnapshotVersion) {
    return make_error(ErrorCode::kUnsupported, "session snapshot version " + std::to_string(version) +
                                                   " (this build reads version " + std::to_string(kSnapshotVersion) +
                                                   ")");
  }
  if (!r.get(hash)) return corrupt("truncated header");
  if (hash != geometry_hash()) {
    return make_error(ErrorCode::kInvalidArgument, "session snapshot was taken for a different model or context size");
  }
  if (!r.get(n_past)) return corrupt("truncated header");
  if (n_past > static_cast<uint64_t>(n_ctx_)) return corrupt("position exceeds the context size");
  SessionState next = *this;  // restore into a copy: *this stays unchanged on error
  next.n_past_ = static_cast<int64_t>(n_past);
  for (size_t l = 0; l < kinds_.size(); ++l) {
    if (kinds_[l] == LayerKind::kGatedDeltaNet) {
      if (!r.get_floats(next.gdn_[l].s) || !r.get_floats(next.gdn_[l].conv)) return corrupt("truncated GDN state");
    } else {
      KvCache& c = next.kv_[l];
      c.n_used = static_cast<int>(n_past);
      const size_t n = static_cast<size_t>(c.n_used) * c.n_head_kv * c.head_dim;
      std::vector<float> k(n), v(n);
      if (!r.get_floats(k) || !r.get_floats(v)) return corrupt("truncated KV cache");
      std::copy(k.begin(), k.end(), c.k.begin());
      std::copy(v.begin(), v.end(), c.v.begin());
    }
  }
  if (!r.done()) return corrupt("trailing bytes after the last layer");
  *this = std::move(next);
  return ok_status();
}

bool SessionState::operator==(const SessionState& o) const {
  if (n_ctx_ != o.n_ctx_ || kinds_ != o.kinds_ || n_past_ != o.n_past_) return false;
  for (size_t l = 0; l < kinds_.size(); ++l) {
    if (!same_bits(gdn_[l].s, o.gdn_[l].s) || !same_bits(gdn_[l].conv, o.gdn_[l].conv)) return false;
    const KvCache& a = kv_[l];
    const KvCache& b = o.kv_[l];
    if (a.n_used != b.n_used) return false;
    const size_t n = static_cast<size_t>(a.n_used) * a.n_head_kv * a.head_dim;
    if (!same_bits(a.k.data(), b.k.data(), n) || !same_bits(a.v.data(), b.v.data(), n)) return false;
  }
  return true;
}

}  // namespace kestrel::ref
