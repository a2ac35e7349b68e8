// PrometheusText: a writer of the Prometheus text exposition format, version 0.0.4 (what GET /metrics answers,
// Content-Type "text/plain; version=0.0.4; charset=utf-8"). Debian packages no C++ Prometheus client, and the format
// is small: per metric family a "# HELP" and a "# TYPE" line, then its samples, `name{label="value",...} value`,
// label values escaped (\\, \", \n), help text escaped (\\, \n), numbers in the shortest form that reads back the same
// (+Inf, -Inf and NaN spelled so), histograms as cumulative `_bucket{le="..."}` samples ending at le="+Inf", then
// `_sum` and `_count`.
//
// Names are not checked here: callers pass constants ([a-zA-Z_:][a-zA-Z0-9_:]*). One writer builds one page; not
// thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/engine/service_metrics.h"

namespace kestrel::daemon::http {

using MetricLabels = std::vector<std::pair<std::string_view, std::string>>;

class PrometheusText {
 public:
  // Starts a family: "# HELP name help" and "# TYPE name type" (type: counter, gauge, histogram).
  void family(std::string_view name, std::string_view type, std::string_view help);
  // One sample of the current family (counters and gauges).
  void sample(std::string_view name, const MetricLabels& labels, double value);
  // The samples of one histogram series: name_bucket (cumulative, le="+Inf" last), name_sum, name_count.
  void histogram(std::string_view name, const MetricLabels& labels, const Histogram::Snapshot& h);

  const std::string& text() const { return out_; }

 private:
  void series(std::string_view name, std::string_view suffix, const MetricLabels& labels, std::string_view extra_name,
              std::string_view extra_value, double value);
  std::string out_;
};

// A number as the format writes it: "3", "0.25", "1e-06", "+Inf", "-Inf", "NaN".
std::string prometheus_number(double value);

}  // namespace kestrel::daemon::http
