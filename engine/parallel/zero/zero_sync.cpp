// make_zero_sync (zero_sync.h). Units launch their gradient communication
// from the backward hooks DDP uses too (bucket_hooks.h: a unit is a bucket),
// strictly in backward order, so every rank issues the same collectives in
// the same order; clipping is grad_norm.h's. The state and its collectives
// are zero_state.h's (ZeRO-3's gathers: FSDP's storage trick). Where
// the dp group shares a machine (parallel.fsdp.shared_params), every unit's
// flat buffer lies in one shared-memory segment instead: each rank's shard
// is its own range of it, updated in place by its optimizer, and the others
// read it there, so nothing is gathered, copied or freed; a barrier (meet)
// after the optimizer step and one before it order the writes and the reads.
#include "engine/parallel/zero/zero_sync.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <fmt/format.h>

#include "common/error.h"
#include "engine/comm/symmetric_buffer.h"
#include "engine/model/grad_slot.h"
#include "engine/optim/adamw.h"
#include "engine/parallel/bucket_hooks.h"
#include "engine/parallel/grad_norm.h"
#include "engine/parallel/zero/flat_layout.h"
#include "engine/parallel/zero/param_offload.h"
#include "engine/parallel/zero/zero_state.h"

namespace dtrain::engine::parallel {
namespace {

using zero::FlatLayout;
using zero::Piece;
using zero::Unit;
using zero::ZeroState;

// ZeRO-3's unit hooks on the model: gather before a unit runs (prefetching
// the next), free after (unless reshard_after_forward is off), and gather
// again when backward reaches the unit's output.
class GatherHooks : public model::UnitHooks {
 public:
  explicit GatherHooks(std::weak_ptr<ZeroState> state) : state_(std::move(state)) {}
  void before(int unit) override {
    auto s = state_.lock();
    s->ensure_gathered(unit, unit + 1);
    if (s->tied && unit + 1 == int(s->units.size())) s->ensure_gathered(0);  // the head reads wte
    if (s->options.prefetch && unit + 1 < int(s->units.size())) s->start_gather(unit + 1, unit + 2);
  }
  at::Tensor after(int unit, const at::Tensor& output) override {
    auto s = state_.lock();
    // The last unit's backward comes first: it stays gathered.
    const bool last = unit + 1 == int(s->units.size());
    const bool no_grad = !c10::GradMode::is_enabled();
    if ((s->options.reshard_after_forward || no_grad) && !last && !(s->tied && unit == 0)) s->release(unit);
    if (s->tied && last && no_grad) s->release(0);  // no backward follows: the head is done with wte
    if (output.requires_grad()) {
      std::weak_ptr<ZeroState> weak = state_;
      output.register_hook([weak, unit](const at::Tensor&) {
        auto st = weak.lock();
        if (!st) return;
        st->ensure_gathered(unit, unit - 1);
        if (st->options.prefetch && unit > 0) st->start_gather(unit - 1, unit - 2);
      });
    }
    return output;
  }

 private:
  std::weak_ptr<ZeroState> state_;
};

// The checkpoint's view: each rank writes its pieces of every parameter
// and of both AdamW moments as rectangular slices of the named tensors
// (of a TP-replicated parameter, only TP rank 0 writes).
class ShardedState : public StateProvider {
 public:
  ShardedState(std::shared_ptr<ZeroState> s, optim::AdamW& opt) : s_(std::move(s)), opt_(opt) {}

  // Offloaded shards come into memory for the checkpoint (a load marks
  // them changed) and leave again after their next gather.
  std::vector<StateEntry> save_entries() override {
    if (s_->offload) s_->offload->page_in_all(/*dirty=*/false);
    return pieces(/*with_model=*/true, /*owned_only=*/true);
  }
  std::vector<StateEntry> load_entries() override {
    if (s_->offload) s_->offload->page_in_all(/*dirty=*/true);
    if (s_->stage() == 3) return pieces(true, false);
    // ZeRO-1/2 hold every parameter whole: read them whole (no gather
    // after loading), and the moments of this rank's shard.
    std::vector<StateEntry> out;
    for (size_t i = 0; i < s_->params.size(); ++i) {
      const at::Tensor& p = s_->params[i];
      std::vector<std::pair<int64_t, int64_t>> all;
      for (int64_t d : p.sizes()) all.emplace_back(0, d);
      for (auto& e : global_entries("model/" + s_->names[i], s_->layouts[i], all, p, false)) out.push_back(std::move(e));
    }
    for (auto& e : pieces(false, false)) out.push_back(std::move(e));
    return out;
  }

 private:
  // Piece pc of a (local) parameter, its values the 1-D `flat`: cut into
  // rectangular blocks of the local tensor, each mapped to the global one.
  void add(std::vector<StateEntry>& out, const std::string& name, const Piece& pc, const at::Tensor& flat) {
    const at::Tensor& p = s_->params[size_t(pc.param)];
    const ParamLayout& layout = s_->layouts[size_t(pc.param)];
    int64_t off = 0;
    for (auto& block : zero::flat_range_blocks(p.sizes().vec(), pc.begin, pc.end)) {
      std::vector<int64_t> shape;
      int64_t count = 1;
      for (auto& r : block) shape.push_back(r.second - r.first), count *= r.second - r.first;
      for (auto& e : global_entries(name, layout, block, flat.narrow(0, off, count).view(shape), true))
        out.push_back(std::move(e));
      off += count;
    }
  }
  std::vector<StateEntry> pieces(bool with_model, bool owned_only) {
    std::vector<StateEntry> out;
    const auto& pcs = s_->layout.pieces;
    for (size_t k = 0; k < pcs.size(); ++k) {
      const Piece& pc = pcs[k];
      if (owned_only && !s_->layouts[size_t(pc.param)].tp_owner) continue;
      const std::string& n = s_->names[size_t(pc.param)];
      if (with_model)
        add(out, "model/" + n, pc,
            s_->units[size_t(pc.unit)].param_shard.narrow(0, pc.shard_offset, pc.end - pc.begin));
      add(out, "optim/exp_avg/" + n, pc, opt_.exp_avg()[k]);
      add(out, "optim/exp_avg_sq/" + n, pc, opt_.exp_avg_sq()[k]);
    }
    return out;
  }

  std::shared_ptr<ZeroState> s_;
  optim::AdamW& opt_;
};

class ZeroSync : public GradSync {
 public:
  ZeroSync(std::vector<std::pair<std::string, at::Tensor>> named_params, std::vector<ParamLayout> layouts,
           std::vector<int> unit_of, model::GptImpl& model, comm::Group& dp, comm::Group& tp,
           comm::Group& pp, ZeroOptions options)
      : s_(std::make_shared<ZeroState>()), model_(model) {
    ZeroState& s = *s_;
    s.options = options;
    s.dp = &dp;
    s.tp = &tp;
    s.pp = &pp;
    s.layouts = std::move(layouts);
    s.unit_of = std::move(unit_of);
    std::vector<int64_t> numel;
    for (auto& [name, p] : named_params) {
      if (p.scalar_type() != at::kFloat || p.device() != dp.device() || !p.is_contiguous() ||
          !p.requires_grad())
        throw Error(ErrorCode::internal, "ZeRO: parameter " + name + " is not a contiguous fp32 tensor on " +
                                             dp.device().str() + " requiring grad");
      s.names.push_back(name);
      s.params.push_back(p);
      numel.push_back(p.numel());
    }
    s.layout = zero::make_flat_layout(numel, s.unit_of, dp.size(), dp.rank());
    build_buffers();
    std::vector<int> backward_order;
    for (int u = int(s.units.size()) - 1; u >= 0; --u) backward_order.push_back(u);
    ZeroState* state = s_.get();  // owns the hooks, so outlives every launch
    s.hooks = BucketHooks(s.unit_of, std::move(backward_order), [state](int u) { state->launch(u); });
    s.hooks.install(s.params);
    if (s.stage() == 3) {
      s.tied = model.config().tie_embeddings;
      hooks_ = std::make_unique<GatherHooks>(s_);
      model_.set_unit_hooks(hooks_.get());
      for (size_t u = 0; u < s.units.size(); ++u) s.release(int(u));
      if (options.offload_params()) {
        std::vector<at::Tensor> shards;
        for (auto& u : s.units) shards.push_back(u.param_shard);
        s.offload = std::make_unique<zero::ParamOffload>(
            std::move(shards),
            zero::ParamOffloadOptions{options.offload_file, options.offload_host, options.offload_drop_writes});
      }
    }
  }

  ~ZeroSync() override {
    if (hooks_) model_.set_unit_hooks(nullptr);
    for (const at::Tensor& p : s_->params) model::unregister_grad_slot_of(p, s_.get());
  }

  void begin_micro(int micro, bool last) override {
    ZeroState& s = *s_;
    // ZeRO-1/2 before the last micro-step: grads accumulate locally.
    // ZeRO-3 reduce-scatters every micro-step.
    s.hooks.set_enabled(last || s.stage() == 3);
    if (s.offload && micro == 0) s.offload->reset_peak();  // memory() reports this step's most
    if (s.stage() == 3 && micro > 0) {
      s.hooks.launch_rest();
      for (size_t u = 0; u < s.units.size(); ++u) s.wait_reduce(int(u));
      s.hooks.reset();
    }
  }

  SyncStats finish() override {
    ZeroState& s = *s_;
    SyncStats stats;
    stats.buckets = int(s.units.size());
    const auto t0 = std::chrono::steady_clock::now();
    s.hooks.launch_rest();
    for (size_t u = 0; u < s.units.size(); ++u) s.wait_reduce(int(u));
    std::vector<at::Tensor> partial;  // sequence parallelism: sums of this rank's positions only
    for (const Piece& pc : s.layout.pieces)
      if (s.layouts[size_t(pc.param)].sum_grad_over_tp)
        partial.push_back(s.units[size_t(pc.unit)].grad_shard.narrow(0, pc.shard_offset, pc.end - pc.begin));
    sum_over_tp(partial, *s.tp);
    // Shared parameters: no rank's optimizer writes its shard before every
    // rank is done reading the others' in this step's backward.
    if (s.shared) s.meet();
    stats.wait_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() +
                   s.exposed_gather_s;
    stats.launched_in_backward = s.hooks.take_launched_in_backward();
    s.exposed_gather_s = 0;
    s.hooks.reset();
    return stats;
  }

  // Each rank's shard holds distinct elements: the partial sums of squares
  // add up over dp (and, for TP-split parameters, over tp) to the global
  // one, every element counted once (a TP-replicated one by TP rank 0).
  double clip(double max_norm, double& scale) override {
    ZeroState& s = *s_;
    std::vector<at::Tensor> grads;
    std::vector<bool> counted;
    const bool all_owned = std::all_of(s.layouts.begin(), s.layouts.end(), [](auto& l) { return l.tp_owner; });
    if (s.tp->size() == 1 && all_owned) {
      for (auto& u : s.units) grads.push_back(u.grad_shard);  // padding: zeros
    } else {
      for (const Piece& pc : s.layout.pieces) {
        grads.push_back(s.units[size_t(pc.unit)].grad_shard.narrow(0, pc.shard_offset, pc.end - pc.begin));
        counted.push_back(s.layouts[size_t(pc.param)].tp_owner);
      }
    }
    // pp: stages hold disjoint parameters.
    return clip_grad_norm(grads, counted, {s.tp, s.dp, s.pp}, max_norm, 0, &scale);
  }

  OptimizerParams optimizer_params() override {
    ZeroState& s = *s_;
    OptimizerParams o;
    // A view is cut of a shard in memory (narrow checks the storage's
    // size); it stays valid while the shard is away and sees it once back.
    if (s.offload) s.offload->page_in_all(/*dirty=*/false);
    for (const Piece& pc : s.layout.pieces) {
      const int64_t len = pc.end - pc.begin;
      o.names.push_back(fmt::format("{}[{}:{}]", s.names[size_t(pc.param)], pc.begin, pc.end));
      o.params.push_back(s.units[size_t(pc.unit)].param_shard.narrow(0, pc.shard_offset, len));
      o.grads.push_back(s.units[size_t(pc.unit)].grad_shard.narrow(0, pc.shard_offset, len));
      o.decay.push_back(s.params[size_t(pc.param)].dim() >= 2);
      if (s.offload) o.page_group.push_back(pc.unit);
    }
    // Offloaded: the optimizer updates a unit's shard in memory, reading the
    // next one meanwhile, and writes it back.
    if (s.offload)
      o.page = [weak = std::weak_ptr<ZeroState>(s_)](int u, bool in) {
        auto st = weak.lock();
        if (!st) return;
        if (in) {
          st->offload->page_in(u);
          if (st->options.offload_prefetch) st->offload->prefetch(u + 1);
        } else {
          st->offload->mark_dirty(u);
          st->offload->page_out(u);
        }
      };
    if (s.offload)
      for (int u = 0; u < s.offload->units(); ++u) s.offload->page_out(u);
    return o;
  }

  // ZeRO-1/2: every rank's updated shard into everyone's parameters.
  // ZeRO-3: start gathering the first unit for the next forward.
  void after_optimizer_step() override {
    ZeroState& s = *s_;
    if (s.stage() == 3) {
      if (s.shared) s.sync_due = true;
      else if (s.options.prefetch) s.start_gather(0, 1);
      return;
    }
    if (s.dp->size() == 1) return;
    std::vector<comm::WorkPtr> works;
    std::vector<at::Tensor> sources;
    for (auto& u : s.units) {
      sources.push_back(u.param_shard.clone());  // [S]: never gather from inside the output
      works.push_back(s.dp->all_gather(sources.back(), u.full, /*async=*/true));
    }
    for (auto& w : works) w->wait();
  }

  void zero() override {
    ZeroState& s = *s_;
    if (s.stage() == 1) {
      s.grad_all.zero_();
      return;
    }
    // Every unit is reduce-scattered before finish() returns (launch_rest),
    // so the step's first reduce overwrites each whole shard, padding too.
    for (auto& u : s.units) u.shard_stale = true;
  }

  ModelBytes memory() const override {
    const ZeroState& s = *s_;
    ModelBytes b;
    if (s.offload) {
      b.params = s.offload->peak_bytes();
      b.offloaded = s.offload->bytes();
    } else {
      b.params = s.shared ? s.shard_numel * int64_t(sizeof(float))  // this rank's share of the segment
                          : int64_t((s.stage() == 3 ? s.param_shards_all : s.full_all).nbytes());
    }
    b.grads = int64_t((s.stage() == 1 ? s.grad_all : s.grad_shards_all).nbytes());
    return b;
  }

  std::unique_ptr<StateProvider> state(optim::AdamW& optimizer) override {
    return std::make_unique<ShardedState>(s_, optimizer);
  }

  std::string describe() const override {
    const ZeroState& s = *s_;
    int64_t numel = 0, padded = 0;
    for (auto& u : s.layout.units) numel += u.numel, padded += u.padded;
    std::string d = fmt::format("ZeRO-{}{}: {} units, flat and padded ({} + {} padding elements), over dp {} ({})",
                                s.stage(), s.stage() == 3 ? " (FSDP full shard)" : "", s.units.size(), numel,
                                padded - numel, s.dp->size(), s.dp->backend());
    if (s.shared)
      d += ", parameters in one shared-memory segment of the machine (each rank updates its shard in place; "
           "nothing gathered)";
    else if (s.stage() == 3)
      d += fmt::format(", reshard_after_forward {}, prefetch {}",
                       s.options.reshard_after_forward ? "on" : "off", s.options.prefetch ? "on" : "off");
    if (!s.input_pool.empty())
      d += fmt::format("; reduce-scatter inputs in {} buffers of the dp group's symmetric buffer (read in place)",
                       s.input_pool.size());
    if (s.offload)
      d += fmt::format("; parameter shards ({} bytes) in {} between uses", s.offload->bytes(), s.offload->where());
    if (s.dp->size() == 1) d += "; dp = 1: nothing to shard, this rank holds everything";
    return d;
  }

  optim::OffloadFile* offloaded_params() override { return s_->offload.get(); }

 private:
  // Lays out every unit's flat buffers (one allocation per kind) and makes
  // the parameters (and, for ZeRO-1, their grads) views of them.
  void build_buffers() {
    ZeroState& s = *s_;
    const auto& lu = s.layout.units;
    int64_t padded = 0, shards = 0;
    for (auto& u : lu) padded += u.padded, shards += u.shard;
    const auto opts = s.params.front().options().requires_grad(false);
    if (s.stage() < 3) s.full_all = at::zeros({padded}, opts);                 // [sum padded]
    // Offloaded shards each own their storage: one leaves memory alone.
    const bool own_shards = s.options.offload_params();
    if (s.stage() == 3 && s.options.shared_params && !own_shards && s.dp->size() > 1 &&
        s.dp->device().is_cpu() && opts.dtype() == at::kFloat) {
      s.full_all = comm::shared_buffer(*s.dp, padded, at::kFloat);  // [sum padded], one per machine
      s.shared = s.full_all.defined();
    }
    if (s.stage() == 1) {
      // As DDP's buckets: in the dp group's symmetric buffer where it runs
      // through shared memory (each unit's all-reduce then adds in place).
      if (s.dp->size() > 1 && s.dp->device().is_cpu() && opts.dtype() == at::kFloat)
        s.grad_all = comm::symmetric_buffer(*s.dp, padded, at::kFloat);
      if (!s.grad_all.defined()) s.grad_all = at::zeros({padded}, opts);      // [sum padded]
    }
    if (s.stage() == 3 && !own_shards && !s.shared) s.param_shards_all = at::zeros({shards}, opts);  // [sum S]
    if (s.stage() > 1) s.grad_shards_all = at::zeros({shards}, opts);          // [sum S]
    // ZeRO-2/3: the reduce-scatter inputs' pool (zero_state.h), in the dp
    // group's symmetric buffer where it runs through shared memory.
    if (s.stage() > 1 && s.dp->size() > 1 && s.dp->device().is_cpu() && opts.dtype() == at::kFloat) {
      int64_t largest = 0;
      for (auto& u : lu) largest = std::max(largest, u.padded);
      const at::Tensor pool = comm::symmetric_buffer(*s.dp, ZeroState::kInputPool * largest, at::kFloat);
      for (int k = 0; pool.defined() && k < ZeroState::kInputPool; ++k)
        s.input_pool.push_back(pool.narrow(0, k * largest, largest));
      s.pool_user.assign(s.input_pool.size(), -1);
      s.pool_of.assign(lu.size(), -1);
      s.launched_at.assign(lu.size(), 0);
    }
    s.units.resize(lu.size());
    at::NoGradGuard no_grad;
    int64_t full_off = 0, shard_off = 0;
    for (size_t ui = 0; ui < lu.size(); ++ui) {
      const zero::FlatUnit& fu = lu[ui];
      Unit& u = s.units[ui];
      const int64_t begin = s.shard_begin(fu);
      const bool flat_all = s.stage() < 3 || s.shared;
      u.full = flat_all ? s.full_all.narrow(0, full_off, fu.padded) : at::zeros({fu.padded}, opts);
      // Shared: this rank writes its own shard only (the ranks' initial
      // values are the same), the others theirs, then one barrier below.
      at::Tensor fill = s.shared ? at::zeros({fu.padded}, opts) : u.full;
      for (size_t k = 0; k < fu.params.size(); ++k) {
        at::Tensor& p = s.params[size_t(fu.params[k])];
        fill.narrow(0, fu.offsets[k], p.numel()).copy_(p.reshape({-1}));
        // [param shape] view into the unit's flat buffer
        p.set_data(u.full.narrow(0, fu.offsets[k], p.numel()).view(p.sizes()));
      }
      if (s.shared) u.full.narrow(0, begin, fu.shard).copy_(fill.narrow(0, begin, fu.shard));
      if (flat_all) {
        u.param_shard = u.full.narrow(0, begin, fu.shard);
      } else {
        u.param_shard = own_shards ? at::empty({fu.shard}, opts) : s.param_shards_all.narrow(0, shard_off, fu.shard);
        u.param_shard.copy_(u.full.narrow(0, begin, fu.shard));
      }
      if (s.stage() == 1) {
        u.grad_full = s.grad_all.narrow(0, full_off, fu.padded);
        for (size_t k = 0; k < fu.params.size(); ++k) {
          at::Tensor& p = s.params[size_t(fu.params[k])];
          p.mutable_grad() = u.grad_full.narrow(0, fu.offsets[k], p.numel()).view(p.sizes());
        }
        u.grad_shard = u.grad_full.narrow(0, begin, fu.shard);
      } else {
        u.grad_shard = s.grad_shards_all.narrow(0, shard_off, fu.shard);
      }
      full_off += fu.padded;
      shard_off += fu.shard;
    }
    s.shard_numel = shard_off;
    if (s.shared) {
      s.meet();           // every shard in place before any rank reads one
      s.sync_due = true;  // and again after a checkpoint load writes them
    }
    // ZeRO-2/3: the linear layers compute a unit's weight grads straight
    // into its next reduce-scatter input (launch copies the others).
    if (s.stage() > 1) {
      ZeroState* state = s_.get();  // unregisters them in ~ZeroSync
      for (size_t ui = 0; ui < lu.size(); ++ui)
        for (size_t k = 0; k < lu[ui].params.size(); ++k) {
          const int i = lu[ui].params[k];
          const int64_t offset = lu[ui].offsets[k];
          model::register_grad_slot(
              s.params[size_t(i)], s.params[size_t(i)].device(),
              [state, u = int(ui), offset, i] { return state->grad_slot(u, offset, i); }, state);
        }
    }
  }

  std::shared_ptr<ZeroState> s_;
  model::GptImpl& model_;
  std::unique_ptr<GatherHooks> hooks_;
};

}  // namespace

std::unique_ptr<GradSync> make_zero_sync(std::vector<std::pair<std::string, at::Tensor>> named_params,
                                         std::vector<ParamLayout> layouts, std::vector<int> unit_of,
                                         model::GptImpl& model, comm::Group& dp, comm::Group& tp,
                                         comm::Group& pp, ZeroOptions options) {
  if (options.stage < 1 || options.stage > 3)
    throw Error(ErrorCode::config, "parallel.zero = " + std::to_string(options.stage) + " is not a ZeRO stage",
                "use 0 (DDP), 1, 2 or 3");
  if (options.offload_params() && options.stage != 3)
    throw Error(ErrorCode::config, "train.offload.params needs parallel.zero = 3 (here ZeRO-" +
                                       std::to_string(options.stage) + ")",
                "set parallel.zero: 3, or train.offload.params: none");
  return std::make_unique<ZeroSync>(std::move(named_params), std::move(layouts), std::move(unit_of), model,
                                    dp, tp, pp, options);
}

}  // namespace dtrain::engine::parallel
