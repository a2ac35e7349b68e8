// Routing counts and their file (routing_counts.h).
#include "core/engine/routing_counts.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/engine/placement_planner.h"

namespace kestrel {
namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

uint64_t fnv1a(uint64_t h, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

uint64_t fnv1a_u32(uint64_t h, uint32_t v) {
  uint8_t b[4];
  std::memcpy(b, &v, 4);
  return fnv1a(h, b, 4);
}

uint64_t fnv1a_u64(uint64_t h, uint64_t v) {
  uint8_t b[8];
  std::memcpy(b, &v, 8);
  return fnv1a(h, b, 8);
}

// The key as the file writes it: 16 lowercase hex digits.
std::string key_hex(uint64_t key) {
  char text[17];
  std::snprintf(text, sizeof text, "%016" PRIx64, key);
  return text;
}

}  // namespace

uint64_t routing_key(const Model& model) {
  const ModelHparams& hp = model.hparams();
  uint64_t h = fnv1a_u32(kFnvOffset, static_cast<uint32_t>(hp.arch));
  h = fnv1a_u32(fnv1a_u32(fnv1a_u32(h, hp.n_layer), hp.n_expert), hp.n_expert_used);
  for (const PlannerTensor& t : planner_model(model.catalog()).tensors) {
    h = fnv1a_u64(fnv1a(h, reinterpret_cast<const uint8_t*>(t.name.data()), t.name.size()), t.bytes);
  }
  for (uint32_t l = 0; l < hp.n_layer; ++l) {
    const TensorRef& router = model.catalog().layer(l).ffn.router;
    if (!router.present()) continue;
    h = fnv1a(fnv1a_u32(h, l), router.data.data(), router.data.size());
  }
  return h;
}

std::string routing_counts_path(const std::string& dir, uint64_t key) {
  return dir + "/routing-" + key_hex(key) + ".txt";
}

Status save_routing_counts(const std::string& path, uint64_t key, uint32_t n_layer, uint32_t n_expert,
                           const RoutingCounts& counts) {
  if (counts.counts.size() != static_cast<size_t>(n_layer) * n_expert) {
    return make_error(ErrorCode::kInvalidArgument, "routing counts: " + std::to_string(counts.counts.size()) +
                                                       " counts for " + std::to_string(n_layer) + " layers of " +
                                                       std::to_string(n_expert) + " experts");
  }
  std::ostringstream s;
  s << "kestrel-routing-counts 1\nkey " << key_hex(key) << " layers " << n_layer << " experts " << n_expert
    << " tokens " << counts.tokens << "\n";
  for (uint32_t l = 0; l < n_layer; ++l) {
    for (uint32_t e = 0; e < n_expert; ++e) {
      s << (e ? " " : "") << counts.counts[static_cast<size_t>(l) * n_expert + e];
    }
    s << "\n";
  }
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty() && !std::filesystem::create_directories(dir, ec) && ec) {
    return make_error(ErrorCode::kIo, "routing counts: cannot create " + dir.string() + ": " + ec.message());
  }
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << s.str();
    f.flush();
    if (!f) return make_error(ErrorCode::kIo, "routing counts: cannot write " + tmp + ": " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return make_error(ErrorCode::kIo, "routing counts: cannot rename " + tmp + " to " + path + ": " + why);
  }
  return ok_status();
}

Expected<RoutingCounts> load_routing_counts(const std::string& path, uint64_t key, uint32_t n_layer,
                                            uint32_t n_expert) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return make_error(ErrorCode::kNotFound, "routing counts: no file " + path);
  auto bad = [&](const std::string& why) {
    return make_error(ErrorCode::kInvalidArgument, "routing counts " + path + ": " + why);
  };
  std::string magic, key_word, key_text, w_layers, w_experts, w_tokens;
  int version = 0;
  uint64_t layers = 0, experts = 0;
  RoutingCounts out;
  if (!(f >> magic >> version) || magic != "kestrel-routing-counts" || version != 1) {
    return bad("not a routing counts file (version 1)");
  }
  if (!(f >> key_word >> key_text >> w_layers >> layers >> w_experts >> experts >> w_tokens >> out.tokens) ||
      key_word != "key" || w_layers != "layers" || w_experts != "experts" || w_tokens != "tokens" ||
      key_text.size() != 16 || out.tokens < 0) {
    return bad("malformed header");
  }
  if (const std::string want = key_hex(key); key_text != want) {
    return bad("counted with other router weights (key " + key_text + ", this model " + want + ")");
  }
  if (layers != n_layer || experts != n_expert) {
    return bad(std::to_string(layers) + " layers of " + std::to_string(experts) + " experts, the model has " +
               std::to_string(n_layer) + " of " + std::to_string(n_expert));
  }
  out.counts.resize(static_cast<size_t>(n_layer) * n_expert);
  for (uint64_t& c : out.counts) {
    if (!(f >> c)) return bad("fewer counts than " + std::to_string(out.counts.size()));
  }
  std::string rest;
  if (f >> rest) return bad("text after the counts");
  return out;
}

}  // namespace kestrel
