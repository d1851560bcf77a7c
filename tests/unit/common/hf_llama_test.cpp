// The Hugging Face mapping without files: config.json to a model section and
// back, the parameter table's pieces tiling each parameter, and the dtype
// conversions against values worked out by hand (bf16 and fp16 bit patterns,
// round-to-nearest-even, subnormals, inf and NaN).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "common/error.h"
#include "common/hf_llama.h"
#include "common/hf_source.h"
#include "common/safetensors.h"

using dtrain::hf::llama_params;
using dtrain::hf::model_from_config;

namespace {
float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float from(const std::string& dtype, uint16_t v) {
  float f = 0;
  const uint8_t b[2] = {uint8_t(v & 0xFF), uint8_t(v >> 8)};
  dtrain::hf::to_fp32(dtype, b, &f, 1);
  return f;
}
}  // namespace

TEST_CASE("fp16 and bf16 widen to fp32 exactly") {
  CHECK(from("BF16", 0x3F80) == 1.0f);
  CHECK(from("BF16", 0xC049) == bits_to_float(0xC0490000u));
  CHECK(from("F16", 0x3C00) == 1.0f);
  CHECK(from("F16", 0xC000) == -2.0f);
  CHECK(from("F16", 0x7BFF) == 65504.0f);
  CHECK(from("F16", 0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(from("F16", 0x03FF) == std::ldexp(1023.0f, -24));  // largest subnormal
  CHECK(from("F16", 0x0400) == std::ldexp(1.0f, -14));  // smallest normal
  CHECK(std::signbit(from("F16", 0x8000)));
  CHECK(from("F16", 0x7C00) == std::numeric_limits<float>::infinity());
  CHECK(std::isnan(from("F16", 0x7E00)));
  // every fp16 value, against the arithmetic definition
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t e = (h >> 10) & 0x1F, man = h & 0x3FF;
    if (e == 0x1F) continue;
    const float want = (h & 0x8000 ? -1.0f : 1.0f) *
                       (e == 0 ? std::ldexp(float(man), -24) : std::ldexp(float(1024 + man), int(e) - 25));
    if (from("F16", uint16_t(h)) != want) FAIL("fp16 " << h);
  }
}

TEST_CASE("fp32 to bf16 rounds to nearest even and keeps NaN a NaN") {
  const auto one = [](uint32_t u) {
    uint16_t out;
    const float f = bits_to_float(u);
    dtrain::hf::to_bf16(&f, &out, 1);
    return out;
  };
  CHECK(one(0x3F800000u) == 0x3F80);
  CHECK(one(0x3F808000u) == 0x3F80);  // a tie, down to even
  CHECK(one(0x3F818000u) == 0x3F82);  // a tie, up to even
  CHECK(one(0x3F808001u) == 0x3F81);  // above the tie
  CHECK(one(0x7F7FFFFFu) == 0x7F80);  // the largest float rounds to inf, as torch does
  CHECK((one(0x7FC00001u) & 0x7FFF) > 0x7F80);
  CHECK((one(0x7F800001u) & 0x7FFF) > 0x7F80);  // a NaN whose payload is below bit 16
}

TEST_CASE("config.json to a model section and back") {
  const std::string cfg = R"({"architectures": ["MixtralForCausalLM"], "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"},
    "max_position_embeddings": 131072, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": null,
    "head_dim": null, "tie_word_embeddings": false})";
  const dtrain::ModelSpec m = model_from_config(cfg, "config.json");
  CHECK(m.kind == "llama");
  CHECK(m.seq_len == 4096);  // capped
  CHECK(m.effective_kv_heads() == 2);
  CHECK(m.rope_theta == 1e6);
  CHECK(m.moe.experts == 4);
  CHECK(m.moe.top_k == 2);
  CHECK(m.moe.d_ff == 96);
  CHECK(m.moe.capacity_factor == 2.0);  // experts / top_k: no token dropped
  const dtrain::ModelSpec back = model_from_config(dtrain::hf::config_from_model(m, "float32"), "again");
  CHECK(dtrain::hf::architecture_difference(m, back, "a", "b").empty());
  dtrain::ModelSpec other = m;
  other.d_model = 32;
  CHECK(dtrain::hf::architecture_difference(m, other, "here", "there") == "model.d_model = 64 here, 32 there");

  const std::string scaled = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 8,
    "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192}})";
  const dtrain::ModelSpec s = model_from_config(scaled, "v4 config");
  CHECK(s.rope_theta == 500000.0);
  CHECK(s.rope_scaling.factor == 8.0);
  CHECK(s.rope_scaling.original_max_position == 8192);
  CHECK(s.effective_kv_heads() == 2);
}

TEST_CASE("each parameter's HF pieces tile it in row-major order") {
  dtrain::ModelSpec m;
  m.kind = "llama";
  m.vocab = 10, m.d_model = 8, m.heads = 4, m.kv_heads = 2, m.ffn_hidden = 6, m.layers = 2;
  for (int experts : {0, 3}) {
    m.moe.experts = experts;
    m.moe.d_ff = 5;
    size_t hf_tensors = 0;
    for (const auto& p : llama_params(m)) {
      int64_t covered = 0, next = 0;  // pieces must be consecutive runs of the flat tensor
      std::vector<int64_t> stride(p.shape.size(), 1);
      for (size_t d = p.shape.size(); d-- > 1;) stride[d - 1] = stride[d] * p.shape[d];
      for (const auto& piece : p.pieces) {
        int64_t first = 0, n = 1;
        for (size_t d = 0; d < p.shape.size(); ++d) {
          first += piece.region[d].first * stride[d];
          n *= piece.region[d].second - piece.region[d].first;
        }
        CHECK(first == next);
        CHECK(n == dtrain::safetensors::numel(piece.shape));
        next = first + n;
        covered += n;
        ++hf_tensors;
      }
      CHECK(covered == dtrain::safetensors::numel(p.shape));
    }
    // embed, norm, head; per layer q k v o + 2 norms + (gate up down | router + 3 per expert)
    CHECK(hf_tensors == 3 + 2 * (6 + (experts ? 1 + 3 * experts : 3)));
  }
}

TEST_CASE("train.init_from: a blank path is refused, naming the field") {
  CHECK_NOTHROW(dtrain::parse_job_spec("train: {init_from: hf/llama}\n", "s.yaml"));
  try {
    dtrain::parse_job_spec("train: {init_from: ' '}\n", "s.yaml");
    FAIL("a blank train.init_from was accepted");
  } catch (const dtrain::Error& e) {
    CHECK(e.code() == dtrain::ErrorCode::config);
    CHECK(std::string(e.what()).find("train.init_from is blank") != std::string::npos);
  }
}
