// ShmAdmission (shm_admission.h).
#include "daemon/shm/shm_admission.h"

#include <string>
#include <utility>

namespace kestrel::daemon {
namespace {

// No client slot: the connection would wait for another client to leave.
Error full(std::string message) {
  return make_error(ErrorCode::kResourceExhausted, std::move(message) + "; use gRPC or retry later");
}

// No handshake place: transient (places free within milliseconds, or at the handshake deadline); libkestrel-client
// retries these until its connect timeout.
Error busy(std::string message) {
  return make_error(ErrorCode::kUnavailable, std::move(message) + "; retry in a moment");
}

}  // namespace

ShmAdmission::ShmAdmission(ShmAdmissionLimits limits, std::function<void(uint32_t)> on_clients_changed)
    : limits_(limits), on_clients_changed_(std::move(on_clients_changed)) {}

Status ShmAdmission::check_client_slot(uid_t uid) const {
  if (clients_ >= limits_.max_clients) {
    return full("kestreld already serves " + std::to_string(limits_.max_clients) + " shm clients (max_clients)");
  }
  const auto it = uids_.find(uid);
  if (it != uids_.end() && it->second.clients >= limits_.max_clients_per_uid) {
    return full("uid " + std::to_string(uid) + " already has " + std::to_string(limits_.max_clients_per_uid) +
                " shm clients (max_clients_per_uid)");
  }
  return ok_status();
}

void ShmAdmission::forget_if_idle(uid_t uid) {
  const auto it = uids_.find(uid);
  if (it != uids_.end() && it->second.clients == 0 && it->second.handshakes == 0) uids_.erase(it);
}

Status ShmAdmission::begin_handshake(uid_t uid) {
  std::lock_guard<std::mutex> lock(mu_);
  KESTREL_TRY(check_client_slot(uid));
  if (handshakes_ >= limits_.max_handshakes) {
    return busy(std::to_string(limits_.max_handshakes) + " shm handshakes are in progress (max_handshakes)");
  }
  PerUid& u = uids_[uid];
  if (u.handshakes >= limits_.max_handshakes_per_uid) {
    const uint32_t n = u.handshakes;
    forget_if_idle(uid);
    return busy("uid " + std::to_string(uid) + " already has " + std::to_string(n) +
                " shm handshakes in progress (max_handshakes_per_uid)");
  }
  ++u.handshakes;
  ++handshakes_;
  return ok_status();
}

Status ShmAdmission::promote(uid_t uid) {
  std::lock_guard<std::mutex> lock(mu_);
  PerUid& u = uids_[uid];
  if (u.handshakes > 0) {
    --u.handshakes;
    --handshakes_;
  }
  if (Status st = check_client_slot(uid); !st) {
    forget_if_idle(uid);
    return st;
  }
  ++u.clients;
  ++clients_;
  if (on_clients_changed_) on_clients_changed_(clients_);
  return ok_status();
}

void ShmAdmission::abandon_handshake(uid_t uid) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = uids_.find(uid);
  if (it == uids_.end() || it->second.handshakes == 0) return;
  --it->second.handshakes;
  --handshakes_;
  forget_if_idle(uid);
}

void ShmAdmission::release_client(uid_t uid) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = uids_.find(uid);
  if (it == uids_.end() || it->second.clients == 0) return;
  --it->second.clients;
  --clients_;
  forget_if_idle(uid);
  if (on_clients_changed_) on_clients_changed_(clients_);
}

uint32_t ShmAdmission::clients() const {
  std::lock_guard<std::mutex> lock(mu_);
  return clients_;
}

uint32_t ShmAdmission::handshakes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return handshakes_;
}

}  // namespace kestrel::daemon
