#!/usr/bin/env python3
# megatron_indexed.py: the reference side of tests/unit/engine/indexed_data_test.cpp.
# Writes Megatron indexed datasets with megatron-core's own IndexedDatasetBuilder
# (uint16 and int32, documents of different lengths, some of several sequences),
# reads each back with megatron-core's IndexedDataset, and writes what it read,
# concatenated in index order, as raw little-endian int64 to PREFIX.expected.
#
#   megatron_indexed.py OUT_DIR   -> OUT_DIR/{u16,i32}.{idx,bin,expected}
import os
import sys
import warnings

warnings.filterwarnings("ignore")
import numpy as np
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder


def write(prefix, dtype, vocab, seed):
    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for doc in range(9):
        # 1 to 3 sequences per document, 1 to 60 tokens each; the last token of
        # each document is the end-of-document id 0, as a tokenizer writes it.
        for s in range(1 + doc % 3):
            n = int(rng.integers(1, 61))
            seq = rng.integers(1, vocab, size=n).astype(np.int64)
            if s == doc % 3:
                seq[-1] = 0
            builder.add_item(torch.from_numpy(seq))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    ds = IndexedDataset(prefix)
    seqs = [np.asarray(ds[i], dtype=np.int64) for i in range(len(ds))]
    np.concatenate(seqs).astype("<i8").tofile(prefix + ".expected")
    print(f"{os.path.basename(prefix)}: {len(ds)} sequences, {len(ds.document_indices) - 1} documents, "
          f"{sum(len(s) for s in seqs)} tokens, dtype {ds.index.dtype.__name__}")


out = sys.argv[1]
write(os.path.join(out, "u16"), np.uint16, 65000, 1)
write(os.path.join(out, "i32"), np.int32, 200000, 2)
