#!/usr/bin/env python3
"""A Triton blocked matmul (the tutorial's kernel: tl.dot over K blocks, FP32 accumulator, grouped
tile order) on a small ulpgate campaign: 30 shapes with ragged tails (M, N, K not multiples of
any block), FP16 and BF16 in, the output in the input type, four input families, each shape run
with two fixed block configurations (no autotuning: the configuration checked is the one run).
Each case goes through `ulpgate export`, the kernel, `ulpgate check` (ulpgate_cli.py).

    python3 examples/pytorch/check_triton.py --out /tmp/triton             # the H200: under a minute
    python3 examples/pytorch/check_triton.py --out /tmp/t --backend numpy --quick   # no Triton

Without Triton (or torch) it prints one line, writes OUT/triton.json saying so and exits 0.
Otherwise OUT/triton.json and OUT/triton.md, exit 0 when every case passed, 1 otherwise.
"""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ulpgate_cli as uc  # noqa: E402

# BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages (the tutorial's Hopper configurations).
CONFIGS = {"128x256x64": (128, 256, 64, 8, 8, 3), "64x64x32": (64, 64, 32, 8, 4, 4)}
DISTS = {"normal": {"A": "normal(0,1)", "B": "normal(0,1)"},
         "llm": {"A": "activations()", "B": "weights()"},
         "outliers": {"A": "outliers(rate=0.001,scale=100)", "B": "normal(0,1)"},
         "exact": {"A": "exact()", "B": "exact()"}}  # small integers: a correct kernel is bit-exact


def make_triton_kernel():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        # Tiles in groups of GROUP_M rows so that neighbouring programs share A and B in L2.
        pid = tl.program_id(axis=0)
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        num_pid_in_group = GROUP_M * num_pid_n
        group_id = pid // num_pid_in_group
        first_pid_m = group_id * GROUP_M
        group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
        pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
        pid_n = (pid % num_pid_in_group) // group_size_m
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - kb * BLOCK_K  # the ragged last block reads zeros past K
            a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        c = acc.to(c_ptr.dtype.element_ty)
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, c, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))

    class TritonMatmul:
        name = "triton"

        def __init__(self):
            if not torch.cuda.is_available():
                raise RuntimeError("torch sees no CUDA device")
            self.dev = torch.device("cuda")
            self.dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}

        def environment(self):
            return {"triton": triton.__version__, "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}

        def to_device(self, words, fmt):
            w = np.ascontiguousarray(words)
            if fmt == "bf16":
                return torch.from_numpy(w.view(np.int16)).to(self.dev).view(torch.bfloat16)
            return torch.from_numpy(w).to(self.dev)

        def run(self, a_words, b_words, fmt, config):
            bm, bn, bk, gm, warps, stages = CONFIGS[config]
            a, b = self.to_device(a_words, fmt), self.to_device(b_words, fmt)
            m, k = a.shape
            n = b.shape[1]
            c = torch.empty((m, n), device=self.dev, dtype=self.dtypes[fmt])
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
            matmul_kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                c.stride(0), c.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm,
                                num_warps=warps, num_stages=stages)
            torch.cuda.synchronize()
            if fmt == "bf16":
                return c.view(torch.int16).cpu().numpy().view(np.uint16)
            return c.cpu().numpy()

    return TritonMatmul()


class NumpyBlockedMatmul:
    """Stands in for the Triton kernel: the same loop over K blocks with a float32 accumulator
    (each block's products summed by NumPy's float32 matmul), rounded once to the output type."""

    name = "numpy"

    def environment(self):
        return {"kernel": "NumPy float32 blocked matmul (stand-in for the Triton kernel)"}

    def run(self, a_words, b_words, fmt, config):
        bk = CONFIGS[config][2]
        a, b = uc.decode(a_words, fmt), uc.decode(b_words, fmt)
        acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
        for k0 in range(0, a.shape[1], bk):
            acc += np.matmul(a[:, k0:k0 + bk], b[k0:k0 + bk])
        return uc.encode(acc, fmt)


def campaign(count, seed):
    """Shapes with ragged tails: M, N log-uniform in [1, 1500], K in [1, 8192], all odd (so no
    multiple of any block) but for a few edges (1 and block + 1); dtypes and families cycled."""
    rng = np.random.default_rng(seed)
    edges = [(1, 1, 1), (65, 257, 33), (1, 300, 4097), (129, 1, 65)]
    dists = list(DISTS)
    cases = []
    for i in range(count):
        if i < len(edges):
            m, n, k = edges[i]
        else:
            m, n = (int(np.exp(rng.uniform(0, np.log(1500)))) | 1 for _ in range(2))
            k = int(np.exp(rng.uniform(0, np.log(8192)))) | 1
        cases.append({"m": m, "n": n, "k": k, "dtype": ("fp16", "bf16")[i % 2], "dist": dists[(i // 2) % len(dists)]})
    return cases


def not_available(out, why):
    line = f"triton not available: {why}"
    print(line)
    doc = {"ulpgate_examples": 1, "script": "triton", "summary": line, "records": [],
           "environment": {"command": " ".join(sys.argv)}}
    Path(out / "triton.json").write_text(json.dumps(doc, indent=1) + "\n")
    Path(out / "triton.md").write_text(f"# Triton matmul (ulpgate check)\n\n**{line}**\n")
    return 0


def main():
    ap = uc.common_args(__doc__)
    ap.add_argument("--backend", choices=["triton", "numpy"], default="triton")
    ap.add_argument("--cases", type=int, help="shapes (default 30; --quick 6)")
    ap.add_argument("--config", choices=sorted(CONFIGS), nargs="+", help="block configurations (default both; --quick 64x64x32)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    count = args.cases or (6 if args.quick else 30)
    configs = args.config or (["64x64x32"] if args.quick else list(CONFIGS))
    if args.backend == "triton":
        try:
            kernel = make_triton_kernel()
        except Exception as e:  # ImportError, no GPU, a Triton that does not compile here
            return not_available(out, f"{type(e).__name__}: {e}".splitlines()[0])
    else:
        kernel = NumpyBlockedMatmul()
    u = uc.Ulpgate(uc.find_ulpgate(args.ulpgate), out / "work")
    env = uc.environment(u, {"backend": kernel.name, "seed": args.seed, "configs": configs, **kernel.environment()})
    print(f"check_triton: {env['ulpgate_version']}, backend {kernel.name}, seed {args.seed}, {count} shapes x {configs}", flush=True)
    records = []
    pool = uc.CheckPool(args.jobs)
    start = time.perf_counter()
    for i, c in enumerate(campaign(count, args.seed)):
        case = uc.gemm_case(c["m"], c["n"], c["k"], c["dtype"], c["dtype"], "fp32", dist=DISTS[c["dist"]], seed=args.seed + i)
        group = f"case{i:02d}-{c['dtype']}-{c['m']}x{c['n']}x{c['k']}-{c['dist']}"
        case_path = u.write_case(case, group)
        exported = u.export(case_path, u.work / group)
        a, b = exported.logical("A")[0], exported.logical("B")[0]
        calls = []
        for config in configs:
            rec = dict(c, case=i, config=config, expect="pass", label=f"{group} {config}")
            records.append(rec)
            try:
                t0 = time.perf_counter()
                d = kernel.run(a, b, c["dtype"], config)
                rec["kernel_seconds"] = round(time.perf_counter() - t0, 4)
            except Exception as e:  # a compile or launch failure is this case's record
                rec.update(outcome="error", message=f"{type(e).__name__}: {e}".splitlines()[0])
                continue
            d_path = u.work / f"{group}-{config}-D.npy"
            np.save(d_path, uc.output_buffer(d[None], exported.output_info("D")))
            calls.append((rec, lambda dp=d_path, t=f"{group}-{config}": u.check(case_path, {"D": dp}, u.work / f"{t}.run.json")))
        pool.run_all(calls)
        if not args.keep_files:
            for f in list((u.work / group).glob("*.npy")) + list(u.work.glob(f"{group}-*-D.npy")):
                f.unlink()
        done = [uc.judge(r) for r in records if r["case"] == i]
        print(f"  {group}: " + ", ".join(f"{r['config']} {r['outcome']}" for r in done), flush=True)
    pool.close()
    seconds = time.perf_counter() - start
    rows = [[r["case"], r["dtype"], f"{r['m']}x{r['n']}x{r['k']}", r["dist"], r["config"], r.get("outcome"),
             uc.g(r.get("max_normalised")), uc.g(r.get("max_ulp")), uc.g(r.get("mean_ulp")),
             f"{r.get('exact_matches')}/{r.get('compared')}" if r.get("compared") is not None else "-",
             r.get("notes", {}).get("misrounded", "-"), r.get("signature") or r.get("message", "")] for r in records]
    results = uc.md_table(["#", "dtype", "MxNxK", "dist", "config", "verdict", "max err/sum|ab|", "max ULP",
                           "mean ULP", "correctly rounded", "misrounded", "failed checks"], rows)
    inexact = [r for r in records if r["dist"] == "exact" and r.get("compared") and r.get("exact_matches") != r.get("compared")]
    exact_note = ("Every `exact` case is bit-exact (its partial sums are exact, so any correct kernel is).\n"
                  if not inexact else "`exact` cases that are not bit-exact (a logic bug, not rounding): " +
                  ", ".join(r["label"] for r in inexact) + "\n")
    line, rc = uc.write_report(out, "triton", "Triton blocked matmul (ulpgate check)", dict(env, seconds=round(seconds, 1)),
                               records, [("Cases", results), ("Exact inputs", exact_note)])
    print(f"{line} ({seconds:.1f} s); {out / 'triton.md'}")
    return rc


if __name__ == "__main__":
    uc.main_guard(main)
