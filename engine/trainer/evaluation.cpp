// evaluate and run_evaluation (evaluation.h): the validation windows of
// each dp rank, the forward through the Schedule with autograd and dropout
// off, the world sum of per-token losses and tokens; and the worker's
// `dtrain eval` mode around it.
#include "engine/trainer/evaluation.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/tensor.h>

#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "common/log.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/parallel/autocast_scope.h"
#include "engine/trainer/train_session.h"

namespace dtrain::engine::trainer {
namespace {

// Micro-batch g of the evaluation: this dp rank's rows of round g, window
// ids clamped to the last one (the filler rows are not counted).
class WindowBatches : public parallel::BatchSource {
 public:
  WindowBatches(TrainSession& s, const EvalSource& src, int64_t windows) : s_(s), src_(src), windows_(windows) {}
  void micro_batch(int micro, at::Tensor& inputs, at::Tensor& targets) override {
    const int mb = s_.spec.train.micro_batch;
    std::vector<int64_t> ids(static_cast<size_t>(mb));
    for (int j = 0; j < mb; ++j) ids[size_t(j)] = src_.first + std::min(first_row(micro) + j, windows_ - 1);
    src_.data->get_batch(ids, s_.inputs, s_.targets);
    if (!s_.device.is_cpu()) {
      s_.inputs_dev.copy_(s_.inputs);
      s_.targets_dev.copy_(s_.targets);
    }
    inputs = s_.inputs_dev;
    targets = s_.targets_dev;
    if (s_.par.local_batch) s_.par.local_batch(inputs, targets);
  }
  int64_t global_rows() const override { return int64_t(s_.spec.train.micro_batch) * s_.info.mesh.dp(); }
  int64_t row_begin(int) const override {
    return int64_t(s_.info.coord[mesh::Axis::dp]) * s_.spec.train.micro_batch;
  }
  // The window index of micro-batch `micro`'s first row on this dp rank.
  int64_t first_row(int micro) const { return int64_t(micro) * global_rows() + row_begin(micro); }

 private:
  TrainSession& s_;
  const EvalSource& src_;
  int64_t windows_;
};

// The logits [T, V] of window src.first as float32 .npy (version 1.0, C
// order) at `path`: what a reference implementation's forward is compared
// with. One-rank meshes only (`dtrain eval` refuses --logits-out otherwise),
// so the model here is the whole model.
void write_first_logits(TrainSession& s, const EvalSource& src, const std::string& path) {
  const std::vector<int64_t> ids(size_t(s.spec.train.micro_batch), src.first);
  src.data->get_batch(ids, s.inputs, s.targets);
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    const bool was_training = s.par.parts.model->is_training();
    s.par.parts.model->eval();
    parallel::AutocastScope autocast(s.device.type(), s.spec.train.precision == Precision::bf16);
    logits = s.par.parts.model->forward(s.inputs.to(s.device))[0].to(at::kCPU, at::kFloat).contiguous();  // [T, V]
    if (was_training) s.par.parts.model->train();
  }
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}",
                                   logits.size(0), logits.size(1));
  header.append(63 - (10 + header.size()) % 64, ' ');  // magic + lengths + header + '\n': a multiple of 64
  header += '\n';
  const uint16_t len = uint16_t(header.size());
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&len), 2);  // little-endian hosts only, as the rest of dtrain
  out << header;
  out.write(static_cast<const char*>(logits.data_ptr()), std::streamsize(logits.numel() * 4));
  out.close();
  if (!out) throw Error(ErrorCode::internal, "could not write the logits to " + tmp);
  std::filesystem::rename(tmp, path);
}

}  // namespace

int64_t training_windows(const JobSpec& spec, int64_t windows) {
  const double split = spec.data.valid.split;
  if (split <= 0) return windows;
  const auto held = int64_t(std::floor(double(windows) * split));
  if (held < 1)
    throw Error(ErrorCode::config,
                fmt::format("data.valid.split = {} of data.path's ", split) + std::to_string(windows) +
                    " windows of model.seq_len + 1 tokens holds out none",
                fmt::format("raise data.valid.split to at least {:.3g}", 1.0 / double(windows)) +
                    ", or give data.valid.path a file");
  return windows - held;
}

EvalSource eval_source(const JobSpec& spec, const data::TokenDataset& train, int64_t windows) {
  EvalSource src;
  const ValidSpec& v = spec.data.valid;
  if (!v.path.empty()) {
    src.owned = data::open_dataset(to_string(spec.data.format), v.path, spec.model.seq_len, spec.model.vocab,
                                   spec.job.seed);
    src.data = src.owned.get();
    src.available = src.data->num_samples();
    src.what = "data.valid.path = " + v.path;
  } else {
    src.data = &train;
    // The held-out tail (data.valid.split), or with no split (`dtrain eval`
    // of a spec without data.valid) data.path from its first window.
    src.first = v.split > 0 ? training_windows(spec, train.num_samples()) : 0;
    src.available = train.num_samples() - src.first;
    src.what = v.split > 0 ? fmt::format("data.valid.split = {} of data.path = {}", v.split, spec.data.path)
                           : "data.path = " + spec.data.path;
  }
  if (windows > src.available)
    throw Error(ErrorCode::config,
                "data.valid.batches = " + std::to_string(windows) + " windows, but " + src.what + " holds " +
                    std::to_string(src.available) + " windows of model.seq_len + 1 = " +
                    std::to_string(spec.model.seq_len + 1) + " tokens",
                "use at most " + std::to_string(src.available) + " (--batches, data.valid.batches)");
  return src;
}

EvalResult evaluate(TrainSession& s, const EvalSource& src, int64_t windows) {
  const auto t0 = std::chrono::steady_clock::now();
  WindowBatches batches(s, src, windows);
  parallel::EvalOptions opt;
  opt.bf16 = s.spec.train.precision == Precision::bf16;
  const int mb = s.spec.train.micro_batch;
  for (int g = 0; batches.first_row(g) - batches.row_begin(g) < windows; ++g)
    opt.rows.push_back(int(std::clamp<int64_t>(windows - batches.first_row(g), 0, mb)));
  parallel::EvalSums sums;
  {
    at::NoGradGuard no_grad;
    // Dropout off (model.eval semantics); the training mode is restored after.
    const bool was_training = s.par.parts.model->is_training();
    s.par.parts.model->eval();
    try {
      sums = s.par.schedule->evaluate(s.par.parts, batches, opt);
    } catch (...) {
      if (was_training) s.par.parts.model->train();
      throw;
    }
    if (was_training) s.par.parts.model->train();
  }
  at::Tensor t = at::tensor({sums.loss_sum, sums.tokens}, at::TensorOptions().dtype(at::kDouble));  // [2]
  s.comm->control().all_reduce(t);
  EvalResult r;
  r.tokens = int64_t(std::llround(t[1].item<double>()));
  if (r.tokens != windows * s.spec.model.seq_len)
    throw Error(ErrorCode::internal, "evaluation counted " + std::to_string(r.tokens) + " tokens, expected " +
                                         std::to_string(windows) + " windows x " +
                                         std::to_string(s.spec.model.seq_len));
  r.loss = t[0].item<double>() / double(r.tokens);
  r.ppl = std::exp(r.loss);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

int run_evaluation() {
  auto session = make_train_session();
  TrainSession& s = *session;
  const std::string& dir = s.info.eval.ckpt;
  const int64_t windows = s.info.eval.windows;
  checkpoint::TrainState state{&s.spec,           &s.info,        &s.comm->control(), s.state.get(),
                               s.optimizer.get(), s.sampler.get(), &s.schedule,       s.device};
  const int64_t step = checkpoint::load_model(state, dir);
  const EvalSource src = eval_source(s.spec, *s.data, windows);
  if (s.is_log_rank()) DTRAIN_INFO("eval: {} at step {}, {} windows of {}", dir, step, windows, src.what);
  const EvalResult r = evaluate(s, src, windows);
  if (!s.is_log_rank()) return 0;
  // `dtrain eval --logits-out`: the launcher's DTRAIN_EVAL_LOGITS.
  if (const char* logits = std::getenv("DTRAIN_EVAL_LOGITS"); logits && *logits) write_first_logits(s, src, logits);
  DTRAIN_INFO("eval: loss {:.6f}, ppl {:.4f} over {} tokens in {:.0f} ms", r.loss, r.ppl, r.tokens, r.seconds * 1e3);
  const std::string& out = s.info.eval.out;
  if (out.empty()) return 0;
  char json[256];
  std::snprintf(json, sizeof json, "{\"loss\": %.17g, \"ppl\": %.17g, \"tokens\": %lld, \"step\": %lld}\n", r.loss,
                r.ppl, static_cast<long long>(r.tokens), static_cast<long long>(step));
  const std::string tmp = out + ".tmp";
  std::ofstream(tmp) << json;
  std::filesystem::rename(tmp, out);
  return 0;
}

}  // namespace dtrain::engine::trainer
