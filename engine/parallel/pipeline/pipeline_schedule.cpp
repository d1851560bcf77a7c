// The pipeline runtime (pipeline_schedule.h): executes this stage's action
// list. Sends are posted and waited for at the end of the step (the plan's
// model: non-blocking sends, blocking receives); receives are posted
// kRecvAhead receive actions early and waited for where the plan has them
// (a Gloo send moves its data only once the receiver has posted the
// receive: posted late, every hop costs a round trip at the point of
// need, which interleaved schedules, with v times the hops, pay v times
// over). A message's tag is derived
// from its micro-batch and direction, so a receive takes exactly the
// matching send. The stage keeps, per micro-batch in flight, its input
// activation (a leaf whose grad goes back), its output (or its loss on the
// last stage) and the received output gradient, and drops them after the
// micro-batch's backward.
#include "engine/parallel/pipeline/pipeline_schedule.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "common/error.h"
#include "common/log.h"
#include "common/timeline.h"
#include "engine/comm/round_abort.h"
#include "engine/comm/traced_group.h"
#include "engine/parallel/autocast_scope.h"
#include "engine/parallel/pipeline/split_backward.h"
#include "plan/pipeline_plan.h"

namespace dtrain::engine::parallel {
namespace pipeline = plan::pipeline;  // the plan this runtime executes (plan/pipeline_plan.h)
namespace {

using pipeline::Action;
using pipeline::Op;

bool starts_with(const std::string& s, const std::string& head) { return s.rfind(head, 0) == 0; }

// The timeline's kind of each action (common/timeline.h).
timeline::Kind timeline_kind(Op op) {
  switch (op) {
    case Op::forward: return timeline::Kind::forward;
    case Op::backward: return timeline::Kind::backward;
    case Op::send_act: return timeline::Kind::send_act;
    case Op::recv_act: return timeline::Kind::recv_act;
    case Op::send_grad: return timeline::Kind::send_grad;
    case Op::recv_grad: return timeline::Kind::recv_grad;
    case Op::backward_input: return timeline::Kind::backward_input;
    case Op::backward_weight: return timeline::Kind::backward_weight;
  }
  return timeline::Kind::forward;
}

// The aux losses of the MoE layers among blocks [begin, end) from their
// last forward, summed in block order as GptImpl::moe_aux_loss does
// (undefined: no MoE block there).
at::Tensor stage_aux_loss(const model::GptImpl& model, int begin, int end) {
  at::Tensor total;
  for (int i = begin; i < end; ++i)
    if (const auto& m = model.blocks->ptr(size_t(i))->as<model::Block>()->moe; m && m->last_aux.defined())
      total = total.defined() ? total + m->last_aux : m->last_aux;
  return total;
}

// Receives posted ahead of the one being waited for: one per direction in a
// steady 1F1B state (the next forward's activation, the next backward's
// gradient). Each holds one [B, T, C] buffer until its action runs.
constexpr size_t kRecvAhead = 2;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Pipeline : public Schedule {
 public:
  Pipeline(pipeline::PlanSpec spec, comm::Group& pp, PipelineStage stage, std::vector<int64_t> activation,
           bool fault_drop_grad)
      : spec_(std::move(spec)), pp_(pp), stage_(stage), activation_(std::move(activation)),
        fault_drop_grad_(fault_drop_grad) {
    const pipeline::Plan plan = pipeline::build_plan(spec_);
    const pipeline::SimResult sim = pipeline::simulate(spec_, plan);
    if (!sim.ok)
      throw Error(ErrorCode::config,
                  "parallel.pipeline.schedule = " + to_string(spec_.kind) + " for pp = " + std::to_string(spec_.stages) +
                      ", grad_accum = " + std::to_string(spec_.micro) + ": the simulator rejects its plan: " + sim.error,
                  "use parallel.pipeline.schedule 1f1b or gpipe");
    actions_ = plan.at(size_t(stage_.rank));
    for (size_t i = 0; i < actions_.size(); ++i)
      if (actions_[i].op == Op::recv_act || actions_[i].op == Op::recv_grad) recvs_.push_back(i);
    for (const Action& a : actions_)
      if (a.op == Op::send_act || a.op == Op::send_grad) {
        const pipeline::Peer to = pipeline::peer(spec_, stage_.rank, a);
        send_to_.push_back({to.rank, tag(a.micro, to.chunk, a.op == Op::send_grad)});
      }
    simulated_bubble_ = sim.bubble;
    if (stage_.rank == 0)
      DTRAIN_INFO("pipeline plan (simulated: bubble {:.1f}%, ideal {:.1f}%):\n{}", 100 * sim.bubble,
                  100 * pipeline::ideal_bubble(spec_), pipeline::format_plan(spec_, plan));
  }

  // The measured bubble: the share of the schedule's wall time this rank
  // spent blocked (receives, the step's pending sends, the loss all-reduce)
  // rather than computing, over the steps after the first (warm-up).
  std::string summary() const override {
    if (timed_steps_ == 0) return {};
    char text[320];
    std::snprintf(text, sizeof text,
                  "pipeline rank %d: measured bubble %.1f%% (blocked %.2f of %.2f ms/step over %d steps after "
                  "the first; simulated %.1f%%, ideal %.1f%%)",
                  stage_.rank, 100 * idle_s_ / run_s_, 1e3 * idle_s_ / timed_steps_, 1e3 * run_s_ / timed_steps_,
                  timed_steps_, 100 * simulated_bubble_, 100 * pipeline::ideal_bubble(spec_));
    return text;
  }

  double run(ModelParts& parts, GradSync& sync, BatchSource& batches, const StepOptions& options) override {
    model::GptImpl& model = *parts.model;
    const c10::Device device = pp_.device();
    const auto act_options = at::TensorOptions().dtype(at::kFloat).device(device);
    std::map<std::pair<int, int>, Micro> micro;  // by (micro-batch, chunk)
    size_t next_send = 0;
    std::vector<comm::WorkPtr> sends;
    std::vector<at::Tensor> sent;  // alive until their sends complete
    // A split backward (zb_h1) accumulates every micro-batch's weight
    // gradients outside the whole-backward order the gradient sync overlaps
    // with: its reduction then runs in sync.finish(), after the step.
    const bool reduce_in_backward = spec_.kind != PipelineSchedule::zb_h1;
    const int backward_total = spec_.micro * stage_.chunks;
    std::vector<at::Tensor> params;
    if (!reduce_in_backward)
      for (auto& [name, p] : parts.named_params) params.push_back(p);
    double loss_sum = 0;
    int backwards = 0;
    const double start = now_s();
    double idle = 0;  // seconds blocked on the pp group in this step
    auto blocked = [&idle](auto&& wait) {
      const double t0 = now_s();
      wait();
      idle += now_s() - t0;
    };
    uint64_t message_bytes = 4;  // an activation or its gradient, fp32 [B, T, C]
    for (int64_t d : activation_) message_bytes *= uint64_t(d);
    // Early receives: recvs_[k] is the k-th receive action; posted[k] its
    // buffer and work once posted, which is kRecvAhead receives ahead of
    // the one consumed (the tags are unique per step, so the order in
    // which receives are posted does not affect which message each takes).
    std::map<size_t, std::pair<at::Tensor, comm::WorkPtr>> posted;
    size_t next_post = 0, consumed = 0;
    auto post_ahead = [&] {
      for (; next_post < recvs_.size() && next_post < consumed + kRecvAhead; ++next_post) {
        const Action& r = actions_[recvs_[next_post]];
        at::Tensor buf = at::empty(activation_, act_options);  // [B, T, C]
        comm::WorkPtr w = pp_.recv(buf, pipeline::peer(spec_, stage_.rank, r).rank,
                                   tag(r.micro, r.chunk, r.op == Op::recv_grad));
        posted.emplace(next_post, std::make_pair(buf, std::move(w)));
      }
    };
    auto take_recv = [&] {  // the next receive's buffer, once its message is in
      post_ahead();
      auto it = posted.find(consumed++);
      at::Tensor buf = it->second.first;
      blocked([&] { it->second.second->wait(); });
      posted.erase(it);
      post_ahead();
      return buf;
    };
    post_ahead();
    for (const Action& a : actions_) {
      comm::throw_if_round_aborted("the pipeline schedule");  // a round the agent ended: leave at once
      const int64_t action_begin = timeline::recording() ? timeline::now_ns() : 0;
      Micro& m = micro[{a.micro, a.chunk}];
      const bool first = stage_.first(a.chunk), last = stage_.last(a.chunk);
      switch (a.op) {
        case Op::forward: {
          comm::trace_phase(trace::Phase::forward);
          at::Tensor x;
          if (first || last) {
            // The batch buffers are refilled by the next micro-batch's forward
            // before this one's backward, which reads the tokens (the
            // embedding's indices): each micro-batch keeps its own copy.
            batches.micro_batch(a.micro, inputs_, targets_);  // [B, T] each
            if (first) m.tokens = inputs_.clone();
            if (last) m.targets = targets_.clone();
          }
          model.set_dropout_position({options.seed, options.step, batches.global_rows(), batches.row_begin(a.micro)});
          AutocastScope autocast(device.type(), options.bf16);
          if (first && !reduce_in_backward) {
            // A split backward stops at the embedding's output: its input
            // half runs the blocks, its weight half also the embedding.
            m.embedded = model.embed(m.tokens);  // [B, T, C]
            m.input = m.embedded.detach().requires_grad_(true);
          }
          x = first && reduce_in_backward ? model.embed(m.tokens) : m.input;
          at::Tensor y = model.run_blocks(x, stage_.first_block(a.chunk), stage_.last_block(a.chunk));  // [B, T, C]
          // The MoE blocks' aux losses of this chunk (undefined: none) join
          // its own backward and the step's loss, as loss() adds them on one
          // process; read now, before the next forward overwrites them.
          const at::Tensor aux = stage_aux_loss(model, stage_.first_block(a.chunk), stage_.last_block(a.chunk));  // []
          if (aux.defined()) loss_sum += aux.item<double>();
          if (last) {
            m.loss = model.head_loss(y, m.targets);  // [] mean over B*T
            loss_sum += m.loss.item<double>();
            if (aux.defined()) m.loss = m.loss + aux;
          } else {
            m.output = y;
            m.aux = aux;
          }
          break;
        }
        case Op::send_act: {
          const auto [to, t] = send_to_.at(next_send++);
          sent.push_back(m.output.detach().contiguous());
          sends.push_back(pp_.send(sent.back(), to, t));
          break;
        }
        case Op::recv_act: {
          m.input = take_recv().requires_grad_(true);  // [B, T, C]
          break;
        }
        case Op::recv_grad: {
          m.output_grad = take_recv();  // [B, T, C]
          break;
        }
        case Op::backward: {
          sync.begin_micro(backwards, reduce_in_backward && backwards == backward_total - 1);
          ++backwards;
          comm::trace_phase(trace::Phase::backward);
          if (last)
            m.loss.mul(options.loss_scale).backward();
          else if (m.aux.defined())
            stage_root(m, options.loss_scale).backward();
          else
            m.output.backward(m.output_grad);
          m.loss = m.output = m.output_grad = m.tokens = m.targets = m.aux = at::Tensor();
          break;
        }
        case Op::backward_input: {
          comm::trace_phase(trace::Phase::backward);
          if (last)
            m.input_grad = m.split.backward_input(m.loss.mul(options.loss_scale), {}, m.input, params);
          else if (m.aux.defined())
            m.input_grad = m.split.backward_input(stage_root(m, options.loss_scale), {}, m.input, params);
          else
            m.input_grad = m.split.backward_input(m.output, m.output_grad, m.input, params);
          m.aux = at::Tensor();
          m.output_grad = at::Tensor();
          break;
        }
        case Op::backward_weight: {
          sync.begin_micro(backwards++, false);
          comm::trace_phase(trace::Phase::backward);
          m.split.backward_weight();
          if (m.embedded.defined()) m.embedded.backward(m.input_grad);
          m = Micro{};
          break;
        }
        case Op::send_grad: {
          const auto [to, t] = send_to_.at(next_send++);
          sent.push_back(m.input_grad.defined() ? m.input_grad : m.input.grad());
          if (fault_drop_grad_) sent.back() = at::zeros_like(sent.back());  // fault.kind no_pp_grad
          sends.push_back(pp_.send(sent.back(), to, t));
          if (!m.input_grad.defined()) m.input = at::Tensor();  // a split backward still needs it
          break;
        }
      }
      if (action_begin != 0) {
        const bool message = a.op == Op::send_act || a.op == Op::recv_act || a.op == Op::send_grad || a.op == Op::recv_grad;
        timeline::record(timeline_kind(a.op), action_begin, a.micro, a.chunk, message ? message_bytes : 0);
      }
    }
    blocked([&] {
      for (auto& w : sends) w->wait();
    });
    // The losses live on the last stage; every stage returns their sum.
    at::Tensor t = at::full({1}, loss_sum, at::TensorOptions().dtype(at::kDouble).device(device));  // [1]
    blocked([&] { pp_.all_reduce(t); });
    if (steps_seen_++ > 0) {
      idle_s_ += idle;
      run_s_ += now_s() - start;
      ++timed_steps_;
    }
    return t.item<double>();
  }

  // Forward only, one micro-batch at a time through the stages in order
  // (global stage g = chunk * size + rank hands its output to g + 1): a
  // single activation in flight, so no plan is needed and none can deadlock.
  // The last stage sums the losses; the caller reduces them over the world.
  EvalSums evaluate(ModelParts& parts, BatchSource& batches, const EvalOptions& options) override {
    model::GptImpl& model = *parts.model;
    const c10::Device device = pp_.device();
    const auto act_options = at::TensorOptions().dtype(at::kFloat).device(device);
    const int stages = stage_.size * stage_.chunks;
    EvalSums sums;
    std::vector<comm::WorkPtr> sends;
    std::vector<at::Tensor> sent;  // alive until their sends complete
    for (int m = 0; m < int(options.rows.size()); ++m) {
      for (int chunk = 0; chunk < stage_.chunks; ++chunk) {
        const int g = stage_.global_stage(chunk);
        const bool first = stage_.first(chunk), last = stage_.last(chunk);
        if (first || last) batches.micro_batch(m, inputs_, targets_);  // [B, T] each
        at::Tensor x;
        if (first) {
          AutocastScope autocast(device.type(), options.bf16);
          x = model.embed(inputs_);  // [B, T, C]
        } else {
          x = at::empty(activation_, act_options);  // [B, T, C]
          pp_.recv(x, (g - 1) % stage_.size, tag(m, chunk, false))->wait();
        }
        AutocastScope autocast(device.type(), options.bf16);
        at::Tensor y = model.run_blocks(x, stage_.first_block(chunk), stage_.last_block(chunk));  // [B, T, C]
        if (last) {
          sums += head_loss_rows(model, y, targets_, options.rows[size_t(m)]);
        } else if (g + 1 < stages) {
          sent.push_back(y.to(at::kFloat).contiguous());
          sends.push_back(pp_.send(sent.back(), (g + 1) % stage_.size, tag(m, (g + 1) / stage_.size, false)));
        }
      }
    }
    for (auto& w : sends) w->wait();
    return sums;
  }

  const char* name() const override { return to_string(spec_.kind).c_str(); }

 private:
  struct Micro {
    at::Tensor input;        // received activation (leaf, requires grad)
    at::Tensor output;       // this stage's output, until its backward
    at::Tensor output_grad;  // received gradient of `output`
    at::Tensor loss;         // last stage
    at::Tensor targets;      // last stage
    at::Tensor tokens;       // first stage
    at::Tensor input_grad;   // the input half's gradient of `input` (split backward)
    at::Tensor embedded;     // first stage, split backward: the embedding's output
    SplitBackward split;     // between a split backward's halves
    at::Tensor aux;          // not the last stage: this chunk's MoE aux losses [], until its backward
  };
  // A stage with MoE blocks before the last: one scalar root whose gradient
  // is output_grad at the output (d(sum(y * g))/dy = g, exactly) and the
  // loss scale at the aux losses, so one backward (or its split halves)
  // takes both.
  static at::Tensor stage_root(const Micro& m, double loss_scale) {
    return (m.output * m.output_grad).sum() + m.aux.mul(loss_scale);  // []
  }
  // A message's tag, from the receiving side's (micro-batch, chunk) and
  // its direction (activation forward, gradient backward).
  int tag(int micro, int chunk, bool grad) const { return (micro * stage_.chunks + chunk) * 2 + (grad ? 1 : 0); }

  pipeline::PlanSpec spec_;
  comm::Group& pp_;
  PipelineStage stage_;
  std::vector<int64_t> activation_;
  bool fault_drop_grad_ = false;
  std::vector<Action> actions_;
  std::vector<size_t> recvs_;  // indices of the receive actions in actions_, in order
  std::vector<std::pair<int, int>> send_to_;  // per send action, in order: (peer rank, tag)
  at::Tensor inputs_, targets_;
  double simulated_bubble_ = 0;
  int steps_seen_ = 0, timed_steps_ = 0;
  double idle_s_ = 0, run_s_ = 0;  // summed over the timed steps
};

}  // namespace

bool PipelineStage::holds_block(int block) const {
  for (size_t s = 0; s + 1 < begin.size(); ++s)
    if (block >= begin[s] && block < begin[s + 1]) return int(s) % size == rank;
  return false;
}

PipelineStage pipeline_stage(const std::vector<int>& stage_layers, int rank, int size, int chunks) {
  std::string shown;
  for (int n : stage_layers) shown += (shown.empty() ? "" : ", ") + std::to_string(n);
  const bool positive = std::all_of(stage_layers.begin(), stage_layers.end(), [](int n) { return n >= 1; });
  if (size < 1 || chunks < 1 || int(stage_layers.size()) != size * chunks || !positive)
    throw Error(ErrorCode::config,
                "pipeline stages [" + shown + "] (blocks per stage) do not fit parallel.pp = " + std::to_string(size) +
                    " x parallel.pipeline.virtual_stages = " + std::to_string(chunks) + " stages of >= 1 block",
                "give parallel.pipeline.layers_per_stage one entry >= 1 per stage, or pp and virtual_stages "
                "whose product divides model.layers");
  PipelineStage st;
  st.rank = rank;
  st.size = size;
  st.chunks = chunks;
  st.begin.push_back(0);
  for (int n : stage_layers) st.begin.push_back(st.begin.back() + n);
  return st;
}

bool stage_keeps(const std::string& name, const PipelineStage& stage, bool tie_embeddings) {
  bool mine = false;
  if (starts_with(name, "wte.") || starts_with(name, "wpe.")) mine = stage.first(0);
  // A tied head reads wte: the last stage keeps a copy (tied_embedding.h).
  if (name == "wte.weight" && tie_embeddings) mine = mine || stage.last(stage.chunks - 1);
  else if (starts_with(name, "ln_f.") || starts_with(name, "head.")) mine = stage.last(stage.chunks - 1);
  else if (starts_with(name, "blocks.")) mine = stage.holds_block(std::atoi(name.c_str() + 7));
  return mine;
}

void keep_stage_parameters(ModelParts& parts, const PipelineStage& stage) {
  std::vector<std::pair<std::string, at::Tensor>> kept;
  at::NoGradGuard no_grad;
  for (auto& [name, p] : parts.named_params) {
    if (stage_keeps(name, stage, parts.model->config().tie_embeddings)) {
      kept.emplace_back(name, p);
    } else {
      at::Tensor other = p;
      other.set_data(at::empty({0}, p.options()));  // another stage's: release it
    }
  }
  parts.named_params = std::move(kept);
}

std::unique_ptr<Schedule> make_pipeline_schedule(PipelineSchedule kind, int micro, comm::Group& pp,
                                                 PipelineStage stage, std::vector<int64_t> activation,
                                                 bool fault_drop_grad) {
  pipeline::PlanSpec spec;
  spec.kind = kind;
  spec.stages = stage.size;
  spec.micro = micro;
  spec.virtual_stages = stage.chunks;
  if (fault_drop_grad && stage.rank == 0)
    DTRAIN_WARN("fault.kind = no_pp_grad: every stage sends zeros back instead of its input's gradient "
                "(a wrong layout on purpose)");
  return std::make_unique<Pipeline>(std::move(spec), pp, stage, std::move(activation), fault_drop_grad);
}

}  // namespace dtrain::engine::parallel
