// load_model(): read-through with progress, then Model::open (model_loader.h).
#include "daemon/ops/model_loader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <vector>

namespace kestrel::daemon::ops {

namespace {

constexpr size_t kChunkBytes = size_t{8} << 20;

Error file_error(const std::string& path, int err) {
  return make_error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                    "model " + path + ": " + std::generic_category().message(err));
}

}  // namespace

Expected<std::unique_ptr<Model>> load_model(const std::string& path, const LoadProgress& progress) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return file_error(path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return file_error(path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(ErrorCode::kInvalidArgument, "model " + path + ": not a regular file");
  }
  const auto total = static_cast<uint64_t>(st.st_size);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> buf(kChunkBytes);  // bytes [kChunkBytes]: scratch, contents unused
  uint64_t done = 0;
  int reported = -1;
  if (progress) {
    progress(0, 0, total);
    reported = 0;
  }
  while (done < total) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return file_error(path, err);
    }
    if (n == 0) break;  // the file shrank; Model::open reports what is wrong with it
    done += static_cast<uint64_t>(n);
    const int percent = static_cast<int>(done * 100 / total);
    if (progress && percent / 10 > reported / 10) {
      progress(percent, done, total);
      reported = percent;
    }
  }
  ::close(fd);
  return Model::open(path);
}

}  // namespace kestrel::daemon::ops
