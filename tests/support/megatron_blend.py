#!/usr/bin/env python3
# megatron_blend.py: the reference side of tests/unit/engine/data_blend_test.cpp.
# megatron-core's own build_blending_indices (its compiled helpers) for the
# given weights and sample count; writes (source, index in source) per
# position as little-endian int64 pairs.
#
#   megatron_blend.py 0.5,0.3,0.2 N OUT
import sys
import warnings

warnings.filterwarnings("ignore")
import numpy as np
from megatron.core.datasets import helpers_cpp

weights = np.array([float(w) for w in sys.argv[1].split(",")], dtype=np.float64)
weights /= weights.sum()
n = int(sys.argv[2])
source = np.zeros(n, dtype=np.int16)
index = np.zeros(n, dtype=np.int64)
helpers_cpp.build_blending_indices(source, index, weights, len(weights), n, False)
np.stack([source.astype(np.int64), index], axis=1).astype("<i8").tofile(sys.argv[3])
print(f"build_blending_indices: {n} positions over weights {weights.tolist()}")
