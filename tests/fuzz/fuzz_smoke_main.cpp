// Deterministic driver for the fuzz targets that keep a seed corpus in tests/fuzz/corpus/<target>/ (every target but
// the GGUF reader, whose driver makes its seeds with GgufWriter: fuzz_driver_main.cpp). CTest runs each target
// through it as `fuzz_<target>_smoke` (label unit): every corpus file, then a fixed number of seeded mutations of them,
// so CI exercises each parser on its corpus in a few seconds; the libFuzzer build (KESTREL_FUZZ=ON) explores the
// same target for as long as it is given.
//
// Mutations, 1-4 per input: bit flips, bytes set to 0x00/0xFF/0x7F/0x80, truncation, insertion of random or
// interesting bytes, deletion, duplication of a chunk, a chunk copied from another corpus file (crossover), and
// little-endian integers set to boundary values. Same corpus, same seed, same inputs: a failure reproduces.
//
//   fuzz_X_smoke CORPUS_DIR [--iterations N] [--seed S] [--max-len L]   run the corpus, then N mutations (default 5000)
//   fuzz_X_smoke FILE...                                                 run the target on each file (replay a crash)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

Bytes read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class Mutator {
 public:
  Mutator(const std::vector<Bytes>& corpus, uint64_t seed, size_t max_len)
      : corpus_(corpus), rng_(seed), max_len_(max_len) {}

  Bytes next() {
    Bytes m = corpus_[pick(corpus_.size())];
    const int n = 1 + static_cast<int>(rng_() % 4);
    for (int i = 0; i < n; ++i) mutate(m);
    if (m.size() > max_len_) m.resize(max_len_);
    return m;
  }

 private:
  size_t pick(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  void mutate(Bytes& m) {
    static constexpr uint8_t kInteresting[] = {0x00, 0xFF, 0x7F, 0x80, 0x01, 0x0A, 0x22, 0x5B, 0x3D, 0x5C};
    switch (rng_() % 9) {
      case 0:
        if (!m.empty()) m[pick(m.size())] ^= static_cast<uint8_t>(1u << (rng_() % 8));
        break;
      case 1:
        if (!m.empty()) m[pick(m.size())] = kInteresting[pick(sizeof kInteresting)];
        break;
      case 2: m.resize(pick(m.size() + 1)); break;
      case 3: {
        const size_t at = pick(m.size() + 1);
        const size_t n = 1 + pick(8);
        for (size_t i = 0; i < n; ++i) {
          const uint8_t b = rng_() % 2 == 0 ? static_cast<uint8_t>(rng_()) : kInteresting[pick(sizeof kInteresting)];
          m.insert(m.begin() + static_cast<std::ptrdiff_t>(at), b);
        }
        break;
      }
      case 4: {
        if (m.empty()) break;
        const size_t at = pick(m.size());
        const size_t n = 1 + pick(std::min<size_t>(16, m.size() - at));
        m.erase(m.begin() + static_cast<std::ptrdiff_t>(at), m.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 5: {  // duplicate a chunk in place
        if (m.empty()) break;
        const size_t at = pick(m.size());
        const size_t n = 1 + pick(std::min<size_t>(64, m.size() - at));
        const Bytes chunk(m.begin() + static_cast<std::ptrdiff_t>(at), m.begin() + static_cast<std::ptrdiff_t>(at + n));
        m.insert(m.begin() + static_cast<std::ptrdiff_t>(at), chunk.begin(), chunk.end());
        break;
      }
      case 6: {  // crossover: a chunk of another corpus file
        const Bytes& other = corpus_[pick(corpus_.size())];
        if (other.empty()) break;
        const size_t from = pick(other.size());
        const size_t n = 1 + pick(std::min<size_t>(64, other.size() - from));
        const size_t at = pick(m.size() + 1);
        m.insert(m.begin() + static_cast<std::ptrdiff_t>(at), other.begin() + static_cast<std::ptrdiff_t>(from),
                 other.begin() + static_cast<std::ptrdiff_t>(from + n));
        break;
      }
      case 7:
      case 8: {  // a little-endian integer of 1, 2, 4 or 8 bytes set to a boundary value
        static constexpr uint64_t kValues[] = {
            0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x8000000000000000ull, ~0ull};
        const size_t width = size_t{1} << pick(4);
        if (m.size() < width) break;
        const uint64_t v = kValues[pick(std::size(kValues))] - (rng_() % 2);
        std::memcpy(m.data() + pick(m.size() - width + 1), &v, width);
        break;
      }
    }
  }

  const std::vector<Bytes>& corpus_;
  std::mt19937_64 rng_;
  size_t max_len_;
};

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s CORPUS_DIR [--iterations N] [--seed S] [--max-len L] | FILE...\n", argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t iterations = 5000;
  uint64_t seed = 1;
  size_t max_len = 1 << 16;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iterations" && i + 1 < argc) {
      iterations = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--max-len" && i + 1 < argc) {
      max_len = std::strtoull(argv[++i], nullptr, 10);
    } else if (!a.empty() && a[0] == '-') {
      return usage(argv[0]);
    } else {
      paths.push_back(a);
    }
  }
  if (paths.empty()) return usage(argv[0]);
  if (!(paths.size() == 1 && std::filesystem::is_directory(paths[0]))) {
    for (const std::string& path : paths) {
      const Bytes bytes = read_file(path);
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      std::printf("%s: ok (%zu bytes)\n", path.c_str(), bytes.size());
    }
    return 0;
  }

  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(paths[0])) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "%s: no corpus files\n", paths[0].c_str());
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<Bytes> corpus;
  for (const auto& f : files) {
    corpus.push_back(read_file(f));
    LLVMFuzzerTestOneInput(corpus.back().data(), corpus.back().size());
  }
  Mutator mutator(corpus, seed, max_len);
  for (uint64_t it = 0; it < iterations; ++it) {
    const Bytes m = mutator.next();
    LLVMFuzzerTestOneInput(m.data(), m.size());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz smoke: %zu corpus files and %llu mutations of them (rng seed %llu) in %.2f s, no crash\n",
              corpus.size(), static_cast<unsigned long long>(iterations), static_cast<unsigned long long>(seed), secs);
  return 0;
}
