// ModelPlan: everything kestrel-mkmodel will write, computed without writing anything: the preset, every tensor of
// expected_tensors() with its type, byte size and value distribution, and the totals. `--dry-run` prints it.
//
// Plain value type; thread-safe to share const.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/base/expected.h"
#include "core/gguf/ggml_type.h"
#include "core/model/tensor_layout.h"
#include "tools/mkmodel/presets.h"
#include "tools/mkmodel/weight_init.h"

namespace kestrel::mkmodel {

inline constexpr uint64_t kDefaultSeed = 42;

struct PlanOptions {
  uint64_t seed = kDefaultSeed;
  std::optional<GgmlType> uniform_type;  // --types: every quantizable tensor in this type
  GdnInputLayout gdn_input = GdnInputLayout::kSplit;
};

struct PlannedTensor {
  TensorSpec spec;
  GgmlType type = GgmlType::kF32;
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;  // unpadded
  WeightInit init;
};

struct ModelPlan {
  Preset preset;
  PlanOptions options;
  LayoutOptions layout;  // the preset's, with options.gdn_input
  uint32_t file_type = 0;
  std::vector<PlannedTensor> tensors;

  uint64_t tensor_bytes() const;                          // sum of n_bytes
  uint64_t data_section_bytes(uint64_t alignment) const;  // each tensor padded to the alignment
  uint64_t parameter_count() const;                       // sum of n_elements
};

// kInvalidArgument for a --types that does not fit a tensor (names it) or a legacy GDN layout on qwen35*; the
// preset's hparams must pass ModelHparams::validate().
Expected<ModelPlan> make_model_plan(const Preset& preset, const PlanOptions& options);

// The --dry-run text: one line per tensor (name, shape, type, bytes, placement, init), then per-type and per-class
// totals and the tensor-data size.
std::string format_plan(const ModelPlan& plan);

}  // namespace kestrel::mkmodel
