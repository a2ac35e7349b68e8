// The embedded default model: created once in the cache folder, atomically (no temporary left, stale temporaries of
// dead writers removed), reused on the next start, byte-identical to `kestrel-mkmodel --preset tiny`, and a model
// that opens.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "tests/daemon/scratch_dir.h"
#include "tools/mkmodel/default_model.h"

namespace kestrel::mkmodel {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

class DefaultModelTest : public ::testing::Test {
 protected:
  ::kestrel::test::ScratchDir scratch_{"kestrel-default-model"};
  const fs::path& dir_ = scratch_.path();
};

TEST_F(DefaultModelTest, FileNameCarriesPresetAndVersion) {
  auto name = default_model_file_name();
  ASSERT_TRUE(name) << name.error().to_string();
  EXPECT_EQ(name->rfind("kestrel-tiny-", 0), 0u) << *name;
  EXPECT_EQ(name->substr(name->size() - 5), ".gguf");
  EXPECT_EQ(*name, *default_model_file_name());  // stable
}

TEST_F(DefaultModelTest, CreatedOnceAtomicallyThenReused) {
  // A temporary left by a writer that died (pid 0x7ffffffe does not exist) is cleaned up.
  fs::create_directories(dir_ / "cache");
  const std::string name = *default_model_file_name();
  const fs::path stale = dir_ / "cache" / ("." + name + ".tmp-2147483646");
  std::ofstream(stale) << "half a model";
  // A temporary of a live writer (the parent of this test) is left alone.
  const fs::path live = dir_ / "cache" / ("." + name + ".tmp-" + std::to_string(::getppid()));
  std::ofstream(live) << "being written";

  std::vector<std::string> log;
  auto first = ensure_default_model((dir_ / "cache").string(), [&](std::string_view l) { log.emplace_back(l); });
  ASSERT_TRUE(first) << first.error().to_string();
  EXPECT_TRUE(first->created);
  EXPECT_EQ(first->path, (dir_ / "cache" / name).string());
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  fs::remove(live);
  EXPECT_EQ(names_in(dir_ / "cache"), std::vector<std::string>{name});  // no temporary left behind
  bool said_creating = false, said_wrote = false, said_removed = false;
  for (const std::string& l : log) {
    said_creating |= l.find("creating " + first->path) != std::string::npos;
    said_wrote |= l.find("wrote") != std::string::npos;
    said_removed |= l.find("removed " + stale.string()) != std::string::npos;
  }
  EXPECT_TRUE(said_creating && said_wrote && said_removed);

  struct stat before {};
  ASSERT_EQ(::stat(first->path.c_str(), &before), 0);
  auto second = ensure_default_model((dir_ / "cache").string(), nullptr);
  ASSERT_TRUE(second);
  EXPECT_FALSE(second->created);
  EXPECT_EQ(second->path, first->path);
  struct stat after {};
  ASSERT_EQ(::stat(second->path.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_EQ(before.st_mtim.tv_sec, after.st_mtim.tv_sec);
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);

  // Same bytes as the kestrel-mkmodel tool writes for the preset.
  const fs::path tool = fs::path(KESTREL_BINARY_DIR) / "bin" / "kestrel-mkmodel";
  ASSERT_TRUE(fs::exists(tool)) << tool;
  const fs::path reference = dir_ / "mkmodel-tiny.gguf";
  const std::string cmd = tool.string() + " --preset tiny -q -o " + reference.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string ours = read_all(first->path);
  EXPECT_GT(ours.size(), 1000000u);
  EXPECT_TRUE(ours == read_all(reference)) << "the default model differs from kestrel-mkmodel --preset tiny";

  auto model = Model::open(first->path);
  ASSERT_TRUE(model) << model.error().to_string();
  EXPECT_EQ(model->get()->hparams().n_embd, 64u);
}

TEST_F(DefaultModelTest, UnwritableCacheFolderIsAClearError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root can write anywhere";
  fs::create_directories(dir_);
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  auto r = ensure_default_model((dir_ / "cache").string(), nullptr);
  fs::permissions(dir_, fs::perms::owner_all);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find((dir_ / "cache").string()), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("--model"), std::string::npos) << r.error().message;
}

TEST(DefaultModelCacheDir, FromTheEnvironment) {
  EXPECT_EQ(default_model_cache_dir("/var/cache/kestrel:/var/cache/other", "/x", "/home/u", 5), "/var/cache/kestrel");
  EXPECT_EQ(default_model_cache_dir("", "/x/cache", "/home/u", 5), "/x/cache/kestrel");
  EXPECT_EQ(default_model_cache_dir("", "", "/home/u", 5), "/home/u/.cache/kestrel");
  EXPECT_EQ(default_model_cache_dir("", "", "", 5), "/tmp/kestrel-5/cache");
}

// Another user created the fallback folder /tmp/kestrel-$UID first (mode 0777) to plant a model in its cache:
// ensure_default_model refuses the cache there before reading or writing anything, for kestreld and `kestrel run`
// alike. Runs as a spare uid in a child process, so it needs root.
TEST_F(DefaultModelTest, CacheInASquattedFallbackFolderIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run as another uid";
  const uid_t uid = 64976;
  const fs::path squatted = "/tmp/kestrel-" + std::to_string(uid);
  fs::remove_all(squatted);
  ASSERT_EQ(::mkdir(squatted.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(squatted.c_str(), 0777), 0);  // root's, mode 0777: another user's folder
  const fs::path message_file = dir_ / "message";
  fs::permissions(dir_, fs::perms::all);  // the child writes its message here
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(90);
    auto r = ensure_default_model(default_model_cache_dir("", "", "", uid), nullptr);
    std::ofstream(message_file) << (r ? std::string("accepted") : r.error().to_string());
    ::_exit(r ? 1 : (r.error().code == ErrorCode::kFailedPrecondition ? 0 : 2));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  const std::string message = read_all(message_file);
  const bool planted = fs::exists(squatted / "cache");
  fs::remove_all(squatted);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << message;
  EXPECT_FALSE(planted) << "nothing may be created inside the squatted folder";
  EXPECT_NE(message.find("cache folder " + (squatted / "cache").string() + ": private folder " + squatted.string() +
                         " is not safe to use: it belongs to uid 0, not to this program's uid " + std::to_string(uid)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("--model"), std::string::npos) << message;
}

TEST_F(DefaultModelTest, CacheFolderIsAFileIsAClearError) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / "file") << "x";
  auto r = ensure_default_model((dir_ / "file").string(), nullptr);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find((dir_ / "file").string()), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace kestrel::mkmodel
