// The Prometheus text format (daemon/http/prometheus_text.h, metrics_page.h) read back by a parser of the
// exposition format 0.0.4 written here from its specification: comment lines, metric and label name grammar,
// escapes, numbers (+Inf, NaN), one TYPE per family before its samples, contiguous families, no duplicate series,
// cumulative histogram buckets ending at le="+Inf" equal to _count. Then the /metrics page itself, before and after
// the Service records requests.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/engine/service_metrics.h"
#include "daemon/http/metrics_page.h"
#include "daemon/http/prometheus_text.h"
#include "tests/daemon/server/fake_service.h"

namespace kestrel::daemon::http {
namespace {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0.0;
};

struct Family {
  std::string name, type, help;
  std::vector<Sample> samples;
};

struct Parsed {
  std::vector<Family> families;
  std::string error;  // "" = the text is valid

  const Family* find(const std::string& name) const {
    for (const Family& f : families) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }
  // The value of the sample `name` whose labels include `labels`.
  std::optional<double> value(const std::string& name, const std::map<std::string, std::string>& labels = {}) const {
    for (const Family& f : families) {
      for (const Sample& s : f.samples) {
        if (s.name != name) continue;
        bool match = true;
        for (const auto& [k, v] : labels) match = match && s.labels.count(k) && s.labels.at(k) == v;
        if (match) return s.value;
      }
    }
    return std::nullopt;
  }
};

bool parse_number(const std::string& text, double* out) {
  if (text == "+Inf" || text == "-Inf" || text == "NaN") {
    *out = text == "NaN" ? NAN : text[0] == '+' ? INFINITY : -INFINITY;
    return true;
  }
  static const std::regex number(R"([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)");
  if (!std::regex_match(text, number)) return false;
  *out = std::stod(text);
  return true;
}

std::string unescape(const std::string& text, bool quote, bool* ok) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\') {
      if (quote && text[i] == '"') *ok = false;
      out += text[i];
      continue;
    }
    if (++i == text.size()) {
      *ok = false;
      break;
    }
    if (text[i] == '\\') {
      out += '\\';
    } else if (text[i] == 'n') {
      out += '\n';
    } else if (text[i] == '"' && quote) {
      out += '"';
    } else {
      *ok = false;
    }
  }
  return out;
}

Parsed parse(const std::string& text) {
  Parsed p;
  auto fail = [&](const std::string& why, const std::string& line) {
    p.error = why + ": '" + line + "'";
    return p;
  };
  if (!text.empty() && text.back() != '\n') return fail("the text does not end with a newline", "");
  static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*))");
  static const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped))");
  static const std::regex sample(R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+))");
  static const std::regex label(R"(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)\"(,|$))");
  std::set<std::string> seen_families, seen_series;
  std::istringstream in(text);
  std::string line, pending_help, pending_help_name;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, help)) {
      bool ok = true;
      pending_help = unescape(m[2], false, &ok);
      if (!ok) return fail("bad escape in HELP", line);
      pending_help_name = m[1];
      continue;
    }
    if (std::regex_match(line, m, type)) {
      const std::string name = m[1];
      if (!seen_families.insert(name).second) return fail("a second TYPE (or a family split in two)", line);
      if (pending_help_name != name) return fail("TYPE without its HELP just before", line);
      p.families.push_back(Family{name, m[2], pending_help, {}});
      continue;
    }
    if (line.empty() || line[0] == '#') return fail("unexpected comment or empty line", line);
    if (!std::regex_match(line, m, sample)) return fail("not a sample", line);
    if (p.families.empty()) return fail("a sample before any TYPE", line);
    Family& f = p.families.back();
    Sample s;
    s.name = m[1];
    const std::string base = f.name;
    const bool belongs = f.type == "histogram"
                             ? (s.name == base + "_bucket" || s.name == base + "_sum" || s.name == base + "_count")
                             : s.name == base;
    if (!belongs) return fail("a sample outside its family " + base, line);
    std::string labels = m[3];
    while (!labels.empty()) {
      std::smatch lm;
      if (!std::regex_search(labels, lm, label) || lm.position(0) != 0) return fail("bad labels", line);
      bool ok = true;
      const std::string value = unescape(lm[2], true, &ok);
      if (!ok) return fail("bad escape in a label value", line);
      if (!s.labels.emplace(lm[1], value).second) return fail("a label twice", line);
      labels = lm.suffix();
    }
    if (!parse_number(m[4], &s.value)) return fail("bad value", line);
    std::string key = s.name;
    for (const auto& [k, v] : s.labels) key += "|" + k + "=" + v;
    if (!seen_series.insert(key).second) return fail("a duplicate series", line);
    f.samples.push_back(std::move(s));
  }
  // Histograms: per series, le ascending, counts cumulative, +Inf last and equal to _count.
  for (const Family& f : p.families) {
    if (f.type != "histogram") continue;
    std::map<std::string, std::vector<std::pair<double, double>>> buckets;
    std::map<std::string, double> counts;
    for (const Sample& s : f.samples) {
      std::string key;
      for (const auto& [k, v] : s.labels) {
        if (k != "le") key += k + "=" + v + ";";
      }
      if (s.name == f.name + "_bucket") {
        double le = 0.0;
        if (!s.labels.count("le") || !parse_number(s.labels.at("le"), &le)) return fail("a bucket without le", key);
        buckets[key].emplace_back(le, s.value);
      } else if (s.name == f.name + "_count") {
        counts[key] = s.value;
      }
    }
    for (const auto& [key, b] : buckets) {
      for (size_t i = 1; i < b.size(); ++i) {
        if (!(b[i].first > b[i - 1].first) || b[i].second < b[i - 1].second) return fail("buckets out of order", key);
      }
      if (b.empty() || !std::isinf(b.back().first)) return fail("no +Inf bucket", key);
      if (!counts.count(key) || counts[key] != b.back().second) return fail("+Inf bucket != _count", key);
    }
  }
  return p;
}

TEST(PrometheusText, ParserRefusesBrokenText) {
  EXPECT_NE(parse("x 1").error, "");                                       // no newline
  EXPECT_NE(parse("x 1\n").error, "");                                     // no TYPE
  EXPECT_NE(parse("# HELP x h\n# TYPE x gauge\nx{a=\"1} 2\n").error, "");  // unterminated label
  EXPECT_NE(parse("# HELP x h\n# TYPE x gauge\nx 1\nx 2\n").error, "");    // duplicate series
  EXPECT_NE(parse("# HELP x h\n# TYPE x gauge\ny 1\n").error, "");         // sample outside the family
  EXPECT_NE(parse("# HELP x h\n# TYPE x gauge\nx one\n").error, "");       // bad value
  EXPECT_EQ(parse("# HELP x h\n# TYPE x gauge\nx{a=\"\\\"\"} +Inf\n").error, "");
}

TEST(PrometheusText, WritesWhatAParserReadsBack) {
  PrometheusText p;
  p.family("kestrel:test_total", "counter", "Help with a \\ backslash\nand a newline");
  p.sample("kestrel:test_total", {{"transport", "http"}, {"odd", "a \"quoted\" \\ value\nnext"}}, 3);
  p.sample("kestrel:test_total", {{"transport", "grpc"}, {"odd", ""}}, 0.125);
  p.family("kestrel:ratio", "gauge", "A gauge");
  p.sample("kestrel:ratio", {}, std::nan(""));
  Histogram h(std::vector<double>{0.001, 0.5, 2.0});
  for (double v : {0.0005, 0.001, 0.2, 0.3, 1.0, 100.0}) h.observe(v);
  p.family("kestrel:latency_seconds", "histogram", "Latency");
  p.histogram("kestrel:latency_seconds", {{"transport", "shm"}}, h.snapshot());

  const Parsed r = parse(p.text());
  ASSERT_EQ(r.error, "") << p.text();
  ASSERT_EQ(r.families.size(), 3u);
  EXPECT_EQ(r.families[0].help, "Help with a \\ backslash\nand a newline");
  EXPECT_EQ(r.value("kestrel:test_total", {{"odd", "a \"quoted\" \\ value\nnext"}}), 3.0);
  EXPECT_EQ(r.value("kestrel:test_total", {{"transport", "grpc"}}), 0.125);
  EXPECT_TRUE(std::isnan(*r.value("kestrel:ratio")));
  EXPECT_EQ(r.value("kestrel:latency_seconds_bucket", {{"le", "0.001"}}), 2.0);  // bounds are inclusive
  EXPECT_EQ(r.value("kestrel:latency_seconds_bucket", {{"le", "0.5"}}), 4.0);
  EXPECT_EQ(r.value("kestrel:latency_seconds_bucket", {{"le", "2"}}), 5.0);
  EXPECT_EQ(r.value("kestrel:latency_seconds_bucket", {{"le", "+Inf"}}), 6.0);
  EXPECT_EQ(r.value("kestrel:latency_seconds_count"), 6.0);
  EXPECT_NEAR(*r.value("kestrel:latency_seconds_sum"), 101.5015, 1e-9);
}

TEST(PrometheusText, Numbers) {
  EXPECT_EQ(prometheus_number(3), "3");
  EXPECT_EQ(prometheus_number(0.25), "0.25");
  EXPECT_EQ(prometheus_number(1e-6), "1e-06");
  EXPECT_EQ(prometheus_number(INFINITY), "+Inf");
  EXPECT_EQ(prometheus_number(-INFINITY), "-Inf");
  EXPECT_EQ(prometheus_number(NAN), "NaN");
}

const char* const kFamilies[] = {"kestrel:request_success_total",
                                 "kestrel:request_failure_total",
                                 "kestrel:prompt_tokens_total",
                                 "kestrel:generation_tokens_total",
                                 "kestrel:time_to_first_token_seconds",
                                 "kestrel:inter_token_latency_seconds",
                                 "kestrel:e2e_request_latency_seconds",
                                 "kestrel:request_queue_time_seconds",
                                 "kestrel:num_requests_running",
                                 "kestrel:num_requests_waiting",
                                 "kestrel:num_sessions",
                                 "kestrel:state_slots_used",
                                 "kestrel:state_slots_total",
                                 "kestrel:state_slot_usage_perc",
                                 "kestrel:engine_ticks_total",
                                 "kestrel:tokens_processed_total",
                                 "kestrel:serving",
                                 "kestrel:http_connections",
                                 "kestrel:http_responses_total"};

TEST(MetricsPage, EveryFamilyForEveryTransport) {
  testing::FakeService service;
  HttpCounters http;
  http.count_response(200);
  http.count_response(429);
  const Parsed r = parse(render_metrics(&service, http));
  ASSERT_EQ(r.error, "");
  for (const char* name : kFamilies) EXPECT_NE(r.find(name), nullptr) << name;
  for (const char* t : {"grpc", "shm", "http"}) {
    EXPECT_EQ(r.value("kestrel:prompt_tokens_total", {{"transport", t}}), 0.0) << t;
    EXPECT_EQ(r.value("kestrel:request_success_total", {{"transport", t}, {"finished_reason", "length"}}), 0.0);
    EXPECT_EQ(r.value("kestrel:request_failure_total", {{"transport", t}, {"code", "resource_exhausted"}}), 0.0);
    EXPECT_EQ(r.value("kestrel:time_to_first_token_seconds_count", {{"transport", t}}), 0.0);
  }
  EXPECT_EQ(r.value("kestrel:http_responses_total", {{"code", "429"}}), 1.0);
  EXPECT_EQ(r.value("kestrel:serving"), 1.0);
}

TEST(MetricsPage, KvCacheFamiliesWithASharedPool) {
  testing::FakeService service;
  HttpCounters http;
  EXPECT_EQ(parse(render_metrics(&service, http)).find("kestrel:kv_cache_tokens_total"), nullptr)
      << "an engine without a shared pool has no KV cache families";
  service.cache = EngineCachePool{4096, 1024, 1u << 30};
  const Parsed r = parse(render_metrics(&service, http));
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.value("kestrel:kv_cache_tokens_total"), 4096.0);
  EXPECT_EQ(r.value("kestrel:kv_cache_tokens_used"), 1024.0);
  EXPECT_EQ(r.value("kestrel:kv_cache_usage_perc"), 0.25);
}

TEST(MetricsPage, WhileLoadingOnlyTheServerFamilies) {
  HttpCounters http;
  const Parsed r = parse(render_metrics(nullptr, http));
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.value("kestrel:serving"), 0.0);
  EXPECT_EQ(r.find("kestrel:prompt_tokens_total"), nullptr);
}

TEST(ServiceMetrics, RecordsLandInTheirTransportAndBuckets) {
  ServiceMetrics m;
  m.admitted(Transport::kHttp);
  m.admitted(Transport::kHttp);
  EXPECT_EQ(m.snapshot().transports[2].waiting, 2);
  m.scheduled(Transport::kHttp, 0.002);
  m.first_token(Transport::kHttp, 0.03, 11);
  m.next_token(Transport::kHttp, 0.004);
  m.next_token(Transport::kHttp, 0.006);
  m.succeeded(Transport::kHttp, /*was_scheduled=*/true, FinishClass::kLength, 0.05);
  m.failed(Transport::kHttp, /*was_admitted=*/true, /*was_scheduled=*/false, ErrorCode::kCancelled);
  m.failed(Transport::kShm, /*was_admitted=*/false, /*was_scheduled=*/false, ErrorCode::kInvalidArgument);
  const ServiceMetrics::Snapshot s = m.snapshot();
  const auto& h = s.transports[static_cast<size_t>(Transport::kHttp)];
  EXPECT_EQ(h.waiting, 0);
  EXPECT_EQ(h.running, 0);
  EXPECT_EQ(h.prompt_tokens, 11u);
  EXPECT_EQ(h.generation_tokens, 3u);
  EXPECT_EQ(h.success[static_cast<size_t>(FinishClass::kLength)], 1u);
  EXPECT_EQ(h.failure[static_cast<size_t>(ErrorCode::kCancelled)], 1u);
  EXPECT_EQ(h.ttft.count, 1u);
  EXPECT_EQ(h.inter_token.count, 2u);
  EXPECT_NEAR(h.inter_token.sum, 0.01, 1e-12);
  EXPECT_EQ(h.queue_time.count, 1u);
  EXPECT_EQ(h.e2e.count, 1u);
  const auto& shm = s.transports[static_cast<size_t>(Transport::kShm)];
  EXPECT_EQ(shm.failure[static_cast<size_t>(ErrorCode::kInvalidArgument)], 1u);
  EXPECT_EQ(shm.waiting, 0) << "a refusal at admission was never waiting";
  EXPECT_EQ(s.transports[static_cast<size_t>(Transport::kGrpc)].generation_tokens, 0u);
}

}  // namespace
}  // namespace kestrel::daemon::http
