// make_tied_embedding_sync (tied_embedding.h): the gradient swap of the two
// wte.weight copies of a tied head under pipeline parallelism.
#include "engine/parallel/pipeline/tied_embedding.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty_like.h>

#include "common/error.h"
#include "common/log.h"

namespace dtrain::engine::parallel {
namespace {

constexpr int kTiedTag = comm::kMaxUserTag - 1;  // apart from the pipeline's activation tags

bool is_wte(const std::string& name) { return name == "wte.weight" || name.rfind("wte.weight[", 0) == 0; }

class TiedEmbeddingSync : public GradSync {
 public:
  TiedEmbeddingSync(std::unique_ptr<GradSync> inner, comm::Group& pp, int peer, bool fault_skip)
      : inner_(std::move(inner)), pp_(pp), peer_(peer), fault_skip_(fault_skip) {}

  void begin_micro(int micro, bool last) override { inner_->begin_micro(micro, last); }

  SyncStats finish() override {
    SyncStats stats = inner_->finish();
    if (fault_skip_) return stats;
    const OptimizerParams o = inner_->optimizer_params();
    std::vector<at::Tensor> grads;  // this end's wte.weight gradient, in pieces (one under DDP)
    for (size_t i = 0; i < o.names.size(); ++i)
      if (is_wte(o.names[i])) grads.push_back(o.grads.empty() ? o.params[i].grad() : o.grads[i]);
    if (grads.empty()) throw Error(ErrorCode::internal, "tied embeddings: this stage holds no wte.weight");
    std::vector<at::Tensor> flat;
    for (auto& g : grads) flat.push_back(g.reshape({-1}));
    at::Tensor mine = at::cat(flat);  // [n]
    at::Tensor theirs = at::empty_like(mine);
    comm::WorkPtr sent = pp_.send(mine, peer_, kTiedTag);
    pp_.recv(theirs, peer_, kTiedTag)->wait();
    sent->wait();
    mine.add_(theirs);
    int64_t off = 0;
    for (auto& g : grads) {
      g.copy_(mine.narrow(0, off, g.numel()).view(g.sizes()));
      off += g.numel();
    }
    return stats;
  }

  double clip(double max_norm, double& scale) override { return inner_->clip(max_norm, scale); }
  OptimizerParams optimizer_params() override { return inner_->optimizer_params(); }
  void after_optimizer_step() override { inner_->after_optimizer_step(); }
  optim::OffloadFile* offloaded_params() override { return inner_->offloaded_params(); }
  void zero() override { inner_->zero(); }
  ModelBytes memory() const override { return inner_->memory(); }
  std::unique_ptr<StateProvider> state(optim::AdamW& optimizer) override { return inner_->state(optimizer); }
  std::string describe() const override {
    return inner_->describe() + "; tied wte.weight: gradient summed with pp stage " + std::to_string(peer_);
  }
  std::vector<std::pair<std::string, double>> step_metrics() const override { return inner_->step_metrics(); }

 private:
  std::unique_ptr<GradSync> inner_;
  comm::Group& pp_;
  int peer_;
  bool fault_skip_;
};

}  // namespace

std::unique_ptr<GradSync> make_tied_embedding_sync(std::unique_ptr<GradSync> inner, comm::Group& pp, int peer,
                                                   bool fault_skip) {
  if (fault_skip)
    DTRAIN_WARN("fault.kind = no_grad_sync: the tied wte copies of the first and last stages keep their own "
                "gradients (a wrong layout on purpose)");
  return std::make_unique<TiedEmbeddingSync>(std::move(inner), pp, peer, fault_skip);
}

}  // namespace dtrain::engine::parallel
