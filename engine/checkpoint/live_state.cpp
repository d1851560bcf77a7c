// keep_live_state and restore_from_live (live_state.h). The kept state is
// the StateProvider's load entries (model and AdamW moments, by reference),
// the optimizer's step count and the sampler's position; the rounds agree on
// it by two all-reduces (the newest step kept, the layouts' signatures; who
// holds that step), then the lowest holder sends it to the ranks without it.
#include "engine/checkpoint/live_state.h"

#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"

namespace dtrain::engine::checkpoint {
namespace {

struct Kept {
  bool valid = false;
  int64_t lineage = 0;  // the restore it trained on from (lineage() then)
  int64_t step = -1, recorded = -1, optimizer_step = 0, consumed = 0;
  bool log_rank = false;  // rank 0 of the round it was kept in: the one that wrote metrics.jsonl
  int64_t signature = 0;
  std::vector<at::Tensor> tensors;  // load_entries' order
};

Kept& kept() {
  static Kept k;
  return k;
}

// A Lamport clock of restores: every restore of a round (restore_from_live
// runs in each) sets it to one past the largest any of its ranks knew, so
// every rank of a round shares it and a later round's is larger. Two states
// of one step are the same state only when they share it: a worker dropped
// from a round by a short link cut keeps a step that the survivors then
// trained again in a smaller world (the same sums in another order).
int64_t& lineage() {
  static int64_t n = 0;
  return n;
}

// Every entry is its whole global tensor, contiguous, on the CPU: this rank
// holds all of the state (pure data parallelism).
bool whole(const std::vector<parallel::StateEntry>& entries) {
  for (const auto& e : entries) {
    if (!e.tensor.defined() || !e.tensor.device().is_cpu() || !e.tensor.is_contiguous()) return false;
    if (e.tensor.sizes().vec() != e.global_shape || e.slice.size() != e.global_shape.size()) return false;
    for (size_t d = 0; d < e.slice.size(); ++d)
      if (e.slice[d].first != 0 || e.slice[d].second != e.global_shape[d]) return false;
  }
  return !entries.empty();
}

// FNV-1a over the entries' names, shapes and dtypes, in order; 62 bits (its
// negation is an int64 too: the all-reduce checks equality as max == -max(-x)).
int64_t signature(const std::vector<parallel::StateEntry>& entries) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ULL; };
  for (const auto& e : entries) {
    for (char c : e.name) mix(uint8_t(c));
    mix(0xff);
    for (int64_t d : e.global_shape) mix(uint64_t(d));
    mix(uint64_t(e.tensor.scalar_type()));
  }
  return int64_t(h & ((uint64_t(1) << 62) - 1));
}

bool eligible(const TrainState& s, const std::vector<parallel::StateEntry>& entries) {
  const OffloadSpec& off = s.spec->train.offload;
  return s.spec->cluster.live_recovery && s.device.is_cpu() && off.optimizer == OffloadTarget::none &&
         off.params == OffloadTarget::none && whole(entries);
}

std::string list(const std::vector<int>& v) {
  std::string out;
  for (int r : v) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out.empty() ? "none" : out;
}

}  // namespace

void keep_live_state(const TrainState& s, int64_t steps_done, int64_t steps_recorded) noexcept {
  try {
    kept() = Kept{};  // the tensors of an older round go first
    const std::vector<parallel::StateEntry> entries = s.state->load_entries();
    if (!eligible(s, entries)) return;
    Kept k;
    k.lineage = lineage();
    k.step = steps_done;
    k.recorded = steps_recorded;
    k.log_rank = s.info->rank == 0;
    k.optimizer_step = s.optimizer->step_count();
    k.consumed = s.sampler->state().consumed;
    k.signature = signature(entries);
    // detach(): the storage alone, not the parameter's autograd state (its
    // gradient is a view into a DDP bucket, which may go with the session).
    for (const auto& e : entries) k.tensors.push_back(e.tensor.detach());
    k.valid = true;
    kept() = std::move(k);
  } catch (...) {
    kept() = Kept{};
  }
}

int64_t restore_from_live(const TrainState& s, int64_t disk_step) {
  const auto t0 = std::chrono::steady_clock::now();
  Kept mine = std::move(kept());
  kept() = Kept{};
  std::vector<parallel::StateEntry> entries = s.state->load_entries();
  const bool ok = eligible(s, entries);
  const int64_t sig = signature(entries);
  const bool usable = ok && mine.valid && mine.signature == sig;
  comm::Group& g = *s.control;
  // 1. [newest lineage kept, signature, -signature, some rank not eligible,
  //     newest lineage known]: the state is taken from the newest lineage only.
  at::Tensor agree =
      at::tensor({usable ? mine.lineage : int64_t(-1), sig, -sig, int64_t(ok ? 0 : 1), lineage()}, at::kLong);
  g.all_reduce(agree, /*async=*/false, comm::ReduceOp::max);
  const int64_t* a = agree.data_ptr<int64_t>();
  const int64_t newest = a[0];
  lineage() = std::max(a[4], newest) + 1;  // this round's, whatever it restores from
  if (newest < 0 || a[1] != -a[2] || a[3] != 0) return -1;
  // 2. Per rank (a sum: each fills its own slot): its step of the newest
  //    lineage + 1 (0: none), the steps it recorded + 1, whether it was the
  //    log rank (the writer of metrics.jsonl).
  const bool current = usable && mine.lineage == newest;
  const int n = g.size();
  at::Tensor slots = at::zeros({3, n}, at::kLong);  // [3, world]
  int64_t* sl = slots.data_ptr<int64_t>();
  sl[g.rank()] = current ? mine.step + 1 : 0;
  sl[n + g.rank()] = current ? mine.recorded + 1 : 0;
  sl[2 * n + g.rank()] = current && mine.log_rank ? 1 : 0;
  g.all_reduce(slots);
  int64_t step = -1;
  for (int r = 0; r < n; ++r) step = std::max(step, sl[r] - 1);
  bool recorded = false, log_rank_recorded = true;
  int root = -1;
  std::vector<int> holders, receivers;
  for (int r = 0; r < n; ++r) {
    const bool h = sl[r] - 1 == step;
    (h ? holders : receivers).push_back(r);
    if (h && root < 0) root = r;
    if (h && sl[n + r] - 1 == step) recorded = true;
    if (sl[2 * n + r] == 1 && sl[n + r] - 1 < step) log_rank_recorded = false;
  }
  if (step < 0 || step < disk_step) return -1;
  // Some rank that kept the step recorded its metrics, and a kept log rank
  // recorded it too.
  if (!recorded || !log_rank_recorded) {
    if (s.info->rank == 0)
      DTRAIN_WARN("live state of step {} not taken: the round ended in that step's logging, before its metrics "
                  "were recorded; restoring an older copy instead (the step is redone)", step);
    return -1;
  }
  const bool have = current && mine.step == step;
  c10::NoGradGuard no_grad;
  if (have)
    for (size_t i = 0; i < entries.size(); ++i) entries[i].tensor.copy_(mine.tensors[i]);
  at::Tensor meta = at::tensor({mine.optimizer_step, mine.consumed}, at::kLong);
  mine = Kept{};  // the old round's memory goes before any receive
  // Tags far above the restore from memory's (two per old rank from 4096).
  constexpr int kTagBase = 1 << 20;
  std::vector<comm::WorkPtr> works;
  if (g.rank() == root) {
    for (int q : receivers)
      for (size_t i = 0; i < entries.size(); ++i) works.push_back(g.send(entries[i].tensor, q, kTagBase + int(i)));
  } else if (!have) {
    for (size_t i = 0; i < entries.size(); ++i) works.push_back(g.recv(entries[i].tensor, root, kTagBase + int(i)));
  }
  for (auto& w : works) w->wait();
  g.broadcast(meta, root);
  s.optimizer->set_step_count(meta.data_ptr<int64_t>()[0]);
  s.sampler->load_state({meta.data_ptr<int64_t>()[1]});
  if (s.info->rank == 0) {
    uint64_t bytes = 0;
    for (const auto& e : entries) bytes += uint64_t(e.tensor.nbytes());
    DTRAIN_INFO("resuming from step {} (live state: kept in place by rank(s) {}, sent by rank {} to rank(s) {}, "
                "{:.1f} MB each; no copy or checkpoint read; disk has {}) in {:.3f} s",
                step, list(holders), root, list(receivers), double(bytes) / 1e6,
                disk_step < 0 ? "none" : "step " + std::to_string(disk_step),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return step;
}

}  // namespace dtrain::engine::checkpoint
