// Limits a test child process's private writable memory so that commits beyond it fail with
// ENOMEM, the way a machine under memory pressure (or a container limit) makes them fail.
#pragma once

#include <sys/resource.h>

#include <cstddef>
#include <cstdio>

namespace memkit::testing {

// Sets RLIMIT_DATA to what this process's data segment uses now plus `growth` bytes (sanitizers
// map plenty of their own, so an absolute limit would not work). False when it cannot.
inline bool limit_data_growth(std::size_t growth) {
  std::FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return false;
  unsigned long long data_kib = 0;
  char line[256];
  while (std::fgets(line, sizeof line, status) != nullptr) {
    if (std::sscanf(line, "VmData: %llu kB", &data_kib) == 1) break;
  }
  std::fclose(status);
  rlimit limit{};
  if (data_kib == 0 || getrlimit(RLIMIT_DATA, &limit) != 0) return false;
  limit.rlim_cur = static_cast<rlim_t>(data_kib * 1024 + growth);
  return setrlimit(RLIMIT_DATA, &limit) == 0;
}

}  // namespace memkit::testing
