// `kestrel status`: what a running kestreld is doing — health, the model (architecture, vocabulary, context,
// placement table) and the server's counters (sessions, queue, ticks, tokens, uptime), as text or with --json as one
// JSON object {"connect", "transport", "health", "model", "server"} (model and server in the proto3 JSON mapping of
// ModelInfo and ServerStatus, proto field names).
//
// Health is SERVING when the daemon answers and reports serving (model loaded, not draining), NOT_SERVING when it
// answers but is loading or draining. Exit status: 0 when SERVING, 1 otherwise (also when it cannot be reached), so
// `kestrel status >/dev/null` works as a readiness check.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "client/cli/cli11.h"
#include "client/cli/cli_format.h"
#include "client/cli/client_flags.h"
#include "client/cli/commands.h"

namespace kestrel::cli {
namespace {

struct StatusOptions {
  ConnectFlags connect;
  bool json = false;
};

std::string format_uptime(double s) {
  const auto total = static_cast<uint64_t>(s);
  const uint64_t d = total / 86400, h = (total / 3600) % 24, m = (total / 60) % 60, sec = total % 60;
  char buf[64];
  if (d > 0) {
    std::snprintf(buf, sizeof buf, "%llud %lluh %llum", (unsigned long long)d, (unsigned long long)h,
                  (unsigned long long)m);
  } else if (h > 0) {
    std::snprintf(buf, sizeof buf, "%lluh %llum %llus", (unsigned long long)h, (unsigned long long)m,
                  (unsigned long long)sec);
  } else {
    std::snprintf(buf, sizeof buf, "%llum %.1fs", (unsigned long long)m, s - 60.0 * static_cast<double>(m));
  }
  return buf;
}

void print_text(const std::string& uri, const std::string& transport, const v1::ServerStatus& st,
                const v1::ModelInfo* mi, const std::string& model_error) {
  std::printf("daemon:       %s (%s), kestreld %s\n", uri.c_str(), transport.c_str(), st.version().c_str());
  std::printf("health:       %s\n", st.serving() ? "SERVING" : "NOT_SERVING (loading the model or draining)");
  std::printf("uptime:       %s\n", format_uptime(st.uptime_s()).c_str());
  std::printf("sessions:     %u of %u (%u shared-memory clients)\n", st.sessions(), st.max_sessions(),
              st.shm_clients());
  std::printf("queue:        %u of %u steps\n", st.queued_steps(), st.max_queued_steps());
  if (st.kv_cache_tokens() > 0) {
    std::printf("kv cache:     %s of %s tokens held (%.1f%%), a pool of %s\n",
                format_count(st.kv_cache_tokens_held()).c_str(), format_count(st.kv_cache_tokens()).c_str(),
                100.0 * static_cast<double>(st.kv_cache_tokens_held()) / static_cast<double>(st.kv_cache_tokens()),
                format_bytes(st.kv_cache_bytes()).c_str());
  }
  std::printf("work:         %s ticks, %s tokens processed, %s generated\n", format_count(st.ticks()).c_str(),
              format_count(st.tokens_processed()).c_str(), format_count(st.tokens_generated()).c_str());
  if (mi == nullptr) {
    std::printf("model:        unavailable (%s)\n", model_error.c_str());
    return;
  }
  std::printf("model:        %s \"%s\", %s, engine %s\n", mi->architecture().c_str(), mi->name().c_str(),
              format_bytes(mi->file_bytes()).c_str(), mi->engine().c_str());
  std::printf("  path:       %s\n", mi->model_path().c_str());
  if (!mi->device().empty()) std::printf("  device:     %s\n", mi->device().c_str());
  std::string eos;
  for (int32_t id : mi->eos_token_ids()) eos += (eos.empty() ? "" : " ") + std::to_string(id);
  std::printf("  vocab:      %s tokens, eos %s, bos %d\n", format_count(static_cast<uint64_t>(mi->n_vocab())).c_str(),
              eos.empty() ? "none" : eos.c_str(), mi->bos_token_id());
  std::printf("  context:    %s trained, %s per session at most\n",
              format_count(static_cast<uint64_t>(mi->n_ctx_train())).c_str(),
              format_count(static_cast<uint64_t>(mi->max_session_ctx())).c_str());
  std::printf("  shape:      %d layers, embedding %d, %d experts (%d used per token)\n", mi->n_layer(), mi->n_embd(),
              mi->n_expert(), mi->n_expert_used());
  if (mi->placement_size() == 0) return;
  size_t width = 9;
  for (const auto& p : mi->placement()) width = std::max(width, p.component().size());
  uint64_t total = 0;
  for (const auto& p : mi->placement()) total += p.bytes();
  std::printf("placement:\n  %-*s  %-8s  %10s  %6s\n", static_cast<int>(width), "component", "device", "bytes",
              "share");
  for (const auto& p : mi->placement()) {
    std::printf("  %-*s  %-8s  %10s  %6s\n", static_cast<int>(width), p.component().c_str(), p.device().c_str(),
                format_bytes(p.bytes()).c_str(), format_percent(p.bytes(), total).c_str());
  }
  if (!mi->placement_summary().empty()) std::printf("  %s\n", mi->placement_summary().c_str());
}

int run_status(const StatusOptions& o) {
  auto client = connect_client(o.connect);
  if (!client) {
    if (o.json) {
      nlohmann::ordered_json j;
      j["connect"] = normalize_uri(o.connect.uri);
      j["health"] = "UNREACHABLE";
      std::puts(j.dump().c_str());
    }
    print_error("", client.error().message);
    return 1;
  }
  client::Client& c = **client;
  auto st = c.server_status();
  if (!st) {
    print_error("", st.error().message);
    return 1;
  }
  auto mi = c.model_info();
  const std::string uri = normalize_uri(o.connect.uri);
  if (o.json) {
    nlohmann::ordered_json j;
    j["connect"] = uri;
    j["transport"] = c.transport();
    j["health"] = st->serving() ? "SERVING" : "NOT_SERVING";
    j["model"] = mi ? nlohmann::ordered_json::parse(to_json(*mi)) : nlohmann::ordered_json(nullptr);
    if (!mi) j["model_error"] = mi.error().message;
    j["server"] = nlohmann::ordered_json::parse(to_json(*st));
    std::puts(j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
  } else {
    print_text(uri, c.transport(), *st, mi ? &*mi : nullptr, mi ? std::string() : mi.error().message);
  }
  return st->serving() ? 0 : 1;
}

}  // namespace

void add_status(CLI::App& app, int* exit_code) {
  auto opts = std::make_shared<StatusOptions>();
  CLI::App* cmd = app.add_subcommand("status", "health, model and counters of a running kestreld");
  cmd->add_flag("--json", opts->json, "print one JSON object instead of text");
  add_connect_flags(cmd, &opts->connect);
  cmd->callback([opts, exit_code] { *exit_code = run_status(*opts); });
}

}  // namespace kestrel::cli
