"""ulpgate from Python: cases, their exact inputs and references, the CLI's check of outputs
computed elsewhere, and fuzz campaigns over a Python callable (docs/guide/python.md).

Arrays hold exact bits, as `ulpgate export` writes them: FP64 float64, FP32 and TF32 float32,
FP16 float16, BF16 uint16 words, FP8 uint8 bytes (decode() gives their values). Bad input
raises ValueError with the one line the CLI prints.
"""
import inspect
import json
import os
import re

import numpy as np

from . import _ulpgate as _u

__version__ = _u.__version__
__all__ = ["Case", "Result", "FuzzResult", "read_case", "gemm_case", "attention_case", "attention_combine_case",
           "inputs", "reference", "check", "run", "fuzz", "encode", "decode", "read_record"]


class Case:
    """One reproducible case (core/case.hpp), held as the JSON ulpgate reads and writes."""

    def __init__(self, data):
        text = data if isinstance(data, str) else json.dumps(data)
        self._json = _u.normalise_case(text)
        self._dict = json.loads(self._json)

    @classmethod
    def from_json(cls, text):
        return cls(text)

    def to_json(self, indent=2):
        return json.dumps(self._dict, indent=indent, sort_keys=True)

    def to_dict(self):
        return json.loads(self._json)

    def write(self, path):
        """Writes the case file (atomically), for `ulpgate replay`, `export` or `check`."""
        _u.write_case(str(path), self._json)

    def replace(self, **fields):
        """A copy with top-level fields replaced (seed=, kernel=, dist=, ...)."""
        d = self.to_dict()
        d.update(fields)
        return Case(d)

    op = property(lambda self: self._dict["op"])
    seed = property(lambda self: self._dict["seed"])
    types = property(lambda self: dict(self._dict["types"]))
    scales = property(lambda self: dict(self._dict["scales"]))
    head_scales = property(lambda self: {k: list(v) for k, v in self._dict.get("head_scales", {}).items()})
    gemm = property(lambda self: dict(self._dict["gemm"]) if self.op == "gemm" else None)
    attention = property(lambda self: dict(self._dict["attention"]) if self.op != "gemm" else None)
    # attention_combine: partial states per query row, and the base of every LSE ("e" or "2").
    splits = property(lambda self: self._dict["attention"]["splits"] if self.op == "attention_combine" else None)
    lse_base = property(lambda self: self._dict["attention"]["lse_base"] if self.op == "attention_combine" else None)
    outputs = property(lambda self: _u.outputs_of(self._json))

    def __eq__(self, other):
        return isinstance(other, Case) and self._dict == other._dict

    def __repr__(self):
        t = self._dict["types"]
        if self.op == "gemm":
            g = self._dict["gemm"]
            shape = f"{g['batch']}x{g['m']}x{g['n']}x{g['k']}" if g["batch"] > 1 else f"{g['m']}x{g['n']}x{g['k']}"
            io = f"{t['A']}->{t['D']}"
        elif self.op == "attention_combine":
            a = self._dict["attention"]
            shape = f"b{a['batch']} h{a['heads']} q{a['seq_q']} d{a['head_dim']} splits{a['splits']} base {a['lse_base']}"
            io = f"{t['O_part']}->{t['O']}"
        else:
            a = self._dict["attention"]
            shape = f"b{a['batch']} h{a['heads']} q{a['seq_q']} kv{a['seq_kv']} d{a['head_dim']}"
            io = f"{t['Q']}->{t['O']}"
        return f"<ulpgate.Case {self.op} {shape} {io} compute {t['compute']} seed {self.seed}>"


def _case(case):
    if isinstance(case, Case):
        return case
    if isinstance(case, (str, dict)):
        return Case(case)
    raise TypeError(f"expected a ulpgate.Case, got {type(case).__name__}")


def read_case(path):
    """A case file (as fuzz saves failures and `ulpgate export` reads)."""
    return Case(_u.read_case(str(path)))


def _dists(dist, operands):
    if isinstance(dist, dict):
        return dict(dist)
    return {op: dist for op in operands}


def gemm_case(m, n, k, dtype="fp32", out=None, compute=None, batch=1, layout="row", trans_a=False, trans_b=False,
              lda=0, ldb=0, ldc=0, ldd=0, alpha=1.0, beta=0.0, epilogue="none", dist="normal(0,1)", seed=1,
              c_dtype=None, bias_dtype=None, scales=None, kernel=""):
    """D = alpha op(A) op(B) + beta C (core/case.hpp). dtype: A and B's format; out: D's
    (default fp32, fp64 for fp64 inputs); compute: the accumulation's (default fp32; fp64 for
    fp64). dist: one spec for every input or a dict per operand (docs/concepts/cases.md)."""
    b_dtype = dtype
    if compute is None:
        compute = "fp64" if dtype == "fp64" else "fp32"
    if out is None:
        out = "fp64" if dtype == "fp64" else "fp32"
    types = {"A": dtype, "B": b_dtype, "D": out, "compute": compute}
    operands = ["A", "B"]
    if beta != 0:
        types["C"] = c_dtype or out
        operands.append("C")
    if "bias" in epilogue:
        types["bias"] = bias_dtype or out
        operands.append("bias")
    return Case({"ulpgate_case": 1, "op": "gemm", "kernel": kernel, "alpha": float(alpha), "beta": float(beta),
                 "epilogue": epilogue, "scales": scales or {}, "seed": int(seed), "types": types,
                 "dist": _dists(dist, operands),
                 "gemm": {"m": m, "n": n, "k": k, "batch": batch, "layout": layout, "trans_a": trans_a,
                          "trans_b": trans_b, "lda": lda, "ldb": ldb, "ldc": ldc, "ldd": ldd}})


def attention_case(seq_q, seq_kv, head_dim=64, batch=1, heads=1, kv_heads=0, head_dim_v=0, dtype="fp16", out=None,
                   compute="fp32", layout="bhsd", causal=False, softmax_scale=None, kv_lengths=None,
                   dist="normal(0,1)", seed=1, kernel="", lse=False):
    """O = softmax(scale Q K^T + mask) V per batch and head (core/case.hpp). dtype: Q, K and
    V's format; out: O's (default dtype); softmax_scale None: 1/sqrt(head_dim); lse: the case
    asks for the log-sum-exp output LSE too (FP32, [batch][heads][seq_q])."""
    a = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "seq_q": seq_q, "seq_kv": seq_kv,
         "head_dim": head_dim, "head_dim_v": head_dim_v, "layout": layout, "causal": causal,
         "kv_lengths": list(kv_lengths or [])}
    if softmax_scale is not None:
        a["softmax_scale"] = float(softmax_scale)
    types = {"Q": dtype, "K": dtype, "V": dtype, "O": out or dtype, "compute": compute}
    if lse:
        types["LSE"] = "fp32"
    return Case({"ulpgate_case": 1, "op": "attention", "kernel": kernel, "alpha": 1.0, "beta": 0.0,
                 "epilogue": "none", "scales": {}, "seed": int(seed),
                 "types": types,
                 "dist": _dists(dist, ["Q", "K", "V"]), "attention": a})


def attention_combine_case(splits, head_dim=64, batch=1, heads=1, seq_q=1, dtype="fp32", out=None, layout="bhsd",
                           lse_base="e", lse=False, dist="normal(0,1)", lse_dist="lse(mean=4,std=4,empty=0.1)",
                           seed=1, kernel=""):
    """Split-KV decoding's merge of partial states (docs/concepts/split-kv.md): per query row,
    LSE = ln sum_s exp(LSE_s), O = sum_s exp(LSE_s - LSE) O_s (lse_base "2": log2 and 2^x, every
    LSE). dtype: O_part's format (fp32, fp16 or bf16); out: O's (default dtype); dist: O_part's
    distribution; lse_dist: LSE_part's (the lse family: -inf marks an empty split); lse: the
    case asks for the merged LSE too (FP32, [batch][heads][seq_q])."""
    types = {"O_part": dtype, "LSE_part": "fp32", "O": out or dtype, "compute": "fp32"}
    if lse:
        types["LSE"] = "fp32"
    return Case({"ulpgate_case": 1, "op": "attention_combine", "kernel": kernel, "alpha": 1.0, "beta": 0.0,
                 "epilogue": "none", "scales": {}, "seed": int(seed), "types": types,
                 "dist": {"O_part": dist, "LSE_part": lse_dist},
                 "attention": {"batch": batch, "heads": heads, "seq_q": seq_q, "head_dim": head_dim,
                               "splits": splits, "layout": layout, "lse_base": str(lse_base)}})


def _view(case_json, operand, buffer):
    """The logical view (read-only) of an operand's flat buffer."""
    shape, strides, _, _ = _u.logical_view(case_json, operand)
    v = np.lib.stride_tricks.as_strided(buffer, shape=shape, strides=[s * buffer.itemsize for s in strides],
                                        writeable=False)
    return v


def _fill(case):
    filled_json, buffers = _u.fill(case._json)
    return Case(filled_json), buffers


def inputs(case, flat=False):
    """The case's inputs, filled from its seed and distributions: a dict operand -> array of
    exact bits. Default: logical views, GEMM op(A) (batch, M, K), op(B) (batch, K, N), C
    (batch, M, N), bias (N,); attention (batch, heads, seq, dim), whatever the layout,
    transposes and leading dimensions; attention_combine O_part (splits, batch, heads, seq_q,
    head_dim) and LSE_part (splits, batch, heads, seq_q, 1). flat=True: the whole buffers (padding included, a NaN
    poison) exactly as `ulpgate export` writes them. FP8 amax scales and masked kv_lengths
    that filling draws are in filled_case(case)."""
    case = _case(case)
    filled, buffers = _fill(case)
    if flat:
        return buffers
    return {op: _view(filled._json, op, b) for op, b in buffers.items()}


def filled_case(case):
    """The case as its inputs were filled: FP8 amax scales and kv_lengths included (what
    `ulpgate export` writes into its manifest)."""
    return _fill(_case(case))[0]


def reference(case):
    """The exact outputs rounded to float64 (the op's reference, core of every check):
    {"D": (batch, M, N)} or {"O": (batch, heads, seq_q, head_dim_v)} (attention_combine:
    head_dim), and "LSE" (batch, heads, seq_q) where the case asks for it."""
    return _u.reference(_case(case)._json)


def encode(values, fmt):
    """Values (anything float64 holds) rounded to nearest even into format fmt's words: the
    array to hand ulpgate for that format (fp32 -> float32, bf16 -> uint16, ...)."""
    return _u.encode(np.asarray(values, dtype=np.float64), fmt)


def decode(words, fmt):
    """The exact values of format fmt's words: float32 (float64 for fp64)."""
    return _u.decode(np.asarray(words), fmt)


def _buffer(case, name, array, round_outputs=False):
    """An output given as a logical array (GEMM (batch, M, N), or (M, N) when batch is 1;
    attention (batch, heads, seq_q, dim)) or as its flat buffer (1-D, or any other shape with
    the buffer's element count, C order, as `ulpgate check --outputs` reads .npy files):
    the flat buffer of the output's format."""
    shape, strides, elements, dtype = _u.logical_view(case._json, name)
    fmt = case.types[name]
    a = np.asarray(array)
    if a.dtype != np.dtype(dtype):
        if round_outputs and a.dtype.kind == "f":
            a = encode(a, fmt)
        else:
            hint = "" if round_outputs else f" (ulpgate.encode(x, '{fmt}') rounds values to it)"
            raise ValueError(f"output {name}: dtype '{a.dtype.str}' is not {fmt}'s '{np.dtype(dtype).str}'{hint}")
    shape = tuple(shape)
    logical = a.shape == shape or (case.op == "gemm" and shape[0] == 1 and a.shape == shape[1:])
    if logical and a.ndim > 1:
        buf = np.zeros(elements, dtype=a.dtype)
        view = np.lib.stride_tricks.as_strided(buf, shape=shape, strides=[s * buf.itemsize for s in strides])
        view[...] = a.reshape(shape)
        return buf
    if a.size == elements:
        return np.ascontiguousarray(a).reshape(-1)
    raise ValueError(f"output {name}: shape {a.shape} is neither its logical shape {shape} nor a flat buffer of "
                     f"{elements} elements")


class Result:
    """One case's result: what `ulpgate check` and `replay` compute (record.hpp's CaseResult)."""

    def __init__(self, data):
        self._dict = json.loads(data) if isinstance(data, str) else data

    passed = property(lambda self: self._dict["verdict"]["passed"])
    reasons = property(lambda self: list(self._dict["verdict"]["reasons"]))
    checks = property(lambda self: list(self._dict["verdict"]["checks"]))
    signature = property(lambda self: self._dict.get("signature", ""))
    status = property(lambda self: self._dict["status"])
    kernel = property(lambda self: self._dict["kernel"])
    id = property(lambda self: self._dict["id"])
    notes = property(lambda self: dict(self._dict.get("notes", {})))
    reproducer = property(lambda self: self._dict.get("reproducer", ""))
    case = property(lambda self: Case(self._dict["case"]))

    @property
    def verdict(self):
        return dict(self._dict["verdict"])

    @property
    def metrics(self):
        """Per output name: elements, compared, exact_matches, max_abs, max_rel, normwise,
        max_normalised, mean_normalised, max_ulp, mean_ulp, bias_ulp, unexpected_nan,
        unexpected_inf, missed_nonfinite, overflowed, unwritten, worst, ..."""
        return {m["output"]: dict(m) for m in self._dict.get("metrics", [])}

    def to_dict(self):
        return json.loads(json.dumps(self._dict))

    def write_record(self, path, command=None):
        """Writes a run record of this one case (kind "check") that `ulpgate report` renders."""
        _u.write_record(str(path), [json.dumps(self._dict)], "check", command or self.reproducer)

    def __bool__(self):
        return self.passed

    def __repr__(self):
        parts = [f"{m['output']} max_normalised {m['max_normalised']:.4g} max_ulp {m['max_ulp']:.4g}"
                 for m in self._dict.get("metrics", [])]
        verdict = "PASS" if self.passed else "FAIL: " + "; ".join(self.reasons)
        return f"<ulpgate.Result {self.kernel} {verdict}{' (' + ', '.join(parts) + ')' if parts else ''}>"


def check(case, outputs, kernel_name="external:python", p_bits=0):
    """Judges outputs computed elsewhere as `ulpgate check --outputs` does (the same
    reference, metrics, tolerance and verdict; check/check.hpp check_given_outputs).
    outputs: {"D": array}, or {"O": array} and "LSE" where the case asks for it, each logical
    or flat (see _buffer) and of the output format's dtype (encode() rounds values to it).
    p_bits: attention whose kernel rounds P to that many bits before P V (11 FP16, 8 BF16:
    FlashAttention, cuDNN; 24: P in FP32, the tighter rule; 0: undeclared, P in the inputs'
    16-bit format admitted), as `ulpgate check --p-bits`."""
    case = _case(case)
    given = {name: _buffer(case, name, a) for name, a in dict(outputs).items()
             if name in case.types and name != "compute"}
    unknown = [n for n in outputs if n not in given]
    if unknown:
        raise ValueError(f"'{unknown[0]}' is not an output of this {case.op} case (its outputs: "
                         f"{', '.join(case.outputs)})")
    r = Result(_u.check(case._json, given, kernel_name, int(p_bits)))
    r._dict["reproducer"] = f"ulpgate.check(ulpgate.Case({case.to_json(indent=None)!r}), outputs)"
    return r


def _takes_case(kernel):
    try:
        params = [p for p in inspect.signature(kernel).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return len(params) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(kernel).parameters.values())
    except (TypeError, ValueError):
        return False


def _call(kernel, case, buffers, round_outputs):
    views = {op: _view(case._json, op, b) for op, b in buffers.items()}
    out = kernel(views, case) if _takes_case(kernel) else kernel(views)
    if not isinstance(out, dict):
        if len(case.outputs) == 1:
            out = {case.outputs[0]: out}
        else:
            raise TypeError("the kernel must return a dict output name -> array")
    return {name: _buffer(case, name, a, round_outputs) for name, a in out.items()}


def run(kernel, case, round_outputs=False, kernel_name=None):
    """Runs kernel (inputs dict -> outputs dict, or (inputs, case) -> ...) on the case's
    inputs (logical views, as inputs() gives them) and checks what it returns (check())."""
    case = _case(case)
    filled, buffers = _fill(case)
    outputs = _call(kernel, filled, buffers, round_outputs)
    return check(case, outputs, kernel_name or _kernel_name(kernel))


def _kernel_name(kernel):
    return "python:" + getattr(kernel, "__qualname__", getattr(kernel, "__name__", type(kernel).__name__))


def plain(case):
    """The cases a plain kernel computes (fuzz's default `supports`): GEMM D = op(A) op(B)
    (alpha 1, beta 0, no epilogue; FP8 cases may carry case.scales all the same: amax inputs);
    attention without causal masking, kv_lengths, grouped K/V heads or a softmax scale other
    than 1/sqrt(head_dim); every attention_combine case (it has no variants). None if
    supported, else why not."""
    if case.op == "attention_combine":
        return None
    if case.op == "gemm":
        if case._dict["alpha"] != 1 or case._dict["beta"] != 0 or case._dict["epilogue"] != "none":
            return "plain GEMM only (alpha 1, beta 0, no epilogue)"
        return None
    a = case._dict["attention"]
    if a["causal"] or a["kv_lengths"] or a.get("kv_heads", 0) not in (0, a["heads"]) \
            or a.get("softmax_scale") is not None:
        return "plain attention only (no causal mask, kv_lengths, grouped heads or softmax scale)"
    return None


def everything(case):
    """fuzz's `supports` for a kernel that reads the case: every generated case."""
    return None


class FuzzResult:
    """A fuzz campaign's record (record.hpp RunRecord, kind "fuzz")."""

    def __init__(self, record_json):
        self.record = json.loads(record_json)
        self._json = record_json
        self.results = [Result(c) for c in self.record["cases"]]
        self.failures = [r for r in self.results if not r.passed]

    cases = property(lambda self: self.results)
    checked = property(lambda self: [r for r in self.results if r.status != "not_supported"])

    @property
    def passed(self):
        """No failure, every planned case run, and at least one case checked (a campaign whose
        kernel took no case compared nothing, and does not pass)."""
        return not self.failures and not self.record.get("not_run") and (bool(self.checked) or not self.results)

    def summary(self):
        n, f, c = len(self.results), len(self.failures), len(self.checked)
        sigs = sorted({r.signature for r in self.failures})
        s = f"{n} cases: {c} checked, {f} failed" + (f", {n - c} not supported" if n != c else "")
        return s + (": " + ", ".join(sigs) if sigs else "")

    def write(self, path):
        """Writes the record (fuzz.json) for `ulpgate report` and `ulpgate gate`."""
        _u.write_record_json(str(path), self._json)

    def __bool__(self):
        return self.passed

    def __repr__(self):
        return f"<ulpgate.FuzzResult {self.summary()}>"


def fuzz(kernel, dtype="fp16", op="gemm", cases=20, seed=1, out=None, supports=plain, max_k=1024, sizes="small",
         time=0, metamorphic=True, gelu=False, deterministic=True, rounds_to_nearest=False, round_outputs=False,
         lse=False, variants=(), name=None, progress=None):
    """A fuzz campaign over a Python callable, with `ulpgate fuzz`'s generators, check path,
    metamorphic relations and shrinking (campaign/fuzz.hpp), in this process.

    kernel(inputs) or kernel(inputs, case) -> {"D": array} (or the array): inputs are logical
    read-only views (see inputs()); outputs logical or flat, of the output format's dtype
    (round_outputs=True: float arrays are rounded to nearest even into it). supports(case) ->
    None or why not: which generated cases the kernel takes (default plain(); everything()
    for a kernel that reads the case). Case i depends only on (seed, name, dtype, op, i) and
    the limits. out: writes fuzz.json, report.md, junit.xml, cases/ (failing cases) and
    corpus/ (shrunk failures, replayed first next time) there. lse=True: attention and
    attention_combine cases may ask for the log-sum-exp too (case.outputs has "LSE"; return
    {"O": ..., "LSE": ...}, FP32 [batch][heads][seq_q]). op="attention_combine" (dtype: O_part's
    format, fp32, fp16 or bf16): the kernel merges inputs["O_part"] and inputs["LSE_part"] as
    case.lse_base says. variants: the attention variants the kernel applies, any of "window",
    "softcap", "alibi", "sinks", "kv_scales" and "kv_head_scales" (docs/concepts/): cases draw
    them only where named, and the kernel reads them from the case (case.json["attention"];
    K/V scales of an FP8 cache in case.scales, one per K/V head in case.head_scales). Paged
    K/V is not offered: a callable gets logical views."""
    name = name or _kernel_name(kernel)
    out = "" if out is None else str(out)

    def call(case_json, buffers):
        return _call(kernel, Case(case_json), buffers, round_outputs)

    def why_not(case_json):
        return supports(Case(case_json))

    bits = {"window": 1, "softcap": 2, "alibi": 4, "sinks": 8, "kv_scales": 32, "kv_head_scales": 64}
    unknown = [v for v in variants if v not in bits]
    if unknown or isinstance(variants, str):
        raise ValueError(f"variants {variants!r}: a list of window, softcap, alibi, sinks, kv_scales and kv_head_scales")
    rec = _u.fuzz(call, why_not, name, dtype, op, int(cases), int(seed), int(max_k), sizes, float(time),
                  bool(metamorphic), bool(gelu), bool(deterministic), bool(rounds_to_nearest), bool(lse),
                  sum(bits[v] for v in set(variants)), out, progress)
    d = json.loads(rec)
    args = f"dtype={dtype!r}, op={op!r}, seed={seed}, max_k={max_k}, sizes={sizes!r}"
    d["command"] = f"ulpgate.fuzz({name}, {args}, cases={cases})"
    for c in d["cases"]:
        m = re.search(r" replay (\S+)$", c.get("reproducer", ""))
        n = re.search(r"--cases (\d+)", c.get("reproducer", ""))
        if m:
            c["reproducer"] = f"ulpgate.run({name}, ulpgate.read_case({m.group(1)!r}))"
        elif n:
            c["reproducer"] = f"ulpgate.fuzz({name}, {args}, cases={n.group(1)})  # its last case"
    rec = json.dumps(d)
    result = FuzzResult(rec)
    if out:
        os.makedirs(out, exist_ok=True)
        result.write(os.path.join(out, "fuzz.json"))
        for what, file in (("markdown", "report.md"), ("junit", "junit.xml")):
            with open(os.path.join(out, file), "w") as f:
                f.write(_u.render(rec, what))
    return result


def read_record(path):
    """A run record (fuzz.json, check's --out) as a dict."""
    return json.loads(_u.read_record(str(path)))
