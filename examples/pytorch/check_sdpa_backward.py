#!/usr/bin/env python3
"""The gradients of torch.nn.functional.scaled_dot_product_attention per backend, judged by ulpgate.

Each SDPA backend (MATH, FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION, one at a time
through torch.nn.attention.sdpa_kernel) runs the forward on an attention backward case's
Q, K, V with autograd, then backward with the case's dO; dQ, dK and dV are checked by
`ulpgate check --outputs dQ --outputs dK --outputs dV --forward O=...`: against the exact
gradients, with the backend's own forward output O given (autograd differentiates from it),
so the check allows exactly for how far that O is from the exact forward. FP16 and BF16,
causal (bottom-right) and not, with and without padding (kv_lengths as a boolean mask),
seq_kv including 192 (seq_kv % 128 == 64), seq_q 16, head_dim 64, B = 2, H = 2.

    python3 examples/pytorch/check_sdpa_backward.py --out /tmp/bwd            # a GPU with torch
    python3 examples/pytorch/check_sdpa_backward.py --out /tmp/b --backend numpy --quick   # no torch

Writes OUT/sdpa_backward.json and OUT/sdpa_backward.md: per backend and output the largest
error |g - x| / c (c the gradient's condition term), the largest ULP distance from the
correctly rounded gradient, and the failures. Exit 0 when every case that ran passed, 1
otherwise, 2 bad usage.
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
GRADS = ["dQ", "dK", "dV"]
SEQ_KV_FULL = [64, 192, 1024, 4096]
SEQ_KV_QUICK = [17, 64]


def backward_case(batch, heads, seq_q, seq_kv, head_dim, dtype, causal, kv_lengths, seed):
    case = uc.attention_case(batch, heads, seq_q, seq_kv, head_dim, dtype, causal=causal, kv_lengths=kv_lengths,
                             dist={"dO": "normal(0,1)"}, seed=seed)
    case["op"] = "attention_backward"
    case["types"].update({"LSE": "fp32", "dO": dtype, "dQ": dtype, "dK": dtype, "dV": dtype})
    return case


class TorchBackward:
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
        return {"torch": t.__version__, "cuda": t.version.cuda, "gpu": t.cuda.get_device_name(),
                "cudnn": t.backends.cudnn.version()}

    def run(self, backend, ins, fmt, case):
        """O and the gradients (logical words), and how torch was called."""
        t, F = self.torch, self.F
        Q, K, V, dO = (uc.torch_to_device(t, self.dev, ins[x], fmt) for x in ("Q", "K", "V", "dO"))
        for x in (Q, K, V):
            x.requires_grad_(True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with self.sdpa_kernel([getattr(self.SDPBackend, backend)]):
                    if uc.needs_mask(case):
                        if backend == "FLASH_ATTENTION":
                            raise uc.NotSupported("flash attention takes no attn_mask (padding or bottom-right causal)")
                        call = "sdpa(attn_mask=bool (B,1,Sq,Skv)).backward(dO)"
                        mask = t.from_numpy(np.ascontiguousarray(uc.visible_mask(case))).to(self.dev)
                        o = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
                    else:
                        call = f"sdpa(is_causal={case['attention']['causal']}).backward(dO)"
                        o = F.scaled_dot_product_attention(Q, K, V, is_causal=case["attention"]["causal"])
                    o.backward(dO)
                    t.cuda.synchronize()
            except RuntimeError as e:
                text = str(e).splitlines()[0] if str(e) else type(e).__name__
                if "No available kernel" not in text:
                    raise
                why = list(dict.fromkeys(str(w.message).splitlines()[0] for w in caught))
                raise uc.NotSupported("; ".join([text] + why[:3])) from None
        out = {"O": uc.torch_from_device(t, o.detach(), fmt)}
        out.update({g: uc.torch_from_device(t, x.grad, fmt) for g, x in zip(GRADS, (Q, K, V))})
        return out, call


class NumpyBackward:
    """Stands in for torch where there is none: every backend is the float64 forward and
    backward from the case's own Q, K, V, dO, rounded once to the output type."""

    name = "numpy"

    def environment(self):
        return {"kernel": "NumPy float64 attention forward and backward rounded to the output type (every backend)"}

    def run(self, backend, ins, fmt, case):
        q, k, v, do = (uc.decode(ins[x], fmt).astype(np.float64) for x in ("Q", "K", "V", "dO"))
        scale = 1.0 / np.sqrt(case["attention"]["head_dim"])
        vis = uc.visible_mask(case)
        s = np.where(vis, np.matmul(q, k.transpose(0, 1, 3, 2)) * scale, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.where(vis, np.exp(s - m), 0.0)
        l = e.sum(axis=-1, keepdims=True)
        p = np.divide(e, l, out=np.zeros_like(e), where=l > 0)
        o = np.matmul(p, v)
        dv = np.matmul(p.transpose(0, 1, 3, 2), do)
        dp = np.matmul(do, v.transpose(0, 1, 3, 2))
        ds = p * (dp - (do * o).sum(axis=-1, keepdims=True))
        dq = np.matmul(ds, k) * scale
        dk = np.matmul(ds.transpose(0, 1, 3, 2), q) * scale
        return {x: uc.encode(y, fmt) for x, y in zip(["O"] + GRADS, (o, dq, dk, dv))}, "numpy float64"


def main():
    ap = uc.common_args(__doc__)
    ap.add_argument("--backend", choices=["torch", "numpy"], default="torch")
    ap.add_argument("--sdpa", choices=BACKENDS, nargs="+", default=BACKENDS, help="SDPA backends (default all)")
    ap.add_argument("--seq-kv", type=int, nargs="+", help=f"seq_kv values (default {SEQ_KV_FULL}; --quick {SEQ_KV_QUICK})")
    ap.add_argument("--seq-q", type=int, help="queries (default 16; --quick 8)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp16", "bf16"], nargs="+", default=["fp16", "bf16"])
    args = ap.parse_args()
    seqs = args.seq_kv or (SEQ_KV_QUICK if args.quick else SEQ_KV_FULL)
    args.seq_q = args.seq_q or (8 if args.quick else 16)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    u = uc.Ulpgate(uc.find_ulpgate(args.ulpgate), out / "work")
    kernel = TorchBackward() if args.backend == "torch" else NumpyBackward()
    shape = dict(batch=args.batch, heads=args.heads, seq_q=args.seq_q, head_dim=args.head_dim)
    env = uc.environment(u, {"backend": kernel.name, "seed": args.seed, "shape": shape, "seq_kv": seqs,
                             **kernel.environment()})
    print(f"check_sdpa_backward: {env['ulpgate_version']}, backend {kernel.name}, seed {args.seed}, {shape}, "
          f"seq_kv {seqs}", flush=True)
    records = []
    pool = uc.CheckPool(args.jobs)
    start = time.perf_counter()
    for dtype in args.dtype:
        for causal in (False, True):
            for padded in (False, True):
                for skv in seqs:
                    lengths = ([skv] + [max(1, skv // 2 + 1)] * (args.batch - 1)) if padded else []
                    case = backward_case(args.batch, args.heads, args.seq_q, skv, args.head_dim, dtype, causal, lengths,
                                         args.seed)
                    group = f"bwd-{dtype}-{'causal' if causal else 'full'}-{'pad' if padded else 'nopad'}-kv{skv}"
                    case_path = u.write_case(case, group)
                    exported = u.export(case_path, u.work / group)
                    ins = {x: exported.logical(x) for x in ("Q", "K", "V", "dO")}
                    calls = []
                    for backend in args.sdpa:
                        rec = {"sdpa": backend, "dtype": dtype, "causal": causal, "padded": padded, "seq_kv": skv,
                               **shape, "expect": "pass",
                               "label": f"{backend} {dtype} {'causal' if causal else 'full'} "
                                        f"{'padded' if padded else 'unpadded'} seq_kv={skv}"}
                        records.append(rec)
                        try:
                            got, call = kernel.run(backend, ins, dtype, case)
                        except uc.NotSupported as e:
                            rec.update(outcome="not supported", message=str(e))
                            continue
                        except Exception as e:  # any failure of the kernel is this case's record
                            rec.update(outcome="error", message=f"{type(e).__name__}: {e}".splitlines()[0])
                            continue
                        rec["call"] = call
                        files = {}
                        for name, words in got.items():
                            info = exported.output_info(name) if name in GRADS else exported.manifest["inputs"]["O"]
                            files[name] = u.work / f"{group}-{backend}-{name}.npy"
                            np.save(files[name], uc.output_buffer(words, info))
                        calls.append((rec, lambda f=files, t=f"{group}-{backend}": check(u, case_path, f, u.work / f"{t}.run.json")))
                    pool.run_all(calls)
                    if not args.keep_files:
                        for f in list((u.work / group).glob("*.npy")) + list(u.work.glob(f"{group}-*.npy")):
                            f.unlink()
                    done = [uc.judge(r) for r in records if r["seq_kv"] == skv and r["dtype"] == dtype and
                            r["causal"] == causal and r["padded"] == padded]
                    print(f"  {group}: " + ", ".join(f"{r['sdpa']} {r['outcome']}" for r in done), flush=True)
    pool.close()
    seconds = time.perf_counter() - start
    line, rc = uc.write_report(out, "sdpa_backward", "scaled_dot_product_attention backward per backend (ulpgate check)",
                               dict(env, seconds=round(seconds, 1)), records, sections(records, args.sdpa))
    print(f"{line} ({seconds:.1f} s); {out / 'sdpa_backward.md'}")
    return rc


def check(u, case_path, files, run_path):
    """`ulpgate check` of the gradients with the backend's own O given: a summary per output."""
    record = u.check_record(case_path, {g: files[g] for g in GRADS}, run_path, forward={"O": files["O"]})
    res = uc.summarize_run(record, run_path, "dQ")
    for g in GRADS:
        m = uc.summarize_run(record, None, g)
        res[f"{g}_max_normalised"] = m["max_normalised"]
        res[f"{g}_max_ulp_distance"] = m["max_ulp_distance"]
    return res


def sections(records, backends):
    rows = []
    for backend in backends:
        rs = [r for r in records if r["sdpa"] == backend]
        judged = [r for r in rs if r.get("outcome") in ("pass", "fail")]
        count = lambda o: sum(r.get("outcome") == o for r in rs)  # noqa: E731
        row = [backend, len(rs), count("pass"), count("fail"), count("not supported"), count("error")]
        for g in GRADS:
            row.append(uc.g(max((r.get(f"{g}_max_normalised") or 0 for r in judged), default=None)))
            row.append(max((r.get(f"{g}_max_ulp_distance") or 0 for r in judged), default="-"))
        rows.append(row)
    head = ["backend", "cases", "pass", "fail", "not supported", "error"]
    for g in GRADS:
        head += [f"{g} max err/c", f"{g} max ULP dist"]
    return [("Overview", uc.md_table(head, rows) +
             "\nerr/c: the largest |g - x| / c over the output, c the gradient's condition term (dQ: |scale| "
             "sum_j P (|dP| + |D|) |k|; dV: sum_i P |dO|); ULP dist: the largest distance from the correctly "
             "rounded gradient. Each backend's own forward O is given to the check (`--forward O=`).\n")]


if __name__ == "__main__":
    uc.main_guard(main)
