// run_training (trainer.h): the training loop, in the order of TorchTitan's
// train.py: set up, load, then per step train / log / save. One step is
// grad_accum micro-steps with DDP's no_sync on all but the last, the gradient
// all-reduce, global-norm clipping and the AdamW update. Set-up lives in
// train_session.cpp, printing in metrics.cpp.
#include "engine/trainer/trainer.h"

#include <ATen/ops/full.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/log.h"
#include "engine/checkpoint/checkpoint.h"  // [checkpoint issue]
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

StepResult train_step(TrainSession& s, int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  const int ga = s.spec.train.grad_accum;
  // DESIGN.md section 8: each micro-batch loss is scaled by its share of the
  // global batch, so the DDP SUM of gradients is the 1-process gradient of
  // the global-batch mean loss (micro-batches hold equal token counts).
  const double loss_scale = 1.0 / (double(ga) * double(s.dp->size()));
  StepResult r;
  for (int micro = 0; micro < ga; ++micro) {
    s.ddp->set_grad_sync(micro == ga - 1);  // no_sync for all but the last
    s.data->get_batch(s.sampler->micro_batch_ids(micro), s.inputs, s.targets);
    at::Tensor loss = s.model->loss(s.inputs, s.targets);  // [] mean over B*T
    loss.mul(loss_scale).backward();
    r.local_loss_sum += loss.item<double>();
  }
  r.sync = s.ddp->finish_gradient_sync();
  r.grad_norm = clip_grad_norm(s);
  r.lr = s.schedule.at(step);
  s.optimizer->step(r.lr);
  s.ddp->zero_grad();
  s.sampler->advance();
  r.step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// The mean loss over the whole global batch: the same number whatever the
// layout. Collective over dp: every rank calls it on the same steps.
double global_mean_loss(TrainSession& s, double local_loss_sum) {
  at::Tensor t = at::full({1}, local_loss_sum, at::kDouble);  // [1]
  s.dp->all_reduce(t);
  return t.item<double>() / (double(s.spec.train.grad_accum) * double(s.dp->size()));
}

// [checkpoint issue] The trainer's view for engine/checkpoint: references
// into the session. Resume loads DTRAIN_RESUME_FROM or checkpoint.dir's
// latest (model, optimizer, step, sampler position, RNG states).
checkpoint::TrainState checkpoint_state(TrainSession& s) {
  return {&s.spec, &s.info, &s.comm->world(), s.dp, &s.named_params,
          s.optimizer.get(), s.sampler.get(), &s.schedule};
}

int64_t maybe_load_checkpoint(TrainSession& s) { return checkpoint::resume(checkpoint_state(s)); }

// [checkpoint issue] Saves every checkpoint.every steps, after the last step
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
  for (; step < s.spec.train.steps; ++step) {
    StepResult r = train_step(s, step);
    StepReport report{step + 1, 0.0, r.lr, r.grad_norm, r.step_s, r.sync.wait_s,
                      r.sync.launched_in_backward};
    const bool logged = metrics.should_log(step + 1);
    if (logged) report.loss = global_mean_loss(s, r.local_loss_sum);
    metrics.record(report, logged ? s.memory() : MemoryStats{}, s.is_log_rank());
    if (maybe_save_checkpoint(s, step + 1)) return 0;  // [checkpoint issue] preempted, saved
  }
  maybe_dump_parameters(s);
  if (s.is_log_rank()) DTRAIN_INFO("training done: {} steps", s.spec.train.steps);
  return 0;
}

}  // namespace dtrain::engine::trainer
