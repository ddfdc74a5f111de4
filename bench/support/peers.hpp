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
  // The environment entries a child needs to run on this peer ({} for glibc).
  std::vector<std::string> environment() const {
    if (preload_path.empty()) return {};
    return {"LD_PRELOAD=" + preload_path};
  }
};

// glibc first, then jemalloc, mimalloc and tcmalloc, each with whether it is installed.
std::vector<malloc_peer> malloc_peers();

// memkit's own drop-in (libmemkit_malloc.so from this build), measured the same way as the peers.
malloc_peer memkit_malloc();

}  // namespace memkit::bench
