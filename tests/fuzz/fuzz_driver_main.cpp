// Deterministic driver for the fuzz targets when libFuzzer is not used (KESTREL_FUZZ=OFF): ctest runs it as
// `fuzz_gguf_reader_smoke`.
//
// Seeds are small valid GGUF files made with GgufWriter (tests/core/gguf/gguf_test_files.h). Each iteration takes a
// seed and applies 1-4 seeded random mutations (bit flips, bytes set to 0x00/0xFF/0x7F, truncation, insertion,
// deletion, splices, length/count fields set to huge values, small type codes), then calls LLVMFuzzerTestOneInput,
// which aborts on any violated invariant. Same seed, same inputs: a failure reproduces.
//
//   fuzz_gguf_reader_smoke [--iterations N] [--seed S]   mutate and run (default 25000 iterations, seed 1)
//   fuzz_gguf_reader_smoke --write-seeds DIR             write the seed files (a libFuzzer corpus) and exit
//   fuzz_gguf_reader_smoke FILE...                       run the target on each file (replay a crash input)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/core/gguf/gguf_test_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using kestrel::testing::GgufBytes;

std::vector<std::vector<uint8_t>> make_seeds() {
  std::vector<std::vector<uint8_t>> seeds;
  for (int v = 0; v < kestrel::testing::kSampleVariants; ++v) {
    auto bytes = kestrel::testing::make_sample_gguf(v);
    if (!bytes) {
      std::fprintf(stderr, "cannot make seed %d: %s\n", v, bytes.error().to_string().c_str());
      std::exit(2);
    }
    seeds.push_back(std::move(bytes).value());
  }
  // A hand-made v2 file with a nested array and a tensor at a non-zero offset.
  GgufBytes b;
  b.header(2, 1, 1).str("n").u32(9).u32(9).u64(1).u32(5).u64(2).u32(1).u32(2);
  b.tensor_info("t", {4}, kestrel::GgmlType::kF32, 32).pad(32).zeros(48);
  seeds.push_back(b.bytes());
  return seeds;
}

// Positions of little-endian u64 fields holding small values (likely lengths, counts, dims, offsets).
std::vector<size_t> small_u64_positions(const std::vector<uint8_t>& s) {
  std::vector<size_t> out;
  for (size_t i = 0; i + 8 <= s.size(); ++i) {
    uint64_t v = 0;
    std::memcpy(&v, s.data() + i, 8);
    if (v >= 1 && v <= 4096) out.push_back(i);
  }
  return out;
}

void mutate(std::vector<uint8_t>& m, const std::vector<size_t>& fields, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  // Most of the interest is in the header, metadata and tensor infos: bias positions to the first 1 KiB.
  auto pos = [&]() { return (rng() % 4 != 0 && m.size() > 1024) ? pick(1024) : pick(m.size()); };
  static constexpr uint64_t kHuge[] = {uint64_t{1} << 63,       ~uint64_t{0},         uint64_t{1} << 32,
                                       (uint64_t{1} << 62) + 1, uint64_t{0xFFFFFFFF}, 0};
  switch (rng() % 9) {
    case 0:
      if (!m.empty()) m[pos()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      break;
    case 1: {
      static constexpr uint8_t kBytes[] = {0x00, 0xFF, 0x7F, 0x80, 0x01};
      if (!m.empty()) m[pos()] = kBytes[rng() % 5];
      break;
    }
    case 2: m.resize(pick(m.size() + 1)); break;
    case 3: {
      const size_t at = pick(m.size() + 1);
      const size_t n = 1 + rng() % 8;
      for (size_t i = 0; i < n; ++i) m.insert(m.begin() + static_cast<std::ptrdiff_t>(at), static_cast<uint8_t>(rng()));
      break;
    }
    case 4: {
      if (m.empty()) break;
      const size_t at = pick(m.size());
      const size_t n = 1 + pick(std::min<size_t>(16, m.size() - at));
      m.erase(m.begin() + static_cast<std::ptrdiff_t>(at), m.begin() + static_cast<std::ptrdiff_t>(at + n));
      break;
    }
    case 5:
    case 6: {  // a length/count/dim/offset field set to a huge value
      if (fields.empty()) break;
      const size_t at = fields[pick(fields.size())];
      if (at + 8 > m.size()) break;
      const uint64_t v = kHuge[rng() % 6] - (rng() % 3);
      std::memcpy(m.data() + at, &v, 8);
      break;
    }
    case 7: {  // a small u32 (value type, element type, n_dims, tensor type) at a random position
      if (m.size() < 4) break;
      const size_t at = pick(m.size() - 3);
      const uint32_t v = static_cast<uint32_t>(rng() % 40);
      std::memcpy(m.data() + at, &v, 4);
      break;
    }
    case 8: {  // splice: copy a chunk of the input over another place
      if (m.size() < 2) break;
      const size_t from = pick(m.size());
      const size_t to = pick(m.size());
      const size_t n = std::min({static_cast<size_t>(1 + rng() % 32), m.size() - from, m.size() - to});
      std::memmove(m.data() + to, m.data() + from, n);
      break;
    }
  }
}

int write_seeds(const std::string& dir) {
  const auto seeds = make_seeds();
  for (size_t i = 0; i < seeds.size(); ++i) {
    const std::string path = dir + "/seed-" + std::to_string(i) + ".gguf";
    kestrel::testing::write_file_bytes(path, seeds[i]);
    std::printf("%s (%zu bytes)\n", path.c_str(), seeds[i].size());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t iterations = 25000;
  uint64_t seed = 1;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iterations" && i + 1 < argc) {
      iterations = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--write-seeds" && i + 1 < argc) {
      return write_seeds(argv[++i]);
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "usage: %s [--iterations N] [--seed S] | --write-seeds DIR | FILE...\n", argv[0]);
      return 2;
    } else {
      files.push_back(a);
    }
  }
  if (!files.empty()) {
    for (const std::string& path : files) {
      const std::vector<uint8_t> bytes = kestrel::testing::read_file_bytes(path);
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      std::printf("%s: ok (%zu bytes)\n", path.c_str(), bytes.size());
    }
    return 0;
  }

  const auto start = std::chrono::steady_clock::now();
  const auto seeds = make_seeds();
  std::vector<std::vector<size_t>> fields;
  for (const auto& s : seeds) {
    fields.push_back(small_u64_positions(s));
    LLVMFuzzerTestOneInput(s.data(), s.size());
  }
  std::mt19937_64 rng(seed);
  for (uint64_t it = 0; it < iterations; ++it) {
    const size_t k = static_cast<size_t>(rng() % seeds.size());
    std::vector<uint8_t> m = seeds[k];
    const int n_mutations = 1 + static_cast<int>(rng() % 4);
    for (int j = 0; j < n_mutations; ++j) mutate(m, fields[k], rng);
    LLVMFuzzerTestOneInput(m.data(), m.size());
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("fuzz smoke: %llu mutated inputs from %zu seeds (rng seed %llu) in %.2f s, no crash\n",
              static_cast<unsigned long long>(iterations), seeds.size(), static_cast<unsigned long long>(seed), secs);
  return 0;
}
