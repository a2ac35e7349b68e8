// DaemonConfig: defaults, TOML file, flags and their precedence; every bad value names its key and its file line
// or flag; --print-config reads back to the same configuration; the example file documents every key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/ops/command_line.h"
#include "daemon/ops/config.h"
#include "tests/daemon/scratch_dir.h"

namespace kestrel::daemon::ops {
namespace {

namespace fs = std::filesystem;

Environment test_env() {
  Environment env;
  env.uid = 1000;
  env.home = "/home/k";
  env.xdg_runtime_dir = "/run/user/1000";
  return env;
}

struct CliRun {
  Expected<CliResult> result;
  std::string out, err;
};

CliRun run_cli(std::vector<std::string> args, const Environment& env = test_env()) {
  args.insert(args.begin(), "kestreld");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  auto r = parse_command_line(static_cast<int>(argv.size()), argv.data(), env, out, err);
  return CliRun{std::move(r), out.str(), err.str()};
}

Status apply_text(DaemonConfig& c, const std::string& text) { return apply_toml(c, text, "test.toml"); }

std::string error_of(const Status& st) { return st ? std::string("<ok>") : st.error().message; }

TEST(DaemonConfig, DefaultsWithoutFileOrFlags) {
  CliRun r = run_cli({});
  ASSERT_TRUE(r.result) << r.result.error().to_string();
  const DaemonConfig& c = r.result->config;
  EXPECT_EQ(r.result->action, CliAction::kRun);
  EXPECT_EQ(c.model, "");
  EXPECT_EQ(c.engine, "auto");
  EXPECT_EQ(c.cuda.slots, 16u);
  EXPECT_EQ(c.cuda.kv_cache_bytes, 0u);
  EXPECT_EQ(c.cuda.device, 0u);
  EXPECT_EQ(c.listen.socket, "/run/user/1000/kestrel/kestreld.sock");
  EXPECT_EQ(c.listen.shm_socket, "/run/user/1000/kestrel/kestreld-shm.sock");
  EXPECT_EQ(c.listen.socket_mode, 0660u);
  EXPECT_EQ(c.listen.tcp, "");
  EXPECT_EQ(c.stop_timeout_s, 30u);
  EXPECT_EQ(c.cache_dir, "/home/k/.cache/kestrel");
  EXPECT_EQ(c.limits.max_sessions, ServiceLimits{}.max_sessions);
  EXPECT_EQ(c.limits.default_n_ctx, ServiceLimits{}.default_n_ctx);
  EXPECT_FLOAT_EQ(c.limits.default_sampling.temperature, 0.8f);
  EXPECT_EQ(c.limits.default_sampling.top_k, 40);
  EXPECT_TRUE(c.limits.random_seed_by_default);
  EXPECT_EQ(c.log.level, "info");
  EXPECT_TRUE(c.origins.empty());
}

TEST(DaemonConfig, FlagBeatsFileBeatsDefault) {
  ::kestrel::test::ScratchDir dir("kestrel-ops");
  const std::string file = dir.write("k.toml",
                                     "model = \"/models/from-file.gguf\"\n"
                                     "[limits]\n"
                                     "max_sessions = 8\n"
                                     "max_queued_steps = 99\n"
                                     "[sampling]\n"
                                     "temperature = 0.5\n");
  CliRun r = run_cli({"--config", file, "--max-sessions", "12", "--temperature", "0"});
  ASSERT_TRUE(r.result) << r.result.error().to_string();
  const DaemonConfig& c = r.result->config;
  EXPECT_EQ(c.config_file, file);
  EXPECT_EQ(c.model, "/models/from-file.gguf");                  // file
  EXPECT_EQ(c.limits.max_sessions, 12u);                         // flag over file
  EXPECT_EQ(c.limits.max_queued_steps, 99u);                     // file
  EXPECT_FLOAT_EQ(c.limits.default_sampling.temperature, 0.0f);  // flag over file
  EXPECT_EQ(c.limits.default_n_ctx, 4096);                       // default
  EXPECT_EQ(c.origins.at("limits.max_sessions"), "--max-sessions");
  EXPECT_EQ(c.origins.at("limits.max_queued_steps"), file + ":4");
  EXPECT_EQ(c.origins.count("limits.default_n_ctx"), 0u);
}

TEST(DaemonConfig, ShmSocketFollowsSocketUnlessSetAndEmptyDisablesIt) {
  CliRun moved = run_cli({"--socket", "/srv/k/d.sock"});
  ASSERT_TRUE(moved.result);
  ASSERT_EQ(moved.result->action, CliAction::kRun);
  EXPECT_EQ(moved.result->config.listen.shm_socket, "/srv/k/kestreld-shm.sock");

  CliRun off = run_cli({"--socket", "/srv/k/d.sock", "--shm-socket=", "--check-config"});
  ASSERT_TRUE(off.result) << off.result.error().to_string();
  EXPECT_EQ(off.result->action, CliAction::kCheckConfig) << off.err;
  EXPECT_EQ(off.result->config.origins.count("listen.shm_socket"), 1u);
  EXPECT_EQ(off.result->config.listen.shm_socket, "");

  DaemonConfig c;
  ASSERT_TRUE(apply_text(c, "[listen]\nshm_socket = \"/x/shm.sock\"\n"));
  resolve_defaults(c, test_env());
  EXPECT_EQ(c.listen.shm_socket, "/x/shm.sock");
  EXPECT_EQ(c.listen.socket, "/run/user/1000/kestrel/kestreld.sock");
}

TEST(DaemonConfig, SeedZeroMeansRandomPerSession) {
  DaemonConfig c;
  ASSERT_TRUE(apply_text(c, "[sampling]\nseed = 7\n"));
  EXPECT_FALSE(c.limits.random_seed_by_default);
  EXPECT_EQ(c.limits.default_sampling.seed, 7u);
  ASSERT_TRUE(apply_text(c, "[sampling]\nseed = 0\n"));
  EXPECT_TRUE(c.limits.random_seed_by_default);
}

TEST(DaemonConfig, SocketModeAsOctalIntegerOrString) {
  DaemonConfig c;
  ASSERT_TRUE(apply_text(c, "[listen]\nsocket_mode = 0o600\n"));
  EXPECT_EQ(c.listen.socket_mode, 0600u);
  ASSERT_TRUE(apply_text(c, "[listen]\nsocket_mode = \"0666\"\n"));
  EXPECT_EQ(c.listen.socket_mode, 0666u);
}

// Every key gets a bad value on line 3 of a file; the error names the file, the line and the key.
TEST(DaemonConfig, EveryBadValueNamesKeyAndLine) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "model = 3"},
      {"", "engine = \"turbo\""},
      {"", "stop_timeout_s = -1"},
      {"", "cache_dir = false"},
      {"listen", "socket = \"relative.sock\""},
      {"listen", "socket_mode = \"0999\""},
      {"listen", "shm_socket = \"/" + std::string(120, 'a') + "\""},
      {"listen", "tcp = \"localhost\""},
      {"listen", "http = \"127.0.0.1\""},
      {"http", "api_key = \"two words\""},
      {"http", "api_key_file = \"key.txt\""},
      {"http", "served_model_name = 7"},
      {"http", "max_body_bytes = 10"},
      {"http", "max_concurrent_requests = 0"},
      {"http", "max_connections = \"all\""},
      {"cuda", "slots = 0"},
      {"cuda", "kv_cache_bytes = -1"},
      {"cuda", "device = -1"},
      {"cuda", "gpu_memory = \"twelve\""},
      {"cuda", "n_cpu_moe = -1"},
      {"cuda", "override_tensor = \"blk=tpu\""},
      {"cuda", "prompt_digits = 3"},
      {"cuda", "prompt_digits = 8"},
      {"cuda", "expert_upload = -2"},
      {"cuda", "side_read = 101"},
      {"cuda", "routing_calibration = -1"},
      {"cpu", "threads = -1"},
      {"limits", "max_sessions = 0"},
      {"limits", "max_queued_steps = \"many\""},
      {"limits", "default_n_ctx = -5"},
      {"limits", "max_session_ctx = 1.5"},
      {"limits", "max_batch_tokens = 0"},
      {"limits", "idle_ttl_s = 0"},
      {"limits", "max_idle_ttl_s = -3"},
      {"sampling", "temperature = -0.1"},
      {"sampling", "top_k = -1"},
      {"sampling", "top_p = 0.0"},
      {"sampling", "min_p = 1.5"},
      {"sampling", "repetition_penalty = 0"},
      {"sampling", "presence_penalty = nan"},
      {"sampling", "frequency_penalty = inf"},
      {"sampling", "penalty_last_n = -2"},
      {"sampling", "seed = -1"},
      {"log", "level = \"loud\""},
      {"log", "format = \"xml\""},
  };
  // Every key of the table is exercised.
  std::vector<std::string> covered;
  for (const auto& [section, line] : bad) covered.push_back(section + "." + line.substr(0, line.find(' ')));
  for (const ConfigKey& k : config_keys()) {
    const std::string name = std::string(k.section) + "." + std::string(k.name);
    EXPECT_NE(std::find(covered.begin(), covered.end(), name), covered.end()) << name << " has no bad-value case";
  }
  for (const auto& [section, line] : bad) {
    std::string text = "# comment\n";
    text += section.empty() ? "\n" : "[" + section + "]\n";
    text += line + "\n";
    DaemonConfig c;
    const std::string msg = error_of(apply_text(c, text));
    const std::string key = line.substr(0, line.find(' '));
    EXPECT_NE(msg.find("test.toml:3: "), std::string::npos) << line << " -> " << msg;
    EXPECT_NE(msg.find(key), std::string::npos) << line << " -> " << msg;
    if (!section.empty()) {
      EXPECT_NE(msg.find("[" + section + "]"), std::string::npos) << msg;
    }
  }
}

TEST(DaemonConfig, BadFlagValuesNameTheFlag) {
  CliRun r = run_cli({"--max-sessions", "lots"});
  ASSERT_FALSE(r.result);
  EXPECT_NE(r.result.error().message.find("--max-sessions"), std::string::npos) << r.result.error().message;
  CliRun t = run_cli({"--top-p", "2"});
  ASSERT_FALSE(t.result);
  EXPECT_NE(t.result.error().message.find("--top-p: must be"), std::string::npos) << t.result.error().message;
  CliRun tcp = run_cli({"--tcp", "host:99999"});
  ASSERT_FALSE(tcp.result);
  EXPECT_NE(tcp.result.error().message.find("--tcp"), std::string::npos);
}

TEST(DaemonConfig, UnknownKeysAndSectionsAreErrorsWithLines) {
  DaemonConfig c;
  EXPECT_NE(error_of(apply_text(c, "model = \"\"\n\n[limits]\nmax_session = 3\n"))
                .find("test.toml:4: unknown key 'max_session' in [limits]"),
            std::string::npos);
  EXPECT_NE(error_of(apply_text(c, "[limit]\nmax_sessions = 3\n")).find("test.toml:1: unknown section [limit]"),
            std::string::npos);
  EXPECT_NE(error_of(apply_text(c, "\nmodle = \"x\"\n")).find("test.toml:2: unknown key 'modle'"), std::string::npos);
  EXPECT_NE(error_of(apply_text(c, "[listen]\nsocket = [\"/a\"]\n")).find("test.toml:2: [listen] socket: must be"),
            std::string::npos);
}

TEST(DaemonConfig, TomlSyntaxErrorNamesLine) {
  DaemonConfig c;
  const std::string msg = error_of(apply_text(c, "model = \"a\"\nengine = \n"));
  EXPECT_EQ(msg.rfind("test.toml:2: ", 0), 0u) << msg;
}

TEST(DaemonConfig, MissingFileIsAnError) {
  CliRun r = run_cli({"--config", "/nonexistent/kestreld.toml"});
  ASSERT_FALSE(r.result);
  EXPECT_EQ(r.result.error().code, ErrorCode::kNotFound);
  EXPECT_NE(r.result.error().message.find("/nonexistent/kestreld.toml"), std::string::npos);
}

TEST(DaemonConfig, CrossKeyChecksNameWhereValuesCameFrom) {
  ::kestrel::test::ScratchDir dir("kestrel-ops");
  const std::string file = dir.write("k.toml", "[limits]\ndefault_n_ctx = 9000\n");
  CliRun r = run_cli({"--config", file, "--max-session-ctx", "8192"});
  ASSERT_FALSE(r.result);
  const std::string msg = r.result.error().message;
  EXPECT_NE(msg.find(file + ":2: [limits] default_n_ctx (9000)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--max-session-ctx"), std::string::npos) << msg;

  CliRun ttl = run_cli({"--idle-ttl", "100", "--max-idle-ttl", "50"});
  ASSERT_FALSE(ttl.result);
  EXPECT_NE(ttl.result.error().message.find("--idle-ttl: [limits] idle_ttl_s"), std::string::npos);

  CliRun same = run_cli({"--socket", "/a/b.sock", "--shm-socket", "/a/b.sock"});
  ASSERT_FALSE(same.result);
  EXPECT_NE(same.result.error().message.find("--shm-socket"), std::string::npos);

  CliRun keys = run_cli({"--http-api-key", "k1", "--http-api-key-file", "/etc/kestrel/key"});
  ASSERT_FALSE(keys.result);
  EXPECT_NE(keys.result.error().message.find("--http-api-key-file: [http] api_key_file and api_key (--http-api-key)"),
            std::string::npos)
      << keys.result.error().message;
}

TEST(DaemonConfig, PrintConfigReadsBackToTheSameValues) {
  CliRun r = run_cli({"--model", "/m/x \"q\".gguf", "--temperature", "0.7", "--seed", "99", "--tcp", "[::1]:7777",
                      "--socket-mode", "0600", "--log-level", "debug", "--http", "127.0.0.1:8080", "--http-api-key",
                      "s3cret", "--http-max-concurrent", "3", "--print-config"});
  ASSERT_TRUE(r.result) << r.result.error().to_string();
  EXPECT_EQ(r.result->action, CliAction::kPrintConfig);
  const DaemonConfig& a = r.result->config;
  const std::string text = to_toml(a);
  EXPECT_NE(text.find("# --temperature"), std::string::npos) << text;
  DaemonConfig b;
  ASSERT_TRUE(apply_text(b, text)) << text;
  for (const ConfigKey& k : config_keys()) {
    EXPECT_EQ(k.get(a), k.get(b)) << k.full_name() << "\n" << text;
  }
}

TEST(DaemonConfig, HelpDocumentsEveryFlag) {
  CliRun r = run_cli({"--help"});
  ASSERT_TRUE(r.result);
  EXPECT_EQ(r.result->action, CliAction::kExit);
  EXPECT_EQ(r.result->exit_code, 0);
  for (const ConfigKey& k : config_keys()) {
    EXPECT_NE(r.out.find(std::string(k.flag)), std::string::npos) << k.flag;
    EXPECT_NE(r.out.find("[" + k.full_name() + "]"), std::string::npos) << k.full_name();
  }
  for (const char* f : {"--config", "--print-config", "--check-config", "--version"}) {
    EXPECT_NE(r.out.find(f), std::string::npos) << f;
  }
}

TEST(DaemonConfig, UnknownFlagIsAUsageError) {
  CliRun r = run_cli({"--no-such-flag"});
  ASSERT_TRUE(r.result);
  EXPECT_EQ(r.result->action, CliAction::kExit);
  EXPECT_EQ(r.result->exit_code, 2);
  EXPECT_NE(r.err.find("--no-such-flag"), std::string::npos) << r.err;
}

TEST(DaemonConfig, CheckConfigAction) {
  CliRun r = run_cli({"--check-config"});
  ASSERT_TRUE(r.result);
  EXPECT_EQ(r.result->action, CliAction::kCheckConfig);
}

// systemd/kestreld.toml.example lists every key, commented out at its default: uncommented, it is a valid file
// that changes nothing (shm_socket aside, whose default depends on socket).
TEST(DaemonConfig, ExampleFileDocumentsEveryKeyAtItsDefault) {
  const fs::path example = fs::path(KESTREL_TEST_DATA_DIR) / ".." / ".." / "systemd" / "kestreld.toml.example";
  std::ifstream in(example);
  ASSERT_TRUE(in) << example;
  std::string uncommented, line;
  const std::regex commented_key(R"(^#\s*([a-z_]+\s*=.*)$)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, commented_key)) {
      uncommented += m[1].str() + "\n";
    } else if (!line.empty() && line[0] == '[') {
      uncommented += line + "\n";
    }
  }
  DaemonConfig from_example;
  ASSERT_TRUE(apply_toml(from_example, uncommented, example.string())) << uncommented;
  DaemonConfig defaults;
  for (const ConfigKey& k : config_keys()) {
    EXPECT_NE(from_example.origins.count(k.full_name()), 0u) << k.full_name() << " is not in the example";
    if (k.full_name() == "listen.shm_socket") continue;
    EXPECT_EQ(k.get(from_example), k.get(defaults)) << k.full_name() << " differs from the default";
  }
}

TEST(DefaultPaths, SocketFromEnvironment) {
  Environment env;
  env.uid = 1000;
  EXPECT_EQ(default_socket_path(env), "/tmp/kestrel-1000/kestreld.sock");
  env.xdg_runtime_dir = "/run/user/1000";
  EXPECT_EQ(default_socket_path(env), "/run/user/1000/kestrel/kestreld.sock");
  env.uid = 0;
  EXPECT_EQ(default_socket_path(env), "/run/kestrel/kestreld.sock");
  env.runtime_directory = "/run/kestrel:/run/other";
  EXPECT_EQ(default_socket_path(env), "/run/kestrel/kestreld.sock");
  env.runtime_directory = "/run/custom";
  EXPECT_EQ(default_socket_path(env), "/run/custom/kestreld.sock");
  EXPECT_EQ(default_shm_socket_path("/run/custom/kestreld.sock"), "/run/custom/kestreld-shm.sock");
}

TEST(DefaultPaths, CacheFromEnvironment) {
  Environment env;
  env.uid = 1000;
  EXPECT_EQ(default_cache_dir(env), "/tmp/kestrel-1000/cache");
  env.home = "/home/k";
  EXPECT_EQ(default_cache_dir(env), "/home/k/.cache/kestrel");
  env.xdg_cache_home = "/xdg/cache";
  EXPECT_EQ(default_cache_dir(env), "/xdg/cache/kestrel");
  env.cache_directory = "/var/cache/kestrel";
  EXPECT_EQ(default_cache_dir(env), "/var/cache/kestrel");
}

TEST(DefaultPaths, FromProcessReadsTheVariables) {
  ::setenv("RUNTIME_DIRECTORY", "/run/test-rt", 1);
  ::setenv("CACHE_DIRECTORY", "/var/cache/test", 1);
  const Environment env = Environment::from_process();
  ::unsetenv("RUNTIME_DIRECTORY");
  ::unsetenv("CACHE_DIRECTORY");
  EXPECT_EQ(env.runtime_directory, "/run/test-rt");
  EXPECT_EQ(env.cache_directory, "/var/cache/test");
  EXPECT_EQ(env.uid, static_cast<uint32_t>(::getuid()));
  CliRun r = run_cli({}, env);
  ASSERT_TRUE(r.result);
  EXPECT_EQ(r.result->config.listen.socket, "/run/test-rt/kestreld.sock");
  EXPECT_EQ(r.result->config.cache_dir, "/var/cache/test");
}

}  // namespace
}  // namespace kestrel::daemon::ops
