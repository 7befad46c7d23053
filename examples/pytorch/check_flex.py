#!/usr/bin/env python3
"""torch.nn.attention.flex_attention with served variants, judged by ulpgate.

FlexAttention compiles a score_mod and a mask_mod into one Triton kernel. This runs it with
the variants serving kernels add (docs/concepts/): a sliding window (mask_mod, bottom-right
diagonal, FlashAttention's window_left with right 0), a soft cap (score_mod cap tanh(s / cap),
s the scaled score), ALiBi in FlashAttention's form (score_mod + slope_h * -|i + seq_kv - seq_q
- j|, the standard slopes of the head count), and all three at once; FP16 and BF16, on
normal(0,1) inputs (logits of std 16 where there is a cap, so that it bites: scores of std 1
stay within 0.1% of their capped values), each case checked by `ulpgate check` against the exact attention of the
same case file (window_left, softcap, alibi_slopes in case.attention), with P declared
rounded to the input type before P V (--p-bits), as FlexAttention's kernel does.

    python3 examples/pytorch/check_flex.py --out /tmp/flex                  # a GPU with torch >= 2.5
    python3 examples/pytorch/check_flex.py --out /tmp/f --backend numpy --quick   # no torch

Writes OUT/flex.json and OUT/flex.md: per variant and type the largest error
|o - x| / sum_j p_j |v_j|, the largest ULP distance from the correctly rounded output and the
failures. Exit 0 when every case that ran passed, 1 otherwise, 2 bad usage.
"""
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ulpgate_cli as uc  # noqa: E402

VARIANTS = ["window", "softcap", "alibi", "all"]
SEQ_KV_FULL = [128, 1024, 4096]
SEQ_KV_QUICK = [48, 96]
WINDOW = 63     # keys left of the diagonal (FlashAttention's window_left; HF sliding_window 64)
SOFTCAP = 30.0  # Gemma 2's attention cap


def standard_slopes(heads):
    """ALiBi's slopes for any head count (docs/concepts/alibi.md), as FP32 values."""
    n = 1 << (heads.bit_length() - 1)
    slopes = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    slopes += [2.0 ** (-4.0 * k / n) for k in range(1, 2 * (heads - n), 2)]
    return [float(np.float32(s)) for s in slopes]


def flex_case(variant, batch, heads, seq_q, seq_kv, head_dim, dtype, seed):
    capped = variant in ("softcap", "all")
    dist = {"Q": "logits(std=16)", "K": "logits(std=16)"} if capped else {}
    case = uc.attention_case(batch, heads, seq_q, seq_kv, head_dim, dtype, causal=variant in ("window", "all"),
                             dist=dist, seed=seed)
    a = case["attention"]
    if variant in ("window", "all"):
        a["window_left"], a["window_right"] = WINDOW, 0
    if variant in ("softcap", "all"):
        a["softcap"] = SOFTCAP
    if variant in ("alibi", "all"):
        a["alibi_form"], a["alibi_slopes"] = "flash", standard_slopes(heads)
    return case


def variant_parts(case):
    """(window_left or None, cap or 0, slopes or None, seq_kv - seq_q) of a case."""
    a = case["attention"]
    left = a.get("window_left", -1)
    return (left if left >= 0 else None), a.get("softcap", 0.0), a.get("alibi_slopes"), a["seq_kv"] - a["seq_q"]


class TorchFlex:
    name = "torch"

    def __init__(self, eager=False):
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        if not torch.cuda.is_available():
            raise uc.UlpgateError("torch sees no CUDA device (use --backend numpy to try the loop)", 2)
        self.torch, self.create_block_mask = torch, create_block_mask
        # Every case brings new score_mod and mask_mod closures (their captures are tensors,
        # so one compiled kernel per variant and shape serves); room for all of them.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        self.flex = flex_attention if eager else torch.compile(flex_attention)
        self.eager = eager
        self.dev = torch.device("cuda")

    def environment(self):
        t = self.torch
        return {"torch": t.__version__, "cuda": t.version.cuda, "gpu": t.cuda.get_device_name(),
                "flex_attention": "eager (unfused)" if self.eager else "torch.compile (Triton)"}

    def run(self, q, k, v, fmt, case):
        t = self.torch
        a = case["attention"]
        left, cap, slopes, off = variant_parts(case)
        Q, K, V = (uc.torch_to_device(t, self.dev, x, fmt) for x in (q, k, v))
        slope_t = t.tensor(slopes, dtype=t.float32, device=self.dev) if slopes else None
        off_t = t.tensor(off, dtype=t.int32, device=self.dev)  # the bottom-right diagonal's offset

        def score_mod(score, b, h, q_idx, kv_idx):
            if cap:
                score = cap * t.tanh(score / cap)
            if slope_t is not None:
                score = score - slope_t[h] * (q_idx + off_t - kv_idx).abs()
            return score

        block_mask = None
        if left is not None:
            def mask_mod(b, h, q_idx, kv_idx):
                return (kv_idx <= q_idx + off_t) & (q_idx + off_t - kv_idx <= left)
            block_mask = self.create_block_mask(mask_mod, None, None, a["seq_q"], a["seq_kv"], device=self.dev)
        o = self.flex(Q, K, V, score_mod=score_mod if (cap or slopes) else None, block_mask=block_mask)
        t.cuda.synchronize()
        call = "flex_attention(" + ", ".join(
            (["score_mod=" + "+".join((["softcap"] if cap else []) + (["alibi"] if slopes else []))] if cap or slopes else []) +
            ([f"block_mask=window({left})"] if left is not None else [])) + ")"
        return uc.torch_from_device(t, o, fmt), call


class NumpyFlex:
    """Stands in for torch where there is none: the same score_mod and mask in float64, P
    rounded to the input type before P V (the row sum keeps the unrounded P), O rounded once;
    with planted_no_cap, the soft cap accepted but never applied (sgl-kernel-xpu PR #491,
    docs/concepts/softcap.md)."""

    name = "numpy"

    def __init__(self, planted_no_cap=False):
        self.planted = planted_no_cap

    def environment(self):
        what = "NumPy float64 flex_attention stand-in, P rounded to the input type before P V"
        return {"kernel": what + ("; planted: soft cap never applied" if self.planted else "")}

    def run(self, q, k, v, fmt, case):
        a = case["attention"]
        left, cap, slopes, off = variant_parts(case)
        q, k, v = (uc.decode(x, fmt).astype(np.float64) for x in (q, k, v))
        s = np.matmul(q, k.transpose(0, 1, 3, 2)) / np.sqrt(a["head_dim"])
        i = np.arange(a["seq_q"])[:, None]
        j = np.arange(a["seq_kv"])[None, :]
        vis = np.ones((a["seq_q"], a["seq_kv"]), bool)
        if a["causal"]:
            vis &= j <= i + off
        if left is not None:
            vis &= i + off - j <= left
        if cap and not self.planted:
            s = cap * np.tanh(s / cap)
        if slopes:
            s = s - np.array(slopes)[None, :, None, None] * np.abs(i + off - j)[None, None]
        s = np.where(vis[None, None], s, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        pv = uc.decode(uc.encode(p, fmt), fmt).astype(np.float64)
        o = np.matmul(pv, v) / p.sum(axis=-1, keepdims=True)
        return uc.encode(o, fmt), "numpy float64, P rounded" + (", no cap" if self.planted else "")


def main():
    ap = uc.common_args(__doc__)
    ap.add_argument("--backend", choices=["torch", "numpy"], default="torch")
    ap.add_argument("--eager", action="store_true", help="torch: flex_attention without torch.compile (unfused)")
    ap.add_argument("--variant", choices=VARIANTS, nargs="+", default=VARIANTS)
    ap.add_argument("--seq-kv", type=int, nargs="+", help=f"seq_kv values (default {SEQ_KV_FULL}; --quick {SEQ_KV_QUICK})")
    ap.add_argument("--seq-q", type=int, help="queries (default 128; --quick 32)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=12, help="heads (default 12: ALiBi's slopes off the powers of two)")
    ap.add_argument("--dtype", choices=["fp16", "bf16"], nargs="+", default=["fp16", "bf16"])
    ap.add_argument("--numpy-planted-no-cap", action="store_true",
                    help="numpy backend: never apply the soft cap (a planted bug: capped cases must fail)")
    args = ap.parse_args()
    seqs = args.seq_kv or (SEQ_KV_QUICK if args.quick else SEQ_KV_FULL)
    args.seq_q = args.seq_q or (32 if args.quick else 128)
    if any(s < args.seq_q for s in seqs):
        raise uc.UlpgateError(f"every seq_kv must be at least seq_q ({args.seq_q})", 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    u = uc.Ulpgate(uc.find_ulpgate(args.ulpgate), out / "work")
    kernel = TorchFlex(args.eager) if args.backend == "torch" else NumpyFlex(args.numpy_planted_no_cap)
    shape = dict(batch=args.batch, heads=args.heads, seq_q=args.seq_q, head_dim=args.head_dim)
    env = uc.environment(u, {"backend": kernel.name, "seed": args.seed, "shape": shape, "seq_kv": seqs,
                             "window_left": WINDOW, "softcap": SOFTCAP, **kernel.environment()})
    print(f"check_flex: {env['ulpgate_version']}, backend {kernel.name}, seed {args.seed}, {shape}, seq_kv {seqs}",
          flush=True)
    records = []
    pool = uc.CheckPool(args.jobs)
    start = time.perf_counter()
    for variant in args.variant:
        for dtype in args.dtype:
            calls = []
            for skv in seqs:
                case = flex_case(variant, args.batch, args.heads, args.seq_q, skv, args.head_dim, dtype, args.seed)
                group = f"{variant}-{dtype}-kv{skv}"
                case_path = u.write_case(case, group)
                exported = u.export(case_path, u.work / group)
                q, k, v = (exported.logical(x) for x in "QKV")
                # The planted bug changes only the cases with a cap.
                planted = args.backend == "numpy" and args.numpy_planted_no_cap and variant in ("softcap", "all")
                rec = {"variant": variant, "dtype": dtype, "seq_kv": skv, **shape, "expect": "fail" if planted else "pass",
                       "label": f"{variant} {dtype} seq_kv={skv}"}
                records.append(rec)
                t0 = time.perf_counter()
                try:
                    o, call = kernel.run(q, k, v, dtype, case)
                except Exception as e:  # any failure of the kernel is this case's record
                    rec.update(outcome="error", message=f"{type(e).__name__}: {e}".splitlines()[0])
                    continue
                rec.update(call=call, kernel_seconds=round(time.perf_counter() - t0, 4))
                o_path = u.work / f"{group}-O.npy"
                np.save(o_path, uc.output_buffer(o, exported.output_info("O")))
                p_bits = 11 if dtype == "fp16" else 8
                rec["p_bits"] = p_bits
                calls.append((rec, lambda cp=case_path, op=o_path, g=group, pb=p_bits:
                              u.check(cp, {"O": op}, u.work / f"{g}.run.json", pb)))
            pool.run_all(calls)
            if not args.keep_files:
                for f in u.work.glob(f"{variant}-{dtype}-*"):
                    if f.is_dir():
                        for x in f.glob("*.npy"):
                            x.unlink()
                    elif f.suffix == ".npy":
                        f.unlink()
            done = [uc.judge(r) for r in records if r["variant"] == variant and r["dtype"] == dtype]
            print(f"  {variant} {dtype}: " + ", ".join(f"kv{r['seq_kv']} {r['outcome']}" for r in done), flush=True)
    pool.close()
    seconds = time.perf_counter() - start
    line, rc = uc.write_report(out, "flex", "flex_attention with served variants (ulpgate check)",
                               dict(env, seconds=round(seconds, 1)), records, report_sections(records, seqs))
    print(f"{line} ({seconds:.1f} s); {out / 'flex.md'}")
    return rc


def report_sections(records, seqs):
    rows = []
    for variant in dict.fromkeys(r["variant"] for r in records):
        for dtype in dict.fromkeys(r["dtype"] for r in records if r["variant"] == variant):
            rs = {r["seq_kv"]: r for r in records if r["variant"] == variant and r["dtype"] == dtype}
            judged = [r for r in rs.values() if r.get("outcome") in ("pass", "fail")]
            rows.append([variant, dtype] + [uc.result_cell(rs.get(s)) for s in seqs] +
                        [max((r.get("max_ulp_distance") or 0 for r in judged), default="-")])
    table = uc.md_table(["variant", "dtype"] + [f"kv {s}" for s in seqs] + ["max ULP dist"], rows)
    return [("Largest error |o - x| / sum_j p_j |v_j| per seq_kv", table +
             f"\nwindow: window_left {WINDOW} with causal masking (bottom-right); softcap: cap {SOFTCAP}; alibi: "
             "FlashAttention's form with the standard slopes; all: the three at once. P declared rounded to "
             "the input type before P V (--p-bits 11 for FP16, 8 for BF16).\n")]


if __name__ == "__main__":
    sys.exit(uc.main_guard(main))
