// Runs a helper program as a child process and collects what it printed and how it ended, for
// tests that check a program from the outside (the drop-in malloc under LD_PRELOAD).
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace memkit::testing {

struct outcome {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string output;  // stdout and stderr together
};

// Runs `argv` with the current environment minus any MEMKIT_* / LD_PRELOAD, plus `extra`.
// MEMKIT_PAGE_SIZE stays: a suite run with larger pages runs its children with them too.
inline outcome run(const std::vector<std::string>& argv, const std::vector<std::string>& extra) {
  outcome result;
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    const bool page_size = entry.rfind("MEMKIT_PAGE_SIZE=", 0) == 0;
    if (!page_size && (entry.rfind("MEMKIT_", 0) == 0 || entry.rfind("LD_PRELOAD=", 0) == 0)) continue;
    environment.push_back(entry);
  }
  environment.insert(environment.end(), extra.begin(), extra.end());
  std::vector<char*> args, envp;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (auto& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);

  int fds[2];
  if (::pipe(fds) != 0) return result;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  pid_t pid = 0;
  const int error = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (error != 0) {
    ::close(fds[0]);
    result.output = std::string("spawn failed: ") + std::strerror(error);
    return result;
  }
  char buffer[4096];
  for (;;) {
    ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n > 0) result.output.append(buffer, static_cast<std::size_t>(n));
    else if (n == 0 || errno != EINTR) break;
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  return result;
}

}  // namespace memkit::testing
