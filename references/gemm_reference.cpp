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
  if (mpfr_cmpabs_ui(t, limit) > 0) {
    // Beyond the limit d (t > 0) or gelu(t) (t < 0) is below 2^-(2^29): under MPFR's
    // exponent range, and far below any bit of t (a sum of products of formats' values).
    if (positive) return just_below(ts);
    RefValue r;
    r.kind = RefValue::Kind::Finite;
    r.negative = true;
    r.inexact = true;
    r.exponent = -(1 << 30);
    r.sig_hi = std::uint64_t{1} << 63;
    return r;
  }
  for (mpfr_prec_t p = 256; p <= (1 << 20); p *= 2) {
    Mpfr x(p), v(p), w(p);
    // v = d (t > 0) or gelu(t) (t < 0), times scale_d.
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
    // gelu(t) is transcendental for t != 0, never a 128-bit number: once the error
    // interval fits between two of them, the truncation is decided.
    if (!positive) {
      if (mpfr_can_round(v, p - 64, MPFR_RNDN, MPFR_RNDZ, 128)) return RefValue::from_certified(v);
      continue;
    }
    // gelu(t) scale_d = ts - d with v = d (1 + e), |e| < 2^(64 - P).
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
      continue;
    }
    // Here ts - v needs at most gap + P + 2 bits beyond v's error: rounding it costs one
    // more 2^(EXP(v) + 64 - P) at most.
    Mpfr y(static_cast<mpfr_prec_t>(std::max<long>(gap, 0) + p + 2));
    mpfr_sub(y, ts, v, MPFR_RNDN);
    const long err = static_cast<long>(mpfr_get_exp(y)) - (static_cast<long>(mpfr_get_exp(v)) + 65 - p);
    if (mpfr_can_round(y, err, MPFR_RNDN, MPFR_RNDZ, 128)) return RefValue::from_certified(y);
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

GemmReference gemm_reference(const Case& c, const std::map<std::string, Tensor>& inputs,
                             unsigned threads, const SlicedPath* sliced_path) {
  if (c.op != Op::Gemm) throw InputError("gemm reference: case.op is not gemm");
  const ReferenceFpEnv env;  // whatever a kernel left set; parallel_for's threads inherit it
  const GemmShape& g = c.gemm;
  const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), cv = gemm_view(c, "C");
  const Tensor& a = input(inputs, c, "A", av.elements());
  const Tensor& b = input(inputs, c, "B", bv.elements());
  const bool with_c = c.beta != 0.0, with_bias = has_bias(c.epilogue);
  const Tensor* ct = with_c ? &input(inputs, c, "C", cv.elements()) : nullptr;
  const Tensor* bias = with_bias ? &input(inputs, c, "bias", g.n) : nullptr;
  const Act act = activation_of(c.epilogue);

  // alpha * scale_A * scale_B and beta * scale_C, exactly.
  Mpfr alpha_ab(3 * 53), beta_c(2 * 53);
  mpfr_set_d(alpha_ab, c.alpha, MPFR_RNDN);
  mpfr_mul_d(alpha_ab, alpha_ab, scale_of(c, "A"), MPFR_RNDN);
  mpfr_mul_d(alpha_ab, alpha_ab, scale_of(c, "B"), MPFR_RNDN);
  mpfr_set_d(beta_c, c.beta, MPFR_RNDN);
  mpfr_mul_d(beta_c, beta_c, scale_of(c, "C"), MPFR_RNDN);
  const double scale_d = scale_of(c, "D");
  const double beta_c_double = mpfr_get_d(beta_c, MPFR_RNDN);
  const bool beta_c_exact = mpfr_cmp_d(beta_c, beta_c_double) == 0;
  // When the dot product enters scaled by a power of two (alpha sA sB = +-2^e: alpha 1, 0.5,
  // -1, 2 ...) and unactivated (or only through ReLU), C and bias divided by that power can
  // join the exact sum, which is then scaled: no MPFR per element. A zero sum takes the
  // MPFR path when the power is not 1 (the sign rules of a zero are the terms' there).
  const double alpha_double = mpfr_get_d(alpha_ab, MPFR_RNDN);
  int alpha_exp = 0;
  const bool alpha_pow2 = mpfr_cmp_d(alpha_ab, alpha_double) == 0 && alpha_double != 0.0 &&
                          std::fabs(std::frexp(alpha_double, &alpha_exp)) == 0.5;
  --alpha_exp;  // |alpha sA sB| = 2^alpha_exp
  const bool alpha_one = alpha_double == 1.0 && mpfr_cmp_ui(alpha_ab, 1) == 0;
  const bool fold_epilogue = alpha_pow2 && scale_d == 1.0 && (act == Act::None || act == Act::Relu) && beta_c_exact;
  const double alpha_abs = std::fabs(alpha_double);
  // BLAS semantics: alpha = 0 does not reference A and B (D = beta C + bias), even where
  // their product is NaN or Inf.
  const bool drop_product = c.alpha == 0.0;

  GemmReference r;
  r.batch = g.batch, r.m = g.m, r.n = g.n;
  r.d_format = c.types.count("D") ? c.types.at("D") : Format::FP32;
  const std::int64_t total = g.batch * g.m * g.n, k = g.k;
  r.values.resize(static_cast<std::size_t>(total));
  r.condition.resize(static_cast<std::size_t>(total));
  r.magnitude.resize(static_cast<std::size_t>(total));
  r.intermediate.resize(static_cast<std::size_t>(total));

  // op(A) rows and op(B) columns packed contiguously: every dot product reads two
  // streams. Formats up to FP32 are exact as float; FP64 operands stay double.
  const bool fast = a.format() != Format::FP64 && b.format() != Format::FP64;
  UninitVector<float> a_rows, b_cols;  // written in full by the packing below
  UninitVector<double> a_rows64, b_cols64;
  std::vector<Operand> a_ops, b_ops;
  if (fast) {
    a_rows.resize(static_cast<std::size_t>(g.batch * g.m * k));
    b_cols.resize(static_cast<std::size_t>(g.batch * g.n * k));
    a_ops.resize(static_cast<std::size_t>(g.batch * g.m));
    b_ops.resize(static_cast<std::size_t>(g.batch * g.n));
  } else {
    a_rows64.resize(static_cast<std::size_t>(g.batch * g.m * k));
    b_cols64.resize(static_cast<std::size_t>(g.batch * g.n * k));
  }
  // A thread per 2^17 product terms at least: small cases run on the calling thread.
  threads = threads_for(static_cast<double>(g.batch) * g.m * g.n * static_cast<double>(k), 0x1p17, threads);
  std::optional<Phase> phase(std::in_place, "reference.pack");
  parallel_for(g.batch * (g.m + g.n), [&](std::int64_t row) {
    const bool is_a = row < g.batch * g.m;
    const std::int64_t r2 = is_a ? row : row - g.batch * g.m;
    const std::int64_t bi = is_a ? r2 / g.m : r2 / g.n, i = is_a ? r2 % g.m : r2 % g.n;
    if (fast) {  // a strided run of storage words (offsets are affine in kk)
      const auto at = [&](std::int64_t kk) { return is_a ? op_a_offset(c, av, bi, i, kk) : op_b_offset(c, bv, bi, kk, i); };
      const std::int64_t first = k > 0 ? at(0) : 0, step = k > 1 ? at(1) - first : 1;
      const Tensor& t = is_a ? a : b;
      decode_floats(t.format(), t.data(), first, step, k, (is_a ? a_rows : b_cols).data() + r2 * k);
      return;
    }
    for (std::int64_t kk = 0; kk < k; ++kk)
      (is_a ? a_rows64 : b_cols64)[static_cast<std::size_t>(r2 * k + kk)] =
          is_a ? a.value(op_a_offset(c, av, bi, i, kk)) : b.value(op_b_offset(c, bv, bi, kk, i));
  }, threads);

  // The sliced path: every batch's dot products from the digits (certified, or recomputed
  // by the tiles below, which run the superaccumulator on the elements not certified).
  const double terms = static_cast<double>(g.batch) * g.m * g.n * static_cast<double>(k);
  std::string path_name = sliced_path ? "sliced" : "";
  if (!sliced_path && fast) {
    const ReferencePath want = reference_path();
    if (want == ReferencePath::Gpu || (want == ReferencePath::Auto && terms >= kGpuReferenceTerms)) {
      sliced_path = gpu_path();
      if (!sliced_path && want == ReferencePath::Gpu) throw InputError("--reference gpu: no CUDA device here");
      path_name = "gpu";
    }
  }
  std::vector<SlicedDots> sliced;
  phase.emplace("reference.sliced");
  if (sliced_path && fast) {
    r.recomputed = 0;
    r.path = path_name;
    const auto mk = static_cast<std::size_t>(g.m * k), nk = static_cast<std::size_t>(g.n * k);
    try {
      for (std::int64_t bi = 0; bi < g.batch; ++bi) {
        sliced.push_back((*sliced_path)(std::span<const float>(a_rows).subspan(bi * mk, mk), g.m,
                                        std::span<const float>(b_cols).subspan(bi * nk, nk), g.n, k));
        r.recomputed += sliced.back().recomputed;
      }
    } catch (const std::runtime_error& e) {
      if (reference_path() != ReferencePath::Auto || path_name != "gpu") throw;
      std::fprintf(stderr, "ulpgate: GPU exact reference failed (%s); this case's reference runs on the CPU\n", e.what());
      sliced.clear();
      r.recomputed = -1, r.path = "cpu";
    }
  }

  // Prepared operands for the superaccumulator: every row and column, or with the sliced
  // path only those of elements the digits did not certify (preparing all of them would
  // cost as much as the GPU's whole product at large K).
  phase.emplace("reference.prepare");
  if (fast) {
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
      const auto* base = (is_a ? a_rows.data() : b_cols.data()) + r2 * static_cast<std::size_t>(k);
      (is_a ? a_ops : b_ops)[r2] = Operand(std::span<const float>(base, static_cast<std::size_t>(k)));
    }, threads);
  }

  // Tiles of 8 rows x col_block columns, so that a tile's B columns (about 256 KB) stay in
  // the core's L2 while its rows use them; consecutive tiles share their columns, which the
  // threads taking them in turn then find in L3.
  phase.emplace("reference.finish");
  const std::int64_t row_block = 8, m_blocks = (g.m + row_block - 1) / row_block;
  const std::int64_t col_block = std::clamp<std::int64_t>((std::int64_t{1} << 16) / std::max<std::int64_t>(k, 1), 8, 256);
  const std::int64_t n_blocks = (g.n + col_block - 1) / col_block, tiles_per_batch = m_blocks * n_blocks;
  parallel_for(g.batch * tiles_per_batch, [&](std::int64_t tile) {
    const std::int64_t bi = tile / tiles_per_batch, jb = tile % tiles_per_batch / m_blocks, ib = tile % m_blocks;
    ExactAccumulator acc;
    MpfrOracle oracle;
    Mpfr dot(2), t(2), scaled(2), beta_term(3 * 53), bias_term(53);
    for (std::int64_t i = ib * row_block; i < std::min(g.m, (ib + 1) * row_block); ++i)
    for (std::int64_t j = jb * col_block; j < std::min(g.n, (jb + 1) * col_block); ++j) {
      const std::int64_t idx = r.index(bi, i, j);
      const auto ai = static_cast<std::size_t>(bi * g.m + i), bj = static_cast<std::size_t>(bi * g.n + j);
      const double cval = with_c ? ct->value(cv.offset(bi, i, j)) : 0.0;
      const double bval = with_bias ? bias->value(j) : 0.0;
      double condition = 0.0, finite_condition = -1.0;
      bool done = false;
      bool dot_negative_down = false;  // the sign of a zero dot product rounding down
      // The exact dot product into acc: the digits' pieces where they certify it.
      const SlicedDots* sd = sliced.empty() ? nullptr : &sliced[static_cast<std::size_t>(bi)];
      const bool certified = sd && sd->certified[sd->index(i, j)];
      const auto add_dot = [&] {
        if (certified) {
          for (const double piece : sd->pieces(i, j))
            if (piece != 0.0) acc.add(piece);
        } else {
          acc.add_products(a_ops[ai], b_ops[bj]);
        }
      };
      if (certified && fold_epilogue && !with_c && !with_bias) {
        // The digits' value itself (nonzero: certification needs S != 0), scaled by the
        // power of two as below: no accumulator (most of a large sweep point's finishing).
        RefValue v = sd->value(i, j);
        if (!alpha_one) {
          v.exponent += alpha_exp;
          if (alpha_double < 0) v.negative = !v.negative;
        }
        r.values[idx] = act == Act::Relu ? relu(v) : v;
        condition = sd->condition[sd->index(i, j)];
        done = true;
      } else if (fast) {
        acc.clear();
        add_dot();
        condition = certified ? sd->condition[sd->index(i, j)] : acc.magnitude().to_double();
        if (fold_epilogue) {
          // beta sC c joins the sum only if it is an exact double (FMA residual zero, and
          // far enough from underflow that the residual itself is exact), and it and the
          // bias only if dividing them by the power of two is exact (a normal result).
          const double bc = beta_c_double * cval;
          const bool bc_exact = !with_c || (std::isfinite(bc) && (bc == 0.0 ? (beta_c_double == 0.0 || cval == 0.0)
                                                         : std::fabs(bc) >= 0x1p-969 &&
                                                               std::fma(beta_c_double, cval, -bc) == 0.0));
          const auto unscaled = [&](double v, double& out) {
            out = alpha_one ? v : std::ldexp(v, -alpha_exp) * (alpha_double < 0 ? -1.0 : 1.0);
            // exact unless the quotient leaves the normal range (rounded there, or Inf)
            return alpha_one || !std::isfinite(v) || v == 0.0 || (std::isfinite(out) && std::fabs(out) >= DBL_MIN);
          };
          double tc = 0.0, tb = 0.0;
          if (bc_exact && (!with_c || unscaled(bc, tc)) && (!with_bias || unscaled(bval, tb))) {
            if (with_c) acc.add(tc);
            if (with_bias) acc.add(tb);
            RefValue v = acc.value();
            if (!alpha_one) {
              if (v.kind == RefValue::Kind::Finite) v.exponent += alpha_exp;
              if (alpha_double < 0 && (v.kind == RefValue::Kind::Finite || v.kind == RefValue::Kind::Inf)) v.negative = !v.negative;
            }
            if (alpha_one || v.kind != RefValue::Kind::Zero) {
              r.values[idx] = act == Act::Relu ? relu(v) : v;
              done = true;
            } else {  // a zero: the MPFR path below, on the dot product alone
              acc.clear();
              add_dot();
            }
          }
        }
        if (!done) {
          acc.exact_value(dot);
          dot_negative_down = acc.value().negative_down;
        }
      } else {
        std::span<const double> x(&a_rows64[static_cast<std::size_t>((bi * g.m + i) * k)], k),
            y(&b_cols64[static_cast<std::size_t>((bi * g.n + j) * k)], k);
        oracle.dot(dot, x, y);
        if (mpfr_zero_p(dot)) {
          oracle.dot(t, x, y, MPFR_RNDD);
          dot_negative_down = mpfr_signbit(t) != 0;
        }
        std::vector<double> ax(x.begin(), x.end()), ay(y.begin(), y.end());
        for (auto& v : ax) v = std::fabs(v);
        for (auto& v : ay) v = std::fabs(v);
        oracle.dot(t, ax, ay);
        condition = mpfr_get_d(t, MPFR_RNDN);
        if (!std::isfinite(condition)) {  // NaN/Inf inputs: the intermediate bound is over the finite terms
          for (std::size_t q = 0; q < ax.size(); ++q)
            if (!std::isfinite(ax[q]) || !std::isfinite(ay[q])) ax[q] = ay[q] = 0.0;
          oracle.dot(t, ax, ay);
          finite_condition = mpfr_get_d(t, MPFR_RNDN);
        }
      }
      if (!done) {
        std::vector<mpfr_ptr> terms;
        if (!drop_product) {  // BLAS: alpha = 0 adds no product, not even a +0
          mpfr_set_prec(scaled, mpfr_get_prec(dot) + 3 * 53);
          mpfr_mul(scaled, alpha_ab, dot, MPFR_RNDN);  // exact
          terms.push_back(scaled);
        }
        if (with_c) {
          mpfr_mul_d(beta_term, beta_c, cval, MPFR_RNDN);  // exact: 106 + 53 bits
          terms.push_back(beta_term);
        }
        if (with_bias) {
          mpfr_set_d(bias_term, bval, MPFR_RNDN);
          terms.push_back(bias_term);
        }
        exact_sum(t, terms, MPFR_RNDN);
        r.values[idx] = apply_activation(c.epilogue, t, scale_d);
        if (r.values[idx].kind == RefValue::Kind::Zero && act != Act::Relu) {
          // The same sum's sign rounding down, from the dot product's; it goes through
          // scale_D and GELU (gelu(+-0) = +-0) as the sign rounding to nearest does.
          if (!drop_product && mpfr_zero_p(dot))
            mpfr_setsign(scaled, scaled, dot_negative_down != (mpfr_sgn(alpha_ab.get()) < 0), MPFR_RNDN);
          Mpfr down(2);
          exact_sum(down, terms, MPFR_RNDD);
          r.values[idx].negative_down = (mpfr_signbit(down) != 0) != (scale_d < 0);
        }
      }
      r.condition[idx] = condition;
      const double pre = alpha_abs * condition + std::fabs(beta_c_double * cval) + std::fabs(bval);
      r.magnitude[idx] = scale_d * pre;
      const double cf = finite_condition < 0 ? condition : finite_condition;
      const auto finite_abs = [](double v) { return std::isfinite(v) ? std::fabs(v) : 0.0; };
      r.intermediate[idx] = std::max(cf, alpha_abs * cf + finite_abs(beta_c_double * cval) + finite_abs(bval));
      // A kernel that multiplies by alpha = 0 anyway meets the NaN or Inf of the product.
      if (drop_product && !std::isfinite(condition)) r.intermediate[idx] = INFINITY;
    }
  }, threads);
  return r;
}

}  // namespace ulpgate
