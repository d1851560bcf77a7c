#!/usr/bin/env python3
# data_prepare_ref.py: the reference side of tests/integration/data_prepare_test.cpp.
#
#   data_prepare_ref.py make CORPUS DIR   -> DIR/tok.json (a byte-level BPE,
#       vocab 1000, trained by `tokenizers` on CORPUS), DIR/a.jsonl and
#       DIR/b.jsonl (the corpus's paragraphs, one document per line),
#       DIR/c.txt and DIR/d.txt (one document each)
#   data_prepare_ref.py make32k CORPUS DIR -> DIR/tok32k.json (a byte-level
#       BPE of 32000 entries trained on CORPUS), DIR/train.jsonl (the corpus's
#       paragraphs but every 20th) and DIR/valid.jsonl (every 20th: held out)
#   data_prepare_ref.py check DIR PREFIX INPUT... [--eod]
#       -> every document's ids from tokenizers' encode (+ the eod id) against
#       megatron-core's IndexedDataset(PREFIX)[i]; prints how many differ,
#       then the same with one token of a copy of PREFIX changed (a negative
#       control that must show exactly one document differing). Exit 0 when
#       the output matches and the control misses.
import json
import os
import shutil
import sys
import warnings

warnings.filterwarnings("ignore")
import numpy as np


def train_bpe(corpus, out, vocab, name):
    """A byte-level BPE of `vocab` entries trained on CORPUS, saved as OUT/NAME;
    returns it and the corpus's paragraphs (split at blank lines)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>", "<unk>"], show_progress=False)
    tok.train([corpus], trainer)
    tok.save(os.path.join(out, name))
    paragraphs = [p for p in open(corpus, encoding="utf-8", errors="replace").read().split("\n\n") if p.strip()]
    return tok, paragraphs


def make(corpus, out):
    tok, paragraphs = train_bpe(corpus, out, 1000, "tok.json")
    for name, part in (("a", paragraphs[:240]), ("b", paragraphs[240:300])):
        with open(os.path.join(out, name + ".jsonl"), "w") as f:
            for p in part:
                f.write(json.dumps({"text": p, "id": len(p)}) + "\n")
    with open(os.path.join(out, "c.txt"), "w") as f:
        f.write("\n\n".join(paragraphs[300:305]))
    with open(os.path.join(out, "d.txt"), "w") as f:
        f.write("one short document\n")
    print(f"tokenizer vocab {tok.get_vocab_size()}; {len(paragraphs)} paragraphs")


def make32k(corpus, out):
    tok, paragraphs = train_bpe(corpus, out, 32000, "tok32k.json")
    for name, keep in (("train", lambda i: i % 20 != 0), ("valid", lambda i: i % 20 == 0)):
        with open(os.path.join(out, name + ".jsonl"), "w") as f:
            for i, p in enumerate(paragraphs):
                if keep(i):
                    f.write(json.dumps({"text": p}) + "\n")
    print("tok32k.json:", tok.get_vocab_size(), "entries;", len(paragraphs), "paragraphs")


def texts(path):
    if path.endswith(".jsonl"):
        return [json.loads(line)["text"] for line in open(path) if line.strip()]
    return [open(path, encoding="utf-8").read()]


def misses(prefix, expected):
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    ds = IndexedDataset(prefix)
    if len(ds) != len(expected):
        return len(expected), f"{len(ds)} sequences, {len(expected)} documents"
    bad = sum(1 for i, ids in enumerate(expected) if not np.array_equal(np.asarray(ds[i], dtype=np.int64), ids))
    return bad, f"{len(ds)} sequences, dtype {ds.index.dtype.__name__}"


def check(out, prefix, inputs, eod):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(out, "tok.json"))
    eod_id = tok.token_to_id("<|endoftext|>")
    expected = []
    for path in inputs:
        for t in texts(path):
            expected.append(np.asarray(tok.encode(t).ids + ([eod_id] if eod else []), dtype=np.int64))
    bad, what = misses(prefix, expected)
    print(f"{bad} of {len(expected)} documents differ from tokenizers' encode ({what}, "
          f"{sum(len(e) for e in expected)} tokens)")
    # Negative control: the copy with one token of document 7 changed.
    copy = os.path.join(out, "control")
    shutil.copy(prefix + ".idx", copy + ".idx")
    data = bytearray(open(prefix + ".bin", "rb").read())
    at = sum(len(e) for e in expected[:7]) * (2 if len(tok.get_vocab()) < 65536 else 4)
    data[at] ^= 1
    open(copy + ".bin", "wb").write(bytes(data))
    control, _ = misses(copy, expected)
    print(f"negative control (one token of document 7 changed): {control} documents differ")
    return 0 if bad == 0 and control == 1 else 1


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "make32k":
        make32k(sys.argv[2], sys.argv[3])
    else:
        eod = "--eod" in sys.argv
        args = [a for a in sys.argv[2:] if a != "--eod"]
        sys.exit(check(args[0], args[1], args[2:], eod))
