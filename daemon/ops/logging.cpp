// spdlog set-up for kestreld (logging.h).
#include "daemon/ops/logging.h"

#include <google/protobuf/stubs/logging.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace kestrel::daemon::ops {

namespace {

// "%*" in a pattern: the syslog priority of the message's level as "<N>" (sd-daemon(3)).
class SyslogPriorityFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm& /*tm_time*/, spdlog::memory_buf_t& dest) override {
    int priority = 6;  // LOG_INFO
    switch (msg.level) {
      case spdlog::level::trace:
      case spdlog::level::debug: priority = 7; break;
      case spdlog::level::info: priority = 6; break;
      case spdlog::level::warn: priority = 4; break;
      case spdlog::level::err: priority = 3; break;
      case spdlog::level::critical: priority = 2; break;
      default: break;
    }
    const char text[] = {'<', static_cast<char>('0' + priority), '>'};
    dest.append(text, text + sizeof text);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<SyslogPriorityFlag>(); }
};

// Protobuf's own log lines, through kestreld's logger. Parsing a message whose string field is not UTF-8 makes
// protobuf log an ERROR before the parse fails; a client can send such messages at will and kestreld answers each
// with INVALID_ARGUMENT, so those lines are debug lines here instead of one unthrottled stderr line per request.
void protobuf_log(google::protobuf::LogLevel level, const char* filename, int line, const std::string& message) {
  spdlog::level::level_enum to = spdlog::level::debug;
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO: to = spdlog::level::debug; break;
    case google::protobuf::LOGLEVEL_WARNING: to = spdlog::level::warn; break;
    case google::protobuf::LOGLEVEL_ERROR:
      to = message.find("when parsing") != std::string::npos ? spdlog::level::debug : spdlog::level::err;
      break;
    case google::protobuf::LOGLEVEL_FATAL: to = spdlog::level::critical; break;
  }
  spdlog::log(to, "protobuf {}:{}: {}", filename, line, message);
}

}  // namespace

bool stderr_is_journal() {
  const char* stream = std::getenv("JOURNAL_STREAM");  // NOLINT(concurrency-mt-unsafe): start-up, one thread
  if (stream == nullptr) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(stream, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st {};
  if (::fstat(2, &st) != 0) return false;
  return static_cast<unsigned long long>(st.st_dev) == dev && static_cast<unsigned long long>(st.st_ino) == ino;
}

std::string resolve_log_format(const std::string& format) {
  if (format == "auto") return stderr_is_journal() ? "journal" : "text";
  return format;
}

Status setup_logging(const LogConfig& config) {
  const spdlog::level::level_enum level = spdlog::level::from_str(config.level);
  if (level == spdlog::level::off && config.level != "off") {
    return make_error(ErrorCode::kInvalidArgument, "[log] level: unknown level '" + config.level + "'");
  }
  const std::string format = resolve_log_format(config.format);
  if (format != "text" && format != "journal") {
    return make_error(ErrorCode::kInvalidArgument, "[log] format: unknown format '" + config.format + "'");
  }
  const bool journal = format == "journal";
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>(journal ? spdlog::color_mode::never
                                                                            : spdlog::color_mode::automatic);
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  if (journal) {
    formatter->add_flag<SyslogPriorityFlag>('*').set_pattern("%*%v");
  } else {
    formatter->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%-5l%$ %v");
  }
  sink->set_formatter(std::move(formatter));
  auto logger = std::make_shared<spdlog::logger>("kestreld", std::move(sink));
  logger->set_level(level);
  logger->flush_on(spdlog::level::trace);  // every line reaches the journal at once
  spdlog::set_default_logger(std::move(logger));
  google::protobuf::SetLogHandler(&protobuf_log);
  return ok_status();
}

}  // namespace kestrel::daemon::ops
