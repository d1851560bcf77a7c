// OpProfile (op_profile.h): a global RecordFunction callback pair, a
// thread-local stack of open scopes (self time = total minus the children's
// totals), sums by "operator <- caller" under one mutex.
#include "engine/trainer/op_profile.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/log.h"

namespace dtrain::engine::trainer {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Frame {
  const at::RecordFunction* fn;
  int64_t start_ns;
  int64_t child_ns;
  std::string shapes;  // DTRAIN_OP_PROFILE_SHAPES=1: " [sizes, ...]" of the tensor inputs
};

struct Sum {
  int64_t calls = 0, self_ns = 0, total_ns = 0;
};

std::atomic<bool> g_on{false};
bool g_shapes = false;  // DTRAIN_OP_PROFILE_SHAPES=1: the tensor inputs' sizes in the key
std::mutex g_mu;
std::unique_ptr<std::unordered_map<std::string, Sum>> g_sums;  // the live OpProfile's
thread_local std::vector<Frame> t_stack;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (!g_on.load(std::memory_order_relaxed)) return nullptr;
  std::string shapes;
  if (g_shapes) {  // the inputs are only there during the start callback
    shapes = " [";
    bool first = true;
    for (const c10::IValue& v : fn.inputs()) {
      if (!v.isTensor() || !v.toTensor().defined()) continue;
      shapes += first ? "" : ", ";
      first = false;
      shapes += c10::str(v.toTensor().sizes());
    }
    shapes += "]";
  }
  t_stack.push_back({&fn, now_ns(), 0, std::move(shapes)});
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (t_stack.empty() || t_stack.back().fn != &fn) return;  // opened while off
  const int64_t end = now_ns();
  const Frame f = std::move(t_stack.back());
  t_stack.pop_back();
  const int64_t total = end - f.start_ns;
  std::string key = fn.name();
  key += f.shapes;
  key += " <- ";
  key += t_stack.empty() ? "(step)" : t_stack.back().fn->name();
  if (!t_stack.empty()) t_stack.back().child_ns += total;
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_sums) return;
  Sum& s = (*g_sums)[key];
  ++s.calls;
  s.total_ns += total;
  s.self_ns += total - f.child_ns;
}

}  // namespace

std::unique_ptr<OpProfile> OpProfile::from_env(int rank) {
  const char* dir = std::getenv("DTRAIN_OP_PROFILE");
  if (!dir || !*dir) return nullptr;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // a failure shows at write()
  return std::unique_ptr<OpProfile>(
      new OpProfile(std::string(dir) + "/op_profile_rank_" + std::to_string(rank) + ".txt", rank));
}

OpProfile::OpProfile(std::string path, int rank) : path_(std::move(path)), rank_(rank) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_sums = std::make_unique<std::unordered_map<std::string, Sum>>();
  }
  const char* shapes = std::getenv("DTRAIN_OP_PROFILE_SHAPES");
  g_shapes = shapes && std::string(shapes) == "1";
  handle_ = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                      .needsInputs(g_shapes)
                                      .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                               at::RecordScope::USER_SCOPE}));
}

OpProfile::~OpProfile() {
  write();
  at::removeCallback(handle_);
  std::lock_guard<std::mutex> lock(g_mu);
  g_sums.reset();
}

void OpProfile::before_step(int64_t step) {
  if (written_ || step < 1) return;
  if (!g_on.load()) begin_ns_ = now_ns();
  g_on.store(true);
  ++steps_;
}

void OpProfile::write() {
  if (written_) return;
  written_ = true;
  g_on.store(false);
  const int64_t wall = begin_ns_ > 0 ? now_ns() - begin_ns_ : 0;
  std::vector<std::pair<std::string, Sum>> rows;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_sums) rows.assign(g_sums->begin(), g_sums->end());
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.self_ns > b.second.self_ns; });
  FILE* f = std::fopen(path_.c_str(), "w");
  if (!f) {
    DTRAIN_WARN("DTRAIN_OP_PROFILE: cannot write {}", path_);
    return;
  }
  const double steps = double(std::max<int64_t>(steps_, 1)), per = 1e6 * steps;  // ns -> ms per step
  int64_t self_sum = 0;
  for (const auto& r : rows) self_sum += r.second.self_ns;
  std::fprintf(f, "# DTRAIN_OP_PROFILE, rank %d: %lld steps recorded (the first left out), %.2f wall ms per step,\n",
               rank_, static_cast<long long>(steps_), double(wall) / per);
  std::fprintf(f, "# %.2f ms per step inside operators (self times summed); wall time through ATen's RecordFunction\n",
               double(self_sum) / per);
  std::fprintf(f, "%10s %7s %10s %10s  %s\n", "self_ms", "self_%", "total_ms", "calls", "operator <- caller");
  for (const auto& [key, s] : rows)
    std::fprintf(f, "%10.3f %7.2f %10.3f %10.1f  %s\n", double(s.self_ns) / per,
                 wall > 0 ? 100.0 * double(s.self_ns) / double(wall) : 0.0, double(s.total_ns) / per,
                 double(s.calls) / steps, key.c_str());
  std::fclose(f);
}

}  // namespace dtrain::engine::trainer
