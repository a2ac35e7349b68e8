// DaemonConfig: the key table, the TOML reader and writer, flag conversion and cross-key checks (config.h).
#include "daemon/ops/config.h"

#include <toml++/toml.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>

#include "core/engine/placement_planner.h"

namespace kestrel::daemon::ops {

namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
constexpr size_t kMaxUnixPath = 107;  // sizeof(sockaddr_un::sun_path) - 1

std::string describe(const ConfigValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) {
    std::ostringstream s;
    s << *d;
    return s.str();
  }
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  return "\"" + std::get<std::string>(v) + "\"";
}

Error bad(std::string message) { return make_error(ErrorCode::kInvalidArgument, std::move(message)); }

Expected<int64_t> as_integer(const ConfigValue& v, int64_t lo, int64_t hi) {
  const auto* i = std::get_if<int64_t>(&v);
  if (i == nullptr || *i < lo || *i > hi) {
    return bad("must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " + describe(v));
  }
  return *i;
}

// A finite number in [lo, hi] (lo excluded when lo_open); TOML integers are accepted.
Expected<float> as_float(const ConfigValue& v, double lo, double hi, bool lo_open) {
  double d = 0.0;
  if (const auto* i = std::get_if<int64_t>(&v)) {
    d = static_cast<double>(*i);
  } else if (const auto* f = std::get_if<double>(&v)) {
    d = *f;
  } else {
    return bad("must be a number, got " + describe(v));
  }
  const bool below = lo_open ? !(d > lo) : !(d >= lo);
  if (!std::isfinite(d) || below || d > hi) {
    std::ostringstream range;
    range << (lo_open ? "greater than " : "from ") << lo;
    if (std::isfinite(hi)) range << (lo_open ? " and at most " : " to ") << hi;
    return bad("must be a finite number " + range.str() + ", got " + describe(v));
  }
  return static_cast<float>(d);
}

Expected<std::string> as_string(const ConfigValue& v) {
  const auto* s = std::get_if<std::string>(&v);
  if (s == nullptr) return bad("must be a string, got " + describe(v));
  return *s;
}

Expected<std::string> as_one_of(const ConfigValue& v, std::initializer_list<std::string_view> allowed) {
  KESTREL_TRY_ASSIGN(std::string s, as_string(v));
  std::string list;
  for (std::string_view a : allowed) {
    if (s == a) return s;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  return bad("must be one of " + list + ", got \"" + s + "\"");
}

// A Unix socket path: empty allowed when `empty_ok`; otherwise absolute and short enough for sockaddr_un.
Expected<std::string> as_socket_path(const ConfigValue& v, bool empty_ok) {
  const auto* s = std::get_if<std::string>(&v);  // read in place: copying first trips GCC 12's -Wmaybe-uninitialized
  if (s == nullptr) return bad("must be a string, got " + describe(v));
  if (s->empty()) {
    if (empty_ok) return std::string();
    return bad("must be an absolute path, got \"\"");
  }
  if ((*s)[0] != '/') return bad("must be an absolute path, got \"" + *s + "\"");
  if (s->size() > kMaxUnixPath) {
    return bad("is " + std::to_string(s->size()) + " bytes long; a Unix socket path holds at most " +
               std::to_string(kMaxUnixPath));
  }
  return *s;
}

Status check_tcp_address(const std::string& s) {
  if (s.empty()) return ok_status();
  const size_t colon = s.rfind(':');
  const std::string host = colon == std::string::npos ? std::string() : s.substr(0, colon);
  const std::string port = colon == std::string::npos ? std::string() : s.substr(colon + 1);
  int value = -1;
  const auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (host.empty() || port.empty() || ec != std::errc() || ptr != port.data() + port.size() || value < 0 ||
      value > 65535) {
    return bad("must be HOST:PORT (e.g. \"127.0.0.1:7777\" or \"[::1]:7777\", port 0-65535), got \"" + s + "\"");
  }
  return ok_status();
}

// A token such as an API key or a model name: printable ASCII without spaces (it travels in a header or JSON).
Expected<std::string> as_token(const ConfigValue& v) {
  const auto* s = std::get_if<std::string>(&v);
  if (s == nullptr) return bad("must be a string, got " + describe(v));
  for (const char ch : *s) {
    if (ch <= ' ' || ch > '~') return bad("must be printable ASCII without spaces, got \"" + *s + "\"");
  }
  return *s;
}

Expected<uint32_t> as_mode(const ConfigValue& v) {
  int64_t mode = -1;
  if (const auto* i = std::get_if<int64_t>(&v)) {
    mode = *i;  // a TOML octal literal (0o660) arrives as its value
  } else if (const auto* s = std::get_if<std::string>(&v)) {
    const char* end = s->data() + s->size();
    const auto [ptr, ec] = std::from_chars(s->data(), end, mode, 8);
    if (s->empty() || ec != std::errc() || ptr != end) mode = -1;
  }
  if (mode < 0 || mode > 0777) return bad("must be an octal file mode such as \"0660\", got " + describe(v));
  return static_cast<uint32_t>(mode);
}

std::string mode_text(uint32_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode);
  return buf;
}

// Field setters ----------------------------------------------------------------------------------------------------

template <class T>
Status set_int_field(T& field, const ConfigValue& v, int64_t lo, int64_t hi) {
  KESTREL_TRY_ASSIGN(int64_t i, as_integer(v, lo, hi));
  field = static_cast<T>(i);
  return ok_status();
}

Status set_seconds(std::chrono::seconds& field, const ConfigValue& v, int64_t lo, int64_t hi) {
  KESTREL_TRY_ASSIGN(int64_t i, as_integer(v, lo, hi));
  field = std::chrono::seconds(i);
  return ok_status();
}

Status set_float_field(float& field, const ConfigValue& v, double lo, double hi, bool lo_open) {
  KESTREL_TRY_ASSIGN(float f, as_float(v, lo, hi, lo_open));
  field = f;
  return ok_status();
}

constexpr double kHuge = 1e30;  // penalties: any finite float

SamplingParams& sampling(DaemonConfig& c) { return c.limits.default_sampling; }
const SamplingParams& sampling(const DaemonConfig& c) { return c.limits.default_sampling; }

// The help of [cuda] expert_upload names the engine's default.
static_assert(gpu::GpuTuning{}.expert_upload_min_tokens == gpu::kExpertUploadAuto && gpu::kExpertUploadAuto == -1);

const std::vector<ConfigKey> kKeys = {
    // Top level.
    {"", "model", "--model", "PATH",
     "GGUF model to serve; empty: the embedded default tiny model, created in cache_dir on first start",
     ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(c.model, as_string(v));
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.model; }},
    {"", "engine", "--engine", "NAME",
     "compute engine: auto (cuda when a usable CUDA device exists, else cpu; the default), cuda (every weight and "
     "session state on the GPU), cpu (SIMD kernels on pinned worker threads, weights read from the mapped file), "
     "reference (the scalar f32 oracle, one thread)",
     ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(c.engine, as_one_of(v, {"auto", "cuda", "cpu", "reference"}));
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.engine; }},
    {"", "stop_timeout_s", "--stop-timeout", "SECONDS",
     "on SIGTERM, how long in-flight requests may run before they are aborted (0-3600; default 30)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.stop_timeout_s, v, 0, 3600); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.stop_timeout_s}; }},
    {"", "cache_dir", "--cache-dir", "DIR",
     "where the default model is kept; empty: $CACHE_DIRECTORY, else $XDG_CACHE_HOME/kestrel, else "
     "~/.cache/kestrel",
     ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(c.cache_dir, as_string(v));
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.cache_dir; }},
    // [listen]
    {"listen", "socket", "--socket", "PATH",
     "gRPC Unix socket; empty: $RUNTIME_DIRECTORY/kestreld.sock under systemd, /run/kestrel/kestreld.sock as "
     "root, else $XDG_RUNTIME_DIR/kestrel/kestreld.sock or /tmp/kestrel-$UID/kestreld.sock",
     ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(c.listen.socket, as_socket_path(v, true));
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.listen.socket; }},
    {"listen", "socket_mode", "--socket-mode", "MODE",
     "permissions of both sockets, octal (default 0660: the daemon's user and group)", ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(c.listen.socket_mode, as_mode(v));
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return mode_text(c.listen.socket_mode); }},
    {"listen", "shm_socket", "--shm-socket", "PATH",
     "control socket of the shared-memory fast path; default: kestreld-shm.sock beside the gRPC socket; "
     "empty: disabled",
     ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(c.listen.shm_socket, as_socket_path(v, true));
       c.listen.shm_socket_set = true;
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.listen.shm_socket; }},
    {"listen", "tcp", "--tcp", "HOST:PORT", "also serve gRPC over TCP at this address (no TLS); empty: no TCP",
     ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(std::string s, as_string(v));
       KESTREL_TRY(check_tcp_address(s));
       c.listen.tcp = s;
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.listen.tcp; }},
    {"listen", "http", "--http", "HOST:PORT",
     "serve the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics) "
     "at this address (no TLS: bind to 127.0.0.1 or put a proxy in front); empty: off",
     ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(std::string s, as_string(v));
       KESTREL_TRY(check_tcp_address(s));
       c.listen.http = s;
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.listen.http; }},
    // [http]
    {"http", "api_key", "--http-api-key", "KEY",
     "HTTP: require \"Authorization: Bearer KEY\" on /v1/ routes (visible in ps: prefer api_key_file); empty: none",
     ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(c.http.api_key, as_token(v));
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.http.api_key; }},
    {"http", "api_key_file", "--http-api-key-file", "PATH",
     "HTTP: read the API key from the first line of this file at start; empty: none", ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(std::string s, as_string(v));
       if (!s.empty() && s[0] != '/') return bad("must be an absolute path, got \"" + s + "\"");
       c.http.api_key_file = s;
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.http.api_key_file; }},
    {"http", "served_model_name", "--served-model-name", "NAME",
     "HTTP: the model id of /v1/models and of every response; empty: the model file's name without .gguf",
     ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(c.http.served_model_name, as_token(v));
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.http.served_model_name; }},
    {"http", "max_body_bytes", "--http-max-body-bytes", "BYTES",
     "HTTP: largest request body; larger ones are answered 413 (1024-1073741824; default 4194304)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.http.max_body_bytes, v, 1024, 1 << 30); },
     [](const DaemonConfig& c) -> ConfigValue { return static_cast<int64_t>(c.http.max_body_bytes); }},
    {"http", "max_concurrent_requests", "--http-max-concurrent", "N",
     "HTTP: completions running at once; more are answered 429 (1-100000; default 64)", ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.http.max_concurrent_requests, v, 1, 100000); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.http.max_concurrent_requests}; }},
    {"http", "max_connections", "--http-max-connections", "N",
     "HTTP: open connections; more are answered 503 and closed (1-1000000; default 512)", ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.http.max_connections, v, 1, 1000000); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.http.max_connections}; }},
    // [cuda]
    {"cuda", "slots", "--cuda-slots", "N",
     "CUDA engine: sessions resident on the device at once, each up to max_session_ctx tokens, their KV cache taken "
     "from the kv_cache_bytes pool as they grow (1-4096; default 16; max_sessions is lowered to it)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.cuda.slots, v, 1, 4096); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.cuda.slots}; }},
    {"cuda", "kv_cache_bytes", "--kv-cache-bytes", "BYTES",
     "CUDA engine: device memory for the KV cache all sessions share, in pages of 256 tokens; a step that needs a "
     "page when none is free fails with RESOURCE_EXHAUSTED (0-2^50; default 0: enough for every slot at "
     "max_session_ctx, at most 90% of the memory left after the weights)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.cuda.kv_cache_bytes, v, 0, int64_t{1} << 50); },
     [](const DaemonConfig& c) -> ConfigValue { return static_cast<int64_t>(c.cuda.kv_cache_bytes); }},
    {"cuda", "device", "--cuda-device", "N", "CUDA engine: the device ordinal (default 0)", ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.cuda.device, v, 0, 1024); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.cuda.device}; }},
    {"cuda", "gpu_memory", "--gpu-memory", "BYTES|auto",
     "CUDA engine: GPU memory the weights may take (12G, 512MiB, bytes); the routed experts that do not fit run on "
     "the CPU. auto (the default): what the device has free less the sessions' state, the scratch and a headroom",
     ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(std::string text, as_string(v));
       PlacementFlags f;
       f.gpu_memory = text;
       if (auto parsed = parse_placement_flags(f); !parsed) return bad(parsed.error().message);
       c.cuda.gpu_memory = text;
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.cuda.gpu_memory; }},
    {"cuda", "n_cpu_moe", "--n-cpu-moe", "N",
     "CUDA engine: keep the routed experts of the first N MoE layers on the CPU (0-100000; default 0)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.cuda.n_cpu_moe, v, 0, 100000); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.cuda.n_cpu_moe}; }},
    {"cuda", "override_tensor", "--override-tensor", "REGEX=cpu|gpu[;...]",
     "CUDA engine: put the routed experts of the layers whose expert tensors match REGEX on the CPU or the GPU "
     "(several separated by ';', the last match wins; names as in `kestrel inspect --plan`); default none",
     ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(std::string text, as_string(v));
       PlacementFlags f;
       f.overrides = split_tensor_overrides(text);
       if (auto parsed = parse_placement_flags(f); !parsed) return bad(parsed.error().message);
       c.cuda.override_tensor = text;
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.cuda.override_tensor; }},
    {"cuda", "prompt_digits", "--prompt-digits", "4|2",
     "CUDA engine: activation digits of the prompt passes' quantized matrix products: 4 (default; the arithmetic of "
     "decode) or 2 (about 20% faster prompts; each activation rounded to 13 bits below its 256-element group's "
     "largest)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(int64_t d, as_integer(v, 2, 4));
       if (d != 2 && d != 4) return bad("prompt_digits must be 4 or 2 (got " + std::to_string(d) + ")");
       c.cuda.prompt_digits = static_cast<uint32_t>(d);
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.cuda.prompt_digits}; }},
    {"cuda", "expert_upload", "--expert-upload", "N",
     "CUDA engine with routed experts on the CPU: prompt passes of at least N tokens copy those experts to the GPU "
     "layer by layer and run them there, bit-identical to an all-GPU model (0: the CPU computes them; -1: from where "
     "the start-up cost model, the measured copy rate against the host's measured time per token, says it pays; "
     "-1-1000000; default -1)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) {
       return set_int_field(c.cuda.expert_upload_min_tokens, v, -1, 1000000);
     },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.cuda.expert_upload_min_tokens}; }},
    {"cuda", "side_read", "--side-read", "PCT",
     "CUDA engine with routed experts on the CPU: decode steps have the GPU read PCT% of each token's host experts "
     "itself, over the bus from their page-locked copy, while the CPU's workers read the rest (0: off; -1: "
     "the share at which both would finish together by the rates measured at start-up; -1-100; default -1)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.cuda.side_read_percent, v, -1, 100); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.cuda.side_read_percent}; }},
    {"cuda", "routing_calibration", "--routing-calibration", "N",
     "CUDA engine whose GPU budget splits the routed experts (no n_cpu_moe or override_tensor): the planner fills "
     "the GPU with the most-chosen experts first, counted over an N-token calibration prompt through the CPU engine "
     "at start-up and kept in cache_dir for the next start with the same model (0: no calibration, every expert "
     "equally likely unless cache_dir has counts; 0-65536; default 256)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.cuda.routing_calibration, v, 0, 65536); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.cuda.routing_calibration}; }},
    // [cpu]
    {"cpu", "threads", "--threads", "N",
     "CPU engine (and the CUDA engine's routed experts on the CPU): compute threads, the engine loop's own included, "
     "pinned one per core (0-1024; default 0: one per physical core, two fewer for the CUDA engine's experts)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.cpu.threads, v, 0, 1024); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.cpu.threads}; }},
    // [limits]
    {"limits", "max_sessions", "--max-sessions", "N",
     "open sessions at most; more get RESOURCE_EXHAUSTED (default 256)", ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.limits.max_sessions, v, 1, 1000000); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.limits.max_sessions}; }},
    {"limits", "max_queued_steps", "--max-queued-steps", "N",
     "step and generate requests waiting or running at most; more get RESOURCE_EXHAUSTED (default 1024)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.limits.max_queued_steps, v, 1, 10000000); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.limits.max_queued_steps}; }},
    {"limits", "default_n_ctx", "--default-n-ctx", "TOKENS",
     "context of a session that asks for none (default 4096; at most max_session_ctx)", ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.limits.default_n_ctx, v, 1, kMaxInt32); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.limits.default_n_ctx}; }},
    {"limits", "max_session_ctx", "--max-session-ctx", "TOKENS",
     "largest context a session may ask for, clamped to the model's training context (default 32768)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.limits.max_session_ctx, v, 1, kMaxInt32); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.limits.max_session_ctx}; }},
    {"limits", "max_batch_tokens", "--max-batch-tokens", "TOKENS",
     "tokens in one engine tick; longer prompts are split across ticks (default 2048)", ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(c.limits.max_batch_tokens, v, 1, 1 << 20); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.limits.max_batch_tokens}; }},
    {"limits", "idle_ttl_s", "--idle-ttl", "SECONDS",
     "a session unused this long is closed, unless it asked for another TTL (default 600)", ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_seconds(c.limits.default_idle_ttl, v, 1, 31536000); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.limits.default_idle_ttl.count()}; }},
    {"limits", "max_idle_ttl_s", "--max-idle-ttl", "SECONDS", "largest idle TTL a session may ask for (default 86400)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_seconds(c.limits.max_idle_ttl, v, 1, 31536000); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{c.limits.max_idle_ttl.count()}; }},
    // [sampling]
    {"sampling", "temperature", "--temperature", "T", "default temperature; 0 = greedy (default 0.8)",
     ConfigValueKind::kFloat,
     [](DaemonConfig& c, const ConfigValue& v) {
       return set_float_field(sampling(c).temperature, v, 0.0, kHuge, false);
     },
     [](const DaemonConfig& c) -> ConfigValue { return double{sampling(c).temperature}; }},
    {"sampling", "top_k", "--top-k", "K", "default top-k; 0 = off (default 40)", ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(sampling(c).top_k, v, 0, kMaxInt32); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{sampling(c).top_k}; }},
    {"sampling", "top_p", "--top-p", "P", "default nucleus threshold in (0, 1]; 1 = off (default 0.95)",
     ConfigValueKind::kFloat,
     [](DaemonConfig& c, const ConfigValue& v) { return set_float_field(sampling(c).top_p, v, 0.0, 1.0, true); },
     [](const DaemonConfig& c) -> ConfigValue { return double{sampling(c).top_p}; }},
    {"sampling", "min_p", "--min-p", "P", "default min-p in [0, 1]; 0 = off (default 0.05)", ConfigValueKind::kFloat,
     [](DaemonConfig& c, const ConfigValue& v) { return set_float_field(sampling(c).min_p, v, 0.0, 1.0, false); },
     [](const DaemonConfig& c) -> ConfigValue { return double{sampling(c).min_p}; }},
    {"sampling", "repetition_penalty", "--repetition-penalty", "R",
     "default repetition penalty > 0; 1 = off (default 1)", ConfigValueKind::kFloat,
     [](DaemonConfig& c, const ConfigValue& v) {
       return set_float_field(sampling(c).repetition_penalty, v, 0.0, kHuge, true);
     },
     [](const DaemonConfig& c) -> ConfigValue { return double{sampling(c).repetition_penalty}; }},
    {"sampling", "presence_penalty", "--presence-penalty", "X", "default presence penalty; 0 = off (default 0)",
     ConfigValueKind::kFloat,
     [](DaemonConfig& c, const ConfigValue& v) {
       return set_float_field(sampling(c).presence_penalty, v, -kHuge, kHuge, false);
     },
     [](const DaemonConfig& c) -> ConfigValue { return double{sampling(c).presence_penalty}; }},
    {"sampling", "frequency_penalty", "--frequency-penalty", "X", "default frequency penalty; 0 = off (default 0)",
     ConfigValueKind::kFloat,
     [](DaemonConfig& c, const ConfigValue& v) {
       return set_float_field(sampling(c).frequency_penalty, v, -kHuge, kHuge, false);
     },
     [](const DaemonConfig& c) -> ConfigValue { return double{sampling(c).frequency_penalty}; }},
    {"sampling", "penalty_last_n", "--penalty-last-n", "N",
     "tokens the penalties look back over; -1 = whole history, 0 = off (default 64)", ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) { return set_int_field(sampling(c).penalty_last_n, v, -1, kMaxInt32); },
     [](const DaemonConfig& c) -> ConfigValue { return int64_t{sampling(c).penalty_last_n}; }},
    {"sampling", "seed", "--seed", "SEED", "default sampling seed; 0 = a random seed per session (default 0)",
     ConfigValueKind::kInteger,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(int64_t seed, as_integer(v, 0, std::numeric_limits<int64_t>::max()));
       sampling(c).seed = static_cast<uint64_t>(seed);
       c.limits.random_seed_by_default = seed == 0;
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue {
       return c.limits.random_seed_by_default ? int64_t{0} : static_cast<int64_t>(sampling(c).seed);
     }},
    // [log]
    {"log", "level", "--log-level", "LEVEL", "trace, debug, info, warn, error, critical or off (default info)",
     ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(c.log.level, as_one_of(v, {"trace", "debug", "info", "warn", "error", "critical", "off"}));
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.log.level; }},
    {"log", "format", "--log-format", "FORMAT",
     "text (timestamped lines), journal (syslog priorities for journald) or auto: journal when stderr is the "
     "journal (default auto)",
     ConfigValueKind::kString,
     [](DaemonConfig& c, const ConfigValue& v) -> Status {
       KESTREL_TRY_ASSIGN(c.log.format, as_one_of(v, {"auto", "text", "journal"}));
       return ok_status();
     },
     [](const DaemonConfig& c) -> ConfigValue { return c.log.format; }},
};

const ConfigKey* find_key(std::string_view section, std::string_view name) {
  for (const ConfigKey& k : kKeys) {
    if (k.section == section && k.name == name) return &k;
  }
  return nullptr;
}

bool is_section(std::string_view name) {
  for (const ConfigKey& k : kKeys) {
    if (!k.section.empty() && k.section == name) return true;
  }
  return false;
}

std::string section_list() {
  std::string out;
  std::string_view last;
  for (const ConfigKey& k : kKeys) {
    if (k.section.empty() || k.section == last) continue;
    last = k.section;
    out += (out.empty() ? "[" : ", [") + std::string(k.section) + "]";
  }
  return out;
}

std::string keys_of(std::string_view section) {
  std::string out;
  for (const ConfigKey& k : kKeys) {
    if (k.section == section) out += (out.empty() ? "" : ", ") + std::string(k.name);
  }
  return out;
}

std::string where(const std::string& source, const toml::source_region& region) {
  return source + ":" + std::to_string(region.begin.line);
}

Expected<ConfigValue> toml_value(const toml::node& node) {
  if (const auto* i = node.as_integer()) return ConfigValue{i->get()};
  if (const auto* f = node.as_floating_point()) return ConfigValue{f->get()};
  if (const auto* s = node.as_string()) return ConfigValue{s->get()};
  if (const auto* b = node.as_boolean()) return ConfigValue{b->get()};
  return bad(std::string("must be a single value, got a ") + (node.is_table()   ? "table"
                                                              : node.is_array() ? "array"
                                                                                : "date or time"));
}

Status apply_node(DaemonConfig& config, const ConfigKey& key, const toml::node& node, const std::string& source) {
  const std::string at = where(source, node.source());
  auto value = toml_value(node);
  Status st = value ? key.set(config, *value) : Status(value.error());
  if (!st) {
    const std::string label =
        key.section.empty() ? std::string(key.name) : "[" + std::string(key.section) + "] " + std::string(key.name);
    return make_error(st.error().code, at + ": " + label + ": " + st.error().message);
  }
  config.origins[key.full_name()] = at;
  return ok_status();
}

void append_toml_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += '"';
}

void append_value(std::string& out, const ConfigValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) {
    out += std::to_string(*i);
  } else if (const auto* d = std::get_if<double>(&v)) {
    // Shortest text that reads back to the same float (every float field is a float).
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(*d));
    std::string text(buf, r.ptr);
    if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // TOML needs a float to look like one
    out += text;
  } else if (const auto* b = std::get_if<bool>(&v)) {
    out += *b ? "true" : "false";
  } else {
    append_toml_string(out, std::get<std::string>(v));
  }
}

}  // namespace

ServiceLimits DaemonConfig::default_limits() {
  ServiceLimits limits;
  limits.default_sampling = kestrel_default_sampling();
  limits.random_seed_by_default = true;
  return limits;
}

std::string ConfigKey::full_name() const {
  return section.empty() ? std::string(name) : std::string(section) + "." + std::string(name);
}

const std::vector<ConfigKey>& config_keys() { return kKeys; }

Status apply_toml(DaemonConfig& config, std::string_view toml_text, const std::string& source_name) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    return bad(where(source_name, e.source()) + ": " + std::string(e.description()));
  }
  for (const auto& [key, node] : root) {
    const std::string name(key.str());
    if (node.is_table()) {
      if (!is_section(name)) {
        return bad(where(source_name, key.source()) + ": unknown section [" + name + "] (known: " + section_list() +
                   ")");
      }
      for (const auto& [sub_key, sub_node] : *node.as_table()) {
        const ConfigKey* k = find_key(name, sub_key.str());
        if (k == nullptr) {
          return bad(where(source_name, sub_key.source()) + ": unknown key '" + std::string(sub_key.str()) + "' in [" +
                     name + "] (known: " + keys_of(name) + ")");
        }
        KESTREL_TRY(apply_node(config, *k, sub_node, source_name));
      }
      continue;
    }
    const ConfigKey* k = find_key("", name);
    if (k == nullptr) {
      const std::string hint = is_section(name) ? "; [" + name + "] is a section" : "";
      return bad(where(source_name, key.source()) + ": unknown key '" + name +
                 "' (known at the top level: " + keys_of("") + ")" + hint);
    }
    KESTREL_TRY(apply_node(config, *k, node, source_name));
  }
  return ok_status();
}

Status apply_toml_file(DaemonConfig& config, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    return make_error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                      "config file " + path + ": " + std::generic_category().message(err));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return make_error(ErrorCode::kIo, "config file " + path + ": read failed");
  config.config_file = path;
  return apply_toml(config, text.str(), path);
}

Status apply_flag(DaemonConfig& config, const ConfigKey& key, const std::string& text) {
  ConfigValue value = text;
  if (key.kind == ConfigValueKind::kInteger) {
    int64_t i = 0;
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), i);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
      return bad(std::string(key.flag) + ": expected an integer, got '" + text + "'");
    }
    value = i;
  } else if (key.kind == ConfigValueKind::kFloat) {
    double d = 0.0;
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
      return bad(std::string(key.flag) + ": expected a number, got '" + text + "'");
    }
    value = d;
  }
  Status st = key.set(config, value);
  if (!st) return make_error(st.error().code, std::string(key.flag) + ": " + st.error().message);
  config.origins[key.full_name()] = std::string(key.flag);
  return ok_status();
}

void resolve_defaults(DaemonConfig& config, const Environment& env) {
  if (config.listen.socket.empty()) config.listen.socket = default_socket_path(env);
  if (!config.listen.shm_socket_set) config.listen.shm_socket = default_shm_socket_path(config.listen.socket);
  if (config.cache_dir.empty()) config.cache_dir = default_cache_dir(env);
}

Status validate(const DaemonConfig& config) {
  auto origin = [&](const char* key) {
    auto it = config.origins.find(key);
    return std::string(it != config.origins.end() ? it->second : "default");
  };
  const ServiceLimits& l = config.limits;
  if (l.default_n_ctx > l.max_session_ctx) {
    return bad(origin("limits.default_n_ctx") + ": [limits] default_n_ctx (" + std::to_string(l.default_n_ctx) +
               ") is larger than max_session_ctx (" + std::to_string(l.max_session_ctx) + ", " +
               origin("limits.max_session_ctx") + ")");
  }
  if (l.default_idle_ttl > l.max_idle_ttl) {
    return bad(origin("limits.idle_ttl_s") + ": [limits] idle_ttl_s (" + std::to_string(l.default_idle_ttl.count()) +
               ") is larger than max_idle_ttl_s (" + std::to_string(l.max_idle_ttl.count()) + ", " +
               origin("limits.max_idle_ttl_s") + ")");
  }
  if (!config.listen.shm_socket.empty() && config.listen.shm_socket == config.listen.socket) {
    return bad(origin("listen.shm_socket") + ": [listen] shm_socket is the same path as socket (" +
               config.listen.socket + ")");
  }
  if (!config.http.api_key.empty() && !config.http.api_key_file.empty()) {
    return bad(origin("http.api_key_file") + ": [http] api_key_file and api_key (" + origin("http.api_key") +
               ") are both set; give the key one way");
  }
  if (Status st = l.default_sampling.validate(); !st) {
    return bad("[sampling] " + st.error().message);
  }
  return ok_status();
}

std::string to_toml(const DaemonConfig& config) {
  std::string out = "# kestreld effective configuration";
  if (!config.config_file.empty()) out += " (file: " + config.config_file + ")";
  out += "\n";
  std::string_view section = "<none>";
  for (const ConfigKey& k : kKeys) {
    if (k.section != section) {
      section = k.section;
      if (!section.empty()) out += "\n[" + std::string(section) + "]\n";
    }
    std::string line = std::string(k.name) + " = ";
    append_value(line, k.get(config));
    auto it = config.origins.find(k.full_name());
    const std::string from = it != config.origins.end() ? it->second : "default";
    if (line.size() < 40) line.resize(40, ' ');
    out += line + "  # " + from + "\n";
  }
  return out;
}

}  // namespace kestrel::daemon::ops
