// wait_for_rank_if_spare (see warm_spare.h). Runs first in main, before the
// logger or anything else reads the environment.
#include "apps/dtrain-worker/warm_spare.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace dtrain::worker {

void replace_environment(const std::vector<std::string>& env) {
  ::clearenv();
  // putenv keeps the pointer: the strings live as long as the process.
  for (const auto& kv : env) ::putenv(::strdup(kv.c_str()));
}

bool wait_for_rank_if_spare() {
  const char* spare = std::getenv("DTRAIN_WARM_SPARE");
  if (!spare || !*spare) return true;
  std::string got;
  char buf[16384];
  // The payload ends with an empty entry: two NULs in a row (or one at the start).
  auto complete = [&got] {
    return got.size() >= 2 ? got.compare(got.size() - 2, 2, std::string(2, '\0')) == 0 : got == std::string(1, '\0');
  };
  while (!complete()) {
    ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got.append(buf, static_cast<size_t>(n));
  }
  std::vector<std::string> env;
  size_t from = 0;
  while (from < got.size() && got[from] != '\0') {
    size_t end = got.find('\0', from);
    env.push_back(got.substr(from, end - from));
    from = end + 1;
  }
  replace_environment(env);
  const char* rank = std::getenv("RANK");
  std::fprintf(stderr, "dtrain-worker: warm spare pid %d given rank %s\n", static_cast<int>(::getpid()),
               rank ? rank : "?");
  // Under recovery in place the pipe stays: it carries the next rounds.
  const char* channel = std::getenv("DTRAIN_ROUND_CHANNEL");
  int null = channel && *channel ? -1 : ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null >= 0) {
    ::dup2(null, STDIN_FILENO);
    ::close(null);
  }
  return true;
}

}  // namespace dtrain::worker
