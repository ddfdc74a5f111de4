// The peers memkit is measured against that are whole malloc implementations (glibc, jemalloc,
// mimalloc, tcmalloc). They are compared by running the same workload in a child process with the
// peer's shared library preloaded, so every allocator runs the identical code path. Which peers
// exist is found at configure time (bench/CMakeLists.txt); a missing one is reported as
// "not installed", never silently dropped.
#pragma once

#include <string>
#include <vector>

namespace memkit::bench {

struct malloc_peer {
  std::string name;          // "glibc", "jemalloc", "mimalloc", "tcmalloc"
  std::string preload_path;  // shared library for LD_PRELOAD; empty for glibc (the default)
  bool installed = false;    // false: report "not installed"
  std::vector<std::string> settings;  // further environment entries (GLIBC_TUNABLES=... say)
  // The environment entries a child needs to run on this peer ({} for glibc at its defaults).
  std::vector<std::string> environment() const {
    std::vector<std::string> entries = settings;
    if (!preload_path.empty()) entries.push_back("LD_PRELOAD=" + preload_path);
    return entries;
  }
};

// glibc first, then jemalloc, mimalloc and tcmalloc, each with whether it is installed.
std::vector<malloc_peer> malloc_peers();

// glibc at its best reasonable configuration for an allocation-heavy program, through tunables
// (the documented knobs, no code change): blocks up to 32 MiB (the largest threshold glibc
// accepts) come from the heap instead of a mapping of their own each, freed memory is kept up to
// 256 MiB instead of trimmed at 128 KiB, the heap grows 16 MiB at a time, and the per-thread cache
// holds 256 blocks per size instead of 7. Named "glibc (tuned)"; the value is glibc_tunables.
malloc_peer glibc_tuned();
extern const char* const glibc_tunables;

// memkit's own drop-in (libmemkit_malloc.so from this build), measured the same way as the peers.
malloc_peer memkit_malloc();

}  // namespace memkit::bench
