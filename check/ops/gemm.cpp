#include "check/ops/gemm.hpp"

#include "kernels/emulated/gemm_models.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/profile.hpp"
#include "distributions/case_gen.hpp"
#include "references/gemm_reference.hpp"

namespace ulpgate {
namespace {

const std::vector<std::string> kGemmDtypes = {"fp32", "tf32", "fp16", "bf16", "e4m3", "e5m2", "fp64"};

}  // namespace

Case transposed_gemm_case(const Case& c) {
  Case t = c;
  auto& g = t.gemm;
  g.layout = c.gemm.layout == Layout::RowMajor ? Layout::ColMajor : Layout::RowMajor;
  g.m = c.gemm.n, g.n = c.gemm.m;
  g.trans_a = c.gemm.trans_b, g.trans_b = c.gemm.trans_a;
  g.lda = gemm_view(c, "B").ld, g.ldb = gemm_view(c, "A").ld;
  g.ldc = c.beta != 0 ? gemm_view(c, "C").ld : 0;
  g.ldd = gemm_view(c, "D").ld;
  std::swap(t.types["A"], t.types["B"]);
  if (c.scales.count("A") || c.scales.count("B")) {
    const double sa = c.scales.count("A") ? c.scales.at("A") : 1.0, sb = c.scales.count("B") ? c.scales.at("B") : 1.0;
    t.scales["A"] = sb, t.scales["B"] = sa;
  }
  t.dist.clear();  // the inputs are given, not drawn
  return t;
}

namespace {

// Whether doubling A keeps every value, product and sum away from underflow and overflow,
// so that a kernel whose operations all round the same way at any scale (floating point
// without subnormals or overflow) must double D exactly. The products are checked with and
// without the scales and alpha (a kernel may apply them to each product or to the sum);
// sums of normal numbers that fall below the normal range are exact, so only the top needs
// a bound: K times the largest product. A must be normal too (in its format): rounding a
// subnormal keeps its absolute unit, so where the kernel rounds its inputs (TF32 compute)
// round(2a) need not be 2 round(a) (a = 2^-137 + 2^-149 rounds to 2^-136 in TF32, and so
// does 2a), and a unit that aligns its products on the inputs' exponents without
// normalising a subnormal's significand (the H200's FP16 tensor cores through cuBLAS: D(2A)
// != 2 D(A) with subnormal A, within the tolerance) truncates 2a b on the grid of a b.
bool scaling_applies(const Case& c, const Inputs& in) {
  if (c.beta != 0 || has_bias(c.epilogue) || !(c.epilogue == Epilogue::None || c.epilogue == Epilogue::Relu)) return false;
  double lo[2] = {INFINITY, INFINITY}, hi[2] = {0, 0};
  int i = 0;
  for (const char* op : {"A", "B"}) {
    const Tensor& t = in.at(op);
    const MatrixView v = gemm_view(c, op);
    const double max = info(t.format()).max_finite();
    const double min_a = i == 0 ? info(t.format()).min_normal() : 0.0;
    for (std::size_t e = 0; e < t.size(); ++e) {
      if (v.is_padding(static_cast<std::int64_t>(e))) continue;
      const double x = std::fabs(t.value(e));
      if (!std::isfinite(x) || 2 * x > max || (x != 0 && x < min_a)) return false;
      if (x != 0) lo[i] = std::min(lo[i], x), hi[i] = std::max(hi[i], x);
    }
    ++i;
  }
  if (hi[0] == 0 || hi[1] == 0) return true;  // D = 0 either way
  const auto scale = [&](const char* op) { return c.scales.count(op) ? c.scales.at(op) : 1.0; };
  const double s = std::fabs(c.alpha) * scale("A") * scale("B");
  const Format compute = c.types.at("compute") == Format::TF32 ? Format::FP32 : c.types.at("compute");
  const double tiny = 0x1p24 * info(compute).min_normal(), big = info(compute).max_finite() / 4;
  const double pmin = lo[0] * lo[1] * std::min(1.0, s), pmax = 2 * hi[0] * hi[1] * std::max(1.0, s);
  return pmin >= tiny && pmax * static_cast<double>(c.gemm.k) <= big;
}

// A kernel that rounds its inputs to input_bits (TF32 tensor cores: 11) carries an input
// at or above that precision's overflow threshold, (2 - 2^-p) 2^emax, to Inf (rounding to
// nearest): every D element whose row of op(A) or column of op(B) holds one may then be
// non-finite, so its intermediate bound is +Inf (see OutputComparison::accumulated).
void mark_input_rounding_overflow(const Case& c, const Inputs& inputs, int input_bits, OutputComparison& cmp) {
  const GemmShape& g = c.gemm;
  const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B");
  const Tensor &a = inputs.at("A"), &b = inputs.at("B");
  const auto threshold = [&](const Tensor& t) { return std::ldexp(2.0 - std::ldexp(1.0, -input_bits), info(t.format()).emax()); };
  const double limit_a = threshold(a), limit_b = threshold(b);
  const auto over = [](const Tensor& t, std::int64_t off, double limit) {
    const double v = std::fabs(t.value(off));
    return std::isfinite(v) && v >= limit;
  };
  const unsigned threads = threads_for(static_cast<double>(g.m + g.n) * static_cast<double>(g.k), 0x1p16);
  for (std::int64_t bi = 0; bi < g.batch; ++bi) {
    std::vector<char> row(static_cast<std::size_t>(g.m), 0), col(static_cast<std::size_t>(g.n), 0);
    parallel_for(g.m + g.n, [&](std::int64_t r) {
      const bool is_a = r < g.m;
      for (std::int64_t k = 0; k < g.k; ++k)
        if (is_a ? over(a, op_a_offset(c, av, bi, r, k), limit_a) : over(b, op_b_offset(c, bv, bi, k, r - g.m), limit_b)) {
          (is_a ? row[static_cast<std::size_t>(r)] : col[static_cast<std::size_t>(r - g.m)]) = 1;
          break;
        }
    }, threads);
    if (std::find(row.begin(), row.end(), 1) == row.end() && std::find(col.begin(), col.end(), 1) == col.end()) continue;
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j)
        if (row[i] || col[j]) cmp.accumulated[static_cast<std::size_t>((bi * g.m + i) * g.n + j)] = INFINITY;
  }
}

// a_e of ToleranceModel (check/analyze.hpp) for a kernel that rounds its inputs to
// input_bits: per D element, sum_k eta_in (1 + u_in) (s_a |b| + s_b |a|) + s_a s_b eta_in^2
// over op(A)[b][i][k] = a and op(B)[b][k][j] = b, where s_v = 1 for an input below the
// normal range of the rounding (|v| < 2^emin) that is not a multiple of eta_in = 2^(emin +
// 1 - input_bits), each operand with its format's emin; scaled as the condition term.
// Empty when no input is such a subnormal (the usual case: no O(M N K) pass).
std::vector<double> input_rounding_abs(const Case& c, const Inputs& inputs, int input_bits) {
  const GemmShape& g = c.gemm;
  const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B");
  const Tensor &a = inputs.at("A"), &b = inputs.at("B");
  const auto eta_of = [&](const Tensor& t) { return std::ldexp(1.0, info(t.format()).emin() + 1 - input_bits); };
  const double eta_a = eta_of(a), eta_b = eta_of(b), u_in = std::ldexp(1.0, 1 - input_bits);
  const auto rounds_absolutely = [](double v, double eta, double min_normal) {
    return std::isfinite(v) && std::fabs(v) < min_normal && std::fmod(std::fabs(v), eta) != 0;  // fmod: exact
  };
  // op(A) rows and op(B) columns as |value|, and which of them round absolutely.
  const std::int64_t M = g.m, N = g.n, K = g.k;
  std::vector<double> ar, bc;  // sized when needed
  std::vector<char> as, bs;
  const double sa = c.scales.count("A") ? c.scales.at("A") : 1.0, sb = c.scales.count("B") ? c.scales.at("B") : 1.0;
  const double sd = c.scales.count("D") ? c.scales.at("D") : 1.0;
  const double scale = std::fabs(c.alpha * sa * sb * sd);
  std::vector<double> out;
  const unsigned threads = threads_for(static_cast<double>(M + N) * static_cast<double>(K), 0x1p16);
  const double min_a = info(a.format()).min_normal(), min_b = info(b.format()).min_normal();
  for (std::int64_t bi = 0; bi < g.batch; ++bi) {
    // Usually no input rounds absolutely: then nothing is copied and no O(M N K) pass runs.
    std::atomic<bool> any{false};
    parallel_for(M + N, [&](std::int64_t r) {
      const bool is_a = r < M;
      for (std::int64_t k = 0; k < K && !any.load(std::memory_order_relaxed); ++k)
        if (is_a ? rounds_absolutely(a.value(op_a_offset(c, av, bi, r, k)), eta_a, min_a)
                 : rounds_absolutely(b.value(op_b_offset(c, bv, bi, k, r - M)), eta_b, min_b))
          any = true;
    }, threads);
    if (!any || scale == 0) continue;
    if (ar.empty()) ar.resize(M * K), bc.resize(N * K), as.resize(M * K), bs.resize(N * K);
    parallel_for(M + N, [&](std::int64_t r) {
      const bool is_a = r < M;
      const std::int64_t i = is_a ? r : r - M;
      for (std::int64_t k = 0; k < K; ++k) {
        const double v = is_a ? a.value(op_a_offset(c, av, bi, i, k)) : b.value(op_b_offset(c, bv, bi, k, i));
        (is_a ? ar : bc)[i * K + k] = std::isfinite(v) ? std::fabs(v) : 0.0;
        (is_a ? as : bs)[i * K + k] = is_a ? rounds_absolutely(v, eta_a, min_a) : rounds_absolutely(v, eta_b, min_b);
      }
    }, threads);
    if (out.empty()) out.assign(static_cast<std::size_t>(g.batch * M * N), 0.0);
    parallel_for(M, [&](std::int64_t i) {
      for (std::int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (std::int64_t k = 0; k < K; ++k) {
          const double x = ar[i * K + k], y = bc[j * K + k];
          const bool ta = as[i * K + k], tb = bs[j * K + k];
          if (ta) s += eta_a * (1 + u_in) * y;
          if (tb) s += eta_b * (1 + u_in) * x;
          if (ta && tb) s += eta_a * eta_b;
        }
        out[static_cast<std::size_t>((bi * M + i) * N + j)] = scale * s;
      }
    }, threads_for(static_cast<double>(M) * N * K, 0x1p16));
  }
  return out;
}

// s_e of the precision rule (check/analyze.hpp) for every element of D, in D's units:
// from the products p_k = op(A)_ik op(B)_kj and the sequential partial sums s_k (in
// double: the scale needs no more than a few correct bits), u = 2^-bits,
//   max(u sqrt(sum_k (s_k^2 + p_k^2) / 3), |seq - sum_k p_k|) [+ u |sum_k (s_k + p_k)| unless tol.nearest]
// (seq: the sum accumulated sequentially, rounded to nearest at `bits` after each term).
// A kernel that promotes (tol.promote) sums chunks of that many products: s_k restarts at
// each chunk, seq rounds each chunk's sum to FP32 as it adds it, and 2^-24 sum_c |S_c|
// (S_c the exact sum up to the end of chunk c) joins for FP32's roundings.
// and, where the kernel rounds its inputs to u_in = 2^-input_bits (two roundings per
// product), u_in sqrt(2 sum_k p_k^2 / 3) [+ 2 u_in |sum_k p_k| where the declared input
// rounding is directed], all times |alpha sA sB sD|, plus (K + 4) eta_acc sD and the input
// rounding's absolute part.
// The bias test's terms (OutputComparison::bias_*) come from the same pass: the allowance is
// the systematic part of the scale (|seq - sum|, the round-toward-zero and promotion terms,
// the absolute part), the spread its random part u sqrt(sum_k (s_k^2 + p_k^2) / 3), and the
// shift sum_k (a'_k b'_k - a_k b_k) with a', b' rounded as declared, exact to a few units of
// FP64 (each difference is exact; the sum's error is far below FP32's), times alpha sA sB sD.
// The sample's columns of op(B) go 64 at a time, k-major, so the inner loop runs over them
// (vectorised).
// precision_terms_of's constants for one case and tolerance.
struct PrecisionPlan {
  double u;        // the accumulator's unit roundoff
  // Veltkamp's split: c = v (2^(53 - bits) + 1), c - (c - v) is v rounded to nearest at
  // `bits` bits (branch-free; exponent range ignored, as by the scale's other terms).
  double split, split24 = 0x1p29 + 1;
  bool promoting;  // the kernel promotes its narrow accumulator every `chunk` products to FP32
  std::int64_t chunk;
  double ui;       // the declared input rounding's unit (0: none)
  bool directed_inputs;
  bool nearest;
  double scale;    // |alpha sA sB sD|
  double shift_scale;  // alpha sA sB sD
  double floor;    // the absolute part: K + 4 times the accumulator's eta
  // Where alpha acc + beta C may be rounded to D's format before the bias (the admitted
  // epilogue rounding, ToleranceModel::epilogue_rounding): that rounding's error,
  // epilogue_rounding |alpha sA sB acc + beta sC c| |sD|, joins the scale, and its random
  // spread (that over sqrt 3, uniform rounding) the bias test's.
  double epilogue_rounding, alpha_sab, beta_sc, sd_abs;

  PrecisionPlan(const Case& c, const ToleranceModel& tol) {
    const std::int64_t K = c.gemm.k;
    u = std::ldexp(1.0, -tol.accumulator_bits);
    split = std::ldexp(1.0, 53 - std::min(tol.accumulator_bits, 53)) + 1;
    promoting = tol.promote > 0 && tol.accumulator_bits < 24 && tol.promote < K;
    chunk = promoting ? tol.promote : std::max<std::int64_t>(K, 1);
    ui = tol.input_bits > 0 ? std::ldexp(1.0, -tol.input_bits) : 0.0;
    directed_inputs = tol.input_bits > 0 && tol.input_rounding != Rounding::NearestEven &&
                      tol.input_rounding != Rounding::NearestAway;
    nearest = tol.nearest;
    const auto scale_of = [&](const char* op) { return c.scales.count(op) ? c.scales.at(op) : 1.0; };
    const double sd = scale_of("D");
    shift_scale = c.alpha * scale_of("A") * scale_of("B") * sd;
    scale = std::fabs(shift_scale);
    floor = static_cast<double>(K + 4) * tol.accumulator_eta * std::max(1.0, sd);
    epilogue_rounding = tol.epilogue_rounding;
    alpha_sab = c.alpha * scale_of("A") * scale_of("B");
    beta_sc = c.beta * scale_of("C");
    sd_abs = std::fabs(sd);
  }
};

constexpr std::int64_t kTile = 64;  // columns of op(B) at a time, the inner (vectorised) loop

// The sums of one row of op(A) against up to kTile columns of op(B). part, pseq: the
// running sum of the current promotion chunk (the whole sum when the kernel does not
// promote), exactly and rounded at `bits`; seq, outer: the FP32 accumulator the chunks are
// added to, and the sum of its magnitudes; delta: sum_k (a'_k b'_k - a_k b_k), a' b' the
// declared input rounding's.
struct TileSums {
  double sum[kTile] = {}, sq[kTile] = {}, lin[kTile] = {}, pp[kTile] = {}, seq[kTile] = {}, part[kTile] = {},
         pseq[kTile] = {}, outer[kTile] = {}, delta[kTile] = {};
};

// ar, ar_in: the row (and its declared rounding, or empty); bk, bk_in: the sample's columns,
// bk[k * C + col]; the tile is columns [j0, j0 + w).
void accumulate_tile(const PrecisionPlan& pl, const std::vector<double>& ar, const std::vector<double>& ar_in,
                     const std::vector<double>& bk, const std::vector<double>& bk_in, std::int64_t C, std::int64_t j0,
                     std::int64_t w, TileSums& t) {
  const auto K = static_cast<std::int64_t>(ar.size());
  if (!ar_in.empty())
    for (std::int64_t k = 0; k < K; ++k) {
      const double x = ar[k], xi = ar_in[k];
      const double *y = &bk[k * C + j0], *yi = &bk_in[k * C + j0];
      for (std::int64_t jj = 0; jj < w; ++jj) t.delta[jj] += xi * yi[jj] - x * y[jj];
    }
  for (std::int64_t k0 = 0; k0 < K; k0 += pl.chunk) {
    for (std::int64_t k = k0; k < std::min(K, k0 + pl.chunk); ++k) {
      const double x = ar[k];
      if (x == 0) continue;  // adds exact zeros: no rounding
      const double* y = &bk[k * C + j0];
      for (std::int64_t jj = 0; jj < w; ++jj) {
        const double p = x * y[jj];
        t.sum[jj] += p;
        t.part[jj] += p;
        t.sq[jj] += t.part[jj] * t.part[jj] + p * p;
        t.lin[jj] += t.part[jj] + p;
        t.pp[jj] += p * p;
        const double s = t.pseq[jj] + p, v = pl.split * s;
        t.pseq[jj] = v - (v - s);
      }
    }
    if (pl.promoting)
      for (std::int64_t jj = 0; jj < w; ++jj) {
        const double s = t.seq[jj] + t.pseq[jj], v = pl.split24 * s;
        t.seq[jj] = v - (v - s), t.outer[jj] += std::fabs(t.sum[jj]), t.part[jj] = t.pseq[jj] = 0;
      }
  }
  if (!pl.promoting)
    for (std::int64_t jj = 0; jj < w; ++jj) t.seq[jj] = t.pseq[jj];
}

// One element's scale and bias terms from its tile sums (column jj of the tile).
struct ElementTerms {
  double scale, allowance, spread, shift;
};

// c_value: the element's C (0 without beta C).
ElementTerms element_terms(const PrecisionPlan& pl, const TileSums& t, std::int64_t jj, double abs_part, double c_value) {
  // The random model's sigma, or the error a sequential round-to-nearest accumulation at
  // this precision really makes on these inputs where that is larger: on heavy-tailed
  // positive data small terms are absorbed one-sidedly (the model's independence fails),
  // and a correct kernel may do just that.
  const double sigma = pl.u * std::sqrt(t.sq[jj] / 3), absorbed = std::fabs(t.seq[jj] - t.sum[jj]);
  // A systematic error a correct accumulation of the declared arithmetic can make: the
  // sequential one's (absorption), round-toward-zero's, FP32's promotions.
  double systematic = absorbed;
  if (!pl.nearest) systematic += pl.u * std::fabs(t.lin[jj]);
  if (pl.promoting) systematic += 0x1p-24 * t.outer[jj];  // FP32's rounding of each chunk's addition
  double acc = std::max(sigma, absorbed) + (systematic - absorbed);
  if (pl.ui > 0) acc += pl.ui * std::sqrt(2 * t.pp[jj] / 3) + (pl.directed_inputs ? 2 * pl.ui * std::fabs(t.sum[jj]) : 0.0);
  const double pre_rounding =
      pl.epilogue_rounding > 0
          ? pl.epilogue_rounding * pl.sd_abs * std::fabs(pl.alpha_sab * t.sum[jj] + pl.beta_sc * c_value)
          : 0.0;
  return {pl.scale * acc + abs_part + pre_rounding, pl.scale * systematic + abs_part,
          pl.scale * sigma + pre_rounding / std::sqrt(3.0), pl.shift_scale * t.delta[jj]};
}

void precision_terms_of(const Case& c, const Inputs& inputs, const ToleranceModel& tol, const PrecisionSample& sample,
                        OutputComparison& cmp) {
  const std::vector<double>& input_abs = cmp.input_abs;
  const GemmShape& g = c.gemm;
  const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B");
  const Tensor &a = inputs.at("A"), &b = inputs.at("B");
  const std::int64_t M = g.m, N = g.n, K = g.k;
  const PrecisionPlan pl(c, tol);
  const auto finite_or_zero = [](double v) { return std::isfinite(v) ? v : 0.0; };
  // C is read only where the epilogue-rounding term needs it; its view is made once.
  const bool reads_c = pl.epilogue_rounding > 0 && c.beta != 0.0;
  const Tensor* c_tensor = reads_c ? &inputs.at("C") : nullptr;
  const MatrixView cv_view = reads_c ? gemm_view(c, "C") : MatrixView{};
  const auto c_value = [&](std::int64_t bi, std::int64_t i, std::int64_t j) {
    return reads_c ? finite_or_zero(c_tensor->value(cv_view.offset(bi, i, j))) : 0.0;
  };
  // elements outside the sample (precision_sample) have no scale: NaN, which the rule skips
  const std::vector<std::int64_t>& rows = sample.rows;
  const std::vector<std::int64_t>& cols = sample.cols;
  const auto C = static_cast<std::int64_t>(cols.size());
  std::vector<double> out(static_cast<std::size_t>(g.batch * M * N), sample.all(g) ? 0.0 : NAN);
  // The bias test's terms (analyze.hpp): the allowance of a correct kernel's systematic
  // error, the spread of its random one, and the shift the declared input rounding makes.
  std::vector<double> allowance(out.size(), NAN), spread(out.size(), 0.0), shift;
  const bool rounds_inputs = tol.input_bits > 0;
  if (rounds_inputs) shift.assign(out.size(), 0.0);
  const Format input_format = tol.input_bits == info(Format::TF32).precision() ? Format::TF32 : Format::FP32;
  const auto rounded_input = [&](double v) {
    return rounds_inputs && std::isfinite(v) ? decode(input_format, encode(input_format, v, tol.input_rounding)) : v;
  };
  std::vector<double> bk(static_cast<std::size_t>(K * C)), bk_in(rounds_inputs ? bk.size() : 0);
  for (std::int64_t bi = 0; bi < g.batch; ++bi) {
    parallel_for(C, [&](std::int64_t col) {
      const std::int64_t j = cols[static_cast<std::size_t>(col)];
      for (std::int64_t k = 0; k < K; ++k) bk[k * C + col] = finite_or_zero(b.value(op_b_offset(c, bv, bi, k, j)));
      if (rounds_inputs)
        for (std::int64_t k = 0; k < K; ++k) bk_in[k * C + col] = finite_or_zero(rounded_input(bk[k * C + col]));
    }, threads_for(static_cast<double>(K) * C, 0x1p15));
    parallel_for(static_cast<std::int64_t>(rows.size()), [&](std::int64_t row) {
      const std::int64_t i = rows[static_cast<std::size_t>(row)];
      std::vector<double> ar(static_cast<std::size_t>(K)), ar_in(rounds_inputs ? ar.size() : 0);
      for (std::int64_t k = 0; k < K; ++k) ar[k] = finite_or_zero(a.value(op_a_offset(c, av, bi, i, k)));
      for (std::size_t k = 0; k < ar_in.size(); ++k) ar_in[k] = finite_or_zero(rounded_input(ar[k]));
      for (std::int64_t j0 = 0; j0 < C; j0 += kTile) {
        const std::int64_t w = std::min(kTile, C - j0);
        TileSums t;
        accumulate_tile(pl, ar, ar_in, bk, bk_in, C, j0, w, t);
        for (std::int64_t jj = 0; jj < w; ++jj) {
          const std::size_t e = static_cast<std::size_t>((bi * M + i) * N + cols[static_cast<std::size_t>(j0 + jj)]);
          const double cv = c_value(bi, i, cols[static_cast<std::size_t>(j0 + jj)]);
          const ElementTerms et = element_terms(pl, t, jj, pl.floor + (input_abs.empty() ? 0.0 : input_abs[e]), cv);
          out[e] = et.scale, allowance[e] = et.allowance, spread[e] = et.spread;
          if (rounds_inputs) shift[e] = et.shift;
        }
      }
    }, threads_for(static_cast<double>(rows.size()) * C * K, 0x1p16));
  }
  cmp.precision_scale = std::move(out);
  cmp.bias_allowance = std::move(allowance);
  cmp.bias_spread = std::move(spread);
  cmp.bias_shift = std::move(shift);
}

// The calibrator's mean normalised error on the same inputs at each precision in `levels`,
// before any output rounding (so that only its accumulation shows): mean over the sample's
// elements of |cal_e - x_e| / c_e (arows: the sample's rows of op(A), row after row; bk: its
// columns of op(B), bk[k * C + col]). Each element is calibration_dot's sum, term by term
// in order; kCalibrationBlock columns at once keep that many independent sums in flight,
// and the levels share the pass over the data.
// GELU's largest slope: Phi(x) + x phi(x) peaks at x = sqrt(2), 1.1289 (its tanh form too).
constexpr double kGeluSlope = 1.13;

constexpr std::int64_t kCalibrationBlock = 16;
std::vector<double> calibration_means(const std::vector<double>& arows, const std::vector<double>& bk,
                                      const PrecisionSample& sample, std::int64_t N, std::int64_t K,
                                      const OutputComparison& cmp, const std::vector<int>& levels) {
  const auto R = static_cast<std::int64_t>(sample.rows.size()), C = static_cast<std::int64_t>(sample.cols.size());
  const auto L = levels.size();
  std::vector<double> err(L * static_cast<std::size_t>(R * C), 0.0);  // err[l * R * C + row * C + col]
  parallel_for(R, [&](std::int64_t row) {
    const std::int64_t i = sample.rows[static_cast<std::size_t>(row)];
    const double* a = &arows[static_cast<std::size_t>(row * K)];
    std::vector<double> acc(L * kCalibrationBlock);
    for (std::int64_t c0 = 0; c0 < C; c0 += kCalibrationBlock) {
      const std::int64_t w = std::min(kCalibrationBlock, C - c0);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t k = 0; k < K; ++k) {
        const double x = a[k];
        const double* y = &bk[static_cast<std::size_t>(k * C + c0)];
        for (std::size_t l = 0; l < L; ++l) {
          double* al = &acc[l * kCalibrationBlock];
          for (std::int64_t jj = 0; jj < w; ++jj) al[jj] = round_to_bits(al[jj] + x * y[jj], levels[l]);
        }
      }
      for (std::int64_t jj = 0; jj < w; ++jj) {
        const std::int64_t col = c0 + jj;
        const std::int64_t e = i * N + sample.cols[static_cast<std::size_t>(col)];
        const DoubleDouble x = cmp.exact[e].double_double();
        const double cond = cmp.condition[e];
        for (std::size_t l = 0; l < L; ++l)
          err[l * static_cast<std::size_t>(R * C) + static_cast<std::size_t>(row * C + col)] =
              cond > 0 ? std::fabs((acc[l * kCalibrationBlock + jj] - x.hi) - x.lo) / cond : 0.0;
      }
    }
  }, threads_for(static_cast<double>(R) * C * K * L, 0x1p16));
  std::vector<double> means(L, 0.0);
  for (std::size_t l = 0; l < L; ++l) {
    double sum = 0;
    for (std::size_t e = 0; e < static_cast<std::size_t>(R * C); ++e) sum += err[l * static_cast<std::size_t>(R * C) + e];
    means[l] = sum / static_cast<double>(R * C);
  }
  return means;
}

}  // namespace

OutputComparison transposed_reference(const OutputComparison& cmp) {
  // D^T = op(B)^T op(A)^T sums the same products (and beta C^T, no bias): every exact
  // value, condition term and per-element bound moves from (b, i, j) to (b, j, i).
  const std::int64_t batch = cmp.shape.at(0), m = cmp.shape.at(1), n = cmp.shape.at(2);
  OutputComparison t;
  t.format = cmp.format;
  t.shape = {batch, n, m};
  t.accumulator_max = cmp.accumulator_max;
  t.accumulated_growth = cmp.accumulated_growth;
  t.tolerance_note = cmp.tolerance_note;
  t.relu_output = cmp.relu_output;
  t.ulp_fair_condition = cmp.ulp_fair_condition;
  const auto permute = [&](const auto& v) {
    std::decay_t<decltype(v)> out(v.size());
    if (v.empty()) return out;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) out[(b * n + j) * m + i] = v[(b * m + i) * n + j];
    return out;
  };
  t.got = permute(cmp.got);
  t.exact = permute(cmp.exact);
  t.condition = permute(cmp.condition);
  t.accumulated = permute(cmp.accumulated);
  t.allowed = permute(cmp.allowed);
  t.input_abs = permute(cmp.input_abs);
  t.precision_scale = permute(cmp.precision_scale);
  t.bias_allowance = permute(cmp.bias_allowance);
  t.bias_spread = permute(cmp.bias_spread);
  t.bias_shift = permute(cmp.bias_shift);
  t.unwritten = permute(cmp.unwritten);
  return t;
}

namespace {

// Caps of the large regime besides kLargeTermBudget (batch x M x N x K): D's elements
// (each holds a reference value, a condition term and bounds: ~64 bytes), and each input
// operand's elements (2^23: 32 MB in FP32).
constexpr std::int64_t kLargeOutputs = std::int64_t{1} << 21;
constexpr std::int64_t kLargeOperand = std::int64_t{1} << 23;

// The large regime's shape (docs/concepts/sizes.md), one of four kinds, in the rotation
// long K, wide, long K, skinny, batched (GenLimits::large_kind; at random when -1: long K,
// the commonest size switch, with odds 2/5):
//   long K:  K in [2048, 65536], M and N in [1, 512]  (split-K and long-K paths)
//   wide:    M in [1024, 4096], N in [256, 4096], K in [1, 4096]  (large tiles, ragged tails)
//   skinny:  one of M, N in [2048, 65536], the other in [1, 64], K in [16, 16384]
//   batched: batch in [2, 16], M and N in [16, 512], K in [16, 4096]
// each dimension log-spread (gen::log_dim: ragged, powers of two, tile multiples plus a
// tail), then trimmed to the caps, the later-drawn dimensions first. FP8 K is a multiple
// of 16 where the kernel needs it.
void draw_large_shape(Case& c, const Kernel* k, int large_kind) {
  GemmShape& g = c.gemm;
  // FP64 products are not exact in double: its exact reference costs ~30x more per term.
  const std::int64_t budget = c.types.at("A") == Format::FP64 ? kLargeTermBudget >> 5 : kLargeTermBudget;
  const auto cap = [](std::int64_t want, std::int64_t limit) { return std::max<std::int64_t>(1, std::min(want, limit)); };
  static constexpr int kKinds[] = {0, 1, 0, 2, 3};  // long K, wide, long K, skinny, batched
  const int kind = kKinds[large_kind >= 0 ? large_kind % 5 : *rc::gen::inRange(0, 5)];
  g.batch = 1;
  if (kind == 0) {
    g.k = *gen::log_dim(2048, kLargeReduction);
    g.m = *gen::log_dim(1, cap(512, kLargeOperand / g.k));
    g.n = *gen::log_dim(1, cap(512, std::min(kLargeOperand / g.k, budget / (g.m * g.k))));
  } else if (kind == 1) {
    g.m = *gen::log_dim(1024, 4096);
    g.n = *gen::log_dim(256, cap(4096, kLargeOutputs / g.m));
    g.k = *gen::log_dim(1, cap(4096, std::min(kLargeOperand / std::max(g.m, g.n), budget / (g.m * g.n))));
  } else if (kind == 2) {
    std::int64_t big = *gen::log_dim(2048, kLargeReduction), small = *gen::log_dim(1, 64);
    big = cap(big, kLargeOutputs / small);
    const bool tall = *gen::pick(std::vector<bool>{true, false});
    g.m = tall ? big : small, g.n = tall ? small : big;
    g.k = *gen::log_dim(1, cap(16384, std::min(kLargeOperand / big, budget / (g.m * g.n))));
  } else {
    g.batch = *gen::log_dim(2, 16);
    g.m = *gen::log_dim(16, 512);
    g.n = *gen::log_dim(16, 512);
    g.k = *gen::log_dim(16, cap(4096, std::min(kLargeOperand / (g.batch * std::max(g.m, g.n)),
                                                budget / (g.batch * g.m * g.n))));
  }
  if (k && k->unsupported(c) && is_fp8(c.types.at("A"))) {
    g.k = std::max<std::int64_t>(16, g.k / 16 * 16);  // cuBLASLt FP8: K a multiple of 16
    while (g.batch * g.m * g.n * g.k > budget && g.k > 16) g.k -= 16;
  }
}

// The formats the generator draws D from: the accumulator's own (d0) first.
std::vector<Format> gemm_outputs(Format d0, Format a) { return {d0, Format::BF16, Format::FP16, a}; }

class GemmModule final : public OpModule {
 public:
  Op op() const override { return Op::Gemm; }
  std::vector<std::string> dtypes() const override { return kGemmDtypes; }
  Case basic_case(std::string_view dtype) const override { return dtype_gemm_case(dtype, 16, 16, 16); }
  std::vector<Format> output_formats(std::string_view dtype) const override {
    const Case c = basic_case(dtype);
    return distinct_formats(gemm_outputs(c.types.at("D"), c.types.at("A")));
  }

  // Shapes on tile edges, layouts, padding, scalars and epilogues as distributions/case_gen.hpp
  // draws them, each choice kept only if the kernel supports it (so library restrictions such
  // as FP8's "TN" form do not waste the budget), then input distributions for the final types.
  rc::Gen<Case> generate(std::string_view dtype_in, const Kernel* k, const GenLimits& limits) const override {
    return rc::gen::exec([this, dtype_in = std::string(dtype_in), k, limits]() {
      const std::string dtype = dtype_in.empty() ? *gen::pick(kGemmDtypes) : dtype_in;
      // From an output the kernel takes (a kernel of FP16 D only refuses the FP32 default).
      Case c = dtype_gemm_case(dtype, 1, 1, 1, k ? supported_output(*k, dtype) : std::nullopt);
      if (k) c.kernel = k->name();
      auto keep_if_supported = [&](auto apply, auto revert) {
        apply();
        if (k && k->unsupported(c)) revert();
      };
      auto& g = c.gemm;
      const bool fp8 = dtype == "e4m3" || dtype == "e5m2";
      if (limits.large) {
        draw_large_shape(c, k, limits.large_kind);
      } else {
        g.k = *gen::dim(limits.max_reduction);
        // FP8 K that is not a multiple of 16 only where the kernel takes it (cuBLASLt does not).
        if (fp8 && k && k->unsupported(c)) g.k = std::max<std::int64_t>(16, (g.k + 15) / 16 * 16);
        const std::int64_t side = std::max<std::int64_t>(1, std::min<std::int64_t>(96, gen::kElementBudget / g.k));
        g.m = *gen::dim(side);
        g.n = *gen::dim(side);
        g.batch = *gen::dim(std::max<std::int64_t>(1, std::min<std::int64_t>(3, gen::kElementBudget / (g.k * std::max(g.m, g.n)))));
      }
      const Layout layout = *gen::pick(std::vector<Layout>{Layout::RowMajor, Layout::ColMajor});
      const bool ta = *gen::pick(std::vector<bool>{false, true}), tb = *gen::pick(std::vector<bool>{true, false});
      keep_if_supported([&] { g.layout = layout, g.trans_a = ta, g.trans_b = tb; },
                        [&] { g.layout = Layout::RowMajor, g.trans_a = false, g.trans_b = true; });
      // FP8 M and N multiples of 16 only where the kernel needs it (cuBLASLt FP8: every
      // leading dimension a multiple of 16 bytes, so packed FP32 outputs need N or M % 4).
      if (fp8 && k && k->unsupported(c)) {
        const std::int64_t m0 = g.m, n0 = g.n;
        g.m = (g.m + 15) / 16 * 16, g.n = (g.n + 15) / 16 * 16;
        if (k->unsupported(c)) g.m = m0, g.n = n0;
      }
      if (!k && c.types.at("A") != Format::FP64 && *gen::pick(std::vector<bool>{false, true})) {
        // Without a kernel: mixed input formats too (A and B of different types).
        c.types["B"] = *gen::pick(std::vector<Format>{Format::FP32, Format::FP16, Format::BF16, Format::E4M3, Format::E5M2});
        if (c.types["compute"] == Format::TF32) c.types["compute"] = Format::FP32;
      }
      const std::vector<std::int64_t> pads{0, 1, 3, 16, 64};
      const std::int64_t pa = *gen::pick(pads), pb = *gen::pick(pads), pc = *gen::pick(pads), pd = *gen::pick(pads);
      keep_if_supported([&] { g.lda = pa ? g.packed_ld(g.a_rows(), g.a_cols()) + pa : 0; }, [&] { g.lda = 0; });
      keep_if_supported([&] { g.ldb = pb ? g.packed_ld(g.b_rows(), g.b_cols()) + pb : 0; }, [&] { g.ldb = 0; });
      keep_if_supported([&] { g.ldd = pd ? g.packed_ld(g.m, g.n) + pd : 0; }, [&] { g.ldd = 0; });
      const Format d0 = c.types.at("D");
      // (Large cases keep the accumulator's own output more often: a precision loss at large
      // K shows through an FP32 D, not through a BF16 one, whose rounding is coarser.)
      std::vector<Format> outputs = gemm_outputs(d0, c.types.at("A"));
      if (limits.large) outputs.insert(outputs.begin(), d0);
      const Format d = *gen::pick(outputs);
      keep_if_supported([&] { c.types["D"] = d; }, [&] { c.types["D"] = d0; });
      const double alpha = *gen::pick(std::vector<double>{1, 0.5, -1, 2, 0.1, 0});
      keep_if_supported([&] { c.alpha = alpha; }, [&] { c.alpha = 1; });
      const double beta = *gen::pick(std::vector<double>{0, 1, -0.5, 2});
      keep_if_supported([&] { c.beta = beta, c.types["C"] = c.types.at("D"); },
                        [&] { c.beta = 0, c.types.erase("C"); });
      if (c.beta == 0) c.types.erase("C");
      if (c.beta != 0) keep_if_supported([&] { g.ldc = pc ? g.packed_ld(g.m, g.n) + pc : 0; }, [&] { g.ldc = 0; });
      std::vector<Epilogue> epilogues{Epilogue::None, Epilogue::Relu, Epilogue::Bias, Epilogue::BiasRelu};
      if (limits.gelu && !limits.large)  // a certified GELU per element costs too much at 10^6 elements
        epilogues.insert(epilogues.end(), {Epilogue::GeluTanh, Epilogue::Gelu, Epilogue::BiasGeluTanh, Epilogue::BiasGelu});
      const Epilogue e = *gen::pick(epilogues);
      const Format bias_type = fp8 ? (c.types.at("D") == Format::FP16 ? Format::FP16 : Format::BF16) : c.types.at("D");
      keep_if_supported([&] { c.epilogue = e; if (has_bias(e)) c.types["bias"] = bias_type; },
                        [&] { c.epilogue = Epilogue::None, c.types.erase("bias"); });
      c.dist["A"] = *gen::dist_spec(c, "A", true);
      if (c.dist["A"].rfind("gendot", 0) != 0) c.dist["B"] = *gen::dist_spec(c, "B", false);
      if (c.beta != 0) c.dist["C"] = *gen::dist_spec(c, "C", false);
      if (has_bias(c.epilogue)) c.dist["bias"] = *gen::dist_spec(c, "bias", false);
      c.seed = *rc::gen::arbitrary<std::uint64_t>();
      validate(c);
      return c;
    });
  }

  std::string family(const Case& c) const override { return op_family(c, "gemm", "A", "D"); }

  std::int64_t reduction_length(const Case& c) const override { return c.gemm.k; }

  ToleranceModel tolerance(const Case& c, const KernelTraits& traits) const override {
    ToleranceModel t = precision_terms(c, traits);
    // cuBLASLt with a bias or a GELU into a 16-bit D may round alpha acc + beta C to D's
    // format before it adds the bias or applies the GELU, with beta C or without (measured:
    // tests/kernels/test_library_gpu.cpp).
    const Format fd = c.types.at("D");
    if ((has_bias(c.epilogue) || has_gelu(c.epilogue)) && info(fd).precision() < 24) {
      t.epilogue_rounding = std::ldexp(1.0, -info(fd).precision()) * (has_gelu(c.epilogue) ? kGeluSlope : 1.0);
      t.rule += fmt::format(", alpha acc{} may be rounded to {} before the {}", c.beta != 0.0 ? " + beta C" : "", name(fd),
                            has_bias(c.epilogue) ? "bias" : "activation");
    }
    return t;
  }

  std::vector<AdmittedArithmetic> admitted(std::string_view dtype) const override {
    if (dtype == "fp64") return {{"FP64 accumulation in any order", ""}};
    const bool fp8 = dtype == "e4m3" || dtype == "e5m2";
    std::vector<AdmittedArithmetic> out = {
        {"FP32 FMA accumulation in k order", "cpu.fp32_seq"},
        {"split-K: 4 slices of K accumulated apart, then added in FP32", "cpu.fp32_seq:splitk=4"},
    };
    if (!fp8) out.push_back({"FP32 products summed pairwise (a binary tree)", "cpu.fp32_pairwise"});
    if (dtype == "fp32")
      out.push_back({"a truncating block-FMA accumulator: 4 products per step, 24 bits", "cpu.blockfma:block=4,frac=23,round=rz"});
    if (dtype == "tf32") {
      out.front().what = "inputs rounded to TF32 (cvt.rna), " + out.front().what;
      out.push_back({"mma/wgmma TF32: 8 products per step, 25 bits after alignment on the inputs' exponents, truncated",
                     "cpu.blockfma:block=8,frac=25,round=rz,align=tf32"});
    }
    if (dtype == "fp16" || dtype == "bf16")
      out.push_back({"mma/wgmma: 16 products per step, 25 bits after alignment on the inputs' exponents, truncated",
                     fmt::format("cpu.blockfma:block=16,frac=25,round=rz,align={}", dtype)});
    if (dtype != "fp32" && dtype != "tf32" && dtype != "fp64")
      out.push_back({"a bias or a GELU into a 16-bit D: alpha acc + beta C rounded to D's format before the bias or the "
                     "activation (cuBLASLt)",
                     "cpu.fp32_seq:epi=rounded"});
    if (fp8)
      out.push_back({"FP8 tensor cores: 32 products per step kept to 13 fraction bits (truncated), promoted to FP32 every 128",
                     fmt::format("cpu.blockfma:block=32,frac=13,round=rz,promote=128,align={},out=13", dtype)});
    return out;
  }

  std::vector<OutputComparison> compare(const Case& c, const Inputs& inputs, const std::map<std::string, Tensor>& outputs,
                                        const ToleranceModel& tol) const override {
    std::vector<OutputComparison> out;
    out.push_back(compare_d(c, inputs, outputs.at("D"), tol));
    return out;
  }

  OutputComparison compare_d(const Case& c, const Inputs& inputs, const Tensor& d, const ToleranceModel& tol) const {
    GemmReference ref = [&] {
      const Phase phase("reference");
      return gemm_reference(c, inputs);
    }();
    OutputComparison cmp;
    cmp.format = c.types.at("D");
    cmp.shape = {c.gemm.batch, c.gemm.m, c.gemm.n};
    cmp.got = logical_output(c, "D", d);
    cmp.exact = std::move(ref.values);
    cmp.condition = std::move(ref.magnitude);
    cmp.accumulated = std::move(ref.intermediate);
    cmp.relu_output = c.epilogue == Epilogue::Relu || c.epilogue == Epilogue::BiasRelu;
    cmp.ulp_fair_condition = ulp_fair_condition(tol.accumulator_bits, cmp.format);
    if (ref.path == "gpu")
      cmp.reference_note = fmt::format("exact on the GPU (int8 digit products); {} of {} elements recomputed on the CPU",
                                       ref.recomputed, cmp.exact.size());
    const Format compute = c.types.at("compute");
    // FP64 too: the intermediate bound is a double, +Inf once the terms pass DBL_MAX.
    cmp.accumulator_max = info(compute == Format::TF32 ? Format::FP32 : compute).max_finite();
    cmp.accumulated_growth = 1 + tol.terms(cmp.format, c.gemm.k).condition;
    if (tol.input_bits > 0) {
      const Phase phase("input_rounding");
      mark_input_rounding_overflow(c, inputs, tol.input_bits, cmp);
      if (c.alpha != 0) cmp.input_abs = input_rounding_abs(c, inputs, tol.input_bits);
    }
    // The precision rule: where D is alpha x the accumulation through at most a bias and a
    // ReLU (a GELU's own evaluation error is not in its scale).
    const Phase phase("precision_scale");
    if (c.alpha != 0 && !has_gelu(c.epilogue))
      precision_terms_of(c, inputs, tol, precision_sample(c), cmp);
    return cmp;  // allowed: empty, the ToleranceModel's GEMM bound with n = K applies
  }

  std::vector<std::int64_t> output_offsets(const Case& c, const std::string& output) const override {
    const MatrixView dv = gemm_view(c, output);
    const std::int64_t m = c.gemm.m, n = c.gemm.n;
    std::vector<std::int64_t> at(static_cast<std::size_t>(c.gemm.batch * m * n));
    parallel_for(c.gemm.batch * m, [&](std::int64_t row) {  // row = b * m + i
      for (std::int64_t j = 0; j < n; ++j) at[static_cast<std::size_t>(row * n + j)] = dv.offset(row / m, row % m, j);
    }, threads_for(static_cast<double>(at.size()), 0x1p20));
    return at;
  }

  std::vector<RelationFailure> relations(const RelationContext& ctx, const Case& c, const Inputs& inputs,
                                         const RunOutcome& first) const override {
    std::vector<RelationFailure> out;
    const Tensor& d = first.outputs.at("D");
    if (scaling_applies(c, inputs)) {
      Inputs scaled = inputs;
      Tensor& a = scaled.at("A");
      const MatrixView av = gemm_view(c, "A");
      for (std::size_t e = 0; e < a.size(); ++e)
        if (!av.is_padding(static_cast<std::int64_t>(e))) a.set_value(e, 2 * a.value(e));
      const RunOutcome s = ctx.run(c, scaled);
      const MatrixView dv = gemm_view(c, "D");
      const Format fd = c.types.at("D");
      std::int64_t off = 0;
      if (s.status != Disposition::Ok) {
        out.push_back({"scaling", fmt::format("A scaled by 2: {}: {}", name(s.status), s.message)});
      } else if (!ctx.kernel.traits().deterministic) {
        // Two runs of a kernel that is not bitwise repeatable (split-K with atomics) may
        // differ in every bit that the tolerance allows: D(2A) is judged against its own
        // exact reference, 2x that of D(A), instead of against 2 D(A).
        if (const std::string why = ctx.judge(c, scaled, s); !why.empty())
          out.push_back({"scaling", "A scaled by 2 fails against its own reference: " + why});
      } else {
        for (std::int64_t b = 0; b < c.gemm.batch; ++b)
          for (std::int64_t i = 0; i < c.gemm.m; ++i)
            for (std::int64_t j = 0; j < c.gemm.n; ++j) {
              const double x = decode(fd, d.code(dv.offset(b, i, j)));
              const double y = decode(fd, s.outputs.at("D").code(dv.offset(b, i, j)));
              // only where doubling x is exact in D's format (normal, no overflow); x above the
              // smallest normal, as the unrounded value of an x equal to it may be subnormal
              if (std::isfinite(x) && std::fabs(x) > info(fd).min_normal() && 2 * std::fabs(x) <= info(fd).max_finite() &&
                  y != 2 * x)
                ++off;
            }
      }
      if (off) out.push_back({"scaling", fmt::format("scaling A by 2 did not double D exactly in {} elements", off)});
    }
    // (A bias runs along D's columns, which transposition turns into rows: no relation then.)
    if (!has_bias(c.epilogue)) {
      const Case tc = transposed_gemm_case(c);
      if (ctx.kernel.supports(tc)) {
        Inputs tin{{"A", inputs.at("B")}, {"B", inputs.at("A")}};
        if (c.beta != 0) tin.emplace("C", inputs.at("C"));
        const RunOutcome t = ctx.run(tc, tin);
        // A kernel may find out only when it runs that it lacks the other layout (no
        // algorithm for it): not supported then is no finding; a failure or crash is.
        const std::string why = t.status == Disposition::NotSupported ? std::string()
                              : t.status == Disposition::Ok ? ctx.judge_against(tc, t, transposed_reference(ctx.first))
                                                            : fmt::format("{}: {}", name(t.status), t.message);
        if (!why.empty())
          out.push_back({"transposition", "the transposed problem (other layout, A and B swapped) fails: " + why});
      }
    }
    return out;
  }

  // A kernel that rounds to nearest: the highest calibration precision (from
  // kCalibrationBits down) at which the RNE calibrator is not exact on this data and its
  // n u stays small (<= 1/16), so that its errors still behave like independent roundings:
  // effective = bits + log2(calibrator / kernel). Any other (tensor cores truncate): the
  // block-FMA family fitted (block_fma_bits), whose errors grow with K as a truncating
  // kernel's do, so the estimate does not drift with K as an RNE calibrator's would; where
  // the kernel is more precise than the whole family, the RNE calibrator.
  EffectiveBits effective_bits(const Case& c, const Inputs& inputs, const OutputComparison& cmp, double kernel_mean,
                               const KernelTraits& traits) const override {
    if (!(kernel_mean > 0) || c.gemm.batch != 1) return {};
    const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B");
    const std::int64_t N = c.gemm.n, K = c.gemm.k;
    // (the calibrator's mean over precision_sample: the same expectation as the kernel's
    // mean over every element, for elements drawn alike); arows and bcols hold its rows and
    // columns only
    const PrecisionSample sample = precision_sample(c);
    const std::vector<std::int64_t>& rows = sample.rows;
    const auto R = static_cast<std::int64_t>(rows.size()), C = static_cast<std::int64_t>(sample.cols.size());
    std::vector<double> arows(R * K), bk(C * K);  // bk[k * C + col]
    const Tensor &a = inputs.at("A"), &b = inputs.at("B");
    parallel_for(R, [&](std::int64_t row) {
      const std::int64_t i = rows[static_cast<std::size_t>(row)];
      for (std::int64_t k = 0; k < K; ++k) arows[row * K + k] = a.value(op_a_offset(c, av, 0, i, k));
    }, threads_for(static_cast<double>(R) * K, 0x1p15));
    parallel_for(C, [&](std::int64_t col) {
      const std::int64_t j = sample.cols[static_cast<std::size_t>(col)];
      for (std::int64_t k = 0; k < K; ++k) bk[k * C + col] = b.value(op_b_offset(c, bv, 0, k, j));
    }, threads_for(static_cast<double>(C) * K, 0x1p15));
    // (a kernel more precise than the family's finest, FP32 truncated after every step, is
    // measured by the RNE calibrator below)
    if (!traits.rounds_to_nearest)
      if (EffectiveBits fit = block_fma_bits(c, arows, bk, sample, cmp, traits); std::isfinite(fit.bits)) return fit;
    std::vector<int> levels;
    for (int bits = kCalibrationBits; bits >= 12; bits -= 4) {
      if (std::ldexp(static_cast<double>(K), -bits) > 1.0 / 16) break;
      levels.push_back(bits);
    }
    if (levels.empty()) return {};
    const auto found = [&](int bits, double cal) {
      return EffectiveBits{bits + std::log2(cal / kernel_mean), NAN, "a sequential round-to-nearest calibrator"};
    };
    // The first level usually decides; where the calibrator is exact there (narrow inputs
    // whose products and sums fit), the other levels in one pass.
    std::vector<double> cal = calibration_means(arows, bk, sample, N, K, cmp, {levels.front()});
    if (cal.front() > 0) return found(levels.front(), cal.front());
    levels.erase(levels.begin());
    cal = calibration_means(arows, bk, sample, N, K, cmp, levels);
    for (std::size_t l = 0; l < levels.size(); ++l)
      if (cal[l] > 0) return found(levels[l], cal[l]);
    return {};
  }

  // The block-FMA fit: on up to kFitTerms product terms of the sample (whole rows of op(A)
  // against its columns), the mean normalised error e(F) of cpu.blockfma with F fraction
  // bits (the kernel's declared block, promotion, alignment and interleaving, else blocks
  // of 16, truncating; a declared narrow step result, out < 23, narrows with F) is found on both sides of the kernel's own mean k on the same elements:
  // e(F) >= k > e(F + 1), F* = F + log2(e(F) / k) / log2(e(F) / e(F + 1)), reported as
  // F* + 1 bits of precision (a model of F fraction bits gives exactly F + 1). The
  // uncertainty: the kernel mean's standard error carried through the local slope.
  static EffectiveBits block_fma_bits(const Case& c, const std::vector<double>& arows, const std::vector<double>& bk,
                                      const PrecisionSample& sample, const OutputComparison& cmp,
                                      const KernelTraits& traits) {
    constexpr double kFitTerms = 0x1p24;
    const std::int64_t N = c.gemm.n, K = c.gemm.k;
    const auto R = static_cast<std::int64_t>(sample.rows.size()), C = static_cast<std::int64_t>(sample.cols.size());
    AccumulationModel m;
    m.order = AccumulationModel::Order::BlockFma, m.block = 16, m.rounding = Rounding::TowardZero;
    if (const auto declared = AccumulationModel::parse(traits.accumulation_model);
        declared && declared->order == AccumulationModel::Order::BlockFma)
      m = *declared;
    m.promote = traits.promote > 0 ? traits.promote : m.promote;
    // Elements: the first rows of the sample, every sampled column, within the budget.
    const std::int64_t rows = std::clamp<std::int64_t>(static_cast<std::int64_t>(kFitTerms / (static_cast<double>(C) * K)), 1, R);
    const std::int64_t n = rows * C;
    std::vector<double> kernel_err(static_cast<std::size_t>(n)), exact_hi(kernel_err.size()), exact_lo(kernel_err.size()),
        cond(kernel_err.size()), bcol(static_cast<std::size_t>(C * K));
    for (std::int64_t col = 0; col < C; ++col)
      for (std::int64_t k = 0; k < K; ++k) bcol[static_cast<std::size_t>(col * K + k)] = bk[static_cast<std::size_t>(k * C + col)];
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t col = 0; col < C; ++col) {
        const auto at = static_cast<std::size_t>(row * C + col);
        const std::int64_t e = sample.rows[static_cast<std::size_t>(row)] * N + sample.cols[static_cast<std::size_t>(col)];
        const DoubleDouble x = cmp.exact[e].double_double();
        exact_hi[at] = x.hi, exact_lo[at] = x.lo, cond[at] = cmp.condition[e];
        const double got = decode(cmp.format, cmp.got[e]);
        kernel_err[at] = cond[at] > 0 && std::isfinite(got) ? std::fabs((got - x.hi) - x.lo) / cond[at] : 0.0;
      }
    double k_mean = 0, k_sq = 0;
    for (const double v : kernel_err) k_mean += v, k_sq += v * v;
    k_mean /= static_cast<double>(n);
    if (!(k_mean > 0)) return {};
    const double k_sd = std::sqrt(std::max(0.0, k_sq / static_cast<double>(n) - k_mean * k_mean));
    std::map<int, double> memo;
    const auto e_of = [&](int frac) {
      if (const auto it = memo.find(frac); it != memo.end()) return it->second;
      AccumulationModel f = m;
      f.frac_bits = frac;
      if (m.out_bits < 23) f.out_bits = std::min(frac, 23);  // a narrow accumulator: its width is the parameter too
      std::vector<double> err(static_cast<std::size_t>(n));
      parallel_for(n, [&](std::int64_t at) {
        const std::int64_t row = at / C, col = at % C;
        const double v = model_dot(f, &arows[static_cast<std::size_t>(row * K)], &bcol[static_cast<std::size_t>(col * K)], K);
        const auto u = static_cast<std::size_t>(at);
        err[u] = cond[u] > 0 ? std::fabs((static_cast<double>(v) - exact_hi[u]) - exact_lo[u]) / cond[u] : 0.0;
      }, threads_for(static_cast<double>(n) * K, 0x1p16));
      double s = 0;
      for (const double v : err) s += v;
      return memo[frac] = s / static_cast<double>(n);
    };
    const int lo_limit = 2, hi_limit = m.align_inputs ? 50 : 52;
    // e(F) falls with F: bisect for the F with e(F) >= k > e(F + 1).
    int lo = lo_limit, hi = hi_limit;
    if (e_of(lo) < k_mean || e_of(hi) >= k_mean) return {};  // beyond the family's range
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      (e_of(mid) >= k_mean ? lo : hi) = mid;
    }
    const double e0 = e_of(lo), e1 = e_of(hi);
    const double slope = e1 > 0 ? std::log2(e0 / e1) : INFINITY;  // bits of log2 error per fraction bit
    const double f_star = std::isfinite(slope) && slope > 0 ? lo + std::log2(e0 / k_mean) / slope : lo;
    EffectiveBits r;
    r.bits = f_star + 1;
    r.uncertainty = std::isfinite(slope) && slope > 0 ? k_sd / std::sqrt(static_cast<double>(n)) / k_mean / std::log(2.0) / slope : NAN;
    AccumulationModel named = m;
    named.frac_bits = 1;
    r.family = named.name();
    r.family.replace(r.family.find("frac=1"), 6, "frac=F");
    return r;
  }
};

}  // namespace

Case dtype_gemm_case(std::string_view dtype, std::int64_t m, std::int64_t n, std::int64_t k, std::optional<Format> out) {
  Case c;
  c.op = Op::Gemm;
  c.gemm.m = m, c.gemm.n = n, c.gemm.k = k;
  c.gemm.trans_b = true;
  Format in, in_b, compute = Format::FP32, d = Format::FP32;
  if (dtype == "tf32") {
    in = in_b = Format::FP32, compute = Format::TF32;
  } else if (dtype == "e5m2") {
    in = Format::E5M2, in_b = Format::E4M3;
  } else if (auto f = parse_format(dtype); f && *f != Format::TF32) {
    in = in_b = *f;
    if (*f == Format::FP64) compute = d = Format::FP64;
  } else {
    throw InputError(fmt::format("--dtype '{}': expected fp64, fp32, tf32, fp16, bf16, e4m3 or e5m2", dtype));
  }
  c.types = {{"A", in}, {"B", in_b}, {"D", out.value_or(d)}, {"compute", compute}};
  validate(c);
  return c;
}

PrecisionSample precision_sample(const Case& c) {
  const GemmShape& g = c.gemm;
  const double per_row = static_cast<double>(g.batch) * static_cast<double>(g.n) * static_cast<double>(g.k);
  if (per_row * static_cast<double>(g.m) <= kPrecisionTerms)
    return {edge_and_spread_sample(g.m, g.m, c.seed), edge_and_spread_sample(g.n, g.n, c.seed)};
  const std::int64_t rows = std::max<std::int64_t>(16, static_cast<std::int64_t>(kPrecisionTerms / per_row));
  const double per_col = static_cast<double>(g.batch) * static_cast<double>(std::min(rows, g.m)) * static_cast<double>(g.k);
  const std::int64_t cols = per_col * static_cast<double>(g.n) <= kPrecisionTerms
                                ? g.n
                                : std::max<std::int64_t>(64, static_cast<std::int64_t>(kPrecisionTerms / per_col));
  return {edge_and_spread_sample(g.m, rows, c.seed), edge_and_spread_sample(g.n, cols, c.seed >> 10)};
}

const OpModule& gemm_module() {
  static const GemmModule m;
  return m;
}

double round_to_bits(double v, int bits) {
  std::uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  const std::uint64_t biased = (u >> 52) & 0x7ff;
  if (biased == 0 || biased == 0x7ff || bits >= 53 || bits < 2) {
    // zero, subnormal, Inf, NaN, one bit (its last kept bit is the implicit one): by the
    // definition (the sweeps' sums are normal)
    if (v == 0 || !std::isfinite(v) || bits >= 53) return v;
    const int e = std::ilogb(v);
    return std::ldexp(std::nearbyint(std::ldexp(v, bits - 1 - e)), e - bits + 1);  // RNE (default mode)
  }
  // A normal double: RNE on the magnitude's bits, dropping 53 - bits of the significand;
  // a carry out of it steps the exponent (to Inf past the largest finite), as it should.
  const int drop = 53 - bits;
  const std::uint64_t mask = (std::uint64_t{1} << drop) - 1, lsb = (u >> drop) & 1;
  u = (u + (mask >> 1) + lsb) & ~mask;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

double calibration_dot(const double* a, const double* b, std::int64_t k, int bits) {
  double acc = 0;
  for (std::int64_t i = 0; i < k; ++i) acc = round_to_bits(acc + a[i] * b[i], bits);
  return acc;
}

}  // namespace ulpgate
