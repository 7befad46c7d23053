#!/usr/bin/env python3
"""The usual way to test a GEMM, for comparison with ulpgate (docs/dev/benchmarks.md).

Random shapes M, N, K in [1, MAX] (default 256), bf16 inputs from randn, C = A @ B on the
GPU (cuBLAS through PyTorch), reference A.double() @ B.double() on the GPU rounded to bf16,
torch.testing.assert_close with bf16's default tolerances (rtol 1.6e-2, atol 1e-5). Every
failure of assert_close on this correct cuBLAS is a false alarm. Prints cases/s and the
false-alarm count as one JSON line.

    python3 examples/pytorch/pytorch_loop.py --seconds 10 [--max 256] [--seed 1]
"""
import argparse
import json
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--max", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(args.seed)
    for _ in range(20):  # warm-up: cuBLAS handles and kernels loaded
        a = torch.randn(64, 64, device=dev, dtype=torch.bfloat16)
        (a @ a).float().sum().item()
    cases = alarms = 0
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        m, n, k = (int(x) for x in torch.randint(1, args.max + 1, (3,), generator=gen))
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        c = a @ b
        ref = (a.double() @ b.double()).to(torch.bfloat16)
        try:
            torch.testing.assert_close(c, ref)
        except AssertionError:
            alarms += 1
        cases += 1
    seconds = time.perf_counter() - start
    print(json.dumps({"mode": "pytorch loop", "cases": cases, "seconds": round(seconds, 3),
                      "cases_per_s": round(cases / seconds, 1), "false_alarms": alarms,
                      "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
