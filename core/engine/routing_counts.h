// Routing counts for the placement planner (placement_planner.h fills a GPU budget hottest expert first): how many
// tokens chose each routed expert of each layer, and the file that keeps them between runs.
//
// The file is text, one header and one line per layer:
//   kestrel-routing-counts 1
//   key <16 hex digits> layers <n_layer> experts <n_expert> tokens <tokens>
//   <n_expert counts of layer 0>
//   ...
// The key is routing_key(model): a hash of the architecture, the routing hparams, every used tensor's name and size
// (so its type and shape) and every router tensor's bytes, so counts are used only with the model layout and routers
// that produced them (another quantization, another architecture or a fine-tune with other routers has another).
// Writes go to PATH.tmp (its directory made if missing), then a rename, so a reader sees a whole file or none.
//
// Thread-safety: pure functions over their arguments and the file system.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/expected.h"
#include "core/model/model.h"

namespace kestrel {

struct RoutingCounts {
  std::vector<uint64_t> counts;  // [n_layer][n_expert] flattened; zero rows for layers without routed experts
  int64_t tokens = 0;            // tokens that produced them
};

// FNV-1a (64-bit) over the architecture, n_layer, n_expert, n_expert_used, every used tensor's name and bytes in the
// file, and every MoE layer's router bytes.
uint64_t routing_key(const Model& model);

// The counts file of `key` in directory `dir`: DIR/routing-<the key's 16 hex digits>.txt.
std::string routing_counts_path(const std::string& dir, uint64_t key);

Status save_routing_counts(const std::string& path, uint64_t key, uint32_t n_layer, uint32_t n_expert,
                           const RoutingCounts& counts);

// kNotFound when there is no file; kInvalidArgument naming what is wrong when it is not a counts file, holds
// another key (other routers) or another geometry.
Expected<RoutingCounts> load_routing_counts(const std::string& path, uint64_t key, uint32_t n_layer, uint32_t n_expert);

}  // namespace kestrel
