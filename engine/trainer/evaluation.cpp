// evaluate and run_evaluation (evaluation.h): the validation sources (one,
// or data.valid.blend's files and their shares of the windows), the windows
// of each dp rank, the forward through the Schedule with autograd and
// dropout off, the world sum of per-token losses and tokens; and the
// worker's `dtrain eval` mode around it.
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
#include "engine/data/indexed_blend.h"
#include "engine/parallel/autocast_scope.h"
#include "engine/trainer/metrics.h"
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

std::vector<EvalSource> eval_sources(const JobSpec& spec, const data::TokenDataset& train, int64_t windows) {
  std::vector<EvalSource> out;
  const std::vector<DataSource>& blend = spec.data.valid.blend;
  if (blend.empty()) {
    out.push_back(eval_source(spec, train, windows));
    out.back().windows = windows;
    return out;
  }
  std::vector<double> weights;
  for (const DataSource& b : blend) weights.push_back(b.weight);
  const std::vector<int64_t> drawn = data::BlendSchedule(weights).drawn_before(windows);  // n_j
  for (size_t j = 0; j < blend.size(); ++j) {
    EvalSource src;
    const std::string field = "data.valid.blend[" + std::to_string(j) + "]";
    src.what = field + " = " + blend[j].path;
    try {
      src.owned = data::open_dataset(to_string(spec.data.format), blend[j].path, spec.model.seq_len,
                                     spec.model.vocab, spec.job.seed);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::config) throw;
      throw Error(ErrorCode::config, field + ".path = " + blend[j].path + ": " + e.message(), e.hint());
    }
    src.data = src.owned.get();
    src.available = src.data->num_samples();
    src.windows = drawn[j];
    // The base name, as data_tokens names data.blend's sources (a repeat gets #j).
    src.name = std::filesystem::path(blend[j].path).filename().string();
    for (const EvalSource& other : out)
      if (other.name == src.name) src.name += "#" + std::to_string(j);
    if (src.windows > src.available)
      throw Error(ErrorCode::config,
                  "data.valid.batches = " + std::to_string(windows) + " draws " + std::to_string(src.windows) +
                      " windows from " + src.what + " (weight " + fmt::format("{:g}", blend[j].weight) +
                      "), but it holds " + std::to_string(src.available) + " windows of model.seq_len + 1 = " +
                      std::to_string(spec.model.seq_len + 1) + " tokens",
                  "lower data.valid.batches (or --batches), lower its weight, or give it a longer file");
    out.push_back(std::move(src));
  }
  return out;
}

namespace {

// The world sums of per-token losses and of tokens over src's windows (see
// evaluate); checks that every window's tokens were counted once.
std::pair<double, int64_t> world_sums(TrainSession& s, const EvalSource& src, int64_t windows) {
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
  const auto tokens = int64_t(std::llround(t[1].item<double>()));
  if (tokens != windows * s.spec.model.seq_len)
    throw Error(ErrorCode::internal, "evaluation counted " + std::to_string(tokens) + " tokens, expected " +
                                         std::to_string(windows) + " windows x " +
                                         std::to_string(s.spec.model.seq_len));
  return {t[0].item<double>(), tokens};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

EvalResult evaluate(TrainSession& s, const EvalSource& src, int64_t windows) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto [loss_sum, tokens] = world_sums(s, src, windows);
  EvalResult r;
  r.tokens = tokens;
  r.loss = loss_sum / double(r.tokens);
  r.ppl = std::exp(r.loss);
  r.seconds = seconds_since(t0);
  return r;
}

EvalResult evaluate(TrainSession& s, const std::vector<EvalSource>& sources) {
  const auto t0 = std::chrono::steady_clock::now();
  double loss_sum = 0;
  EvalResult r;
  for (const EvalSource& src : sources) {
    if (src.windows < 1) continue;  // a blend file none of the windows came from
    const auto [sum, tokens] = world_sums(s, src, src.windows);
    loss_sum += sum;
    r.tokens += tokens;
    if (!src.name.empty()) r.by_source.emplace_back(src.name, sum / double(tokens));
  }
  r.loss = loss_sum / double(r.tokens);
  r.ppl = std::exp(r.loss);
  r.seconds = seconds_since(t0);
  return r;
}

std::vector<EvalSource> open_validation(const TrainSession& s, int64_t windows) {
  std::vector<EvalSource> sources = eval_sources(s.spec, *s.data, windows);
  if (s.is_log_rank())
    for (const EvalSource& src : sources)
      if (src.windows < 1)
        DTRAIN_WARN("{} gets none of the {} validation windows (data.valid.batches) by its weight, so it has no "
                    "val_loss_by_source; raise data.valid.batches or its weight",
                    src.what, windows);
  return sources;
}

int run_evaluation() {
  auto session = make_train_session();
  TrainSession& s = *session;
  const std::string& dir = s.info.eval.ckpt;
  const int64_t windows = s.info.eval.windows;
  checkpoint::TrainState state{&s.spec,           &s.info,        &s.comm->control(), s.state.get(),
                               s.optimizer.get(), s.sampler.get(), &s.schedule,       s.device};
  const int64_t step = checkpoint::load_model(state, dir);
  const std::vector<EvalSource> sources = open_validation(s, windows);
  const std::string what = s.spec.data.valid.blend.empty() ? sources[0].what : "data.valid.blend";
  if (s.is_log_rank()) DTRAIN_INFO("eval: {} at step {}, {} windows of {}", dir, step, windows, what);
  const EvalResult r = evaluate(s, sources);
  if (!s.is_log_rank()) return 0;
  // `dtrain eval --logits-out`: the launcher's DTRAIN_EVAL_LOGITS.
  if (const char* logits = std::getenv("DTRAIN_EVAL_LOGITS"); logits && *logits)
    write_first_logits(s, sources[0], logits);
  DTRAIN_INFO("eval: loss {:.6f}, ppl {:.4f} over {} tokens in {:.0f} ms", r.loss, r.ppl, r.tokens, r.seconds * 1e3);
  for (const auto& [name, loss] : r.by_source) DTRAIN_INFO("eval: {}: loss {:.6f}", name, loss);
  const std::string& out = s.info.eval.out;
  if (out.empty()) return 0;
  std::string json = fmt::format("{{\"loss\": {:.17g}, \"ppl\": {:.17g}, \"tokens\": {}, \"step\": {}", r.loss,
                                 r.ppl, r.tokens, step);
  if (!r.by_source.empty()) {
    json += ", \"loss_by_source\": {";
    for (size_t i = 0; i < r.by_source.size(); ++i) {
      const auto& [name, loss] = r.by_source[i];
      json += fmt::format("{}\"{}\": {:.17g}", i ? ", " : "", json_escaped(name), loss);
    }
    json += "}";
  }
  json += "}\n";
  const std::string tmp = out + ".tmp";
  std::ofstream(tmp) << json;
  std::filesystem::rename(tmp, out);
  return 0;
}

}  // namespace dtrain::engine::trainer
