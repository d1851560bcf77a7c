// make_ddp_sync (ddp_sync.h). Clipping: after finish() every dp rank holds
// the full summed gradient, so this rank's sum of squares IS the global one
// over dp (all-reducing it over dp would count every gradient dp times);
// under tensor parallelism the split parameters' sums add up over tp, and
// a replicated one is counted by TP rank 0 only (grad_norm.h does the sums).
// On CPU without tp or pp, the dp ranks split that pass instead: each sums
// the squares of its 1/dp of every bucket and one fp64 all-reduce over dp
// adds the parts (the pass is memory-bound: 52 MB of gradients, ~4 ms at
// the compute-size GPT, halved at dp 2). Not under the no_grad_sync fault,
// whose ranks keep different gradients and each clip by their own.
#include "engine/parallel/ddp/ddp_sync.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/comm/no_sync_group.h"
#include "engine/optim/adamw.h"
#include "engine/parallel/grad_norm.h"

namespace dtrain::engine::parallel {
namespace {

// All of local tensor t, as entries of the global tensor `name` (several
// when tensor parallelism keeps several segments of it).
void add_whole(std::vector<StateEntry>& out, const std::string& name, const ParamLayout& layout,
               const at::Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> all;
  for (int64_t d : t.sizes()) all.emplace_back(0, d);
  for (auto& e : global_entries(name, layout, all, t, /*keyed=*/layout.sharded())) out.push_back(std::move(e));
}

// Model and AdamW moments, replicated over dp: the replicas split the
// writing (of a TP-replicated parameter, among its TP rank 0s), every rank
// reads its own.
class ReplicatedState : public StateProvider {
 public:
  ReplicatedState(const std::vector<std::pair<std::string, at::Tensor>>& params,
                  const std::vector<ParamLayout>& layouts, optim::AdamW& opt, int dp_rank, int dp_size)
      : params_(params), layouts_(layouts), opt_(opt), dp_rank_(dp_rank), dp_size_(dp_size) {}

  // Each tensor to the replica with the fewest bytes so far, in order (the
  // same on every replica): each writes about 1/dp of the state, as DCP's
  // deduplicated save does, so a save or an in-memory copy takes 1/dp of
  // the time on every rank rather than all of it on dp rank 0.
  std::vector<StateEntry> save_entries() override {
    std::vector<StateEntry> all = entries(/*owned_only=*/true), mine;
    std::vector<int64_t> bytes(size_t(std::max(1, dp_size_)), 0);
    for (auto& e : all) {
      const auto to = size_t(std::min_element(bytes.begin(), bytes.end()) - bytes.begin());
      bytes[to] += e.tensor.numel() * int64_t(e.tensor.element_size());
      if (int(to) == dp_rank_) mine.push_back(std::move(e));
    }
    return mine;
  }
  std::vector<StateEntry> load_entries() override { return entries(false); }
  // Parameters and moments: only AdamW's step writes them.
  bool stable_until_optimizer() const override { return true; }

 private:
  std::vector<StateEntry> entries(bool owned_only) {
    std::vector<StateEntry> out;
    auto& m = opt_.exp_avg();
    auto& v = opt_.exp_avg_sq();
    for (size_t i = 0; i < params_.size(); ++i)
      if (!owned_only || layouts_[i].tp_owner) add_whole(out, "model/" + params_[i].first, layouts_[i], params_[i].second);
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owned_only && !layouts_[i].tp_owner) continue;
      add_whole(out, "optim/exp_avg/" + params_[i].first, layouts_[i], m[i]);
      add_whole(out, "optim/exp_avg_sq/" + params_[i].first, layouts_[i], v[i]);
    }
    return out;
  }

  const std::vector<std::pair<std::string, at::Tensor>>& params_;
  const std::vector<ParamLayout>& layouts_;
  optim::AdamW& opt_;
  int dp_rank_, dp_size_;
};

class DdpSync : public GradSync {
 public:
  DdpSync(std::vector<std::pair<std::string, at::Tensor>> named_params, std::vector<ParamLayout> layouts,
          comm::Group& dp, comm::Group& tp, comm::Group& pp, DdpOptions options)
      : params_(std::move(named_params)), layouts_(std::move(layouts)), dp_(dp), tp_(tp), pp_(pp),
        options_(options), ddp_(params_, dp, options), grads_(ddp_.flat_grads()) {
    split_ = dp.size() > 1 && tp.size() == 1 && pp.size() == 1 &&
             dynamic_cast<comm::NoSyncGroup*>(&dp) == nullptr && !grads_.empty() &&
             std::all_of(grads_.begin(), grads_.end(), [](const at::Tensor& g) { return g.is_cpu(); });
    if (!split_) return;  // the same answer on every dp rank: all of them all-reduce, or none
    const int64_t r = dp.rank(), n = dp.size();
    for (const at::Tensor& g : grads_) {
      const int64_t begin = g.numel() * r / n, end = g.numel() * (r + 1) / n;
      if (end > begin) my_parts_.push_back(g.narrow(0, begin, end - begin));
    }
  }

  void begin_micro(int, bool last) override { ddp_.set_grad_sync(last); }

  SyncStats finish() override {
    SyncStats stats = ddp_.finish_gradient_sync();
    std::vector<at::Tensor> partial;  // sequence parallelism: sums of this rank's positions only
    for (size_t i = 0; i < params_.size(); ++i)
      if (layouts_[i].sum_grad_over_tp) partial.push_back(params_[i].second.grad());
    sum_over_tp(partial, tp_);
    return stats;
  }

  double clip(double max_norm, double& scale) override {
    if (tp_.size() == 1 && pp_.size() == 1) {
      if (split_) return clip_grad_norm(my_parts_, {}, {&dp_}, max_norm, 0, &scale);
      return clip_grad_norm(grads_, {}, {}, max_norm, 0, &scale);  // one op per bucket
    }
    std::vector<at::Tensor> grads;  // views into the buckets, which they cover exactly
    std::vector<bool> counted;      // this rank's share of the global gradient
    for (size_t i = 0; i < params_.size(); ++i) {
      grads.push_back(params_[i].second.grad());
      counted.push_back(layouts_[i].tp_owner);
    }
    return clip_grad_norm(grads, counted, {&tp_, &pp_}, max_norm, 0, &scale);  // pp: stages hold disjoint parameters
  }

  OptimizerParams optimizer_params() override {
    OptimizerParams o;
    for (auto& [name, p] : params_) {
      o.names.push_back(name);
      o.params.push_back(p);
      o.decay.push_back(p.dim() >= 2);  // Linear weights and embedding tables
    }
    return o;
  }

  void zero() override { ddp_.zero_grad(); }

  ModelBytes memory() const override {
    ModelBytes b;
    for (auto& [name, p] : params_) b.params += p.numel() * int64_t(p.element_size());
    b.grads = ddp_.grad_bytes();
    return b;
  }

  std::unique_ptr<StateProvider> state(optim::AdamW& optimizer) override {
    return std::make_unique<ReplicatedState>(params_, layouts_, optimizer, dp_.rank(), dp_.size());
  }

  std::string describe() const override {
    return fmt::format("DDP: {} bucket(s) of <= {} MB over dp {} ({}{}), overlap {}{}",
                       ddp_.num_buckets(), options_.bucket_mb, dp_.size(), dp_.backend(),
                       ddp_.symmetric() ? ", in its symmetric buffer" : "", options_.overlap ? "on" : "off",
                       split_ ? ", gradient norm split over dp" : "");
  }

 private:
  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::vector<ParamLayout> layouts_;
  comm::Group& dp_;
  comm::Group& tp_;
  comm::Group& pp_;
  DdpOptions options_;
  Ddp ddp_;
  std::vector<at::Tensor> grads_;     // the flat buckets
  bool split_ = false;                // the dp ranks split the norm's pass
  std::vector<at::Tensor> my_parts_;  // this rank's 1/dp of each bucket (where split)
};

}  // namespace

std::unique_ptr<GradSync> make_ddp_sync(std::vector<std::pair<std::string, at::Tensor>> named_params,
                                        std::vector<ParamLayout> layouts, comm::Group& dp,
                                        comm::Group& tp, comm::Group& pp, DdpOptions options) {
  return std::make_unique<DdpSync>(std::move(named_params), std::move(layouts), dp, tp, pp, options);
}

}  // namespace dtrain::engine::parallel
