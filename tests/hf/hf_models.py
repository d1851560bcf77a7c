#!/usr/bin/env python3
"""Test helper for dtrain's Hugging Face import/export (tests/integration/hf_test.cpp).

  make KIND DIR [--dtype fp16|bf16] [--tie] [--shard-bytes N] [KIND DIR ...]
      random tiny LlamaForCausalLM (KIND llama) or MixtralForCausalLM (mixtral)
      models built from a config with transformers and saved with save_pretrained.
  compare [--tol T] A B [A B ...]
      loads each pair with AutoModelForCausalLM.from_pretrained (a missing,
      unexpected or mismatched key is reported) and compares the state dicts bit
      for bit (after an exact upcast to fp32 where the dtypes differ); prints
      "pair i: clean load; N differ, max abs diff X" per pair; exit 1 when any
      pair differs (by more than T, when given) or loads unclean.
  windows T K CORPUS DIR [--logits FILE.npy] [DIR [--logits FILE.npy] ...]
      per model, transformers' mean next-token cross-entropy (fp32) over the
      corpus's first K windows as `dtrain eval` cuts them (window i = bytes
      [i*T, i*T+T+1)), and over the same windows one byte later (the negative
      control): "windows DIR loss X shifted Y"; with --logits after a DIR, the
      largest |difference| between FILE's [T, V] logits (`dtrain eval
      --logits-out`) and transformers' for that DIR's window 0, and for its
      window 1 (the control): "logits DIR max abs diff D window 1 E".
Never downloads (HF_HUB_OFFLINE=1).
"""
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "warning")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, MixtralConfig  # noqa: E402

# initializer_range 0.1 (transformers' default 0.02 gives near-uniform logits,
# every window's loss within ~1e-3 of ln 256): losses that tell windows apart.
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=256, max_position_embeddings=128, initializer_range=0.1)


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


def load(path):
    """from_pretrained and the keys its loading info reports (missing, unexpected, mismatched)."""
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    return model, {k: v for k, v in info.items() if v}


def compare_pair(i, a, b, tol=None):
    (ma, bad_a), (mb, bad_b) = load(a), load(b)
    if bad_a or bad_b:
        print(f"pair {i}: load not clean: {a}: {bad_a} {b}: {bad_b}")
        return False
    sa, sb = ma.state_dict(), mb.state_dict()
    if sorted(sa) != sorted(sb):
        print(f"pair {i}: different keys: {sorted(set(sa) ^ set(sb))}")
        return False
    worst, differing = 0.0, []
    for k in sa:
        x, y = sa[k], sb[k]
        if x.shape != y.shape:
            print(f"pair {i}: {k}: shape {tuple(x.shape)} vs {tuple(y.shape)}")
            return False
        if x.dtype != y.dtype:  # a bf16 / fp16 original and its fp32 export: the upcast is exact
            x, y = x.float(), y.float()
        if not torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)):
            d = (x.float() - y.float()).abs().max().item()
            worst = max(worst, d) if d == d else float("inf")
            differing.append(k)
    ok = not differing if tol is None else worst <= tol
    print(f"pair {i}: clean load; {len(differing)} differ, max abs diff {worst} "
          f"(tolerance: {'bit for bit' if tol is None else tol}; {len(sa)} tensors) {'OK' if ok else 'FAIL'}")
    return ok


def main(argv):
    if argv[0] == "make":
        args, i = argv[1:], 0
        while i < len(args):
            kind, out, opts = args[i], args[i + 1], {"dtype": "fp32", "tie": False, "shard_bytes": None}
            i += 2
            while i < len(args) and args[i].startswith("--"):
                if args[i] == "--tie":
                    opts["tie"] = True
                    i += 1
                else:
                    opts[args[i][2:].replace("-", "_")] = args[i + 1]
                    i += 2
            make(kind, out, **opts)
        return 0
    if argv[0] == "windows":
        t, k, data = int(argv[1]), int(argv[2]), open(argv[3], "rb").read()
        dirs, logits_of = [], {}  # DIR, and the logits file given after it
        rest = argv[4:]
        while rest:
            if rest[0] == "--logits":
                logits_of[dirs[-1]], rest = rest[1], rest[2:]
            else:
                dirs.append(rest[0])
                rest = rest[1:]
        for path in dirs:
            model, bad = load(path)
            if bad:
                raise SystemExit(f"{path}: load not clean: {bad}")
            model.float().eval()
            losses, logits = [], None
            with torch.no_grad():
                for start in (0, 1):
                    rows = torch.tensor([list(data[i * t + start: i * t + start + t + 1]) for i in range(k)],
                                        dtype=torch.long)  # [K, T+1]
                    out = model(rows[:, :t]).logits.float()  # [K, T, V]
                    logits = out[:2] if logits is None else logits
                    losses.append(torch.nn.functional.cross_entropy(out.flatten(0, 1), rows[:, 1:].flatten()).item())
            print(f"windows {path} loss {losses[0]!r} shifted {losses[1]!r}")
            if path in logits_of:
                import numpy as np
                mine = torch.from_numpy(np.load(logits_of[path]))
                if tuple(mine.shape) != tuple(logits[0].shape):
                    raise SystemExit(f"{logits_of[path]}: shape {tuple(mine.shape)}, transformers' "
                                     f"{tuple(logits[0].shape)}")
                d0 = (mine - logits[0]).abs().max().item()
                d1 = (mine - logits[1]).abs().max().item()
                print(f"logits {path} max abs diff {d0!r} window 1 {d1!r}")
        return 0
    if argv[0] == "compare":
        tol, pairs = None, argv[1:]
        if pairs[0] == "--tol":
            tol, pairs = float(pairs[1]), pairs[2:]
        ok = [compare_pair(i, pairs[2 * i], pairs[2 * i + 1], tol) for i in range(len(pairs) // 2)]
        return 0 if all(ok) else 1
    raise SystemExit(__doc__)


if __name__ == "__main__":
    transformers.logging.set_verbosity_warning()
    sys.exit(main(sys.argv[1:]))
