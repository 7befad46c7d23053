"""Known answers for the Python module: correct NumPy kernels pass, planted bugs fail, inputs
are the bits `ulpgate export` writes, errors are the CLI's one line, campaigns repeat."""
import json
import os
import subprocess

import numpy as np
import pytest

import ulpgate

CLI = os.environ.get("ULPGATE_CLI", "")
needs_cli = pytest.mark.skipif(not os.path.exists(CLI), reason="ULPGATE_CLI (the ulpgate binary) not set")


def values(x, fmt):
    """Exact float64 values of a format's words."""
    return ulpgate.decode(x, fmt).astype(np.float64)


def numpy_gemm(x, case, drop_last_k=False):
    """D = op(A) op(B) in float64, rounded once to D's format; FP8 scales applied."""
    t, s = case.types, case.scales
    a = values(x["A"], t["A"]) * s.get("A", 1.0)
    b = values(x["B"], t["B"]) * s.get("B", 1.0)
    if drop_last_k:
        a, b = a[..., :-1], b[..., :-1, :]
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and Inf inputs (specials)
        return {"D": ulpgate.encode((a @ b) * s.get("D", 1.0), t["D"])}


def test_case_round_trips_through_json_and_files(tmp_path):
    c = ulpgate.gemm_case(7, 5, 33, dtype="bf16", out="fp16", trans_a=True, lda=40, seed=3)
    assert ulpgate.Case.from_json(c.to_json()) == c
    c.write(tmp_path / "c.json")
    assert ulpgate.read_case(tmp_path / "c.json") == c
    assert c.types == {"A": "bf16", "B": "bf16", "D": "fp16", "compute": "fp32"}
    assert c.outputs == ["D"]
    assert c.replace(seed=4).seed == 4


def test_bad_input_raises_value_error_with_the_clis_message(tmp_path):
    with pytest.raises(ValueError, match=r"case.dist.A: dist \"normal\(0,\)\": empty argument 2"):
        ulpgate.inputs(ulpgate.gemm_case(4, 4, 4, dist="normal(0,)"))
    with pytest.raises(ValueError, match="lda"):
        ulpgate.gemm_case(4, 4, 4, lda=2)
    with pytest.raises(ValueError, match="dtype '<f8' is not fp32's '<f4'"):
        ulpgate.check(ulpgate.gemm_case(4, 4, 4), {"D": np.zeros((4, 4))})
    with pytest.raises(ValueError, match="neither its logical shape"):
        ulpgate.check(ulpgate.gemm_case(4, 4, 4), {"D": np.zeros((3, 4), np.float32)})
    with pytest.raises(ValueError, match="'O' is not an output"):
        ulpgate.check(ulpgate.gemm_case(4, 4, 4), {"O": np.zeros((4, 4), np.float32)})
    with pytest.raises(ValueError, match="dtype 'fp12'"):
        ulpgate.fuzz(lambda x: None, dtype="fp12")


@needs_cli
def test_a_bad_case_file_gives_the_clis_line(tmp_path):
    c = ulpgate.gemm_case(4, 4, 4).to_dict()
    c["gemm"]["lda"] = 2
    (tmp_path / "bad.json").write_text(json.dumps(c))
    cli = subprocess.run([CLI, "export", str(tmp_path / "bad.json"), "--dir", str(tmp_path / "x")],
                         capture_output=True, text=True)
    assert cli.returncode == 2
    with pytest.raises(ValueError) as e:
        ulpgate.read_case(tmp_path / "bad.json")
    assert cli.stderr.strip() == "ulpgate: error: " + str(e.value)


@needs_cli
@pytest.mark.parametrize("case", [
    ulpgate.gemm_case(9, 7, 21, dtype="bf16", layout="col", trans_b=True, ldb=30, beta=1.0, seed=11),
    ulpgate.gemm_case(5, 6, 19, dtype="e4m3", dist={"A": "amax(frac=1,base=normal(0,1))", "B": "normal(0,1)"}),
    ulpgate.attention_case(5, 9, head_dim=16, batch=2, heads=2, layout="bshd", dtype="fp16"),
])
def test_inputs_are_the_bits_export_writes(tmp_path, case):
    case.write(tmp_path / "c.json")
    subprocess.run([CLI, "export", str(tmp_path / "c.json"), "--dir", str(tmp_path / "e")], check=True,
                   capture_output=True)
    flat = ulpgate.inputs(case, flat=True)
    manifest = json.loads((tmp_path / "e" / "manifest.json").read_text())
    assert sorted(flat) == sorted(manifest["inputs"])
    for op, a in flat.items():
        npy = np.load(tmp_path / "e" / f"{op}.npy")
        assert npy.dtype == a.dtype and np.array_equal(npy.view(np.uint8), a.view(np.uint8)), op
    assert ulpgate.filled_case(case).to_dict() == manifest["case"]


def test_logical_views_index_the_buffer_as_the_manifest_says():
    c = ulpgate.gemm_case(3, 4, 5, layout="col", trans_a=True, lda=9, batch=2)
    flat, logical = ulpgate.inputs(c, flat=True)["A"], ulpgate.inputs(c)["A"]
    assert logical.shape == (2, 3, 5) and not logical.flags.writeable
    # A stored K x M column-major, ld 9: op(A)[b][i][k] = A[b][r=k][c=i] at b*M*ld + i*ld + k.
    for b, i, k in [(0, 0, 0), (1, 2, 4), (0, 1, 3)]:
        assert logical[b, i, k] == flat[b * 3 * 9 + i * 9 + k]


def test_reference_is_exact_where_float64_is():
    # Small integers: every partial sum is exact in float64, so the reference equals it.
    c = ulpgate.gemm_case(6, 5, 40, dtype="fp16", dist="exact(max=8,frac=0)", beta=1.0)
    x = ulpgate.inputs(c)
    d = values(x["A"], "fp16") @ values(x["B"], "fp16") + values(x["C"], "fp32")
    assert np.array_equal(ulpgate.reference(c)["D"], d)


def test_a_correct_gemm_passes_and_one_bad_element_fails(tmp_path):
    c = ulpgate.gemm_case(33, 17, 300, dtype="fp16", trans_b=True, ldd=20, seed=5)
    d = numpy_gemm(ulpgate.inputs(c), c)["D"]
    ok = ulpgate.check(c, {"D": d})
    assert ok.passed, ok.reasons
    m = ok.metrics["D"]
    assert m["elements"] == 33 * 17 and m["max_ulp"] <= 1 and m["unexpected_nan"] == 0
    bad = d.copy()
    bad[0, 7, 3] += 1e-2 * np.abs(d).max()
    r = ulpgate.check(c, {"D": bad})
    assert not r.passed
    assert "D:tolerance@interior" in r.checks
    assert any("exceed" in reason for reason in r.reasons), r.reasons
    assert r.metrics["D"]["worst"]["index"] == [0, 7, 3]
    r.write_record(tmp_path / "run.json")
    rec = ulpgate.read_record(tmp_path / "run.json")
    assert rec["kind"] == "check" and rec["cases"][0]["verdict"]["passed"] is False
    if os.path.exists(CLI):
        rep = subprocess.run([CLI, "report", str(tmp_path / "run.json"), "--md", str(tmp_path / "r.md")],
                             capture_output=True, text=True)
        assert rep.returncode == 0, rep.stderr
        assert "D:tolerance@interior" in (tmp_path / "r.md").read_text()


def test_bf16_outputs_go_through_encode():
    c = ulpgate.gemm_case(8, 8, 64, dtype="bf16", out="bf16")
    x = ulpgate.inputs(c)
    assert x["A"].dtype == np.uint16
    d = values(x["A"], "bf16") @ values(x["B"], "bf16")
    assert ulpgate.check(c, {"D": ulpgate.encode(d, "bf16")}).passed
    # Truncating to BF16 instead of rounding misrounds about half of the elements.
    trunc = (d.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    r = ulpgate.check(c, {"D": trunc})
    assert not r.passed and any("misrounded" in k for k in r.checks), r.checks


def test_numpy_float16_matmul_and_a_float16_accumulation():
    c = ulpgate.gemm_case(8, 8, 4096, dtype="fp16", out="fp16")
    x = ulpgate.inputs(c)
    a, b = np.ascontiguousarray(x["A"][0]), np.ascontiguousarray(x["B"][0])
    # NumPy's float16 matmul (no BLAS) sums in float32 and rounds once to float16: it passes.
    d16 = np.matmul(a, b)
    assert d16.dtype == np.float16
    r = ulpgate.check(c, {"D": d16})
    assert r.passed, r.reasons
    # Even as an FP32 output it passes at K = 4096: FP16's rounding (2^-12 |d|, 4050 FP32
    # ulps) is within what FP32 accumulation may lose on these inputs (|d| << sum |a b|).
    # The tolerance is relative to sum |a b|, not to the output's ulp. No element is ULP-fair
    # (each exact value is the remainder of a cancellation), so the ULP statistics cover none
    # of them and only the raw distance shows the 4050 ulps.
    r32 = ulpgate.check(c.replace(types={**c.types, "D": "fp32"}), {"D": d16.astype(np.float32)})
    m = r32.metrics["D"]
    assert r32.passed and m["max_ulp_distance"] > 1000 and m["ulp_fair"] == 0 and m["max_ulp"] == 0, r32
    # A float16 accumulator (every partial sum rounded to FP16) fails the FP32 compute case.
    acc = np.zeros((8, 8), np.float16)
    for k in range(4096):
        acc = (acc + a[:, k:k + 1] * b[k:k + 1, :]).astype(np.float16)
    r16 = ulpgate.check(c, {"D": acc})
    assert not r16.passed and "D:tolerance@interior" in r16.checks, r16


def numpy_attention(x, case):
    """softmax(Q K^T / sqrt(d)) V in float64, rounded once to O's format (plain cases)."""
    t = case.types
    q, k, v = (values(x[n], t[n]) for n in "QKV")
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    o = (p @ v) / p.sum(axis=-1, keepdims=True)
    out = {"O": ulpgate.encode(o, t["O"])}
    if "LSE" in case.outputs:  # the log-sum-exp, [batch][heads][seq_q]
        out["LSE"] = ulpgate.encode(s.max(axis=-1) + np.log(p.sum(axis=-1)), "fp32")
    return out


def test_attention_reference_and_check():
    c = ulpgate.attention_case(7, 33, head_dim=16, batch=2, heads=3, layout="bshd", dtype="bf16", out="fp32")
    o = numpy_attention(ulpgate.inputs(c), c)["O"]
    assert np.allclose(ulpgate.reference(c)["O"], o, rtol=1e-6, atol=1e-7)
    assert ulpgate.check(c, {"O": o}).passed
    assert ulpgate.run(numpy_attention, c).passed


def test_fuzz_passes_a_correct_kernel_and_repeats_from_its_seed(tmp_path):
    f = ulpgate.fuzz(numpy_gemm, dtype="bf16", cases=12, seed=7, max_k=256, out=tmp_path / "out")
    assert len(f.results) == 12 and not f.failures, f.summary()
    assert f.passed
    again = ulpgate.fuzz(numpy_gemm, dtype="bf16", cases=12, seed=7, max_k=256)
    assert [r.id for r in again.results] == [r.id for r in f.results]
    other = ulpgate.fuzz(numpy_gemm, dtype="bf16", cases=3, seed=8, max_k=256)
    assert [r.id for r in other.results] != [r.id for r in f.results[:3]]
    # Generated cases vary layouts, transposes, padding and output formats.
    shapes = {(r.case.gemm["layout"], r.case.gemm["trans_a"], r.case.types["D"]) for r in f.results}
    assert len(shapes) > 3
    for name in ("fuzz.json", "report.md", "junit.xml"):
        assert (tmp_path / "out" / name).exists()
    assert ulpgate.read_record(tmp_path / "out" / "fuzz.json")["campaign"]["seed"] == 7


def test_fuzz_finds_a_dropped_k_element(tmp_path):
    def dropped(x, case):
        return numpy_gemm(x, case, drop_last_k=True)
    f = ulpgate.fuzz(dropped, dtype="fp16", cases=6, seed=1, max_k=128, out=tmp_path / "out")
    assert len(f.failures) >= 5, f.summary()
    assert all("D:tolerance" in r.signature or r.status != "ok" for r in f.failures), f.summary()
    assert os.listdir(tmp_path / "out" / "cases")
    shrunk = [r for r in f.results if r._dict.get("origin") == "shrunk"]
    assert shrunk and "ulpgate.run(" in f.failures[0].reproducer
    # A shrunk case replays through run() and still fails.
    saved = sorted((tmp_path / "out" / "corpus").glob("*.json"))
    assert saved and not ulpgate.run(dropped, ulpgate.read_case(saved[0])).passed


def test_fuzz_records_what_the_kernel_raises():
    def broken(x):
        raise RuntimeError("no such luck")
    f = ulpgate.fuzz(broken, dtype="fp32", cases=2, seed=1, max_k=32, metamorphic=False)
    assert len(f.failures) >= 2
    assert "no such luck" in f.failures[0].reasons[0]


def test_fuzz_attention_plain_cases():
    f = ulpgate.fuzz(numpy_attention, op="attention", dtype="fp16", cases=4, seed=3, max_k=64)
    # Every case must be checked: plain() once refused every attention case (the case JSON
    # carries softmax_scale: null), and the campaign passed while comparing nothing.
    assert [r.status for r in f.results] == ["ok"] * 4 and not f.failures, f.summary()
    assert f.summary() == "4 cases: 4 checked, 0 failed", f.summary()


def test_a_campaign_that_checks_nothing_does_not_pass():
    f = ulpgate.fuzz(numpy_attention, op="attention", dtype="fp16", cases=3, seed=3, max_k=64,
                     supports=lambda case: "never")
    assert [r.status for r in f.results] == ["not_supported"] * 3
    assert not f.passed and not f, f.summary()
    assert f.summary() == "3 cases: 0 checked, 0 failed, 3 not supported", f.summary()


def test_attention_log_sum_exp():
    c = ulpgate.attention_case(5, 40, head_dim=16, batch=2, heads=2, dtype="fp16", out="fp16", lse=True)
    assert c.outputs == ["O", "LSE"]
    out = numpy_attention(ulpgate.inputs(c), c)
    assert np.allclose(ulpgate.reference(c)["LSE"], out["LSE"], rtol=1e-6)
    assert ulpgate.check(c, out).passed
    assert not ulpgate.check(c, dict(out, LSE=out["LSE"] + np.float32(0.01))).passed
    f = ulpgate.fuzz(numpy_attention, op="attention", dtype="fp16", cases=12, seed=5, max_k=64, lse=True)
    assert not f.failures and all(r.status == "ok" for r in f.results), f.summary()
    with_lse = [r for r in f.results if "LSE" in r.case.outputs]
    assert with_lse and all("LSE" in r.metrics and r.metrics["LSE"]["compared"] > 0 for r in with_lse), f.summary()
    # A kernel whose LSE is off by a constant fails on the LSE cases, and only there.
    def lse_off(inputs, case):
        out = numpy_attention(inputs, case)
        return dict(out, LSE=out["LSE"] + np.float32(0.05)) if "LSE" in out else out
    g = ulpgate.fuzz(lse_off, op="attention", dtype="fp16", cases=12, seed=5, max_k=64, lse=True, metamorphic=False)
    assert g.failures and all("LSE" in r.case.outputs for r in g.failures), g.summary()


def python_block(path, heading):
    """The first ```python block after `heading` in a Markdown file of this tree."""
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", path)).read()
    section = text[text.index(heading):]
    start = section.index("```python\n") + 10
    return section[start:section.index("```\n", start)]


def test_the_readme_walkthrough_runs_as_written(tmp_path, monkeypatch, capsys):
    # The README's example and the manual's (docs/guide/python.md) are one text, and it runs.
    code = python_block("README.md", "## Python module")
    assert code == python_block("docs/guide/python.md", "## A first check"), "README block != docs/guide/python.md block"
    monkeypatch.chdir(tmp_path)
    old = np.seterr()
    try:
        exec(compile(code, "README.md", "exec"), {})
    finally:
        np.seterr(**old)
    printed = capsys.readouterr().out.splitlines()
    said = [line.split("# ", 1)[1].split(";")[0] for line in code.splitlines() if line.startswith("print(")]
    assert printed == said
    assert (tmp_path / "check.json").exists() and (tmp_path / "pyfuzz" / "report.md").exists()


def numpy_attention_backward(x, case, with_d=True):
    """dQ, dK, dV of plain attention in float64 from Q, K, V, dO and the stored O, rounded once."""
    t = case.types
    q, k, v, do, o = (values(x[n], t[n]) for n in ("Q", "K", "V", "dO", "O"))
    scale = 1 / np.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * scale
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (do * o).sum(axis=-1, keepdims=True)) if with_d else p * dp
    return {"dQ": ulpgate.encode(ds @ k * scale, t["dQ"]),
            "dK": ulpgate.encode(np.swapaxes(ds, -1, -2) @ q * scale, t["dK"]),
            "dV": ulpgate.encode(np.swapaxes(p, -1, -2) @ do, t["dV"])}


def test_fuzz_attention_backward():
    f = ulpgate.fuzz(numpy_attention_backward, op="attention_backward", dtype="bf16", cases=6, seed=4, max_k=64)
    assert f.checked and not f.failures, f.summary()
    assert f.results[0].case.outputs == ["dQ", "dK", "dV"]
    g = ulpgate.fuzz(lambda x, c: numpy_attention_backward(x, c, with_d=False), op="attention_backward", dtype="bf16",
                     cases=6, seed=4, max_k=64, metamorphic=False)
    assert g.failures, g.summary()


def numpy_served_attention(x, case, ignore_sinks=False, ignore_scales=False):
    """numpy_attention with a soft cap, sinks and K/V scales, as the case gives them (docs/concepts/)."""
    t, a = case.types, case.attention
    q, k, v = (values(x[n], t[n]) for n in "QKV")
    if not ignore_scales:
        k, v = k * case.scales.get("K", 1.0), v * case.scales.get("V", 1.0)
        for name, heads in case.head_scales.items():  # one per K/V head (axis 1)
            per_head = np.array(heads)[None, :, None, None]
            k, v = (k * per_head, v) if name == "K" else (k, v * per_head)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if a.get("softcap", 0):
        s = a["softcap"] * np.tanh(s / a["softcap"])
    sink = np.full(q.shape[1], -np.inf)
    if a.get("sinks") and not ignore_sinks:
        sink = np.array([float(x) for x in a["sinks"]])
    sink = sink[None, :, None, None]
    m = np.maximum(s.max(axis=-1, keepdims=True), sink)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True) + np.exp(sink - m)
    out = {"O": ulpgate.encode((p @ v) / l, t["O"])}
    if "LSE" in case.outputs:
        out["LSE"] = ulpgate.encode((m + np.log(l))[..., 0], "fp32")
    return out


def test_fuzz_served_variants():
    # A kernel that applies soft caps and sinks, declared: cases draw them, and it passes; the
    # same kernel ignoring the sinks fails where a case has one.
    f = ulpgate.fuzz(numpy_served_attention, op="attention", dtype="fp16", cases=16, seed=2, max_k=64, lse=True,
                     variants=["softcap", "sinks"])
    assert f.checked and not f.failures, f.summary()
    drawn = [r for r in f.results if r.case.attention.get("softcap") or r.case.attention.get("sinks")]
    assert drawn, f.summary()
    g = ulpgate.fuzz(lambda x, c: numpy_served_attention(x, c, ignore_sinks=True), op="attention", dtype="fp16",
                     cases=16, seed=2, max_k=64, lse=True, variants=["softcap", "sinks"], metamorphic=False)
    assert g.failures and all(r.case.attention.get("sinks") for r in g.failures), g.summary()
    with pytest.raises(ValueError):
        ulpgate.fuzz(numpy_served_attention, op="attention", variants=["paged"])


def test_fuzz_kv_scales():
    # An FP8 K/V cache with scales, declared: cases draw E4M3/E5M2 K and V with scales, and the
    # kernel applying them passes; the same kernel leaving them at 1 fails those cases.
    f = ulpgate.fuzz(numpy_served_attention, op="attention", dtype="bf16", cases=12, seed=3, max_k=64,
                     variants=["kv_scales"])
    assert f.checked and not f.failures, f.summary()
    scaled = [r for r in f.results if r.case.scales]
    assert scaled, f.summary()
    g = ulpgate.fuzz(lambda x, c: numpy_served_attention(x, c, ignore_scales=True), op="attention", dtype="bf16",
                     cases=12, seed=3, max_k=64, variants=["kv_scales"], metamorphic=False)
    assert g.failures and all(r.case.scales for r in g.failures), g.summary()


def test_fuzz_kv_head_scales():
    # The same with a scale per K/V head declared too: some cases draw per-head scales, the
    # kernel applying them passes, and leaving them at 1 fails on those cases.
    f = ulpgate.fuzz(numpy_served_attention, op="attention", dtype="fp16", cases=16, seed=5, max_k=64,
                     variants=["kv_scales", "kv_head_scales"])
    assert f.checked and not f.failures, f.summary()
    assert [r for r in f.results if r.case.head_scales], f.summary()
    g = ulpgate.fuzz(lambda x, c: numpy_served_attention(x, c, ignore_scales=True), op="attention", dtype="fp16",
                     cases=16, seed=5, max_k=64, variants=["kv_head_scales"], metamorphic=False)
    assert g.failures and all(r.case.head_scales for r in g.failures), g.summary()


def numpy_combine(x, case, dtype=np.float64, max_shift=True, guard=True):
    """The split-KV merge (docs/concepts/split-kv.md) in dtype, rounded once to O's format: the
    largest non-empty LSE_s subtracted, weights exp(LSE_s - max) (exp2 in base 2), empty splits
    (LSE_s = -inf) never read, a row of them O = 0 and LSE = -inf. max_shift=False: exp(LSE_s)
    as it is; guard=False: empty splits taken into the max and the sums."""
    t = case.types
    o = values(x["O_part"], t["O_part"]).astype(dtype)  # (splits, batch, heads, seq_q, head_dim)
    lse = np.asarray(x["LSE_part"], dtype=dtype)          # (splits, batch, heads, seq_q, 1)
    exp, log = (np.exp2, np.log2) if case.lse_base == "2" else (np.exp, np.log)
    live = lse > -np.inf if guard else np.ones(lse.shape, bool)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.where(live, lse, -np.inf).max(axis=0) if max_shift else np.zeros(lse.shape[1:], dtype)
        if guard:
            m = np.where(m == -np.inf, 0, m)  # a row of empty splits
        w = np.where(live, exp(lse - m), 0)
        total = w.sum(axis=0)
        acc = (w * np.where(live, o, 0)).sum(axis=0)
        seen = total > 0 if guard else np.ones(total.shape, bool)
        out = {"O": ulpgate.encode(np.where(seen, acc / np.where(seen, total, 1), 0), t["O"])}
        if "LSE" in case.outputs:  # [batch][heads][seq_q]
            merged = np.where(seen, m + log(np.where(seen, total, 1)), -np.inf)
            out["LSE"] = ulpgate.encode(merged[..., 0], "fp32")
    return out


def test_attention_combine_case_and_check():
    c = ulpgate.attention_combine_case(5, head_dim=16, batch=2, heads=3, seq_q=2, dtype="bf16", out="fp32",
                                       layout="bshd", lse_base="2", lse=True, lse_dist="lse(mean=4,std=4,empty=0.3)")
    assert (c.op, c.splits, c.lse_base, c.outputs) == ("attention_combine", 5, "2", ["O", "LSE"])
    assert ulpgate.Case.from_json(c.to_json()) == c
    x = ulpgate.inputs(c)
    assert x["O_part"].shape == (5, 2, 3, 2, 16) and x["LSE_part"].shape == (5, 2, 3, 2, 1)
    # Split s of batch b is batch s * batch + b of the flat buffer: BSHD [split][batch][seq_q][heads][dim].
    flat = ulpgate.inputs(c, flat=True)["O_part"]
    assert x["O_part"][3, 1, 2, 1, 5] == flat[(((3 * 2 + 1) * 2 + 1) * 3 + 2) * 16 + 5]
    out = numpy_combine(x, c)
    ref = ulpgate.reference(c)
    assert ref["O"].shape == (2, 3, 2, 16) and ref["LSE"].shape == (2, 3, 2)
    assert np.allclose(ref["O"], values(out["O"], "fp32"), rtol=1e-6, atol=1e-30)
    assert ulpgate.check(c, out).passed
    assert ulpgate.run(numpy_combine, c).passed
    assert not ulpgate.check(c, dict(out, LSE=out["LSE"] + np.float32(0.01))).passed


def test_attention_combine_planted_bugs_fail():
    # LSEs near 100: exp(LSE_s) overflows FP32 (past 88.7) unless the largest is subtracted
    # first. The FP32 merge with the subtraction passes, the one without fails.
    big = ulpgate.attention_combine_case(4, head_dim=32, batch=2, heads=2, lse=True,
                                         lse_dist="lse(mean=100,std=4,empty=0)", seed=3)
    assert ulpgate.run(lambda x, c: numpy_combine(x, c, dtype=np.float32), big).passed
    r = ulpgate.run(lambda x, c: numpy_combine(x, c, dtype=np.float32, max_shift=False), big)
    assert not r.passed and "O:unexpected_nan" in r.signature, r
    # Every split empty: the merge must give O = 0 and LSE = -inf, not exp(-inf - -inf) = NaN.
    empty = ulpgate.attention_combine_case(3, head_dim=8, heads=2, lse=True, lse_dist="lse(empty=1)")
    assert np.all(ulpgate.reference(empty)["O"] == 0) and np.all(ulpgate.reference(empty)["LSE"] == -np.inf)
    assert ulpgate.run(numpy_combine, empty).passed
    r = ulpgate.run(lambda x, c: numpy_combine(x, c, guard=False), empty)
    assert not r.passed and "O:unexpected_nan" in r.signature, r


def test_fuzz_attention_combine():
    f = ulpgate.fuzz(numpy_combine, op="attention_combine", dtype="bf16", cases=12, seed=4, lse=True)
    assert f.checked and not f.failures and f.passed, f.summary()
    assert [r for r in f.results if "LSE" in r.case.outputs] and {r.case.lse_base for r in f.results} == {"e", "2"}
    # Without lse=True no case asks for the LSE, and none is refused for it.
    g = ulpgate.fuzz(numpy_combine, op="attention_combine", dtype="fp32", cases=6, seed=4)
    assert g.passed and all(r.case.outputs == ["O"] for r in g.results), g.summary()
    # Reading an empty split's partial output fails (the empty_split relation appends one of NaN).
    h = ulpgate.fuzz(lambda x, c: numpy_combine(x, c, guard=False), op="attention_combine", dtype="fp32", cases=6,
                     seed=4, lse=True)
    assert h.failures, h.summary()


def test_the_combine_example_runs_as_written(capsys):
    code = python_block("docs/guide/python.md", "## Split-KV combine")
    old = np.seterr()
    try:
        exec(compile(code, "docs/guide/python.md", "exec"), {})
    finally:
        np.seterr(**old)
    printed = capsys.readouterr().out.splitlines()
    assert printed == [line.split("# ", 1)[1] for line in code.splitlines() if line.startswith("print(")]
