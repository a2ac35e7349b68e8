// Start-up helpers: prepare_socket_dir() creates missing folders (0750) and refuses a path through a file;
// load_model() reports progress up to 100% and names the file in its errors.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/ops/model_loader.h"
#include "daemon/ops/socket_dir.h"
#include "tests/daemon/scratch_dir.h"

namespace kestrel::daemon::ops {
namespace {

namespace fs = std::filesystem;

class StartupHelpers : public ::testing::Test {
 protected:
  ::kestrel::test::ScratchDir scratch_{"kestrel-startup"};
  const fs::path& dir_ = scratch_.path();
};

TEST_F(StartupHelpers, SocketDirCreatedWithMode0750) {
  const fs::path sock = dir_ / "a" / "b" / "kestreld.sock";
  ASSERT_TRUE(prepare_socket_dir(sock.string()));
  struct stat st {};
  ASSERT_EQ(::stat((dir_ / "a" / "b").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777 & ~0750u, 0u);       // at most 0750 (the umask may remove more)
  EXPECT_TRUE(prepare_socket_dir(sock.string()));  // existing folder: fine
}

TEST_F(StartupHelpers, SocketDirThroughAFileIsAnError) {
  std::ofstream(dir_ / "file") << "x";
  const Status st = prepare_socket_dir((dir_ / "file" / "kestreld.sock").string());
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find((dir_ / "file").string()), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("--socket"), std::string::npos) << st.error().message;
}

TEST_F(StartupHelpers, LoadModelErrorsNameTheFile) {
  std::vector<int> percents;
  auto missing = load_model((dir_ / "none.gguf").string(), [&](int p, uint64_t, uint64_t) { percents.push_back(p); });
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message.find("none.gguf"), std::string::npos);
  EXPECT_TRUE(percents.empty());

  const fs::path bad = dir_ / "bad.gguf";
  std::ofstream(bad) << std::string(100000, 'x');
  auto corrupt = load_model(bad.string(), [&](int p, uint64_t, uint64_t) { percents.push_back(p); });
  ASSERT_FALSE(corrupt);
  EXPECT_NE(corrupt.error().message.find(bad.string()), std::string::npos) << corrupt.error().message;
  ASSERT_FALSE(percents.empty());
  EXPECT_EQ(percents.front(), 0);
  EXPECT_EQ(percents.back(), 100);

  auto folder = load_model(dir_.string(), nullptr);
  ASSERT_FALSE(folder);
}

}  // namespace
}  // namespace kestrel::daemon::ops
