// The daemon's per-client shm segment: sealed memfd + mapping (shm_segment.h).
#include "daemon/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "kestrel/shm/control_socket.h"

namespace kestrel::daemon {

Expected<std::shared_ptr<ShmSegment>> ShmSegment::create(uint64_t owner_tag) {
  const int fd = memfd_create("kestrel-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return make_error(ErrorCode::kIo, std::string("memfd_create failed: ") + shm::errno_text(errno));
  const auto fail = [fd](const char* what) -> Error {
    const int err = errno;
    close(fd);
    return make_error(ErrorCode::kIo, std::string(what) + " failed for a new shm segment: " + shm::errno_text(err));
  };
  if (ftruncate(fd, static_cast<off_t>(shm::kSegmentSize)) != 0) return fail("ftruncate");
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) return fail("fcntl(F_ADD_SEALS)");
  void* p = mmap(nullptr, shm::kSegmentSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap");
  auto segment = std::shared_ptr<ShmSegment>(new ShmSegment(fd, static_cast<uint8_t*>(p)));
  shm::init_segment(segment->view(), owner_tag);
  return segment;
}

void ShmSegment::close_fd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

ShmSegment::~ShmSegment() {
  close_fd();
  if (base_ != nullptr) munmap(base_, shm::kSegmentSize);
}

}  // namespace kestrel::daemon
