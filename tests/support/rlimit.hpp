// Limits a test child process's private writable memory so that commits beyond it fail with
// ENOMEM, the way a machine under memory pressure (or a container limit) makes them fail.
#pragma once

#if defined(_WIN32)
#include "../../src/os/windows_api.hpp"
#include <psapi.h>
#else
#include <sys/resource.h>
#endif

#include <cstddef>
#include <cstdio>

namespace memkit::testing {

#if defined(_WIN32)

// Windows has no RLIMIT_DATA; its counterpart is a job object's limit on each process's committed
// memory (JOB_OBJECT_LIMIT_PROCESS_MEMORY): commits beyond it fail. Puts this process in a new job
// limited to the private memory it has committed now plus `growth` bytes. False when it cannot.
inline bool limit_data_growth(std::size_t growth) {
  PROCESS_MEMORY_COUNTERS counters{};
  if (!::GetProcessMemoryInfo(::GetCurrentProcess(), &counters, sizeof counters)) return false;
  const HANDLE job = ::CreateJobObjectA(nullptr, nullptr);
  if (job == nullptr) return false;
  JOBOBJECT_EXTENDED_LIMIT_INFORMATION limits{};
  limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_PROCESS_MEMORY;
  limits.ProcessMemoryLimit = counters.PagefileUsage + growth;  // PagefileUsage: the commit charge
  // The handle stays open for the rest of the process's life, which the job must outlast.
  return ::SetInformationJobObject(job, JobObjectExtendedLimitInformation, &limits, sizeof limits) &&
         ::AssignProcessToJobObject(job, ::GetCurrentProcess());
}

#else

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

#endif

}  // namespace memkit::testing
