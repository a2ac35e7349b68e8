#include "core/model/model.h"

namespace kestrel {
namespace {

Error with_path(const std::string& path, Error e) {
  e.message = path + ": " + e.message;
  return e;
}

}  // namespace

Expected<std::unique_ptr<Model>> Model::open(const std::string& path) {
  auto file = GgufFile::open(path);
  if (!file) return std::move(file).error();  // the reader's messages already name the path
  std::unique_ptr<Model> m(new Model(std::move(*file)));
  auto hp = ModelHparams::from_gguf(m->file_);
  if (!hp) return with_path(path, std::move(hp).error());
  auto catalog = WeightCatalog::build(m->file_, *hp);
  if (!catalog) return with_path(path, std::move(catalog).error());
  m->catalog_ = std::make_unique<WeightCatalog>(std::move(*catalog));
  auto tok = Tokenizer::from_gguf(m->file_);
  if (!tok) return with_path(path, std::move(tok).error());
  m->tokenizer_ = std::make_unique<Tokenizer>(std::move(*tok));
  return m;
}

}  // namespace kestrel
