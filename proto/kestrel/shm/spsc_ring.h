// Producer and consumer views over one single-producer/single-consumer byte ring of the shm segment
// (shm_layout.h), plus the doorbell (spin, then futex) both sides sleep on. docs/shm.md describes the protocol.
//
// Ownership: views borrow the mapped memory; the owner of the mapping keeps it alive while a view exists.
// Threading: one RingProducer and one RingConsumer per ring, each used by one thread at a time (callers serialise);
// ring_bell() may be called from any thread. Each view keeps its own index privately and only publishes it: it
// never trusts the value in shared memory for its own side, and checks every value the peer wrote (head/tail
// distance, record sizes, padding) before using it. A check that fails is a kDataLoss error: the ring is corrupt
// and the connection must be dropped; nothing outside this ring is affected.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/base/expected.h"
#include "kestrel/shm/shm_layout.h"

namespace kestrel::shm {

// One record copied out of the ring: the header as it was read and the payload bytes (u8 [total_size - 32]).
struct Record {
  RecordHeader header{};
  std::vector<uint8_t> payload;
};

// Wakes the side sleeping on `bell`, if it announced that it sleeps (one FUTEX_WAKE of every waiter, no syscall
// otherwise). Safe from any thread, including while the peer is writing the same words.
void ring_bell(Doorbell& bell);

// Spins `spins` times on ready(), then announces sleep on `bell` and FUTEX_WAITs for at most `timeout` (unless
// ready() turned true in between). Returns ready() at the end. Spurious wake-ups are possible: loop on it.
bool wait_on_bell(Doorbell& bell, const std::function<bool()>& ready, std::chrono::nanoseconds timeout,
                  int spins = 2000);

class RingProducer {
 public:
  RingProducer() = default;
  // control/data: this ring's control block and its kRingCapacity data bytes inside the mapping.
  RingProducer(RingControl* control, uint8_t* data) : control_(control), data_(data) {}

  // Appends one record (header fields from `header`; total_size is filled in) with `payload` copied after it, then
  // publishes it and rings the consumer's doorbell. Returns false when the ring has no room now (retry after the
  // consumer frees space); kInvalidArgument when the record is over kMaxRecordSize; kDataLoss when the tail the
  // consumer published is impossible (the ring is corrupt).
  Expected<bool> push(RecordHeader header, std::span<const uint8_t> payload);
  // True when a record of `payload_size` bytes fits now (the tail is re-read).
  bool has_room(uint32_t payload_size) const;
  uint64_t head() const { return head_; }

 private:
  RingControl* control_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t head_ = 0;  // private copy: the only truth about what this side has written
};

class RingConsumer {
 public:
  RingConsumer() = default;
  // producer_bell: the doorbell of this ring's PRODUCER (it lives in the other ring's control block); rung after
  // space is freed.
  RingConsumer(RingControl* control, const uint8_t* data, Doorbell* producer_bell)
      : control_(control), data_(data), producer_bell_(producer_bell) {}

  // Copies the next record (skipping padding) into *out and frees its space. Returns false when the ring is empty;
  // kDataLoss naming the problem when the head or a record header is malformed. Validates sizes and padding only;
  // kinds and payloads are the caller's to validate.
  Expected<bool> pop(Record* out);
  // True when the producer has published bytes this side has not consumed (a hint; pop() decides).
  bool readable() const;
  uint64_t tail() const { return tail_; }

 private:
  RingControl* control_ = nullptr;
  const uint8_t* data_ = nullptr;
  Doorbell* producer_bell_ = nullptr;
  uint64_t tail_ = 0;  // private copy
};

// Typed pointers into a mapped segment of kSegmentSize bytes (no validation: see validate_segment_header).
struct SegmentView {
  uint8_t* base = nullptr;
  SegmentHeader* header() const { return reinterpret_cast<SegmentHeader*>(base + kHeaderOffset); }
  RingControl* request_ring() const { return reinterpret_cast<RingControl*>(base + kRequestRingOffset); }
  RingControl* response_ring() const { return reinterpret_cast<RingControl*>(base + kResponseRingOffset); }
  uint8_t* request_data() const { return base + kRequestDataOffset; }
  uint8_t* response_data() const { return base + kResponseDataOffset; }
};

// The daemon's side: zeroes the segment and writes the header of version kVersion (daemon_state = kStateReady).
void init_segment(SegmentView segment, uint64_t owner_tag);
// The client's side: kDataLoss / kUnsupported naming the first field that differs from this build's layout.
Status validate_segment_header(const SegmentView& segment, uint64_t mapped_size);

// Atomic access to a plain field of the segment.
template <class T>
T shm_load(T& field, std::memory_order order = std::memory_order_acquire) {
  return std::atomic_ref<T>(field).load(order);
}
template <class T>
void shm_store(T& field, T value, std::memory_order order = std::memory_order_release) {
  std::atomic_ref<T>(field).store(value, order);
}

}  // namespace kestrel::shm
