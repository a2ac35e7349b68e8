// SessionTable: the live sessions of a Service, keyed by random non-zero 64-bit ids (never sequential, so one
// client cannot guess another's session), with their idle-expiry bookkeeping.
//
// A Session is shared (shared_ptr) between the table and the request running on it; once closed it leaves the table
// at once and its engine slot is freed by whoever holds it last (the closer when it is idle, the engine loop when a
// request was in flight).
//
// Ownership of a Session's fields ("busy protocol"): `active` is read and written under the Service's mutex. While
// `active` is set, the engine loop thread alone reads and writes fed, pending and sampler; while it is null,
// they belong to whoever holds the Service's mutex. Everything else is written under that mutex.
// SessionTable itself is not thread-safe: the Service calls it with its mutex held.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <unordered_map>
#include <vector>

#include "core/engine/engine.h"
#include "core/sampler/sampler.h"
#include "daemon/engine/service.h"

namespace kestrel::daemon {

struct Request;

struct Session {
  SessionId id = 0;
  SlotId slot = -1;
  int32_t n_ctx = 0;
  // The tokens in the engine slot, oldest first: the session's history (the sampler's penalty window reads it;
  // engines keep only a position).
  std::vector<int32_t> fed;
  std::vector<int32_t> pending;  // emitted by a generation, not yet fed; prepended to the next request
  SamplingParams params;         // the session's own parameters (per-request overrides are applied on top)
  Sampler sampler;               // the session's RNG stream continues across requests
  std::chrono::seconds idle_ttl{0};
  Clock::time_point last_used;
  uint64_t owner = 0;
  bool temporary = false;           // created by a generate() without a session; closed when it ends
  std::shared_ptr<Request> active;  // the in-flight request (busy) or null
  bool closed = false;              // left the table while busy: the engine loop frees the slot

  explicit Session(Sampler s) : sampler(std::move(s)) {}
  int64_t n_fed() const { return static_cast<int64_t>(fed.size()); }
  int64_t n_past() const { return n_fed() + static_cast<int64_t>(pending.size()); }
  SessionInfo info() const { return SessionInfo{id, n_ctx, n_past()}; }
};

class SessionTable {
 public:
  SessionTable();

  size_t size() const { return sessions_.size(); }
  // Gives the session a fresh random id and inserts it; returns the id.
  SessionId insert(std::shared_ptr<Session> session);
  std::shared_ptr<Session> find(SessionId id) const;
  std::shared_ptr<Session> erase(SessionId id);
  std::vector<SessionId> ids_owned_by(uint64_t owner) const;
  std::vector<std::shared_ptr<Session>> all() const;

  // Removes and returns the idle sessions whose TTL has passed at `now`.
  std::vector<std::shared_ptr<Session>> take_expired(Clock::time_point now);
  // When the next idle session expires (nullopt: none idle).
  std::optional<Clock::time_point> next_expiry() const;

  // A random 64-bit value from the table's generator (seeds of sessions created without one).
  uint64_t random_u64() { return rng_(); }

 private:
  std::unordered_map<SessionId, std::shared_ptr<Session>> sessions_;
  std::mt19937_64 rng_;
};

}  // namespace kestrel::daemon
