// SplitBackward (split_backward.h), the way torch.distributed.pipelining
// splits a stage's backward, in C++: walk the stage's autograd graph once,
// find for each parameter the nodes where its gradient path leaves the input
// path ("intermediates"), capture the gradients those nodes receive while the
// input half runs, and start the weight half from them. The engine's
// exec_info pruning does the skipping: a node computes only the outputs that
// lead to a requested edge (AddmmBackward skips the weight matmul in the
// input half and the input matmul in the weight half).
#include "engine/parallel/pipeline/split_backward.h"

#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <deque>
#include <unordered_map>
#include <unordered_set>

#include "common/error.h"

namespace dtrain::engine::parallel {
namespace {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;
using NodePtr = decltype(std::declval<Edge>().function);

// Keeps the gradients a node receives in the input half. The weight half
// runs the node again (as a root): the slot is full by then and stays as is.
class Capture : public torch::autograd::FunctionPreHook {
 public:
  explicit Capture(std::shared_ptr<variable_list> slot) : slot_(std::move(slot)) {}
  variable_list operator()(const variable_list& grads) override {
    if (slot_->empty()) *slot_ = grads;
    return grads;
  }

 private:
  std::shared_ptr<variable_list> slot_;
};

// The engine treats a single root as the whole input of its node. Where
// that node has other inputs, a second root to the same edge with a zero
// gradient makes it use a GraphRoot, which feeds each root's gradient to its
// own input number (GraphRoot refuses undefined gradients).
variable_list run_engine(edge_list roots, variable_list grads, bool accumulate, const edge_list& outputs) {
  if (roots.size() == 1 && (roots[0].input_nr != 0 || roots[0].function->num_inputs() != 1)) {
    roots.push_back(roots.front());
    grads.push_back(at::zeros_like(grads.front()));
  }
  return torch::autograd::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/true,
                                                               /*create_graph=*/false, accumulate, outputs);
}

}  // namespace

struct SplitBackward::State {
  // Parameters whose gradient paths start at the same intermediates.
  struct Group {
    std::vector<NodePtr> nodes;
    std::vector<std::shared_ptr<variable_list>> grads;  // per node, what it received
    edge_list params;                                   // their AccumulateGrad edges
  };
  std::vector<Group> groups;
  bool input_done = false, weight_done = false;
};

SplitBackward::SplitBackward() : state_(std::make_unique<State>()) {}
SplitBackward::~SplitBackward() = default;
SplitBackward::SplitBackward(SplitBackward&&) noexcept = default;
SplitBackward& SplitBackward::operator=(SplitBackward&&) noexcept = default;

at::Tensor SplitBackward::backward_input(const at::Tensor& root, const at::Tensor& root_grad,
                                         const at::Tensor& input, const std::vector<at::Tensor>& params) {
  State& s = *state_;
  if (s.input_done) throw Error(ErrorCode::internal, "SplitBackward: the input half ran twice");
  s.input_done = true;
  const Edge root_edge = torch::autograd::impl::gradient_edge(root);
  const Edge input_edge = torch::autograd::impl::gradient_edge(input);
  if (!root_edge.is_valid() || !input_edge.is_valid())
    throw Error(ErrorCode::internal, "SplitBackward: the stage output or its input is not part of a graph");

  // 1. Every node reachable from the root, with its parents (the nodes
  //    whose gradients flow into it) and an owning pointer.
  std::unordered_map<Node*, std::vector<Node*>> parents;
  std::unordered_map<Node*, NodePtr> owner;
  owner.emplace(root_edge.function.get(), root_edge.function);
  parents[root_edge.function.get()];
  for (std::vector<Node*> stack{root_edge.function.get()}; !stack.empty();) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.is_valid()) continue;
      parents[e.function.get()].push_back(n);
      if (owner.emplace(e.function.get(), e.function).second) stack.push_back(e.function.get());
    }
  }
  // 2. The input path: the input's accumulator and every node above it.
  if (!owner.count(input_edge.function.get()))
    throw Error(ErrorCode::internal, "SplitBackward: the stage output does not depend on its input");
  std::unordered_set<Node*> on_input_path{input_edge.function.get()};
  for (std::deque<Node*> todo{input_edge.function.get()}; !todo.empty(); todo.pop_front())
    for (Node* q : parents[todo.front()])
      if (on_input_path.insert(q).second) todo.push_back(q);

  // 3. Per parameter, the first input-path nodes above its accumulator;
  //    parameters sharing any of them form one group.
  std::unordered_map<Node*, size_t> group_of;
  for (const at::Tensor& p : params) {
    NodePtr acc = torch::autograd::impl::try_get_grad_accumulator(p);
    if (!acc || !owner.count(acc.get())) continue;  // unused by this graph: no gradient, as in a whole backward
    std::unordered_set<Node*> hits, seen{acc.get()};
    for (std::deque<Node*> todo{acc.get()}; !todo.empty(); todo.pop_front())
      for (Node* q : parents[todo.front()]) {
        if (on_input_path.count(q)) hits.insert(q);
        else if (seen.insert(q).second) todo.push_back(q);
      }
    size_t g = s.groups.size();
    for (Node* h : hits)
      if (group_of.count(h)) g = std::min(g, group_of[h]);
    if (g == s.groups.size()) s.groups.emplace_back();
    // Merge every other group this parameter touches into g.
    for (Node* h : hits) {
      if (!group_of.count(h) || group_of[h] == g) continue;
      State::Group& from = s.groups[group_of[h]];
      for (size_t k = 0; k < from.nodes.size(); ++k) {
        group_of[from.nodes[k].get()] = g;
        s.groups[g].nodes.push_back(from.nodes[k]);
        s.groups[g].grads.push_back(from.grads[k]);
      }
      s.groups[g].params.insert(s.groups[g].params.end(), from.params.begin(), from.params.end());
      from = State::Group{};
    }
    for (Node* h : hits)
      if (!group_of.count(h)) {
        group_of[h] = g;
        s.groups[g].nodes.push_back(owner.at(h));
        s.groups[g].grads.push_back(std::make_shared<variable_list>());
      }
    s.groups[g].params.emplace_back(acc, 0);
  }

  // 4. Capture what the intermediates receive, then run the input half.
  const at::Tensor seed = root_grad.defined() ? root_grad : at::ones_like(root);
  for (auto& g : s.groups)
    for (size_t k = 0; k < g.nodes.size(); ++k) {
      if (g.nodes[k] == root_edge.function) {  // the root's gradient is the seed
        g.grads[k]->resize(g.nodes[k]->num_inputs());
        (*g.grads[k])[root_edge.input_nr] = seed;
      }
      g.nodes[k]->add_pre_hook(std::make_unique<Capture>(g.grads[k]));
    }
  variable_list out = run_engine({root_edge}, {seed}, /*accumulate=*/false, {input_edge});
  return out.at(0);
}

void SplitBackward::backward_weight() {
  State& s = *state_;
  if (!s.input_done || s.weight_done)
    throw Error(ErrorCode::internal, "SplitBackward: the weight half ran before the input half, or twice");
  s.weight_done = true;
  for (auto& g : s.groups) {
    edge_list roots;
    variable_list grads;
    for (size_t k = 0; k < g.nodes.size(); ++k)
      for (uint32_t i = 0; i < g.grads[k]->size(); ++i)
        if ((*g.grads[k])[i].defined()) {
          roots.emplace_back(g.nodes[k], i);
          grads.push_back((*g.grads[k])[i]);
        }
    if (!roots.empty()) run_engine(std::move(roots), std::move(grads), /*accumulate=*/true, g.params);
  }
  s.groups.clear();  // releases the nodes, their saved tensors and the captured gradients
}

}  // namespace dtrain::engine::parallel
