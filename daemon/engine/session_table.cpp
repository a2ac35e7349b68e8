// SessionTable (session_table.h): random ids, lookups by id and owner, idle expiry.
#include "daemon/engine/session_table.h"

#include <utility>

namespace kestrel::daemon {

SessionTable::SessionTable() {
  std::random_device rd;
  std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
  rng_.seed(seq);
}

SessionId SessionTable::insert(std::shared_ptr<Session> session) {
  SessionId id = 0;
  while (id == 0 || sessions_.count(id) != 0) id = rng_();
  session->id = id;
  sessions_.emplace(id, std::move(session));
  return id;
}

std::shared_ptr<Session> SessionTable::find(SessionId id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second;
}

std::shared_ptr<Session> SessionTable::erase(SessionId id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return nullptr;
  std::shared_ptr<Session> s = std::move(it->second);
  sessions_.erase(it);
  return s;
}

std::vector<SessionId> SessionTable::ids_owned_by(uint64_t owner) const {
  std::vector<SessionId> ids;
  for (const auto& [id, s] : sessions_) {
    if (s->owner == owner) ids.push_back(id);
  }
  return ids;
}

std::vector<std::shared_ptr<Session>> SessionTable::all() const {
  std::vector<std::shared_ptr<Session>> out;
  out.reserve(sessions_.size());
  for (const auto& [id, s] : sessions_) out.push_back(s);
  return out;
}

std::vector<std::shared_ptr<Session>> SessionTable::take_expired(Clock::time_point now) {
  std::vector<std::shared_ptr<Session>> out;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    const Session& s = *it->second;
    if (!s.active && !s.temporary && s.last_used + s.idle_ttl <= now) {
      out.push_back(std::move(it->second));
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::optional<Clock::time_point> SessionTable::next_expiry() const {
  std::optional<Clock::time_point> next;
  for (const auto& [id, s] : sessions_) {
    if (s->active || s->temporary) continue;
    const Clock::time_point t = s->last_used + s->idle_ttl;
    if (!next || t < *next) next = t;
  }
  return next;
}

}  // namespace kestrel::daemon
