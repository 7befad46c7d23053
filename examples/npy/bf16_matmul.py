#!/usr/bin/env python3
"""A BF16 GEMM computed with NumPy, for `ulpgate export` / `ulpgate check`.

    bf16_matmul.py INPUTS OUT.npy [--truncate]

Reads INPUTS/A.npy and INPUTS/B.npy as `ulpgate export` wrote them (BF16 words, shapes from
INPUTS/manifest.json), multiplies them with FP32 accumulation, rounds D to BF16 to nearest
even and saves D's words. --truncate plants a bug: D is truncated to BF16 instead.
Prints whether the result passes np.allclose against the exact product with the tolerances
torch.testing.assert_close uses for bfloat16 (rtol 1.6e-2, atol 1e-5).
"""
import json
import sys

import numpy as np


def bf16_values(words):
    return (words.astype(np.uint32) << 16).view(np.float32)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 2:
        sys.exit(__doc__)
    inputs, out = args
    manifest = json.load(open(f"{inputs}/manifest.json"))
    shape = {n: (v["rows"], v["cols"]) for n, v in manifest["inputs"].items()}
    a = bf16_values(np.load(f"{inputs}/A.npy")).reshape(shape["A"])
    b = bf16_values(np.load(f"{inputs}/B.npy")).reshape(shape["B"])
    d = a @ b                                            # float32 BLAS: FP32 accumulation
    w = d.view(np.uint32)
    if "--truncate" in sys.argv:
        words = (w >> 16).astype(np.uint16)              # the bug: toward zero
    else:
        words = ((w + 0x7FFF + (w >> 16 & 1)) >> 16).astype(np.uint16)  # nearest even
    np.save(out, words)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    ok = np.allclose(bf16_values(words), exact, rtol=1.6e-2, atol=1e-5)
    print(f"np.allclose(D, exact, rtol=1.6e-2, atol=1e-5): {ok}")


if __name__ == "__main__":
    main()
