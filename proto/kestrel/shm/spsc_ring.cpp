// The SPSC byte ring and the doorbell of the shm fast path (spsc_ring.h; protocol in docs/shm.md).
#include "kestrel/shm/spsc_ring.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <ctime>
#include <string>

#include "core/base/spin.h"

namespace kestrel::shm {
namespace {

// Process-shared futex (no FUTEX_PRIVATE_FLAG: the word lives in a mapping shared with another process).
void futex_wait(uint32_t* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // EAGAIN (the word changed), EINTR and ETIMEDOUT all mean "look again": the caller re-checks its condition.
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

Error corrupt(const std::string& what) { return make_error(ErrorCode::kDataLoss, "shm ring corrupt: " + what); }

}  // namespace

void ring_bell(Doorbell& bell) {
  std::atomic_ref<uint32_t> sleeping(bell.sleeping);
  if (sleeping.load(std::memory_order_seq_cst) == 0) return;
  if (sleeping.exchange(0, std::memory_order_seq_cst) == 0) return;
  std::atomic_ref<uint32_t>(bell.word).fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&bell.word);
}

bool wait_on_bell(Doorbell& bell, const std::function<bool()>& ready, std::chrono::nanoseconds timeout, int spins) {
  for (int i = 0; i < spins; ++i) {
    if (ready()) return true;
    cpu_relax();
  }
  // Sleepers only ever SET the flag; the ringer clears it. A second sleeper on the same bell (a client thread
  // waiting for ring space while the reader waits for responses) therefore cannot erase the first one's flag.
  const uint32_t seq = std::atomic_ref<uint32_t>(bell.word).load(std::memory_order_seq_cst);
  std::atomic_ref<uint32_t>(bell.sleeping).store(1, std::memory_order_seq_cst);
  if (ready()) return true;
  futex_wait(&bell.word, seq, timeout);
  return ready();
}

Expected<bool> RingProducer::push(RecordHeader header, std::span<const uint8_t> payload) {
  if (payload.size() > kMaxPayloadSize) {
    return make_error(ErrorCode::kInvalidArgument, "shm record payload of " + std::to_string(payload.size()) +
                                                       " bytes is over the limit of " +
                                                       std::to_string(kMaxPayloadSize) + " bytes");
  }
  const auto total = static_cast<uint32_t>(sizeof(RecordHeader) + payload.size());
  const uint32_t need = record_footprint(total);
  const uint64_t tail = shm_load(control_->tail, std::memory_order_seq_cst);
  const uint64_t used = head_ - tail;
  if (used > kRingCapacity || tail % kRecordAlign != 0) {
    return corrupt("consumer published tail " + std::to_string(tail) + " while head is " + std::to_string(head_));
  }
  const uint64_t free = kRingCapacity - used;
  auto pos = static_cast<uint32_t>(head_ % kRingCapacity);
  const uint32_t till_end = kRingCapacity - pos;
  uint64_t advance = need;
  if (need > till_end) {
    if (free < static_cast<uint64_t>(till_end) + need) return false;
    RecordHeader pad{};
    pad.total_size = till_end;
    pad.kind = kKindPad;
    std::memcpy(data_ + pos, &pad, sizeof(pad));
    pos = 0;
    advance = static_cast<uint64_t>(till_end) + need;
  } else if (free < need) {
    return false;
  }
  header.total_size = total;
  std::memcpy(data_ + pos, &header, sizeof(header));
  if (!payload.empty()) std::memcpy(data_ + pos + sizeof(header), payload.data(), payload.size());
  head_ += advance;
  shm_store(control_->head, head_, std::memory_order_seq_cst);
  ring_bell(control_->bell);
  return true;
}

bool RingProducer::has_room(uint32_t payload_size) const {
  const uint32_t need = record_footprint(static_cast<uint32_t>(sizeof(RecordHeader)) + payload_size);
  const uint64_t used = head_ - shm_load(control_->tail, std::memory_order_seq_cst);
  if (used > kRingCapacity) return true;  // corrupt: let push() report it
  const uint64_t free = kRingCapacity - used;
  const uint32_t till_end = kRingCapacity - static_cast<uint32_t>(head_ % kRingCapacity);
  return need <= till_end ? free >= need : free >= static_cast<uint64_t>(till_end) + need;
}

bool RingConsumer::readable() const { return shm_load(control_->head, std::memory_order_seq_cst) != tail_; }

Expected<bool> RingConsumer::pop(Record* out) {
  bool freed = false;
  for (;;) {
    const uint64_t head = shm_load(control_->head, std::memory_order_acquire);
    if (head == tail_) {
      if (freed) ring_bell(*producer_bell_);
      return false;
    }
    const uint64_t avail = head - tail_;
    if (avail > kRingCapacity || avail % kRecordAlign != 0) {
      return corrupt("producer published head " + std::to_string(head) + " while tail is " + std::to_string(tail_));
    }
    const auto pos = static_cast<uint32_t>(tail_ % kRingCapacity);
    const uint32_t till_end = kRingCapacity - pos;
    RecordHeader h;
    std::memcpy(&h, data_ + pos, sizeof(h));  // copied out once: every check below reads the copy
    const std::string where = " at ring offset " + std::to_string(pos);
    if (h.total_size < sizeof(RecordHeader)) {
      return corrupt("record of " + std::to_string(h.total_size) + " bytes (less than its header)" + where);
    }
    if (h.kind == kKindPad) {
      if (h.total_size != till_end || till_end > avail) {
        return corrupt("padding record of " + std::to_string(h.total_size) + " bytes" + where +
                       " does not end exactly at the end of the ring");
      }
      tail_ += till_end;
      shm_store(control_->tail, tail_, std::memory_order_seq_cst);
      freed = true;
      continue;
    }
    if (h.total_size > kMaxRecordSize) {
      return corrupt("record of " + std::to_string(h.total_size) + " bytes" + where + " is over the limit of " +
                     std::to_string(kMaxRecordSize));
    }
    const uint32_t footprint = record_footprint(h.total_size);
    if (footprint > till_end) {
      return corrupt("record of " + std::to_string(h.total_size) + " bytes" + where + " crosses the end of the ring");
    }
    if (footprint > avail) {
      return corrupt("record of " + std::to_string(h.total_size) + " bytes" + where + " but only " +
                     std::to_string(avail) + " bytes were published");
    }
    out->header = h;
    const uint8_t* payload = data_ + pos + sizeof(RecordHeader);
    out->payload.assign(payload, payload + (h.total_size - sizeof(RecordHeader)));
    tail_ += footprint;
    shm_store(control_->tail, tail_, std::memory_order_seq_cst);
    ring_bell(*producer_bell_);
    return true;
  }
}

void init_segment(SegmentView segment, uint64_t owner_tag) {
  std::memset(segment.base, 0, kSegmentSize);
  SegmentHeader* h = segment.header();
  h->magic = kMagic;
  h->version = kVersion;
  h->segment_size = kSegmentSize;
  h->header_size = sizeof(SegmentHeader);
  h->ring_capacity = kRingCapacity;
  h->max_record_size = kMaxRecordSize;
  h->record_align = kRecordAlign;
  h->request_ring_offset = kRequestRingOffset;
  h->request_data_offset = kRequestDataOffset;
  h->response_ring_offset = kResponseRingOffset;
  h->response_data_offset = kResponseDataOffset;
  h->owner_tag = owner_tag;
  shm_store(h->daemon_state, kStateReady);
}

Status validate_segment_header(const SegmentView& segment, uint64_t mapped_size) {
  if (mapped_size != kSegmentSize) {
    return make_error(ErrorCode::kDataLoss, "shm segment is " + std::to_string(mapped_size) + " bytes, expected " +
                                                std::to_string(kSegmentSize));
  }
  SegmentHeader h;
  std::memcpy(&h, segment.header(), sizeof(h));
  if (h.magic != kMagic) return make_error(ErrorCode::kDataLoss, "shm segment has a bad magic number");
  if (h.version != kVersion) {
    return make_error(ErrorCode::kUnsupported, "shm segment layout version " + std::to_string(h.version) +
                                                   "; this client speaks version " + std::to_string(kVersion));
  }
  const auto field = [](const char* name, uint64_t got, uint64_t want) -> Status {
    if (got == want) return ok_status();
    return make_error(ErrorCode::kDataLoss, std::string("shm segment header field ") + name + " is " +
                                                std::to_string(got) + ", expected " + std::to_string(want));
  };
  KESTREL_TRY(field("segment_size", h.segment_size, kSegmentSize));
  KESTREL_TRY(field("header_size", h.header_size, sizeof(SegmentHeader)));
  KESTREL_TRY(field("ring_capacity", h.ring_capacity, kRingCapacity));
  KESTREL_TRY(field("max_record_size", h.max_record_size, kMaxRecordSize));
  KESTREL_TRY(field("record_align", h.record_align, kRecordAlign));
  KESTREL_TRY(field("request_ring_offset", h.request_ring_offset, kRequestRingOffset));
  KESTREL_TRY(field("request_data_offset", h.request_data_offset, kRequestDataOffset));
  KESTREL_TRY(field("response_ring_offset", h.response_ring_offset, kResponseRingOffset));
  KESTREL_TRY(field("response_data_offset", h.response_data_offset, kResponseDataOffset));
  return ok_status();
}

}  // namespace kestrel::shm
