// The GGUF metadata of a kestrel-mkmodel file (model-spec §6.1): general.*, every `<arch>.*` key llama.cpp's converter
// writes for these architectures (with its value types: uint32 counts, float32 eps/base, int32 rope sections), and the
// kestrel.mkmodel.* provenance keys. The tokenizer keys are added separately (vocab_source.h).
//
// Not thread-safe (drives one writer).
#pragma once

#include "core/base/expected.h"
#include "core/gguf/gguf_writer.h"
#include "tools/mkmodel/model_plan.h"

namespace kestrel::mkmodel {

Status add_model_metadata(GgufWriter& writer, const ModelPlan& plan);

}  // namespace kestrel::mkmodel
