// The shared-memory segment of kestreld's fast path (docs/shm.md): a versioned POD layout with offsets, no
// pointers, pinned by static_asserts so that the daemon and every client agree byte for byte.
//
//   offset        size      what
//   0             256       SegmentHeader (identity, sizes, ring offsets, liveness words)
//   256           256       RingControl of the request ring  (client → daemon)
//   512           256       RingControl of the response ring (daemon → client)
//   4096          1 MiB     request ring data
//   4096 + 1 MiB  1 MiB     response ring data
//   total         2 MiB + 4096
//
// A ring holds records: a 32-byte RecordHeader followed by the payload, padded to 64 bytes. A record never wraps:
// when it does not fit before the end of the data area the producer writes a kPad record that fills the rest and
// starts again at offset 0. The payload of a request or response record is the serialized kestrel.v1 protobuf
// message of that operation; an error record carries the gRPC status code in `status` and a UTF-8 message.
//
// Every field is plain data read through std::atomic_ref where two processes touch it. Everything a peer wrote is
// untrusted: copy it out, then validate (spsc_ring.h does this for records).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kestrel::shm {

inline constexpr uint32_t kMagic = 0x314D534Bu;  // "KSM1" little-endian
inline constexpr uint32_t kVersion = 1;

inline constexpr uint32_t kRingCapacity = 1u << 20;     // bytes of record data per ring (power of two)
inline constexpr uint32_t kMaxRecordSize = 256u << 10;  // header + payload of one record, before padding
inline constexpr uint32_t kRecordAlign = 64;            // every record starts on a 64-byte boundary
inline constexpr uint32_t kMaxPayloadSize = kMaxRecordSize - 32;

inline constexpr uint64_t kHeaderOffset = 0;
inline constexpr uint64_t kRequestRingOffset = 256;   // RingControl
inline constexpr uint64_t kResponseRingOffset = 512;  // RingControl
inline constexpr uint64_t kRequestDataOffset = 4096;
inline constexpr uint64_t kResponseDataOffset = kRequestDataOffset + kRingCapacity;
inline constexpr uint64_t kSegmentSize = kResponseDataOffset + kRingCapacity;

// Liveness words (SegmentHeader::daemon_state / client_state). A side sets its word to kClosed before it leaves on
// purpose and rings the peer's doorbell; death without that shows as EOF on the control socket.
inline constexpr uint32_t kStateInit = 0;
inline constexpr uint32_t kStateReady = 1;
inline constexpr uint32_t kStateClosed = 2;

struct SegmentHeader {
  // Written once by the daemon before the fd is handed over; read (and checked against the constants above) by
  // the client.
  uint32_t magic;
  uint32_t version;
  uint64_t segment_size;
  uint32_t header_size;  // sizeof(SegmentHeader)
  uint32_t ring_capacity;
  uint32_t max_record_size;
  uint32_t record_align;
  uint64_t request_ring_offset;
  uint64_t request_data_offset;
  uint64_t response_ring_offset;
  uint64_t response_data_offset;
  uint64_t owner_tag;                 // the daemon's tag for this connection (for logs on both sides)
  alignas(64) uint32_t daemon_state;  // kState*; written by the daemon
  uint8_t reserved1[60];
  alignas(64) uint32_t client_state;  // kState*; written by the client
  uint8_t reserved2[60];
};

// A futex word and the "I am about to sleep" flag of the side that waits on it (docs/shm.md "Wake-ups").
struct Doorbell {
  uint32_t word;      // bumped by the ringer before FUTEX_WAKE; the sleeper FUTEX_WAITs on its old value
  uint32_t sleeping;  // set to 1 by the sleeper before its last check; the ringer wakes only when it reads 1
};

// One single-producer/single-consumer byte ring. head and tail are monotonic byte counters (never reduced modulo
// the capacity); head - tail is the number of bytes in use. Each lives on its own cache line.
// The doorbell belongs to this ring's CONSUMER: the producer rings it after publishing records, and the consumer's
// own consumer-side peer rings it after freeing space in the other ring (the one this side produces into).
struct RingControl {
  alignas(64) uint64_t head;  // written by the producer only (release), bytes ever published
  uint8_t reserved0[56];
  alignas(64) uint64_t tail;  // written by the consumer only (release), bytes ever consumed
  uint8_t reserved1[56];
  alignas(64) Doorbell bell;
  uint8_t reserved2[56];
  uint8_t reserved3[64];
};

enum RecordFlags : uint16_t {
  kFlagFinal = 1,  // the last record answering a request (every unary response; the last GenerateChunk)
};

// Operations of kestrel.v1.Kestrel, in proto order. Request kind = op, response kind = kResponseBase + op.
enum class Op : uint16_t {
  kGetModelInfo = 1,
  kGetServerStatus = 2,
  kTokenize = 3,
  kDetokenize = 4,
  kCreateSession = 5,
  kCloneSession = 6,
  kResetSession = 7,
  kCloseSession = 8,
  kStep = 9,
  kGenerate = 10,
  kAbort = 11,
};
inline constexpr uint16_t kFirstOp = 1;
inline constexpr uint16_t kLastOp = 11;

enum RecordKind : uint16_t {
  kKindPad = 0,          // filler up to the end of the data area; no payload meaning
  kKindCancel = 0x0080,  // client → daemon: cancel request `request_id` (a Generate in flight); empty payload
  kKindResponseBase = 0x0100,
  kKindError = 0x0200,  // daemon → client: `status` = gRPC code (non-zero), payload = UTF-8 message; final
};

constexpr uint16_t request_kind(Op op) { return static_cast<uint16_t>(op); }
constexpr uint16_t response_kind(Op op) { return static_cast<uint16_t>(kKindResponseBase + static_cast<uint16_t>(op)); }
constexpr bool is_request_kind(uint16_t kind) { return kind >= kFirstOp && kind <= kLastOp; }
constexpr bool is_response_kind(uint16_t kind) {
  return kind >= kKindResponseBase + kFirstOp && kind <= kKindResponseBase + kLastOp;
}

struct RecordHeader {
  uint32_t total_size;  // header + payload bytes (the record occupies round_up(total_size, kRecordAlign))
  uint16_t kind;        // RecordKind / request_kind() / response_kind()
  uint16_t flags;       // RecordFlags
  uint64_t request_id;  // chosen by the client, echoed by every record that answers it; never 0
  int32_t status;       // gRPC status code of a kKindError record; 0 otherwise
  uint32_t timeout_ms;  // requests: the call's deadline relative to its arrival; 0 = none
  uint64_t reserved;    // 0
};

constexpr uint32_t record_footprint(uint32_t total_size) {
  return (total_size + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
}

// ---- the pinned layout -----------------------------------------------------------------------------------------
static_assert(sizeof(RecordHeader) == 32);
static_assert(offsetof(RecordHeader, total_size) == 0);
static_assert(offsetof(RecordHeader, kind) == 4);
static_assert(offsetof(RecordHeader, flags) == 6);
static_assert(offsetof(RecordHeader, request_id) == 8);
static_assert(offsetof(RecordHeader, status) == 16);
static_assert(offsetof(RecordHeader, timeout_ms) == 20);
static_assert(kMaxPayloadSize == kMaxRecordSize - sizeof(RecordHeader));

static_assert(sizeof(Doorbell) == 8);
static_assert(sizeof(RingControl) == 256);
static_assert(offsetof(RingControl, head) == 0);
static_assert(offsetof(RingControl, tail) == 64);
static_assert(offsetof(RingControl, bell) == 128);
static_assert(offsetof(RingControl, bell) + offsetof(Doorbell, word) == 128);
static_assert(offsetof(RingControl, bell) + offsetof(Doorbell, sleeping) == 132);

static_assert(sizeof(SegmentHeader) == 256);
static_assert(offsetof(SegmentHeader, magic) == 0);
static_assert(offsetof(SegmentHeader, version) == 4);
static_assert(offsetof(SegmentHeader, segment_size) == 8);
static_assert(offsetof(SegmentHeader, header_size) == 16);
static_assert(offsetof(SegmentHeader, ring_capacity) == 20);
static_assert(offsetof(SegmentHeader, max_record_size) == 24);
static_assert(offsetof(SegmentHeader, record_align) == 28);
static_assert(offsetof(SegmentHeader, request_ring_offset) == 32);
static_assert(offsetof(SegmentHeader, request_data_offset) == 40);
static_assert(offsetof(SegmentHeader, response_ring_offset) == 48);
static_assert(offsetof(SegmentHeader, response_data_offset) == 56);
static_assert(offsetof(SegmentHeader, owner_tag) == 64);
static_assert(offsetof(SegmentHeader, daemon_state) == 128);
static_assert(offsetof(SegmentHeader, client_state) == 192);

static_assert(kRequestRingOffset >= sizeof(SegmentHeader));
static_assert(kResponseRingOffset >= kRequestRingOffset + sizeof(RingControl));
static_assert(kRequestDataOffset >= kResponseRingOffset + sizeof(RingControl));
static_assert(kRequestDataOffset % 4096 == 0 && kResponseDataOffset % 4096 == 0);
static_assert(kSegmentSize == 4096 + 2 * (1u << 20));
static_assert((kRingCapacity & (kRingCapacity - 1)) == 0, "ring capacity must be a power of two");
static_assert(kRingCapacity % kRecordAlign == 0);
static_assert(record_footprint(kMaxRecordSize) <= kRingCapacity / 2, "two maximal records must fit in a ring");
static_assert(kRecordAlign >= sizeof(RecordHeader), "a pad record must fit in any gap before the end");

}  // namespace kestrel::shm
