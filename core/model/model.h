// Model: one GGUF model file opened for serving — the mapping, its hyper-parameters, the checked weight catalog
// and the tokenizer, kept together because the catalog and the tokenizer views point into the mapping.
//
// open() runs every check (GGUF structure, hparams, catalog, tokenizer) and returns the first failure as an Error
// that names the file. The Model is immovable (held by unique_ptr) so the catalog's pointers stay valid.
// Immutable after open(); const methods are thread-safe.
#pragma once

#include <memory>
#include <string>

#include "core/base/expected.h"
#include "core/gguf/gguf_reader.h"
#include "core/model/model_hparams.h"
#include "core/model/weight_catalog.h"
#include "core/tokenizer/tokenizer.h"

namespace kestrel {

class Model {
 public:
  static Expected<std::unique_ptr<Model>> open(const std::string& path);

  const GgufFile& file() const { return file_; }
  const ModelHparams& hparams() const { return catalog_->hparams(); }
  const WeightCatalog& catalog() const { return *catalog_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

 private:
  explicit Model(GgufFile file) : file_(std::move(file)) {}

  GgufFile file_;
  std::unique_ptr<WeightCatalog> catalog_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

}  // namespace kestrel
