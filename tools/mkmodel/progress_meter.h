// ProgressMeter: "[ 42%] 8.41 / 20.05 GB  612 MB/s  ETA 0:19" on stderr while a long write runs.
//
// On a terminal the line is redrawn in place at most 4 times a second; otherwise a line is printed every 10% so logs
// stay short. Not thread-safe: the writing thread calls update().
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace kestrel::mkmodel {

class ProgressMeter {
 public:
  // out == nullptr: silent.
  ProgressMeter(uint64_t total_bytes, std::FILE* out);

  void update(uint64_t done_bytes);
  // Prints the final line ("wrote X MB in Ys, Z MB/s") and ends the line.
  void finish(uint64_t done_bytes);

  double elapsed_seconds() const;

 private:
  void print(uint64_t done, bool final_line);

  uint64_t total_;
  std::FILE* out_;
  bool tty_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_print_;
  int last_decile_ = -1;
};

}  // namespace kestrel::mkmodel
