// A GPT (docs/ARCHITECTURE.md, 'The engine's folders'): token + position
// embeddings, pre-LayerNorm blocks (causal multi-head self-attention, GELU MLP),
// final LayerNorm, output head; and its Llama variant (kind llama, llama.h:
// RMSNorm, rotary positions, grouped-query attention, SwiGLU, no biases).
// Deterministic init from a seed, stable parameter names
// ("blocks.3.attn.qkv.weight"). Written so TP/PP/EP are layouts of it:
// blocks are separate modules, linears are replaceable. Not parallel itself.
#pragma once

#include <torch/nn/module.h>

#include "engine/model/moe.h"
#include "engine/model/attention_core.h"
#include "engine/model/llama.h"
#include "engine/model/param_init.h"
#include "engine/model/recompute.h"
#include "engine/model/tp_ops.h"
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/dropout.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::engine::model {

struct GptConfig {
  int vocab = 256;
  int layers = 2;
  int d_model = 64;
  int heads = 4;
  int seq_len = 64;  // maximum context (position table size)
  double dropout = 0.0;
  MoeConfig moe;  // experts 0: every block has a dense MLP
  std::string attention = "naive";  // the attention core: naive | tiled (attention_core.h)
  // kind llama (llama.h): the fields below; a gpt ignores them.
  std::string kind = "gpt";  // gpt | llama
  int kv_heads = 0;          // key/value heads (grouped-query attention); 0 = heads
  int ffn_hidden = 0;        // the SwiGLU MLP's hidden width; 0 = 4 * d_model
  double norm_eps = 1e-5;    // RMSNorm's epsilon
  RotaryConfig rope;         // rotary base and Llama 3.1 scaling
  bool tie_embeddings = false;  // the head reuses wte's weight (no head.weight)
  bool llama() const { return kind == "llama"; }
  int kv() const { return kv_heads > 0 ? kv_heads : heads; }
  int ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * d_model; }
};

// Where the current micro-batch sits in the step's global batch, for dropout
// masks that do not depend on the layout (docs/ARCHITECTURE.md, 'Layout-invariant
// randomness'): the optimizer step, the global batch size and the global row of
// this micro-batch's first sample. The default is one process's first micro-step.
struct DropoutPosition {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t global_rows = 0;  // 0: this micro-batch is the whole batch
  int64_t row_begin = 0;
};

// A layout that splits the sequence (context parallelism): this rank's
// tokens are segments of a longer global sequence, given as global [begin,
// end) positions in local order, and attention over the whole sequence runs
// through `attention` (q [B*H, Tl, D], k, v [B*KV, Tl, D], batch rows,
// dropout -> [B*H, Tl, D]). Position embeddings and dropout masks follow the global
// positions. Inactive (global_len 0) by default: the rank holds the sequence.
struct SequenceSplit {
  int64_t global_len = 0;
  std::vector<std::pair<int64_t, int64_t>> segments;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                           const AttentionDropout&)>
      attention;
  bool active() const { return global_len > 0; }
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& cfg);
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]
  torch::nn::Linear qkv{nullptr};   // C -> 3C (gpt)
  torch::nn::Linear proj{nullptr};  // C -> C (llama: H*D -> C, no bias)
  // llama: q C -> H*D and kv C -> 2*KV*D ([k; v]), no biases, rotary q and k.
  torch::nn::Linear q{nullptr}, kv{nullptr};
  int kv_heads = 0;               // of the whole model (llama)
  // Under tensor parallelism (llama): this rank uses kv heads [kv_first,
  // kv_first + kv_local) of the global numbering. kv_replicated: kv.weight
  // is the whole [2*KV*D, C] (tp % KV == 0) and the rank reads its rows;
  // else kv.weight holds exactly its heads' k rows, then their v rows.
  int kv_first = 0, kv_local = 0;
  bool kv_replicated = false;
  Rotary* rotary = nullptr;       // set by GptImpl (llama)
  torch::nn::Dropout attn_drop{nullptr}, resid_drop{nullptr};
  int heads;                      // of the whole model; this rank computes heads / tp->size
  int layer = 0;                  // global block index (dropout streams)
  const TpGroup* tp = nullptr;    // set by GptImpl::set_tensor_parallel
  const DropoutPosition* position = nullptr;  // set by GptImpl
  const SequenceSplit* seq = nullptr;         // set by GptImpl
  AttentionKind kind = AttentionKind::naive;
  // Runs the core (q, k, v -> weighted values); set by a layout to
  // recompute it in backward (selective activation checkpointing).
  SegmentRunner core_runner;

 private:
  // llama: q [B*H, T, D] and k, v [B*KV, T, D] of this rank, rotary applied.
  std::vector<at::Tensor> llama_qkv(const at::Tensor& x, int64_t H);
  // [T, T] additive causal mask (0 on and below the diagonal, -inf above),
  // built on first use for a T and reused; not a buffer, so not in the
  // state dict or checkpoints.
  at::Tensor causal_bias_;
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const GptConfig& cfg);
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]
  torch::nn::Linear fc{nullptr};    // C -> 4C (gpt)
  torch::nn::Linear proj{nullptr};  // 4C -> C (llama: F -> C, no bias)
  torch::nn::Linear gate_up{nullptr};  // llama: C -> 2F ([gate; up]), no bias
  torch::nn::Dropout drop{nullptr};
  int layer = 0;
  const TpGroup* tp = nullptr;
  const DropoutPosition* position = nullptr;
  const SequenceSplit* seq = nullptr;
};
TORCH_MODULE(Mlp);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptConfig& cfg, int layer = 0);
  at::Tensor forward(const at::Tensor& x);  // x + attn(ln1(x)); x + mlp(ln2(x))
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};  // gpt
  RmsNorm rms1{nullptr}, rms2{nullptr};             // llama (named ln1, ln2)
  CausalSelfAttention attn{nullptr};
  Mlp mlp{nullptr};
  Moe moe{nullptr};  // instead of mlp in an MoE block (MoeConfig::is_moe_block)
};
TORCH_MODULE(Block);

// The model runs in units: 0 = the embeddings (wte, wpe), 1..layers = the
// blocks, layers + 1 = the head (ln_f, head). A layout that works unit by
// unit (ZeRO-3 gathers a unit's parameters before it runs and frees them
// after) sees each unit's start and its output; the model itself stays
// unaware of any layout.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before(int unit) = 0;
  // Returns the output (the hook may attach a gradient hook to it).
  virtual at::Tensor after(int unit, const at::Tensor& output) = 0;
};

// What one rank builds of the model: parallelize.h's cuts (its pipeline
// stage, its experts, its tensor-parallel slices) made while the model is
// built, one parameter at a time, so that no process ever holds more than
// its share plus one parameter. The default builds the whole model.
struct BuildScope {
  // Whether this rank keeps parameter `name` (one of its stage's); unset:
  // every one. The others end up empty ([0]), as a pipeline split leaves them.
  std::function<bool(const std::string& name)> keeps;
  // This rank's part of a kept parameter, given it whole and initialised
  // (its tensor-parallel slice); unset, or returning `whole`: kept whole.
  std::function<at::Tensor(const std::string& name, const at::Tensor& whole)> slice;
  // Experts [ep_rank * E / ep_size, (ep_rank + 1) * E / ep_size) of every
  // MoE block, built and drawn alone (never the whole [E, ...]).
  int ep_rank = 0, ep_size = 1;
  // false: the weights are not drawn from the seed (they keep LibTorch's
  // module defaults), for a caller that loads every one of them next.
  bool draw = true;
  // Threads that draw a large parameter (param_init.h): the same numbers
  // for any count.
  int draw_threads = 1;
};

class GptImpl : public torch::nn::Module {
 public:
  // Parameters are initialised deterministically from `seed` (same numbers
  // whatever the process, so every rank starts from the 1-process model);
  // `scope` says which of them (and which parts) this rank builds.
  GptImpl(const GptConfig& cfg, uint64_t seed, const BuildScope& scope = {});

  // tokens [B, T] int64 -> logits [B, T, V]
  at::Tensor forward(const at::Tensor& tokens);
  // Mean cross-entropy over all B*T positions of next-token targets [B, T].
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);

  // The same in pieces, so that a pipeline stage runs only its part:
  // loss = head_loss(run_blocks(embed(tokens), 0, layers), targets).
  at::Tensor embed(const at::Tensor& tokens);                         // [B, T] -> [B, T, C]
  at::Tensor run_blocks(const at::Tensor& x, int first, int last);   // blocks [first, last)
  at::Tensor head_logits(const at::Tensor& x);                       // [B, T, C] -> [B, T, V / tp]
  at::Tensor head_loss(const at::Tensor& x, const at::Tensor& targets);

  int64_t num_params() const;  // the parameters this rank built
  int64_t whole_num_params() const { return whole_params_; }  // the 1-process model's
  // A parameter's shape in the 1-process model (its local shape unless
  // the BuildScope cut it).
  std::vector<int64_t> whole_shape(const std::string& name, const at::Tensor& local) const;
  const GptConfig& config() const { return cfg_; }

  int num_units() const { return cfg_.layers + 2; }
  // The unit a parameter belongs to, by its name ("blocks.3.attn.qkv.weight"
  // -> 4); throws for a name the model does not have.
  int unit_of(const std::string& param_name) const;
  // Not owned; nullptr (the default) runs without hooks.
  void set_unit_hooks(UnitHooks* hooks) { hooks_ = hooks; }

  // Tensor parallelism: the caller has already replaced the parameters by
  // this rank's slices (qkv and mlp.fc rows: column-parallel; attn.proj and
  // mlp.proj columns: row-parallel; wte and head rows: vocab-parallel);
  // from now on forward computes local heads and vocab columns and
  // combines them over `tp`. forward() then returns this rank's vocab
  // columns of the logits; loss() is the full cross-entropy on every rank.
  void set_tensor_parallel(TpGroup tp);
  // Before each micro-batch's forward: where it sits (dropout masks).
  void set_dropout_position(const DropoutPosition& p) { position_ = p; }
  const DropoutPosition& dropout_position() const { return position_; }
  // Runs each block (its forward as a Segment of its input); set by a layout
  // to recompute blocks in backward (full activation checkpointing).
  void set_block_runner(SegmentRunner runner) { block_runner_ = std::move(runner); }
  const TpGroup& tensor_parallel() const { return tp_; }
  // Context parallelism: from now on embed, dropout and attention take this
  // rank's tokens as `split`'s segments of the global sequence.
  void set_sequence_split(SequenceSplit split) { seq_ = std::move(split), rotary_.clear(); }
  const SequenceSplit& sequence_split() const { return seq_; }

  // Mixture of experts (moe.cpp): the MoE layers in block order; the sum of
  // their aux losses from the last forward (undefined without MoE), which
  // loss() adds; expert parallelism (the caller has already cut the experts'
  // parameters to this rank's E / ep of them).
  std::vector<Moe> moe_layers() const;
  at::Tensor moe_aux_loss() const;
  void set_expert_parallel(EpGroup ep);

  torch::nn::Embedding wte{nullptr};  // [V, C]
  torch::nn::Embedding wpe{nullptr};  // [T, C] (gpt only: llama's positions are rotary)
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList blocks{nullptr};  // "blocks.<i>"
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};    // C -> V, no bias (absent when tie_embeddings)
  RmsNorm rms_f{nullptr};             // llama's final norm (named ln_f)

 private:
  at::Tensor run_unit(int unit, const std::function<at::Tensor()>& body);
  at::Tensor run_block(int i, const at::Tensor& x);
  at::Tensor final_norm(const at::Tensor& x);
  void build_param(const std::string& name, at::Tensor& p, ParamInit& init, const BuildScope& scope);
  std::map<std::string, std::vector<int64_t>> cut_shapes_;  // whole shapes of the parameters built cut
  int64_t whole_params_ = 0;
  SegmentRunner block_runner_;
  Rotary rotary_;  // llama: the blocks' shared cos/sin cache
  GptConfig cfg_;
  UnitHooks* hooks_ = nullptr;
  TpGroup tp_;
  EpGroup ep_;
  DropoutPosition position_;
  SequenceSplit seq_;
};
TORCH_MODULE(Gpt);

}  // namespace dtrain::engine::model
