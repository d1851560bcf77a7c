// build_plan, simulate and format_plan (plan.h): pipeline schedules as lists
// of actions, and the checker that runs them against the runtime's model
// (buffered sends, blocking receives, messages matched in order per peer and
// direction). Pure C++; nothing here touches tensors or sockets.
#include "plan/pipeline_plan.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <deque>
#include <map>
#include <tuple>

#include "common/error.h"
#include "common/job_spec.h"

namespace dtrain::plan::pipeline {

PlanSpec plan_spec_from(const JobSpec& spec) {
  PlanSpec p;
  p.kind = spec.parallel.pipeline_schedule;
  p.stages = spec.parallel.pp;
  p.micro = spec.train.grad_accum;
  p.virtual_stages = spec.parallel.pipeline_virtual_stages;
  return p;
}

namespace {

bool is_compute(Op op) {
  return op == Op::forward || op == Op::backward || op == Op::backward_input || op == Op::backward_weight;
}
bool is_send(Op op) { return op == Op::send_act || op == Op::send_grad; }

std::string str(int v) { return std::to_string(v); }

// ---- building ---------------------------------------------------------------

// Appends a compute with its receive before and its send after, where the
// stage has a peer in that direction.
struct ListBuilder {
  int p, v, rank;
  std::vector<Action>& out;

  void forward(int micro, int chunk) {
    int s = chunk * p + rank;
    if (s > 0) out.push_back({Op::recv_act, micro, chunk});
    out.push_back({Op::forward, micro, chunk});
    if (s < p * v - 1) out.push_back({Op::send_act, micro, chunk});
  }
  void backward(int micro, int chunk, Op op = Op::backward) {
    int s = chunk * p + rank;
    if (s < p * v - 1) out.push_back({Op::recv_grad, micro, chunk});
    out.push_back({op, micro, chunk});
    if (s > 0) out.push_back({Op::send_grad, micro, chunk});
  }
};

void build_gpipe(int p, int m, int rank, std::vector<Action>& out) {
  ListBuilder b{p, 1, rank, out};
  for (int i = 0; i < m; ++i) b.forward(i, 0);
  for (int i = 0; i < m; ++i) b.backward(i, 0);
}

// Megatron's forward_backward_pipelining_without_interleaving.
void build_1f1b(int p, int m, int rank, std::vector<Action>& out) {
  ListBuilder b{p, 1, rank, out};
  int warmup = std::min(p - rank - 1, m);
  for (int i = 0; i < warmup; ++i) b.forward(i, 0);
  for (int i = 0; i < m - warmup; ++i) {
    b.forward(warmup + i, 0);
    b.backward(i, 0);
  }
  for (int i = m - warmup; i < m; ++i) b.backward(i, 0);
}

// Megatron's forward_backward_pipelining_with_interleaving (core v0.7): the
// k-th virtual micro-batch of a rank (k < v*m) runs micro
// (k / (p*v)) * p + k % p on chunk (k % (p*v)) / p for forwards, on chunk
// v-1 - that for backwards: groups of p micro-batches go through all chunks
// before the next group starts. Warm-up: all of them when m == p, else
// 2(p-r-1) + (v-1)p, capped at v*m.
void build_interleaved(int p, int m, int v, int rank, std::vector<Action>& out) {
  ListBuilder b{p, v, rank, out};
  int total = v * m;
  auto micro_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto chunk_of = [&](int k, bool forward) {
    int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  int warmup = m == p ? total : std::min(2 * (p - rank - 1) + (v - 1) * p, total);
  for (int k = 0; k < warmup; ++k) b.forward(micro_of(k), chunk_of(k, true));
  for (int i = 0; i < total - warmup; ++i) {
    b.forward(micro_of(warmup + i), chunk_of(warmup + i, true));
    b.backward(micro_of(i), chunk_of(i, false));
  }
  for (int k = total - warmup; k < total; ++k) b.backward(micro_of(k), chunk_of(k, false));
}

// ZB-H1 (plan.h), built by running the greedy rule of every rank over the
// cost model's ticks: the lists are the order the computes started in.
void build_zb_h1(int p, int m, Plan& plan) {
  const int limit = std::min(p, m);
  struct Rank {
    int next_f = 0, next_b = 0, weights_done = 0, busy_until = 0;
    std::deque<int> pending_weight;
  };
  std::vector<Rank> ranks(static_cast<size_t>(p));
  // When each rank's F(i) and B(i) end: its output reaches the next stage,
  // its input gradient the previous one.
  std::vector<std::vector<int>> f_end(p, std::vector<int>(m, INT_MAX)), b_end = f_end;
  auto done = [&](const Rank& s) { return s.next_b == m && s.pending_weight.empty(); };
  const int give_up = 16 * (m + p) + 16;  // far above any makespan; a bug guard
  for (int t = 0; !std::all_of(ranks.begin(), ranks.end(), done); ++t) {
    if (t > give_up) throw Error(ErrorCode::internal, "pipeline: zb_h1 plan did not finish");
    for (int r = 0; r < p; ++r) {
      Rank& s = ranks[r];
      if (s.busy_until > t || done(s)) continue;
      ListBuilder b{p, 1, r, plan[r]};
      const bool first = r == 0, last = r == p - 1;
      if (s.next_b < s.next_f && (last || b_end[r + 1][s.next_b] <= t)) {
        const int i = s.next_b++;
        b.backward(i, 0, Op::backward_input);
        s.pending_weight.push_back(i);
        s.busy_until = b_end[r][i] = t + cost(Op::backward_input);
        continue;
      }
      const int in_flight = s.next_f - s.weights_done;
      if (s.next_f < m && in_flight < limit && (first || f_end[r - 1][s.next_f] <= t)) {
        const int i = s.next_f++;
        b.forward(i, 0);
        s.busy_until = f_end[r][i] = t + cost(Op::forward);
        continue;
      }
      if (!s.pending_weight.empty()) {
        plan[r].push_back({Op::backward_weight, s.pending_weight.front(), 0});
        s.pending_weight.pop_front();
        ++s.weights_done;
        s.busy_until = t + cost(Op::backward_weight);
      }
    }
  }
}

}  // namespace

int cost(Op op) {
  switch (op) {
    case Op::forward: case Op::backward_input: case Op::backward_weight: return 1;
    case Op::backward: return 2;
    default: return 0;
  }
}

void validate(const PlanSpec& spec) {
  std::vector<std::string> problems;
  if (spec.stages < 1)
    problems.push_back("parallel.pp = " + str(spec.stages) + " must be at least 1");
  if (spec.micro < 1)
    problems.push_back("train.grad_accum = " + str(spec.micro) +
                       " must be at least 1 (it is the number of pipeline micro-batches)");
  if (spec.virtual_stages < 1)
    problems.push_back("parallel.pipeline.virtual_stages = " + str(spec.virtual_stages) +
                       " must be at least 1");
  if (spec.virtual_stages > 1) {
    if (spec.kind != PipelineSchedule::interleaved_1f1b)
      problems.push_back("parallel.pipeline.virtual_stages = " + str(spec.virtual_stages) +
                         " needs parallel.pipeline.schedule = interleaved_1f1b (it is " +
                         to_string(spec.kind) + "); use virtual_stages 1 or schedule interleaved_1f1b");
    if (spec.stages == 1)
      problems.push_back("parallel.pipeline.virtual_stages = " + str(spec.virtual_stages) +
                         " needs parallel.pp >= 2; with pp 1 use virtual_stages 1");
    if (spec.kind == PipelineSchedule::interleaved_1f1b && spec.stages > 1 && spec.micro >= 1 &&
        spec.micro % spec.stages != 0) {
      int lo = spec.micro / spec.stages * spec.stages, hi = lo + spec.stages;
      problems.push_back(
          "train.grad_accum = " + str(spec.micro) + " is not a multiple of parallel.pp = " +
          str(spec.stages) + ", which interleaved_1f1b with virtual_stages > 1 needs; use " +
          (lo > 0 ? "grad_accum " + str(lo) + " or " + str(hi) : "grad_accum " + str(hi)) +
          ", or schedule 1f1b");
    }
  }
  if (problems.empty()) return;
  std::string msg = "invalid pipeline schedule:";
  for (auto& p : problems) msg += "\n  " + p;
  throw Error(ErrorCode::config, msg, "change the fields above");
}

Plan build_plan(const PlanSpec& spec) {
  validate(spec);
  const int p = spec.stages, m = spec.micro, v = spec.virtual_stages;
  Plan plan(p);
  if (spec.kind == PipelineSchedule::zb_h1) {
    build_zb_h1(p, m, plan);
    return plan;
  }
  for (int r = 0; r < p; ++r) {
    if (spec.kind == PipelineSchedule::gpipe)
      build_gpipe(p, m, r, plan[r]);
    else if (spec.kind == PipelineSchedule::one_f_one_b || v == 1)
      build_1f1b(p, m, r, plan[r]);
    else
      build_interleaved(p, m, v, r, plan[r]);
  }
  return plan;
}

Peer peer(const PlanSpec& spec, int rank, const Action& a) {
  const int p = spec.stages;
  const int s = a.chunk * p + rank;
  const bool downstream = a.op == Op::send_act || a.op == Op::recv_grad;
  const int t = downstream ? s + 1 : s - 1;
  if (is_compute(a.op) || t < 0 || t >= p * spec.virtual_stages)
    throw Error(ErrorCode::internal, "pipeline::peer: " + format_action(spec, a) + " of rank " +
                                         str(rank) + " has no peer");
  return {t % p, t / p};
}

std::string format_action(const PlanSpec& spec, const Action& a) {
  static const char* names[] = {"F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "BI", "W"};
  std::string s = names[static_cast<int>(a.op)] + str(a.micro);
  if (spec.virtual_stages > 1) s += "." + str(a.chunk);
  return s;
}

double ideal_bubble(const PlanSpec& spec) {
  const double p = spec.stages, m = spec.micro;
  const double v = spec.kind == PipelineSchedule::interleaved_1f1b ? spec.virtual_stages : 1;
  if (spec.kind == PipelineSchedule::zb_h1) return (p - 1) / (3 * m + p - 1);
  return (p - 1) / (v * m + p - 1);
}

// ---- simulation -------------------------------------------------------------

namespace {

// What one rank has done so far for one (micro, chunk).
struct Done {
  int forward = 0, backward = 0, recv_act = 0, recv_grad = 0, send_act = 0, send_grad = 0;
  int backward_input = 0, backward_weight = 0;
  bool any_backward() const { return backward || backward_input; }
};

class Checker {
 public:
  Checker(const PlanSpec& spec, const Plan& plan) : spec_(spec), plan_(plan) {}

  SimResult run() {
    SimResult res;
    res.max_in_flight.assign(spec_.stages, 0);
    if (check_shape()) {
      for (int r = 0; r < spec_.stages; ++r) res.max_in_flight[r] = check_rank(r);
      if (errors_.empty()) simulate(res);
    }
    for (auto& e : errors_) res.error += (res.error.empty() ? "" : "\n") + e;
    res.ok = errors_.empty();
    return res;
  }

 private:
  const PlanSpec& spec_;
  const Plan& plan_;
  std::vector<std::string> errors_;

  int p() const { return spec_.stages; }
  int last_stage() const { return spec_.stages * spec_.virtual_stages - 1; }
  std::string at(int r, size_t i) const {
    return "rank " + str(r) + " #" + str(static_cast<int>(i)) + " " +
           format_action(spec_, plan_[r][i]);
  }

  bool check_shape() {
    if (static_cast<int>(plan_.size()) != p()) {
      errors_.push_back("the plan has " + str(static_cast<int>(plan_.size())) +
                        " lists; parallel.pp = " + str(p()) + " needs one per rank");
      return false;
    }
    for (int r = 0; r < p(); ++r)
      for (size_t i = 0; i < plan_[r].size(); ++i) {
        const Action& a = plan_[r][i];
        if (a.micro < 0 || a.micro >= spec_.micro)
          errors_.push_back(at(r, i) + ": micro " + str(a.micro) + " is outside 0.." +
                            str(spec_.micro - 1));
        if (a.chunk < 0 || a.chunk >= spec_.virtual_stages)
          errors_.push_back(at(r, i) + ": chunk " + str(a.chunk) + " is outside 0.." +
                            str(spec_.virtual_stages - 1));
      }
    return errors_.empty();
  }

  // Step 2 of simulate (plan.h) for one rank; returns its most in-flight.
  int check_rank(int r) {
    const int m = spec_.micro, v = spec_.virtual_stages;
    std::vector<Done> done(static_cast<size_t>(m) * v);
    int in_flight = 0, most = 0;
    for (size_t i = 0; i < plan_[r].size(); ++i) {
      const Action& a = plan_[r][i];
      const int s = a.chunk * p() + r;
      Done& d = done[static_cast<size_t>(a.chunk) * m + a.micro];
      const std::string F = format_action(spec_, {Op::forward, a.micro, a.chunk});
      const std::string B = format_action(spec_, {Op::backward, a.micro, a.chunk});
      auto fail = [&](const std::string& why) { errors_.push_back(at(r, i) + ": " + why); };
      switch (a.op) {
        case Op::recv_act:
          if (s == 0) fail("stage 0 has no previous stage to receive from");
          else if (d.recv_act++) fail("receives the activation twice");
          else if (d.forward) fail("comes after " + F + ", which needed it");
          break;
        case Op::forward:
          if (d.forward++) fail("runs twice");
          else if (s > 0 && !d.recv_act) fail("its input was never received: no RECV_F before it");
          else most = std::max(most, ++in_flight);
          break;
        case Op::send_act:
          if (s == last_stage()) fail("the last stage has no next stage to send to");
          else if (d.send_act++) fail("sends the activation twice");
          else if (!d.forward) fail("comes before " + F + ", which produces it");
          break;
        case Op::recv_grad:
          if (s == last_stage()) fail("the last stage has no next stage to receive from");
          else if (d.recv_grad++) fail("receives the gradient twice");
          else if (d.any_backward()) fail("comes after " + B + ", which needed it");
          break;
        case Op::backward:
        case Op::backward_input:
          if (d.any_backward()) fail("runs a second backward of this micro-batch");
          else if (!d.forward) fail("comes before " + F);
          else if (s < last_stage() && !d.recv_grad)
            fail("its output gradient was never received: no RECV_B before it");
          else if (a.op == Op::backward) --in_flight;  // else: held until its weight half
          (a.op == Op::backward ? d.backward : d.backward_input) = 1;
          break;
        case Op::backward_weight:
          if (d.backward_weight++) fail("runs twice");
          else if (!d.backward_input)
            fail("comes before " + format_action(spec_, {Op::backward_input, a.micro, a.chunk}) + ", whose gradients it needs");
          else --in_flight;
          break;
        case Op::send_grad:
          if (s == 0) fail("stage 0 has no previous stage to send to");
          else if (d.send_grad++) fail("sends the gradient twice");
          else if (!d.any_backward()) fail("comes before " + B + ", which produces it");
          break;
      }
    }
    check_complete(r, done);
    return most;
  }

  // What rank r's list never did: every (micro, chunk) forwarded, backwarded
  // and sent on, where its stage has a peer.
  void check_complete(int r, const std::vector<Done>& done) {
    const int m = spec_.micro;
    for (int c = 0; c < spec_.virtual_stages; ++c)
      for (int mi = 0; mi < m; ++mi) {
        const Done& d = done[static_cast<size_t>(c) * m + mi];
        const int s = c * p() + r;
        auto miss = [&](Op op, const char* what) {
          errors_.push_back("rank " + str(r) + " never " + what + " " +
                            format_action(spec_, {op, mi, c}));
        };
        if (!d.forward) miss(Op::forward, "runs");
        if (!d.any_backward()) miss(Op::backward, "runs");
        if (d.backward_input && !d.backward_weight) miss(Op::backward_weight, "runs");
        if (d.forward && s < last_stage() && !d.send_act) miss(Op::send_act, "posts");
        if (d.backward && s > 0 && !d.send_grad) miss(Op::send_grad, "posts");
      }
  }

  // A message in flight on the queue (from, to, is_grad): the receiving
  // side's (micro, chunk) it carries.
  struct Message {
    int micro, chunk;
    std::string sent;  // the send action, for error messages
  };
  using Queue = std::tuple<int, int, bool>;

  // Step 3: ticks under the cost model of plan.h.
  void simulate(SimResult& res) {
    std::map<Queue, std::deque<Message>> queues;
    std::vector<size_t> pc(p(), 0);
    std::vector<int> busy(p(), 0);  // ticks left of the compute at pc[r]
    int computes = 0, tick = 0;
    auto finished = [&] {
      for (int r = 0; r < p(); ++r)
        if (pc[r] < plan_[r].size()) return false;
      return true;
    };
    auto queue_of = [&](int r, const Action& a) {
      Peer q = peer(spec_, r, a);
      bool grad = a.op == Op::send_grad || a.op == Op::recv_grad;
      return std::make_pair(is_send(a.op) ? Queue{r, q.rank, grad} : Queue{q.rank, r, grad}, q);
    };
    while (!finished()) {
      // Sends and receives take no time: run them to a fixed point, since
      // one rank's send can unblock another's receive within the tick.
      for (bool moved = true; moved;) {
        moved = false;
        for (int r = 0; r < p(); ++r)
          while (pc[r] < plan_[r].size() && !is_compute(plan_[r][pc[r]].op)) {
            const Action& a = plan_[r][pc[r]];
            auto [key, q] = queue_of(r, a);
            auto& queue = queues[key];
            if (is_send(a.op)) {
              queue.push_back({a.micro, q.chunk, at(r, pc[r])});
            } else {
              if (queue.empty()) break;
              if (queue.front().micro != a.micro || queue.front().chunk != a.chunk) {
                errors_.push_back(at(r, pc[r]) + ": the next message from rank " +
                                  str(q.rank) + " is " + queue.front().sent +
                                  " (messages match in order per peer and direction)");
                return;
              }
              queue.pop_front();
            }
            ++pc[r];
            moved = true;
          }
      }
      bool ran = false;
      for (int r = 0; r < p(); ++r) {
        if (busy[r] == 0 && pc[r] < plan_[r].size() && is_compute(plan_[r][pc[r]].op)) {
          busy[r] = cost(plan_[r][pc[r]].op);
          computes += busy[r];
        }
        ran = ran || busy[r] > 0;
      }
      if (!ran && !finished()) return deadlock(tick, pc);
      if (!ran) break;
      ++tick;
      for (int r = 0; r < p(); ++r)
        if (busy[r] > 0 && --busy[r] == 0) ++pc[r];  // done: its send follows
    }
    for (auto& [key, queue] : queues)
      for (auto& msg : queue) errors_.push_back(msg.sent + ": never received");
    res.ticks = tick;
    res.bubble = tick ? 1.0 - static_cast<double>(computes) / (static_cast<double>(p()) * tick) : 0;
  }

  void deadlock(int tick, const std::vector<size_t>& pc) {
    std::string msg = "deadlock at tick " + str(tick) + ":";
    for (int r = 0; r < p(); ++r) {
      if (pc[r] >= plan_[r].size()) continue;
      const Action& a = plan_[r][pc[r]];
      Peer q = peer(spec_, r, a);
      Op sent = a.op == Op::recv_act ? Op::send_act : Op::send_grad;
      msg += "\n  " + at(r, pc[r]) + " waits for " +
             format_action(spec_, {sent, a.micro, q.chunk}) + " from rank " + str(q.rank);
    }
    errors_.push_back(msg);
  }
};

}  // namespace

SimResult simulate(const PlanSpec& spec, const Plan& plan) {
  validate(spec);
  return Checker(spec, plan).run();
}

std::string format_plan(const PlanSpec& spec, const Plan& plan) {
  std::string out;
  const bool v1 = spec.virtual_stages == 1;
  for (size_t r = 0; r < plan.size(); ++r) {
    out += (v1 ? "stage " : "rank ") + str(static_cast<int>(r)) + ":";
    for (const Action& a : plan[r]) out += " " + format_action(spec, a);
    out += "\n";
  }
  SimResult sim = simulate(spec, plan);
  if (!sim.ok) return out + "invalid plan: " + sim.error + "\n";
  char line[96];
  std::snprintf(line, sizeof line, "%d ticks, bubble %.3f (ideal %.3f), in flight", sim.ticks,
                sim.bubble, ideal_bubble(spec));
  out += line;
  for (int n : sim.max_in_flight) out += " " + str(n);
  return out + "\n";
}

}  // namespace dtrain::plan::pipeline
