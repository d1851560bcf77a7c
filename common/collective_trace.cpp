// The reader of collective trace files (collective_trace.h). The writer is
// engine/comm/traced_group.cpp; both use the layout of FileLayout.
#include "common/collective_trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <memory>

namespace dtrain::trace {
namespace {

std::string text(const char* field, size_t size) { return std::string(field, strnlen(field, size)); }

template <class T>
T load(const T& v) {
  return __atomic_load_n(&v, __ATOMIC_ACQUIRE);
}

// A consistent copy of one ring record, or false when it is being written.
bool copy_record(const Record& r, Collective* out) {
  const uint64_t before = load(r.stamp);
  if (before == 0 || (before & 1)) return false;
  Collective c;
  c.group = text(r.group, sizeof r.group);
  c.op = text(r.op, sizeof r.op);
  c.seq = load(r.seq);
  c.bytes = load(r.bytes);
  c.enter_ns = load(r.enter_ns);
  c.leave_ns = load(r.leave_ns);
  if (load(r.stamp) != before) return false;
  *out = c;
  return true;
}

}  // namespace

const char* phase_name(uint32_t phase) {
  switch (static_cast<Phase>(phase)) {
    case Phase::init: return "init";
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
    case Phase::logging: return "logging";
    case Phase::checkpoint: return "checkpoint";
    case Phase::done: return "done";
  }
  return "unknown";
}

std::string trace_path(const std::string& run_dir, int rank) {
  return run_dir + "/collectives/rank_" + std::to_string(rank) + ".trace";
}

bool read_progress(const std::string& path, RankProgress* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // A plain read sees what the writer's MAP_SHARED stores put in the page
  // cache; the copy is then taken apart field by field.
  auto file = std::make_unique<FileLayout>();
  ssize_t got = ::pread(fd, file.get(), sizeof(FileLayout), 0);
  ::close(fd);
  if (got != static_cast<ssize_t>(sizeof(FileLayout)) ||
      std::memcmp(file->magic, kMagic, sizeof kMagic) != 0)
    return false;
  RankProgress p;
  p.rank = file->rank;
  p.entered = load(file->entered);
  p.completed = load(file->completed);
  p.step = load(file->step);
  p.phase = phase_name(load(file->phase));
  const uint32_t ngroups = std::min(load(file->ngroups), kMaxGroups);
  for (uint32_t g = 0; g < ngroups; ++g)
    p.group_entered.emplace_back(text(file->groups[g].name, sizeof file->groups[g].name),
                                 load(file->groups[g].entered));
  // The collective it is blocked in (if its record is still in the ring),
  // and the newest one completed.
  const uint64_t blocked = load(file->blocked);
  if (blocked != 0 && blocked + kRingSize > p.entered) {
    const Record& r = file->ring[(blocked - 1) % kRingSize];
    Collective c;
    if (load(r.stamp) == 2 * blocked && copy_record(r, &c) && c.leave_ns == 0) {
      p.waiting = true;
      p.pending = c;
    }
  }
  const uint64_t first = p.entered > kRingSize ? p.entered - kRingSize + 1 : 1;
  for (uint64_t n = first; n <= p.entered; ++n) {
    Collective c;
    if (!copy_record(file->ring[(n - 1) % kRingSize], &c)) continue;
    if (c.leave_ns != 0 && (!p.has_done || c.leave_ns >= p.last_done.leave_ns)) {
      p.has_done = true;
      p.last_done = c;
    }
  }
  p.first_step_ns = load(file->first_step_ns);
  p.start_step = load(file->start_step);
  p.done_step = load(file->done_step);
  p.step_ns = load(file->step_ns);
  p.last_step_ns = load(file->last_step_ns);
  p.checkpoint_ns = load(file->checkpoint_ns);
  p.tokens_per_step = load(file->tokens_per_step);
  const uint64_t loss_bits = load(file->loss_bits), straggler_bits = load(file->straggler_bits);
  std::memcpy(&p.loss, &loss_bits, sizeof p.loss);
  std::memcpy(&p.straggler_ratio, &straggler_bits, sizeof p.straggler_ratio);
  p.has_loss = p.loss == p.loss;  // not NaN
  if (!p.has_loss) p.loss = 0;
  *out = p;
  return true;
}

}  // namespace dtrain::trace
