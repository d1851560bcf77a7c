// run_training (trainer.h): the training loop, in the order of TorchTitan's
// train.py: set up, load, then per step train / log / save. One step is
// grad_accum micro-steps with DDP's no_sync on all but the last, the gradient
// all-reduce, global-norm clipping and the AdamW update. Set-up lives in
// train_session.cpp, printing in metrics.cpp.
#include "engine/trainer/trainer.h"

#include <ATen/autocast_mode.h>
#include <ATen/ops/full.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/log.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/device/device.h"
#include "engine/trainer/train_session.h"

namespace dtrain::engine::trainer {
namespace {

struct StepResult {
  double local_loss_sum = 0;  // sum over micro-steps of the micro-batch mean loss
  double grad_norm = 0;
  double lr = 0;
  double step_s = 0;
  parallel::DdpSyncStats sync;
};

// Clip by the global gradient norm. After Ddp::finish_gradient_sync every dp
// rank holds the full, summed gradient, so this rank's sum of squares IS the
// global one: all-reducing it over dp would count every gradient dp times.
// (Sharded layouts, ZeRO and TP, will all-reduce their partial sums over the
// sharding group instead.) Returns the norm before clipping.
double clip_grad_norm(TrainSession& s) {
  const double norm = std::sqrt(optim::local_grad_sq_norm(s.grads));
  const double max_norm = s.spec.train.grad_clip;
  if (max_norm > 0) optim::scale_grads(s.grads, std::min(1.0, max_norm / (norm + 1e-6)));
  return norm;
}

// train.precision bf16: autocast (torch.autocast's C++ form) around the
// forward: matmuls and attention in bf16, reductions and the loss in fp32;
// parameters, gradients and AdamW stay fp32.
class AutocastScope {
 public:
  AutocastScope(c10::Device d, bool enabled) : type_(d.type()), enabled_(enabled) {
    if (!enabled_) return;
    prev_enabled_ = at::autocast::is_autocast_enabled(type_);
    prev_dtype_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_enabled(type_, true);
    at::autocast::set_autocast_dtype(type_, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!enabled_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, prev_enabled_);
    at::autocast::set_autocast_dtype(type_, prev_dtype_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  c10::DeviceType type_;
  bool enabled_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

StepResult train_step(TrainSession& s, int64_t step, device::StepTimer& timer) {
  timer.start();
  const int ga = s.spec.train.grad_accum;
  const bool bf16 = s.spec.train.precision == "bf16";
  // DESIGN.md section 8: each micro-batch loss is scaled by its share of the
  // global batch, so the DDP SUM of gradients is the 1-process gradient of
  // the global-batch mean loss (micro-batches hold equal token counts).
  const double loss_scale = 1.0 / (double(ga) * double(s.dp->size()));
  StepResult r;
  for (int micro = 0; micro < ga; ++micro) {
    s.ddp->set_grad_sync(micro == ga - 1);  // no_sync for all but the last
    s.data->get_batch(s.sampler->micro_batch_ids(micro), s.inputs, s.targets);
    if (!s.device.is_cpu()) {
      // Async from pinned memory; the host buffers are next written after
      // loss.item() below, which waits for this step's work.
      s.inputs_dev.copy_(s.inputs, /*non_blocking=*/true);
      s.targets_dev.copy_(s.targets, /*non_blocking=*/true);
    }
    at::Tensor loss;
    {
      AutocastScope autocast(s.device, bf16);
      loss = s.model->loss(s.inputs_dev, s.targets_dev);  // [] fp32 mean over B*T
    }
    loss.mul(loss_scale).backward();
    r.local_loss_sum += loss.item<double>();
  }
  r.sync = s.ddp->finish_gradient_sync();
  r.grad_norm = clip_grad_norm(s);
  r.lr = s.schedule.at(step);
  s.optimizer->step(r.lr);
  s.ddp->zero_grad();
  s.sampler->advance();
  r.step_s = timer.stop_s();
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
  return {&s.spec,          &s.info,          &s.comm->control(), s.dp, &s.named_params,
          s.optimizer.get(), s.sampler.get(), &s.schedule,        s.device};
}

int64_t maybe_load_checkpoint(TrainSession& s) { return checkpoint::resume(checkpoint_state(s)); }

// Saves every checkpoint.every steps, after the last step
// and on SIGTERM (preemption); returns true when the loop must stop.
bool maybe_save_checkpoint(TrainSession& s, int64_t steps_done) {
  return checkpoint::after_step(checkpoint_state(s), steps_done);
}

MetricsOptions metrics_options(const TrainSession& s, int64_t start_step) {
  MetricsOptions o;
  o.total_steps = s.spec.train.steps;
  o.every = s.spec.log.every;
  o.tokens_per_step = int64_t(s.spec.global_batch()) * s.spec.model.seq_len;
  const std::string dir = s.info.run_dir.empty() ? s.spec.log.dir : s.info.run_dir;
  if (s.is_log_rank() && !dir.empty()) o.jsonl_path = dir + "/metrics.jsonl";
  o.truncate = start_step == 0 && s.info.restart == 0;
  return o;
}

}  // namespace

int run_training() {
  auto session = make_train_session();
  TrainSession& s = *session;
  int64_t step = maybe_load_checkpoint(s);
  if (step >= s.spec.train.steps && s.is_log_rank())
    DTRAIN_WARN("nothing to train: the checkpoint is at step {} and train.steps = {}; "
                "raise train.steps (--set train.steps=N) or remove checkpoint.dir = {} "
                "to start over", step, s.spec.train.steps, s.spec.checkpoint.dir);
  MetricsLogger metrics(metrics_options(s, step));
  device::StepTimer timer(s.device);
  for (; step < s.spec.train.steps; ++step) {
    StepResult r = train_step(s, step, timer);
    StepReport report{step + 1, 0.0, r.lr, r.grad_norm, r.step_s, r.sync.wait_s,
                      r.sync.launched_in_backward};
    const bool logged = metrics.should_log(step + 1);
    if (logged) report.loss = global_mean_loss(s, r.local_loss_sum);
    metrics.record(report, logged ? s.memory() : MemoryStats{}, s.is_log_rank());
    if (maybe_save_checkpoint(s, step + 1)) return 0;  // preempted, saved
  }
  maybe_dump_parameters(s);
  if (s.is_log_rank()) DTRAIN_INFO("training done: {} steps", s.spec.train.steps);
  return 0;
}

}  // namespace dtrain::engine::trainer
