#!/usr/bin/python3
# Reads a merged dtrain checkpoint by the public safetensors format only
# (u64 LE header length, JSON header, raw data via torch.frombuffer) and
# computes dtrain's GPT loss on every seq_len window of a byte file, as a
# check that the merged file is usable outside dtrain. Prints "loss <value>".
#   read_safetensors.py MERGED.safetensors TEXT_FILE
import json
import math
import re
import struct
import sys

import torch
import torch.nn.functional as F


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    dtypes = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "U8": torch.uint8}
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        buf = bytearray(data[8 + n + begin:8 + n + end])
        tensors[name] = torch.frombuffer(buf, dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    return tensors, meta


def gpt_loss(w, heads, tokens, targets):
    B, T = tokens.shape
    C = w["wte.weight"].shape[1]
    layers = len({k.split(".")[1] for k in w if k.startswith("blocks.")})
    x = w["wte.weight"][tokens] + w["wpe.weight"][:T]  # [B, T, C]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i in range(layers):
        p = "blocks.%d." % i
        h = F.layer_norm(x, (C,), w[p + "ln1.weight"], w[p + "ln1.bias"], 1e-5)
        qkv = F.linear(h, w[p + "attn.qkv.weight"], w[p + "attn.qkv.bias"])  # [B, T, 3C]
        q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // heads))  # [B, H, T, T]
        att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, w[p + "attn.proj.weight"], w[p + "attn.proj.bias"])
        h = F.layer_norm(x, (C,), w[p + "ln2.weight"], w[p + "ln2.bias"], 1e-5)
        h = F.gelu(F.linear(h, w[p + "mlp.fc.weight"], w[p + "mlp.fc.bias"]))
        x = x + F.linear(h, w[p + "mlp.proj.weight"], w[p + "mlp.proj.bias"])
    x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
    logits = F.linear(x, w["head.weight"])  # [B, T, V]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    weights, meta = read_safetensors(sys.argv[1])
    heads = int(re.search(r"heads=(\d+)", meta["dtrain.model"]).group(1))
    T = weights["wpe.weight"].shape[0]
    data = open(sys.argv[2], "rb").read()
    n = (len(data) - 1) // T  # dtrain's windows(): sample i = bytes [iT, iT + T]
    stream = torch.tensor(list(data[: n * T + 1]), dtype=torch.int64)
    tokens = torch.stack([stream[i * T:i * T + T] for i in range(n)])
    targets = torch.stack([stream[i * T + 1:i * T + T + 1] for i in range(n)])
    with torch.no_grad():
        print("loss %.17g" % gpt_loss(weights, heads, tokens, targets).item())


if __name__ == "__main__":
    main()
