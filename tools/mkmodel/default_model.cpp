// The embedded default model: the mkmodel `tiny` preset written once into the cache folder (default_model.h).
#include "tools/mkmodel/default_model.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "core/base/private_dir.h"
#include "tools/mkmodel/model_plan.h"
#include "tools/mkmodel/model_writer.h"
#include "tools/mkmodel/presets.h"
#include "tools/mkmodel/vocab_source.h"

#ifndef KESTREL_VERSION
#define KESTREL_VERSION "unknown"
#endif

namespace kestrel::mkmodel {

namespace {

namespace fs = std::filesystem;

constexpr const char* kPresetName = "tiny";
constexpr const char* kTmpMarker = ".tmp-";

Expected<ModelPlan> tiny_plan() {
  KESTREL_TRY_ASSIGN(Preset preset, find_preset(kPresetName));
  return make_model_plan(preset, PlanOptions{});
}

uint32_t fnv1a32(std::string_view text) {
  uint32_t h = 2166136261u;
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619u;
  }
  return h;
}

std::string errno_text(int err) { return std::generic_category().message(err); }

// fsync() a file or folder by path; kIo naming it.
Status sync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return make_error(ErrorCode::kIo, path + ": " + errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return make_error(ErrorCode::kIo, "fsync " + path + ": " + errno_text(err));
  return ok_status();
}

// Removes "<.name>.tmp-<pid>" files whose writer process no longer exists.
void remove_stale_temporaries(const fs::path& dir, const std::string& tmp_prefix, const LogLine& log) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(tmp_prefix, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + tmp_prefix.size(), nullptr, 10);
    if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)) continue;  // still being written
    std::error_code rm_ec;
    if (fs::remove(e.path(), rm_ec) && log) log("removed " + e.path().string() + " (left by a process that died)");
  }
}

}  // namespace

std::string default_model_cache_dir(const std::string& cache_directory, const std::string& xdg_cache_home,
                                    const std::string& home, uint32_t uid) {
  if (!cache_directory.empty()) return cache_directory.substr(0, cache_directory.find(':'));
  if (!xdg_cache_home.empty()) return (fs::path(xdg_cache_home) / "kestrel").string();
  if (!home.empty()) return (fs::path(home) / ".cache" / "kestrel").string();
  return (fs::path(fallback_runtime_dir(uid)) / "cache").string();
}

std::string default_model_cache_dir_from_process() {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read before threads start
    return v != nullptr ? std::string(v) : std::string();
  };
  return default_model_cache_dir(env("CACHE_DIRECTORY"), env("XDG_CACHE_HOME"), env("HOME"),
                                 static_cast<uint32_t>(::getuid()));
}

Expected<std::string> default_model_file_name() {
  KESTREL_TRY_ASSIGN(ModelPlan plan, tiny_plan());
  char hash[16];
  std::snprintf(hash, sizeof hash, "%08x", fnv1a32(format_plan(plan)));
  return std::string("kestrel-") + kPresetName + "-" + KESTREL_VERSION + "-" + hash + ".gguf";
}

Expected<DefaultModel> ensure_default_model(const std::string& cache_dir, const LogLine& log) {
  KESTREL_TRY_ASSIGN(const std::string name, default_model_file_name());
  const fs::path dir(cache_dir);
  const fs::path final_path = dir / name;
  // Before anything in it is trusted: the fallback /tmp/kestrel-$UID must be ours alone (private_dir.h).
  KESTREL_TRY(prepare_fallback_dir(dir.string(), "cache folder",
                                   "set HOME, or choose another cache folder, or give a model with --model"));
  std::error_code ec;
  if (fs::is_regular_file(final_path, ec)) {
    if (log) log("default model: using " + final_path.string());
    return DefaultModel{final_path.string(), false};
  }
  fs::create_directories(dir, ec);
  if (ec) {
    return make_error(ErrorCode::kIo, "cannot create the cache folder " + dir.string() +
                                          " for the default model: " + ec.message() +
                                          " (choose another cache folder, or give a model with --model)");
  }
  const std::string tmp_prefix = "." + name + kTmpMarker;
  remove_stale_temporaries(dir, tmp_prefix, log);

  KESTREL_TRY_ASSIGN(ModelPlan plan, tiny_plan());
  KESTREL_TRY_ASSIGN(const std::string vocab_path, find_vocab_file(""));
  auto vocab = load_vocab(vocab_path, plan.preset.hparams.n_vocab);
  if (!vocab) return make_error(vocab.error().code, vocab_path + ": " + vocab.error().message);

  const fs::path tmp = dir / (tmp_prefix + std::to_string(::getpid()));
  if (log) {
    log("default model: creating " + final_path.string() + " (mkmodel preset '" + kPresetName + "', " +
        std::to_string(plan.tensors.size()) + " tensors, vocabulary " + vocab_path + ")");
  }
  const auto start = std::chrono::steady_clock::now();
  auto stats = write_model(
      plan, tmp.string(), [&](GgufWriter& w) { return add_vocab_metadata(w, *vocab); }, WriteOptions{});
  if (!stats) {
    fs::remove(tmp, ec);
    return make_error(stats.error().code, "writing the default model into " + dir.string() + ": " +
                                              stats.error().message +
                                              " (choose another cache folder, or give a model with --model)");
  }
  Status synced = sync_path(tmp.string(), false);
  if (synced) {
    fs::rename(tmp, final_path, ec);
    if (ec)
      synced =
          make_error(ErrorCode::kIo, "rename " + tmp.string() + " -> " + final_path.string() + ": " + ec.message());
  }
  if (!synced) {
    fs::remove(tmp, ec);
    return synced.error();
  }
  KESTREL_TRY(sync_path(dir.string(), true));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (log) {
    char line[160];
    std::snprintf(line, sizeof line, "default model: wrote %llu bytes in %.2f s",
                  static_cast<unsigned long long>(stats->file_bytes), seconds);
    log(line);
  }
  return DefaultModel{final_path.string(), true};
}

}  // namespace kestrel::mkmodel
