/* Misuses the heap as argv[1] says, for the drop-in malloc's debug-mode tests (run with
   LD_PRELOAD=libmemkit_malloc.so MEMKIT_DEBUG=1). Pointers go through volatile variables so the
   compiler neither warns about nor removes the misuse. Exits 0 when the misuse went unnoticed.
   Also: "ok" (correct use, from a constructor before main too), "plugin PATH" (dlopen a library
   whose threads use TLS and the heap), "threads" (many short-lived threads), and leaks whose
   truth depends on the program's other threads (see the "thread-" cases at the end). */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../support/refuse_tracing.h"

static void* volatile slot;

static void* launder(void* p) {
  slot = p;
  return slot;
}

/* Loses one block at each depth of a recursion `depth` deep: each has another allocation stack,
   so the leak report has one record per depth. */
__attribute__((noinline)) static void lose_from_places(int depth) {
  if (depth == 0) return;
  launder(malloc(16 + (size_t)depth));
  slot = NULL;
  lose_from_places(depth - 1);
  __asm__ volatile("" ::: "memory"); /* no tail call: every depth keeps its frame */
}

/* Before main: every allocation function, from a constructor. */
__attribute__((constructor)) static void allocate_before_main(void) {
  void* a = malloc(10);
  void* b = calloc(3, 7);
  void* c = realloc(malloc(5), 500);
  void* d = NULL;
  if (posix_memalign(&d, 64, 100) != 0 || !a || !b || !c) abort();
  free(a);
  free(b);
  free(c);
  free(d);
}

typedef size_t (*scratch_fn)(size_t);
static scratch_fn plugin_scratch;

static void* use_plugin(void* unused) {
  (void)unused;
  for (size_t size = 16; size <= 65536; size *= 4)
    if (plugin_scratch(size) != size) return (void*)1;
  return NULL;
}

static void* short_lived(void* arg) {
  void* blocks[64];
  for (int i = 0; i < 64; ++i) blocks[i] = malloc((size_t)(16 + i * 8 + (intptr_t)arg % 7));
  for (int i = 0; i < 64; i += 2) free(blocks[i]);
  return blocks[1]; /* the joiner frees the rest: blocks outlive their thread */
}

static volatile int worker_ready;

/* Allocates, drops the only pointer, then blocks in the kernel for good: the block is lost,
   though the dead frames below the thread's stack pointer (malloc's) still hold its address. */
static void* lose_then_block(void* unused) {
  (void)unused;
  launder(malloc(1357));
  slot = NULL;
  worker_ready = 1;
  for (;;) pause();
  return NULL;
}

/* Waits in poll() on a pipe no one writes to; any failure (EINTR included) ends the process with
   status 9, as some programs treat it. */
static void* poll_or_end_process(void* unused) {
  (void)unused;
  int ends[2];
  if (pipe(ends) != 0) _exit(8);
  struct pollfd wait_for = {ends[0], POLLIN, 0};
  worker_ready = 1;
  if (poll(&wait_for, 1, -1) < 0) _exit(9);
  return NULL;
}

#if defined(__x86_64__)
/* Allocates, keeps the address only in a callee-saved register (memory holds it encoded), then
   blocks in the kernel for good: the block is reachable, as valgrind says, through a register
   only the kernel saved. */
#define HIDE_KEY 0x5555000000000000ul
static void* hold_in_a_register_then_block(void* unused) {
  (void)unused;
  register unsigned long hidden __asm__("r12") = (unsigned long)malloc(2468) ^ HIDE_KEY;
  __asm__ volatile("" : "+r"(hidden));
  {
    char scrub[1 << 16]; /* malloc's dead frames: no copy of the address below this frame */
    memset(scrub, 0, sizeof scrub);
    __asm__ volatile("" : : "r"(scrub) : "memory");
  }
  worker_ready = 1;
  __asm__ volatile(
      "movabs %1, %%rax\n xor %%rax, %0\n xor %%eax, %%eax\n"
      "1: mov $34, %%eax\n syscall\n jmp 1b" /* pause(), forever */
      : "+r"(hidden)
      : "i"(HIDE_KEY)
      : "rax", "rcx", "r11", "memory");
  return NULL;
}
#endif

/* Sleeps 300 ms and tells whether the sleep was cut short (EINTR) by what the leak report does
   meanwhile. */
static void* sleep_through(void* unused) {
  (void)unused;
  struct timespec t = {0, 300 * 1000 * 1000};
  worker_ready = 1;
  return nanosleep(&t, NULL) == 0 ? NULL : (void*)1;
}

static void* block_forever(void* unused) {
  (void)unused;
  worker_ready = 1;
  for (;;) pause();
  return NULL;
}

/* Out of line, with a scrub of the stack after it, so that no copy of the block's address stays
   in main's frame or in a dead one above the exit-time report's. */
__attribute__((noinline)) static void keep_block_at(void** where) { *where = malloc(3579); }
__attribute__((noinline)) static void scrub_stack(void) {
  volatile char scrub[16384];
  for (size_t i = 0; i < sizeof scrub; ++i) scrub[i] = 0;
}

/* A list a thread keeps growing and emptying, every node reachable from `churn_head` (or, for a
   moment, from the thread's registers), until the process exits. */
struct churn_node {
  struct churn_node* next;
  char payload[24];
};
static struct churn_node* volatile churn_head;
static void* churn(void* unused) {
  (void)unused;
  worker_ready = 1;
  for (;;) {
    for (int i = 0; i < 20000; ++i) {
      struct churn_node* n = malloc(sizeof *n);
      n->next = churn_head;
      churn_head = n;
    }
    while (churn_head) {
      struct churn_node* n = churn_head;
      churn_head = n->next;
      free(n);
    }
  }
  return NULL;
}

/* Loses a block whose address stays in this returned frame's slots, below its caller's stack
   pointer: where exit()'s frames will lie when the caller calls it next. */
__attribute__((noinline)) static void lose_leaving_stale_copies(void) {
  volatile uintptr_t copies[32];
  const uintptr_t lost = (uintptr_t)malloc(2468);
  for (size_t i = 0; i < 32; ++i) copies[i] = lost;
}
__attribute__((noinline)) static void exit_over_stale_copies(void) {
  lose_leaving_stale_copies();
  exit(0);
}

__attribute__((noinline)) static void quick_exit_over_stale_copies(void) {
  lose_leaving_stale_copies();
  quick_exit(0);
}

static void free_the_slot(void) {
  free(slot);
  slot = NULL;
}

static void exit_from_handler(int signal_number) { _exit(signal_number == SIGUSR1 ? 0 : 4); }

/* Allocates and frees blocks of many sizes until the process ends. */
static void* allocate_forever(void* unused) {
  (void)unused;
  worker_ready = 1;
  for (;;) {
    for (size_t i = 1; i < 64; ++i) {
      char* volatile p = malloc(i * 24);
      p[0] = 1;
      free(p);
    }
  }
  return NULL;
}

/* An atexit handler that asks for a report while it holds a block in its own frame. */
static void report_holding_a_local(void) {
  void* volatile local = malloc(8642);
  void (*report)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "memkit_malloc_report_leaks");
  if (report) report(2);
  free(local);
}

#if defined(__x86_64__)
/* Calls exit() (or _exit(), or quick_exit(): `how` is the case's name) with a block's only address
   in rbx, a register the frames below save and reuse. */
__attribute__((noinline)) static void exit_with_a_register_root(const char* how) {
  register unsigned long held __asm__("rbx") = (unsigned long)malloc(1357) ^ HIDE_KEY;
  __asm__ volatile("" : "+r"(held));
  scrub_stack(); /* malloc's dead frames: no copy of the address below this frame */
  if (how[0] == 'i')
    __asm__ volatile("movabs %1, %%rax\n xor %%rax, %0\n xor %%edi, %%edi\n call _exit@PLT"
                     : "+r"(held)
                     : "i"(HIDE_KEY)
                     : "rax", "rdi", "memory");
  if (how[0] == 'q')
    __asm__ volatile("movabs %1, %%rax\n xor %%rax, %0\n xor %%edi, %%edi\n call quick_exit@PLT"
                     : "+r"(held)
                     : "i"(HIDE_KEY)
                     : "rax", "rdi", "memory");
  __asm__ volatile("movabs %1, %%rax\n xor %%rax, %0\n xor %%edi, %%edi\n call exit@PLT"
                   : "+r"(held)
                   : "i"(HIDE_KEY)
                   : "rax", "rdi", "memory");
}
#endif

/* Puts a new block's address in `where` only, out of line (no copy stays in main's frame). */
__attribute__((noinline)) static void keep_in(void** where, size_t size) { *where = malloc(size); }

/* Starts `body` on a thread of its own and waits until it is in the kernel. */
static pthread_t start_worker(void* (*body)(void*), const pthread_attr_t* attributes) {
  pthread_t thread;
  if (pthread_create(&thread, attributes, body, NULL) != 0) abort();
  while (!worker_ready) usleep(1000);
  usleep(20000); /* in the kernel by now */
  return thread;
}

/* A double free 40 calls deep (deep-double-free). */
__attribute__((noinline)) static void descend(int depth) {
  if (depth > 0) {
    descend(depth - 1);
    __asm__ volatile(""); /* no tail call: one frame per level */
    return;
  }
  char* p = launder(malloc(24));
  free(p);
  free(launder(p));
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const char* what = argv[1];
  if (strcmp(what, "plugin") == 0 && argc == 3) {
    for (int round = 0; round < 3; ++round) {
      void* library = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
      if (!library) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 3;
      }
      char* (*copy)(void) = (char* (*)(void))dlsym(library, "plugin_copy_greeting");
      plugin_scratch = (scratch_fn)dlsym(library, "plugin_thread_scratch");
      if (!copy || !plugin_scratch) return 4;
      char* text = copy();
      if (!text || strcmp(text, "hello from the plugin") != 0) return 5;
      free(text);
      pthread_t threads[4];
      for (int t = 0; t < 4; ++t) pthread_create(&threads[t], NULL, use_plugin, NULL);
      for (int t = 0; t < 4; ++t) {
        void* failed = NULL;
        pthread_join(threads[t], &failed);
        if (failed) return 6;
      }
      if (dlclose(library) != 0) return 7;
    }
    return 0;
  }
  /* A block the plugin allocated and the program lost, reported at exit after the plugin was
     unloaded: its allocation stack still names the plugin's function. */
  if (strcmp(what, "closed-plugin") == 0 && argc == 3) {
    void* library = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!library) {
      fprintf(stderr, "dlopen: %s\n", dlerror());
      return 3;
    }
    char* (*copy)(void) = (char* (*)(void))dlsym(library, "plugin_copy_greeting");
    if (!copy) return 4;
    launder(copy());
    slot = NULL;
    return dlclose(library) == 0 ? 0 : 7;
  }
  /* A library opened with RTLD_DEEPBIND frees a block of the program's and hands one out: its
     free and malloc must be the drop-in's (PHP opens its extensions so). Then the same library
     opened by its bare name, found through this program's RUNPATH: the drop-in's dlopen must keep
     the program as the caller whose RUNPATH is searched. */
  if (strcmp(what, "deepbind-plugin") == 0 && argc == 3) {
    void* library = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!library) {
      fprintf(stderr, "dlopen: %s\n", dlerror());
      return 3;
    }
    void (*release)(void*) = (void (*)(void*))dlsym(library, "plugin_free");
    char* (*copy)(void) = (char* (*)(void))dlsym(library, "plugin_copy_greeting");
    if (!release || !copy) return 4;
    release(launder(malloc(100)));
    char* text = copy();
    if (!text || strcmp(text, "hello from the plugin") != 0) return 5;
    free(text);
    if (dlclose(library) != 0) return 7;
    void* by_name = dlopen("memkit_malloc_plugin.so", RTLD_NOW | RTLD_LOCAL);
    if (!by_name) {
      fprintf(stderr, "dlopen by name: %s\n", dlerror());
      return 8;
    }
    return dlclose(by_name) == 0 ? 0 : 7;
  }
  if (strcmp(what, "threads") == 0) {
    for (int i = 0; i < 200; ++i) {
      pthread_t thread;
      void* left = NULL;
      if (pthread_create(&thread, NULL, short_lived, (void*)(intptr_t)i) != 0) return 3;
      pthread_join(thread, &left);
      free(left);
    }
    return 0;
  }
  if (strcmp(what, "ok") == 0) {
    for (int i = 0; i < 1000; ++i) {
      char* p = malloc((size_t)i + 1);
      if (!p) return 3;
      memset(p, 1, (size_t)i + 1);
      free(launder(p));
    }
    return 0;
  }
  if (strcmp(what, "leaking-children") == 0) {
    /* Four children that each lose blocks from 20 places and exit at the same moment, so that
       their leak reports are written at once, to one file. */
    int go[2];
    if (pipe(go) != 0) return 3;
    for (int child = 0; child < 4; ++child) {
      const pid_t pid = fork();
      if (pid < 0) return 3;
      if (pid == 0) {
        close(go[1]);
        lose_from_places(20);
        char byte;
        (void)read(go[0], &byte, 1); /* returns when the parent closes its end */
        exit(0);
      }
    }
    close(go[0]);
    close(go[1]);
    for (int child = 0; child < 4; ++child) {
      int status = 0;
      if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 3;
    }
    return 0;
  }
  /* C23's sized frees, found at run time (this C library may have none; the drop-in has both):
     "free-sized" with the sizes the blocks were requested with, "free-sized-wrong" with another. */
  if (strcmp(what, "free-sized") == 0 || strcmp(what, "free-sized-wrong") == 0) {
    void (*sized)(void*, size_t) = (void (*)(void*, size_t))dlsym(RTLD_DEFAULT, "free_sized");
    void (*aligned_sized)(void*, size_t, size_t) =
        (void (*)(void*, size_t, size_t))dlsym(RTLD_DEFAULT, "free_aligned_sized");
    if (!sized || !aligned_sized) return 77;
    if (strcmp(what, "free-sized-wrong") == 0) {
      sized(launder(malloc(40)), 48);
      return 0;
    }
    sized(launder(malloc(40)), 40);
    sized(launder(calloc(4, 10)), 40);
    char* grown = launder(realloc(launder(malloc(10)), 100));
    sized(grown, 100);
    aligned_sized(launder(aligned_alloc(64, 128)), 64, 128);
    sized(NULL, 0);
    return 0;
  }
  if (strcmp(what, "descriptors") == 0) {
    /* Which low descriptors are open, and which one the program's next open() gets: the same with
       the drop-in as without it. */
    for (int fd = 3; fd < 20; ++fd) {
      if (fcntl(fd, F_GETFD) >= 0) printf("descriptor %d is open\n", fd);
    }
    const int fd = open("/dev/null", O_RDONLY);
    printf("open() gave %d\n", fd);
    close(fd);
    return 0;
  }
  if (strcmp(what, "double-free") == 0) {
    char* p = launder(malloc(24));
    p[0] = 1;
    free(p);
    free(launder(p));
    return 0;
  }
  if (strcmp(what, "deep-double-free") == 0) {
    descend(40);
    return 0;
  }
  if (strcmp(what, "double-free-in-a-loop") == 0) {
    /* 50 double frees from one place, then one from another: two reports, as the loop is one error */
    static volatile int times = 50; /* not a constant: an optimizing build would unroll the loop */
    char* p = launder(malloc(24));
    free(p);
    for (int i = 0, n = times; i < n; ++i) free(launder(p));
    free(launder(p));
    return 0;
  }
  if (strcmp(what, "foreign-free") == 0) {
    static char not_from_malloc[256];
    free(launder(not_from_malloc + 64));
    return 0;
  }
  if (strcmp(what, "interior-free") == 0) {
    char* p = launder(malloc(64));
    free(launder(p + 16));
    return 0;
  }
  if (strcmp(what, "overflow") == 0) {
    char* p = launder(malloc(24));
    memset(launder(p), 'x', 24 + 4); /* 4 bytes past the end */
    free(p);
    return 0;
  }
  if (strcmp(what, "use-after-free") == 0) {
    char* p = launder(malloc(48));
    free(p);
    ((char*)launder(p))[8] = 'x';
    /* The block is found overwritten when it is handed out again. */
    for (int i = 0; i < 100000; ++i) launder(malloc(48));
    return 0;
  }
  if (strcmp(what, "close-stderr") == 0) { /* as GNU tools do at exit */
    free(launder(malloc(100)));
    close(2);
    return 0;
  }
  if (strcmp(what, "leak") == 0) {
    launder(malloc(1234));
    slot = NULL; /* the only pointer to the block is gone: lost */
    return 0;
  }
  /* The only pointers to two blocks are 64-bit operands of instructions (movabs $block, %rax) at
     unaligned offsets, as a JIT keeps them in its code: "jit-code" in a writable and executable
     mapping (a code cache: the blocks are in use), "jit-data" in one that is only writable (data
     whose unaligned bytes look like an address: the blocks are lost). */
  if (strcmp(what, "jit-code") == 0 || strcmp(what, "jit-data") == 0) {
    const int protection = PROT_READ | PROT_WRITE | (strcmp(what, "jit-code") == 0 ? PROT_EXEC : 0);
    unsigned char* code = mmap(NULL, 4096, protection, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) return 77;
    for (int i = 0; i < 2; ++i) {
      void* block = launder(malloc(4321));
      unsigned char* at = code + 1 + 11 * i; /* offsets 1 and 12 */
      at[0] = 0x48;
      at[1] = 0xb8;
      memcpy(at + 2, &block, sizeof block);
      at[10] = 0xc3; /* ret */
    }
    slot = NULL;
    return 0;
  }
  /* The exit-time leak report while another thread is blocked in the kernel. */
  if (strcmp(what, "thread-lost-block") == 0) {
    (void)start_worker(lose_then_block, NULL);
    return 0;
  }
  /* The same where the report cannot stop the other thread (no ptrace, and the thread blocks
     every signal): the main thread's lost block is still found. Exits 77 where the system has no
     seccomp filters. */
  if (strcmp(what, "thread-no-ptrace") == 0) {
    if (!memkit_refuse_tracing()) return 77;
    sigset_t all, kept;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &kept); /* the worker starts with this mask */
    (void)start_worker(lose_then_block, NULL);
    pthread_sigmask(SIG_SETMASK, &kept, NULL);
    launder(malloc(1234));
    slot = NULL;
    return 0;
  }
  /* No ptrace, but the worker takes signals: the report stops it with one, so both lost blocks
     are found, and a block only the worker's register holds is reachable. Exits 77 where the
     system has no seccomp filters. */
  if (strcmp(what, "thread-no-ptrace-signal") == 0) {
    if (!memkit_refuse_tracing()) return 77;
    (void)start_worker(lose_then_block, NULL);
    launder(malloc(1234));
    slot = NULL;
    return 0;
  }
  if (strcmp(what, "thread-register-no-ptrace") == 0) {
#if defined(__x86_64__)
    if (!memkit_refuse_tracing()) return 77;
    (void)start_worker(hold_in_a_register_then_block, NULL);
    return 0;
#else
    return 77; /* the case needs x86-64's registers */
#endif
  }
  /* No ptrace, and a worker blocked in poll() that ends the process when poll fails: the stop's
     signal wakes it with EINTR once the scan lets it go, while the main thread writes its report,
     and it calls _exit(9). The report is written whole all the same. Exits 77 where the system has
     no seccomp filters. */
  if (strcmp(what, "thread-eintr-ends-process") == 0) {
    if (!memkit_refuse_tracing()) return 77;
    (void)start_worker(poll_or_end_process, NULL);
    launder(malloc(2345));
    slot = NULL;
    return 0;
  }
  /* A thread running on a stack carved from a larger mapping, as coroutine libraries carve
     them, with a suspended coroutine's stack below it in the same mapping holding the only
     address of a block: reachable. */
  if (strcmp(what, "thread-coroutine-stacks") == 0) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t size = (size_t)1 << 20;
    char* area = mmap(NULL, page + size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED || mprotect(area, page, PROT_READ) != 0) return 3; /* no guard below */
    char* stacks = area + page;
    keep_block_at((void**)(stacks + 4096)); /* the low half: the suspended coroutine's frames */
    scrub_stack();
    pthread_attr_t attributes;
    if (pthread_attr_init(&attributes) != 0 || pthread_attr_setstack(&attributes, stacks + size / 2, size / 2) != 0)
      return 3;
    (void)start_worker(block_forever, &attributes);
    return 0;
  }
  if (strcmp(what, "thread-register") == 0) {
#if defined(__x86_64__)
    (void)start_worker(hold_in_a_register_then_block, NULL);
    return 0;
#else
    return 77; /* the case needs x86-64's registers */
#endif
  }
  /* Blocks whose only addresses are kept in shared memory: a MAP_SHARED anonymous mapping, a
     System V segment and a memfd's shared mapping (memcheck counts them reachable). */
  if (strcmp(what, "shared-roots") == 0) {
    void** anonymous = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    const int segment = shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
    void** system_v = segment >= 0 ? shmat(segment, NULL, 0) : (void*)-1;
    if (segment >= 0) (void)shmctl(segment, IPC_RMID, NULL); /* gone once detached */
    FILE* backing = tmpfile();
    void** file = MAP_FAILED;
    if (backing && ftruncate(fileno(backing), 4096) == 0)
      file = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fileno(backing), 0);
    if (anonymous == MAP_FAILED || system_v == (void*)-1 || file == MAP_FAILED) return 3;
    keep_in(anonymous + 3, 1111);
    keep_in(system_v + 5, 2222);
    keep_in(file + 7, 3333);
    scrub_stack();
    return 0;
  }
  /* A block lost in a returned frame whose slots still hold its address where exit()'s frames
     lie (memcheck: definitely lost, those slots not written since exit's frames were made). */
  if (strcmp(what, "exit-stale") == 0) exit_over_stale_copies();
  /* quick_exit: reported after the program's at_quick_exit handlers (this one frees a block only
     a global holds), with a block lost in a returned frame whose slots quick_exit's frames reuse. */
  if (strcmp(what, "quick-exit-stale") == 0) {
    slot = malloc(3131);
    if (at_quick_exit(free_the_slot) != 0) return 3;
    quick_exit_over_stale_copies();
  }
  /* A report on demand from an atexit handler, below exit(): the handler's frame is a root. */
  if (strcmp(what, "exit-handler") == 0) return atexit(report_holding_a_local) == 0 ? 0 : 3;
  /* exit(), _exit() or quick_exit() called with a block's only address in a callee-saved register
     (memcheck: reachable). */
  if (strcmp(what, "exit-register") == 0 || strcmp(what, "immediate-exit-register") == 0 ||
      strcmp(what, "quick-exit-register") == 0) {
#if defined(__x86_64__)
    exit_with_a_register_root(what);
#else
    return 77; /* the case needs x86-64's registers */
#endif
  }
  /* _exit from a signal handler (the way out POSIX allows there), with a block lost: no report,
     since the handler may have interrupted malloc itself. */
  if (strcmp(what, "immediate-exit-in-handler") == 0) {
    launder(malloc(5656));
    slot = NULL;
    signal(SIGUSR1, exit_from_handler);
    raise(SIGUSR1);
    return 3;
  }
  /* fork() while two threads allocate and free: each of 40 children ends at once in _exit, with
     its leak report, in a heap where those threads' blocks may be half handed out. Exits with
     how many children did not end with status 0. */
  if (strcmp(what, "fork-while-allocating") == 0) {
    (void)start_worker(allocate_forever, NULL);
    (void)start_worker(allocate_forever, NULL);
    int failed = 0;
    for (int i = 0; i < 40; ++i) {
      const pid_t child = fork();
      if (child == 0) _exit(0);
      int status = 0;
      if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
    }
    return failed;
  }
  /* A process that leaves through _exit (no exit handler runs) with a block lost: `argv[2]` says
     who leaves so: "self", a fork() child (after losing a block of its own) or a vfork() child
     (which shares the parent's memory; the parent then returns from main). */
  if (strcmp(what, "immediate-exit") == 0 && argc > 2) {
    launder(malloc(1212));
    slot = NULL;
    if (strcmp(argv[2], "self") == 0) _exit(0);
    const pid_t child = strcmp(argv[2], "fork") == 0 ? fork() : vfork();
    if (child == 0) {
      if (argv[2][0] == 'f') {
        launder(malloc(3434));
        slot = NULL;
      }
      _exit(0);
    }
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return 3;
    return WEXITSTATUS(status);
  }
  /* The exit-time leak report while another thread allocates and frees: main returns after
     `argv[2]` microseconds (20,000 by default) of it. */
  if (strcmp(what, "thread-churn") == 0) {
    pthread_t worker;
    if (pthread_create(&worker, NULL, churn, NULL) != 0) return 3;
    while (!worker_ready) usleep(1000);
    usleep(argc > 2 ? (useconds_t)atoi(argv[2]) : 20000);
    return 0;
  }
  /* A report on demand (memkit_malloc_report_leaks, found in the drop-in) while another thread
     sleeps: the sleep runs its whole time. Exits 4 when it was cut short. */
  if (strcmp(what, "thread-sleep") == 0) {
    void (*report)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "memkit_malloc_report_leaks");
    if (!report) return 3;
    const pthread_t worker = start_worker(sleep_through, NULL);
    launder(malloc(4321));
    slot = NULL;
    report(2);
    void* cut_short = NULL;
    pthread_join(worker, &cut_short);
    return cut_short ? 4 : 0;
  }
  return 2;
}
