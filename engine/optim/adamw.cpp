// AdamW, the learning-rate schedule and the gradient-norm helpers of adamw.h.
// The update is torch.optim.AdamW's: on contiguous fp32 CPU tensors one
// fused pass per tensor (decay, both moments, the step: each element read
// and written once, no temporaries); on a GPU ATen's fused multi-tensor
// kernel (_fused_adamw_, torch.optim.AdamW(fused=True)'s); elsewhere
// in-place ATen ops under NoGradGuard. The same formula in fp32.
// Does not all-reduce anything: the caller combines norms across ranks.
#include "engine/optim/adamw.h"

#include "common/error.h"
#include "engine/optim/adamw_kernel.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/full.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>

namespace dtrain::engine::optim {
namespace {

bool fusable(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v) {
  for (const at::Tensor* t : {&p, &g, &m, &v})
    if (!t->device().is_cpu() || t->scalar_type() != at::kFloat || !t->is_contiguous()) return false;
  return p.numel() == g.numel();
}

kernel::AdamWScalars make_fused_step(bool decay, double lr, const AdamWOptions& o, int64_t step,
                                     double grad_scale) {
  const double bias_correction1 = 1.0 - std::pow(o.beta1, double(step));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, double(step)));
  const bool wd = decay && o.weight_decay != 0.0;
  return kernel::AdamWScalars{wd ? float(1.0 - lr * o.weight_decay) : 1.0f,
                              float(o.beta1),
                              float(1.0 - o.beta1),
                              float(o.beta2),
                              float(1.0 - o.beta2),
                              float(bias_correction2_sqrt),
                              float(o.eps),
                              float(-(lr / bias_correction1)),
                              float(grad_scale)};
}

// One piece of an nvme bucket: params[begin, end) with its moments at m and
// v. fp32 CPU parameters and gradients are updated where they are; any other
// is copied to the host, updated there and copied back, synchronously (host
// offload has a path of its own that overlaps the copies: host_update.h).
void offloaded_piece(at::Tensor& p, const at::Tensor& g, int64_t begin, int64_t end, float* m, float* v,
                     const kernel::AdamWScalars& fs) {
  const bool in_place = p.device().is_cpu() && p.scalar_type() == at::kFloat && g.device().is_cpu() &&
                        g.scalar_type() == at::kFloat && g.is_contiguous();
  if (in_place) {
    kernel::adamw_run(p.data_ptr<float>() + begin, g.const_data_ptr<float>() + begin, m, v, end - begin, fs);
    return;
  }
  at::Tensor pv = p.view({-1}).slice(0, begin, end);  // [end - begin]
  at::Tensor ph = pv.to(at::kCPU, at::kFloat).contiguous();
  const at::Tensor gh = g.reshape({-1}).slice(0, begin, end).to(at::kCPU, at::kFloat).contiguous();
  kernel::adamw_run(ph.data_ptr<float>(), gh.const_data_ptr<float>(), m, v, end - begin, fs);
  pv.copy_(ph);
}

// Whether b's element 0 sits right after a's last element.
bool follows(const at::Tensor& a, const at::Tensor& b) {
  return b.data_ptr<float>() == a.data_ptr<float>() + a.numel();
}

// Zeroed moments shaped like params: views into one flat buffer when the
// params share dtype and device, so params that lie end to end (a ZeRO
// shard) have moments that do too and step() updates them in one run.
std::vector<at::Tensor> zero_moments(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  int64_t total = 0;
  bool flat = !params.empty();
  for (const auto& p : params) {
    total += p.numel();
    flat = flat && p.scalar_type() == params[0].scalar_type() && p.device() == params[0].device();
  }
  if (!flat) {
    for (const auto& p : params) out.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    return out;
  }
  at::Tensor all = at::zeros({total}, params[0].options());  // [sum of numel]
  int64_t offset = 0;
  for (const auto& p : params) {
    out.push_back(all.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return out;
}

}  // namespace

AdamW::AdamW(std::vector<at::Tensor> params, std::vector<bool> decay, AdamWOptions options,
             std::vector<at::Tensor> grads)
    : params_(std::move(params)), decay_(std::move(decay)), grads_(std::move(grads)), opt_(options) {
  if (decay_.size() != params_.size() || (!grads_.empty() && grads_.size() != params_.size())) {
    throw Error(ErrorCode::internal, "AdamW: " + std::to_string(params_.size()) + " params but " +
                                         std::to_string(decay_.size()) + " decay flags and " +
                                         std::to_string(grads_.size()) + " grads");
  }
  // State allocated up front (not lazily) so a checkpoint can be loaded into
  // it before the first step.
  m_.reserve(params_.size());
  v_.reserve(params_.size());
  at::NoGradGuard no_grad;
  if (!opt_.allocate_state) return;
  m_ = zero_moments(params_);
  v_ = zero_moments(params_);
}

AdamW::~AdamW() = default;

void AdamW::step(double lr, double grad_scale) {
  grad_scale_ = grad_scale;
  if (store_) return step_offloaded(lr);
  if (m_.size() != params_.size())
    throw Error(ErrorCode::internal, "AdamW: allocate_state false but the moments were never offloaded");
  at::NoGradGuard no_grad;
  ++step_;
  loops_ = 0;
  // Paged parameters (offloaded ZeRO-3 shards) have no data while on file,
  // so runs cannot be found from their pointers: they go tensor by tensor.
  if (opt_.fused && opt_.flat_runs && !pager_.page) return step_runs(lr);
  int open = -1;
  std::vector<size_t> on_device;  // for one _fused_adamw_ per group at the end
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    const at::Tensor& g = grads_.empty() ? p.grad() : grads_[i];
    if (!g.defined()) continue;
    if (!pager_.page && device_fusable(i, g)) {
      on_device.push_back(i);
      continue;
    }
    page_to(int64_t(i), open);
    if (opt_.fused && fusable(p, g, m_[i], v_[i])) {
      ++loops_;
      kernel::adamw_run(p.data_ptr<float>(), g.data_ptr<float>(), m_[i].data_ptr<float>(),
                  v_[i].data_ptr<float>(), p.numel(), make_fused_step(decay_[i], lr, opt_, step_, grad_scale_));
      continue;
    }
    step_one_unfused(i, lr);
  }
  page_to(-1, open);
  step_device_fused(on_device, lr);
}

bool AdamW::device_fusable(size_t i, const at::Tensor& g) const {
  const at::Tensor& p = params_[i];
  if (!opt_.fused || (p.device().is_cpu() && !opt_.device_path_on_cpu)) return false;
  const auto dt = p.scalar_type();
  if (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf) return false;
  // The op's own check (ATen's check_fast_path_restrictions): one device,
  // dtype and layout, the same sizes at each index, dense.
  for (const at::Tensor* t : {&p, &g, &m_[i], &v_[i]})
    if (t->device() != p.device() || t->scalar_type() != dt || !t->is_contiguous() || t->sizes() != p.sizes())
      return false;
  return true;
}

// ATen's fused AdamW over params idx, one call per (decay flag, device,
// dtype): every tensor of a group in one multi-tensor kernel on a GPU where
// the ATen ops would run nine passes per tensor. The gradients are scaled in
// place first (as step_one_unfused; the op's own grad_scale divides, for
// AMP's loss scale). Its step count is a tensor per parameter, read only:
// one tensor holding step_ serves the whole group.
void AdamW::step_device_fused(const std::vector<size_t>& idx, double lr) {
  if (idx.empty()) return;
  std::map<std::tuple<bool, int, int, int>, std::vector<size_t>> groups;  // decay, device type and index, dtype
  for (size_t i : idx) {
    const c10::Device d = params_[i].device();
    groups[{decay_[i], int(d.type()), int(d.index()), int(params_[i].scalar_type())}].push_back(i);
  }
  for (const auto& [key, members] : groups) {
    std::vector<at::Tensor> ps, gs, ms, vs;
    for (size_t i : members) {
      ps.push_back(params_[i]);
      gs.push_back(grads_.empty() ? params_[i].grad() : grads_[i]);
      ms.push_back(m_[i]);
      vs.push_back(v_[i]);
    }
    if (grad_scale_ != 1.0) scale_grads(gs, grad_scale_);
    const at::Tensor step =
        at::full({}, double(step_), at::TensorOptions().dtype(at::kFloat).device(ps.front().device()));
    const std::vector<at::Tensor> steps(ps.size(), step);
    const bool wd = std::get<0>(key) && opt_.weight_decay != 0.0;
    at::_fused_adamw_(ps, gs, ms, vs, {}, steps, lr, opt_.beta1, opt_.beta2, wd ? opt_.weight_decay : 0.0,
                      opt_.eps, /*amsgrad=*/false, /*maximize=*/false);
    ++loops_;
  }
}

// The five in-place ATen ops on params_[i] (its gradient defined), at the
// step count step() has already advanced.
void AdamW::step_one_unfused(size_t i, double lr) {
  at::Tensor& p = params_[i];
  const at::Tensor& g = grads_.empty() ? p.grad() : grads_[i];
  const double b1 = opt_.beta1, b2 = opt_.beta2;
  const double bias_correction1 = 1.0 - std::pow(b1, double(step_));
  const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(b2, double(step_)));
  const double step_size = lr / bias_correction1;
  scale_grads({g}, grad_scale_);  // in place: the fused paths' product
  if (decay_[i] && opt_.weight_decay != 0.0) p.mul_(1.0 - lr * opt_.weight_decay);  // decoupled decay
  m_[i].mul_(b1).add_(g, 1.0 - b1);                                     // m = b1 m + (1 - b1) g
  v_[i].mul_(b2).addcmul_(g, g, 1.0 - b2);                              // v = b2 v + (1 - b2) g^2
  auto denom = v_[i].sqrt().div_(bias_correction2_sqrt).add_(opt_.eps);  // sqrt(vhat) + eps
  p.addcdiv_(m_[i], denom, -step_size);                                 // p -= lr * mhat / denom
}

// flat_runs: params i..j-1 whose p, g, m and v each continue where the
// previous one's end, with one decay flag, are one kernel::adamw_run. A
// param the kernel cannot take (not fp32 CPU contiguous) goes through the
// per-tensor path alone, with the same step count.
void AdamW::step_runs(double lr) {
  const size_t n = params_.size();
  auto grad = [&](size_t i) -> const at::Tensor& { return grads_.empty() ? params_[i].grad() : grads_[i]; };
  std::vector<size_t> on_device;
  for (size_t i = 0; i < n;) {
    const at::Tensor& g = grad(i);
    if (!g.defined()) {
      ++i;
      continue;
    }
    if (device_fusable(i, g)) {
      on_device.push_back(i);
      ++i;
      continue;
    }
    if (!fusable(params_[i], g, m_[i], v_[i])) {
      step_one_unfused(i, lr);
      ++i;
      continue;
    }
    size_t j = i + 1;
    int64_t len = params_[i].numel();
    for (; j < n; ++j) {
      const at::Tensor& gj = grad(j);
      if (decay_[j] != decay_[i] || !gj.defined() || !fusable(params_[j], gj, m_[j], v_[j]) ||
          !follows(params_[j - 1], params_[j]) || !follows(grad(j - 1), gj) || !follows(m_[j - 1], m_[j]) ||
          !follows(v_[j - 1], v_[j]))
        break;
      len += params_[j].numel();
    }
    const kernel::AdamWScalars ks = make_fused_step(decay_[i], lr, opt_, step_, grad_scale_);
    kernel::adamw_run(params_[i].data_ptr<float>(), g.data_ptr<float>(), m_[i].data_ptr<float>(),
                      v_[i].data_ptr<float>(), len, ks);
    ++loops_;
    i = j;
  }
  step_device_fused(on_device, lr);
}

void AdamW::page_to(int64_t i, int& open) const {
  if (!pager_.page) return;
  const int g = i < 0 ? -1 : pager_.group_of[size_t(i)];
  if (g == open) return;
  if (open >= 0) pager_.page(open, false);
  if (g >= 0) pager_.page(g, true);
  open = g;
}

void AdamW::offload(OffloadOptions options, bool prefetch) {
  std::vector<int64_t> sizes;
  for (const auto& p : params_) {
    if (!p.is_contiguous())
      throw Error(ErrorCode::internal, "AdamW offload: a parameter of shape " + std::to_string(p.dim()) +
                                           "-d is not contiguous; the offloaded update writes it as one run");
    sizes.push_back(p.numel());
  }
  const bool host = !options.nvme, pinned = options.pinned, no_copy_back = options.drop_writes;
  const int threads = options.threads;
  store_ = std::make_unique<OffloadStore>(sizes, std::move(options));
  if (host) host_ = std::make_unique<HostUpdate>(*store_, params_, pinned, no_copy_back, threads);
  prefetch_ = prefetch;
  m_.clear();  // the store starts at zero, as these did
  v_.clear();
  materialized_ = false;
}

int64_t AdamW::resident_bytes() const {
  int64_t n = store_ ? store_->staging_bytes() : 0;
  for (const auto* state : {&m_, &v_})
    for (const auto& t : *state)
      if (t.defined()) n += t.numel() * int64_t(t.element_size());
  return n;
}

// Whole buckets through one host buffer, piece by piece into tensors shaped
// like the parameters (where a checkpoint load writes and a save reads).
void AdamW::materialize() {
  if (!store_ || materialized_) return;
  at::NoGradGuard no_grad;
  store_->drain();
  m_.clear();
  v_.clear();
  for (const auto& p : params_) {
    m_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
    v_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
  }
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  for (int b = 0; b < store_->buckets(); ++b) {
    const int64_t len = store_->bucket_len(b);
    at::Tensor mv = at::empty({2, len}, f32);  // [m | v] of the bucket
    store_->read_bucket(b, mv.data_ptr<float>());
    for (const auto& pc : store_->pieces(b))
      for (int k = 0; k < 2; ++k)
        (k ? v_ : m_)[pc.param].view({-1}).slice(0, pc.begin, pc.end).copy_(mv[k].slice(0, pc.at, pc.at + pc.end - pc.begin));
  }
  materialized_ = true;
}

void AdamW::flush_materialized() {
  if (!materialized_) return;
  at::NoGradGuard no_grad;
  store_->drain();
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  for (int b = 0; b < store_->buckets(); ++b) {
    at::Tensor mv = at::empty({2, store_->bucket_len(b)}, f32);  // [m | v] of the bucket
    for (const auto& pc : store_->pieces(b))
      for (int k = 0; k < 2; ++k)
        mv[k].slice(0, pc.at, pc.at + pc.end - pc.begin).copy_((k ? v_ : m_)[pc.param].reshape({-1}).slice(0, pc.begin, pc.end));
    store_->write_bucket(b, mv.data_ptr<float>());
  }
  // Dropped, not reused: an asynchronous checkpoint save may still hold them.
  m_.clear();
  v_.clear();
  materialized_ = false;
}

OffloadIo AdamW::take_offload_io() {
  if (!store_) return {};
  OffloadIo io = store_->take_stats();
  io.update_s += double(offload_update_ns_) * 1e-9;
  offload_update_ns_ = 0;
  if (host_) {
    const OffloadIo h = host_->take_stats();
    io.io_s += h.io_s;
    io.wait_s += h.wait_s;
    io.update_s += h.update_s;
  }
  return io;
}

// Bucket b is updated while b + 1 is read and b - 1 written (the store's
// three slots); the next step's first buckets, as many as there are slots,
// are queued last, so they are read during its forward and backward.
void AdamW::step_offloaded(double lr) {
  at::NoGradGuard no_grad;
  flush_materialized();
  store_->check_file();
  ++step_;
  int open = -1;
  if (host_) {
    HostUpdate::StepArgs args{
        [&](size_t i) { return grads_.empty() ? params_[i].grad() : grads_[i]; },
        [&](size_t i) { return make_fused_step(decay_[i], lr, opt_, step_, grad_scale_); },
        [&](int64_t i) { page_to(i, open); }};
    return host_->step(*store_, params_, args);
  }
  const int nb = store_->buckets(), depth = OffloadStore::slots();
  for (int b = 0; b < std::min(nb, depth); ++b) store_->prefetch(b);
  for (int b = 0; b < nb; ++b) {
    float* m = store_->acquire(b);
    float* v = m + store_->bucket_len(b);
    for (const auto& pc : store_->pieces(b)) {
      at::Tensor& p = params_[pc.param];
      const at::Tensor& g = grads_.empty() ? p.grad() : grads_[pc.param];
      if (!g.defined()) continue;
      page_to(int64_t(pc.param), open);
      const int64_t t0 = offload_now_ns();
      offloaded_piece(p, g, pc.begin, pc.end, m + pc.at, v + pc.at,
                      make_fused_step(decay_[pc.param], lr, opt_, step_, grad_scale_));
      offload_update_ns_ += offload_now_ns() - t0;
    }
    store_->release(b);
    if (b + depth < nb) store_->prefetch(b + depth);
  }
  page_to(-1, open);
  if (prefetch_)
    for (int b = 0; b < std::min(nb, depth); ++b) store_->prefetch(b);
  else
    store_->drain();
  store_->check_file();
}

void AdamW::zero_grad() {
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor g = grads_.empty() ? params_[i].grad() : grads_[i];
    if (g.defined()) g.zero_();
  }
}

double LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return lr * double(step + 1) / double(warmup_steps);
  // Cosine from lr (first step after warmup) to min_lr (the last step,
  // total_steps - 1); min_lr afterwards.
  const int64_t span = int64_t(total_steps) - warmup_steps - 1;
  if (span <= 0) return step < total_steps ? lr : min_lr;
  double progress = double(step - warmup_steps) / double(span);
  if (progress > 1.0) progress = 1.0;
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (lr - min_lr);
}

double local_grad_sq_norm(const std::vector<at::Tensor>& grads, bool batch_on_cpu) {
  at::NoGradGuard no_grad;
  double total = 0.0;
  // Off the CPU, an .item() per tensor would wait for the device once per
  // gradient: each tensor's fp64 sum stays on its device and every device's
  // sums come back in one copy (devices in the order they first appear).
  std::vector<std::pair<c10::Device, std::vector<at::Tensor>>> on_device;
  for (const auto& g : grads) {
    if (!g.defined()) continue;
    if (g.is_cpu() && g.scalar_type() == at::kFloat && g.is_contiguous()) {
      total += kernel::sq_sum(g.const_data_ptr<float>(), g.numel());
      continue;
    }
    at::Tensor sq = at::sum(g.mul(g), at::kDouble);  // accumulate in fp64
    if (g.is_cpu() && !batch_on_cpu) {
      total += sq.item().toDouble();
      continue;
    }
    auto it = std::find_if(on_device.begin(), on_device.end(),
                           [&](const auto& d) { return d.first == g.device(); });
    if (it == on_device.end()) it = on_device.insert(on_device.end(), {g.device(), {}});
    it->second.push_back(std::move(sq));
  }
  for (const auto& [device, sums] : on_device) total += at::stack(sums).sum().item().toDouble();
  return total;
}

void scale_grads(const std::vector<at::Tensor>& grads, double factor) {
  if (factor == 1.0) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> defined;  // one multi-tensor launch on a GPU, not a kernel per gradient
  for (const auto& g : grads)
    if (g.defined()) defined.push_back(g);
  if (!defined.empty()) at::_foreach_mul_(defined, factor);
}

}  // namespace dtrain::engine::optim
