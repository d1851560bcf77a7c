// run_training (trainer.h): the training loop, in the order of TorchTitan's
// train.py: set up, load, then per step train / log / save. One step is the
// schedule's micro-steps, the gradient sync's finish and clipping, and the
// AdamW update, then data.valid's evaluation when due (evaluation.h); which
// parallelism runs is parallelize's business, never the loop's. Set-up lives
// in train_session.cpp, printing in metrics.cpp.
#include "engine/trainer/trainer.h"

#include <ATen/ops/full.h>
#include <c10/core/GradMode.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <memory>
#include <optional>

#include "common/log.h"
#include "common/timeline.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/live_state.h"
#include "engine/checkpoint/memory_snapshot.h"
#include "engine/checkpoint/resume_fallback.h"
#include "engine/comm/traced_group.h"
#include "engine/device/counting_allocator.h"
#include "engine/device/device.h"
#include "engine/trainer/current_step.h"
#include "engine/trainer/evaluation.h"
#include "engine/trainer/memory_check.h"
#include "engine/trainer/memory_report.h"
#include "engine/trainer/nonfinite.h"
#include "engine/trainer/op_profile.h"
#include "engine/trainer/straggler.h"
#include "engine/trainer/timeline_clock.h"
#include "engine/trainer/train_session.h"

namespace dtrain::engine::trainer {
namespace {

struct StepResult {
  double local_loss_sum = 0;  // sum over micro-steps of the micro-batch mean loss
  double grad_norm = 0;
  bool finite = true;  // the gradient norm is finite, so the update was applied
  double lr = 0;
  double step_s = 0;
  double blocked_s = 0;  // of step_s, blocked in collectives
  int64_t dp_bytes_sent = 0, tp_bytes_sent = 0, ep_bytes_sent = 0, cp_bytes_sent = 0;
  parallel::SyncStats sync;
  double data_s = 0;  // of step_s, reading samples (get_batch) on this rank
  double copy_wait_s = 0;  // not in step_s: waiting for a checkpoint's host copies (wait_for_host_copies)
};

// Micro-batches from the sampler: this dp rank's slice of the step's global
// batch, staged on the host (pinned with a GPU) and copied to the device.
class SamplerBatches : public parallel::BatchSource {
 public:
  explicit SamplerBatches(TrainSession& s) : s_(s) {}
  void micro_batch(int micro, at::Tensor& inputs, at::Tensor& targets) override {
    timeline::Scope span(timeline::Kind::data, micro);
    const auto t0 = std::chrono::steady_clock::now();
    s_.data->get_batch(s_.sampler->micro_batch_ids(micro), s_.inputs, s_.targets);
    data_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!s_.device.is_cpu()) {
      // Async from pinned memory; the host buffers are next written after the
      // schedule's loss.item(), which waits for this micro-step's work.
      s_.inputs_dev.copy_(s_.inputs, /*non_blocking=*/true);
      s_.targets_dev.copy_(s_.targets, /*non_blocking=*/true);
    }
    inputs = s_.inputs_dev;
    targets = s_.targets_dev;
    if (s_.par.local_batch) s_.par.local_batch(inputs, targets);
  }
  // DistributedSampler's order: dp rank d holds rows [d * mb * ga, (d+1) * mb * ga)
  // of the step's global batch, micro-step m the m-th mb of them.
  int64_t global_rows() const override { return s_.spec.global_batch(); }
  int64_t row_begin(int micro) const override {
    const auto& t = s_.spec.train;
    return int64_t(s_.info.coord[mesh::Axis::dp]) * t.micro_batch * t.grad_accum + int64_t(micro) * t.micro_batch;
  }
  double data_s = 0;  // seconds in get_batch this step

 private:
  TrainSession& s_;
};

StepResult train_step(TrainSession& s, int64_t step, device::StepTimer& timer) {
  device::reset_cpu_peak();  // the step's peak, reported with its metrics
  s.dp->reset_bytes_sent();
  s.comm->group(mesh::GroupKind::tp).reset_bytes_sent();
  s.comm->group(mesh::GroupKind::ep).reset_bytes_sent();
  s.comm->group(mesh::GroupKind::cp).reset_bytes_sent();
  timer.start();
  const int64_t blocked_ns = comm::trace_blocked_ns();
  comm::trace_step(step + 1);
  set_current_step(step + 1);  // for the error file, should this step throw
  checkpoint::fault_in_step(s.spec.fault, s.info, step + 1);  // fault.kind slow: inside the timed step
  parallel::StepOptions opt;
  opt.grad_accum = s.spec.train.grad_accum;
  // docs/ARCHITECTURE.md, 'The parity recipe': each micro-batch loss is scaled by
  // its share of the global batch, so summed gradients are the 1-process gradient
  // of the global-batch mean loss (micro-batches hold equal token counts).
  opt.loss_scale = 1.0 / (double(opt.grad_accum) * double(s.dp->size()));
  opt.bf16 = s.spec.train.precision == Precision::bf16;
  opt.seed = s.spec.job.seed;
  opt.step = step;
  if (checkpoint::nan_grad_in_step(s.spec.fault, s.info, step + 1))
    opt.loss_scale = std::numeric_limits<double>::quiet_NaN();
  SamplerBatches batches(s);
  StepResult r;
  r.local_loss_sum = s.par.schedule->run(s.par.parts, *s.par.grad_sync, batches, opt);
  // The state changes from here on: host copies of the last checkpoint still
  // being taken in the background (during this step's forward and backward) end first.
  r.copy_wait_s = checkpoint::wait_for_host_copies() * 1e-3;
  int64_t span_begin = timeline::recording() ? timeline::now_ns() : 0;
  r.sync = s.par.grad_sync->finish();
  if (span_begin != 0) timeline::record(timeline::Kind::grad_sync, span_begin);
  comm::trace_phase(trace::Phase::optimizer);
  span_begin = timeline::recording() ? timeline::now_ns() : 0;
  double clip_scale = 1.0;  // applied inside the optimizer's update
  r.grad_norm = s.par.grad_sync->clip(s.spec.train.grad_clip, clip_scale);
  r.lr = s.schedule.at(step);
  // The norm is global, the same on every rank (GradSync::clip), and a NaN or
  // inf anywhere in any rank's gradients reaches it through the gradient
  // sync: every rank skips the same updates, so weights and optimizer state
  // stay finite and identical across replicas.
  r.finite = std::isfinite(r.grad_norm);
  s.state_settled = false;  // until the sampler has moved too
  if (r.finite) {
    s.optimizer->step(r.lr, clip_scale);
    s.par.grad_sync->after_optimizer_step();
  }
  s.par.grad_sync->zero();
  if (span_begin != 0) timeline::record(timeline::Kind::optimizer, span_begin);
  s.sampler->advance();
  s.steps_applied = step + 1;
  s.state_settled = true;
  r.step_s = timer.stop_s() - r.copy_wait_s;
  r.data_s = batches.data_s;
  r.blocked_s = double(comm::trace_blocked_ns() - blocked_ns) * 1e-9;
  r.dp_bytes_sent = int64_t(s.dp->bytes_sent());
  r.tp_bytes_sent = int64_t(s.comm->group(mesh::GroupKind::tp).bytes_sent());
  r.ep_bytes_sent = int64_t(s.comm->group(mesh::GroupKind::ep).bytes_sent());
  r.cp_bytes_sent = int64_t(s.comm->group(mesh::GroupKind::cp).bytes_sent());
  return r;
}

// The mean loss over the whole global batch: the same number whatever the
// layout. Collective over dp: every rank calls it on the same steps.
double global_mean_loss(TrainSession& s, double local_loss_sum) {
  at::Tensor t = at::full({1}, local_loss_sum, at::TensorOptions().dtype(at::kDouble).device(s.dp->device()));  // [1]
  s.dp->all_reduce(t);
  return t.item<double>() / (double(s.spec.train.grad_accum) * double(s.dp->size()));
}

// The trainer's view for engine/checkpoint: references
// into the session. Resume loads DTRAIN_RESUME_FROM or checkpoint.dir's
// latest (model, optimizer, step, sampler position, RNG states).
checkpoint::TrainState checkpoint_state(TrainSession& s) {
  return {&s.spec,    &s.info,           &s.comm->control(), s.state.get(),
          s.optimizer.get(), s.sampler.get(), &s.schedule,       s.device, &s.preemption};
}

int64_t maybe_load_checkpoint(TrainSession& s) { return checkpoint::resume(checkpoint_state(s)); }

// Saves every checkpoint.every steps, after the last step
// and on SIGTERM (preemption), never after a non-finite step; returns true
// when the loop must stop and what the save cost (checkpoint::StepSave).
checkpoint::StepSave maybe_save_checkpoint(TrainSession& s, int64_t steps_done, bool step_finite) {
  return checkpoint::after_step(checkpoint_state(s), steps_done, step_finite);
}

MetricsOptions metrics_options(const TrainSession& s, int64_t start_step) {
  MetricsOptions o;
  o.total_steps = s.spec.train.steps;
  o.every = s.spec.log.every;
  o.tokens_per_step = int64_t(s.spec.global_batch()) * s.spec.model.seq_len;
  o.flops_per_step = s.flops_per_step;
  o.peak_flops = s.peak.total_flops;
  const std::string dir = s.info.run_dir.empty() ? s.spec.log.dir : s.info.run_dir;
  if (s.is_log_rank() && !dir.empty()) o.jsonl_path = dir + "/metrics.jsonl";
  o.truncate = start_step == 0 && s.info.restart == 0;
  if (s.is_log_rank() && !dir.empty() && s.spec.log.tensorboard) {
    o.tensorboard_dir = dir + "/tb";
    o.spec_yaml = job_spec_to_yaml(s.spec);
    o.start_step = start_step;
  }
  using K = mesh::GroupKind;
  for (K kind : {K::dp, K::tp, K::cp, K::pp, K::ep, K::edp}) {
    const comm::Group& g = s.comm->group(kind);
    if (g.size() > 1) o.comm_paths.emplace_back(mesh::group_name(kind), g.path());
  }
  return o;
}

// data.valid: evaluated every data.valid.every steps and after the last,
// on every rank (evaluate is collective); the figures join that step's report.
struct Validation {
  std::vector<EvalSource> sources;  // empty: no data.valid
  bool due(const JobSpec& spec, int64_t steps_done) const {
    return !sources.empty() && (steps_done % spec.data.valid.every == 0 || steps_done == spec.train.steps);
  }
  void run(TrainSession& s, StepReport& report) const {
    comm::trace_phase(trace::Phase::forward);
    const EvalResult v = evaluate(s, sources);
    report.evaluated = true;
    report.val_loss = v.loss;
    report.val_ppl = v.ppl;
    report.eval_ms = v.seconds * 1e3;
    report.val_loss_by_source = v.by_source;
  }
};

}  // namespace

int run_training() {
  auto session = make_train_session(/*skip_init_if_restoring=*/true);
  TrainSession& s = *session;
  const checkpoint::AsyncSaveScope async_saves(*s.comm, s.spec);  // a write in flight ends before the groups
  const checkpoint::MemoryCopyScope memory_copies(*s.comm, s.spec);  // so does an in-memory copy
  const checkpoint::BackgroundVerifyScope disk_check;  // and a check of disk's `latest` after a restore from memory
  int64_t step = maybe_load_checkpoint(s);
  if (s.init_skipped && step == 0) {  // nothing restored after all (the same on every rank): draw, look again
    if (s.is_log_rank())
      DTRAIN_INFO("no checkpoint or in-memory copy was restored: the weights are drawn from job.seed after all");
    rebuild_drawn(s);
    step = maybe_load_checkpoint(s);
  }
  s.steps_applied = step;
  s.steps_recorded = step;
  s.state_settled = true;
  // A round that ends under the loop (recovery in place: its notice makes a
  // collective throw) leaves the state as the last completed step left it;
  // kept for the next round of this process (checkpoint/live_state.h).
  struct KeepOnUnwind {
    TrainSession& s;
    const int uncaught = std::uncaught_exceptions();
    ~KeepOnUnwind() {
      if (std::uncaught_exceptions() > uncaught && s.state_settled)
        checkpoint::keep_live_state(checkpoint_state(s), s.steps_applied, s.steps_recorded);
    }
  } keep_on_unwind{s};
  if (step >= s.spec.train.steps && s.is_log_rank())
    DTRAIN_WARN("nothing to train: the checkpoint is at step {} and train.steps = {}; "
                "raise train.steps (--set train.steps=N) or remove checkpoint.dir = {} "
                "to start over", step, s.spec.train.steps, s.spec.checkpoint.dir);
  MetricsLogger metrics(metrics_options(s, step));
  comm::trace_run_start(step, int64_t(s.spec.global_batch()) * s.spec.model.seq_len);
  device::StepTimer timer(s.device);
  int64_t run_peak = 0;  // the largest step peak, for the memory report
  StepBytes last_bytes;  // the last step's, for the memory report
  const MemoryCheck memory_check(s.spec, s.info.rank, s.device.is_cpu());  // the planner vs this rank
  NonfiniteWatch nonfinite(s.spec);
  start_timeline(s);
  const std::unique_ptr<OpProfile> op_profile = OpProfile::from_env(s.info.rank);  // DTRAIN_OP_PROFILE
  const int64_t first_step = step;
  std::optional<LivePeak> live_peak;  // log.live_peak
  if (s.spec.log.live_peak) live_peak.emplace(s.spec);
  Validation validation;
  if (s.spec.data.valid.active()) validation.sources = open_validation(s, s.spec.data.valid.batches);
  // Set-up's freed heap (a model built whole before it was sharded, shards
  // moved to an offload store, a checkpoint's read buffers) goes back to the
  // OS: the worker keeps freed heap memory for reuse (no trim), so these
  // pages would otherwise stay in its RSS through every step.
  ::malloc_trim(0);
  for (; step < s.spec.train.steps; ++step) {
    timeline::begin_step(int(step + 1));  // the step's span ends after its checkpoint
    if (op_profile) op_profile->before_step(step - first_step);
    StepResult r = train_step(s, step, timer);
    if (live_peak) live_peak->sample();  // after the step's time was taken
    offload_fault_after_step(s, step + 1);
    run_peak = std::max(run_peak, measured_peak_bytes());
    last_bytes = {r.dp_bytes_sent, r.tp_bytes_sent, r.ep_bytes_sent, r.cp_bytes_sent};
    StepReport report{step + 1, 0.0, r.lr, r.grad_norm, r.step_s, r.sync.wait_s,
                      r.sync.launched_in_backward, r.dp_bytes_sent, r.tp_bytes_sent};
    report.extra = s.par.grad_sync->step_metrics();
    // After advance(): the tokens of steps 1..step+1, a function of the position alone.
    report.data_tokens = s.data->source_tokens(s.sampler->state().consumed);
    report.extra.emplace_back("data_fetch_s", r.data_s);
    optim::OffloadFile* params_off = s.par.grad_sync->offloaded_params();
    if (s.optimizer->offload_store() || params_off) {  // where the offloaded state lives, and this step's I/O on it
      optim::OffloadIo io = s.optimizer->take_offload_io();
      const optim::OffloadIo pio = params_off ? params_off->take_stats() : optim::OffloadIo{};
      io.io_s += pio.io_s;
      io.wait_s += pio.wait_s;
      io.update_s += pio.update_s;
      const int64_t bytes = s.optimizer->offloaded_bytes() + (params_off ? params_off->bytes() : 0);
      report.extra.emplace_back("offload_bytes", double(bytes));
      report.extra.emplace_back("offload_io_ms", io.io_s * 1e3);
      report.extra.emplace_back("offload_wait_ms", io.wait_s * 1e3);
      report.extra.emplace_back("offload_update_ms", io.update_s * 1e3);
    }  // rank 0's; bench/data_prepare.sh compares it to step_time_s
    const bool evaluated = validation.due(s.spec, step + 1);  // the same on every rank
    if (evaluated) validation.run(s, report);
    // A non-finite step is always logged: every rank knows it (r.finite is
    // global), so the logging collectives stay matched.
    const bool logged = metrics.should_log(step + 1) || !r.finite || evaluated;
    comm::trace_phase(trace::Phase::logging);
    if (logged) report.loss = global_mean_loss(s, r.local_loss_sum);
    if (logged && !std::isfinite(report.loss)) r.finite = false;  // the same reduced loss on every rank
    report.nonfinite = !r.finite;
    if (logged && live_peak)  // collective: every rank logs the same steps
      report.live_peak_flops = live_peak->take_total_flops(s.device, s.info.local_world, s.comm->control());
    if (logged) {
      const StragglerStats st = straggler_stats(s.comm->control(), r.step_s - r.blocked_s);
      report.slowest_rank = st.slowest_rank;
      report.straggler_ratio = st.ratio;
      if (st.ratio > kStragglerWarnRatio && s.is_log_rank())
        DTRAIN_WARN("straggler: rank {} computes {:.0f} ms per step, {:.2f}x the median {:.0f} ms",
                    st.slowest_rank, st.slowest_s * 1e3, st.ratio, st.median_s * 1e3);
    }
    metrics.record(report, logged ? s.memory() : MemoryStats{}, s.is_log_rank());
    s.steps_recorded = step + 1;
    comm::trace_step_done(step + 1, r.step_s);
    if (logged) comm::trace_logged(report.loss, report.straggler_ratio);
    if (memory_check.due(step + 1)) memory_check.compare(s.memory(), s.is_log_rank());
    nonfinite.observe(step + 1, r.finite, logged ? report.loss : std::nan(""), r.grad_norm, s.is_log_rank());
    comm::trace_phase(trace::Phase::checkpoint);
    const auto save_start = std::chrono::steady_clock::now();  // the blocking part of a save, for goodput
    const checkpoint::StepSave saved = maybe_save_checkpoint(s, step + 1, r.finite);
    comm::trace_checkpoint_s(std::chrono::duration<double>(std::chrono::steady_clock::now() - save_start).count() +
                             r.copy_wait_s);
    // ckpt_block_ms: the loop stopped for checkpoints (a whole synchronous
    // save; an async one's copies, wait for a previous write, commit);
    // ckpt_write_ms: the rank file's write (this step's synchronous save, or
    // the async save committed at this step); memory_copy_ms: an in-memory
    // copy's background time, at the step its writer is found done. A record
    // of its own: the step's record is written before the save, which may crash.
    // The wait for the last copies (r.copy_wait_s) counts as this step's.
    if (saved.block_ms >= 0 || r.copy_wait_s > 0)
      metrics.record_checkpoint(step + 1, std::max(saved.block_ms, 0.0) + r.copy_wait_s * 1e3, saved.write_ms,
                                saved.memory_copy_ms, s.is_log_rank());
    if (const std::string path = timeline::end_step(); !path.empty() && s.is_log_rank())
      DTRAIN_INFO("log.trace: wrote {} (and every rank its own); `dtrain trace merge {} OUT.json`", path,
                  s.info.run_dir.empty() ? s.spec.log.dir : s.info.run_dir);
    if (saved.stop) return 0;  // preempted, saved
  }
  if (op_profile) op_profile->write();
  if (const std::string what = s.par.schedule->summary(); !what.empty()) DTRAIN_INFO("{}", what);
  comm::trace_phase(trace::Phase::done);
  write_memory_report(s, run_peak, last_bytes);
  if (s.is_log_rank()) DTRAIN_INFO("training done: {} steps", s.spec.train.steps);
  return 0;
}

}  // namespace dtrain::engine::trainer
