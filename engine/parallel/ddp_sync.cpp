// make_ddp_sync (ddp_sync.h). Clipping: after finish() every dp rank holds
// the full summed gradient, so this rank's sum of squares IS the global one;
// all-reducing it over dp would count every gradient dp times.
#include "engine/parallel/ddp_sync.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "engine/optim/adamw.h"

namespace dtrain::engine::parallel {
namespace {

StateEntry whole(std::string name, const at::Tensor& t) {
  StateEntry e{std::move(name), t.sizes().vec(), {}, t, ""};
  for (int64_t d : e.global_shape) e.slice.emplace_back(0, d);
  return e;
}

// Model and AdamW moments, replicated over dp: dp rank 0 writes them, every
// rank reads all of them.
class ReplicatedState : public StateProvider {
 public:
  ReplicatedState(const std::vector<std::pair<std::string, at::Tensor>>& params, optim::AdamW& opt,
                  bool writer)
      : params_(params), opt_(opt), writer_(writer) {}

  std::vector<StateEntry> save_entries() override { return writer_ ? all() : std::vector<StateEntry>{}; }
  std::vector<StateEntry> load_entries() override { return all(); }

 private:
  std::vector<StateEntry> all() {
    std::vector<StateEntry> out;
    auto& m = opt_.exp_avg();
    auto& v = opt_.exp_avg_sq();
    for (auto& [name, p] : params_) out.push_back(whole("model/" + name, p));
    for (size_t i = 0; i < params_.size(); ++i) {
      out.push_back(whole("optim/exp_avg/" + params_[i].first, m[i]));
      out.push_back(whole("optim/exp_avg_sq/" + params_[i].first, v[i]));
    }
    return out;
  }

  const std::vector<std::pair<std::string, at::Tensor>>& params_;
  optim::AdamW& opt_;
  bool writer_;
};

class DdpSync : public GradSync {
 public:
  DdpSync(std::vector<std::pair<std::string, at::Tensor>> named_params, comm::Group& dp,
          DdpOptions options)
      : params_(std::move(named_params)), dp_(dp), options_(options),
        ddp_(params_, dp, options), grads_(ddp_.flat_grads()) {}

  void begin_micro(int, bool last) override { ddp_.set_grad_sync(last); }

  SyncStats finish() override { return ddp_.finish_gradient_sync(); }

  double clip(double max_norm) override {
    const double norm = std::sqrt(optim::local_grad_sq_norm(grads_));  // one op per bucket
    if (max_norm > 0) optim::scale_grads(grads_, std::min(1.0, max_norm / (norm + 1e-6)));
    return norm;
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
    return std::make_unique<ReplicatedState>(params_, optimizer, dp_.rank() == 0);
  }

  std::string describe() const override {
    return fmt::format("DDP: {} bucket(s) of <= {} MB over dp {} ({}), overlap {}",
                       ddp_.num_buckets(), options_.bucket_mb, dp_.size(), dp_.backend(),
                       options_.overlap ? "on" : "off");
  }

 private:
  std::vector<std::pair<std::string, at::Tensor>> params_;
  comm::Group& dp_;
  DdpOptions options_;
  Ddp ddp_;
  std::vector<at::Tensor> grads_;  // the flat buckets
};

}  // namespace

std::unique_ptr<GradSync> make_ddp_sync(std::vector<std::pair<std::string, at::Tensor>> named_params,
                                        comm::Group& dp, DdpOptions options) {
  return std::make_unique<DdpSync>(std::move(named_params), dp, options);
}

}  // namespace dtrain::engine::parallel
