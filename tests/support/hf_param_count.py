"""Independent parameter counts for `dtrain plan`'s llama: builds Hugging Face
LlamaForCausalLM / MixtralForCausalLM from a config on the meta device (no
memory, no download) and prints one JSON line per model, {"name", "params"},
the sum of every parameter's numel (a tied head counted once).

usage: hf_param_count.py NAME=KEY:VALUE,KEY:VALUE... ...
  keys: kind (llama|mixtral), vocab, d_model, layers, heads, kv_heads, ffn,
  experts, top_k, tie (0|1)
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM  # noqa: E402


def build(f):
    common = dict(vocab_size=f["vocab"], hidden_size=f["d_model"], intermediate_size=f["ffn"],
                  num_hidden_layers=f["layers"], num_attention_heads=f["heads"],
                  num_key_value_heads=f["kv_heads"], tie_word_embeddings=bool(f.get("tie", 0)))
    if f["kind"] == "mixtral":
        return MixtralForCausalLM(MixtralConfig(num_local_experts=f["experts"], num_experts_per_tok=f["top_k"],
                                                **common))
    return LlamaForCausalLM(LlamaConfig(attention_bias=False, mlp_bias=False, **common))


def main():
    for arg in sys.argv[1:]:
        name, spec = arg.split("=", 1)
        fields = {}
        for kv in spec.split(","):
            k, v = kv.split(":")
            fields[k] = v if k == "kind" else int(v)
        with torch.device("meta"):
            model = build(fields)
        # parameters() yields a tied weight once.
        params = sum(p.numel() for p in model.parameters())
        print(json.dumps({"name": name, "params": params}), flush=True)


if __name__ == "__main__":
    main()
