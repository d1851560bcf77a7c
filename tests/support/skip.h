// Skipped test cases that are seen and accounted for: a case that cannot run
// here calls DTRAIN_SKIP(kind, reason) instead of returning quietly. The
// skip is recorded (case, kind, reason); doctest_main.cpp prints the list at
// the end of the program, appends it to $DTRAIN_SKIP_LOG (scripts/test prints
// the collected list after ctest) and exits kSkipExitCode when every case
// that ran skipped. Under CI=true a skip of a kind that CI machines must meet
// (test hosts, SLURM, /dev/shm) fails the case instead.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace dtrain::testing {

// A program whose every executed case skipped exits with this (the
// autotools convention); run_without_leftovers.cmake turns it into ctest's
// "Skipped".
constexpr int kSkipExitCode = 77;

// What a skipped case lacked.
enum class SkipKind {
  test_hosts,     // root with network namespaces (scripts/testhosts check)
  slurm,          // Debian's SLURM packages (scripts/install-deps installs them)
  dev_shm,        // a writable /dev/shm
  gpu,            // a visible GPU
  cuda_libtorch,  // a LibTorch built with CUDA
  blas,           // a particular BLAS library (MKL, Debian's OpenBLAS)
  cpu,            // a particular CPU feature set
};

struct SkipKindInfo {
  const char* name;
  const char* needs;  // what the machine lacked, for messages
  bool ci_must_meet;  // CI machines have it: under CI=true the skip is a failure
};

inline SkipKindInfo skip_kind_info(SkipKind k) {
  switch (k) {
    case SkipKind::test_hosts: return {"test_hosts", "root with network namespaces (scripts/testhosts check)", true};
    case SkipKind::slurm: return {"slurm", "SLURM installed (scripts/install-deps installs it)", true};
    case SkipKind::dev_shm: return {"dev_shm", "a writable /dev/shm", true};
    case SkipKind::gpu: return {"gpu", "a visible GPU", false};
    case SkipKind::cuda_libtorch: return {"cuda_libtorch", "a LibTorch built with CUDA", false};
    case SkipKind::blas: return {"blas", "a particular BLAS library", false};
    case SkipKind::cpu: return {"cpu", "a particular CPU feature set", false};
  }
  return {"unknown", "unknown", false};
}

// CI=true (or 1): the run is CI's, on the machine kind CI runs on.
inline bool ci_mode() {
  const char* v = std::getenv("CI");
  return v && (std::strcmp(v, "true") == 0 || std::strcmp(v, "1") == 0);
}

struct SkipRecord {
  std::string test_case, kind, reason;
  bool operator<(const SkipRecord& o) const {
    return std::tie(test_case, kind, reason) < std::tie(o.test_case, o.kind, o.reason);
  }
};

// The program's skips, filled by skip_case and read by doctest_main.cpp's
// listener, which also sets current_case.
struct SkipRegistry {
  std::mutex mu;
  std::string current_case;
  std::vector<SkipRecord> skips;  // in order, each (case, kind, reason) once
  std::set<std::string> skipped_cases;
};

inline SkipRegistry& skip_registry() {
  static SkipRegistry r;
  return r;
}

// The outcome of a skip of `kind`: "" to skip, else the failure message
// (CI=true and a kind CI machines must meet).
inline std::string skip_failure(SkipKind kind, const std::string& reason, bool ci) {
  const SkipKindInfo info = skip_kind_info(kind);
  if (!ci || !info.ci_must_meet) return "";
  return std::string("CI=true and this case would skip for want of ") + info.needs + ": " + reason +
         "\n  CI machines must have it: fix the machine (or unset CI to allow the skip)";
}

// Records a skip of the running case, or fails it (see skip_failure). The
// caller returns right after: DTRAIN_SKIP does both.
inline void skip_case(SkipKind kind, const std::string& reason) {
  if (const std::string fail = skip_failure(kind, reason, ci_mode()); !fail.empty()) FAIL(fail);
  auto& r = skip_registry();
  std::lock_guard<std::mutex> lock(r.mu);
  SkipRecord rec{r.current_case, skip_kind_info(kind).name, reason};
  for (const auto& s : r.skips)
    if (!(s < rec) && !(rec < s)) return;
  r.skips.push_back(rec);
  r.skipped_cases.insert(rec.test_case);
  MESSAGE("skipped (" << rec.kind << "): " << reason);
}

}  // namespace dtrain::testing

// Skip the running case (return from it) for want of `kind`; `reason` is a
// stream expression: DTRAIN_SKIP(blas, "BLAS here is " << name).
#define DTRAIN_SKIP(kind, reason)                                            \
  do {                                                                       \
    std::ostringstream dtrain_skip_reason_;                                  \
    dtrain_skip_reason_ << reason;                                           \
    ::dtrain::testing::skip_case(::dtrain::testing::SkipKind::kind,          \
                                 dtrain_skip_reason_.str());                 \
    return;                                                                  \
  } while (0)
