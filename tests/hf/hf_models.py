#!/usr/bin/env python3
"""Test helper for dtrain's Hugging Face import/export (tests/integration/hf_test.cpp).

  make KIND DIR [--dtype bf16] [--tie] [--shard-bytes N]
      a random tiny LlamaForCausalLM (KIND llama) or MixtralForCausalLM (mixtral)
      built from a config with transformers and saved with save_pretrained.
  compare A B
      loads both with AutoModelForCausalLM.from_pretrained (fails on any
      missing/unexpected-key warning or load report) and compares the state
      dicts bit for bit; prints the max difference.
Never downloads (HF_HUB_OFFLINE=1).
"""
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "warning")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, MixtralConfig  # noqa: E402

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=256, max_position_embeddings=128)


def make(kind, out, dtype="fp32", tie=False, shard_bytes=None):
    torch.manual_seed(1234)
    if kind == "llama":
        cfg = LlamaConfig(**TINY, tie_word_embeddings=tie, rms_norm_eps=1e-5, rope_theta=10000.0)
    else:
        cfg = MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=tie)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # norms away from 1 so a swapped norm shows
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    elif dtype == "fp16":
        model = model.to(torch.float16)
    kwargs = {"max_shard_size": int(shard_bytes)} if shard_bytes else {}
    model.save_pretrained(out, **kwargs)


def load_clean(path):
    """from_pretrained, failing on any load report (missing, unexpected, mismatched keys)."""
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise SystemExit(f"{path}: transformers' loading info is not clean: {bad}")
    return model


def compare(a, b):
    ma, mb = load_clean(a), load_clean(b)
    sa, sb = ma.state_dict(), mb.state_dict()
    if sorted(sa) != sorted(sb):
        raise SystemExit(f"different keys: {sorted(set(sa) ^ set(sb))}")
    worst, differing, upcast = 0.0, [], 0
    for k in sa:
        x, y = sa[k], sb[k]
        if x.shape != y.shape:
            raise SystemExit(f"{k}: shape {tuple(x.shape)} vs {tuple(y.shape)}")
        if x.dtype != y.dtype:  # e.g. a bf16 original and its fp32 export: the upcast is exact
            x, y, upcast = x.float(), y.float(), upcast + 1
        if not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
            d = (x.float() - y.float()).abs().max().item()
            worst = max(worst, d) if d == d else float("inf")
            differing.append(k)
            print(f"differs: {k} max abs diff {d}")
    print(f"compared {len(sa)} tensors ({upcast} upcast to fp32 first): {len(differing)} differ, "
          f"max abs diff {worst} (tolerance: bit for bit)")
    sys.exit(1 if differing else 0)

if __name__ == "__main__":
    transformers.logging.set_verbosity_warning()
    cmd = sys.argv[1]
    if cmd == "make":
        args = sys.argv[2:]
        opts = {"dtype": "fp32", "tie": False, "shard_bytes": None}
        kind, out = args[0], args[1]
        i = 2
        while i < len(args):
            if args[i] == "--dtype":
                opts["dtype"] = args[i + 1]; i += 2
            elif args[i] == "--tie":
                opts["tie"] = True; i += 1
            elif args[i] == "--shard-bytes":
                opts["shard_bytes"] = args[i + 1]; i += 2
            else:
                raise SystemExit(f"unknown option {args[i]}")
        make(kind, out, **opts)
    elif cmd == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(__doc__)
