// Hugging Face LlamaForCausalLM / MixtralForCausalLM <-> dtrain model.kind
// llama (the contract in docs/ARCHITECTURE.md, 'Hugging Face weights'):
// config.json to a ModelSpec and back, and the table of dtrain's global
// parameters with the HF tensors each one is made of. Names and shapes only:
// reading and writing tensors is hf_import.h / hf_export.h. No LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/checkpoint_index.h"
#include "common/job_spec.h"

namespace dtrain::hf {

// The architectures import reads (config.json "architectures"[0]).
constexpr const char* kSupportedArchitectures = "LlamaForCausalLM, MixtralForCausalLM";
constexpr int kMaxImportSeqLen = 4096;  // model.seq_len = min(max_position_embeddings, this)

// config.json (text) as a model section: kind llama, the architecture's
// fields, seq_len from max_position_embeddings capped at kMaxImportSeqLen,
// Mixtral's experts with a capacity that drops no token (HF routes every
// token). Throws dtrain::Error(config) naming `source` and the key for an
// unsupported architecture or a field dtrain cannot honour (attention_bias,
// mlp_bias, sliding_window, head_dim != hidden / heads, hidden_act other than
// silu, rope types other than llama3, kv heads not dividing heads).
ModelSpec model_from_config(const std::string& json_text, const std::string& source);

// config.json for a model section (kind llama; Mixtral when it has experts,
// which must then be in every block). Throws dtrain::Error(config) for a
// model transformers cannot express (a gpt, MoE in only some blocks).
std::string config_from_model(const ModelSpec& m, const std::string& torch_dtype);

// The first architecture field (one that changes a parameter's shape or the
// function the model computes: kind, sizes, heads, norms, rotary, experts)
// where `run` and `other` differ, as "model.d_model = 64 here, 128 there"
// with `here` and `there` naming them; "" when they agree.
std::string architecture_difference(const ModelSpec& run, const ModelSpec& other, const std::string& here,
                                    const std::string& there);

// One HF tensor inside a dtrain parameter: `region` of the dtrain tensor
// ([start, stop) per dim) holds it, row-major, with HF shape `shape`.
struct HfPiece {
  std::string name;            // "model.layers.0.self_attn.k_proj.weight"
  std::vector<int64_t> shape;  // its HF shape
  std::vector<checkpoint::Range> region;
};

// One of dtrain's global parameters (the checkpoint stores it as
// "model/<name>"). Its pieces tile it in row-major order, so the dtrain
// tensor's bytes are the pieces' bytes one after another.
struct LlamaParam {
  std::string name;            // "blocks.0.attn.kv.weight"
  std::vector<int64_t> shape;  // global
  std::vector<HfPiece> pieces;
};

// Every parameter of model.kind llama in the engine's order (wte, blocks,
// ln_f, head unless tied), each with its HF pieces.
std::vector<LlamaParam> llama_params(const ModelSpec& m);

}  // namespace dtrain::hf
