// DaemonConfig: everything kestreld can be told, read from a TOML file and then from command-line flags
// (flags > file > defaults). systemd/kestreld.toml.example documents every key; docs/operations.md is the reference.
//
//   model = ""                       # GGUF path; empty = the default model (tools/mkmodel/default_model.h)
//   engine = "auto"                  # auto, cuda, cpu, reference
//   stop_timeout_s = 30              # drain time on SIGTERM
//   cache_dir = ""                   # empty = default_cache_dir() (default_paths.h)
//   [listen]  socket, socket_mode, shm_socket, tcp, http
//   [http]    api_key, api_key_file, served_model_name, max_body_bytes, max_concurrent_requests, max_connections
//   [cuda]    slots, device, gpu_memory, n_cpu_moe, override_tensor, prompt_digits, expert_upload,
//             routing_calibration
//   [cpu]     threads
//   [limits]  max_sessions, max_queued_steps, default_n_ctx, max_session_ctx, max_batch_tokens, idle_ttl_s,
//             max_idle_ttl_s                                  (daemon::ServiceLimits)
//   [sampling] temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty,
//             penalty_last_n, seed                            (ServiceLimits::default_sampling)
//   [log]     level, format
//
// Every error names where the bad value came from: "kestreld.toml:12: [limits] max_sessions: must be an integer
// from 1 to 1000000, got 0", or "--max-sessions: ..." for a flag. Unknown keys and sections are errors too.
//
// Plain values and pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/base/expected.h"
#include "daemon/engine/service.h"
#include "daemon/ops/default_paths.h"
#include "gpu/kernels/tuning.h"

namespace kestrel::daemon::ops {

struct ListenConfig {
  std::string socket;  // gRPC over this Unix socket; empty until resolve_defaults(): default_socket_path()
  uint32_t socket_mode = 0660;
  std::string shm_socket;       // shm fast path control socket; empty = disabled
  bool shm_socket_set = false;  // a file or flag named shm_socket; otherwise resolve_defaults() puts it by `socket`
  std::string tcp;              // "host:port" for gRPC over TCP; empty = no TCP listener
  std::string http;             // "host:port" for the OpenAI-compatible HTTP API; empty = off
};

// [http]: the OpenAI-compatible HTTP server (daemon/http/http_server.h), when [listen] http is set.
struct HttpConfig {
  std::string api_key;            // "" = none; else /v1/ routes need "Authorization: Bearer <key>"
  std::string api_key_file;       // or the key read from this file at start (first line); not both
  std::string served_model_name;  // the model id of /v1/models; "" = the model file's name without .gguf
  uint64_t max_body_bytes = 4 << 20;
  uint32_t max_concurrent_requests = 64;
  uint32_t max_connections = 512;
};

// [cuda]: the CUDA engine's sizes and placement (engine = cuda, or auto on a machine with a device).
struct CudaConfig {
  uint32_t slots = 16;          // sessions resident on the device at once (GDN state each; KV from the shared pool)
  uint64_t kv_cache_bytes = 0;  // the KV page pool all sessions share; 0 = automatic (gpu/engine/cuda_engine.h)
  uint32_t device = 0;          // CUDA device ordinal
  // Placement (core/engine/placement_planner.h, hybrid/placed_cuda_engine.h): the weights' GPU budget (BYTES or
  // auto), the MoE layers whose routed experts stay on the host, and per-tensor overrides "REGEX=cpu|gpu[;...]".
  // The host experts run on [cpu] threads workers.
  std::string gpu_memory = "auto";
  uint32_t n_cpu_moe = 0;
  std::string override_tensor;
  // Activation digits of the prompt passes' quantized GEMMs (gpu/kernels/gemm_imma.h): 4 (decode's arithmetic) or 2
  // (half the tensor-core work; activations rounded to 13 bits below their 256-element group's bound).
  uint32_t prompt_digits = 4;
  // Prompt passes of at least this many tokens copy the host-resident routed experts to the GPU, layer by layer, and
  // run them there (gpu/engine/expert_upload.h); 0: the host computes them; -1 (gpu::kExpertUploadAuto): from where
  // the placed engine's cost model says the upload pays.
  int32_t expert_upload_min_tokens = gpu::GpuTuning{}.expert_upload_min_tokens;
  // The side read's share of the host experts in percent (gpu/kernels/tuning.h expert_side_read); -1: automatic.
  int32_t side_read_percent = -1;
  // Tokens of the routing calibration prompt for a budget that splits the routed experts (hybrid/placed_cuda_engine.h;
  // counts kept in cache_dir); 0: none.
  int32_t routing_calibration = 256;
};

// [cpu]: the CPU engine's workers (engine = cpu, or auto on a machine without a usable CUDA device).
struct CpuConfig {
  uint32_t threads = 0;  // compute threads, the engine loop's included; 0 = one per physical core
};

struct LogConfig {
  std::string level = "info";   // trace, debug, info, warn, error, critical, off
  std::string format = "auto";  // text (with timestamps), journal (syslog priority prefixes), auto (journal when
                                // stderr is connected to the journal, text otherwise)
};

struct DaemonConfig {
  std::string config_file;      // the file read ("" = none); not a key
  std::string model;            // empty = the embedded default model
  std::string engine = "auto";  // auto (cuda when a usable device exists, else cpu), cuda, cpu, reference
  CudaConfig cuda;
  CpuConfig cpu;
  ListenConfig listen;
  HttpConfig http;
  ServiceLimits limits = default_limits();  // [limits] and [sampling]
  LogConfig log;
  uint32_t stop_timeout_s = 30;
  std::string cache_dir;  // empty until resolve_defaults(): default_cache_dir()
  // Where each key's value came from ("file.toml:12", "--max-sessions"); keys never set are absent. Key names are
  // "section.name" ("limits.max_sessions") or "name" at the top level.
  std::map<std::string, std::string> origins;

  // ServiceLimits with Kestrel's sampling defaults (kestrel_default_sampling(): temperature 0.8, top_k 40, top_p
  // 0.95, min_p 0.05) and a random seed per session; the rest as in service.h.
  static ServiceLimits default_limits();
};

// One configuration key: where it lives in the file, its flag, its help line.
using ConfigValue = std::variant<int64_t, double, std::string, bool>;
enum class ConfigValueKind { kInteger, kFloat, kString };

struct ConfigKey {
  std::string_view section;  // "" for top-level keys
  std::string_view name;
  std::string_view flag;        // "--max-sessions"
  std::string_view value_name;  // "N", "PATH", ...
  std::string_view help;
  ConfigValueKind kind;
  // Sets the field from a value (a TOML value or a converted flag). The error says what is wrong with the value,
  // without the location (the caller adds it).
  Status (*set)(DaemonConfig&, const ConfigValue&);
  ConfigValue (*get)(const DaemonConfig&);

  std::string full_name() const;  // "limits.max_sessions"
};

// Every key, in file order (top-level keys first, then [listen], [http], [cuda], [cpu], [limits], [sampling], [log]).
const std::vector<ConfigKey>& config_keys();

// Applies the keys of a TOML document on top of `config`; `source_name` (a path) prefixes every message with its
// line. The first error wins: a TOML syntax error, an unknown section or key, a value of the wrong type or range.
Status apply_toml(DaemonConfig& config, std::string_view toml_text, const std::string& source_name);
// Reads `path` (kIo / kNotFound naming it) and applies it; sets config.config_file.
Status apply_toml_file(DaemonConfig& config, const std::string& path);
// Applies one flag's text to `key` (converted by key.kind); errors start with the flag name.
Status apply_flag(DaemonConfig& config, const ConfigKey& key, const std::string& text);

// Fills what was left to the environment: the socket path, the shm socket beside it (unless shm_socket was set),
// the cache folder.
void resolve_defaults(DaemonConfig& config, const Environment& env);
// Checks across keys (default_n_ctx <= max_session_ctx, idle_ttl_s <= max_idle_ttl_s, the sampling defaults pass
// SamplingParams::validate()); errors name the key and where it was set.
Status validate(const DaemonConfig& config);

// The effective configuration as a TOML document that apply_toml() reads back to the same values; each line says
// where its value came from.
std::string to_toml(const DaemonConfig& config);

}  // namespace kestrel::daemon::ops
