// The attention reference against a plain MPFR evaluation at 1000 bits, with its own
// index arithmetic for the bhsd/bshd layouts and the mask rule, soft cap, ALiBi bias and sink
// written out again.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <xmmintrin.h>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/format_mpfr.hpp"
#include "references/attention_reference.hpp"
#include "tests/references/dot_inputs.hpp"

using namespace ulpgate;
using namespace ulpgate::test;

namespace {

constexpr Format kInputFormats[] = {Format::FP32, Format::TF32, Format::FP16,
                                    Format::BF16, Format::E4M3, Format::E5M2};
constexpr mpfr_prec_t kPrec = 1000;

// Element (b, h, s, d) of an operand with `heads` heads (Q, O: a.heads; K, V: kv heads).
std::int64_t at(const AttentionShape& a, std::int64_t heads, std::int64_t seq, std::int64_t dim, std::int64_t b,
                std::int64_t h, std::int64_t s, std::int64_t d) {
  return a.layout == AttentionLayout::BHSD ? ((b * heads + h) * seq + s) * dim + d
                                           : ((b * seq + s) * heads + h) * dim + d;
}

// K and V heads, and the one query head h reads: heads / kv consecutive query heads share one.
std::int64_t kv_count(const AttentionShape& a) { return a.kv_heads == 0 ? a.heads : a.kv_heads; }
std::int64_t kv_of(const AttentionShape& a, std::int64_t h) { return h * kv_count(a) / a.heads; }

bool visible(const AttentionShape& a, std::int64_t b, std::int64_t i, std::int64_t j) {
  const std::int64_t len = a.kv_lengths.empty() ? a.seq_kv : a.kv_lengths[b];
  const std::int64_t diag = i + a.seq_kv - a.seq_q;  // FlashAttention's window, written out here
  return j < len && (!a.causal || j <= diag) && (a.window_left < 0 || j >= diag - a.window_left) &&
         (a.window_right < 0 || j <= diag + a.window_right);
}

struct AttnCase {
  Case c;
  std::map<std::string, Tensor> in;
};

Tensor random_tensor(Format f, std::int64_t n, Bits& bits, bool small) {
  Tensor t(f, static_cast<std::size_t>(n));
  for (std::int64_t e = 0; e < n; ++e) {
    double v;
    if (small) v = static_cast<double>(bits.in(-2, 2));
    else do v = decode(f, bits.next() & info(f).code_mask());
         while (!std::isfinite(v) || std::fabs(v) > 6.0);
    t.set_value(static_cast<std::size_t>(e), v);
  }
  return t;
}

AttnCase random_case(std::uint64_t seed) {
  Bits bits(seed, 91, 0);
  AttnCase ac;
  Case& c = ac.c;
  c.op = Op::Attention;
  AttentionShape& a = c.attention;
  a.batch = bits.in(1, 2), a.heads = bits.in(1, 4), a.seq_q = bits.in(1, 6), a.seq_kv = bits.in(1, 8);
  a.head_dim = bits.in(1, 9), a.head_dim_v = bits.chance(0.5) ? 0 : bits.in(1, 5);
  if (a.heads > 1 && bits.chance(0.5)) a.kv_heads = a.heads == 4 && bits.chance(0.5) ? 2 : 1;  // GQA, MQA
  a.layout = bits.chance(0.5) ? AttentionLayout::BHSD : AttentionLayout::BSHD;
  a.causal = bits.chance(0.5);
  if (bits.chance(0.5))
    for (std::int64_t b = 0; b < a.batch; ++b) a.kv_lengths.push_back(bits.in(0, a.seq_kv));
  if (bits.chance(0.3)) a.window_left = bits.in(-1, 4), a.window_right = bits.in(-1, 3);
  const double scales[] = {0.125, -0.5, 0.0, 1.0 / 3.0, 1.0};
  if (bits.chance(0.5)) a.softmax_scale = scales[bits.in(0, 4)];
  // Served variants: small dyadic slopes and sinks make ties with the scores (exact cases).
  const double caps[] = {1.0, 2.5, 30.0, 0.125};
  if (bits.chance(0.25)) a.softcap = caps[bits.in(0, 3)];
  if (bits.chance(0.3)) {
    a.alibi_form = bits.chance(0.5) ? AlibiForm::Flash : AlibiForm::FlashInfer;
    const double slopes[] = {0.5, 0.25, 1.0, -0.0625, 0.0};
    if (bits.chance(0.5)) a.alibi_slopes = alibi_standard_slopes(a.heads);
    else for (std::int64_t h = 0; h < a.heads; ++h) a.alibi_slopes.push_back(slopes[bits.in(0, 4)]);
  }
  if (bits.chance(0.3)) {
    const double sinks[] = {-INFINITY, 0.0, 1.5, -2.0, 20.0, 100.0};
    for (std::int64_t h = 0; h < a.heads; ++h) a.sinks.push_back(sinks[bits.in(0, 5)]);
  }
  c.types = {{"Q", kInputFormats[bits.in(0, 5)]}, {"K", kInputFormats[bits.in(0, 5)]},
             {"V", kInputFormats[bits.in(0, 5)]}, {"O", kAllFormats[bits.in(0, 6)]},
             {"compute", Format::FP32}};
  const bool small = bits.chance(0.4);  // small integers: many equal scores, exact outputs
  ac.in["Q"] = random_tensor(c.types["Q"], attention_view(c, "Q").elements(), bits, small);
  ac.in["K"] = random_tensor(c.types["K"], attention_view(c, "K").elements(), bits, small);
  ac.in["V"] = random_tensor(c.types["V"], attention_view(c, "V").elements(), bits, small);
  validate(c);
  return ac;
}

// Replaces x (kPrec bits) by its 128-bit rounding (precision 128) when that is within
// 2^-900 relative: the computation's own error, so x is taken to be that short number.
void snap_to_short(mpfr_ptr x) {
  if (!mpfr_regular_p(x)) return;
  Mpfr r(128), diff(kPrec);
  mpfr_set(r, x, MPFR_RNDN);
  mpfr_sub(diff, x, r, MPFR_RNDN);
  if (mpfr_zero_p(diff) || mpfr_get_exp(diff) < mpfr_get_exp(x) - 900) {
    mpfr_set_prec(x, 128);
    mpfr_set(x, r, MPFR_RNDN);
  }
}

void check_case(std::uint64_t seed) {
  const AttnCase ac = random_case(seed);
  const Case& c = ac.c;
  const AttentionShape& a = c.attention;
  const AttentionReference r = attention_reference(c, ac.in, 1);
  const std::int64_t dv = a.eff_head_dim_v();
  Mpfr sigma(kPrec), s(kPrec), p(kPrec), m(kPrec), denom(kPrec), num(kPrec), o(kPrec), x(kPrec);
  if (a.softmax_scale) mpfr_set_d(sigma, *a.softmax_scale, MPFR_RNDN);
  else {
    mpfr_set_ui(sigma, static_cast<unsigned long>(a.head_dim), MPFR_RNDN);
    mpfr_rec_sqrt(sigma, sigma, MPFR_RNDN);
  }
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.heads; ++h)
      for (std::int64_t i = 0; i < a.seq_q; ++i) {
        std::vector<std::int64_t> keys;
        for (std::int64_t j = 0; j < a.seq_kv; ++j)
          if (visible(a, b, i, j)) keys.push_back(j);
        const std::string where = "seed " + std::to_string(seed) + " (" + std::to_string(b) + "," +
                                  std::to_string(h) + "," + std::to_string(i) + ")";
        const bool sink = !a.sinks.empty() && a.sinks[h] != -INFINITY;
        if (keys.empty() && !sink) {
          RC_ASSERT(r.lse[r.row(b, h, i)] == RefValue::infinity(true));
          for (std::int64_t d = 0; d < dv; ++d) RC_ASSERT(r.at(b, h, i, d) == RefValue::zero(false));
          continue;
        }
        std::vector<Mpfr*> scores;
        std::vector<std::unique_ptr<Mpfr>> owned;
        mpfr_set_prec(x, kPrec);
        for (std::int64_t j : keys) {
          owned.push_back(std::make_unique<Mpfr>(kPrec));
          mpfr_set_zero(*owned.back(), 1);
          for (std::int64_t d = 0; d < a.head_dim; ++d) {
            mpfr_set_d(x, ac.in.at("Q").value(at(a, a.heads, a.seq_q, a.head_dim, b, h, i, d)), MPFR_RNDN);
            mpfr_mul_d(x, x, ac.in.at("K").value(at(a, kv_count(a), a.seq_kv, a.head_dim, b, kv_of(a, h), j, d)),
                       MPFR_RNDN);
            mpfr_add(*owned.back(), *owned.back(), x, MPFR_RNDN);
          }
          mpfr_mul(*owned.back(), *owned.back(), sigma, MPFR_RNDN);
          if (a.softcap != 0) {  // cap tanh(x / cap), before the bias
            mpfr_div_d(*owned.back(), *owned.back(), a.softcap, MPFR_RNDN);
            mpfr_tanh(*owned.back(), *owned.back(), MPFR_RNDN);
            mpfr_mul_d(*owned.back(), *owned.back(), a.softcap, MPFR_RNDN);
          }
          if (!a.alibi_slopes.empty()) {
            const std::int64_t dist = a.alibi_form == AlibiForm::Flash ? -std::abs(i + a.seq_kv - a.seq_q - j) : j - i;
            mpfr_set_d(x, a.alibi_slopes[h], MPFR_RNDN);
            mpfr_mul_si(x, x, static_cast<long>(dist), MPFR_RNDN);
            mpfr_add(*owned.back(), *owned.back(), x, MPFR_RNDN);
          }
        }
        mpfr_set_inf(m, -1);
        if (sink) mpfr_set_d(m, a.sinks[h], MPFR_RNDN);
        for (auto& sc : owned) mpfr_max(m, m, *sc, MPFR_RNDN);
        mpfr_set_zero(denom, 1);
        if (sink) {  // in the denominator only
          mpfr_set_d(x, a.sinks[h], MPFR_RNDN);
          mpfr_sub(x, x, m, MPFR_RNDN);
          mpfr_exp(x, x, MPFR_RNDN);
          mpfr_add(denom, denom, x, MPFR_RNDN);
        }
        std::vector<std::unique_ptr<Mpfr>> w;
        for (auto& sc : owned) {
          w.push_back(std::make_unique<Mpfr>(kPrec));
          mpfr_sub(x, *sc, m, MPFR_RNDN);
          mpfr_exp(*w.back(), x, MPFR_RNDN);
          mpfr_add(denom, denom, *w.back(), MPFR_RNDN);
        }
        for (std::int64_t d = 0; d < dv; ++d) {
          mpfr_set_zero(num, 1);
          double mag = 0.0;  // sum w |v|, for telling cancellation noise from a value
          for (std::size_t k = 0; k < keys.size(); ++k) {
            const double vk = ac.in.at("V").value(at(a, kv_count(a), a.seq_kv, dv, b, kv_of(a, h), keys[k], d));
            mpfr_mul_d(x, *w[k], vk, MPFR_RNDN);
            mpfr_add(num, num, x, MPFR_RNDN);
            mag += mpfr_get_d(*w[k], MPFR_RNDN) * std::fabs(vk);
          }
          mpfr_set_prec(o, kPrec);
          // An exact zero (equal means of 0) shows as noise 2^-1000 below the terms.
          if (mpfr_zero_p(num) || mpfr_get_exp(num) < std::ilogb(mag) - 900) mpfr_set_zero(num, 1);
          mpfr_div(o, num, denom, MPFR_RNDN);
          // Within 2^-900 of a 128-bit number the true value is that number (a mean of V
          // values): take it as exact. Otherwise it is transcendental: its window, inexact.
          snap_to_short(o);
          const RefValue want = mpfr_get_prec(o) == 128 ? RefValue::from_exact(o) : RefValue::from_certified(o);
          const RefValue got = r.at(b, h, i, d);
          if (!(got == want) && !(mpfr_zero_p(o) && got.kind == RefValue::Kind::Zero))
            RC_FAIL(where + " d " + std::to_string(d) + ": reference " + to_string(got) + ", naive " + to_string(want));
          for (Format f : kAllFormats) RC_ASSERT(got.round_to(f) == encode_exact(f, o));
        }
        mpfr_set_prec(x, kPrec);
        mpfr_log(x, denom, MPFR_RNDN);
        mpfr_add(x, x, m, MPFR_RNDN);
        snap_to_short(x);
        const RefValue lse = r.lse[r.row(b, h, i)];
        for (Format f : kAllFormats)
          if (lse.round_to(f) != encode_exact(f, x))
            RC_FAIL(where + " lse: reference " + to_string(lse) + ", naive " + to_string(RefValue::from_exact(x)));
      }
}

// One FP32 query q = 1 of head dimension 1 against keys k and values v: the scores are k.
// given: softmax scale 1 stated in the case; otherwise the default 1/sqrt(1).
AttentionReference one_query_reference(const std::vector<double>& k_values, const std::vector<double>& v_values,
                                       bool given) {
  const auto n = static_cast<std::int64_t>(k_values.size());
  Case c;
  c.op = Op::Attention;
  c.attention.seq_q = 1, c.attention.seq_kv = n, c.attention.head_dim = 1;
  if (given) c.attention.softmax_scale = 1.0;
  c.types = {{"Q", Format::FP32}, {"K", Format::FP32}, {"V", Format::FP32}, {"O", Format::FP32},
             {"compute", Format::FP32}};
  Tensor q(Format::FP32, 1), k(Format::FP32, n), v(Format::FP32, n);
  q.set_value(0, 1.0);
  for (std::int64_t j = 0; j < n; ++j) k.set_value(j, k_values[j]), v.set_value(j, v_values[j]);
  return attention_reference(c, {{"Q", q}, {"K", k}, {"V", v}}, 1);
}

}  // namespace

// Five random cases per RapidCheck case (500 per run).
RC_GTEST_PROP(AttentionReference, MatchesNaiveMpfr, ()) {
  const auto base = *rc::gen::arbitrary<std::uint64_t>();
  for (std::uint64_t seed = base; seed < base + 5; ++seed) check_case(seed);
}

TEST(AttentionReference, ExactCases) {
  // One query, keys with equal scores: O is the mean of V exactly; a single key gives
  // LSE = scale * score exactly, and a fully masked batch gives 0 and -inf.
  Case c;
  c.op = Op::Attention;
  c.attention.batch = 2, c.attention.seq_q = 1, c.attention.seq_kv = 2, c.attention.head_dim = 4;
  c.attention.kv_lengths = {2, 0};
  c.types = {{"Q", Format::FP16}, {"K", Format::FP16}, {"V", Format::FP16}, {"O", Format::FP16},
             {"compute", Format::FP32}};
  Tensor q(Format::FP16, 8), k(Format::FP16, 16), v(Format::FP16, 16);
  for (int e = 0; e < 8; ++e) q.set_value(e, 1.0);
  for (int e = 0; e < 16; ++e) k.set_value(e, 0.5);
  for (int e = 0; e < 16; ++e) v.set_value(e, e % 8 < 4 ? 1.0 : 2.0);  // key 0 rows 1, key 1 rows 2
  const AttentionReference r = attention_reference(c, {{"Q", q}, {"K", k}, {"V", v}}, 1);
  EXPECT_EQ(r.at(0, 0, 0, 0).to_double(), 1.5);
  EXPECT_FALSE(r.at(0, 0, 0, 0).inexact);
  EXPECT_EQ(r.at(1, 0, 0, 0), RefValue::zero(false));
  EXPECT_EQ(r.lse[r.row(1, 0, 0)], RefValue::infinity(true));
  // LSE = 1 + log 2 (scores 2 * 1/sqrt(4) = 1)
  EXPECT_EQ(r.lse[r.row(0, 0, 0)].to_double(), 1.0 + std::log(2.0));
  EXPECT_NEAR(r.magnitude[r.index(0, 0, 0, 0)], 1.5, 1e-15);
}

// Sinks: a batch with no visible key but a sink has O = 0 and LSE = the sink, exactly; a
// sink of -inf is no sink, bit for bit; a sink equal to the only key's logit halves O.
TEST(AttentionReference, SinksExactCases) {
  Case c;
  c.op = Op::Attention;
  c.attention.batch = 2, c.attention.heads = 2, c.attention.seq_q = 1, c.attention.seq_kv = 1, c.attention.head_dim = 4;
  c.attention.kv_lengths = {1, 0};
  c.attention.softmax_scale = 0.5;
  c.types = {{"Q", Format::FP16}, {"K", Format::FP16}, {"V", Format::FP16}, {"O", Format::FP32},
             {"compute", Format::FP32}};
  Tensor q(Format::FP16, 16), k(Format::FP16, 16), v(Format::FP16, 16);
  for (int e = 0; e < 16; ++e) q.set_value(e, 1.0), k.set_value(e, 0.5), v.set_value(e, 3.0);
  const std::map<std::string, Tensor> in{{"Q", q}, {"K", k}, {"V", v}};
  const AttentionReference none = attention_reference(c, in, 1);
  c.attention.sinks = {1.0, -INFINITY};  // head 0: the key's logit 0.5 * 2 = 1; head 1: none
  validate(c);
  const AttentionReference r = attention_reference(c, in, 1);
  EXPECT_EQ(r.at(0, 0, 0, 0).to_double(), 1.5);  // 3 * e^1 / (e^1 + e^1)
  EXPECT_FALSE(r.at(0, 0, 0, 0).inexact);
  EXPECT_EQ(r.lse[r.row(0, 0, 0)].to_double(), 1.0 + std::log(2.0));
  EXPECT_EQ(r.at(1, 0, 0, 0), RefValue::zero(false));  // no key, the sink only
  EXPECT_EQ(r.lse[r.row(1, 0, 0)].to_double(), 1.0);
  EXPECT_FALSE(r.lse[r.row(1, 0, 0)].inexact);
  for (std::int64_t b = 0; b < 2; ++b) {  // head 1's sink of -inf: as without sinks
    EXPECT_EQ(r.at(b, 1, 0, 0), none.at(b, 1, 0, 0));
    EXPECT_EQ(r.lse[r.row(b, 1, 0)], none.lse[none.row(b, 1, 0)]);
  }
}

// A sink far above the only key, with an irrational scale (head_dim 2): the LSE is the sink
// plus log1p(e^(L - sink)), e^-283000 beyond any working precision. Sink 0: a positive value
// below every format's range; sink 2.25: just above 2.25. O is that tiny weight times v.
TEST(AttentionReference, SinkFarAboveTheKeysDecidesTheLse) {
  Case c;
  c.op = Op::Attention;
  c.attention.seq_kv = 1, c.attention.head_dim = 2;
  c.types = {{"Q", Format::FP32}, {"K", Format::FP32}, {"V", Format::FP32}, {"O", Format::FP32},
             {"LSE", Format::FP32}, {"compute", Format::FP32}};
  Tensor q(Format::FP32, 2), k(Format::FP32, 2), v(Format::FP32, 2);
  q.set_value(0, 1.0), q.set_value(1, 1.0), k.set_value(0, -2e5), k.set_value(1, -2e5), v.set_value(0, 3.0);
  v.set_value(1, 3.0);
  for (const double sink : {0.0, 2.25}) {
    c.attention.sinks = {sink};
    validate(c);
    const AttentionReference r = attention_reference(c, {{"Q", q}, {"K", k}, {"V", v}}, 1);
    const RefValue lse = r.lse[0];
    EXPECT_TRUE(lse.inexact) << sink;
    EXPECT_FALSE(lse.negative) << sink;
    EXPECT_EQ(lse.to_double(), sink);
    EXPECT_EQ(lse.to_double(Rounding::TowardZero), sink);
    EXPECT_EQ(r.at(0, 0, 0, 0).to_double(), 0.0) << sink;  // 3 e^-283000 / (1 + ...)
    EXPECT_EQ(r.at(0, 0, 0, 0).kind, RefValue::Kind::Finite) << sink;
  }
}

// Soft cap and ALiBi on one key: the LSE is the logit, cap tanh(x / cap) + bias, correctly
// rounded; a score of 0 leaves the bias alone, exactly.
TEST(AttentionReference, SoftcapAndAlibiSingleKey) {
  Case c;
  c.op = Op::Attention;
  c.attention.seq_q = 2, c.attention.seq_kv = 3, c.attention.head_dim = 1, c.attention.causal = true;
  c.attention.window_left = 0;  // query i sees key i + 1 only
  c.attention.softcap = 2.5;
  c.attention.alibi_slopes = {0.25};
  c.attention.alibi_form = AlibiForm::FlashInfer;  // slope (j - i) = 0.25
  c.types = {{"Q", Format::FP32}, {"K", Format::FP32}, {"V", Format::FP32}, {"O", Format::FP32},
             {"compute", Format::FP32}};
  validate(c);
  Tensor q(Format::FP32, 2), k(Format::FP32, 3), v(Format::FP32, 3);
  q.set_value(0, 3.0), q.set_value(1, 3.0);
  k.set_value(0, 9.0), k.set_value(1, 1.0), k.set_value(2, 0.0);  // scores 3 (query 0), 0 (query 1)
  for (int e = 0; e < 3; ++e) v.set_value(e, 1.0);
  const AttentionReference r = attention_reference(c, {{"Q", q}, {"K", k}, {"V", v}}, 1);
  Mpfr want(200);
  mpfr_set_ui(want, 3, MPFR_RNDN);  // x = scale 1/sqrt(1) times the score 3
  mpfr_div_d(want, want, 2.5, MPFR_RNDN);
  mpfr_tanh(want, want, MPFR_RNDN);
  mpfr_mul_d(want, want, 2.5, MPFR_RNDN);
  mpfr_add_d(want, want, 0.25, MPFR_RNDN);
  EXPECT_EQ(r.lse[r.row(0, 0, 0)], RefValue::from_certified(want));
  EXPECT_EQ(r.lse[r.row(0, 0, 1)].to_double(), 0.25);
  EXPECT_FALSE(r.lse[r.row(0, 0, 1)].inexact);
  EXPECT_EQ(r.at(0, 0, 0, 0).to_double(), 1.0);
}

// Scores far beyond a soft cap of 1: every logit is -1 + 2 e^(-2|x|), within 2^-288000 of
// -1 (beyond Ziv's 2^18 bits), so O lies that close to the plain mean of V, here exactly 2. The key of the least |x|
// weighs most: O sits just below 2 when its value is the smallest (1, 2, 3), just above when
// the largest (3, 2, 1). Both round to 2 to nearest; toward zero they part.
TEST(AttentionReference, SaturatedSoftcapDecidesNextToTheMean) {
  Case c;
  c.op = Op::Attention;
  c.attention.seq_kv = 3, c.attention.head_dim = 1, c.attention.softcap = 1.0, c.attention.softmax_scale = 1.0;
  c.types = {{"Q", Format::FP32}, {"K", Format::FP32}, {"V", Format::FP32}, {"O", Format::FP32},
             {"compute", Format::FP32}};
  validate(c);
  Tensor q(Format::FP32, 1), k(Format::FP32, 3);
  q.set_value(0, 1.0);
  k.set_value(0, -1e5), k.set_value(1, -1e5 - 1), k.set_value(2, -1e5 - 3);
  for (const bool below : {true, false}) {
    Tensor v(Format::FP32, 3);
    for (int j = 0; j < 3; ++j) v.set_value(j, below ? 1.0 + j : 3.0 - j);
    const RefValue o = attention_reference(c, {{"Q", q}, {"K", k}, {"V", v}}, 1).at(0, 0, 0, 0);
    EXPECT_TRUE(o.inexact);
    EXPECT_EQ(o.to_double(), 2.0);
    EXPECT_EQ(o.to_double(Rounding::TowardZero), below ? std::nextafter(2.0, 0.0) : 2.0) << below;
  }
  // One key: the LSE is the logit, -1 + 2 / (e^200000 + 1), just above -1; with a score of
  // +1e5 and an ALiBi bias of 0.5, 1.5 - 2 / (e^200000 + 1), just below 1.5.
  c.attention.seq_kv = 1;
  c.types["LSE"] = Format::FP32;
  Tensor one(Format::FP32, 1), v(Format::FP32, 1);
  one.set_value(0, -1e5), v.set_value(0, 1.0);
  RefValue lse = attention_reference(c, {{"Q", q}, {"K", one}, {"V", v}}, 1).lse[0];
  EXPECT_TRUE(lse.inexact);
  EXPECT_EQ(lse.to_double(), -1.0);
  EXPECT_EQ(lse.to_double(Rounding::TowardZero), std::nextafter(-1.0, 0.0));
  c.attention.alibi_slopes = {0.5};
  c.attention.alibi_form = AlibiForm::FlashInfer;
  c.attention.seq_q = 1, c.attention.seq_kv = 2, c.attention.window_left = 0;  // query 0 sees key 1 only: j - i = 1
  validate(c);
  Tensor two(Format::FP32, 2), v2(Format::FP32, 2);
  two.set_value(0, 0.0), two.set_value(1, 1e5), v2.set_value(0, 1.0), v2.set_value(1, 1.0);
  lse = attention_reference(c, {{"Q", q}, {"K", two}, {"V", v2}}, 1).lse[0];
  EXPECT_TRUE(lse.inexact);
  EXPECT_EQ(lse.to_double(), 1.5);
  EXPECT_EQ(lse.to_double(Rounding::TowardZero), std::nextafter(1.5, 0.0));
}

TEST(AttentionReference, ThreadsDoNotChangeBits) {
  for (std::uint64_t seed = 0; seed < 10; ++seed) {
    const AttnCase ac = random_case(seed);
    const AttentionReference one = attention_reference(ac.c, ac.in, 1), two = attention_reference(ac.c, ac.in, 2);
    EXPECT_EQ(one.values, two.values);
    EXPECT_EQ(one.lse, two.lse);
  }
}

// Grouped-query attention is multi-head attention with each K/V head repeated for its group
// of query heads: heads 6, kv_heads 3 (and 1, multi-query) against the MHA case whose K and
// V head h is the GQA case's head h / (6 / kv_heads), bit for bit, in both layouts.
TEST(AttentionReference, GroupedQueryEqualsRepeatedHeads) {
  for (const std::int64_t kv_heads : {3, 2, 1})
    for (const AttentionLayout layout : {AttentionLayout::BHSD, AttentionLayout::BSHD}) {
      Case g;
      g.op = Op::Attention;
      AttentionShape& a = g.attention;
      a.batch = 2, a.heads = 6, a.kv_heads = kv_heads, a.seq_q = 3, a.seq_kv = 5, a.head_dim = 4, a.head_dim_v = 3;
      a.layout = layout, a.causal = true, a.kv_lengths = {5, 2};
      g.types = {{"Q", Format::BF16}, {"K", Format::BF16}, {"V", Format::BF16}, {"O", Format::FP32},
                 {"compute", Format::FP32}};
      validate(g);
      Case m = g;
      m.attention.kv_heads = 0;
      Bits bits(kv_heads, 92, 0);
      std::map<std::string, Tensor> gin, min;
      gin["Q"] = min["Q"] = random_tensor(Format::BF16, attention_view(g, "Q").elements(), bits, false);
      for (const char* op : {"K", "V"}) {
        const AttentionView gv = attention_view(g, op), mv = attention_view(m, op);
        ASSERT_EQ(gv.heads, kv_heads);
        ASSERT_EQ(mv.heads, 6);
        gin[op] = random_tensor(Format::BF16, gv.elements(), bits, false);
        min[op] = Tensor(Format::BF16, static_cast<std::size_t>(mv.elements()));
        for (std::int64_t b = 0; b < a.batch; ++b)
          for (std::int64_t h = 0; h < 6; ++h)
            for (std::int64_t s = 0; s < a.seq_kv; ++s)
              for (std::int64_t d = 0; d < gv.dim; ++d)
                min[op].set_code(mv.offset(b, h, s, d), gin[op].code(gv.offset(b, h / (6 / kv_heads), s, d)));
      }
      const AttentionReference rg = attention_reference(g, gin, 1), rm = attention_reference(m, min, 1);
      EXPECT_EQ(rg.values, rm.values) << kv_heads;
      EXPECT_EQ(rg.lse, rm.lse) << kv_heads;
      EXPECT_EQ(rg.magnitude, rm.magnitude) << kv_heads;
      // Query heads of different groups read different keys: their outputs differ.
      EXPECT_NE(rg.at(0, 0, 2, 0), rg.at(0, 5, 2, 0)) << kv_heads;
    }
}

// 8192 keys of equal score and V = -1/32: O is the mean, -1/32 (the exact sum of
// V, -256, sits on a carry-save digit edge; it once came back as +0).
TEST(AttentionReference, NegativePowerOfTwoAtDigitEdge) {
  Case c;
  c.op = Op::Attention;
  c.attention.batch = 1, c.attention.heads = 1, c.attention.seq_q = 1, c.attention.seq_kv = 8192;
  c.attention.head_dim = 1;
  c.types = {{"Q", Format::FP32}, {"K", Format::FP32}, {"V", Format::FP32}, {"O", Format::FP32},
             {"compute", Format::FP32}};
  Tensor q(Format::FP32, 1), k(Format::FP32, 8192), v(Format::FP32, 8192);
  q.set_value(0, 1.0);
  k.fill_code(encode(Format::FP32, 0.5));
  v.fill_code(encode(Format::FP32, -1.0 / 32));
  const AttentionReference r = attention_reference(c, {{"Q", q}, {"K", k}, {"V", v}}, 1);
  EXPECT_EQ(r.at(0, 0, 0, 0).to_double(), -1.0 / 32);
  EXPECT_FALSE(r.at(0, 0, 0, 0).inexact);
}

// The caller's FTZ/DAZ and rounding mode (a kernel may leave them set) change no bit.
TEST(AttentionReference, CallersFloatingPointEnvironment) {
  for (std::uint64_t seed = 100; seed < 130; ++seed) {
    const AttnCase ac = random_case(seed);
    const AttentionReference clean = attention_reference(ac.c, ac.in, 2);
    const unsigned saved = _mm_getcsr();
    _mm_setcsr(0x1F80 | 0x8000 | 0x0040 | 0x2000);  // FTZ, DAZ, round down
    const AttentionReference hostile = attention_reference(ac.c, ac.in, 2);
    _mm_setcsr(saved);
    EXPECT_EQ(clean.values, hostile.values) << seed;
    EXPECT_EQ(clean.lse, hostile.lse) << seed;
  }
}

// One key dominating by a score gap of 512 (weight e^-512 ~ 2^-739 for the others): O sits
// within 2^-739 of the dominant value, and the window next to it is decided from the tiny
// perturbation's sign and size (not by 2^10 bits of precision). Expected: the formula at
// 4000 bits, truncated (its error is far below the perturbation).
TEST(AttentionReference, DominantKeyDecidedNextToItsValue) {
  struct Row {
    std::vector<double> k, v;
  };
  const std::vector<Row> rows = {
      {{600, 88}, {1.5, 3}},        // just above 1.5
      {{600, 88}, {1.5, -3}},       // just below 1.5
      {{600, 88}, {-1.5, 3}},       // |O| just below 1.5
      {{600, 88}, {1.0, 0}},        // just below 1: the binade below
      {{600, 600, 88}, {1, 2, 0}},  // two dominant keys: mean 1.5, just below
      {{600, 600, 600, 88}, {1, 1, 2, 8}},  // mean 4/3, not a 128-bit number
  };
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    const auto n = static_cast<std::int64_t>(row.k.size());
    const AttentionReference ref = one_query_reference(row.k, row.v, true);
    Mpfr num(4000), den(4000), w(4000), lse(4000);
    mpfr_set_zero(num, 1), mpfr_set_zero(den, 1);
    for (std::int64_t j = 0; j < n; ++j) {
      mpfr_set_d(w, row.k[j] - 600, MPFR_RNDN);
      mpfr_exp(w, w, MPFR_RNDN);
      mpfr_add(den, den, w, MPFR_RNDN);
      mpfr_mul_d(w, w, row.v[j], MPFR_RNDN);
      mpfr_add(num, num, w, MPFR_RNDN);
    }
    mpfr_log(lse, den, MPFR_RNDN);
    mpfr_add_d(lse, lse, 600, MPFR_RNDN);
    mpfr_div(num, num, den, MPFR_RNDN);
    EXPECT_EQ(ref.at(0, 0, 0, 0), RefValue::from_certified(num)) << "row " << r << ": " << to_string(ref.at(0, 0, 0, 0));
    EXPECT_EQ(ref.lse[0], RefValue::from_certified(lse)) << "row " << r << ": " << to_string(ref.lse[0]);
  }
}

// One key outscoring the others by 2^20, 2^31 or 2^100: their weights are e^-(2^20) ~
// 2^-(1.5 10^6), within MPFR's exponent range, and e^-(2^31), e^-(2^100), below it, so no
// precision computes them. O and the LSE are decided next to the dominant key's values from
// the sign of the perturbation, and an O whose dominant value is 0 is that perturbation: a
// tiny number of its sign where it is below MPFR's range. Expected: the dominant value moved
// by 2^-200 of itself in the perturbation's direction, truncated to the 128-bit window.
TEST(AttentionReference, WeightsBelowMpfrRangeDecidedBySign) {
  struct Row {
    std::vector<double> k, v;
    int direction;  // of O from the dominant keys' mean; 0: that mean is 0 and O is the perturbation
  };
  for (const double gap : {0x1p20, 0x1p31, 0x1p100}) {
    const std::vector<Row> rows = {
        {{gap, 0}, {1.5, 3}, +1},
        {{gap, 0}, {1.5, -3}, -1},
        {{gap, 0}, {-1.5, 3}, +1},             // |O| just below 1.5
        {{gap, 0}, {1.0, 0}, -1},              // the binade below 1
        {{gap, gap / 2, 0}, {1, 1, 2}, +1},    // the runner-up's V equals the dominant one
        {{gap, 0, -1}, {1, 3, -10}, -1},       // 2 - 11/e < 0: the runner-up alone has the wrong sign
        {{gap, gap, 0}, {1, 2, 0}, -1},        // two dominant keys: mean 1.5, just below
        {{gap, 0}, {0, 3}, 0},
        {{gap, 0}, {0, -3}, 0},
    };
    for (const bool given : {true, false}) {
      for (std::size_t r = 0; r < rows.size(); ++r) {
        const Row& row = rows[r];
        const AttentionReference ref = one_query_reference(row.k, row.v, given);
        const std::string what = fmt::format("gap 2^{}, row {}, scale {}", std::log2(gap), r, given ? "given" : "1/sqrt(d)");
        std::size_t top = 0;
        while (top + 1 < row.k.size() && row.k[top + 1] == gap) ++top;
        double mu = 0.0;
        for (std::size_t j = 0; j <= top; ++j) mu += row.v[j];
        mu /= static_cast<double>(top + 1);
        const RefValue o = ref.at(0, 0, 0, 0);
        if (row.direction == 0 && gap < 0x1p30) {  // V[1] e^-gap / (1 + e^-gap)
          Mpfr w(400), x(400);
          mpfr_set_d(w, -gap, MPFR_RNDN);
          mpfr_exp(w, w, MPFR_RNDN);
          mpfr_mul_d(x, w, row.v[1], MPFR_RNDN);
          mpfr_add_ui(w, w, 1, MPFR_RNDN);
          mpfr_div(x, x, w, MPFR_RNDN);
          EXPECT_EQ(o, RefValue::from_certified(x)) << what << ": " << to_string(o);
        } else if (row.direction == 0) {
          EXPECT_EQ(o, RefValue::tiny(row.v[1] < 0)) << what << ": " << to_string(o);
          EXPECT_EQ(o.round_to(Format::FP32), encode(Format::FP32, row.v[1] < 0 ? -0.0 : 0.0)) << what;
          EXPECT_EQ(o.round_to(Format::FP32, row.v[1] < 0 ? Rounding::Down : Rounding::Up),
                    encode(Format::FP32, std::copysign(0x1p-149, row.v[1])))
              << what;
        } else {
          Mpfr x(400);
          mpfr_set_d(x, std::fabs(mu), MPFR_RNDN);
          mpfr_mul_2si(x, x, -200, MPFR_RNDN);
          if (row.direction < 0) mpfr_neg(x, x, MPFR_RNDN);
          mpfr_add_d(x, x, mu, MPFR_RNDN);
          EXPECT_EQ(o, RefValue::from_certified(x)) << what << ": " << to_string(o);
        }
        Mpfr lse(400);
        mpfr_set_d(lse, gap, MPFR_RNDN);
        mpfr_mul_2si(lse, lse, -200, MPFR_RNDN);
        mpfr_add_d(lse, lse, gap, MPFR_RNDN);
        if (top == 0) {
          EXPECT_EQ(ref.lse[0], RefValue::from_certified(lse)) << what << ": " << to_string(ref.lse[0]);
        }
      }
    }
  }
}

// Every visible key's V equal in a column, at a midpoint of O's format (an FP8 cache's values
// times a scale, or FP32 V and FP16 O), with distinct logits: O is that value exactly, and
// its rounding a tie no precision decides from the weights. Decided as the exact mean: ties
// to even, and the value itself in wider formats.
TEST(AttentionReference, EqualValuesAtAMidpointAreExact) {
  Case c;
  c.op = Op::Attention;
  c.attention.seq_kv = 3, c.attention.head_dim = 2;
  c.types = {{"Q", Format::FP32}, {"K", Format::FP32}, {"V", Format::FP32}, {"O", Format::FP16}, {"compute", Format::FP32}};
  validate(c);
  Tensor q(Format::FP32, 2), k(Format::FP32, 6), v(Format::FP32, 6);
  q.set_value(0, 1.0), q.set_value(1, 0.5);
  const double mid = 1.0 + 0x1p-11;  // between FP16's 1 and 1 + 2^-10
  for (int j = 0; j < 3; ++j) {
    k.set_value(2 * j, 0.3 * j - 40.0 * (j == 2)), k.set_value(2 * j + 1, 0.7 + j);
    v.set_value(2 * j, mid), v.set_value(2 * j + 1, j == 1 ? 2.0 : mid);
  }
  const AttentionReference r = attention_reference(c, {{"Q", q}, {"K", k}, {"V", v}}, 1);
  EXPECT_FALSE(r.at(0, 0, 0, 0).inexact);
  EXPECT_EQ(r.at(0, 0, 0, 0).to_double(), mid);
  EXPECT_EQ(r.at(0, 0, 0, 0).round_to(Format::FP16), encode(Format::FP16, 1.0));
  EXPECT_TRUE(r.at(0, 0, 0, 1).inexact);  // column 1 differs between keys
}

// The same under a saturated soft cap (every logit within e^-(10^5) of -cap): a column whose
// keys all hold one value is that value exactly, a midpoint of FP16 or not.
// One query of (300, 300) over `keys` keys of head_dim 2, FP32 inputs, FP16 O, soft cap 0.5:
// with keys near (-300, -250) every score is near -1.2e5, far beyond the cap.
static Case saturated_case(std::int64_t keys) {
  Case c;
  c.op = Op::Attention;
  c.attention.seq_kv = keys, c.attention.head_dim = 2, c.attention.softcap = 0.5;
  c.types = {{"Q", Format::FP32}, {"K", Format::FP32}, {"V", Format::FP32}, {"O", Format::FP16}, {"compute", Format::FP32}};
  validate(c);
  return c;
}

TEST(AttentionReference, SaturatedSoftcapEqualValuesAreExact) {
  const Case c = saturated_case(3);
  Tensor q(Format::FP32, 2), k(Format::FP32, 6), v(Format::FP32, 6);
  q.set_value(0, 300.0), q.set_value(1, 300.0);
  const double mid = 1.0 + 0x1p-11;
  for (int j = 0; j < 3; ++j) {
    k.set_value(2 * j, -300.0 - j), k.set_value(2 * j + 1, -250.0 + 3 * j);
    v.set_value(2 * j, mid), v.set_value(2 * j + 1, 3.0);
  }
  const AttentionReference r = attention_reference(c, {{"Q", q}, {"K", k}, {"V", v}}, 1);
  EXPECT_EQ(r.at(0, 0, 0, 0).to_double(), mid);
  EXPECT_FALSE(r.at(0, 0, 0, 0).inexact);
  EXPECT_EQ(r.at(0, 0, 0, 1).to_double(), 3.0);
}

// Under a saturated soft cap, two keys whose values in a column cancel (x and -x, as FP8
// values often do): the mean M is 0 and O is the perturbation alone, e^-(10^5) small, whose
// 128-bit window needs D's bounds at full precision. It rounds to a zero of its sign.
TEST(AttentionReference, SaturatedSoftcapCancellingValuesDecideTheSign) {
  const Case c = saturated_case(2);
  Tensor q(Format::FP32, 2), k(Format::FP32, 4), v(Format::FP32, 4);
  q.set_value(0, 300.0), q.set_value(1, 300.0);
  k.set_value(0, -300.0), k.set_value(1, -250.0);  // q.k = -165000
  k.set_value(2, -301.0), k.set_value(3, -247.0);  // q.k = -164400: the larger logit
  v.set_value(0, -0.375), v.set_value(2, 0.375);   // column 0 cancels
  v.set_value(1, 1.0), v.set_value(3, 1.0);
  const AttentionReference r = attention_reference(c, {{"Q", q}, {"K", k}, {"V", v}}, 1);
  const RefValue o = r.at(0, 0, 0, 0);
  EXPECT_EQ(o.kind, RefValue::Kind::Finite);
  EXPECT_FALSE(o.negative);
  EXPECT_EQ(o.round_to(Format::FP16), Code{0});
  EXPECT_EQ(o.round_to(Format::FP16, Rounding::Up), Code{1});  // the smallest subnormal
  EXPECT_EQ(r.at(0, 0, 0, 1).to_double(), 1.0);
}
