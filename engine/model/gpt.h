// A GPT (DESIGN.md section 6, model/): token + position embeddings, pre-
// LayerNorm blocks (causal multi-head self-attention, GELU MLP), final
// LayerNorm, output head. Deterministic init from a seed, stable parameter
// names ("blocks.3.attn.qkv.weight"). Written so TP/PP/EP are layouts of it:
// blocks are separate modules, linears are replaceable. Not parallel itself.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/dropout.h>

#include <cstdint>

namespace dtrain::engine::model {

struct GptConfig {
  int vocab = 256;
  int layers = 2;
  int d_model = 64;
  int heads = 4;
  int seq_len = 64;  // maximum context (position table size)
  double dropout = 0.0;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& cfg);
  at::Tensor forward(const at::Tensor& x);  // [B, T, C] -> [B, T, C]
  torch::nn::Linear qkv{nullptr};   // C -> 3C
  torch::nn::Linear proj{nullptr};  // C -> C
  torch::nn::Dropout attn_drop{nullptr}, resid_drop{nullptr};
  int heads;

 private:
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
  torch::nn::Linear fc{nullptr};    // C -> 4C
  torch::nn::Linear proj{nullptr};  // 4C -> C
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Mlp);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GptConfig& cfg);
  at::Tensor forward(const at::Tensor& x);  // x + attn(ln1(x)); x + mlp(ln2(x))
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  // Parameters are initialised deterministically from `seed` (same numbers
  // whatever the process, so every rank starts from the 1-process model).
  GptImpl(const GptConfig& cfg, uint64_t seed);

  // tokens [B, T] int64 -> logits [B, T, V]
  at::Tensor forward(const at::Tensor& tokens);
  // Mean cross-entropy over all B*T positions of next-token targets [B, T].
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets);

  int64_t num_params() const;
  const GptConfig& config() const { return cfg_; }

  torch::nn::Embedding wte{nullptr};  // [V, C]
  torch::nn::Embedding wpe{nullptr};  // [T, C]
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList blocks{nullptr};  // "blocks.<i>"
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};    // C -> V, no bias

 private:
  GptConfig cfg_;
};
TORCH_MODULE(Gpt);

}  // namespace dtrain::engine::model
