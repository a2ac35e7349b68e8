// Flags and helpers shared by the `kestrel` subcommands that talk to a running kestreld (generate, chat, status,
// bench): where to connect (--connect URI, KESTREL_CONNECT), the per-call timeout, and the sampling options, which
// become a kestrel.v1.SamplingParams holding only the fields the user set (unset fields take the daemon's defaults).
//
// Not thread-safe (the CLI parses its command line on one thread); the Client returned by connect_client is.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "client/lib/client.h"
#include "core/base/expected.h"
#include "kestrel/v1/kestrel.pb.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace kestrel::cli {

// Exit status of a command-line usage error found after parsing (CLI11's own parse errors map to it in main.cpp).
inline constexpr int kExitUsage = 2;

// The daemon's gRPC socket when --connect is not given: $KESTREL_CONNECT when set, else the first existing socket
// among kestreld's default places (daemon/ops/default_paths.h): /run/kestrel/kestreld.sock (the systemd service;
// tried first for root, last otherwise), $XDG_RUNTIME_DIR/kestrel/kestreld.sock, /tmp/kestrel-$UID/kestreld.sock;
// when none exists, the first of them. Reads the environment and the file system.
std::string default_connect_uri();

// A bare absolute path becomes "unix://<path>"; anything else is returned as it is (Client::connect checks it).
std::string normalize_uri(std::string_view uri);

// The shm control socket beside a gRPC Unix socket: unix:///dir/x.sock -> shm:///dir/kestreld-shm.sock. An shm URI
// is returned as it is; a tcp URI has no shm neighbour (empty string).
std::string shm_uri_beside(std::string_view grpc_uri);

struct ConnectFlags {
  std::string uri;         // filled with default_connect_uri() by add_connect_flags
  double timeout_s = 0.0;  // per-call deadline; 0 = none
};

// Adds --connect URI and --timeout SECONDS to `cmd`; `flags` must outlive the parse.
void add_connect_flags(CLI::App* cmd, ConnectFlags* flags);

// Connects to flags.uri (normalized). The error message names the URI and, for an unreachable daemon, says how to
// start one or point --connect elsewhere.
Expected<std::unique_ptr<client::Client>> connect_client(const ConnectFlags& flags);
Expected<std::unique_ptr<client::Client>> connect_client(const std::string& uri, double timeout_s);

// The sampling options of `kestrel run`, for the daemon: --temp, --top-k, --top-p, --min-p, --seed, --repeat-penalty,
// --presence-penalty, --frequency-penalty, --repeat-last-n.
struct SamplingFlags {
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f, repetition_penalty = 1.0f;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  int32_t top_k = 0, penalty_last_n = 64;
  uint64_t seed = 0;
  // The options, to tell which ones the user gave (nullptr before add_sampling_flags).
  CLI::Option *o_temperature = nullptr, *o_top_k = nullptr, *o_top_p = nullptr, *o_min_p = nullptr;
  CLI::Option *o_repetition_penalty = nullptr, *o_presence_penalty = nullptr, *o_frequency_penalty = nullptr;
  CLI::Option *o_penalty_last_n = nullptr, *o_seed = nullptr;
};

void add_sampling_flags(CLI::App* cmd, SamplingFlags* flags);

// Only the options given on the command line are set in the result.
v1::SamplingParams to_proto(const SamplingFlags& flags);

// "stop_token" for FINISH_REASON_STOP_TOKEN, "unspecified" for 0.
std::string finish_reason_text(v1::FinishReason reason);

// Renders a protobuf message as compact JSON: proto field names (snake_case), fields at their default value included,
// 64-bit integers as strings (proto3's JSON mapping).
std::string to_json(const google::protobuf::Message& message);

}  // namespace kestrel::cli
