// make_moe_sync (expert_parallel.h): the experts' half of a step's gradient
// communication, wrapped around the dense GradSync, and the step's routing
// counters. Clipping: after finish() every edp rank holds its experts' full
// gradient, so the experts' sum of squares is this rank's plus the other ep
// ranks' (disjoint experts), added to the dense norm the inner sync reduced
// (grad_norm.h).
#include "engine/parallel/expert/expert_parallel.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>

#include "engine/optim/adamw.h"
#include "engine/parallel/grad_norm.h"

namespace dtrain::engine::parallel {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The dense state, then the experts' (model and moments at optimizer index
// `first` on; edp rank 0 writes them) and every MoE layer's selection bias
// (replicated everywhere: rank 0 of dp and of ep writes it).
class MoeState : public StateProvider {
 public:
  MoeState(std::unique_ptr<StateProvider> dense, const ExpertParams& experts, std::vector<std::string> bias_names,
           std::vector<at::Tensor> biases, optim::AdamW& opt, size_t first, bool expert_writer, bool bias_writer)
      : dense_(std::move(dense)), experts_(experts), bias_names_(std::move(bias_names)), biases_(std::move(biases)),
        opt_(opt), first_(first), expert_writer_(expert_writer), bias_writer_(bias_writer) {}

  std::vector<StateEntry> save_entries() override {
    std::vector<StateEntry> out = dense_->save_entries();
    if (expert_writer_) add_experts(out);
    if (bias_writer_) add_biases(out);
    return out;
  }
  std::vector<StateEntry> load_entries() override {
    std::vector<StateEntry> out = dense_->load_entries();
    add_experts(out);
    add_biases(out);
    return out;
  }

 private:
  void add(std::vector<StateEntry>& out, const std::string& name, const ParamLayout& l, const at::Tensor& t) {
    std::vector<std::pair<int64_t, int64_t>> all;
    for (int64_t d : t.sizes()) all.emplace_back(0, d);
    for (auto& e : global_entries(name, l, all, t, /*keyed=*/l.sharded())) out.push_back(std::move(e));
  }
  void add_experts(std::vector<StateEntry>& out) {
    const auto& named = experts_.named;
    for (size_t i = 0; i < named.size(); ++i) add(out, "model/" + named[i].first, experts_.layouts[i], named[i].second);
    for (size_t i = 0; i < named.size(); ++i) {
      add(out, "optim/exp_avg/" + named[i].first, experts_.layouts[i], opt_.exp_avg()[first_ + i]);
      add(out, "optim/exp_avg_sq/" + named[i].first, experts_.layouts[i], opt_.exp_avg_sq()[first_ + i]);
    }
  }
  void add_biases(std::vector<StateEntry>& out) {
    for (size_t i = 0; i < biases_.size(); ++i) add(out, bias_names_[i], ParamLayout::whole(biases_[i]), biases_[i]);
  }

  std::unique_ptr<StateProvider> dense_;
  const ExpertParams& experts_;
  std::vector<std::string> bias_names_;
  std::vector<at::Tensor> biases_;
  optim::AdamW& opt_;
  size_t first_;
  bool expert_writer_, bias_writer_;
};

class MoeSync : public GradSync {
 public:
  MoeSync(std::unique_ptr<GradSync> dense, ExpertParams experts, model::GptImpl& model, comm::Group& dp,
          comm::Group& tp, comm::Group& pp, comm::Group& ep, comm::Group& edp, MoeSyncOptions options)
      : dense_(std::move(dense)), experts_(std::move(experts)), layers_(model.moe_layers()), dp_(dp), tp_(tp), pp_(pp),
        ep_(ep), edp_(edp), options_(options) {
    at::NoGradGuard no_grad;
    // Gradients exist from the start, so autograd accumulates into them in
    // place and an expert that gets no token still has a (zero) gradient.
    for (auto& [name, p] : experts_.named) p.mutable_grad() = at::zeros_like(p);
    // The bias lives where the router does, before the checkpoint holds it.
    for (auto& m : layers_) m->selection_bias = m->selection_bias.to(m->router->weight.device());
    for (int i = 0; i < model.config().layers; ++i)  // moe_layers() is in block order
      if (model.config().moe.is_moe_block(i)) bias_names_.push_back("moe/selection_bias/blocks." + std::to_string(i));
    // A pipeline stage holds the layers whose routers kept their weights.
    for (auto& m : layers_) held_.push_back(m->router->weight.numel() > 0);
    reset_counters();
  }

  // The counters start at zero before a step's first forward: a pipeline
  // runs forwards before the first backward, so they are reset after the
  // previous step (zero()), not at its first micro-step. (The trainer
  // resets the groups' byte counts at the step's start.)
  void begin_micro(int micro, bool last) override { dense_->begin_micro(micro, last); }

  SyncStats finish() override {
    SyncStats stats = dense_->finish();
    if (edp_.size() > 1 && !experts_.named.empty()) {
      std::vector<at::Tensor> flat;
      for (auto& [name, p] : experts_.named) flat.push_back(p.grad().reshape({-1}));
      at::Tensor all = at::cat(flat);  // [sum numel]
      edp_.all_reduce(all);
      int64_t off = 0;
      for (auto& [name, p] : experts_.named) {
        p.grad().view({-1}).copy_(all.narrow(0, off, p.numel()));
        off += p.numel();
      }
    }
    reduce_counters();
    return stats;
  }

  double clip(double max_norm, double& scale) override {
    double unused = 1.0;
    const double dense = dense_->clip(0.0, unused);  // the norm only
    // The experts' squares over ep and pp, added to the dense part; one
    // factor for all (the optimizer updates dense and expert parameters).
    std::vector<at::Tensor> grads;
    for (auto& [name, p] : experts_.named) grads.push_back(p.grad());
    return clip_grad_norm(grads, {}, {&ep_, &pp_}, max_norm, dense * dense, &scale);
  }

  OptimizerParams optimizer_params() override {
    OptimizerParams o = dense_->optimizer_params();
    const bool explicit_grads = !o.grads.empty();
    for (auto& [name, p] : experts_.named) {
      o.names.push_back(name);
      o.params.push_back(p);
      o.decay.push_back(ends_with(name, ".weight"));  // the expert matrices, not their biases
      if (explicit_grads) o.grads.push_back(p.grad());
      if (o.page) o.page_group.push_back(-1);  // always in memory
    }
    return o;
  }

  void after_optimizer_step() override { dense_->after_optimizer_step(); }
  optim::OffloadFile* offloaded_params() override { return dense_->offloaded_params(); }

  void zero() override {
    dense_->zero();
    for (auto& [name, p] : experts_.named) p.grad().zero_();
    reset_counters();
  }

  ModelBytes memory() const override {
    ModelBytes b = dense_->memory();
    for (auto& [name, p] : experts_.named) {
      b.params += p.numel() * int64_t(p.element_size());
      b.grads += p.numel() * int64_t(p.element_size());
    }
    return b;
  }

  std::unique_ptr<StateProvider> state(optim::AdamW& optimizer) override {
    const size_t first = dense_->optimizer_params().params.size();
    std::vector<at::Tensor> biases;
    std::vector<std::string> names;
    for (size_t l = 0; l < layers_.size(); ++l)  // each stage writes its layers' biases
      if (held_[l]) biases.push_back(layers_[l]->selection_bias), names.push_back(bias_names_[l]);
    return std::make_unique<MoeState>(dense_->state(optimizer), experts_, std::move(names), std::move(biases), optimizer,
                                      first, edp_.rank() == 0,
                                      dp_.rank() == 0 && tp_.rank() == 0 && ep_.rank() == 0);
  }

  std::vector<std::pair<std::string, double>> step_metrics() const override { return metrics_; }

  std::string describe() const override {
    const int experts = layers_.empty() ? 0 : layers_.front()->config().experts;
    return fmt::format("{}; MoE: {} layer(s) of {} experts, {} per rank over ep {} ({}), expert grads over edp {}, "
                       "balance {}",
                       dense_->describe(), layers_.size(), experts, experts / ep_.size(), ep_.size(), ep_.backend(),
                       edp_.size(), options_.bias_balance ? "bias" : "aux");
  }

 private:
  // The step's routing counters of every rank summed over dp (the whole
  // global batch) and pp (a layer counts on its stage only, zeros
  // elsewhere), the metrics from them, and the selection-bias update.
  void reduce_counters();
  void reset_counters() {
    for (auto& m : layers_) m->counters.reset(m->config().experts);
  }

  std::unique_ptr<GradSync> dense_;
  ExpertParams experts_;
  std::vector<model::Moe> layers_;
  std::vector<std::string> bias_names_;
  std::vector<bool> held_;  // per layer: on this pipeline stage
  comm::Group& dp_;
  comm::Group& tp_;
  comm::Group& pp_;
  comm::Group& ep_;
  comm::Group& edp_;
  MoeSyncOptions options_;
  std::vector<std::pair<std::string, double>> metrics_;
};

void MoeSync::reduce_counters() {
  if (layers_.empty()) return;
  const size_t E = size_t(layers_.front()->config().experts);
  std::vector<double> v;  // per layer: load [E], dropped, assigned, aux_sum, forwards
  for (auto& m : layers_) {
    const auto& c = m->counters;
    v.insert(v.end(), c.load.begin(), c.load.end());
    v.push_back(c.dropped), v.push_back(c.assigned), v.push_back(c.aux_sum), v.push_back(c.forwards);
  }
  at::Tensor t = at::tensor(v, at::TensorOptions().dtype(at::kDouble)).to(dp_.device());
  if (dp_.size() > 1) dp_.all_reduce(t);
  // ep_bytes_sent: this rank's all-to-all bytes (rows and counts to other ep
  // ranks in the step's forwards and backwards), summed over its pp group:
  // the bytes of every stage of its slice of the model.
  at::Tensor bytes = at::tensor(std::vector<double>{double(ep_.bytes_sent())},
                                at::TensorOptions().dtype(at::kDouble)).to(dp_.device());  // [1]
  if (pp_.size() > 1) {
    at::Tensor both = at::cat({t, bytes});  // one all-reduce for both
    pp_.all_reduce(both);
    t = both.narrow(0, 0, t.numel()), bytes = both.narrow(0, t.numel(), 1);
  }
  const double ep_bytes = bytes.cpu().item<double>();
  t = t.cpu().contiguous();
  const double* s = t.data_ptr<double>();
  double max_load = 0, dropped = 0, assigned = 0, aux = 0;
  at::NoGradGuard no_grad;
  for (size_t l = 0; l < layers_.size(); ++l, s += E + 4) {
    double total = 0, top = 0;
    for (size_t e = 0; e < E; ++e) total += s[e], top = std::max(top, s[e]);
    const double mean = total / double(E);
    if (mean > 0) max_load = std::max(max_load, top / mean);
    dropped += s[E];
    assigned += s[E + 1];
    // aux_sum adds every forward's aux loss: its mean per micro-batch, as the loss.
    if (s[E + 3] > 0) aux += s[E + 2] / s[E + 3];
    if (options_.bias_balance) layers_[l]->update_selection_bias(std::vector<double>(s, s + E), options_.bias_rate);
  }
  metrics_ = {{"moe_aux_loss", aux},
              {"moe_max_load", max_load},
              {"moe_dropped", assigned > 0 ? dropped / assigned : 0},
              {"ep_bytes_sent", ep_bytes}};
}

}  // namespace

std::unique_ptr<GradSync> make_moe_sync(std::unique_ptr<GradSync> dense, ExpertParams experts, model::GptImpl& model,
                                        comm::Group& dp, comm::Group& tp, comm::Group& pp, comm::Group& ep,
                                        comm::Group& edp, MoeSyncOptions options) {
  return std::make_unique<MoeSync>(std::move(dense), std::move(experts), model, dp, tp, pp, ep, edp, options);
}

}  // namespace dtrain::engine::parallel
