#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <nlohmann/json.hpp>

#include "core/case.hpp"
#include "core/error.hpp"

using namespace ulpgate;
using nlohmann::json;

namespace {

rc::Gen<Format> any_format() {
  return rc::gen::elementOf(std::vector<Format>(std::begin(kAllFormats), std::end(kAllFormats)));
}

rc::Gen<double> any_scalar() {
  return rc::gen::oneOf(rc::gen::element(0.0, 1.0, -1.0, 0.5, -0.0),
                        rc::gen::map(rc::gen::arbitrary<std::uint64_t>(), [](std::uint64_t b) {
                          const double d = std::bit_cast<double>(b);
                          return std::isfinite(d) ? d : 2.0;
                        }));
}

rc::Gen<Case> any_valid_case() {
  return rc::gen::exec([] {
    Case c;
    c.op = *rc::gen::element(Op::Gemm, Op::Attention);
    c.kernel = *rc::gen::element<std::string>("", "cpu.fp32_seq", "cublaslt.fp8");
    c.seed = *rc::gen::arbitrary<std::uint64_t>();
    const auto in_shape = rc::gen::inRange<std::int64_t>(1, 70000);
    if (c.op == Op::Gemm) {
      auto& g = c.gemm;
      g.m = *in_shape;
      g.n = *in_shape;
      g.k = *in_shape;
      g.batch = *rc::gen::inRange<std::int64_t>(1, 9);
      g.layout = *rc::gen::element(Layout::RowMajor, Layout::ColMajor);
      g.trans_a = *rc::gen::arbitrary<bool>();
      g.trans_b = *rc::gen::arbitrary<bool>();
      const auto pad = [] { return *rc::gen::element<std::int64_t>(0, 0, 1, 7, 64); };
      auto ld = [&](std::int64_t rows, std::int64_t cols) {
        const std::int64_t p = pad();
        return p == 0 && *rc::gen::arbitrary<bool>() ? 0 : g.packed_ld(rows, cols) + p;
      };
      g.lda = ld(g.a_rows(), g.a_cols());
      g.ldb = ld(g.b_rows(), g.b_cols());
      g.ldc = ld(g.m, g.n);
      g.ldd = ld(g.m, g.n);
      c.alpha = *any_scalar();
      c.beta = *any_scalar();
      c.epilogue = *rc::gen::element(Epilogue::None, Epilogue::Bias, Epilogue::Relu, Epilogue::Gelu,
                                     Epilogue::GeluTanh, Epilogue::BiasRelu, Epilogue::BiasGelu,
                                     Epilogue::BiasGeluTanh);
      for (const char* op : {"A", "B", "C", "D", "bias"}) c.types[op] = *any_format();
      if (*rc::gen::arbitrary<bool>())
        for (const char* op : {"A", "B", "C", "D"})
          if (takes_scale(c.types.at(op))) c.scales[op] = std::ldexp(1.0, *rc::gen::inRange(-20, 20));
    } else {
      auto& a = c.attention;
      a.batch = *rc::gen::inRange<std::int64_t>(1, 5);
      a.heads = *rc::gen::inRange<std::int64_t>(1, 17);
      a.seq_q = *in_shape;
      a.seq_kv = *in_shape;
      a.head_dim = *rc::gen::element<std::int64_t>(32, 64, 80, 96, 111, 128, 256);
      a.head_dim_v = *rc::gen::element<std::int64_t>(0, 64);
      if (*rc::gen::arbitrary<bool>()) {  // grouped-query: a divisor of heads (0: heads)
        std::vector<std::int64_t> divisors{0};
        for (std::int64_t d = 1; d <= a.heads; ++d)
          if (a.heads % d == 0) divisors.push_back(d);
        a.kv_heads = *rc::gen::elementOf(divisors);
      }
      a.layout = *rc::gen::element(AttentionLayout::BHSD, AttentionLayout::BSHD);
      a.causal = *rc::gen::arbitrary<bool>();
      if (*rc::gen::arbitrary<bool>()) a.softmax_scale = *any_scalar();
      if (*rc::gen::arbitrary<bool>())
        for (std::int64_t b = 0; b < a.batch; ++b)
          a.kv_lengths.push_back(*rc::gen::inRange<std::int64_t>(0, a.seq_kv + 1));
      if (*rc::gen::arbitrary<bool>())
        a.window_left = *rc::gen::inRange<std::int64_t>(-1, 300), a.window_right = *rc::gen::inRange<std::int64_t>(-1, 300);
      for (const char* op : {"Q", "K", "V", "O"}) c.types[op] = *any_format();
    }
    c.types["compute"] = *any_format();
    for (const auto& in : c.inputs())
      if (*rc::gen::arbitrary<bool>())
        c.dist[in] = *rc::gen::element<std::string>("normal(0,1)", "uniform(-9,9)", "gendot(cond=1e12)");
    return c;
  });
}

json minimal_gemm() {
  return json::parse(R"({"ulpgate_case": 1, "op": "gemm",
    "gemm": {"m": 16, "n": 8, "k": 32},
    "types": {"A": "bf16", "B": "bf16", "D": "fp32", "compute": "fp32"}})");
}

std::string error_of(const json& j) {
  try {
    case_from_json(j);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

RC_GTEST_PROP(Case, JsonRoundTrip, ()) {
  const Case c = *any_valid_case();
  validate(c);
  const json j = to_json(c);
  const Case back = case_from_json(json::parse(j.dump()));
  RC_ASSERT(back == c);
  RC_ASSERT(to_json(back) == j);
}

TEST(Case, DefaultsAndDerivedValues) {
  const Case c = case_from_json(minimal_gemm());
  EXPECT_EQ(c.gemm.batch, 1);
  EXPECT_EQ(c.gemm.eff_lda(), 32);  // row-major A is 16 x 32
  EXPECT_EQ(c.gemm.eff_ldb(), 8);
  EXPECT_EQ(c.alpha, 1.0);
  EXPECT_EQ(c.beta, 0.0);
  EXPECT_EQ(c.inputs(), (std::vector<std::string>{"A", "B"}));
  json j = minimal_gemm();
  j["gemm"]["layout"] = "col";
  j["gemm"]["trans_a"] = true;
  j["alpha"] = "0x1.8p+0";  // hex floats are read exactly
  const Case t = case_from_json(j);
  EXPECT_EQ(t.gemm.eff_lda(), 32);  // A stored K x M = 32 x 16, column-major: ld = rows
  EXPECT_EQ(t.alpha, 1.5);
}

// Every malformed input is rejected with a message that names the field.
TEST(Case, MalformedInputsNameTheField) {
  struct Bad { const char* pointer; json value; const char* expect; };
  const Bad bad[] = {
      {"/gemm/m", -3, "case.gemm.m: must be >= 1, got -3"},
      {"/gemm/m", "16", "case.gemm.m: must be an integer"},
      {"/gemm/k", 0, "case.gemm.k: must be >= 1"},
      {"/gemm/lda", 10, "case.gemm.lda: must be 0 (packed) or >= 32"},
      {"/gemm/tarns_a", true, "case.gemm.tarns_a: unknown field"},
      {"/gemm/layout", "diagonal", "case.gemm.layout: must be one of row, col"},
      {"/types/A", "fp12", "case.types.A: unknown format"},
      {"/types/Q", "fp16", "case.types.Q: unknown operand for gemm"},
      {"/beta", 1.0, "case.types.C: missing (required when beta != 0)"},
      {"/epilogue", "bias_relu", "case.types.bias: missing (required by the bias epilogue)"},
      {"/epilogue", "swish", "case.epilogue: must be one of"},
      {"/alpha", "fast", "case.alpha: must be a number"},
      {"/alpha", "inf", "case.alpha: must be finite"},
      {"/scales/A", -1.0, "case.scales.A: must be finite and > 0"},
      {"/scales/Q", 1.0, "case.scales.Q: unknown scale"},
      {"/dist/C", "normal(0,1)", "case.dist.C: not an input operand of this case (A, B)"},
      {"/dist/A", 3, "case.dist.A: must be a distribution spec string"},
      // Fuzz finding F3: a NUL inside a spec was accepted and the number read up to it.
      {"/dist/A", std::string("normal(\0garbage,1)", 18), "case.dist.A: control character 0x00 at offset 7"},
      {"/dist/B", "normal(0,\n1)", "case.dist.B: control character 0x0a at offset 9"},
      {"/seed", -1, "case.seed: must be an unsigned 64-bit integer"},
      {"/ulpgate_case", 2, "case.ulpgate_case: unsupported case version 2"},
      {"/attention", json::object(), "case.attention: not allowed when op is gemm"},
      {"/colour", "red", "case.colour: unknown field"},
      {"/gemm", 5, "case.gemm: must be a JSON object"},
  };
  for (const auto& b : bad) {
    json j = minimal_gemm();
    j[json::json_pointer(b.pointer)] = b.value;
    const std::string msg = error_of(j);
    EXPECT_NE(msg.find(b.expect), std::string::npos) << b.pointer << " -> " << msg;
  }
  json j = minimal_gemm();
  j.erase("types");
  EXPECT_EQ(error_of(j), "case.types: missing");
  j = minimal_gemm();
  j["types"].erase("compute");
  EXPECT_EQ(error_of(j), "case.types.compute: missing");
  EXPECT_EQ(error_of(json::array()), "case: must be a JSON object, got []");
}

// Scales belong to FP8 operands only (plugin.h, cuBLASLt): on any other operand a kernel
// would ignore the factor the reference applies.
TEST(Case, ScalesOnlyOnFp8Operands) {
  json j = minimal_gemm();  // A, B bf16, D fp32
  j["scales"]["A"] = 0.5;
  EXPECT_EQ(error_of(j), "case.scales.A: scales apply only to FP8 operands (A is bf16)");
  j = minimal_gemm();
  j["scales"]["D"] = 2.0;
  EXPECT_EQ(error_of(j), "case.scales.D: scales apply only to FP8 operands (D is fp32)");
  j = minimal_gemm();
  j["scales"]["C"] = 1.0;  // beta = 0: no C at all
  EXPECT_EQ(error_of(j), "case.scales.C: scales apply only to FP8 operands (this case has no C)");
  j = minimal_gemm();
  j["beta"] = 1.0;
  j["types"]["C"] = "fp32";
  j["scales"]["C"] = 0x1p-126;  // what amax gave an FP32 C before FP8 alone took scales
  EXPECT_EQ(error_of(j), "case.scales.C: scales apply only to FP8 operands (C is fp32)");

  j = minimal_gemm();
  j["types"]["A"] = "e4m3";
  j["types"]["B"] = "e5m2";
  j["types"]["D"] = "e4m3";
  j["beta"] = 1.0;
  j["types"]["C"] = "e4m3";
  j["scales"] = {{"A", 0.5}, {"B", 4.0}, {"C", 0.25}, {"D", 8.0}};
  EXPECT_EQ(error_of(j), "(accepted)");
  EXPECT_FALSE(takes_scale(Format::FP16) || takes_scale(Format::BF16) || takes_scale(Format::TF32) ||
               takes_scale(Format::FP32) || takes_scale(Format::FP64));
}

// Per-head K/V scales: one finite positive scale per K/V head of an FP8 K or V of the
// attention forward, never beside a tensor scale of the same operand; they survive JSON.
TEST(Case, HeadScalesOfAnFp8KvCache) {
  json j = json::parse(R"({"ulpgate_case": 1, "op": "attention",
    "attention": {"batch": 1, "heads": 4, "kv_heads": 2, "seq_q": 3, "seq_kv": 5, "head_dim": 8},
    "types": {"Q": "fp16", "K": "e4m3", "V": "e5m2", "O": "fp16", "compute": "fp32"},
    "head_scales": {"K": [0.5, 0.125], "V": [2, 3]}})");
  const Case c = case_from_json(j);
  EXPECT_EQ(input_scale(c, "K", 1), 0.125);
  EXPECT_EQ(input_scale(c, "V", 0), 2.0);
  EXPECT_EQ(input_scale(c, "Q", 0), 1.0);
  EXPECT_EQ(attention_variants(c), kAttnKvHeadScales);
  EXPECT_EQ(case_from_json(to_json(c)), c);
  const auto bad = [&](const char* pointer, const json& value) {
    json k = j;
    k[json::json_pointer(pointer)] = value;
    return error_of(k);
  };
  EXPECT_EQ(bad("/head_scales/K", json::array({0.5})), "case.head_scales.K: must have one scale per K/V head (2), got 1");
  EXPECT_EQ(bad("/head_scales/V/1", -1.0), "case.head_scales.V[1]: must be finite and > 0, got -1");
  EXPECT_EQ(bad("/head_scales/K/0", "x"), "case.head_scales.K[0]: must be a number, got \"x\"");
  EXPECT_EQ(bad("/head_scales/V", 2.0), "case.head_scales.V: must be an array of numbers (one per K/V head)");
  EXPECT_EQ(bad("/head_scales/Q", json::array({1, 1})),
            "case.head_scales.Q: unknown scale (per-head scales are the attention forward's K and V, an FP8 K/V cache)");
  EXPECT_EQ(bad("/scales/K", 0.5), "case.head_scales.K: K has a tensor scale too (case.scales.K)");
  EXPECT_EQ(bad("/types/V", "fp16"), "case.head_scales.V: scales apply only to FP8 operands (V is fp16)");
}

TEST(Case, AttentionValidation) {
  json j = json::parse(R"({"ulpgate_case": 1, "op": "attention",
    "attention": {"batch": 2, "heads": 4, "seq_q": 100, "seq_kv": 130, "head_dim": 80,
                  "causal": true, "kv_lengths": [130, 77]},
    "types": {"Q": "fp16", "K": "fp16", "V": "fp16", "O": "fp16", "compute": "fp32"}})");
  const Case c = case_from_json(j);
  EXPECT_FALSE(c.attention.softmax_scale.has_value());
  EXPECT_EQ(c.attention.eff_head_dim_v(), 80);
  EXPECT_EQ(c.inputs(), (std::vector<std::string>{"Q", "K", "V"}));
  j["attention"]["kv_lengths"] = {130};
  EXPECT_NE(error_of(j).find("case.attention.kv_lengths: must have one entry per batch (2), got 1"),
            std::string::npos);
  j["attention"]["kv_lengths"] = {130, 131};
  EXPECT_NE(error_of(j).find("case.attention.kv_lengths[1]: must be in [0, seq_kv=130], got 131"),
            std::string::npos);
  j["attention"]["kv_lengths"] = {1, 2};
  j["epilogue"] = "relu";
  EXPECT_NE(error_of(j).find("case.epilogue: attention takes no epilogue"), std::string::npos);
}

// Grouped-query attention: kv_heads 0 (absent in older files) is heads; otherwise a
// divisor of heads, and K and V hold kv_heads heads, query head h reading h / (heads / kv_heads).
TEST(Case, AttentionKvHeads) {
  json j = json::parse(R"({"ulpgate_case": 1, "op": "attention",
    "attention": {"batch": 2, "heads": 6, "seq_q": 3, "seq_kv": 5, "head_dim": 8, "head_dim_v": 4},
    "types": {"Q": "fp16", "K": "fp16", "V": "fp16", "O": "fp16", "compute": "fp32"}})");
  Case c = case_from_json(j);  // no "kv_heads": a file from before GQA
  EXPECT_EQ(c.attention.kv_heads, 0);
  EXPECT_EQ(c.attention.eff_kv_heads(), 6);
  EXPECT_EQ(to_json(c)["attention"]["kv_heads"], 0);  // written always
  EXPECT_EQ(attention_view(c, "K").heads, 6);
  for (std::int64_t kvh : {1, 2, 3, 6}) {
    j["attention"]["kv_heads"] = kvh;
    c = case_from_json(j);
    EXPECT_EQ(case_from_json(to_json(c)), c);
    for (const char* op : {"K", "V"}) EXPECT_EQ(attention_view(c, op).heads, kvh) << op;
    for (const char* op : {"Q", "O"}) EXPECT_EQ(attention_view(c, op).heads, 6) << op;
    EXPECT_EQ(attention_view(c, "K").elements(), 2 * kvh * 5 * 8);
    EXPECT_EQ(attention_view(c, "V").elements(), 2 * kvh * 5 * 4);
    for (std::int64_t h = 0; h < 6; ++h) EXPECT_EQ(c.attention.kv_head(h), h / (6 / kvh));
  }
  EXPECT_EQ(c.attention.kv_head(5), 5);
  j["attention"]["kv_heads"] = 1;
  EXPECT_EQ(case_from_json(j).attention.kv_head(5), 0);  // multi-query
  j["attention"]["kv_heads"] = 4;
  EXPECT_EQ(error_of(j), "case.attention.kv_heads: must be 0 (= heads) or a divisor of heads=6 (grouped-query attention), got 4");
  j["attention"]["kv_heads"] = 12;
  EXPECT_EQ(error_of(j), "case.attention.kv_heads: must be 0 (= heads) or a divisor of heads=6 (grouped-query attention), got 12");
  j["attention"]["kv_heads"] = -1;
  EXPECT_EQ(error_of(j), "case.attention.kv_heads: must be >= 0, got -1");
  j["attention"]["kv_heads"] = "2";
  EXPECT_EQ(error_of(j), "case.attention.kv_heads: must be an integer, got \"2\"");
}

// Sizes had no cap: lda = 2^40 or batch = 1e12 reached the allocator (bad_alloc, exit 3)
// and products of sizes overflowed int64. Every size is at most 2^31 - 1 (what the
// libraries' 32-bit interfaces take) and every buffer at most 2^40 elements, padding
// included, so that offsets and byte counts stay exact; memory beyond that is the
// runner's --max-memory check (check/runner.hpp).
TEST(Case, SizesAndBuffersAreCapped) {
  struct Big { const char* pointer; json value; const char* expect; };
  const Big big[] = {
      {"/gemm/lda", std::int64_t{1} << 40, "case.gemm.lda: must be at most 2147483647, got 1099511627776"},
      {"/gemm/batch", std::int64_t{1000000000000}, "case.gemm.batch: must be at most 2147483647, got 1000000000000"},
      {"/gemm/k", std::int64_t{1} << 31, "case.gemm.k: must be at most 2147483647, got 2147483648"},
      {"/gemm/m", INT64_MAX, "case.gemm.m: must be at most 2147483647"},
  };
  for (const auto& b : big) {
    json j = minimal_gemm();
    j[json::json_pointer(b.pointer)] = b.value;
    EXPECT_EQ(error_of(j).rfind(b.expect, 0), 0u) << b.pointer << " -> " << error_of(j);
  }
  json j = minimal_gemm();
  j["gemm"]["m"] = j["gemm"]["n"] = j["gemm"]["k"] = 1000000000;  // each size allowed
  EXPECT_EQ(error_of(j), "case.gemm: A holds 1000000000000000000 elements (batch 1 x 1000000000 x lda 1000000000), above "
                         "the limit of 2^40 per buffer");
  j = minimal_gemm();
  j["gemm"]["batch"] = 70000;
  j["gemm"]["ldc"] = 2147483647;
  j["beta"] = 1;
  j["types"]["C"] = "fp32";
  EXPECT_EQ(error_of(j).rfind("case.gemm: C holds 2405181684640000 elements (batch 70000 x 16 x ldc 2147483647)", 0), 0u)
      << error_of(j);
  j["gemm"]["batch"] = 7;  // 16 x (2^31 - 1) x 7 < 2^40
  EXPECT_EQ(error_of(j), "(accepted)");
  json a = json::parse(R"({"ulpgate_case": 1, "op": "attention",
    "attention": {"batch": 1000000000000, "heads": 1, "seq_q": 1, "seq_kv": 1, "head_dim": 8},
    "types": {"Q": "fp16", "K": "fp16", "V": "fp16", "O": "fp16", "compute": "fp32"}})");
  EXPECT_EQ(error_of(a), "case.attention.batch: must be at most 2147483647, got 1000000000000");
  a["attention"]["batch"] = 65536;
  a["attention"]["heads"] = 65536;
  a["attention"]["seq_kv"] = 1024;
  EXPECT_EQ(error_of(a), "case.attention: K holds 35184372088832 elements (batch 65536 x heads 65536 x seq_kv 1024 x "
                         "head_dim 8), above the limit of 2^40 per buffer");
}

TEST(Case, MemoryViews) {
  Case c = case_from_json(minimal_gemm());  // row-major, A 16x32, B 32x8
  c.gemm.batch = 2;
  c.gemm.ldb = 10;  // padded
  const MatrixView b = gemm_view(c, "B");
  EXPECT_EQ(b.ld, 10);
  EXPECT_EQ(b.batch_stride(), 320);
  EXPECT_EQ(b.elements(), 640);
  EXPECT_EQ(b.offset(1, 2, 3), 320 + 23);
  EXPECT_FALSE(b.is_padding(7));
  EXPECT_TRUE(b.is_padding(8));
  EXPECT_TRUE(b.is_padding(320 + 9));
  c.gemm.layout = Layout::ColMajor;
  c.gemm.trans_a = true;  // A stored K x M = 32 x 16, column-major, ld = 32
  c.gemm.ldb = 0;
  const MatrixView a = gemm_view(c, "A");
  EXPECT_EQ(a.ld, 32);
  EXPECT_EQ(op_a_offset(c, a, 0, /*i=*/3, /*k=*/5), 3 * 32 + 5);
  EXPECT_EQ(gemm_view(c, "bias").elements(), 8);
  EXPECT_THROW(gemm_view(c, "Q"), InputError);

  Case t = case_from_json(json::parse(R"({"ulpgate_case": 1, "op": "attention",
    "attention": {"batch": 2, "heads": 3, "seq_q": 4, "seq_kv": 6, "head_dim": 8, "causal": true,
                  "kv_lengths": [6, 3], "layout": "bshd"},
    "types": {"Q": "fp16", "K": "fp16", "V": "fp16", "O": "fp16", "compute": "fp32"}})"));
  const AttentionView k = attention_view(t, "K");
  EXPECT_EQ(k.elements(), 2 * 3 * 6 * 8);
  EXPECT_EQ(k.offset(1, 2, 5, 7), ((1 * 6 + 5) * 3 + 2) * 8 + 7);
  // causal, bottom-right aligned: query 0 sees keys 0..2 (seq_kv - seq_q = 2)
  EXPECT_TRUE(attention_visible(t, 0, 0, 2));
  EXPECT_FALSE(attention_visible(t, 0, 0, 3));
  EXPECT_TRUE(attention_visible(t, 0, 3, 5));
  EXPECT_FALSE(attention_visible(t, 1, 3, 3));  // beyond kv_lengths[1] = 3
}

// Sliding windows (FlashAttention's convention): query i sees key j iff
// diag - left <= j <= diag + right, diag = i + seq_kv - seq_q, each side -1 for unbounded.
TEST(Case, WindowBoundsTheVisibleKeys) {
  Case c = case_from_json(json::parse(R"({"ulpgate_case": 1, "op": "attention",
    "attention": {"batch": 1, "heads": 1, "seq_q": 4, "seq_kv": 10, "head_dim": 8,
                  "window_left": 2, "window_right": 1},
    "types": {"Q": "fp16", "K": "fp16", "V": "fp16", "O": "fp16", "compute": "fp32"}})"));
  EXPECT_EQ(attention_variants(c), kAttnWindow);
  EXPECT_EQ(attention_variant_names(attention_variants(c)), "window");
  // query 0: diag 6, keys 4..7; query 3: diag 9, keys 7..9 (the last key bounds the right)
  EXPECT_EQ(attention_visible_keys(c, 0, 0).first, 4);
  EXPECT_EQ(attention_visible_keys(c, 0, 0).end, 8);
  EXPECT_EQ(attention_visible_keys(c, 0, 3).first, 7);
  EXPECT_EQ(attention_visible_keys(c, 0, 3).end, 10);
  EXPECT_EQ(attention_visible_count(c, 0, 3), 3);
  // causal caps the right side at the diagonal whatever window_right says
  c.attention.causal = true;
  EXPECT_EQ(attention_visible_keys(c, 0, 0).end, 7);
  // window (unbounded, 0) is causal
  Case w = c, causal = c;
  w.attention.causal = false, w.attention.window_left = -1, w.attention.window_right = 0;
  causal.attention.window_left = causal.attention.window_right = -1;
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 10; ++j) EXPECT_EQ(attention_visible(w, 0, i, j), attention_visible(causal, 0, i, j)) << i << " " << j;
  // a window left of every key the batch has: no key, an empty range at 0
  c.attention.causal = false, c.attention.window_left = 0, c.attention.window_right = 0, c.attention.kv_lengths = {5};
  EXPECT_EQ(attention_visible_keys(c, 0, 0).size(), 0);  // diag 6 is beyond the 5 keys
  EXPECT_EQ(attention_visible_keys(c, 0, 0).first, 0);
  // the JSON round trip keeps the window; files without it have none
  EXPECT_EQ(case_from_json(to_json(c)).attention.window_left, 0);
  c.attention.window_left = -2;
  EXPECT_THROW(validate(c), InputError);
  json j = to_json(w);
  j["attention"].erase("window_left"), j["attention"].erase("window_right");
  EXPECT_FALSE(case_from_json(j).attention.windowed());
  j["attention"]["window_right"] = -3;
  EXPECT_NE(error_of(j).find("case.attention.window_right"), std::string::npos) << error_of(j);
}

// The conventions of other libraries, converted: each names the same window of 4 keys
// left of the diagonal, self included (HF sliding_window = 4 keys; FlashAttention left 3).
TEST(Case, WindowConventions) {
  using W = std::pair<std::int64_t, std::int64_t>;
  EXPECT_EQ(window_from_convention("flash:3,0"), W(3, 0));
  EXPECT_EQ(window_from_convention("flash:-1,-1"), W(-1, -1));
  EXPECT_EQ(window_from_convention("hf:4"), W(3, 0));
  EXPECT_EQ(window_from_convention("flashinfer:3"), W(3, -1));
  EXPECT_EQ(window_from_convention("cudnn:4"), W(3, -1));
  EXPECT_EQ(window_from_convention("cudnn:4,0"), W(3, 0));
  EXPECT_EQ(window_from_convention("cudnn:1,2"), W(0, 2));
  for (const char* bad : {"4", "hf:0", "hf:4,1", "flash:3", "flash:-2,0", "cudnn:0", "cudnn:4,-1", "flashinfer:x",
                          "flashinfer:3,", "xformers:4", "hf:"}) {
    try {
      window_from_convention(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

// Soft cap, ALiBi and sinks: fields, JSON round trip (a sink of -inf as "-inf"), refusals,
// the two bias forms and the standard slope table.
TEST(Case, SoftcapAlibiAndSinks) {
  Case c = case_from_json(json::parse(R"({"ulpgate_case": 1, "op": "attention",
    "attention": {"batch": 1, "heads": 2, "seq_q": 3, "seq_kv": 5, "head_dim": 8, "softcap": 30,
                  "alibi_slopes": [0.5, 0.25], "alibi_form": "flashinfer", "sinks": [2.5, "-inf"]},
    "types": {"Q": "fp16", "K": "fp16", "V": "fp16", "O": "fp16", "compute": "fp32"}})"));
  EXPECT_EQ(attention_variants(c), kAttnSoftcap | kAttnAlibi | kAttnSinks);
  EXPECT_EQ(attention_variant_names(attention_variants(c)), "soft cap, ALiBi, sinks");
  EXPECT_EQ(c.attention.sinks[1], -INFINITY);
  EXPECT_EQ(case_from_json(json::parse(to_json(c).dump())), c);
  // FlashInfer: slope (j - i); Flash: -slope |i + seq_kv - seq_q - j| (diagonal at i + 2)
  EXPECT_EQ(alibi_distance(c.attention, 1, 4), 3);
  c.attention.alibi_form = AlibiForm::Flash;
  EXPECT_EQ(alibi_distance(c.attention, 1, 4), -1);
  EXPECT_EQ(alibi_distance(c.attention, 1, 0), -3);
  EXPECT_EQ(alibi_distance(c.attention, 1, 3), 0);
  // refusals: a slope per head, FP32 values, no +inf sink, a positive cap
  for (const auto& [field, value] : {std::pair{"alibi_slopes", json::array({0.5})}, std::pair{"sinks", json::array({1, "inf"})},
                                     std::pair{"softcap", json(-1)}, std::pair{"alibi_slopes", json::array({0.1, 0.5})},
                                     std::pair{"alibi_form", json("xformers")}}) {
    json j = to_json(c);
    j["attention"][field] = value;
    EXPECT_NE(error_of(j).find(std::string("case.attention.") + field), std::string::npos) << field << ": " << error_of(j);
  }
  // files without the fields: none of the three
  json j = to_json(c);
  for (const char* f : {"softcap", "alibi_slopes", "alibi_form", "sinks"}) j["attention"].erase(f);
  EXPECT_EQ(attention_variants(case_from_json(j)), 0u);
  // the standard slopes: 2^(-8k/n) for a power of two, then the odd entries of 2n's table
  EXPECT_EQ(alibi_standard_slopes(8), (std::vector<double>{0.5, 0.25, 0.125, 0.0625, 0x1p-5, 0x1p-6, 0x1p-7, 0x1p-8}));
  const std::vector<double> s12 = alibi_standard_slopes(12);
  ASSERT_EQ(s12.size(), 12u);
  EXPECT_EQ(s12[7], 0x1p-8);
  EXPECT_EQ(s12[8], static_cast<float>(std::exp2(-0.5)));  // 2^(-4/8)
  EXPECT_EQ(s12[11], static_cast<float>(std::exp2(-3.5)));
  EXPECT_EQ(alibi_standard_slopes(1), std::vector<double>{0x1p-8});
  EXPECT_EQ(alibi_standard_slopes(66).size(), 66u);
}

// Paged K/V: where each key lives in the pool for both page layouts, which pages and slots
// hold keys, the JSON round trip, the contiguous twin, and the refusals.
TEST(Case, PagedKvViews) {
  Case c = case_from_json(json::parse(R"({"ulpgate_case": 1, "op": "attention",
    "attention": {"batch": 2, "heads": 4, "kv_heads": 2, "seq_q": 3, "seq_kv": 5, "head_dim": 8,
                  "page_size": 2, "num_pages": 6, "page_table": [4, 1, 3, 5,  4, 0, 2, 5]},
    "types": {"Q": "fp16", "K": "fp16", "V": "fp16", "O": "fp16", "compute": "fp32"}})"));
  const AttentionShape& a = c.attention;
  EXPECT_EQ(a.pages_per_seq(), 4);
  EXPECT_EQ(a.pages_needed(), 3);
  EXPECT_EQ(attention_variants(c), kAttnPaged);
  EXPECT_EQ(case_from_json(json::parse(to_json(c).dump())), c);
  EXPECT_EQ(shape_text(c), "B2 H4/2 Sq3 Skv5 D8 paged(6x2)");
  // BHSD pages: [page][kv head][slot][dim]; key 3 of batch 1 is slot 1 of page 0
  const AttentionView k = attention_view(c, "K");
  EXPECT_EQ(k.elements(), 6 * 2 * 2 * 8);
  EXPECT_EQ(k.offset(1, 1, 3, 5), ((0 * 2 + 1) * 2 + 1) * 8 + 5);
  EXPECT_EQ(k.offset(0, 0, 4, 0), ((3 * 2 + 0) * 2 + 0) * 8);  // key 4: page 3, slot 0
  EXPECT_EQ(k.offset(1, 0, 0, 0), k.offset(0, 0, 0, 0));       // page 4 shared
  Case nhd = c;
  nhd.attention.layout = AttentionLayout::BSHD;  // [page][slot][kv head][dim]
  EXPECT_EQ(attention_view(nhd, "V").offset(1, 1, 3, 5), ((0 * 2 + 1) * 2 + 1) * 8 + 5);
  EXPECT_EQ(attention_view(nhd, "V").offset(1, 0, 3, 5), ((0 * 2 + 1) * 2 + 0) * 8 + 5);
  EXPECT_FALSE(attention_view(c, "Q").paged());
  // page use: page 4 holds batch 0's keys 0-1 (owner entry 0), page 3 one key, 1 and 5 none...
  const PageUse u = page_use(a);
  EXPECT_EQ(u.slots, (std::vector<std::int64_t>{2, 2, 1, 1, 2, 0}));
  EXPECT_EQ(u.owner, (std::vector<std::int64_t>{5, 1, 6, 2, 0, -1}));
  // the contiguous twin
  const Case flat = unpaged(c);
  EXPECT_EQ(attention_variants(flat), 0u);
  EXPECT_EQ(attention_view(flat, "K").elements(), 2 * 2 * 5 * 8);
  // refusals
  for (const auto& [field, value] : {std::pair{"page_table", json::array({4, 1, 3, 4, 0})},  // rows of 2 < 3 entries
                                     std::pair{"page_table", json::array({4, 1, 3, 5, 4, 0, 6, 5})},  // page 6 of 6
                                     std::pair{"num_pages", json(0)}, std::pair{"page_size", json(-1)}}) {
    json j = to_json(c);
    j["attention"][field] = value;
    EXPECT_NE(error_of(j).find(std::string("case.attention.") + field), std::string::npos) << field << ": " << error_of(j);
  }
  json j = to_json(c);
  j["attention"]["page_size"] = 0;
  EXPECT_NE(error_of(j).find("case.attention.num_pages"), std::string::npos) << error_of(j);
  j = to_json(c);
  j["op"] = "attention_backward";
  j["types"]["dO"] = j["types"]["dQ"] = j["types"]["dK"] = j["types"]["dV"] = "fp16";
  j["types"]["LSE"] = "fp32";
  EXPECT_NE(error_of(j).find("forward-only"), std::string::npos) << error_of(j);
}
