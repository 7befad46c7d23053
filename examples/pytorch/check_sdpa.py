#!/usr/bin/env python3
"""torch.nn.functional.scaled_dot_product_attention with each backend forced, judged by ulpgate.

Backends MATH, FLASH_ATTENTION, EFFICIENT_ATTENTION and CUDNN_ATTENTION (one at a time, through
torch.nn.attention.sdpa_kernel), FP16 and BF16, causal and not, with and without padding (the
case's attention.kv_lengths, given to torch as a boolean attn_mask), seq_kv = 128 .. 16384,
seq_q 16, head_dim 64, B = 2, H = 2, on normal(0,1) inputs and on logits with an attention
sink (sink(logit=16,key=0,std=1) on Q and K). ulpgate's masks are bottom-right aligned
(key j visible to query i iff j <= i + seq_kv - seq_q, FlashAttention-2's convention):
torch's is_causal=True is top-left, so a causal case with seq_q != seq_kv goes to torch as
that boolean mask, and to flash (which takes no mask) through its own op
aten._scaled_dot_product_flash_attention(is_causal=True), which is bottom-right (what
torch.nn.attention.bias.causal_lower_right dispatches to). Padding on flash: 'not supported'.
A backend that refuses a case, or raises, is that case's record, not the end of the run.

    python3 examples/pytorch/check_sdpa.py --out /tmp/sdpa                 # the H200: about 3 min
    python3 examples/pytorch/check_sdpa.py --out /tmp/s --backend numpy --quick   # no torch

Writes OUT/sdpa.json and OUT/sdpa.md: per backend the max error (|o - x| / sum_j p_j |v_j|)
against seq_kv, the fitted growth exponent (least squares of log error on log seq_kv) and the
failures. Exit 0 when every case that ran passed, 1 otherwise, 2 bad usage.
"""
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ulpgate_cli as uc  # noqa: E402

BACKENDS = ["MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"]
DISTS = {"normal": {},  # Q, K, V normal(0,1)
         "sink": {"Q": "sink(logit=16,key=0,std=1)", "K": "sink(logit=16,key=0,std=1)"},
         "logits3": {"Q": "logits(std=3)", "K": "logits(std=3)"}}
SEQ_KV_FULL = [128, 512, 2048, 8192, 16384]
SEQ_KV_QUICK = [64, 128]


def kv_lengths(batch, seq_kv):
    """Padding: batch 0 full, the others ragged (not a multiple of any tile), never empty."""
    return [seq_kv] + [max(1, seq_kv - (b * seq_kv) // (2 * batch) - 3) for b in range(1, batch)]


class TorchSdpa:
    name = "torch"

    def __init__(self):
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if not torch.cuda.is_available():
            raise uc.UlpgateError("torch sees no CUDA device (use --backend numpy to try the loop)", 2)
        self.torch, self.F, self.SDPBackend, self.sdpa_kernel = torch, F, SDPBackend, sdpa_kernel
        self.dev = torch.device("cuda")

    def environment(self):
        t = self.torch
        env = {"torch": t.__version__, "cuda": t.version.cuda, "gpu": t.cuda.get_device_name()}
        for key, get in (("cudnn", lambda: t.backends.cudnn.version()),
                         ("math_sdp_fp16_bf16_reduction", lambda: t.backends.cuda.fp16_bf16_reduction_math_sdp_allowed())):
            try:
                env[key] = get()
            except (AttributeError, RuntimeError):
                pass
        return env

    def to_device(self, words, fmt):
        return uc.torch_to_device(self.torch, self.dev, words, fmt)

    def from_device(self, t, fmt):
        return uc.torch_from_device(self.torch, t, fmt)

    def run(self, backend, q, k, v, fmt, case):
        """O (batch, heads, seq_q, head_dim) words, and how torch was called."""
        t, F = self.torch, self.F
        a = case["attention"]
        Q, K, V = (self.to_device(x, fmt) for x in (q, k, v))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with self.sdpa_kernel([getattr(self.SDPBackend, backend)]):
                    if backend == "FLASH_ATTENTION" and uc.needs_mask(case):
                        if a["kv_lengths"]:
                            raise uc.NotSupported("flash attention takes no attn_mask (the kv_lengths padding)")
                        call = "aten._scaled_dot_product_flash_attention(is_causal=True) (bottom-right)"
                        o = t.ops.aten._scaled_dot_product_flash_attention(Q, K, V, 0.0, is_causal=True,
                                                                           return_debug_mask=False)[0]
                    elif uc.needs_mask(case):
                        call = "sdpa(attn_mask=bool (B,1,Sq,Skv))"
                        mask = t.from_numpy(np.ascontiguousarray(uc.visible_mask(case))).to(self.dev)
                        o = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
                    else:
                        call = f"sdpa(is_causal={a['causal']})"
                        o = F.scaled_dot_product_attention(Q, K, V, is_causal=a["causal"])
                    t.cuda.synchronize()
            except RuntimeError as e:
                text = str(e).splitlines()[0] if str(e) else type(e).__name__
                if "No available kernel" not in text:
                    raise
                why = list(dict.fromkeys(str(w.message).splitlines()[0] for w in caught))  # torch's reasons
                raise uc.NotSupported("; ".join([text] + why[:3])) from None
        return self.from_device(o, fmt), call


class NumpySdpa:
    """Stands in for torch where there is none: every backend is softmax(Q K^T / sqrt(D) + mask) V
    in float64, rounded once to O's type; FLASH refuses padding masks as torch's does. With
    round_p, the backends but MATH round P = exp(s - max) to the input type before P V (the
    row sum keeps the unrounded P), as FlashAttention-2 and cuDNN do."""

    name = "numpy"

    def __init__(self, round_p=False):
        self.round_p = round_p

    def environment(self):
        what = "NumPy float64 attention rounded to the output type (stand-in for every SDPA backend)"
        if self.round_p:
            what += "; P rounded to the input type before P V in every backend but MATH"
        return {"kernel": what}

    def run(self, backend, q, k, v, fmt, case):
        a = case["attention"]
        if backend == "FLASH_ATTENTION" and a["kv_lengths"]:
            raise uc.NotSupported("flash attention takes no attn_mask (the kv_lengths padding)")
        q, k, v = (uc.decode(x, fmt).astype(np.float64) for x in (q, k, v))
        s = np.matmul(q, k.transpose(0, 1, 3, 2)) / np.sqrt(a["head_dim"])
        s = np.where(uc.visible_mask(case), s, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        pv = uc.decode(uc.encode(p, fmt), fmt).astype(np.float64) if self.round_p and backend != "MATH" else p
        o = np.matmul(pv, v) / p.sum(axis=-1, keepdims=True)
        return uc.encode(o, fmt), "numpy float64" + (", P rounded" if pv is not p else "")


def main():
    ap = uc.common_args(__doc__)
    ap.add_argument("--backend", choices=["torch", "numpy"], default="torch")
    ap.add_argument("--sdpa", choices=BACKENDS, nargs="+", default=BACKENDS, help="SDPA backends (default all)")
    ap.add_argument("--seq-kv", type=int, nargs="+", help=f"seq_kv values (default {SEQ_KV_FULL}; --quick {SEQ_KV_QUICK})")
    ap.add_argument("--seq-q", type=int, help="queries (default 16; --quick 8)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, help="heads (default 2; --quick 1)")
    ap.add_argument("--dtype", choices=["fp16", "bf16"], nargs="+", default=["fp16", "bf16"])
    ap.add_argument("--dist", choices=sorted(DISTS), nargs="+", default=["normal", "sink"])
    ap.add_argument("--p-bits", choices=["auto", "24"], default="auto",
                    help="P's precision declared to `ulpgate check`: auto (default) the input type's for every "
                         "backend but MATH (FlashAttention-2, memory-efficient and cuDNN round P before P V), "
                         "24: P in FP32 declared for all (the tighter rule)")
    ap.add_argument("--numpy-round-p", action="store_true",
                    help="numpy backend: every backend but MATH rounds P to the input type before P V, "
                         "as FlashAttention-2 does (docs/concepts/precision.md says how ulpgate judges that)")
    args = ap.parse_args()
    seqs = args.seq_kv or (SEQ_KV_QUICK if args.quick else SEQ_KV_FULL)
    args.seq_q = args.seq_q or (8 if args.quick else 16)
    args.heads = args.heads or (1 if args.quick else 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    u = uc.Ulpgate(uc.find_ulpgate(args.ulpgate), out / "work")
    kernel = TorchSdpa() if args.backend == "torch" else NumpySdpa(args.numpy_round_p)
    shape = dict(batch=args.batch, heads=args.heads, seq_q=args.seq_q, head_dim=args.head_dim)
    env = uc.environment(u, {"backend": kernel.name, "seed": args.seed, "shape": shape, "seq_kv": seqs,
                             **kernel.environment()})
    print(f"check_sdpa: {env['ulpgate_version']}, backend {kernel.name}, seed {args.seed}, {shape}, seq_kv {seqs}", flush=True)
    records = []
    pool = uc.CheckPool(args.jobs)
    start = time.perf_counter()
    for dist in args.dist:
        for dtype in args.dtype:
            for causal in (False, True):
                for padded in (False, True):
                    for skv in seqs:
                        lengths = kv_lengths(args.batch, skv) if padded else []
                        case = uc.attention_case(args.batch, args.heads, args.seq_q, skv, args.head_dim, dtype,
                                                 causal=causal, kv_lengths=lengths, dist=DISTS[dist], seed=args.seed)
                        group = f"{dtype}-{'causal' if causal else 'full'}-{'pad' if padded else 'nopad'}-{dist}-kv{skv}"
                        case_path = u.write_case(case, group)
                        t0 = time.perf_counter()
                        exported = u.export(case_path, u.work / group)
                        export_s = time.perf_counter() - t0
                        q, k, v = (exported.logical(x) for x in "QKV")
                        calls = []
                        for backend in args.sdpa:
                            rec = {"sdpa": backend, "dtype": dtype, "causal": causal, "padded": padded, "dist": dist,
                                   "seq_kv": skv, "kv_lengths": lengths, **shape, "expect": "pass",
                                   "export_seconds": round(export_s, 3),
                                   "label": f"{backend} {dtype} {'causal' if causal else 'full'} "
                                            f"{'padded' if padded else 'unpadded'} {dist} seq_kv={skv}"}
                            records.append(rec)
                            t0 = time.perf_counter()
                            try:
                                o, call = kernel.run(backend, q, k, v, dtype, case)
                            except uc.NotSupported as e:
                                rec.update(outcome="not supported", message=str(e))
                                continue
                            except Exception as e:  # any failure of the kernel is this case's record
                                rec.update(outcome="error", message=f"{type(e).__name__}: {e}".splitlines()[0])
                                continue
                            rec.update(call=call, kernel_seconds=round(time.perf_counter() - t0, 4))
                            o_path = u.work / f"{group}-{backend}-O.npy"
                            np.save(o_path, uc.output_buffer(o, exported.output_info("O")))
                            p_bits = 24 if args.p_bits == "24" or backend == "MATH" else (11 if dtype == "fp16" else 8)
                            rec["p_bits"] = p_bits
                            calls.append((rec, lambda op=o_path, t=f"{group}-{backend}", pb=p_bits:
                                          u.check(case_path, {"O": op}, u.work / f"{t}.run.json", pb)))
                        pool.run_all(calls)
                        if not args.keep_files:
                            for f in list((u.work / group).glob("*.npy")) + list(u.work.glob(f"{group}-*-O.npy")):
                                f.unlink()
                        done = [uc.judge(r) for r in records if r["seq_kv"] == skv and r["dtype"] == dtype and
                                r["causal"] == causal and r["padded"] == padded and r["dist"] == dist]
                        print(f"  {group}: " + ", ".join(f"{r['sdpa']} {r['outcome']}" for r in done), flush=True)
    pool.close()
    seconds = time.perf_counter() - start
    line, rc = uc.write_report(out, "sdpa", "scaled_dot_product_attention per backend (ulpgate check)",
                               dict(env, seconds=round(seconds, 1)), records, report_sections(records, seqs, args.sdpa))
    print(f"{line} ({seconds:.1f} s); {out / 'sdpa.md'}")
    return rc


def report_sections(records, seqs, backends):
    sections = []
    series_keys = []
    for r in records:
        key = (r["dtype"], r["causal"], r["padded"], r["dist"])
        if key not in series_keys:
            series_keys.append(key)
    overview = []
    for backend in backends:
        rs = [r for r in records if r["sdpa"] == backend]
        count = lambda o: sum(r.get("outcome") == o for r in rs)  # noqa: E731
        judged = [r for r in rs if r.get("outcome") in ("pass", "fail")]
        exact = sum(r.get("exact_matches") or 0 for r in judged)
        compared = sum(r.get("compared") or 0 for r in judged)
        overview.append([backend, len(rs), count("pass"), count("fail"), count("not supported"), count("error"),
                         uc.g(max((r.get("max_normalised") or 0 for r in judged), default=None)),
                         max((r.get("max_ulp_distance") or 0 for r in judged), default="-"),
                         f"{100.0 * exact / compared:.1f}%" if compared else "-"])
    sections.append(("Overview", uc.md_table(
        ["backend", "cases", "pass", "fail", "not supported", "error", "max err/sum p|v|",
         "max ULP dist from correct rounding", "correctly rounded"], overview) +
        "\nThe error includes O's own rounding (a correctly rounded BF16 output is up to 2^-8 |o| off), so "
        "on these ranges it is mostly the output format's; the ULP distance from the correctly rounded "
        "value and the share of correctly rounded elements separate the kernels. Every backend but MATH is "
        "checked with `ulpgate check --p-bits` (P rounded to the input type before P V, as FlashAttention-2, "
        "the memory-efficient kernel and cuDNN do; `--p-bits 24` judges them with P in FP32, which a BF16 P "
        "can exceed at short seq_kv: `--backend numpy --numpy-round-p --p-bits 24` shows it).\n"))
    for backend in backends:
        rows = []
        for key in series_keys:
            dtype, causal, padded, dist = key
            pts = {r["seq_kv"]: r for r in records if r["sdpa"] == backend and (r["dtype"], r["causal"], r["padded"], r["dist"]) == key}
            judged = [(s, pts[s]["max_normalised"]) for s in seqs if s in pts and pts[s].get("outcome") in ("pass", "fail")]
            p, se = uc.growth_exponent([s for s, _ in judged], [e for _, e in judged])
            pm, _ = uc.growth_exponent([s for s, _ in judged],
                                       [pts[s].get("mean_normalised") for s, _ in judged])
            exp = "-" if p is None else (f"{p:+.2f}" + (f" ± {se:.2f}" if se is not None else ""))
            rows.append([dtype, "causal" if causal else "full", "padded" if padded else "-", dist] +
                        [uc.result_cell(pts.get(s)) for s in seqs] + [exp, "-" if pm is None else f"{pm:+.2f}"])
        sections.append((f"{backend}: max |o - x| / sum p|v| against seq_kv", uc.md_table(
            ["dtype", "mask", "padding", "dist"] + [f"{s}" for s in seqs] + ["growth (max)", "growth (mean)"], rows)))
    bad = [r for r in records if r.get("outcome") in ("fail", "error")]
    sections.append(("Failures", uc.md_table(["case", "outcome", "why"], [
        [r["label"], r["outcome"], "; ".join(r.get("reasons", [])) or r.get("message", "")] for r in bad]) if bad else "None.\n"))
    ns = {}
    for r in records:
        if r.get("outcome") == "not supported":
            ns.setdefault((r["sdpa"], r["message"]), []).append(r)
    sections.append(("Not supported", uc.md_table(["backend", "cases", "reason"], [
        [b, len(v), m] for (b, m), v in ns.items()]) if ns else "None.\n"))
    return sections


if __name__ == "__main__":
    uc.main_guard(main)
