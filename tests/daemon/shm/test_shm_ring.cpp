// Tests of the shm wire layer (proto/kestrel/shm): the pinned segment layout, the SPSC ring (wrap-around, full ring,
// every record size up to the maximum, corruption detection), a two-thread stress of a million records with
// checksums, and the futex doorbell.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "kestrel/shm/shm_layout.h"
#include "kestrel/shm/spsc_ring.h"

namespace kestrel::shm {
namespace {

using namespace std::chrono_literals;

// A segment in process memory (the layout does not care whether the mapping is shared).
struct TestSegment {
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> storage{static_cast<uint8_t*>(std::aligned_alloc(4096, kSegmentSize))};
  SegmentView view{storage.get()};
  TestSegment() { init_segment(view, 7); }
  RingProducer producer() { return RingProducer(view.request_ring(), view.request_data()); }
  RingConsumer consumer() {
    return RingConsumer(view.request_ring(), view.request_data(), &view.response_ring()->bell);
  }
};

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131u + seed * 7u) ^ (seed >> 3));
  return v;
}

RecordHeader request(uint64_t id, uint16_t kind = request_kind(Op::kStep)) {
  RecordHeader h{};
  h.kind = kind;
  h.request_id = id;
  return h;
}

TEST(ShmLayout, InitializedSegmentValidates) {
  TestSegment seg;
  ASSERT_TRUE(validate_segment_header(seg.view, kSegmentSize));
  EXPECT_EQ(seg.view.header()->owner_tag, 7u);
  EXPECT_EQ(shm_load(seg.view.header()->daemon_state), kStateReady);
  EXPECT_EQ(seg.view.request_data() - seg.view.base, 4096);
  EXPECT_EQ(seg.view.response_data() - seg.view.base, 4096 + (1 << 20));
}

TEST(ShmLayout, EveryHeaderFieldIsChecked) {
  TestSegment seg;
  EXPECT_EQ(validate_segment_header(seg.view, kSegmentSize - 4096).error().code, ErrorCode::kDataLoss);
  seg.view.header()->version = 2;
  auto st = validate_segment_header(seg.view, kSegmentSize);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(st.error().message.find("version 2"), std::string::npos);
  seg.view.header()->version = kVersion;
  seg.view.header()->ring_capacity = 4096;
  st = validate_segment_header(seg.view, kSegmentSize);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("ring_capacity"), std::string::npos);
  seg.view.header()->ring_capacity = kRingCapacity;
  seg.view.header()->magic = 0;
  EXPECT_FALSE(validate_segment_header(seg.view, kSegmentSize));
}

TEST(ShmRing, PushPopKeepsHeaderAndPayload) {
  TestSegment seg;
  auto p = seg.producer();
  auto c = seg.consumer();
  Record r;
  ASSERT_FALSE(*c.pop(&r));
  RecordHeader h = request(42);
  h.flags = kFlagFinal;
  h.status = 5;
  h.timeout_ms = 1234;
  const auto payload = pattern(100, 1);
  ASSERT_TRUE(*p.push(h, payload));
  ASSERT_TRUE(c.readable());
  ASSERT_TRUE(*c.pop(&r));
  EXPECT_EQ(r.header.total_size, 132u);
  EXPECT_EQ(r.header.kind, request_kind(Op::kStep));
  EXPECT_EQ(r.header.flags, kFlagFinal);
  EXPECT_EQ(r.header.request_id, 42u);
  EXPECT_EQ(r.header.status, 5);
  EXPECT_EQ(r.header.timeout_ms, 1234u);
  EXPECT_EQ(r.payload, payload);
  EXPECT_EQ(c.tail(), 192u);  // 132 rounded up to 64
  ASSERT_FALSE(*c.pop(&r));
}

TEST(ShmRing, FullRingRefusesThenAcceptsAfterPop) {
  TestSegment seg;
  auto p = seg.producer();
  auto c = seg.consumer();
  // Each record occupies 256 KiB - 64 bytes: four fill the ring but for 256 bytes.
  const auto payload = pattern(kMaxPayloadSize - 100, 3);
  int pushed = 0;
  while (*p.push(request(pushed + 1), payload)) ++pushed;
  EXPECT_EQ(pushed, 4);
  EXPECT_FALSE(p.has_room(kMaxPayloadSize - 100));
  EXPECT_TRUE(p.has_room(0));
  Record r;
  ASSERT_TRUE(*c.pop(&r));
  EXPECT_EQ(r.header.request_id, 1u);
  ASSERT_TRUE(*p.push(request(100), payload));  // wraps with a 256-byte pad record
  for (uint64_t want : {2u, 3u, 4u, 100u}) {
    ASSERT_TRUE(*c.pop(&r));
    EXPECT_EQ(r.header.request_id, want);
    EXPECT_EQ(r.payload, payload);
  }
  ASSERT_FALSE(*c.pop(&r));
}

TEST(ShmRing, OversizedRecordIsRefused) {
  TestSegment seg;
  auto p = seg.producer();
  const auto payload = pattern(kMaxPayloadSize + 1, 0);
  auto pushed = p.push(request(1), payload);
  ASSERT_FALSE(pushed);
  EXPECT_EQ(pushed.error().code, ErrorCode::kInvalidArgument);
}

TEST(ShmRing, WrapAroundWithEveryAlignment) {
  TestSegment seg;
  auto p = seg.producer();
  auto c = seg.consumer();
  // Sizes chosen so that the write position walks through every 64-byte slot near the end of the ring.
  uint64_t id = 1;
  Record r;
  for (int round = 0; round < 60; ++round) {
    for (uint32_t size : {1000u, 37u, 4000u, 0u, 64u * 1024 + 5}) {
      const auto payload = pattern(size, static_cast<uint32_t>(id));
      ASSERT_TRUE(*p.push(request(id), payload));
      ASSERT_TRUE(*c.pop(&r));
      ASSERT_EQ(r.header.request_id, id);
      ASSERT_EQ(r.payload, payload);
      ++id;
    }
  }
  EXPECT_GT(p.head(), 3u * kRingCapacity);  // wrapped several times
  EXPECT_EQ(p.head(), c.tail());
}

TEST(ShmRing, RecordsOfEverySizeUpToTheMaximum) {
  TestSegment seg;
  auto p = seg.producer();
  auto c = seg.consumer();
  std::vector<uint32_t> sizes;
  for (uint32_t s = 0; s <= 4096; ++s) sizes.push_back(s);                    // every small size
  for (uint32_t s = 4097; s < kMaxPayloadSize; s += 997) sizes.push_back(s);  // a prime stride to the top
  for (uint32_t s = kMaxPayloadSize - 64; s <= kMaxPayloadSize; ++s) sizes.push_back(s);
  Record r;
  uint64_t id = 1;
  for (uint32_t size : sizes) {
    const auto payload = pattern(size, size);
    auto pushed = p.push(request(id), payload);
    ASSERT_TRUE(pushed && *pushed) << size;
    ASSERT_TRUE(*c.pop(&r)) << size;
    ASSERT_EQ(r.header.total_size, size + sizeof(RecordHeader));
    ASSERT_EQ(r.payload, payload) << size;
    ++id;
  }
}

TEST(ShmRing, CorruptHeadIsDetected) {
  TestSegment seg;
  auto c = seg.consumer();
  Record r;
  shm_store(seg.view.request_ring()->head, uint64_t{kRingCapacity + 64});  // more than the ring holds
  auto got = c.pop(&r);
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, ErrorCode::kDataLoss);
  shm_store(seg.view.request_ring()->head, uint64_t{40});  // not a multiple of the record alignment
  EXPECT_FALSE(c.pop(&r));
}

TEST(ShmRing, CorruptTailIsDetected) {
  TestSegment seg;
  auto p = seg.producer();
  ASSERT_TRUE(*p.push(request(1), pattern(10, 1)));
  shm_store(seg.view.request_ring()->tail, uint64_t{1} << 40);  // the consumer "consumed" more than was written
  auto pushed = p.push(request(2), pattern(10, 2));
  ASSERT_FALSE(pushed);
  EXPECT_EQ(pushed.error().code, ErrorCode::kDataLoss);
}

// Writes a raw header at offset 0 of the request ring and publishes `published` bytes.
Expected<bool> pop_forged(RecordHeader h, uint64_t published) {
  TestSegment seg;
  std::memcpy(seg.view.request_data(), &h, sizeof(h));
  shm_store(seg.view.request_ring()->head, published);
  auto c = seg.consumer();
  Record r;
  return c.pop(&r);
}

TEST(ShmRing, MalformedRecordHeadersAreDetected) {
  RecordHeader h = request(1);
  h.total_size = 8;  // shorter than its own header
  EXPECT_EQ(pop_forged(h, 64).error().code, ErrorCode::kDataLoss);
  h.total_size = kMaxRecordSize + 64;  // over the limit
  EXPECT_EQ(pop_forged(h, kRingCapacity).error().code, ErrorCode::kDataLoss);
  h.total_size = 1000;  // more than was published
  EXPECT_EQ(pop_forged(h, 64).error().code, ErrorCode::kDataLoss);
  h.kind = kKindPad;  // padding that does not reach the end of the ring
  h.total_size = 64;
  EXPECT_EQ(pop_forged(h, 64).error().code, ErrorCode::kDataLoss);
  h = request(1);
  h.total_size = 100;  // a well-formed record passes
  auto ok = pop_forged(h, 128);
  ASSERT_TRUE(ok);
  EXPECT_TRUE(*ok);
}

TEST(ShmRing, RecordCrossingTheEndIsDetected) {
  TestSegment seg;
  auto p = seg.producer();
  auto c = seg.consumer();
  Record r;
  // Move both indices to 128 bytes before the end (15 records of 64 KiB, one of 64 KiB - 128), then forge a
  // 1 KiB record there.
  for (int i = 0; i < 16; ++i) {
    const auto filler = pattern((i < 15 ? 65536 : 65536 - 128) - sizeof(RecordHeader), 0);
    ASSERT_TRUE(*p.push(request(1), filler));
    ASSERT_TRUE(*c.pop(&r));
  }
  ASSERT_EQ(c.tail(), kRingCapacity - 128);
  RecordHeader h = request(3);
  h.total_size = 1024;
  std::memcpy(seg.view.request_data() + kRingCapacity - 128, &h, sizeof(h));
  shm_store(seg.view.request_ring()->head, c.tail() + 1024);
  auto got = c.pop(&r);
  ASSERT_FALSE(got);
  EXPECT_NE(got.error().message.find("crosses the end"), std::string::npos);
}

uint64_t fnv1a(std::span<const uint8_t> bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  return h;
}

// A producer and a consumer thread move a million records of random sizes through one ring, sleeping on the
// doorbells (spin, then futex) whenever the ring is full or empty. Each payload carries its own checksum.
TEST(ShmRing, TwoThreadStressOfAMillionRecords) {
  constexpr uint64_t kRecords = 1000000;
  TestSegment seg;
  Doorbell& consumer_bell = seg.view.request_ring()->bell;
  Doorbell& producer_bell = seg.view.response_ring()->bell;
  std::atomic<uint64_t> sent_sum{0};
  std::thread producer([&] {
    RingProducer p = seg.producer();
    std::mt19937 rng(1);
    std::vector<uint8_t> payload;
    uint64_t sum = 0;
    for (uint64_t i = 1; i <= kRecords; ++i) {
      // Mostly small records, sometimes large ones so that the ring fills up and wraps at many offsets.
      const uint32_t size = 8 + ((i % 1000 == 0) ? rng() % 60000 : rng() % 200);
      payload.resize(size);
      for (uint32_t k = 8; k < size; ++k) payload[k] = static_cast<uint8_t>(rng());
      const uint64_t check = fnv1a(std::span(payload).subspan(8));
      std::memcpy(payload.data(), &check, 8);
      sum += check;
      for (;;) {
        auto pushed = p.push(request(i), payload);
        ASSERT_TRUE(pushed) << pushed.error().message;
        if (*pushed) break;
        wait_on_bell(
            producer_bell, [&] { return p.has_room(size); }, 10ms, 100);
      }
    }
    sent_sum = sum;
  });
  RingConsumer c = seg.consumer();
  Record r;
  uint64_t received_sum = 0;
  uint64_t bad = 0;
  for (uint64_t i = 1; i <= kRecords; ++i) {
    for (;;) {
      auto got = c.pop(&r);
      ASSERT_TRUE(got) << got.error().message;
      if (*got) break;
      wait_on_bell(
          consumer_bell, [&] { return c.readable(); }, 10ms, 100);
    }
    ASSERT_EQ(r.header.request_id, i);
    uint64_t check;
    std::memcpy(&check, r.payload.data(), 8);
    if (check != fnv1a(std::span(r.payload).subspan(8))) ++bad;
    received_sum += check;
  }
  producer.join();
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(received_sum, sent_sum.load());
  EXPECT_FALSE(c.readable());
}

TEST(ShmDoorbell, RingWithoutSleeperDoesNothing) {
  Doorbell bell{};
  ring_bell(bell);
  EXPECT_EQ(bell.word, 0u);
}

TEST(ShmDoorbell, SleeperIsWokenByTheFutexNotTheTimeout) {
  TestSegment seg;
  Doorbell& bell = seg.view.request_ring()->bell;
  std::atomic<bool> ready{false};
  std::atomic<bool> woke{false};
  const auto start = std::chrono::steady_clock::now();
  std::thread sleeper([&] {
    while (!ready.load())
      wait_on_bell(
          bell, [&] { return ready.load(); }, 20s, 0);
    woke = true;
  });
  // Wait until the sleeper announced it sleeps, then make the condition true and ring.
  while (shm_load(bell.sleeping) == 0) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(woke.load());
  ready = true;
  ring_bell(bell);
  sleeper.join();
  EXPECT_TRUE(woke.load());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_EQ(shm_load(bell.sleeping), 0u);  // the ringer cleared the flag
  EXPECT_GE(shm_load(bell.word), 1u);
}

TEST(ShmDoorbell, WaitTimesOutWhenNobodyRings) {
  Doorbell bell{};
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(wait_on_bell(
      bell, [] { return false; }, 30ms, 10));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 25ms);
  EXPECT_EQ(shm_load(bell.sleeping), 1u);
}

}  // namespace
}  // namespace kestrel::shm
