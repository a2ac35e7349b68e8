// The Prometheus text format writer (prometheus_text.h).
#include "daemon/http/prometheus_text.h"

#include <charconv>
#include <cmath>

namespace kestrel::daemon::http {
namespace {

void append_escaped(std::string& out, std::string_view text, bool quote) {
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

}  // namespace

std::string prometheus_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, r.ptr);
}

void PrometheusText::family(std::string_view name, std::string_view type, std::string_view help) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  append_escaped(out_, help, /*quote=*/false);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void PrometheusText::series(std::string_view name, std::string_view suffix, const MetricLabels& labels,
                            std::string_view extra_name, std::string_view extra_value, double value) {
  out_ += name;
  out_ += suffix;
  if (!labels.empty() || !extra_name.empty()) {
    out_ += '{';
    bool first = true;
    auto label = [&](std::string_view k, std::string_view v) {
      if (!first) out_ += ',';
      first = false;
      out_ += k;
      out_ += "=\"";
      append_escaped(out_, v, /*quote=*/true);
      out_ += '"';
    };
    for (const auto& [k, v] : labels) label(k, v);
    if (!extra_name.empty()) label(extra_name, extra_value);
    out_ += '}';
  }
  out_ += ' ';
  out_ += prometheus_number(value);
  out_ += '\n';
}

void PrometheusText::sample(std::string_view name, const MetricLabels& labels, double value) {
  series(name, "", labels, "", "", value);
}

void PrometheusText::histogram(std::string_view name, const MetricLabels& labels, const Histogram::Snapshot& h) {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.upper_bounds.size(); ++i) {
    cumulative += h.counts[i];
    series(name, "_bucket", labels, "le", prometheus_number(h.upper_bounds[i]), static_cast<double>(cumulative));
  }
  series(name, "_bucket", labels, "le", "+Inf", static_cast<double>(h.count));
  series(name, "_sum", labels, "", "", h.sum);
  series(name, "_count", labels, "", "", static_cast<double>(h.count));
}

}  // namespace kestrel::daemon::http
