// write_model(): streams a ModelPlan into a GGUF file with bounded memory and several generator threads.
//
// Each tensor is cut into chunks of whole blocks (at most chunk_bytes each); worker threads generate chunks in any
// order into a ring of 2 * threads buffers, and the calling thread appends them to the GgufWriter strictly in file
// order. Because a block's bytes depend only on (seed, tensor name, block index), the file is byte-identical for any
// thread count and chunk size. Peak memory: metadata (the vocabulary) + 2 * threads * chunk_bytes.
//
// Blocking; the caller's thread drives the writer. Safe to call from several threads for different paths.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include "core/base/expected.h"
#include "core/gguf/gguf_writer.h"
#include "tools/mkmodel/model_plan.h"

namespace kestrel::mkmodel {

struct WriteOptions {
  unsigned threads = 0;                      // generator threads; 0: hardware concurrency, at least 2
  uint64_t chunk_bytes = uint64_t{8} << 20;  // generation unit (rounded down to whole blocks, at least one block)
  std::FILE* progress = nullptr;             // progress lines (percentage, MB/s, ETA); nullptr: silent
};

struct WriteStats {
  uint64_t file_bytes = 0;
  double seconds = 0.0;
};

// Adds metadata beyond the model keys (the tokenizer) before the header is written.
using MetadataHook = std::function<Status(GgufWriter&)>;

// Writes `plan` to `path` (replaced if it exists). On error the partial file is removed.
Expected<WriteStats> write_model(const ModelPlan& plan, const std::string& path, const MetadataHook& extra_metadata,
                                 const WriteOptions& options);

}  // namespace kestrel::mkmodel
