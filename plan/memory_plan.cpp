// plan_memory (memory_plan.h). Model states follow the engine's code:
// gpt_params.h (parameter shapes and which tp splits, as engine/model and
// engine/parallel/tensor build them), engine/parallel/pipeline (which blocks a stage holds) and
// engine/parallel/zero/flat_layout.h (units padded to a multiple of dp, rank
// r's shard). Activations count, per micro-batch, the fp32 tensors autograd
// saves in the model's forward (GPT or llama: see activation_elems); the pipeline's
// in-flight count comes from simulating its plan. MoE blocks: the router
// joins the dense units, the experts (E / ep on a rank, engine/model/moe.h)
// are kept apart like the engine's expert sync keeps them (never ZeRO-sharded).
//
// Legend: b = micro_batch, s = seq_len, h = d_model, a = heads, V = vocab,
// t = tp, tsp = t with sequence parallelism (else 1), L = layers,
// E = experts, K = top_k, F = an expert's hidden width, N = bs tokens.
#include "plan/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <sys/stat.h>

#include "common/error.h"
#include "common/mesh.h"
#include "plan/flops.h"
#include "plan/gpt_params.h"
#include "plan/pipeline_plan.h"

namespace dtrain::plan {
namespace {

constexpr int64_t kFloat = 4;  // bytes per fp32 element

struct Dims {
  int64_t b, s, h, a, V, L, t, tsp, vt;  // vt: the vocab split (t when vocab-parallel, else 1)
  bool drop, tiled;
  Recompute recompute = Recompute::none;
  int64_t E = 0, K = 1, F = 0, every = 1, ep = 1;  // MoE (E = 0: dense)
  bool llama = false;
  // The fused RMSNorm and SwiGLU (engine/model/fused_ops.h) run: fp32 on
  // the CPU; elsewhere (bf16 or fp16 autocast, GPUs) ATen's compositions.
  bool fused = false;
  int64_t kv = 0, kvdiv = 1, Fd = 0;  // llama: kv heads, their tp divisor (TpView), the SwiGLU's hidden width
  const ModelSpec* model = nullptr;  // the tensors (gpt_params.h)
  TpView view;
  bool moe_block(int64_t layer) const { return is_moe_block(*model, layer); }
};

Dims dims_of(const JobSpec& spec) {
  Dims d;
  d.b = spec.train.micro_batch;
  d.s = spec.model.seq_len / std::max(1, spec.parallel.cp);  // this rank's tokens: cp splits the sequence
  d.h = spec.model.d_model;
  d.a = spec.model.heads;
  d.V = spec.model.vocab;
  d.L = spec.model.layers;
  d.t = spec.parallel.tp;
  d.tsp = spec.parallel.sequence_parallel && d.t > 1 ? d.t : 1;
  d.vt = d.t > 1 && spec.model.tp_vocab == TpVocab::parallel ? d.t : 1;
  d.drop = spec.model.dropout > 0.0;
  d.tiled = spec.model.attention == AttentionImpl::tiled;
  d.recompute = spec.train.recompute;
  d.model = &spec.model;
  d.view = tp_view(spec);
  d.llama = is_llama(spec.model);
  d.fused = spec.cluster.device == DeviceKind::cpu && spec.train.precision == Precision::fp32;
  d.kv = spec.model.effective_kv_heads();
  d.kvdiv = d.view.kv_divisor();
  d.Fd = spec.model.effective_ffn_hidden();
  const MoeSpec& m = spec.model.moe;
  if (m.experts > 0) {
    d.E = m.experts, d.K = std::max(1, m.top_k), d.every = std::max(1, m.every);
    d.F = expert_hidden(spec.model);
    d.ep = std::max(1, spec.parallel.ep);
  }
  return d;
}

// Parameter elements of each unit on one tp rank (gpt_params.h: which
// tensors tp slices). One rank's experts of one MoE block: E / ep of them.
int64_t embedding_numel(const Dims& d) { return rank_numel(embedding_tensors(*d.model), d.view); }
int64_t block_numel(const Dims& d, int64_t layer) { return rank_numel(block_tensors(*d.model, layer), d.view); }
int64_t expert_numel(const Dims& d) { return d.E / d.ep * rank_numel(expert_tensors(*d.model), TpView{}); }
int64_t head_numel(const Dims& d) { return rank_numel(head_tensors(*d.model), d.view); }

// The blocks a pipeline rank holds, in order: its chunks c are the global
// stages c * pp + pp_rank, of spec.stage_layers() blocks each
// (parallel.pipeline.layers_per_stage, or layers split evenly).
std::vector<int64_t> blocks_of_stage(const JobSpec& spec, const Dims& d, int pp_rank) {
  const int p = spec.parallel.pp, v = spec.parallel.pipeline_virtual_stages;
  const std::vector<int> layers = spec.stage_layers();
  int64_t total = 0;
  for (int n : layers) total += n;
  if (int64_t(layers.size()) != int64_t(p) * v || total != d.L ||
      (spec.parallel.pipeline_layers_per_stage.empty() && d.L % (int64_t(p) * v) != 0))
    throw Error(ErrorCode::config, "model.layers = " + std::to_string(d.L) + " does not split into parallel.pp = " +
                                       std::to_string(p) + " x virtual_stages = " + std::to_string(v) + " stages");
  std::vector<int64_t> first(layers.size() + 1, 0);  // first block of each global stage
  for (size_t s = 0; s < layers.size(); ++s) first[s + 1] = first[s] + layers[s];
  std::vector<int64_t> blocks;
  for (int c = 0; c < v; ++c)
    for (int64_t b = first[c * p + pp_rank]; b < first[c * p + pp_rank + 1]; ++b) blocks.push_back(b);
  return blocks;
}

// The units (numel each) a pipeline rank holds, in order. A tied head
// under pp: the last stage keeps its own copy of wte
// (engine/parallel/pipeline/tied_embedding.h), in its embedding unit.
std::vector<int64_t> units_of_stage(const JobSpec& spec, const Dims& d, int pp_rank) {
  std::vector<int64_t> units;
  const int last = spec.parallel.pp - 1;
  if (pp_rank == 0) units.push_back(embedding_numel(d));
  else if (pp_rank == last && spec.model.tie_embeddings)
    units.push_back(rank_numel({embedding_tensors(*d.model).front()}, d.view));  // wte's copy
  for (int64_t b : blocks_of_stage(spec, d, pp_rank)) units.push_back(block_numel(d, b));
  if (pp_rank == last) units.push_back(head_numel(d));
  return units;
}

// ZeRO shards over every replica of the shard: dp x cp ranks (dp_rank: the
// rank's index among them).
void model_states(const JobSpec& spec, const std::vector<int64_t>& units, int dp_rank, RankMemory& r) {
  const int n = spec.parallel.dp * std::max(1, spec.parallel.cp), z = spec.parallel.zero;
  int64_t numel = 0, padded = 0, shard = 0, owned = 0, largest = 0;
  for (int64_t u : units) {
    const int64_t pad = std::max<int64_t>((u + n - 1) / n * n, n);
    const int64_t sh = pad / n;
    largest = std::max(largest, sh);
    numel += u;
    padded += pad;
    shard += sh;
    owned += std::max<int64_t>(0, std::min(u, (dp_rank + 1) * sh) - dp_rank * sh);
  }
  if (z == 0) {
    r.param_bytes = r.grad_bytes = kFloat * numel;
    r.optimizer_bytes = 2 * kFloat * numel;
    return;
  }
  r.param_bytes = kFloat * (z == 3 ? shard : padded);
  r.grad_bytes = kFloat * (z == 1 ? padded : shard);
  r.optimizer_bytes = 2 * kFloat * owned;
  // train.offload.params (ZeRO-3): the shards live in a file or a host
  // buffer; in memory at most three at once (one in use, one read ahead,
  // one being written back).
  if (z == 3 && spec.train.offload.params != OffloadTarget::none) {
    r.offload_bytes += kFloat * shard;
    r.param_bytes = kFloat * std::min(shard, 3 * largest);
  }
}

// What the MLP saves: the GPT's fc and GELU outputs (8sbh/t); the llama's
// SwiGLU its gate_up output (gate and up, 2sbF/t) and the product proj
// multiplies (sbF/t), composed by ATen also silu(gate) (sbF/t).
double mlp_activation_elems(const Dims& d) {
  const double sb = double(d.s) * d.b;
  return d.llama ? (d.fused ? 3 : 4) * sb * d.Fd / d.t : 8 * sb * d.h / d.t;
}

// One llama RMSNorm's saved tensors: fused, its input and two [bs] row
// statistics (sbh + 2bs); composed in fp32, its input, x * rstd and rstd
// (2sbh + bs).
double rms_norm_elems(const Dims& d) {
  const double sbh = double(d.s) * d.b * d.h, bs = double(d.b) * d.s;
  return (d.fused ? sbh + 2 * bs : 2 * sbh + bs) / d.tsp;
}

// The norms' saved tensors and the attention's projections besides the
// core. GPT: LayerNorm inputs and mean/rstd, q/k/v and the attention
// output (below). Llama: two RMSNorms (rms_norm_elems); q and the
// attention output (2sbh/t); k and v at the kv heads' width (2sb x KV x D /
// kvdiv: grouped-query attention saves the smaller kv).
double norms_attention_elems(const Dims& d) {
  const double sbh = double(d.s) * d.b * d.h, bs = double(d.b) * d.s;
  const double drop = d.drop ? 2 * sbh / d.tsp : 0.0;
  if (!d.llama) return (2 * sbh + 4 * bs) / d.tsp + drop + 4 * sbh / d.t;
  const double head_dim = double(d.h) / double(std::max<int64_t>(1, d.a));
  return 2 * rms_norm_elems(d) + drop + 2 * sbh / d.t + 2 * bs * double(d.kv) * head_dim / double(d.kvdiv);
}

// Elements one block saves for backward per micro-batch (engine/model/gpt.cpp):
// LayerNorm inputs and their mean/rstd (sbh/tsp + 2bs/tsp, twice), LayerNorm
// outputs saved whole by qkv and mlp.fc (2sbh; under SP the gathered copy),
// q/k/v (3sbh/t), the attention output before proj (sbh/t), mlp.fc's output
// and GELU's (8sbh/t), the residual dropout masks (2sbh/tsp with dropout);
// the core: naive saves softmax's output (as^2b/t) and with dropout its mask
// and the dropped probabilities (2as^2b/t more); tiled its output and
// log-sum-exp (sbh/t + asb/t). Selective recompute keeps none of the core's;
// full keeps only the block's input (sbh/tsp).
double block_activation_elems(const Dims& d) {
  const double sbh = double(d.s) * d.b * d.h;
  if (d.recompute == Recompute::full) return sbh / d.tsp;
  // The norms' outputs saved whole by qkv (q, kv) and fc (gate_up), then
  // the rest (norms_attention_elems, mlp_activation_elems).
  double e = 2 * sbh + norms_attention_elems(d) + mlp_activation_elems(d);
  if (d.recompute == Recompute::selective) return e;
  if (d.tiled) return e + sbh / d.t + double(d.a) * d.s * d.b / d.t;
  return e + (d.drop ? 3.0 : 1.0) * d.a * d.s * d.s * d.b / d.t;
}

// A MoE block saves, instead of the MLP's: the router's softmax output
// (N x E), each kept assignment's expert input and its fc and GELU outputs
// (KN/t x (h + 2F): at most K choices of this tp rank's share of the N
// tokens; a llama's SwiGLU expert h + 4F as its MLP), the gathered slots
// the gates multiply (KNh) and the gates.
double moe_block_activation_elems(const Dims& d) {
  const double N = double(d.b) * d.s;
  if (d.recompute == Recompute::full) return block_activation_elems(d);
  const double expert = d.llama ? d.h + 4.0 * d.F : d.h + 2.0 * d.F;
  return block_activation_elems(d) - mlp_activation_elems(d) + N * d.E + d.K * N * expert / d.t + d.K * N * d.h +
         2.0 * d.K * N;
}

// Routing's int64 temporaries of a MoE forward, in fp32 elements: the
// one-hot of the KN assignments over E experts, its cumulative sum and
// their product ([KN, E] each, 2 elements per int64), alive at once.
double moe_route_transient_elems(const Dims& d) { return 3.0 * 2.0 * d.K * double(d.b) * d.s * d.E; }

// The host memory of the builtin dataset (engine/data/dataset.cpp): bytes
// reads the file into a vector through stream iterators, whose capacity
// doubles as it grows (about twice the file at its end and while it
// reallocates); tokens-u16 maps the file (page cache, shared by the ranks);
// synthetic is a small table.
int64_t data_buffer_bytes(const JobSpec& spec) {
  if (!spec.builtin_entrypoint() || spec.data.format != DataFormat::bytes) return 0;
  struct stat st {};
  if (::stat(spec.data.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  return 2 * int64_t(st.st_size);
}

// Outside the blocks: the embedding's dropout mask (first stage); ln_f's
// input, its mean/rstd and its output (whole, saved by the head), and the
// loss's [bs, V/vt] log-softmax (last stage).
double embedding_activation_elems(const Dims& d) { return d.drop ? double(d.s) * d.b * d.h / d.tsp : 0.0; }
double head_activation_elems(const Dims& d) {
  const double sbh = double(d.s) * d.b * d.h, bs = double(d.b) * d.s;
  const double norm = d.llama ? rms_norm_elems(d) : sbh / d.tsp + 2 * bs / d.tsp;
  return norm + sbh + bs * d.V / d.vt;
}

// Backward's largest moment on top of everything saved (elements), the
// larger of two phases. The head's: the loss's gradient and the logits'
// ([bs, V/vt] each) and the residual-stream gradients (2sbh/tsp). A block's:
// the head's saved tensors are gone (last stage), the block's recomputed
// tensors are back (full: the block's usual ones; selective: the core's),
// and backward's temporaries: mlp's gradients (8sbh/t), the residual
// stream's, and in the naive core one [B*H, T, T] gradient more than it
// frees at its worst step.
double backward_transient_elems(const Dims& d, bool has_head) {
  const double sbh = double(d.s) * d.b * d.h, bs = double(d.b) * d.s, att = double(d.a) * d.s * d.s * d.b / d.t;
  const double head_phase = has_head ? 2 * bs * d.V / d.vt + 2 * sbh / d.tsp : 0.0;
  Dims usual = d;
  usual.recompute = Recompute::none;
  double recomputed = 0;
  if (d.recompute == Recompute::full) recomputed = block_activation_elems(usual);
  if (d.recompute == Recompute::selective)
    recomputed = d.tiled ? sbh / d.t + double(d.a) * d.s * d.b / d.t : (d.drop ? 3.0 : 1.0) * att;
  const double block_phase = (has_head ? -head_activation_elems(d) : 0.0) + recomputed + (d.tiled ? 0.0 : att) +
                             mlp_activation_elems(d) + 2 * sbh / d.tsp;
  return std::max({0.0, head_phase, block_phase});
}

int in_flight_of(const JobSpec& spec, int pp_rank) {
  if (spec.parallel.pp == 1) return 1;
  const pipeline::PlanSpec p = pipeline::plan_spec_from(spec);
  const auto sim = pipeline::simulate(p, pipeline::build_plan(p));
  if (!sim.ok) throw Error(ErrorCode::config, "parallel.pipeline: the simulator rejects the plan: " + sim.error);
  return sim.max_in_flight[size_t(pp_rank)];
}

// The size of this rank's ZeRO shard group (dp x cp) and how many of its
// members share this rank's machine (ranks fill the machines in order,
// cluster.procs_per_node each).
struct ShardGroupHere {
  int64_t size = 0, here = 0;
};
ShardGroupHere shard_group_here(const JobSpec& spec, const mesh::Mesh& m, int rank) {
  const std::vector<int> group = mesh::group_of(m, mesh::gradient_group(spec.parallel.cp), rank);
  const int per_node = std::max(1, spec.cluster.procs_per_node);
  return {std::ssize(group),
          std::count_if(group.begin(), group.end(), [&](int r) { return r / per_node == rank / per_node; })};
}

// ZeRO-3's parameters in one shared-memory segment of the machine
// (parallel.fsdp.shared_params; engine/parallel/zero/zero_sync.cpp): on
// CPU, with the shared-memory collectives, no parameter offload, and every
// rank of the shard group on this rank's machine. Nothing is gathered then. The
// engine also falls back to gathering where the segment would take more
// than a quarter of /dev/shm, which a plan made elsewhere cannot see.
bool zero3_shared_params(const JobSpec& spec, const mesh::Mesh& m, int rank) {
  if (spec.parallel.zero != 3 || !spec.parallel.fsdp_shared_params || !spec.cluster.shm ||
      spec.cluster.device != DeviceKind::cpu || spec.train.offload.params != OffloadTarget::none)
    return false;
  const ShardGroupHere g = shard_group_here(spec, m, rank);
  return g.size >= 2 && g.here == g.size;
}

// ZeRO-2/3's reduce-scatter inputs in a pool of kZeroInputPool units
// (engine/parallel/zero/zero_sync.cpp): on CPU with the shared-memory
// collectives, where the shard group has a symmetric buffer: all of it on
// this rank's machine, or (a hierarchical group, cluster.hier_allreduce) at
// least two of its members here. The engine falls back to a tensor per
// unit where the segment would not fit /dev/shm, which a plan made
// elsewhere cannot see.
bool zero_input_pool(const JobSpec& spec, const mesh::Mesh& m, int rank) {
  if (spec.parallel.zero < 2 || !spec.cluster.shm || spec.cluster.device != DeviceKind::cpu) return false;
  const ShardGroupHere g = shard_group_here(spec, m, rank);
  return g.size >= 2 && (g.here == g.size || (spec.cluster.hier_allreduce && g.here >= 2));
}

}  // namespace

RankMemory plan_rank(const JobSpec& spec, int rank) {
  const Dims d = dims_of(spec);
  const mesh::Mesh m = spec.mesh();
  const mesh::Coord mc = mesh::coord_of(m, rank);
  const int replica = mesh::index_in_group(m, mesh::GroupKind::dp_cp, mc);  // ZeRO's shard index
  const struct { int dp, tp, pp; } c{mc[mesh::Axis::dp], mc[mesh::Axis::tp], mc[mesh::Axis::pp]};
  RankMemory r;
  r.rank = rank;
  r.dp = c.dp, r.tp = c.tp, r.pp = c.pp, r.cp = mc[mesh::Axis::cp];
  const std::vector<int64_t> units = units_of_stage(spec, d, c.pp);
  model_states(spec, units, replica, r);
  int64_t moe_blocks = 0;
  const std::vector<int64_t> rank_blocks = blocks_of_stage(spec, d, c.pp);
  for (int64_t l : rank_blocks)
    if (d.moe_block(l)) ++moe_blocks;
  // Experts: whole param, grad and AdamW state per rank (the expert sync
  // reduces them over the ranks holding the same experts; ZeRO leaves them).
  const int64_t experts = moe_blocks * expert_numel(d);
  r.param_bytes += kFloat * experts;
  r.grad_bytes += kFloat * experts;
  r.optimizer_bytes += 2 * kFloat * experts;
  // train.offload.optimizer: the moments live in a file (nvme), whose three
  // I/O buckets stay in memory, or in host memory (host) with the update's
  // fp32 master (half the moments' bytes) and two buckets of gradients.
  if (spec.train.offload.optimizer != OffloadTarget::none) {
    const int64_t moments = r.optimizer_bytes;
    const auto bucket = std::min(int64_t(spec.train.offload.bucket_mb * 1024 * 1024), moments);
    const bool nvme = spec.train.offload.optimizer == OffloadTarget::nvme;
    r.offload_bytes += nvme ? moments : moments + moments / 2 + bucket;
    r.optimizer_bytes = nvme ? 3 * bucket : 0;
  }
  // The engine builds this rank's share only (engine/model/gpt.h's
  // BuildScope): its stage's units as tp slices and its E / ep experts,
  // whole before ZeRO shards them (each parameter is drawn whole in host
  // memory first, one at a time: not device memory).
  int64_t built = experts;
  for (int64_t u : units) built += u;
  r.build_bytes = kFloat * built;
  r.data_bytes = data_buffer_bytes(spec);

  const int p = spec.parallel.pp, v = spec.parallel.pipeline_virtual_stages;
  const int64_t blocks = int64_t(rank_blocks.size());  // this rank's blocks (all chunks)
  const bool first = c.pp == 0, last = c.pp == p - 1;
  if (!d.tiled) r.cache_bytes = kFloat * blocks * d.s * d.s;  // one [s, s] causal bias per attention module
  r.in_flight = in_flight_of(spec, c.pp);
  // A micro-batch in flight on an interleaved rank holds one chunk's blocks;
  // otherwise all of the rank's blocks. The first and last stages' extras
  // belong to one chunk each.
  const double chunk = p > 1 ? 1.0 / v : 1.0;
  const double per_micro = chunk * (double(blocks - moe_blocks) * block_activation_elems(d) +
                                    double(moe_blocks) * moe_block_activation_elems(d));
  double act = r.in_flight * per_micro;
  if (first) act += r.in_flight * embedding_activation_elems(d);
  if (last) act += head_activation_elems(d);  // the last stage runs each micro-batch's backward at once
  r.activation_bytes = int64_t(kFloat * act);

  double transient = backward_transient_elems(d, last);
  if (moe_blocks > 0) transient = std::max(transient, moe_route_transient_elems(d));
  // The expert sync all-reduces one flat copy of the experts' gradients
  // over the ranks holding the same experts (dp x tp / ep of them).
  if (experts > 0 && spec.parallel.dp * spec.parallel.tp / d.ep > 1) transient += double(experts);
  const int shards = spec.parallel.dp * std::max(1, spec.parallel.cp);  // ZeRO's shard group: dp x cp
  if (spec.parallel.zero >= 2 && shards > 1) {
    // A unit's full gradient, the reduce-scatter's input: one at a time,
    // or the pool's units (padded), alive the whole run.
    const int64_t largest = *std::max_element(units.begin(), units.end());
    const int64_t padded = (largest + shards - 1) / shards * shards;
    transient += zero_input_pool(spec, m, rank) ? double(kZeroInputPool) * double(padded) : double(largest);
    // ZeRO-3's gathered units: the running one and the prefetched one in
    // forward, one in backward. Shared parameters: none (the node's one
    // copy is param_bytes' shards).
    if (spec.parallel.zero == 3) {
      const int gathered = zero3_shared_params(spec, m, rank) ? 0 : spec.parallel.fsdp_prefetch ? 2 : 1;
      transient += double(largest) * gathered;
    }
  }
  r.transient_bytes = int64_t(kFloat * transient);
  r.peak_bytes = r.static_bytes() + r.cache_bytes + r.activation_bytes + r.transient_bytes;
  return r;
}

MemoryPlan plan_memory(const JobSpec& spec) {
  MemoryPlan plan;
  for (int r = 0; r < spec.world(); ++r) plan.ranks.push_back(plan_rank(spec, r));
  plan.flops_per_step = flops_per_step(spec);
  return plan;
}

int64_t MemoryPlan::max_peak_bytes() const {
  int64_t m = 0;
  for (const auto& r : ranks) m = std::max(m, r.peak_bytes);
  return m;
}

int64_t MemoryPlan::max_need_bytes() const {
  int64_t m = 0;
  for (const auto& r : ranks) m = std::max(m, r.need_bytes());
  return m;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) bytes /= 1024.0, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

std::string plan_to_text(const JobSpec& spec, const MemoryPlan& plan) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-5s %-14s %12s %12s %12s %12s %12s %12s %12s %9s %12s %12s\n", "rank", "coord",
                "params", "grads", "optimizer", "cache", "activations", "transient", "peak", "in_flight", "data",
                "need");
  out += line;
  for (const auto& r : plan.ranks) {
    std::string coord = "dp" + std::to_string(r.dp) + " tp" + std::to_string(r.tp) + " pp" + std::to_string(r.pp);
    if (spec.parallel.cp > 1) coord += " cp" + std::to_string(r.cp);
    std::snprintf(line, sizeof line, "%-5d %-14s %12s %12s %12s %12s %12s %12s %12s %9d %12s %12s\n", r.rank,
                  coord.c_str(),
                  format_bytes(double(r.param_bytes)).c_str(), format_bytes(double(r.grad_bytes)).c_str(),
                  format_bytes(double(r.optimizer_bytes)).c_str(), format_bytes(double(r.cache_bytes)).c_str(),
                  format_bytes(double(r.activation_bytes)).c_str(), format_bytes(double(r.transient_bytes)).c_str(),
                  format_bytes(double(r.peak_bytes)).c_str(), r.in_flight, format_bytes(double(r.data_bytes)).c_str(),
                  format_bytes(double(r.need_bytes())).c_str());
    out += line;
  }
  if (spec.train.offload.params != OffloadTarget::none && spec.parallel.zero == 3 && !plan.ranks.empty())
    out += "params offload: rank 0's ZeRO-3 parameter shards live in " +
           (spec.train.offload.params == OffloadTarget::nvme ? "nvme files under " + spec.train.offload.path
                                                             : std::string("a host buffer")) +
           " between uses; the params column is the most of them in memory at once (three shards)\n";
  const OffloadTarget opt = spec.train.offload.optimizer;
  if (opt != OffloadTarget::none && !plan.ranks.empty())
    out += "optimizer offload: rank 0's " + format_bytes(double(plan.ranks[0].offload_bytes)) +
           (opt == OffloadTarget::nvme
                ? " of AdamW's moments live in nvme files under " + spec.train.offload.path +
                      "; the optimizer column is their three I/O buckets in memory\n"
                : " of AdamW's moments, the update's fp32 master and two buckets of gradients live in pinned "
                  "host memory; the optimizer column (device) holds none of them\n");
  return out;
}

}  // namespace dtrain::plan
