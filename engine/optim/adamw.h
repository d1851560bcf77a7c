// AdamW (decoupled weight decay, as torch.optim.AdamW), the learning-rate
// schedule (linear warmup then cosine decay to min_lr), and gradient
// clipping by a global norm (the caller all-reduces the squared norm across
// ranks when parameters are sharded). Works on any list of tensors: full
// parameters or shards.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/optim/host_update.h"
#include "engine/optim/offload_store.h"

namespace dtrain::engine::optim {

struct AdamWOptions {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // One fused pass per contiguous fp32 CPU tensor (as torch.optim.AdamW's
  // fused=True); off the CPU (a GPU), ATen's fused multi-tensor AdamW
  // (_fused_adamw_, what torch.optim.AdamW(fused=True) calls) over every
  // contiguous parameter of one device, dtype and decay flag at once; false =
  // the five in-place ATen ops per tensor. Same formula.
  bool fused = true;
  // Tests only: CPU tensors take the device path (_fused_adamw_ has a CPU
  // kernel), so a machine without a GPU checks its arguments and results.
  bool device_path_on_cpu = false;
  // With fused: params whose parameters, gradients and moments each lie end
  // to end (a ZeRO shard; the moments are allocated flat) and share a decay
  // flag are updated by one loop (optim/adamw_kernel.h), vectorised for AVX2
  // where the CPU has it. false = one scalar pass per tensor. Same bits.
  bool flat_runs = true;
  // false: no moment tensors at construction, for a caller that calls
  // offload() next (the whole state allocated first would set the peak).
  bool allocate_state = true;
};

// Parameters whose storage is away between uses (ZeRO-3's parameter
// offload): step() calls page(g, true) before it updates the first
// parameter of group g = group_of[i] and page(g, false) after the last one;
// groups come in increasing order, each once per step.
struct ParamPager {
  std::vector<int> group_of;  // per parameter
  std::function<void(int group, bool in)> page;
};

class AdamW {
 public:
  // decay[i]: whether params[i] gets weight decay (matrices yes; biases,
  // LayerNorm weights and embeddings' positions no, by the caller's choice).
  // grads: the gradient of each param (views of a ZeRO flat gradient shard);
  // empty = each param's .grad().
  AdamW(std::vector<at::Tensor> params, std::vector<bool> decay, AdamWOptions options,
        std::vector<at::Tensor> grads = {});
  ~AdamW();
  // Keeps the moments in `store` (host memory or a file) instead of tensors
  // of their own: step() reads and writes them bucket by bucket. Before the
  // first step; the moments start at zero as without. prefetch: the next
  // step's first buckets are read while its forward and backward run. Host
  // memory: the update runs on the CPU on a master copy of the parameters
  // (optim/host_update.h), whatever device they are on.
  void offload(OffloadOptions options, bool prefetch);
  void set_pager(ParamPager pager) { pager_ = std::move(pager); }
  // One step with learning rate lr. Skips params without a gradient.
  // grad_scale: every gradient is taken times this (the clip factor of
  // parallel::GradSync::clip), inside the fused update where it runs (no
  // pass of its own; the gradients keep their values), else scaled in place
  // first. The same bits either way.
  void step(double lr, double grad_scale = 1.0);
  void zero_grad();  // sets grads to zero (keeps storage)

  int64_t step_count() const { return step_; }
  // Fused loops the last step() ran (flat_runs: one per run; else per tensor).
  int last_step_loops() const { return loops_; }
  // State for checkpoints: exp_avg and exp_avg_sq per param, same order.
  // Offloaded: read into tensors of their own on first use (a save reads
  // them, a load writes them), written back and dropped by the next step.
  std::vector<at::Tensor>& exp_avg() { return materialize(), m_; }
  std::vector<at::Tensor>& exp_avg_sq() { return materialize(), v_; }
  // Bytes of AdamW state in this process's tensors (moments, or the
  // offload's staging buffers); bytes it keeps in host memory or a file
  // (host: the moments, the master weights and the gradients' staging).
  int64_t resident_bytes() const;
  int64_t offloaded_bytes() const { return (store_ ? store_->bytes() : 0) + (host_ ? host_->bytes() : 0); }
  const OffloadStore* offload_store() const { return store_.get(); }
  OffloadStore* offload_store() { return store_.get(); }
  // This process's offload transfers and update since the last call (the
  // store's I/O, host's copies, the update on the offloaded state).
  OffloadIo take_offload_io();
  void set_step_count(int64_t s) { step_ = s; }
  const std::vector<at::Tensor>& params() const { return params_; }

 private:
  std::vector<at::Tensor> params_;
  std::vector<bool> decay_;
  std::vector<at::Tensor> grads_;  // empty: params_[i].grad()
  AdamWOptions opt_;
  void materialize();        // offloaded: m_ and v_ from the store
  void flush_materialized();  // offloaded: m_ and v_ back to the store, dropped
  void step_offloaded(double lr);
  void step_runs(double lr);                    // fused + flat_runs
  void step_one_unfused(size_t i, double lr);  // the ATen ops on params_[i]
  // fused: whether params_[i] (gradient g) goes to step_device_fused.
  bool device_fusable(size_t i, const at::Tensor& g) const;
  void step_device_fused(const std::vector<size_t>& idx, double lr);  // _fused_adamw_ over idx
  std::vector<at::Tensor> m_, v_;  // offloaded: empty unless materialized
  int64_t step_ = 0;
  double grad_scale_ = 1.0;  // of the step() running
  std::unique_ptr<OffloadStore> store_;
  std::unique_ptr<HostUpdate> host_;  // the store in host memory: the CPU's master and its copies
  int64_t offload_update_ns_ = 0;  // nvme: the update of the offloaded buckets since take_offload_io
  bool prefetch_ = true;  // read the next step's first buckets ahead
  bool materialized_ = false;
  int loops_ = 0;
  ParamPager pager_;
  // Pages in parameter i's group (and out the previous one); -1 ends the step.
  void page_to(int64_t i, int& open) const;
};

struct LrSchedule {
  double lr = 3e-4;
  double min_lr = 0.0;
  int warmup_steps = 10;
  int total_steps = 100;
  // step is 0-based: step 0 of warmup 10 -> lr * 1/10.
  double at(int64_t step) const;
};

// Sum of squares of every grad in `grads` (local part); the caller adds the
// other ranks' parts, takes sqrt, and calls scale_grads with
// min(1, max_norm / (norm + 1e-6)). Off the CPU the per-tensor sums are
// fetched in one copy per device; batch_on_cpu (tests) sends the CPU
// tensors outside the fp32 loop through that path too.
double local_grad_sq_norm(const std::vector<at::Tensor>& grads, bool batch_on_cpu = false);
void scale_grads(const std::vector<at::Tensor>& grads, double factor);

}  // namespace dtrain::engine::optim
