"""Shared code of the PyTorch and Triton checks: ulpgate through its command line only.

The loop (docs/guide/pytorch.md): write a case JSON, `ulpgate export` its inputs
as .npy (exact bits: BF16 as uint16 words, FP8 as uint8), run the kernel anywhere, save its
output .npy in the case's output format, `ulpgate check CASE --outputs O=FILE --out RUN.json`,
read the verdict and metrics from RUN.json. Needs only NumPy and the ulpgate binary (not the
compiled Python module).
"""
import argparse
import concurrent.futures
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
# Where `cmake -B build-gpu` (the H200's build) and `cmake -B build` put the binary.
DEFAULT_BINARIES = (REPO / "build-gpu" / "ulpgate", REPO / "build" / "ulpgate")


class UlpgateError(Exception):
    """ulpgate refused a case or a file (exit 2) or failed itself (exit 3)."""

    def __init__(self, message, rc):
        super().__init__(message)
        self.rc = rc


class NotSupported(Exception):
    """The kernel does not take this case (a record 'not supported', not a failure)."""


def find_ulpgate(given=None):
    """--ulpgate, else $ULPGATE, else build-gpu/ulpgate or build/ulpgate in this repo, else PATH."""
    candidates = [given] if given else [os.environ.get("ULPGATE")] if os.environ.get("ULPGATE") else []
    if not candidates:
        candidates = [str(p) for p in DEFAULT_BINARIES] + [shutil.which("ulpgate") or ""]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    tried = ", ".join(c for c in candidates if c) or "nothing"
    raise UlpgateError(f"no ulpgate binary (tried {tried}); build it or pass --ulpgate PATH", 2)


def common_args(description):
    """The flags every script takes."""
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ulpgate", help="the ulpgate binary (default: $ULPGATE, build-gpu/ulpgate, "
                    "build/ulpgate, then PATH)")
    ap.add_argument("--out", required=True, help="directory for the results (JSON, Markdown, cases)")
    ap.add_argument("--seed", type=int, default=1, help="seed of every case (default 1)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CI, a first try)")
    ap.add_argument("--jobs", type=int, default=max(1, min(4, (os.cpu_count() or 1) // 4)),
                    help="ulpgate checks run at once (default: cores / 4, 1 to 4)")
    ap.add_argument("--keep-files", action="store_true",
                    help="keep the exported inputs and the outputs (.npy) under OUT/work")
    return ap


# ---------------------------------------------------------------------------------------
# Number formats in NumPy: what `ulpgate export` writes and `ulpgate check` reads.

NPY_DTYPES = {"fp64": np.float64, "fp32": np.float32, "tf32": np.float32, "fp16": np.float16,
              "bf16": np.uint16, "e4m3": np.uint8, "e5m2": np.uint8}


def decode(words, fmt):
    """Exact values of a format's words: float32 (float64 for fp64)."""
    if fmt == "bf16":
        return (np.asarray(words, np.uint16).astype(np.uint32) << 16).view(np.float32)
    if fmt in ("fp64", "fp32", "tf32"):
        return np.asarray(words)
    if fmt == "fp16":
        return np.asarray(words, np.float16).astype(np.float32)
    raise ValueError(f"decode: format {fmt} not handled here")


def bf16_words(x):
    """float64 (or float32) values rounded once, to nearest even, to BF16 words."""
    x = np.asarray(x, np.float64)
    w = x.view(np.uint64)
    # Normal range: keep 8 significant bits of the double (52 - 7 = 45 bits dropped), then the
    # float32 conversion is exact (Inf where the rounded value is beyond BF16's range).
    lsb = (w >> np.uint64(45)) & np.uint64(1)
    kept = (w + np.uint64((1 << 44) - 1) + lsb) & ~np.uint64((1 << 45) - 1)
    with np.errstate(over="ignore", invalid="ignore"):
        normal = kept.view(np.float64).astype(np.float32).view(np.uint32) >> np.uint32(16)
        # Below 2^-126 BF16 is subnormal, a fixed grid of 2^-133: round on that grid.
        sub = (np.rint(x * 2.0**133) * 2.0**-133).astype(np.float32).view(np.uint32) >> np.uint32(16)
    words = np.where(np.abs(x) < 2.0**-126, sub, normal).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7fff), words)  # canonical NaN (as CUDA's)


def encode(x, fmt):
    """float64/float32 values rounded once, to nearest even, into a format's .npy dtype."""
    if fmt == "bf16":
        return bf16_words(x)
    if fmt in ("fp32", "fp16", "fp64"):
        with np.errstate(over="ignore"):
            return np.asarray(x).astype(NPY_DTYPES[fmt])  # NumPy rounds float64 -> float16 directly
    raise ValueError(f"encode: format {fmt} not handled here")


def tf32_round(x):
    """float32 values rounded to TF32 (10 fraction bits) to nearest, ties away, as cvt.rna.tf32.f32."""
    w = np.ascontiguousarray(x, np.float32).view(np.uint32)
    finite = (w & np.uint32(0x7f800000)) != np.uint32(0x7f800000)
    r = np.where(finite, (w + np.uint32(0x1000)) & np.uint32(0xffffe000), w)
    return r.astype(np.uint32).view(np.float32)


# ---------------------------------------------------------------------------------------
# Cases (core/case.cpp: case_from_json; the manifest of `ulpgate export` echoes them filled).

def gemm_case(m, n, k, a, d, compute="fp32", b=None, dist=None, seed=1, batch=1):
    """A packed row-major GEMM D = A B: A M x K, B K x N, D M x N."""
    return {"ulpgate_case": 1, "op": "gemm",
            "gemm": {"m": m, "n": n, "k": k, "batch": batch, "layout": "row",
                     "trans_a": False, "trans_b": False},
            "types": {"A": a, "B": b or a, "D": d, "compute": compute},
            "dist": dict(dist or {}), "seed": seed}


def attention_case(batch, heads, seq_q, seq_kv, head_dim, dtype, out=None, causal=False,
                   kv_lengths=None, dist=None, seed=1):
    """softmax(Q K^T / sqrt(head_dim) + mask) V in the bhsd layout, torch's (B, H, S, D).
    The mask: key j visible to query i of batch b iff j < kv_lengths[b] and, when causal,
    j <= i + seq_kv - seq_q (bottom-right aligned, as FlashAttention-2; core/case.hpp)."""
    return {"ulpgate_case": 1, "op": "attention",
            "attention": {"batch": batch, "heads": heads, "seq_q": seq_q, "seq_kv": seq_kv,
                          "head_dim": head_dim, "layout": "bhsd", "causal": causal,
                          "kv_lengths": list(kv_lengths or [])},
            "types": {"Q": dtype, "K": dtype, "V": dtype, "O": out or dtype, "compute": "fp32"},
            "dist": dict(dist or {}), "seed": seed}


def visible_mask(case):
    """The case's attention mask as a NumPy bool array (batch, 1, seq_q, seq_kv): True = attends."""
    a = case["attention"]
    sq, skv = a["seq_q"], a["seq_kv"]
    j = np.arange(skv)
    lengths = np.array(a["kv_lengths"] or [skv] * a["batch"])
    vis = np.broadcast_to(j[None, None, :] < lengths[:, None, None], (a["batch"], sq, skv))
    if a["causal"]:
        vis = vis & (j[None, :] <= np.arange(sq)[:, None] + (skv - sq))[None]
    return vis[:, None]


def needs_mask(case):
    a = case["attention"]
    return bool(a["kv_lengths"]) or (a["causal"] and a["seq_q"] != a["seq_kv"])


def input_key(case):
    """Cases that differ only in the declared compute type (or kernel) have the same inputs:
    values are a pure function of (seed, operand, coordinates) rounded to the operand's
    format (docs/concepts/cases.md)."""
    c = json.loads(json.dumps(case))
    c["types"].pop("compute", None)
    c.pop("kernel", None)
    return json.dumps(c, sort_keys=True)


# ---------------------------------------------------------------------------------------
# Logical views of the exported buffers (the manifest says where element [b][r][c] or
# [b][h][s][d] lives; these scripts write packed cases, but read what the manifest says).

def gemm_operand(words, info):
    """(batch, rows, cols) view of a GEMM buffer, as stored (A is K x M under trans_a)."""
    out = []
    for b in range(info["batch"]):
        base = b * info["batch_stride"]
        if info["layout"] == "row_major":
            out.append(words[base:base + info["rows"] * info["ld"]].reshape(info["rows"], info["ld"])[:, :info["cols"]])
        else:
            out.append(words[base:base + info["cols"] * info["ld"]].reshape(info["cols"], info["ld"])[:, :info["rows"]].T)
    return np.stack(out)


def attention_operand(words, info):
    """(batch, heads, seq, dim) view of an attention buffer (bhsd or bshd)."""
    b, h, s, d = info["batch"], info["heads"], info["seq"], info["dim"]
    if info["layout"] == "bhsd":
        return words.reshape(b, h, s, d)
    return words.reshape(b, s, h, d).transpose(0, 2, 1, 3)


def output_buffer(logical, info):
    """The flat output buffer `ulpgate check` reads, from a logical (batch, rows, cols) or
    (batch, heads, seq, dim) array of the output's npy dtype (packed layouts only)."""
    if "rows" in info:
        if info["layout"] != "row_major" or info["ld"] != info["cols"] or info["batch_stride"] != info["rows"] * info["cols"]:
            raise ValueError("output_buffer: only packed row-major GEMM outputs are written here")
        return np.ascontiguousarray(logical).reshape(-1)
    if info["layout"] == "bshd":
        logical = np.asarray(logical).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(logical).reshape(-1)


# ---------------------------------------------------------------------------------------
# The ulpgate binary.

class Exported:
    def __init__(self, directory, manifest):
        self.dir = Path(directory)
        self.manifest = manifest
        self.case = manifest["case"]  # as filled (FP8 scales, masked kv_lengths)

    def words(self, op):
        """An input's buffer as exported (flat, the npy dtype of its format)."""
        return np.load(self.dir / self.manifest["inputs"][op]["file"])

    def logical(self, op):
        info = self.manifest["inputs"][op]
        w = self.words(op)
        return gemm_operand(w, info) if "rows" in info else attention_operand(w, info)

    def values(self, op):
        """An input's exact values, logical shape, float32 (float64 for fp64)."""
        return decode(self.logical(op), self.manifest["inputs"][op]["format"])

    def output_info(self, op):
        return self.manifest["outputs"][op]


class Ulpgate:
    """Runs `ulpgate export` and `ulpgate check` on case files under WORK."""

    def __init__(self, binary, work):
        self.binary = binary
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)

    def _run(self, args, ok=(0,)):
        p = subprocess.run([self.binary] + [str(a) for a in args], capture_output=True, text=True)
        if p.returncode not in ok:
            lines = [l for l in p.stderr.splitlines() if l.strip()] or [f"exit {p.returncode}"]
            raise UlpgateError(f"ulpgate {args[0]}: {lines[-1]}", p.returncode)
        return p

    def version(self):
        return self._run(["--version"]).stdout.strip()

    def write_case(self, case, name):
        path = self.work / f"{name}.json"
        path.write_text(json.dumps(case, indent=1) + "\n")
        return path

    def export(self, case_path, directory):
        self._run(["export", case_path, "--dir", directory, "--force"])
        return Exported(directory, json.loads((Path(directory) / "manifest.json").read_text()))

    def check(self, case_path, outputs, run_path, p_bits=0):
        """`ulpgate check CASE --outputs O=FILE... [--p-bits N] --out RUN`: a summary of the
        record. p_bits: the attention kernel rounds P to that many bits before P V."""
        record = self.check_record(case_path, outputs, run_path, p_bits)
        return summarize_run(record, run_path, next(iter(outputs)))

    def check_record(self, case_path, outputs, run_path, p_bits=0, forward=None):
        """The same, the whole record. forward: attention backward, the forward outputs
        ({"O": FILE}, and LSE where known) the gradients were computed from."""
        args = ["check", case_path]
        for op, f in outputs.items():
            args += ["--outputs", f"{op}={f}"]
        for op, f in (forward or {}).items():
            args += ["--forward", f"{op}={f}"]
        if p_bits:
            args += ["--p-bits", str(p_bits)]
        self._run(args + ["--out", run_path], ok=(0, 1))
        return json.loads(Path(run_path).read_text())


def summarize_run(record, run_path=None, output=None):
    """The numbers these scripts report, from one `ulpgate check` run record (the metrics of
    `output`, by default the first output's)."""
    case = record["cases"][0]
    metrics = case.get("metrics") or [{}]
    m = next((x for x in metrics if x.get("output") == output), metrics[0])
    keys = ("compared", "exact_matches", "max_abs", "max_rel", "normwise", "max_normalised",
            "mean_normalised", "max_ulp", "mean_ulp", "bias_ulp", "max_ulp_distance",
            "unexpected_nan", "unexpected_inf", "missed_nonfinite", "unwritten")
    out = {"passed": bool(case["verdict"]["passed"]), "status": case.get("status"),
           "signature": case.get("signature", ""), "reasons": case["verdict"].get("reasons", []),
           "notes": case.get("notes", {}), "worst": m.get("worst"),
           "check_seconds": case.get("seconds")}
    out.update({k: m.get(k) for k in keys})
    if run_path:
        out["record"] = str(run_path)
    return out


class CheckPool:
    """ulpgate checks of one input group at once (`--jobs`); kernels run before, one at a time."""

    def __init__(self, jobs):
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs))

    def run_all(self, calls):
        """calls: [(record, fn)]; fn() -> dict merged into record. A check that cannot judge (bad
        output file, ulpgate's own error) is that record's error; the run goes on."""
        futures = [(rec, self.pool.submit(fn)) for rec, fn in calls]
        for rec, fut in futures:
            try:
                rec.update(fut.result())
            except Exception as e:
                rec.update(outcome="error", message=f"{type(e).__name__}: {e}".splitlines()[0])

    def close(self):
        self.pool.shutdown()


# ---------------------------------------------------------------------------------------
# Records, verdicts and reports.

def judge(rec):
    """outcome pass/fail from the check; `expect` (pass, fail, any) says whether it is as expected."""
    if "passed" in rec and "outcome" not in rec:
        rec["outcome"] = "pass" if rec["passed"] else "fail"
    expect = rec.get("expect", "pass")
    o = rec.get("outcome")
    if o in ("not supported", "skipped"):
        rec["as_expected"] = True
    elif o == "error":  # the kernel raised: never as expected
        rec["as_expected"] = False
    else:
        rec["as_expected"] = expect == "any" or expect == o
    return rec


def result_cell(r):
    """A record's table cell: its largest normalised error, marked where it failed; '-' for no record."""
    if r is None:
        return "-"
    o = r.get("outcome")
    if o == "pass":
        return g(r.get("max_normalised"))
    if o == "fail":
        return f"**FAIL** {g(r.get('max_normalised'))}"
    return "n/s" if o == "not supported" else "error"


def growth_exponent(xs, ys):
    """Least-squares slope p of log(y) = a + p log(x), with its standard error (None if < 2 points)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x and y and x > 0 and y > 0]
    if len(pts) < 2:
        return None, None
    n = len(pts)
    mx = sum(p[0] for p in pts) / n
    my = sum(p[1] for p in pts) / n
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    if sxx == 0:
        return None, None
    slope = sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
    if n < 3:
        return slope, None
    resid = sum((p[1] - my - slope * (p[0] - mx)) ** 2 for p in pts)
    return slope, math.sqrt(resid / (n - 2) / sxx)


def g(x, digits=3):
    """A number for a table: 3 significant digits, '-' for none."""
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def md_table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(lines) + "\n"


def environment(ulpgate=None, extra=None):
    env = {"host": platform.node(), "python": platform.python_version(), "numpy": np.__version__,
           "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])}
    if ulpgate:
        env["ulpgate"] = ulpgate.binary
        env["ulpgate_version"] = ulpgate.version()
    env.update(extra or {})
    return env


def verdict_line(records):
    """One line and an exit code: 0 when every record is as expected, 1 otherwise."""
    bad = [r for r in records if not r.get("as_expected", False)]
    judged = [r for r in records if r.get("outcome") in ("pass", "fail")]
    fails = sum(r["outcome"] == "fail" for r in judged)
    ns = sum(r.get("outcome") == "not supported" for r in records)
    errors = sum(r.get("outcome") == "error" for r in records)
    head = "PASS" if not bad else "FAIL"
    line = (f"{head}: {len(records)} records, {len(judged)} checked ({fails} failed ulpgate's check), "
            f"{ns} not supported, {errors} errors; {len(bad)} not as expected")
    return line, 0 if not bad else 1


def write_report(out, name, title, env, records, sections, extra=None):
    """OUT/NAME.json (every record) and OUT/NAME.md (the tables); returns (line, exit code)."""
    line, rc = verdict_line(records)
    doc = {"ulpgate_examples": 1, "script": name, "summary": line, "environment": env,
           "records": records}
    doc.update(extra or {})
    out = Path(out)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = [f"# {title}\n", f"**{line}**\n"]
    md.append(md_table(["", ""], [[k, f"`{v}`" if k == "command" else v] for k, v in env.items()]))
    for heading, text in sections:
        md.append(f"\n## {heading}\n\n{text}")
    bad = [r for r in records if not r.get("as_expected", False)]
    if bad:
        md.append("\n## Not as expected\n\n" + md_table(
            ["case", "expected", "outcome", "why"],
            [[r.get("label", ""), r.get("expect", "pass"), r.get("outcome"), "; ".join(r.get("reasons", [])) or r.get("message", "")] for r in bad]))
    (out / f"{name}.md").write_text("\n".join(md))
    return line, rc


def main_guard(fn):
    """Exit codes: 0 every record as expected, 1 not, 2 bad usage or input, 3 ulpgate's own error."""
    try:
        sys.exit(fn())
    except UlpgateError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2 if e.rc in (1, 2) else 3)


def torch_to_device(torch, dev, words, fmt):
    """Storage words (as exported) to a torch tensor on dev: BF16 words reinterpreted, bit for bit."""
    w = np.ascontiguousarray(words)
    if fmt == "bf16":
        return torch.from_numpy(w.view(np.int16)).to(dev).view(torch.bfloat16)
    return torch.from_numpy(w).to(dev)


def torch_from_device(torch, t, fmt):
    """A torch tensor back to storage words (BF16 as uint16 words)."""
    t = t.contiguous()
    if fmt == "bf16":
        return t.view(torch.int16).cpu().numpy().view(np.uint16)
    return t.cpu().numpy()
