// make_model_plan() and format_plan(): the tensor list, types, sizes and distributions of a kestrel-mkmodel file.
#include "tools/mkmodel/model_plan.h"

#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "core/gguf/gguf_reader.h"
#include "tools/mkmodel/tensor_types.h"

namespace kestrel::mkmodel {

namespace {

std::string shape_string(const std::vector<uint64_t>& ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n >= (uint64_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(n) / (1 << 30));
  } else if (n >= (uint64_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(n) / (1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(n) / 1024);
  }
  return buf;
}

}  // namespace

uint64_t ModelPlan::tensor_bytes() const {
  uint64_t total = 0;
  for (const PlannedTensor& t : tensors) total += t.n_bytes;
  return total;
}

uint64_t ModelPlan::data_section_bytes(uint64_t alignment) const {
  uint64_t total = 0;
  for (const PlannedTensor& t : tensors) total += (t.n_bytes + alignment - 1) / alignment * alignment;
  return total;
}

uint64_t ModelPlan::parameter_count() const {
  uint64_t total = 0;
  for (const PlannedTensor& t : tensors) total += t.n_elements;
  return total;
}

Expected<ModelPlan> make_model_plan(const Preset& preset, const PlanOptions& options) {
  KESTREL_TRY(preset.hparams.validate());
  if (options.gdn_input == GdnInputLayout::kLegacySsmIn && preset.hparams.arch != Arch::kQwen3Next) {
    return make_error(ErrorCode::kInvalidArgument, "the legacy ssm_in GDN layout exists only for qwen3next, not " +
                                                       std::string(arch_name(preset.hparams.arch)));
  }
  ModelPlan plan;
  plan.preset = preset;
  plan.options = options;
  plan.layout = preset.layout;
  plan.layout.gdn_input = options.gdn_input;
  plan.file_type = file_type_for(options.uniform_type);

  std::vector<TensorSpec> specs = expected_tensors(preset.hparams, plan.layout);
  KESTREL_TRY_ASSIGN(std::vector<GgmlType> types, choose_tensor_types(preset.hparams, specs, options.uniform_type));
  plan.tensors.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    PlannedTensor t;
    t.n_elements = 1;
    for (uint64_t d : specs[i].ne) t.n_elements *= d;
    KESTREL_TRY_ASSIGN(uint64_t row_bytes, ggml_row_bytes(types[i], specs[i].ne[0]));
    t.n_bytes = row_bytes * (t.n_elements / specs[i].ne[0]);
    t.type = types[i];
    t.init = weight_init_for(specs[i]);
    t.spec = std::move(specs[i]);
    plan.tensors.push_back(std::move(t));
  }
  return plan;
}

std::string format_plan(const ModelPlan& plan) {
  const ModelHparams& hp = plan.preset.hparams;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "preset %s (%s), seed %llu, %s\n", plan.preset.name.c_str(),
                std::string(arch_name(hp.arch)).c_str(), static_cast<unsigned long long>(plan.options.seed),
                plan.options.uniform_type
                    ? ("all quantizable weights " + std::string(ggml_type_name(*plan.options.uniform_type))).c_str()
                    : "Q4_K_M types");
  out += line;
  std::snprintf(line, sizeof line, "%-36s %-22s %-6s %14s  %-14s %s\n", "tensor", "shape", "type", "bytes", "class",
                "init");
  out += line;
  std::map<std::string, uint64_t> by_type;
  std::map<std::string, uint64_t> by_class;
  for (const PlannedTensor& t : plan.tensors) {
    std::snprintf(line, sizeof line, "%-36s %-22s %-6s %14llu  %-14s %s\n", t.spec.name.c_str(),
                  shape_string(t.spec.ne).c_str(), std::string(ggml_type_name(t.type)).c_str(),
                  static_cast<unsigned long long>(t.n_bytes),
                  std::string(placement_class_name(t.spec.placement)).c_str(), t.init.describe().c_str());
    out += line;
    by_type[std::string(ggml_type_name(t.type))] += t.n_bytes;
    by_class[std::string(placement_class_name(t.spec.placement))] += t.n_bytes;
  }
  for (const auto& [name, bytes] : by_type) {
    std::snprintf(line, sizeof line, "type  %-14s %16llu bytes (%s)\n", name.c_str(),
                  static_cast<unsigned long long>(bytes), human_bytes(bytes).c_str());
    out += line;
  }
  for (const auto& [name, bytes] : by_class) {
    std::snprintf(line, sizeof line, "class %-14s %16llu bytes (%s)\n", name.c_str(),
                  static_cast<unsigned long long>(bytes), human_bytes(bytes).c_str());
    out += line;
  }
  const uint64_t data = plan.data_section_bytes(kGgufDefaultAlignment);
  std::snprintf(line, sizeof line,
                "total: %zu tensors, %llu parameters, %llu tensor bytes, %llu bytes of tensor data in the file (%s)\n",
                plan.tensors.size(), static_cast<unsigned long long>(plan.parameter_count()),
                static_cast<unsigned long long>(plan.tensor_bytes()), static_cast<unsigned long long>(data),
                human_bytes(data).c_str());
  out += line;
  return out;
}

}  // namespace kestrel::mkmodel
