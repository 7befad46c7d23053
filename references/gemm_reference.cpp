#include "references/gemm_reference.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <cfloat>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/format_mpfr.hpp"
#include "core/profile.hpp"
#include "references/exact_dot.hpp"
#include "references/fp_env.hpp"
#if ULPGATE_GPU_REFERENCE
#include "references/sliced_gemm_gpu.hpp"
#endif

namespace ulpgate {
namespace {

enum class Act { None, Relu, Gelu, GeluTanh };

Act activation_of(Epilogue e) {
  switch (e) {
    case Epilogue::Relu:
    case Epilogue::BiasRelu: return Act::Relu;
    case Epilogue::Gelu:
    case Epilogue::BiasGelu: return Act::Gelu;
    case Epilogue::GeluTanh:
    case Epilogue::BiasGeluTanh: return Act::GeluTanh;
    default: return Act::None;
  }
}

double scale_of(const Case& c, const char* operand) {
  const auto it = c.scales.find(operand);
  return it == c.scales.end() ? 1.0 : it->second;
}

const Tensor& input(const std::map<std::string, Tensor>& inputs, const Case& c,
                    const std::string& operand, std::int64_t elements) {
  const auto it = inputs.find(operand);
  if (it == inputs.end()) throw InputError("gemm reference: input " + operand + " missing");
  const Format f = c.types.at(operand);
  if (it->second.format() != f)
    throw InputError(fmt::format("gemm reference: input {} is {}, the case says {}", operand,
                                 name(it->second.format()), name(f)));
  if (static_cast<std::int64_t>(it->second.size()) < elements)
    throw InputError(fmt::format("gemm reference: input {} has {} elements, its view needs {}",
                                 operand, it->second.size(), elements));
  return it->second;
}

// out = the sum of the given exact numbers, exactly: the precision spans from the lowest
// bit of any term to the highest plus carries. An exact zero gets the sign IEEE 754 gives
// it when rounding with rnd (mpfr_sum's rule).
void exact_sum(mpfr_ptr out, const std::vector<mpfr_ptr>& terms, mpfr_rnd_t rnd) {
  long hi = std::numeric_limits<long>::min(), lo = std::numeric_limits<long>::max();
  for (mpfr_ptr t : terms) {
    if (!mpfr_regular_p(t)) continue;
    hi = std::max<long>(hi, mpfr_get_exp(t));
    lo = std::min<long>(lo, mpfr_get_exp(t) - static_cast<long>(mpfr_get_prec(t)));
  }
  mpfr_set_prec(out, hi < lo ? 2 : static_cast<mpfr_prec_t>(hi - lo + 8));
  mpfr_sum(out, const_cast<mpfr_ptr*>(terms.data()), terms.size(), rnd);
}

RefValue relu(const RefValue& v) {
  if (v.kind == RefValue::Kind::NaN) return v;
  if (!v.negative && v.kind != RefValue::Kind::Zero) return v;
  return RefValue::zero(false);
}

// x - (a positive amount below every nonzero bit of x) for an exact x > 0: the window
// loses one unit when x fits it exactly, and is inexact either way.
RefValue just_below(mpfr_srcptr x) {
  RefValue r = RefValue::from_exact(x);
  if (!r.inexact) {
    if (r.sig_hi == (std::uint64_t{1} << 63) && r.sig_lo == 0) {  // 2^e - tiny
      r.sig_hi = r.sig_lo = ~std::uint64_t{0};
      --r.exponent;
    } else {
      if (r.sig_lo-- == 0) --r.sig_hi;
    }
  }
  r.inexact = true;
  return r;
}

// gelu(t) * scale_d for |t| beyond the evaluation's limit: d (t > 0) or gelu(t) (t < 0) is
// below 2^-(2^29) there, under MPFR's exponent range, and far below any bit of t (a sum of
// products of formats' values).
RefValue gelu_beyond_limit(mpfr_srcptr ts, bool positive) {
  if (positive) return just_below(ts);
  RefValue r;
  r.kind = RefValue::Kind::Finite;
  r.negative = true;
  r.inexact = true;
  r.exponent = -(1 << 30);
  r.sig_hi = std::uint64_t{1} << 63;
  return r;
}

// v = d (t > 0) or gelu(t) (t < 0), times scale_d, at v's precision.
void gelu_part(mpfr_ptr v, mpfr_srcptr t, double scale_d, bool tanh_form, bool positive) {
  const mpfr_prec_t p = mpfr_get_prec(v);
  Mpfr x(p), w(p);
  if (!tanh_form) {  // d = t/2 erfc(t/sqrt 2); gelu(t < 0) = t/2 erfc(|t|/sqrt 2)
    mpfr_sqrt_ui(w, 2, MPFR_RNDN);
    mpfr_div(x, t, w, MPFR_RNDN);
    mpfr_abs(x, x, MPFR_RNDN);
    mpfr_erfc(v, x, MPFR_RNDN);
    mpfr_mul(v, v, t, MPFR_RNDN);
    mpfr_div_2ui(v, v, 1, MPFR_RNDN);
  } else {  // d = t / (1 + exp(2u)); gelu(t < 0) = t / (1 + exp(-2u)), u = sqrt(2/pi)(t + 0.044715 t^3)
    mpfr_const_pi(w, MPFR_RNDN);
    mpfr_ui_div(w, 2, w, MPFR_RNDN);
    mpfr_sqrt(w, w, MPFR_RNDN);
    mpfr_set_str(x, "0.044715", 10, MPFR_RNDN);
    mpfr_mul(x, x, t, MPFR_RNDN);
    mpfr_mul(x, x, t, MPFR_RNDN);
    mpfr_mul(x, x, t, MPFR_RNDN);
    mpfr_add(x, x, t, MPFR_RNDN);
    mpfr_mul(x, x, w, MPFR_RNDN);
    mpfr_mul_si(x, x, positive ? 2 : -2, MPFR_RNDN);
    mpfr_exp(x, x, MPFR_RNDN);
    mpfr_add_ui(x, x, 1, MPFR_RNDN);
    mpfr_div(v, t, x, MPFR_RNDN);
  }
  mpfr_mul_d(v, v, scale_d, MPFR_RNDN);
}

// gelu(t) scale_d = ts - d with v = d (1 + e), |e| < 2^(64 - P), P v's precision; nullopt
// where this precision does not decide the window.
std::optional<RefValue> ts_minus_d(mpfr_srcptr ts, mpfr_srcptr v) {
  const mpfr_prec_t p = mpfr_get_prec(v);
  const long gap = static_cast<long>(mpfr_get_exp(ts)) - static_cast<long>(mpfr_get_exp(v));
  if (gap > 140) {
    // d is below a quarter unit of ts's 128-bit window: the window is ts's, or one
    // unit less when d exceeds what ts holds below the window.
    Mpfr window(128), rest(mpfr_get_prec(ts));
    mpfr_set(window, ts, MPFR_RNDZ);
    mpfr_sub(rest, ts, window, MPFR_RNDN);  // exact
    Mpfr lo(p), hi(p);  // d lies in [lo, hi]
    mpfr_set_ui_2exp(hi, 1, mpfr_get_exp(v) + 64 - p, MPFR_RNDU);
    mpfr_sub(lo, v, hi, MPFR_RNDD);
    mpfr_add(hi, v, hi, MPFR_RNDU);
    if (mpfr_cmp(hi, rest) < 0) {
      RefValue r = RefValue::from_exact(window);
      r.inexact = true;
      return r;
    }
    if (mpfr_cmp(lo, rest) > 0) return just_below(window);
    return std::nullopt;
  }
  // Here ts - v needs at most gap + P + 2 bits beyond v's error: rounding it costs one
  // more 2^(EXP(v) + 64 - P) at most.
  Mpfr y(static_cast<mpfr_prec_t>(std::max<long>(gap, 0) + p + 2));
  mpfr_sub(y, ts, v, MPFR_RNDN);
  const long err = static_cast<long>(mpfr_get_exp(y)) - (static_cast<long>(mpfr_get_exp(v)) + 65 - p);
  if (mpfr_can_round(y, err, MPFR_RNDN, MPFR_RNDZ, 128)) return RefValue::from_certified(y);
  return std::nullopt;
}

// gelu(t) * scale_d for finite nonzero t, by Ziv's strategy.
//
// For t < 0 the formulas below have no cancellation. For t > 0, gelu(t) = t - d with
// d = t/2 erfc(t/sqrt 2) (or t / (1 + exp(2u))) tiny for large t: evaluating gelu
// directly would need precision beyond -log2(d) to see that it sits just below t. So d is
// evaluated alone (relative error bounded) and subtracted from the exact t exactly: the
// error is then relative to d, not to the result.
//
// Error bound: below 2^(64 - P) relative for the evaluated quantity (d, or gelu(t) for
// t < 0) while |t| is within the thresholds below: the conditioning of erfc(|t|/sqrt 2) is
// at most 2 t^2 < 2^31 and that of exp(+-2u) at most 2|u| < 2^30; each MPFR operation
// adds 2^-P.
RefValue gelu_certified(mpfr_srcptr t, double scale_d, bool tanh_form) {
  const unsigned long limit = tanh_form ? 2000 : 30000;
  const bool positive = mpfr_sgn(t) > 0;
  Mpfr ts(mpfr_get_prec(t) + 53);
  mpfr_mul_d(ts, t, scale_d, MPFR_RNDN);  // exact
  if (mpfr_cmpabs_ui(t, limit) > 0) return gelu_beyond_limit(ts, positive);
  for (mpfr_prec_t p = 256; p <= (1 << 20); p *= 2) {
    Mpfr v(p);
    gelu_part(v, t, scale_d, tanh_form, positive);
    // gelu(t) is transcendental for t != 0, never a 128-bit number: once the error
    // interval fits between two of them, the truncation is decided.
    if (!positive) {
      if (mpfr_can_round(v, p - 64, MPFR_RNDN, MPFR_RNDZ, 128)) return RefValue::from_certified(v);
      continue;
    }
    if (const auto r = ts_minus_d(ts, v)) return *r;
  }
  throw std::runtime_error("gelu reference: rounding not decided at 2^20 bits");
}

// ULPGATE_REFERENCE (auto, cpu, gpu) where set, else auto; set_reference_path overrides it.
std::atomic<ReferencePath> g_reference_path{[] {
  const char* s = std::getenv("ULPGATE_REFERENCE");
  const std::optional<ReferencePath> p = s ? parse_reference_path(s) : std::nullopt;
  return p.value_or(ReferencePath::Auto);
}()};

// The GPU sliced path, or nullptr where this build or machine has none.
const SlicedPath* gpu_path() {
#if ULPGATE_GPU_REFERENCE
  if (!gpu_sliced_available()) return nullptr;
  static const SlicedPath path = gpu_sliced_path();
  return &path;
#else
  return nullptr;
#endif
}

}  // namespace

RefValue apply_activation(Epilogue e, mpfr_srcptr t, double scale_d) {
  const Act act = activation_of(e);
  if (mpfr_nan_p(t)) return RefValue::nan();
  if (act == Act::Relu && !(mpfr_sgn(t) > 0)) return RefValue::zero(false);
  if (act == Act::None || act == Act::Relu || mpfr_zero_p(t)) {  // gelu(+-0) = +-0
    Mpfr v(mpfr_get_prec(t) + 53);
    mpfr_mul_d(v, t, scale_d, MPFR_RNDN);  // exact
    return RefValue::from_exact(v);
  }
  if (mpfr_inf_p(t)) return mpfr_sgn(t) > 0 ? RefValue::infinity(false) : RefValue::nan();
  return gelu_certified(t, scale_d, act == Act::GeluTanh);
}

void set_reference_path(ReferencePath p) { g_reference_path = p; }
ReferencePath reference_path() { return g_reference_path; }
std::optional<ReferencePath> parse_reference_path(std::string_view s) {
  if (s == "auto") return ReferencePath::Auto;
  if (s == "cpu") return ReferencePath::Cpu;
  if (s == "gpu") return ReferencePath::Gpu;
  return std::nullopt;
}
bool gpu_reference_available() { return gpu_path() != nullptr; }

namespace {

// The case's operand tensors and views (InputError for a missing or mistyped one).
struct Operands {
  Operands(const Case& c, const std::map<std::string, Tensor>& inputs)
      : g(c.gemm), av(gemm_view(c, "A")), bv(gemm_view(c, "B")), cv(gemm_view(c, "C")),
        a(input(inputs, c, "A", av.elements())), b(input(inputs, c, "B", bv.elements())),
        with_c(c.beta != 0.0), with_bias(has_bias(c.epilogue)),
        ct(with_c ? &input(inputs, c, "C", cv.elements()) : nullptr),
        bias(with_bias ? &input(inputs, c, "bias", g.n) : nullptr),
        fast(a.format() != Format::FP64 && b.format() != Format::FP64) {}
  const GemmShape& g;
  const MatrixView av, bv, cv;
  const Tensor& a;
  const Tensor& b;
  const bool with_c, with_bias;
  const Tensor* const ct;
  const Tensor* const bias;
  const bool fast;  // A and B up to FP32: the superaccumulator; FP64 takes the MPFR oracle
};

// alpha * scale_A * scale_B and beta * scale_C, exactly, and what the elements' epilogue
// derives from them.
struct Scalars {
  explicit Scalars(const Case& c);
  // out = v / (alpha sA sB) where that is the power of two 2^alpha_exp (or 1); false where
  // the quotient leaves the normal range (rounded there, or Inf).
  bool unscaled(double v, double& out) const {
    out = alpha_one ? v : std::ldexp(v, -alpha_exp) * (alpha_double < 0 ? -1.0 : 1.0);
    return alpha_one || !std::isfinite(v) || v == 0.0 || (std::isfinite(out) && std::fabs(out) >= DBL_MIN);
  }
  const Act act;
  Mpfr alpha_ab{3 * 53}, beta_c{2 * 53};
  double scale_d = 1.0, beta_c_double = 0.0, alpha_double = 0.0, alpha_abs = 0.0;
  int alpha_exp = 0;  // |alpha sA sB| = 2^alpha_exp where it is a power of two
  bool alpha_one = false, fold_epilogue = false, drop_product = false;
};

Scalars::Scalars(const Case& c) : act(activation_of(c.epilogue)) {
  mpfr_set_d(alpha_ab, c.alpha, MPFR_RNDN);
  mpfr_mul_d(alpha_ab, alpha_ab, scale_of(c, "A"), MPFR_RNDN);
  mpfr_mul_d(alpha_ab, alpha_ab, scale_of(c, "B"), MPFR_RNDN);
  mpfr_set_d(beta_c, c.beta, MPFR_RNDN);
  mpfr_mul_d(beta_c, beta_c, scale_of(c, "C"), MPFR_RNDN);
  scale_d = scale_of(c, "D");
  beta_c_double = mpfr_get_d(beta_c, MPFR_RNDN);
  const bool beta_c_exact = mpfr_cmp_d(beta_c, beta_c_double) == 0;
  // When the dot product enters scaled by a power of two (alpha sA sB = +-2^e: alpha 1, 0.5,
  // -1, 2 ...) and unactivated (or only through ReLU), C and bias divided by that power can
  // join the exact sum, which is then scaled: no MPFR per element. A zero sum takes the
  // MPFR path when the power is not 1 (the sign rules of a zero are the terms' there).
  alpha_double = mpfr_get_d(alpha_ab, MPFR_RNDN);
  const bool alpha_pow2 = mpfr_cmp_d(alpha_ab, alpha_double) == 0 && alpha_double != 0.0 &&
                          std::fabs(std::frexp(alpha_double, &alpha_exp)) == 0.5;
  --alpha_exp;
  alpha_one = alpha_double == 1.0 && mpfr_cmp_ui(alpha_ab, 1) == 0;
  fold_epilogue = alpha_pow2 && scale_d == 1.0 && (act == Act::None || act == Act::Relu) && beta_c_exact;
  alpha_abs = std::fabs(alpha_double);
  // BLAS semantics: alpha = 0 does not reference A and B (D = beta C + bias), even where
  // their product is NaN or Inf.
  drop_product = c.alpha == 0.0;
}

GemmReference sized_reference(const Case& c) {
  const GemmShape& g = c.gemm;
  GemmReference r;
  r.batch = g.batch, r.m = g.m, r.n = g.n;
  r.d_format = c.types.count("D") ? c.types.at("D") : Format::FP32;
  const auto total = static_cast<std::size_t>(g.batch * g.m * g.n);
  r.values.resize(total);
  r.condition.resize(total);
  r.magnitude.resize(total);
  r.intermediate.resize(total);
  return r;
}

// op(A) rows and op(B) columns packed contiguously: every dot product reads two streams.
// Formats up to FP32 are exact as float; FP64 operands stay double.
struct Packed {
  explicit Packed(const Operands& in);
  const bool fast;
  const std::int64_t k;
  UninitVector<float> a_rows, b_cols;  // written in full by pack()
  UninitVector<double> a_rows64, b_cols64;
  std::vector<Operand> a_ops, b_ops;   // the superaccumulator's prepared rows and columns
};

Packed::Packed(const Operands& in) : fast(in.fast), k(in.g.k) {
  const GemmShape& g = in.g;
  if (fast) {
    a_rows.resize(static_cast<std::size_t>(g.batch * g.m * k));
    b_cols.resize(static_cast<std::size_t>(g.batch * g.n * k));
    a_ops.resize(static_cast<std::size_t>(g.batch * g.m));
    b_ops.resize(static_cast<std::size_t>(g.batch * g.n));
  } else {
    a_rows64.resize(static_cast<std::size_t>(g.batch * g.m * k));
    b_cols64.resize(static_cast<std::size_t>(g.batch * g.n * k));
  }
}

void pack(const Case& c, const Operands& in, Packed& p, unsigned threads) {
  const GemmShape& g = in.g;
  const std::int64_t k = p.k;
  parallel_for(g.batch * (g.m + g.n), [&](std::int64_t row) {
    const bool is_a = row < g.batch * g.m;
    const std::int64_t r2 = is_a ? row : row - g.batch * g.m;
    const std::int64_t bi = is_a ? r2 / g.m : r2 / g.n, i = is_a ? r2 % g.m : r2 % g.n;
    if (p.fast) {  // a strided run of storage words (offsets are affine in kk)
      const auto at = [&](std::int64_t kk) {
        return is_a ? op_a_offset(c, in.av, bi, i, kk) : op_b_offset(c, in.bv, bi, kk, i);
      };
      const std::int64_t first = k > 0 ? at(0) : 0, step = k > 1 ? at(1) - first : 1;
      const Tensor& t = is_a ? in.a : in.b;
      decode_floats(t.format(), t.data(), first, step, k, (is_a ? p.a_rows : p.b_cols).data() + r2 * k);
      return;
    }
    for (std::int64_t kk = 0; kk < k; ++kk)
      (is_a ? p.a_rows64 : p.b_cols64)[static_cast<std::size_t>(r2 * k + kk)] =
          is_a ? in.a.value(op_a_offset(c, in.av, bi, i, kk)) : in.b.value(op_b_offset(c, in.bv, bi, kk, i));
  }, threads);
}

// The sliced path the dot products take: the caller's ("sliced"), the GPU's where
// reference_path() asks for it ("gpu"), or none.
const SlicedPath* choose_path(const SlicedPath* given, bool fast, double terms, std::string& path_name) {
  path_name = given ? "sliced" : "";
  if (given || !fast) return given;
  const ReferencePath want = reference_path();
  if (want == ReferencePath::Gpu || (want == ReferencePath::Auto && terms >= kGpuReferenceTerms)) {
    const SlicedPath* gpu = gpu_path();
    if (!gpu && want == ReferencePath::Gpu) throw InputError("--reference gpu: no CUDA device here");
    path_name = "gpu";
    return gpu;
  }
  return nullptr;
}

// Every batch's dot products from the digits (certified, or recomputed by the finish, which
// runs the superaccumulator on the elements not certified); none without a sliced path, or
// where the GPU path fails under auto (a note on stderr).
std::vector<SlicedDots> sliced_dots(const SlicedPath* path, const std::string& path_name, const Packed& p,
                                    const GemmShape& g, GemmReference& r) {
  std::vector<SlicedDots> sliced;
  if (!path || !p.fast) return sliced;
  r.recomputed = 0;
  r.path = path_name;
  const auto mk = static_cast<std::size_t>(g.m * p.k), nk = static_cast<std::size_t>(g.n * p.k);
  try {
    for (std::int64_t bi = 0; bi < g.batch; ++bi) {
      sliced.push_back((*path)(std::span<const float>(p.a_rows).subspan(bi * mk, mk), g.m,
                               std::span<const float>(p.b_cols).subspan(bi * nk, nk), g.n, p.k));
      r.recomputed += sliced.back().recomputed;
    }
  } catch (const std::runtime_error& e) {
    if (reference_path() != ReferencePath::Auto || path_name != "gpu") throw;
    std::fprintf(stderr, "ulpgate: GPU exact reference failed (%s); this case's reference runs on the CPU\n", e.what());
    sliced.clear();
    r.recomputed = -1, r.path = "cpu";
  }
  return sliced;
}

// Prepared operands for the superaccumulator: every row and column, or with the sliced
// path only those of elements the digits did not certify (preparing all of them would
// cost as much as the GPU's whole product at large K).
void prepare_operands(const std::vector<SlicedDots>& sliced, const GemmShape& g, Packed& p, unsigned threads) {
  if (!p.fast) return;
  std::vector<char> need_a(static_cast<std::size_t>(g.batch * g.m), sliced.empty()),
      need_b(static_cast<std::size_t>(g.batch * g.n), sliced.empty());
  for (std::size_t bi = 0; bi < sliced.size(); ++bi)
    for (std::int64_t j = 0; j < g.n && sliced[bi].recomputed > 0; ++j)
      for (std::int64_t i = 0; i < g.m; ++i)
        if (!sliced[bi].certified[sliced[bi].index(i, j)])
          need_a[bi * static_cast<std::size_t>(g.m) + static_cast<std::size_t>(i)] = 1,
          need_b[bi * static_cast<std::size_t>(g.n) + static_cast<std::size_t>(j)] = 1;
  parallel_for(g.batch * (g.m + g.n), [&](std::int64_t row) {
    const bool is_a = row < g.batch * g.m;
    const auto r2 = static_cast<std::size_t>(is_a ? row : row - g.batch * g.m);
    if (!(is_a ? need_a : need_b)[r2]) return;
    const auto* base = (is_a ? p.a_rows.data() : p.b_cols.data()) + r2 * static_cast<std::size_t>(p.k);
    (is_a ? p.a_ops : p.b_ops)[r2] = Operand(std::span<const float>(base, static_cast<std::size_t>(p.k)));
  }, threads);
}

// One element (b, i, j) on its way through the finish.
struct Element {
  std::int64_t bi = 0, i = 0, j = 0, idx = 0;
  double cval = 0.0, bval = 0.0;  // C's and bias's values (0 where absent)
  const SlicedDots* sd = nullptr;
  bool certified = false;  // the digits certify its dot product
  double condition = 0.0, finite_condition = -1.0;
  bool dot_negative_down = false;  // the sign of a zero dot product rounding down
};

// Finishes the elements of one tile: the exact dot product, the epilogue, the rounding to a
// RefValue, the condition, magnitude and intermediate bound.
class Finisher {
 public:
  Finisher(const Case& c, const Operands& in, const Scalars& s, const Packed& p, const std::vector<SlicedDots>& sliced,
           GemmReference& r)
      : c_(c), in_(in), s_(s), p_(p), sliced_(sliced), r_(r) {}
  void element(std::int64_t bi, std::int64_t i, std::int64_t j);

 private:
  void add_dot(const Element& e);
  void from_digits(Element& e);
  bool fast_dot(Element& e);
  bool fold(const Element& e);
  void oracle_dot(Element& e);
  void mpfr_epilogue(const Element& e);
  void record_scales(const Element& e);

  const Case& c_;
  const Operands& in_;
  const Scalars& s_;
  const Packed& p_;
  const std::vector<SlicedDots>& sliced_;
  GemmReference& r_;
  ExactAccumulator acc_;
  MpfrOracle oracle_;
  Mpfr dot_{2}, t_{2}, scaled_{2}, beta_term_{3 * 53}, bias_term_{53};
};

void Finisher::element(std::int64_t bi, std::int64_t i, std::int64_t j) {
  Element e;
  e.bi = bi, e.i = i, e.j = j, e.idx = r_.index(bi, i, j);
  e.cval = in_.with_c ? in_.ct->value(in_.cv.offset(bi, i, j)) : 0.0;
  e.bval = in_.with_bias ? in_.bias->value(j) : 0.0;
  e.sd = sliced_.empty() ? nullptr : &sliced_[static_cast<std::size_t>(bi)];
  e.certified = e.sd && e.sd->certified[e.sd->index(i, j)];
  bool done = false;
  if (e.certified && s_.fold_epilogue && !in_.with_c && !in_.with_bias) {
    from_digits(e);
    done = true;
  } else if (p_.fast) {
    done = fast_dot(e);
  } else {
    oracle_dot(e);
  }
  if (!done) mpfr_epilogue(e);
  record_scales(e);
}

// The exact dot product into acc_: the digits' pieces where they certify it.
void Finisher::add_dot(const Element& e) {
  if (e.certified) {
    for (const double piece : e.sd->pieces(e.i, e.j))
      if (piece != 0.0) acc_.add(piece);
  } else {
    const auto ai = static_cast<std::size_t>(e.bi * in_.g.m + e.i), bj = static_cast<std::size_t>(e.bi * in_.g.n + e.j);
    acc_.add_products(p_.a_ops[ai], p_.b_ops[bj]);
  }
}

// The digits' value itself (nonzero: certification needs S != 0), scaled by the power of
// two as fold() does: no accumulator (most of a large sweep point's finishing).
void Finisher::from_digits(Element& e) {
  RefValue v = e.sd->value(e.i, e.j);
  if (!s_.alpha_one) {
    v.exponent += s_.alpha_exp;
    if (s_.alpha_double < 0) v.negative = !v.negative;
  }
  r_.values[e.idx] = s_.act == Act::Relu ? relu(v) : v;
  e.condition = e.sd->condition[e.sd->index(e.i, e.j)];
}

// The dot product by the superaccumulator, finished there where the epilogue folds into
// the exact sum; otherwise left in dot_ for the MPFR epilogue (false).
bool Finisher::fast_dot(Element& e) {
  acc_.clear();
  add_dot(e);
  e.condition = e.certified ? e.sd->condition[e.sd->index(e.i, e.j)] : acc_.magnitude().to_double();
  if (s_.fold_epilogue && fold(e)) return true;
  acc_.exact_value(dot_);
  e.dot_negative_down = acc_.value().negative_down;
  return false;
}

// C and bias into the exact sum, divided by the power of two alpha sA sB, the sum then
// scaled by it; false (acc_ holding the dot product alone) where that is not exact or the
// sum is a zero whose sign the MPFR path decides.
bool Finisher::fold(const Element& e) {
  // beta sC c joins the sum only if it is an exact double (FMA residual zero, and far
  // enough from underflow that the residual itself is exact), and it and the bias only if
  // dividing them by the power of two is exact (a normal result).
  const double bc = s_.beta_c_double * e.cval;
  const bool bc_exact = !in_.with_c || (std::isfinite(bc) && (bc == 0.0 ? (s_.beta_c_double == 0.0 || e.cval == 0.0)
                                                                         : std::fabs(bc) >= 0x1p-969 &&
                                                                               std::fma(s_.beta_c_double, e.cval, -bc) == 0.0));
  double tc = 0.0, tb = 0.0;
  if (!bc_exact || (in_.with_c && !s_.unscaled(bc, tc)) || (in_.with_bias && !s_.unscaled(e.bval, tb))) return false;
  if (in_.with_c) acc_.add(tc);
  if (in_.with_bias) acc_.add(tb);
  RefValue v = acc_.value();
  if (!s_.alpha_one) {
    if (v.kind == RefValue::Kind::Finite) v.exponent += s_.alpha_exp;
    if (s_.alpha_double < 0 && (v.kind == RefValue::Kind::Finite || v.kind == RefValue::Kind::Inf)) v.negative = !v.negative;
  }
  if (s_.alpha_one || v.kind != RefValue::Kind::Zero) {
    r_.values[e.idx] = s_.act == Act::Relu ? relu(v) : v;
    return true;
  }
  acc_.clear();
  add_dot(e);
  return false;
}

// FP64 A or B: the dot product, its condition term and the sign of a zero by the MPFR oracle.
void Finisher::oracle_dot(Element& e) {
  const GemmShape& g = in_.g;
  const std::int64_t k = p_.k;
  std::span<const double> x(&p_.a_rows64[static_cast<std::size_t>((e.bi * g.m + e.i) * k)], k),
      y(&p_.b_cols64[static_cast<std::size_t>((e.bi * g.n + e.j) * k)], k);
  oracle_.dot(dot_, x, y);
  if (mpfr_zero_p(dot_)) {
    oracle_.dot(t_, x, y, MPFR_RNDD);
    e.dot_negative_down = mpfr_signbit(t_) != 0;
  }
  std::vector<double> ax(x.begin(), x.end()), ay(y.begin(), y.end());
  for (auto& v : ax) v = std::fabs(v);
  for (auto& v : ay) v = std::fabs(v);
  oracle_.dot(t_, ax, ay);
  e.condition = mpfr_get_d(t_, MPFR_RNDN);
  if (!std::isfinite(e.condition)) {  // NaN/Inf inputs: the intermediate bound is over the finite terms
    for (std::size_t q = 0; q < ax.size(); ++q)
      if (!std::isfinite(ax[q]) || !std::isfinite(ay[q])) ax[q] = ay[q] = 0.0;
    oracle_.dot(t_, ax, ay);
    e.finite_condition = mpfr_get_d(t_, MPFR_RNDN);
  }
}

// alpha sA sB dot + beta sC c + bias summed exactly, then the activation and scale_D.
void Finisher::mpfr_epilogue(const Element& e) {
  std::vector<mpfr_ptr> terms;
  if (!s_.drop_product) {  // BLAS: alpha = 0 adds no product, not even a +0
    mpfr_set_prec(scaled_, mpfr_get_prec(dot_) + 3 * 53);
    mpfr_mul(scaled_, s_.alpha_ab, dot_, MPFR_RNDN);  // exact
    terms.push_back(scaled_);
  }
  if (in_.with_c) {
    mpfr_mul_d(beta_term_, s_.beta_c, e.cval, MPFR_RNDN);  // exact: 106 + 53 bits
    terms.push_back(beta_term_);
  }
  if (in_.with_bias) {
    mpfr_set_d(bias_term_, e.bval, MPFR_RNDN);
    terms.push_back(bias_term_);
  }
  exact_sum(t_, terms, MPFR_RNDN);
  RefValue& v = r_.values[e.idx];
  v = apply_activation(c_.epilogue, t_, s_.scale_d);
  if (v.kind != RefValue::Kind::Zero || s_.act == Act::Relu) return;
  // The same sum's sign rounding down, from the dot product's; it goes through scale_D and
  // GELU (gelu(+-0) = +-0) as the sign rounding to nearest does.
  if (!s_.drop_product && mpfr_zero_p(dot_))
    mpfr_setsign(scaled_, scaled_, e.dot_negative_down != (mpfr_sgn(s_.alpha_ab.get()) < 0), MPFR_RNDN);
  Mpfr down(2);
  exact_sum(down, terms, MPFR_RNDD);
  v.negative_down = (mpfr_signbit(down) != 0) != (s_.scale_d < 0);
}

void Finisher::record_scales(const Element& e) {
  r_.condition[e.idx] = e.condition;
  const double pre = s_.alpha_abs * e.condition + std::fabs(s_.beta_c_double * e.cval) + std::fabs(e.bval);
  r_.magnitude[e.idx] = s_.scale_d * pre;
  const double cf = e.finite_condition < 0 ? e.condition : e.finite_condition;
  const auto finite_abs = [](double v) { return std::isfinite(v) ? std::fabs(v) : 0.0; };
  r_.intermediate[e.idx] = std::max(cf, s_.alpha_abs * cf + finite_abs(s_.beta_c_double * e.cval) + finite_abs(e.bval));
  // A kernel that multiplies by alpha = 0 anyway meets the NaN or Inf of the product.
  if (s_.drop_product && !std::isfinite(e.condition)) r_.intermediate[e.idx] = INFINITY;
}

// Tiles of 8 rows x col_block columns, so that a tile's B columns (about 256 KB) stay in
// the core's L2 while its rows use them; consecutive tiles share their columns, which the
// threads taking them in turn then find in L3.
void finish(const Case& c, const Operands& in, const Scalars& s, const Packed& p, const std::vector<SlicedDots>& sliced,
            GemmReference& r, unsigned threads) {
  const GemmShape& g = in.g;
  const std::int64_t row_block = 8, m_blocks = (g.m + row_block - 1) / row_block;
  const std::int64_t col_block = std::clamp<std::int64_t>((std::int64_t{1} << 16) / std::max<std::int64_t>(g.k, 1), 8, 256);
  const std::int64_t n_blocks = (g.n + col_block - 1) / col_block, tiles_per_batch = m_blocks * n_blocks;
  parallel_for(g.batch * tiles_per_batch, [&](std::int64_t tile) {
    const std::int64_t bi = tile / tiles_per_batch, jb = tile % tiles_per_batch / m_blocks, ib = tile % m_blocks;
    Finisher f(c, in, s, p, sliced, r);
    for (std::int64_t i = ib * row_block; i < std::min(g.m, (ib + 1) * row_block); ++i)
      for (std::int64_t j = jb * col_block; j < std::min(g.n, (jb + 1) * col_block); ++j) f.element(bi, i, j);
  }, threads);
}

}  // namespace

GemmReference gemm_reference(const Case& c, const std::map<std::string, Tensor>& inputs,
                             unsigned threads, const SlicedPath* sliced_path) {
  if (c.op != Op::Gemm) throw InputError("gemm reference: case.op is not gemm");
  const ReferenceFpEnv env;  // whatever a kernel left set; parallel_for's threads inherit it
  const Operands in(c, inputs);
  const Scalars s(c);
  const GemmShape& g = c.gemm;
  GemmReference r = sized_reference(c);
  Packed packed(in);
  const double terms = static_cast<double>(g.batch) * g.m * g.n * static_cast<double>(g.k);
  // A thread per 2^17 product terms at least: small cases run on the calling thread.
  threads = threads_for(terms, 0x1p17, threads);
  std::optional<Phase> phase(std::in_place, "reference.pack");
  pack(c, in, packed, threads);
  std::string path_name;
  sliced_path = choose_path(sliced_path, packed.fast, terms, path_name);
  phase.emplace("reference.sliced");
  const std::vector<SlicedDots> sliced = sliced_dots(sliced_path, path_name, packed, g, r);
  phase.emplace("reference.prepare");
  prepare_operands(sliced, g, packed, threads);
  phase.emplace("reference.finish");
  finish(c, in, s, packed, sliced, r, threads);
  return r;
}

}  // namespace ulpgate
