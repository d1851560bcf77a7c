// Pipeline schedules as data (docs/ARCHITECTURE.md, 'Pipeline parallelism'):
// build_plan turns a PlanSpec into one list of actions per pipeline rank, simulate
// checks a plan against the runtime's model (dependencies, message order, deadlock,
// in-flight micro-batches) and times it, format_plan prints it. Pure C++: no
// LibTorch, no communication; the engine's runtime executes a Plan
// (engine/parallel/pipeline/pipeline_schedule.h).
#pragma once

#include <string>
#include <vector>

#include "common/spec_enums.h"

namespace dtrain {
struct JobSpec;
}

namespace dtrain::plan::pipeline {

// Stages: p ranks hold v chunks each; global stage s = chunk * p + rank
// (Megatron's interleaved placement), P = p * v stages in all. Stage 0 reads
// the data, stage P-1 holds the loss.
//
// forward(m, c)   : stage s's forward of micro m. Its input is the data (s == 0)
//                   or a recv_act(m, c) earlier in this rank's list.
// send_act(m, c)  : after forward(m, c) on s < P-1: its output to stage s+1.
// recv_act(m, c)  : the input of forward(m, c), from stage s-1 (s > 0).
// backward(m, c)  : needs forward(m, c) done, and on s < P-1 a recv_grad(m, c)
//                   earlier; the last stage starts from its loss.
// send_grad(m, c) : after backward(m, c) on s > 0: the input's gradient to s-1.
// recv_grad(m, c) : the output's gradient for backward(m, c), from stage s+1.
//
// `chunk` is always this rank's own chunk (the one the action serves), so
// the two ends of one message may name different chunks: rank p-1's
// send_act(m, c) is rank 0's recv_act(m, c+1). peer() gives the other end.
//
// Matching: sends are non-blocking (posted and buffered), receives block.
// The runtime matches messages by order per (peer, direction): the k-th
// send_act from rank a to rank b is the k-th recv_act of rank b from rank a,
// likewise for gradients, with tags it derives from (micro, chunk) (the
// receiving side's; a sender gets them from peer()). So a plan must post the
// sends of one (peer, direction) in the order the peer receives them, and a
// receive must name what that send carries; simulate enforces both.
//
// Split backward (zb_h1): backward_input(m, c) computes only the gradient of
// the stage's input (what the previous stage waits for: send_grad may follow
// it), backward_weight(m, c) later the parameters' gradients, from what
// backward_input kept. A stage runs either backward or both halves per
// (micro, chunk).
enum class Op { forward, backward, send_act, recv_act, send_grad, recv_grad, backward_input, backward_weight };

struct Action {
  Op op;
  int micro;
  int chunk = 0;  // virtual stage index on this rank (0 when v = 1)
};

struct PlanSpec {
  PipelineSchedule kind = PipelineSchedule::one_f_one_b;
  int stages = 1;          // p: pipeline ranks (parallel.pp)
  int micro = 1;           // m: micro-batches per step (train.grad_accum)
  int virtual_stages = 1;  // v: chunks per rank (interleaved_1f1b only)
};

// The plan a job spec asks for: parallel.pipeline.schedule, parallel.pp,
// train.grad_accum and parallel.pipeline.virtual_stages.
PlanSpec plan_spec_from(const JobSpec& spec);

// One list per pipeline rank 0..stages-1, run in order.
using Plan = std::vector<std::vector<Action>>;

// Schedules (r = rank, w = warm-up forwards):
//   gpipe            all forwards in micro order, then all backwards in
//                    micro order 0..m-1 (the order 1F1B also uses, so both
//                    accumulate gradients in the same order).
//   1f1b             Megatron's non-interleaved schedule: w = min(p-r-1, m)
//                    forwards, then pairs F(w+i) B(i), then the remaining
//                    backwards. At most min(p-r, m) micro-batches in flight.
//   interleaved_1f1b Megatron's interleaved schedule (v > 1 needs p >= 2 and
//                    m % p == 0); with v = 1 it is 1f1b.
//   zb_h1            zero bubble, ZB-H1 of Qi et al. 2023: every backward
//                    split into its input and weight halves; each rank, at
//                    every tick of the cost model below, runs the oldest
//                    input half whose gradient has arrived, else the next
//                    forward if fewer than min(p, m) micro-batches are in
//                    flight (1F1B's peak, on stage 0; counted until the
//                    weight half), else the oldest pending weight half. The
//                    weight halves fill the bubbles; the bubble reaches
//                    (p-1)/(3m+p-1) for m = p (and for even m at p = 2),
//                    and lies between that and 1F1B's otherwise.
// Each receive sits right before the compute that needs it and each send
// right after the compute that produced it: with blocking receives this is
// the loosest order, so it deadlocks only if the compute order does.
// Throws dtrain::Error(config) naming the fields at fault and the fix.
Plan build_plan(const PlanSpec& spec);

// Throws the same Error as build_plan when `spec` is invalid.
void validate(const PlanSpec& spec);

// The other end of a send/recv action of `rank`: its rank and chunk.
struct Peer {
  int rank = 0;
  int chunk = 0;
};
Peer peer(const PlanSpec& spec, int rank, const Action& action);

// Cost model: forward 1 tick, backward 2 (backward_input and
// backward_weight 1 each), sends and receives 0. A send right after a
// compute ending with tick t is posted then, so the peer's compute that
// needs it can start in tick t+1. Ranks start at tick 0 and run their list
// in order, waiting only on receives.
int cost(Op op);
struct SimResult {
  bool ok = false;
  std::string error;               // empty when ok; else every problem found
  std::vector<int> max_in_flight;  // per rank: most (micro, chunk) pairs
                                   // forwarded but not yet backwarded (with a
                                   // split backward: its weight half)
  int ticks = 0;                   // makespan under the cost model
  double bubble = 0;               // idle fraction: 1 - computes / (p * ticks)
};

// Checks, in this order (later checks run only when earlier ones pass):
//  1. shape: one list per rank, micro and chunk in range;
//  2. per rank, in list order: every (micro, chunk) forward and backward runs
//     exactly once, receives before the compute that needs them, sends after
//     the compute that produced them, exactly one of each where needed and
//     none where there is no peer (recv_act on stage 0...);
//  3. the run: receives match the head of their (peer, direction) queue
//     (same micro and chunk), no deadlock (the message names every blocked
//     rank, its action and what it waits for), every send received.
// Throws dtrain::Error(config) only for an invalid spec.
SimResult simulate(const PlanSpec& spec, const Plan& plan);

// "F3" / "SEND_F3" / "RECV_B2" / "BI3" / "W3"...; with v > 1 the chunk follows: "F3.1".
std::string format_action(const PlanSpec& spec, const Action& action);

// One line per rank ("stage 0: F0 SEND_F0 F1 ..."; "rank 0: ..." when
// v > 1), then a line with the simulated ticks, bubble and in-flight counts
// (or the simulator's error).
std::string format_plan(const PlanSpec& spec, const Plan& plan);

// (p-1)/(m+p-1); interleaved_1f1b: (p-1)/(v*m+p-1); zb_h1: (p-1)/(3m+p-1)
// (each stage idle p-1 ticks of F + B - W, Qi et al.'s estimate).
double ideal_bubble(const PlanSpec& spec);

}  // namespace dtrain::plan::pipeline
