// populate_tensor_data and the huge-page share (cpu/populate.h): after populating, every page of a model's tensor
// data is resident; the share parser sums Rss and FilePmdMapped over exactly the smaps mappings that overlap the span
// and says "unknown" (−1) when the kernel lists no FilePmdMapped.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <sstream>
#include <vector>

#include "core/model/model.h"
#include "cpu/populate.h"
#include "cpu/worker_pool.h"
#include "tests/core/engine/engine_test_util.h"

namespace kestrel::cpu {
namespace {

// A smaps listing: the span [0x10000000, 0x10400000) overlaps the second and third mappings only.
constexpr char kSmaps[] =
    "0f000000-0f800000 r--s 00000000 fd:00 12 /models/other.gguf\n"
    "Size:               8192 kB\n"
    "Rss:                8192 kB\n"
    "FilePmdMapped:      8192 kB\n"
    "10000000-10200000 r--s 00001000 fd:00 34 /models/m.gguf\n"
    "Size:               2048 kB\n"
    "Rss:                2048 kB\n"
    "FilePmdMapped:      2048 kB\n"
    "VmFlags: rd sh mr mw me ms hg\n"
    "10200000-10600000 r--s 00201000 fd:00 34 /models/m.gguf\n"
    "Rss:                2048 kB\n"
    "AnonHugePages:         0 kB\n"
    "FilePmdMapped:         0 kB\n"
    "7ffd0000-7ffd1000 rw-p 00000000 00:00 0 [stack]\n"
    "Rss:                   4 kB\n"
    "FilePmdMapped:         0 kB\n";

TEST(Populate, HugePageShareCountsTheOverlappingMappings) {
  std::istringstream smaps(kSmaps);
  EXPECT_DOUBLE_EQ(huge_page_share_from_smaps(smaps, 0x10000000, 0x10400000), 0.5);  // 2048 of 4096 kB
  std::istringstream again(kSmaps);
  EXPECT_DOUBLE_EQ(huge_page_share_from_smaps(again, 0x0f000000, 0x10000001), 1.0);  // 10240 of 10240 kB
  std::istringstream none(kSmaps);
  EXPECT_EQ(huge_page_share_from_smaps(none, 0x20000000, 0x20001000), -1.0) << "no mapping overlaps";
  std::istringstream old_kernel("10000000-10200000 r--s 00000000 fd:00 34 /m.gguf\nRss: 2048 kB\n");
  EXPECT_EQ(huge_page_share_from_smaps(old_kernel, 0x10000000, 0x10200000), -1.0) << "no FilePmdMapped field";
}

TEST(Populate, EveryTensorPageIsResidentAfterwards) {
  std::unique_ptr<Model> model = test::open_fixture("golden-qwen35moe");
  ASSERT_TRUE(model);
  auto pool = WorkerPool::create(1, /*pin=*/false);
  ASSERT_TRUE(pool.has_value());
  populate_tensor_data(model->file(), **pool);
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  size_t checked = 0;
  for (const GgufTensorInfo& t : model->file().tensors()) {
    const std::span<const uint8_t> d = model->file().tensor_data(t);
    if (d.empty()) continue;
    const uintptr_t a = reinterpret_cast<uintptr_t>(d.data()) / page * page;
    const uintptr_t b = reinterpret_cast<uintptr_t>(d.data() + d.size());
    std::vector<unsigned char> resident((b - a + page - 1) / page);
    // NOLINTNEXTLINE(performance-no-int-to-ptr): the mapping's own addresses
    ASSERT_EQ(mincore(reinterpret_cast<void*>(a), b - a, resident.data()), 0);
    for (size_t i = 0; i < resident.size(); ++i) ASSERT_TRUE(resident[i] & 1) << t.name << " page " << i;
    checked += resident.size();
  }
  EXPECT_GT(checked, 0u);
  const double share = tensor_data_huge_page_share(model->file());
  EXPECT_TRUE(share == -1.0 || (share >= 0.0 && share <= 1.0)) << share;
}

}  // namespace
}  // namespace kestrel::cpu
