// Start-up helpers: prepare_socket_dir() creates missing folders (0750) and refuses a path through a file;
// check_private_dir() / check_inside_private_dir() refuse a private folder that another user could control (a
// symbolic link on its path, another owner, a mode other than 0700 / 0750);
// load_model() reports progress up to 100% and names the file in its errors.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/base/private_dir.h"
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

// The message of a failed status, or "" when it passed.
std::string message_of(const Status& st) { return st ? std::string() : st.error().message; }

TEST_F(StartupHelpers, PrivateDirMustBeOwnedWithMode0700Or0750) {
  const uint32_t me = static_cast<uint32_t>(::geteuid());
  const fs::path d = dir_ / "private";
  ASSERT_EQ(::mkdir(d.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(d.c_str(), 0700), 0);
  EXPECT_EQ(message_of(check_private_dir(d.string(), me)), "");
  ASSERT_EQ(::chmod(d.c_str(), 0750), 0);
  EXPECT_EQ(message_of(check_private_dir(d.string(), me)), "");
  for (const mode_t mode : {0777u, 0755u, 0770u, 01777u, 0500u}) {
    ASSERT_EQ(::chmod(d.c_str(), mode), 0);
    const Status st = check_private_dir(d.string(), me);
    ASSERT_FALSE(st) << std::oct << mode;
    EXPECT_EQ(st.error().code, ErrorCode::kFailedPrecondition);
    char expect[64];
    std::snprintf(expect, sizeof expect, "its mode is %04o, not 0700 or 0750; chmod 0700 ",
                  static_cast<unsigned>(mode));
    EXPECT_NE(st.error().message.find(expect), std::string::npos) << st.error().message;
  }
  ASSERT_EQ(::chmod(d.c_str(), 0700), 0);
  // Another owner: what kestreld sees when another user created the folder first.
  const Status other = check_private_dir(d.string(), me + 1);
  ASSERT_FALSE(other);
  EXPECT_NE(other.error().message.find("it belongs to uid " + std::to_string(me) + ", not to this program's uid " +
                                       std::to_string(me + 1)),
            std::string::npos)
      << other.error().message;
  EXPECT_NE(other.error().message.find("remove it"), std::string::npos) << other.error().message;
  // Not a directory.
  std::ofstream(dir_ / "file") << "x";
  EXPECT_NE(message_of(check_private_dir((dir_ / "file").string(), me)).find("it is not a directory"),
            std::string::npos);
  // Missing.
  EXPECT_EQ(check_private_dir((dir_ / "missing").string(), me).error().code, ErrorCode::kIo);
}

TEST_F(StartupHelpers, PrivateDirWithASymlinkOnItsPathIsRefused) {
  const uint32_t me = static_cast<uint32_t>(::geteuid());
  const fs::path real = dir_ / "real";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((real / "inner").c_str(), 0700), 0);
  ASSERT_EQ(::chmod((real / "inner").c_str(), 0700), 0);
  fs::create_directory_symlink(real, dir_ / "link");
  // The folder itself a link (the /tmp/kestrel-$UID -> /somewhere/else case), and a link further up.
  Status st = check_private_dir((dir_ / "link").string(), me);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find((dir_ / "link").string() + " is a symbolic link"), std::string::npos)
      << st.error().message;
  st = check_private_dir((dir_ / "link" / "inner").string(), me);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find((dir_ / "link").string() + " is a symbolic link"), std::string::npos)
      << st.error().message;
  EXPECT_EQ(message_of(check_private_dir((real / "inner").string(), me)), "");
}

TEST_F(StartupHelpers, InsidePrivateDirChecksTheRootAndEveryLevelBelowIt) {
  const uint32_t me = static_cast<uint32_t>(::geteuid());
  const fs::path root = dir_ / "kestrel-root";
  ASSERT_EQ(::mkdir(root.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(root.c_str(), 0777), 0);
  // Outside the root: nothing is checked.
  EXPECT_EQ(message_of(check_inside_private_dir((dir_ / "elsewhere" / "x").string(), root.string(), me, "socket")), "");
  EXPECT_EQ(message_of(check_inside_private_dir((dir_ / "kestrel-root2").string(), root.string(), me, "socket")), "");
  // Inside it: the root's mode is refused, with the path's use named first.
  Status st = check_inside_private_dir((root / "cache").string(), root.string(), me, "cache folder");
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().message.rfind("cache folder " + (root / "cache").string() + ": private folder " + root.string() +
                                         " is not safe to use: its mode is 0777",
                                     0),
            0u)
      << st.error().message;
  ASSERT_EQ(::chmod(root.c_str(), 0700), 0);
  EXPECT_EQ(message_of(check_inside_private_dir((root / "cache" / "not-yet").string(), root.string(), me, "x")), "");
  // A link planted below the root.
  fs::create_directory_symlink(dir_, root / "cache");
  st = check_inside_private_dir((root / "cache" / "m").string(), root.string(), me, "cache folder");
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find((root / "cache").string() + " inside the private folder"), std::string::npos)
      << st.error().message;
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
