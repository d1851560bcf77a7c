// config.json <-> ModelSpec and the parameter table of hf_llama.h. The HF
// names are transformers' LlamaForCausalLM / MixtralForCausalLM state-dict
// keys; k/v and gate/up are concatenated along dim 0, Mixtral's experts
// stacked along a leading expert dim.
#include "common/hf_llama.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace dtrain::hf {
namespace {

using Json = nlohmann::json;

[[noreturn]] void refuse(const std::string& source, const std::string& what, const std::string& hint = {}) {
  throw Error(ErrorCode::config, source + ": " + what, hint);
}

// The rotary parameters: transformers 5 keeps them in rope_parameters
// ({rope_type, rope_theta, factor, ...}), transformers 4 in rope_theta and
// rope_scaling ({rope_type or type, factor, ...}).
void read_rope(const Json& j, const std::string& source, ModelSpec& m) {
  const Json* scaling = nullptr;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) scaling = &j["rope_parameters"];
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) scaling = &j["rope_scaling"];
  if (j.contains("rope_theta") && j["rope_theta"].is_number()) m.rope_theta = j["rope_theta"].get<double>();
  else if (j.contains("rope_parameters") && j["rope_parameters"].contains("rope_theta"))
    m.rope_theta = j["rope_parameters"]["rope_theta"].get<double>();
  if (!scaling) return;
  std::string type = scaling->value("rope_type", scaling->value("type", std::string("default")));
  if (type == "default") return;
  if (type != "llama3")
    refuse(source, "rope type \"" + type + "\" is not supported (dtrain implements \"default\" and \"llama3\")",
           "use a model with Llama 3.1 style or no rotary scaling");
  m.rope_scaling.factor = scaling->value("factor", 8.0);
  m.rope_scaling.low_freq_factor = scaling->value("low_freq_factor", 1.0);
  m.rope_scaling.high_freq_factor = scaling->value("high_freq_factor", 4.0);
  m.rope_scaling.original_max_position = scaling->value("original_max_position_embeddings", 8192);
}

int need_int(const Json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || !j[key].is_number_integer())
    refuse(source, std::string("\"") + key + "\" is missing or not an integer", "config.json of a Llama model has it");
  return j[key].get<int>();
}

bool truthy(const Json& j, const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); }

// The fields of an HF config dtrain cannot honour: each is named.
void refuse_unsupported(const Json& j, const std::string& source, int hidden, int heads) {
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (truthy(j, key))
      refuse(source, std::string("\"") + key + "\": true is not supported (dtrain's Llama has no biases)");
  if (j.contains("sliding_window") && !j["sliding_window"].is_null())
    refuse(source, "\"sliding_window\": " + j["sliding_window"].dump() +
                       " is not supported (dtrain's attention is full causal); it must be null");
  if (j.contains("head_dim") && !j["head_dim"].is_null() && heads > 0 &&
      j["head_dim"].get<int>() != hidden / heads)
    refuse(source, "\"head_dim\": " + j["head_dim"].dump() + " differs from hidden_size / num_attention_heads = " +
                       std::to_string(hidden / heads) + "; dtrain needs head_dim = hidden_size / num_attention_heads");
  const std::string act = j.value("hidden_act", std::string("silu"));
  if (act != "silu") refuse(source, "\"hidden_act\": \"" + act + "\" is not supported (dtrain's SwiGLU uses silu)");
}

}  // namespace

ModelSpec model_from_config(const std::string& json_text, const std::string& source) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    refuse(source, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) refuse(source, "not a JSON object");
  std::string arch = j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()
                         ? j["architectures"][0].get<std::string>()
                         : "";
  if (arch.empty()) {  // no architectures list: judge by model_type
    const std::string type = j.value("model_type", std::string());
    arch = type == "llama" ? "LlamaForCausalLM" : type == "mixtral" ? "MixtralForCausalLM" : "model_type " + type;
  }
  if (arch != "LlamaForCausalLM" && arch != "MixtralForCausalLM")
    refuse(source, "architecture " + arch + " is not supported; dtrain imports " + kSupportedArchitectures);
  const bool mixtral = arch == "MixtralForCausalLM";
  ModelSpec m;
  m.kind = "llama";
  m.vocab = need_int(j, "vocab_size", source);
  m.d_model = need_int(j, "hidden_size", source);
  m.layers = need_int(j, "num_hidden_layers", source);
  m.heads = need_int(j, "num_attention_heads", source);
  m.kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                   ? j["num_key_value_heads"].get<int>() : m.heads;
  if (m.heads < 1 || m.kv_heads < 1 || m.heads % m.kv_heads != 0)
    refuse(source, "num_key_value_heads = " + std::to_string(m.kv_heads) + " does not divide num_attention_heads = " +
                       std::to_string(m.heads));
  refuse_unsupported(j, source, m.d_model, m.heads);
  const int inter = need_int(j, "intermediate_size", source);
  m.ffn_hidden = inter;
  m.norm_eps = j.value("rms_norm_eps", mixtral ? 1e-5 : 1e-6);
  m.rope_theta = mixtral ? 1e6 : 10000;
  read_rope(j, source, m);
  m.tie_embeddings = j.value("tie_word_embeddings", false);
  m.seq_len = std::min(j.value("max_position_embeddings", 2048), kMaxImportSeqLen);
  m.dropout = 0;
  if (mixtral) {
    m.moe.experts = need_int(j, "num_local_experts", source);
    m.moe.top_k = j.value("num_experts_per_tok", 2);
    m.moe.d_ff = inter;
    m.moe.every = 1;
    m.moe.aux_loss_coef = j.value("router_aux_loss_coef", 0.001);
    // capacity = tokens x top_k x factor / experts = every token: none dropped, as in HF
    m.moe.capacity_factor = double(m.moe.experts) / std::max(1, m.moe.top_k);
  }
  return m;
}

std::string config_from_model(const ModelSpec& m, const std::string& torch_dtype) {
  if (m.kind != "llama")
    throw Error(ErrorCode::config, "model.kind = " + m.kind + ": only model.kind llama exports to Hugging Face",
                "export a Llama checkpoint");
  const bool mixtral = m.moe.experts > 0;
  if (mixtral && m.moe.every != 1)
    throw Error(ErrorCode::config, "model.moe.every = " + std::to_string(m.moe.every) +
                                       ": MixtralForCausalLM has experts in every block; only every = 1 exports");
  nlohmann::ordered_json j;
  j["architectures"] = {mixtral ? "MixtralForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = mixtral ? "mixtral" : "llama";
  j["vocab_size"] = m.vocab;
  j["hidden_size"] = m.d_model;
  j["intermediate_size"] = mixtral ? (m.moe.d_ff > 0 ? m.moe.d_ff : 4 * m.d_model) : m.effective_ffn_hidden();
  j["num_hidden_layers"] = m.layers;
  j["num_attention_heads"] = m.heads;
  j["num_key_value_heads"] = m.effective_kv_heads();
  j["head_dim"] = m.d_model / m.heads;
  j["hidden_act"] = "silu";
  const bool scaled = m.rope_scaling.factor > 0;
  j["max_position_embeddings"] = scaled ? std::max(m.seq_len, m.rope_scaling.original_max_position) : m.seq_len;
  j["rms_norm_eps"] = m.norm_eps;
  nlohmann::ordered_json rope;
  rope["rope_theta"] = m.rope_theta;
  rope["rope_type"] = scaled ? "llama3" : "default";
  if (scaled) {
    rope["factor"] = m.rope_scaling.factor;
    rope["low_freq_factor"] = m.rope_scaling.low_freq_factor;
    rope["high_freq_factor"] = m.rope_scaling.high_freq_factor;
    rope["original_max_position_embeddings"] = m.rope_scaling.original_max_position;
  }
  j["rope_parameters"] = rope;
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["attention_dropout"] = 0.0;
  if (!mixtral) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  } else {
    j["num_local_experts"] = m.moe.experts;
    j["num_experts_per_tok"] = m.moe.top_k;
    j["router_aux_loss_coef"] = m.moe.aux_loss_coef;
    j["sliding_window"] = nullptr;
  }
  j["dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

std::string architecture_difference(const ModelSpec& a, const ModelSpec& b, const std::string& here,
                                    const std::string& there) {
  const auto num = [](auto v) {
    if constexpr (std::is_floating_point_v<decltype(v)>) return nlohmann::json(v).dump();
    else return std::to_string(v);
  };
  const bool llama = a.kind == "llama";
  const std::pair<const char*, std::pair<std::string, std::string>> fields[] = {
      {"model.kind", {a.kind, b.kind}},
      {"model.vocab", {num(a.vocab), num(b.vocab)}},
      {"model.d_model", {num(a.d_model), num(b.d_model)}},
      {"model.layers", {num(a.layers), num(b.layers)}},
      {"model.heads", {num(a.heads), num(b.heads)}},
      {"model.seq_len", {llama ? "" : num(a.seq_len), llama ? "" : num(b.seq_len)}},  // gpt: the wpe table
      {"model.kv_heads", {num(a.effective_kv_heads()), num(b.effective_kv_heads())}},
      {"model.ffn_hidden", {num(a.effective_ffn_hidden()), num(b.effective_ffn_hidden())}},
      {"model.norm_eps", {num(a.norm_eps), num(b.norm_eps)}},
      {"model.rope_theta", {num(a.rope_theta), num(b.rope_theta)}},
      {"model.rope_scaling.factor", {num(a.rope_scaling.factor), num(b.rope_scaling.factor)}},
      {"model.tie_embeddings", {a.tie_embeddings ? "true" : "false", b.tie_embeddings ? "true" : "false"}},
      {"model.moe.experts", {num(a.moe.experts), num(b.moe.experts)}},
      {"model.moe.top_k", {num(a.moe.experts ? a.moe.top_k : 0), num(b.moe.experts ? b.moe.top_k : 0)}},
      {"model.moe.every", {num(a.moe.experts ? a.moe.every : 0), num(b.moe.experts ? b.moe.every : 0)}},
      {"model.moe.d_ff", {num(a.moe.experts ? (a.moe.d_ff > 0 ? a.moe.d_ff : 4 * a.d_model) : 0),
                          num(b.moe.experts ? (b.moe.d_ff > 0 ? b.moe.d_ff : 4 * b.d_model) : 0)}},
  };
  for (const auto& [name, v] : fields)
    if (v.first != v.second)
      return std::string(name) + " = " + v.first + " " + here + ", " + v.second + " " + there;
  return "";
}

std::vector<LlamaParam> llama_params(const ModelSpec& m) {
  const int64_t V = m.vocab, C = m.d_model, H = m.heads, KV = m.effective_kv_heads(), D = C / H;
  const int64_t F = m.effective_ffn_hidden(), E = m.moe.experts, Fe = m.moe.d_ff > 0 ? m.moe.d_ff : 4 * C;
  using R = checkpoint::Range;
  std::vector<LlamaParam> out;
  // A parameter that is one HF tensor of the same shape.
  auto whole = [&](const std::string& name, std::vector<int64_t> shape, const std::string& hf) {
    std::vector<R> region;
    for (int64_t d : shape) region.emplace_back(0, d);
    out.push_back({name, shape, {{hf, shape, region}}});
  };
  // A [rows_a + rows_b, cols] parameter: HF a then HF b along dim 0.
  auto cat2 = [&](const std::string& name, int64_t ra, int64_t rb, int64_t cols, const std::string& a,
                  const std::string& b) {
    out.push_back({name, {ra + rb, cols},
                   {{a, {ra, cols}, {R{0, ra}, R{0, cols}}}, {b, {rb, cols}, {R{ra, ra + rb}, R{0, cols}}}}});
  };
  whole("wte.weight", {V, C}, "model.embed_tokens.weight");
  for (int i = 0; i < m.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".", h = "model.layers." + std::to_string(i) + ".";
    whole(b + "ln1.weight", {C}, h + "input_layernorm.weight");
    whole(b + "attn.q.weight", {H * D, C}, h + "self_attn.q_proj.weight");
    cat2(b + "attn.kv.weight", KV * D, KV * D, C, h + "self_attn.k_proj.weight", h + "self_attn.v_proj.weight");
    whole(b + "attn.proj.weight", {C, H * D}, h + "self_attn.o_proj.weight");
    whole(b + "ln2.weight", {C}, h + "post_attention_layernorm.weight");
    if (E > 0 && i % m.moe.every == 0) {
      const std::string x = h + "block_sparse_moe.";
      whole(b + "moe.router.weight", {E, C}, x + "gate.weight");
      LlamaParam fc{b + "moe.fc.weight", {E, 2 * Fe, C}, {}}, proj{b + "moe.proj.weight", {E, C, Fe}, {}};
      for (int64_t e = 0; e < E; ++e) {
        const std::string ex = x + "experts." + std::to_string(e) + ".";
        fc.pieces.push_back({ex + "w1.weight", {Fe, C}, {R{e, e + 1}, R{0, Fe}, R{0, C}}});
        fc.pieces.push_back({ex + "w3.weight", {Fe, C}, {R{e, e + 1}, R{Fe, 2 * Fe}, R{0, C}}});
        proj.pieces.push_back({ex + "w2.weight", {C, Fe}, {R{e, e + 1}, R{0, C}, R{0, Fe}}});
      }
      out.push_back(std::move(fc));
      out.push_back(std::move(proj));
    } else {
      cat2(b + "mlp.gate_up.weight", F, F, C, h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight");
      whole(b + "mlp.proj.weight", {C, F}, h + "mlp.down_proj.weight");
    }
  }
  whole("ln_f.weight", {C}, "model.norm.weight");
  if (!m.tie_embeddings) whole("head.weight", {V, C}, "lm_head.weight");
  return out;
}

}  // namespace dtrain::hf
