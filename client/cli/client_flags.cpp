// Shared flags of the `kestrel` client commands (client_flags.h): connection URI, timeout, sampling options.
#include "client/cli/client_flags.h"

#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "client/cli/cli11.h"

namespace kestrel::cli {

std::string default_connect_uri() {
  if (const char* env = std::getenv("KESTREL_CONNECT"); env != nullptr && *env != '\0') return normalize_uri(env);
  // The places kestreld puts its socket (daemon/ops/default_paths.h), the likeliest first: the system service's
  // for root, a per-user daemon's otherwise. The first that exists wins; when none does, the first.
  const uid_t uid = getuid();
  std::vector<std::string> candidates;
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  const std::string system_socket = "/run/kestrel/kestreld.sock";
  if (uid == 0) candidates.push_back(system_socket);
  if (xdg != nullptr && xdg[0] == '/') candidates.push_back(std::string(xdg) + "/kestrel/kestreld.sock");
  candidates.push_back("/tmp/kestrel-" + std::to_string(uid) + "/kestreld.sock");
  if (uid != 0) candidates.push_back(system_socket);
  for (const auto& path : candidates) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return "unix://" + path;
  }
  return "unix://" + candidates.front();
}

std::string normalize_uri(std::string_view uri) {
  if (!uri.empty() && uri[0] == '/') return "unix://" + std::string(uri);
  return std::string(uri);
}

std::string shm_uri_beside(std::string_view grpc_uri) {
  constexpr std::string_view kUnix = "unix://";
  if (grpc_uri.starts_with("shm://")) return std::string(grpc_uri);
  if (!grpc_uri.starts_with(kUnix)) return {};
  const std::string_view path = grpc_uri.substr(kUnix.size());
  const auto slash = path.rfind('/');
  if (slash == std::string_view::npos) return {};
  return "shm://" + std::string(path.substr(0, slash)) + "/kestreld-shm.sock";
}

void add_connect_flags(CLI::App* cmd, ConnectFlags* flags) {
  flags->uri = default_connect_uri();
  cmd->add_option("--connect", flags->uri,
                  "daemon address: unix:///path (gRPC), tcp://host:port, shm:///path (shared memory); "
                  "env KESTREL_CONNECT")
      ->capture_default_str();
  cmd->add_option("--timeout", flags->timeout_s, "per-call deadline in seconds (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e7));
}

Expected<std::unique_ptr<client::Client>> connect_client(const std::string& uri, double timeout_s) {
  client::ClientOptions options;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::llround(timeout_s * 1000.0)));
  if (timeout_s > 0.0 && options.timeout < options.connect_timeout) options.connect_timeout = options.timeout;
  const std::string normalized = normalize_uri(uri);
  auto client = client::Client::connect(normalized, options);
  if (!client) {
    // The library's message names the address and what it found there; the one hint is added here.
    std::string msg = client.error().message;
    if (client.error().code == ErrorCode::kUnavailable) {
      msg += " (is kestreld running? start it, or point --connect / KESTREL_CONNECT at its socket)";
    }
    return make_error(client.error().code, msg);
  }
  return client;
}

Expected<std::unique_ptr<client::Client>> connect_client(const ConnectFlags& flags) {
  return connect_client(flags.uri, flags.timeout_s);
}

void add_sampling_flags(CLI::App* cmd, SamplingFlags* f) {
  constexpr const char* kGroup = "Sampling (unset: the daemon's defaults)";
  f->o_seed =
      cmd->add_option("--seed", f->seed, "sampling seed (default: the daemon picks one per session)")->group(kGroup);
  f->o_temperature = cmd->add_option("--temp", f->temperature, "temperature (0: greedy)")->group(kGroup);
  f->o_top_k = cmd->add_option("--top-k", f->top_k, "keep the k most likely tokens (0: off)")->group(kGroup);
  f->o_top_p = cmd->add_option("--top-p", f->top_p, "nucleus sampling mass (1: off)")->group(kGroup);
  f->o_min_p = cmd->add_option("--min-p", f->min_p, "drop tokens below min-p times the best (0: off)")->group(kGroup);
  f->o_repetition_penalty =
      cmd->add_option("--repeat-penalty", f->repetition_penalty, "repetition penalty (1: off)")->group(kGroup);
  f->o_presence_penalty =
      cmd->add_option("--presence-penalty", f->presence_penalty, "presence penalty (0: off)")->group(kGroup);
  f->o_frequency_penalty =
      cmd->add_option("--frequency-penalty", f->frequency_penalty, "frequency penalty (0: off)")->group(kGroup);
  f->o_penalty_last_n =
      cmd->add_option("--repeat-last-n", f->penalty_last_n, "tokens the penalties look back (-1: all, 0: off)")
          ->group(kGroup);
}

v1::SamplingParams to_proto(const SamplingFlags& f) {
  v1::SamplingParams p;
  auto given = [](const CLI::Option* o) { return o != nullptr && o->count() > 0; };
  if (given(f.o_temperature)) p.set_temperature(f.temperature);
  if (given(f.o_top_k)) p.set_top_k(f.top_k);
  if (given(f.o_top_p)) p.set_top_p(f.top_p);
  if (given(f.o_min_p)) p.set_min_p(f.min_p);
  if (given(f.o_repetition_penalty)) p.set_repetition_penalty(f.repetition_penalty);
  if (given(f.o_presence_penalty)) p.set_presence_penalty(f.presence_penalty);
  if (given(f.o_frequency_penalty)) p.set_frequency_penalty(f.frequency_penalty);
  if (given(f.o_penalty_last_n)) p.set_penalty_last_n(f.penalty_last_n);
  if (given(f.o_seed)) p.set_seed(f.seed);
  return p;
}

std::string finish_reason_text(v1::FinishReason reason) {
  std::string name = v1::FinishReason_Name(reason);
  constexpr std::string_view kPrefix = "FINISH_REASON_";
  if (name.starts_with(kPrefix)) name.erase(0, kPrefix.size());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name.empty() ? std::to_string(static_cast<int>(reason)) : name;
}

std::string to_json(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(message, &out, options).ok()) return "{}";
  return out;
}

}  // namespace kestrel::cli
