// ScratchDir: a fresh folder of the test's own under the system temp folder (mkdtemp, so unique across the test
// processes ctest runs in parallel), removed with everything in it when the ScratchDir goes out of scope. Shared by
// the daemon tests (sockets, configs, caches, model files).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace kestrel::test {

class ScratchDir {
 public:
  explicit ScratchDir(std::string_view prefix = "kestrel-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();  // no scratch folder: nothing a test could do
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }
  // Writes `text` to the file `name` in the folder; returns its path.
  std::string write(std::string_view name, std::string_view text) const {
    const std::filesystem::path p = path_ / name;
    std::ofstream(p) << text;
    return p.string();
  }

 private:
  std::filesystem::path path_;
};

}  // namespace kestrel::test
