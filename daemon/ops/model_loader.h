// Loading the served model with progress: the GGUF file is read through once (sequential reads into the page cache,
// so the first requests do not fault the weights in one page at a time), reporting each 10% to a callback, then
// opened and checked by kestrel::Model::open (which maps the cached pages).
//
// Blocking; call from main() during start-up. The callback runs on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/base/expected.h"
#include "core/model/model.h"

namespace kestrel::daemon::ops {

// percent: 0..100; bytes_done / bytes_total of the file read so far.
using LoadProgress = std::function<void(int percent, uint64_t bytes_done, uint64_t bytes_total)>;

// kNotFound / kIo naming the file when it cannot be read; Model::open's error (naming the file) when it is not a
// usable model (corrupt, truncated, unsupported architecture).
Expected<std::unique_ptr<Model>> load_model(const std::string& path, const LoadProgress& progress);

}  // namespace kestrel::daemon::ops
