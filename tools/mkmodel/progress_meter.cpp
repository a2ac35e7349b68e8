// ProgressMeter: percentage, MB/s and ETA of a long write on stderr.
#include "tools/mkmodel/progress_meter.h"

#include <unistd.h>

#include <cmath>

namespace kestrel::mkmodel {

ProgressMeter::ProgressMeter(uint64_t total_bytes, std::FILE* out)
    : total_(total_bytes), out_(out), start_(std::chrono::steady_clock::now()), last_print_(start_) {
  if (out_ != nullptr) tty_ = isatty(fileno(out_)) != 0;
}

double ProgressMeter::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ProgressMeter::update(uint64_t done_bytes) {
  if (out_ == nullptr || total_ == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_print_ < std::chrono::milliseconds(250)) return;
  } else {
    const int decile = static_cast<int>(done_bytes * 10 / total_);
    if (decile == last_decile_) return;
    last_decile_ = decile;
  }
  last_print_ = now;
  print(done_bytes, false);
}

void ProgressMeter::finish(uint64_t done_bytes) {
  if (out_ == nullptr) return;
  print(done_bytes, true);
}

void ProgressMeter::print(uint64_t done, bool final_line) {
  const double secs = elapsed_seconds();
  const double mb = static_cast<double>(done) / 1e6;
  const double rate = secs > 0 ? mb / secs : 0.0;
  if (final_line) {
    std::fprintf(out_, "%s%.1f MB in %.1f s, %.0f MB/s\n", tty_ ? "\r\033[K" : "", mb, secs, rate);
    std::fflush(out_);
    return;
  }
  const double pct = total_ ? 100.0 * static_cast<double>(done) / static_cast<double>(total_) : 100.0;
  const double left = rate > 0 ? (static_cast<double>(total_ - done) / 1e6) / rate : 0.0;
  const long eta = std::lround(left);
  std::fprintf(out_, "%s[%3.0f%%] %.2f / %.2f GB  %.0f MB/s  ETA %ld:%02ld%s", tty_ ? "\r\033[K" : "", pct, mb / 1e3,
               static_cast<double>(total_) / 1e9, rate, eta / 60, eta % 60, tty_ ? "" : "\n");
  std::fflush(out_);
}

}  // namespace kestrel::mkmodel
