// Makes the calling process refuse ptrace, the way a container's seccomp filter can: every ptrace
// call of the process (and of the tasks it starts) then fails with EPERM, so that the leak scan's
// path for threads it cannot stop runs. For a test's child process: the filter cannot be removed.
#pragma once

#if defined(__linux__)
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>
#endif

namespace memkit::testing {

// False where the system has no seccomp filters.
inline bool refuse_tracing() {
#if defined(__linux__)
  sock_filter rules[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, static_cast<unsigned>(offsetof(seccomp_data, nr))),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ptrace, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof rules / sizeof rules[0]), rules};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
#else
  return false;
#endif
}

}  // namespace memkit::testing
