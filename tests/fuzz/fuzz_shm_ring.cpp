// Fuzz target for the shm rings (proto/kestrel/shm/spsc_ring.h) driven by a hostile peer: the record decoder
// (RingConsumer::pop) against whatever head index and ring bytes the producer publishes, and the producer
// (RingProducer::push) against whatever tail index the consumer publishes, from any position the honest protocol can
// reach (a warm-up of valid records moves both indices first, across the end of the ring).
//
// Input: [warm count u8][warm payload u16][producer: tail mode u8, tail u64, push count u8, payload sizes u32...]
// [consumer: head mode u8, head u64][ring bytes...]. Invariants: the warm-up round-trips; every error is kDataLoss
// (kInvalidArgument for an oversized push) with a message; a popped record is 32..kMaxRecordSize bytes with its
// payload, lies within what was published and leaves the tail 64-byte aligned; a push never lets the producer run
// more than one ring ahead of the tail it trusted. The ring data is a heap block of exactly kRingCapacity bytes, so
// AddressSanitizer sees any access outside it. Built as fuzz_shm_ring (libFuzzer) and fuzz_shm_ring_smoke
// (tests/fuzz/CMakeLists.txt).
#include <cstdint>
#include <memory>
#include <vector>

#include "kestrel/shm/spsc_ring.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using namespace kestrel;
using namespace kestrel::shm;
using kestrel::fuzz::fuzz_check;

constexpr const char* kTarget = "fuzz_shm_ring";

void check(bool ok, const char* what) { fuzz_check(ok, kTarget, what); }

struct Ring {
  std::unique_ptr<RingControl> control = std::make_unique<RingControl>();
  std::unique_ptr<uint8_t[]> data = std::make_unique<uint8_t[]>(kRingCapacity);
  std::unique_ptr<Doorbell> producer_bell = std::make_unique<Doorbell>();
  void reset() {
    *control = RingControl{};
    *producer_bell = Doorbell{};
    std::memset(data.get(), 0, kRingCapacity);
  }
};

void check_error(const Error& e, bool push) {
  check(!e.message.empty(), "errors carry a message");
  check(e.code == ErrorCode::kDataLoss || (push && e.code == ErrorCode::kInvalidArgument),
        "ring errors are kDataLoss (or kInvalidArgument for an oversized push)");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  static Ring ring;
  ring.reset();
  fuzz::FuzzInput in(bytes, size);
  RingProducer producer(ring.control.get(), ring.data.get());
  RingConsumer consumer(ring.control.get(), ring.data.get(), ring.producer_bell.get());

  // 1. Honest warm-up: records of one size pushed and popped at once, moving both indices (wrap-around included).
  const unsigned warm = in.u8() % 40;      // up to 40 x 64 KiB: past the end of the ring
  const uint32_t warm_payload = in.u16();  // (kept small: every byte is copied in and out)
  std::vector<uint8_t> payload(warm_payload, 0xA5);
  Record rec;
  for (unsigned i = 0; i < warm; ++i) {
    RecordHeader h{};
    h.kind = request_kind(Op::kStep);
    h.request_id = i + 1;
    auto pushed = producer.push(h, payload);
    check(pushed.has_value() && *pushed, "an honest push into an emptied ring succeeds");
    auto popped = consumer.pop(&rec);
    check(popped.has_value() && *popped, "an honest record pops");
    check(rec.header.request_id == i + 1 && rec.payload.size() == warm_payload, "the record round-trips");
  }
  const uint64_t head0 = producer.head();
  const uint64_t tail0 = consumer.tail();
  check(head0 == tail0, "after the warm-up the ring is empty");

  // 2. A hostile consumer publishes any tail; the producer must refuse what cannot be and never overrun.
  const uint8_t tail_mode = in.u8();
  const uint64_t tail_value = in.u64();
  const uint64_t published_tail = (tail_mode & 1) != 0 ? tail_value : head0 - (tail_value % (2 * kRingCapacity));
  shm_store(ring.control->tail, published_tail);
  const unsigned pushes = in.u8() % 8;
  for (unsigned i = 0; i < pushes; ++i) {
    const uint32_t want = in.u32() % (kMaxPayloadSize + 64);
    payload.assign(want, 0x5A);
    const uint64_t before = producer.head();
    auto pushed = producer.push(RecordHeader{}, payload);
    if (!pushed) {
      check_error(pushed.error(), true);
      check(producer.head() == before, "a refused push does not move the head");
      continue;
    }
    if (*pushed) {
      check(producer.head() > before, "a push moves the head");
      check(producer.head() - published_tail <= kRingCapacity, "the producer stays within one ring of the tail");
    } else {
      check(producer.head() == before, "a full ring does not move the head");
    }
  }

  // 3. A hostile producer publishes any head and any bytes; the consumer must refuse what cannot be.
  const uint8_t head_mode = in.u8();
  const uint64_t head_value = in.u64();
  const uint64_t published_head = (head_mode & 1) != 0 ? head_value : tail0 + (head_value % (2 * kRingCapacity));
  const std::string_view ring_bytes = in.rest();
  for (size_t i = 0; i < ring_bytes.size() && i < kRingCapacity; ++i) {
    ring.data[(tail0 + i) % kRingCapacity] = static_cast<uint8_t>(ring_bytes[i]);
  }
  shm_store(ring.control->head, published_head);
  for (int i = 0; i < 64; ++i) {
    const uint64_t before = consumer.tail();
    auto popped = consumer.pop(&rec);
    if (!popped) {
      check_error(popped.error(), false);
      break;
    }
    if (!*popped) {
      check(consumer.tail() == published_head, "the ring is empty exactly at the published head");
      break;
    }
    check(rec.header.total_size >= sizeof(RecordHeader) && rec.header.total_size <= kMaxRecordSize,
          "a popped record is between a header and the record limit");
    check(rec.payload.size() == rec.header.total_size - sizeof(RecordHeader), "the payload is the record's rest");
    check(rec.header.kind != kKindPad, "padding is never returned");
    check(consumer.tail() > before && consumer.tail() - tail0 <= kRingCapacity, "the tail advances within one ring");
    check(published_head - consumer.tail() <= kRingCapacity, "the tail never passes the published head");
    check(consumer.tail() % kRecordAlign == 0, "the tail stays aligned");
  }
  return 0;
}
