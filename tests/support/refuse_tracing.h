/* Makes the calling process refuse ptrace, the way a container's seccomp filter can: every ptrace
   call of the process (and of the tasks it starts) then fails with EPERM, so that the leak scan's
   path for threads it cannot stop runs. For a test's child process: the filter cannot be removed.
   C and C++ (tests/malloc/misuse.c and the C++ tests). */
#ifndef MEMKIT_TESTS_REFUSE_TRACING_H
#define MEMKIT_TESTS_REFUSE_TRACING_H

#if defined(__linux__)
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif

/* 1 when the filter is in place, 0 where the system has no seccomp filters. */
static inline int memkit_refuse_tracing(void) {
#if defined(__linux__)
  struct sock_filter rules[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (unsigned)offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ptrace, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog program = {(unsigned short)(sizeof rules / sizeof rules[0]), rules};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
#else
  return 0;
#endif
}

#endif
