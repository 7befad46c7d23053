#!/usr/bin/env python3
"""torch.matmul under PyTorch's precision flags, judged by ulpgate against the exact product.

FP32 with TF32 off and on (torch.backends.cuda.matmul.allow_tf32), FP16 and BF16 with
allow_{fp16,bf16}_reduced_precision_reduction off and on (and FP16 with
allow_fp16_accumulation where this torch has it), K = 256 .. 65536, M = N = 256, on
normal(0,1) inputs and LLM-like ones (activations() x weights()). Output in the input type,
as torch.matmul returns. Each case: `ulpgate export` the inputs, run torch on the GPU, save
D, `ulpgate check` (through the CLI only; see ulpgate_cli.py).

A case declares the arithmetic it is judged against: TF32 on is declared `compute: tf32`
(as ulpgate's cublas.tf32: inputs rounded to 11 bits, FP32 accumulation) and is also judged
as plain FP32, which it is not: that row is the finding that TF32 is not FP32. The
reduced-precision settings are judged as FP32 accumulation, which is what PyTorch promises
with the flag off.

    python3 examples/pytorch/check_matmul.py --out /tmp/matmul            # the H200: about 1-2 min
    python3 examples/pytorch/check_matmul.py --out /tmp/m --backend numpy --quick   # no torch

Writes OUT/matmul.json (every record) and OUT/matmul.md (tables); exit 0 when every case
with an expectation met it (the flag-off settings and TF32 judged as TF32 must pass; the
flag-on settings judged as FP32 are measured, not required), 1 otherwise, 2 bad usage.
"""
import contextlib
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ulpgate_cli as uc  # noqa: E402

DISTS = {"normal": {"A": "normal(0,1)", "B": "normal(0,1)"},
         "llm": {"A": "activations()", "B": "weights()"}}
K_FULL = [256, 1024, 4096, 16384, 65536]
K_QUICK = [256, 1024]

# torch.backends.cuda.matmul attribute of each flag.
FLAG_ATTRS = {"tf32": "allow_tf32",
              "fp16_reduction": "allow_fp16_reduced_precision_reduction",
              "bf16_reduction": "allow_bf16_reduced_precision_reduction",
              "fp16_accumulation": "allow_fp16_accumulation"}


def settings(have_fp16_accumulation):
    """(input type, setting, flags, flag that the setting is about or None, [(judged compute, expect)])."""
    s = [("fp32", "tf32 off", {"tf32": False}, None, [("fp32", "pass")]),
         ("fp32", "tf32 on", {"tf32": True}, "tf32", [("tf32", "pass"), ("fp32", "any")]),
         ("fp16", "reduced-precision reduction off", {"fp16_reduction": False}, None, [("fp32", "pass")]),
         ("fp16", "reduced-precision reduction on", {"fp16_reduction": True}, "fp16_reduction", [("fp32", "any")]),
         ("bf16", "reduced-precision reduction off", {"bf16_reduction": False}, None, [("fp32", "pass")]),
         ("bf16", "reduced-precision reduction on", {"bf16_reduction": True}, "bf16_reduction", [("fp32", "any")])]
    if have_fp16_accumulation:
        s.append(("fp16", "fp16 accumulation on", {"fp16_accumulation": True, "fp16_reduction": True},
                  "fp16_accumulation", [("fp16", "any"), ("fp32", "any")]))
    return s


class TorchMatmul:
    """torch.matmul on the GPU, the flags set around each call and restored after."""

    name = "torch"

    def __init__(self):
        import torch
        self.torch = torch
        if not torch.cuda.is_available():
            raise uc.UlpgateError("torch sees no CUDA device (use --backend numpy to try the loop)", 2)
        self.dev = torch.device("cuda")
        self.flags_module = torch.backends.cuda.matmul
        self.dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

    def has_flag(self, flag):
        try:
            getattr(self.flags_module, FLAG_ATTRS[flag])
            return True
        except (AttributeError, RuntimeError):
            return False

    def environment(self):
        t = self.torch
        env = {"torch": t.__version__, "cuda": t.version.cuda, "gpu": t.cuda.get_device_name()}
        try:
            env["blas_preferred"] = str(t.backends.cuda.preferred_blas_library())
        except (AttributeError, RuntimeError):
            pass
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env["flag_defaults"] = {a: str(getattr(self.flags_module, a)) for f, a in FLAG_ATTRS.items() if self.has_flag(f)}
        return env

    @contextlib.contextmanager
    def flags(self, flags):
        saved = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # allow_tf32's deprecation notice
            try:
                for f, value in flags.items():
                    attr = FLAG_ATTRS[f]
                    saved[attr] = getattr(self.flags_module, attr)
                    setattr(self.flags_module, attr, value)
                yield
            finally:
                for attr, value in saved.items():
                    setattr(self.flags_module, attr, value)

    def to_device(self, words, fmt):
        return uc.torch_to_device(self.torch, self.dev, words, fmt)

    def from_device(self, t, fmt):
        return uc.torch_from_device(self.torch, t, fmt)

    def run(self, a_words, b_words, fmt, flags):
        """D = A B in the input type (torch.matmul's output type): D's words."""
        a, b = self.to_device(a_words, fmt), self.to_device(b_words, fmt)
        with self.flags(flags):
            d = self.torch.matmul(a, b)
            self.torch.cuda.synchronize()
        return self.from_device(d, fmt)


class NumpyMatmul:
    """Stands in for torch where there is none: the product in float64 (FP32 products are exact
    there; the sum's error is far below FP32's), rounded once to the output type. TF32 on rounds
    the inputs to TF32 first (what the flag means); the reduction flags change nothing here."""

    name = "numpy"

    def has_flag(self, flag):
        return flag != "fp16_accumulation"

    def environment(self):
        return {"kernel": "NumPy float64 matmul rounded to the output type (stand-in for torch.matmul)"}

    def run(self, a_words, b_words, fmt, flags):
        a, b = uc.decode(a_words, fmt), uc.decode(b_words, fmt)
        if flags.get("tf32"):
            a, b = uc.tf32_round(a), uc.tf32_round(b)
        return uc.encode(np.matmul(a.astype(np.float64), b.astype(np.float64)), fmt)


def main():
    ap = uc.common_args(__doc__)
    ap.add_argument("--backend", choices=["torch", "numpy"], default="torch")
    ap.add_argument("--k", type=int, nargs="+", help=f"K values (default {K_FULL}; --quick {K_QUICK})")
    ap.add_argument("--mn", type=int, help="M = N (default 256; --quick 64)")
    ap.add_argument("--dist", choices=sorted(DISTS), nargs="+", default=sorted(DISTS))
    args = ap.parse_args()
    ks = args.k or (K_QUICK if args.quick else K_FULL)
    mn = args.mn or (64 if args.quick else 256)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    u = uc.Ulpgate(uc.find_ulpgate(args.ulpgate), out / "work")
    kernel = TorchMatmul() if args.backend == "torch" else NumpyMatmul()
    env = uc.environment(u, {"backend": kernel.name, "seed": args.seed, "M=N": mn, "K": ks, **kernel.environment()})
    print(f"check_matmul: {env['ulpgate_version']}, backend {kernel.name}, seed {args.seed}, M = N = {mn}, K {ks}", flush=True)
    plan = settings(kernel.has_flag("fp16_accumulation"))
    records = []
    pool = uc.CheckPool(args.jobs)
    start = time.perf_counter()
    for dist in args.dist:
        for k in ks:
            for dtype in ("fp32", "fp16", "bf16"):
                group = f"{dtype}-k{k}-{dist}"
                exported = exported_case = None
                calls = []
                for in_type, setting, flags, about, judged in plan:
                    if in_type != dtype:
                        continue
                    base = {"dtype": dtype, "setting": setting, "flags": flags, "about": about, "k": k, "m": mn,
                            "n": mn, "dist": dist}
                    cases = []
                    for compute, expect in judged:
                        case = uc.gemm_case(mn, mn, k, dtype, dtype, compute, dist=DISTS[dist], seed=args.seed)
                        tag = f"{group}-{setting.replace(' ', '_')}-as_{compute}"
                        rec = dict(base, compute=compute, expect=expect, label=f"{dtype} {setting}, judged as {compute}, K={k}, {dist}")
                        cases.append((case, tag, rec))
                        records.append(rec)
                    try:
                        # One export per input group: cases differing only in the declared compute share inputs.
                        assert exported is None or uc.input_key(cases[0][0]) == uc.input_key(exported_case)
                        if exported is None:
                            t0 = time.perf_counter()
                            exported_case = cases[0][0]
                            exported = u.export(u.write_case(exported_case, f"{group}-inputs"), u.work / group)
                            export_s = time.perf_counter() - t0
                        t0 = time.perf_counter()
                        a, b = exported.logical("A")[0], exported.logical("B")[0]
                        d = kernel.run(a, b, dtype, flags)
                        kernel_s = time.perf_counter() - t0
                    except uc.UlpgateError:
                        raise
                    except Exception as e:  # the kernel's failure is this setting's record
                        for _, _, rec in cases:
                            rec.update(outcome="error", message=f"{type(e).__name__}: {e}".splitlines()[0])
                        continue
                    d_path = u.work / f"{group}-{setting.replace(' ', '_')}-D.npy"
                    np.save(d_path, uc.output_buffer(d[None], exported.output_info("D")))
                    for case, tag, rec in cases:
                        rec.update(export_seconds=round(export_s, 3), kernel_seconds=round(kernel_s, 4))
                        case_path = u.write_case(case, tag)
                        calls.append((rec, lambda cp=case_path, dp=d_path, t=tag: u.check(cp, {"D": dp}, u.work / f"{t}.run.json")))
                pool.run_all(calls)
                if not args.keep_files:
                    for f in (u.work / group).glob("*.npy"):
                        f.unlink()
                    for f in u.work.glob(f"{group}-*-D.npy"):
                        f.unlink()
                done = [uc.judge(r) for r in records if r["dtype"] == dtype and r["k"] == k and r["dist"] == dist]
                print(f"  {group}: " + ", ".join(f"{r['setting']} as {r['compute']} {r.get('outcome')}" for r in done), flush=True)
    pool.close()
    seconds = time.perf_counter() - start
    sections = report_sections(records)
    line, rc = uc.write_report(out, "matmul", "torch.matmul under PyTorch's precision flags (ulpgate check)",
                               dict(env, seconds=round(seconds, 1)), records, sections)
    print(f"{line} ({seconds:.1f} s); {out / 'matmul.md'}")
    return rc


def report_sections(records):
    rows = []
    for r in records:
        rows.append([r["dtype"], r["setting"], r["compute"], r["k"], r["dist"], r.get("outcome"),
                     uc.g(r.get("max_normalised")), uc.g(r.get("mean_normalised")), uc.g(r.get("max_ulp")),
                     uc.g(r.get("mean_ulp")), r.get("max_ulp_distance", "-"),
                     uc.g(r.get("notes", {}).get("precision_ratio")), r.get("notes", {}).get("misrounded", "-"),
                     r.get("signature") or r.get("message", "")])
    results = uc.md_table(["input", "setting", "judged as", "K", "dist", "verdict", "max err/sum|ab|",
                           "mean err/sum|ab|", "max ULP", "mean ULP", "max ULP dist", "precision ratio", "misrounded",
                           "failed checks"], rows)
    # The flags' effect: the setting that turns a flag on against its off partner on the same inputs.
    first = {}
    for r in records:
        first.setdefault((r["dtype"], r["setting"], r["k"], r["dist"]), r)
    eff = []
    for (dtype, setting, k, dist), r in first.items():
        if not r.get("about"):
            continue
        off = next((o for (d2, s2, k2, di2), o in first.items() if d2 == dtype and k2 == k and di2 == dist and not o.get("about")), None)
        if not off:
            continue
        ratio = lambda key: (r[key] / off[key]) if r.get(key) is not None and off.get(key) else None  # noqa: E731
        eff.append([dtype, setting, k, dist, uc.g(r.get("max_normalised")), uc.g(off.get("max_normalised")),
                    uc.g(ratio("max_normalised")), uc.g(ratio("mean_normalised")), uc.g(ratio("mean_ulp"))])
    effects = uc.md_table(["input", "setting (vs off)", "K", "dist", "max err on", "max err off", "ratio max err",
                           "ratio mean err", "ratio mean ULP"], eff)
    declared = ("Each case declares the arithmetic it is judged against in `types.compute` (the run records "
                "carry ulpgate's default tolerance model, not the case's; docs/concepts/precision.md):\n\n" + uc.md_table(
                    ["declared compute", "judged as"],
                    [["fp32", "FP32 accumulation (24 bits) of the exact products"],
                     ["tf32", "inputs rounded to TF32 (11 bits) inside the kernel, then FP32 accumulation "
                              "(as ulpgate's cublas.tf32 and cublaslt.tf32 declare it)"],
                     ["fp16", "FP16 accumulation (11 bits)"]]) +
                "\n`precision ratio` is the precision rule's mean error over its allowance (> 1 fails, "
                "`D:precision`); `misrounded` the elements rounded to the wrong side of a boundary over the "
                "allowance (`D:misrounded`).\n")
    fails = [r for r in records if r.get("outcome") == "fail"]
    finding = ("\n".join(f"- {r['label']}: {'; '.join(r.get('reasons', []))}" for r in fails) + "\n") if fails else "None.\n"
    return [("Results", results), ("Effect of each flag (on / off, same inputs)", effects),
            ("Declared compute type and tolerance", declared), ("Failed checks (findings)", finding)]


if __name__ == "__main__":
    uc.main_guard(main)
