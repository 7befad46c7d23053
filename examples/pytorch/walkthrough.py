#!/usr/bin/env python3
# The manual's walkthrough (docs/guide/pytorch.md): torch.matmul in BF16 judged by ulpgate (NumPy stands in without torch).
import json, subprocess, sys
import numpy as np
ulpgate = sys.argv[1] if len(sys.argv) > 1 else "build/ulpgate"
case = {"ulpgate_case": 1, "op": "gemm", "gemm": {"m": 256, "n": 256, "k": 4096}, "seed": 1,
        "types": {"A": "bf16", "B": "bf16", "D": "bf16", "compute": "fp32"},
        "dist": {"A": "activations()", "B": "weights()"}}
json.dump(case, open("case.json", "w"))
subprocess.run([ulpgate, "export", "case.json", "--dir", "inputs", "--force"], check=True)
a = np.load("inputs/A.npy").view(np.int16).reshape(256, 4096)  # BF16 words, exactly
b = np.load("inputs/B.npy").view(np.int16).reshape(4096, 256)
try:
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    A, B = (torch.from_numpy(x).to(dev).view(torch.bfloat16) for x in (a, b))
    d = (A @ B).view(torch.int16).cpu().numpy()                  # the kernel under test
except ImportError:  # NumPy's float32 matmul, rounded to BF16 (nearest even)
    f32 = lambda x: (x.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    w = (f32(a) @ f32(b)).view(np.uint32)
    d = ((w + 0x7fff + (w >> 16 & 1)) >> 16).astype(np.uint16)
np.save("D.npy", d.view(np.uint16))                             # D's BF16 words, 256 x 256
sys.exit(subprocess.run([ulpgate, "check", "case.json", "--outputs", "D=D.npy", "--out", "run.json"]).returncode)
