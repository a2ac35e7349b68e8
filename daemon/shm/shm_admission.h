// ShmAdmission: who may hold a place in kestreld's shm fast path (docs/shm.md "Handshake"). A connection first holds
// a handshake place, from accept until the client confirms its mapping (within ShmServerOptions::handshake_timeout),
// and only then one of max_clients. So connections that never finish the handshake cannot lock real clients out:
// they are bounded by their own limits (all uids, and per uid) and by the deadline. A per-uid limit on clients keeps
// one user from taking every slot.
//
//   begin_handshake(uid)  accept: refused when no client slot could be given at its end (max_clients or the uid's
//                         share in use) or when the handshake places are full (all, or this uid's)
//   promote(uid)          handshake done: the handshake place becomes a client slot, or refused when the client
//                         limits filled meanwhile; the handshake place is released either way
//   abandon_handshake     handshake failed or timed out
//   release_client        a promoted client left
//
// Refusals name the limit: kResourceExhausted when the client slots are full (a client would wait for another to
// leave), kUnavailable when only the handshake places are (they free within milliseconds, or at the handshake
// deadline; libkestrel-client retries those until its connect timeout). Pure bookkeeping (no I/O, no logging);
// thread-safe. on_clients_changed (if set) is called with the new client count under the lock, so the counts it
// sees arrive in order: it must be quick and must not call back into the ShmAdmission.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "core/base/expected.h"

namespace kestrel::daemon {

struct ShmAdmissionLimits {
  uint32_t max_clients = 64;            // connected clients (handshake done), all uids
  uint32_t max_clients_per_uid = 32;    // connected clients of one uid
  uint32_t max_handshakes = 16;         // connections still in their handshake, all uids
  uint32_t max_handshakes_per_uid = 8;  // connections of one uid still in their handshake
};

class ShmAdmission {
 public:
  explicit ShmAdmission(ShmAdmissionLimits limits, std::function<void(uint32_t clients)> on_clients_changed = {});

  Status begin_handshake(uid_t uid);
  Status promote(uid_t uid);
  void abandon_handshake(uid_t uid);
  void release_client(uid_t uid);

  uint32_t clients() const;
  uint32_t handshakes() const;
  const ShmAdmissionLimits& limits() const { return limits_; }

 private:
  struct PerUid {
    uint32_t clients = 0;
    uint32_t handshakes = 0;
  };
  // Under mu_: kResourceExhausted when `uid` could not take a client slot now.
  Status check_client_slot(uid_t uid) const;
  void forget_if_idle(uid_t uid);

  const ShmAdmissionLimits limits_;
  const std::function<void(uint32_t)> on_clients_changed_;
  mutable std::mutex mu_;
  uint32_t clients_ = 0;                    // guarded by mu_
  uint32_t handshakes_ = 0;                 // guarded by mu_
  std::unordered_map<uid_t, PerUid> uids_;  // guarded by mu_; entries with both counts 0 are removed
};

}  // namespace kestrel::daemon
