// ShmSegment: the daemon's side of one client's shared-memory segment (docs/shm.md "Segment"). An anonymous
// memfd of kSegmentSize bytes, sealed against shrinking and growing (a client holding the fd cannot truncate it
// under the daemon's mapping, which would turn every daemon access into SIGBUS), mapped read-write, initialised with
// the version-1 header. It has no name in /dev/shm at any time, so nothing can be left behind there.
//
// Ownership: owns the fd (until release_fd) and the mapping (unmapped by the destructor). Share it with shared_ptr
// between the connection thread and engine callbacks that ring its doorbell. Threading: immutable after create().
#pragma once

#include <cstdint>
#include <memory>

#include "core/base/expected.h"
#include "kestrel/shm/spsc_ring.h"

namespace kestrel::daemon {

class ShmSegment {
 public:
  // kIo naming the failing system call (memfd_create, ftruncate, F_ADD_SEALS, mmap).
  static Expected<std::shared_ptr<ShmSegment>> create(uint64_t owner_tag);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  shm::SegmentView view() const { return shm::SegmentView{base_}; }
  int fd() const { return fd_; }
  // Closes the fd once it was handed to the client; the mapping stays.
  void close_fd();

 private:
  ShmSegment(int fd, uint8_t* base) : fd_(fd), base_(base) {}
  int fd_ = -1;
  uint8_t* base_ = nullptr;  // u8 [kSegmentSize], MAP_SHARED
};

}  // namespace kestrel::daemon
