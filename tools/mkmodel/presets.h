// The model shapes kestrel-mkmodel can write: tiny test models for each architecture and the full-size shapes of the
// released checkpoints (model-spec.md §1). docs/mkmodel.md lists them with their sizes.
//
// Plain data; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/expected.h"
#include "core/model/model_hparams.h"
#include "core/model/tensor_layout.h"

namespace kestrel::mkmodel {

struct Preset {
  std::string name;         // "tiny", "qwen35moe-35b-a3b", ...
  std::string description;  // one line for --list-presets
  ModelHparams hparams;     // validated; layer_kinds follow full_attention_interval
  uint32_t full_attention_interval = 4;
  // qwen3next checkpoints carry an (unused) dense intermediate_size that the converter writes as
  // feed_forward_length; 0: the key is not written for MoE archs.
  uint32_t moe_unused_feed_forward_length = 0;
  LayoutOptions layout;    // tied_output: output.weight omitted
  bool full_size = false;  // a multi-GB file: progress is shown
};

std::vector<std::string> preset_names();
// kNotFound naming the known presets.
Expected<Preset> find_preset(std::string_view name);
// `tiny` with an architecture: "tiny" + qwen3next -> "tiny-qwen3next" (qwen35moe -> "tiny"). A full-size preset must
// match `arch` (kInvalidArgument otherwise) and keeps its name.
Expected<std::string> preset_for_arch(std::string_view preset, Arch arch);

}  // namespace kestrel::mkmodel
