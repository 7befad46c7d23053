#include "references/sliced_gemm.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>

namespace ulpgate {

using slicing::RowPlan;
using slicing::Wide;

std::int64_t SlicedRows::captured_rows() const {
  return std::count_if(plan.begin(), plan.end(), [](const RowPlan& p) { return p.captured != 0; });
}

SlicedRows slice_rows(std::span<const float> values, std::int64_t rows, std::int64_t k, int max_digits) {
  if (max_digits < 1 || max_digits > kMaxSliceDigits) throw std::invalid_argument("slice_rows: max_digits out of 1..8");
  if (static_cast<std::int64_t>(values.size()) < rows * k) throw std::invalid_argument("slice_rows: too few values");
  SlicedRows s;
  s.rows = rows, s.k = k;
  s.pitch = (k + slicing::kPitch - 1) / slicing::kPitch * slicing::kPitch;
  s.plan.resize(static_cast<std::size_t>(rows));
  s.offset.resize(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    slicing::RowScan scan;
    for (std::int64_t q = 0; q < k; ++q) slicing::scan(scan, std::bit_cast<std::uint32_t>(values[r * k + q]));
    s.plan[r] = slicing::plan_row(scan, max_digits);
    s.offset[r] = s.stacked;
    s.stacked += s.plan[r].digits;
  }
  s.value.assign(static_cast<std::size_t>(s.stacked * s.pitch), 0);
  s.magnitude.assign(s.value.size(), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const RowPlan& p = s.plan[r];
    for (std::int64_t q = 0; q < k; ++q) {
      const std::int64_t n = slicing::scaled_integer(std::bit_cast<std::uint32_t>(values[r * k + q]), p.lowest);
      const std::size_t at = static_cast<std::size_t>(s.offset[r] * s.pitch + q);
      slicing::balanced_digits(n, p.digits, &s.value[at], s.pitch);
      slicing::balanced_digits(n < 0 ? -n : n, p.digits, &s.magnitude[at], s.pitch);
    }
  }
  return s;
}

void cpu_digit_products(const std::int8_t* a, std::int64_t rows_a, const std::int8_t* b, std::int64_t rows_b,
                        std::int64_t k, std::int64_t pitch, std::vector<std::int32_t>& out) {
  const std::int64_t chunks = std::max<std::int64_t>(1, (k + kInt32Chunk - 1) / kInt32Chunk);
  out.assign(static_cast<std::size_t>(chunks * rows_a * rows_b), 0);
  for (std::int64_t c = 0; c < chunks; ++c)
    for (std::int64_t rb = 0; rb < rows_b; ++rb)
      for (std::int64_t ra = 0; ra < rows_a; ++ra) {
        std::int32_t sum = 0;  // exact: at most kChunk products of magnitude <= 2^14
        for (std::int64_t q = c * kInt32Chunk; q < std::min(k, (c + 1) * kInt32Chunk); ++q)
          sum += static_cast<std::int32_t>(a[ra * pitch + q]) * b[rb * pitch + q];
        out[static_cast<std::size_t>((c * rows_b + rb) * rows_a + ra)] = sum;
      }
}

SlicedDots cpu_sliced_dots(std::span<const float> a, std::int64_t m, std::span<const float> b, std::int64_t n,
                           std::int64_t k, int max_digits) {
  const SlicedRows sa = slice_rows(a, m, k, max_digits), sb = slice_rows(b, n, k, max_digits);
  SlicedDots out;
  out.m = m, out.n = n;
  out.a_plan = sa.plan, out.b_plan = sb.plan;
  out.stacked_a = sa.stacked, out.stacked_b = sb.stacked;
  std::vector<std::int32_t> pv, pm;
  cpu_digit_products(sa.value.data(), sa.stacked, sb.value.data(), sb.stacked, k, sa.pitch, pv);
  cpu_digit_products(sa.magnitude.data(), sa.stacked, sb.magnitude.data(), sb.stacked, k, sa.pitch, pm);
  const int chunks = static_cast<int>(std::max<std::int64_t>(1, (k + kInt32Chunk - 1) / kInt32Chunk));  // as cpu_digit_products
  out.products = 2 * chunks;
  const auto mn = static_cast<std::size_t>(m * n);
  for (auto& l : out.limb) l.assign(mn, 0);
  out.condition.assign(mn, 0.0);
  out.certified.assign(mn, 0);
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < m; ++i) {
      const RowPlan &pa = sa.plan[i], &pb = sb.plan[j];
      Wide v, mag;
      if (pa.digits > 0 && pb.digits > 0) {
        slicing::combine(pv.data(), sa.stacked, sa.stacked * sb.stacked, chunks, sa.offset[i], pa.digits,
                         sb.offset[j], pb.digits, v);
        slicing::combine(pm.data(), sa.stacked, sa.stacked * sb.stacked, chunks, sa.offset[i], pa.digits,
                         sb.offset[j], pb.digits, mag);
      }
      const std::size_t e = out.index(i, j);
      if (!pa.captured || !pb.captured || slicing::is_zero(v)) {
        ++out.recomputed;
        continue;
      }
      for (int l = 0; l < 3; ++l) out.limb[l][e] = v.w[l];
      out.condition[e] = slicing::round_to_double(mag, pa.lowest + pb.lowest);
      out.certified[e] = 1;
    }
  return out;
}

namespace {

// Bits [lo, lo + 64) of a nonnegative 192-bit value (bits below 0 are zeros).
std::uint64_t bits_at(const Wide& x, int lo) {
  const auto limb = [&](int i) -> std::uint64_t { return i >= 0 && i < 3 ? x.w[i] : 0; };
  const int l = lo >= 0 ? lo / 64 : -((-lo + 63) / 64), b = lo - 64 * l;
  return b == 0 ? limb(l) : (limb(l) >> b) | (limb(l + 1) << (64 - b));
}

// |S| and its sign.
Wide magnitude_of(const SlicedDots& s, std::size_t e, bool& negative) {
  Wide x;
  for (int l = 0; l < 3; ++l) x.w[l] = s.limb[l][e];
  negative = (x.w[2] >> 63) != 0;
  if (negative) {
    std::uint64_t carry = 1;
    for (auto& w : x.w) {
      w = ~w + carry;
      carry = carry && w == 0;
    }
  }
  return x;
}

}  // namespace

RefValue SlicedDots::value(std::int64_t i, std::int64_t j) const {
  bool negative = false;
  const Wide x = magnitude_of(*this, index(i, j), negative);
  RefValue v;
  v.kind = RefValue::Kind::Finite;
  v.negative = negative;
  int top = 2;
  while (x.w[top] == 0) --top;  // certified: S != 0
  const int p = 64 * top + 63 - std::countl_zero(x.w[top]);
  v.exponent = p + a_plan[i].lowest + b_plan[j].lowest;
  v.sig_hi = bits_at(x, p - 63);
  v.sig_lo = bits_at(x, p - 127);
  bool below = false;  // any bit below the 128-bit window
  for (int l = 0; l < 3 && 64 * l < p - 127; ++l) {
    const int count = p - 127 - 64 * l;
    below |= (count >= 64 ? x.w[l] : x.w[l] & ((std::uint64_t{1} << count) - 1)) != 0;
  }
  v.inexact = below;
  return v;
}

std::array<double, 4> SlicedDots::pieces(std::int64_t i, std::int64_t j) const {
  bool negative = false;
  const Wide x = magnitude_of(*this, index(i, j), negative);
  const int scale = a_plan[i].lowest + b_plan[j].lowest;
  std::array<double, 4> out{};  // |S| < 2^(62 + 62 + 20): four 52-bit pieces
  for (int p = 0; p < 4; ++p) {
    const double piece = std::ldexp(static_cast<double>(bits_at(x, 52 * p) & ((std::uint64_t{1} << 52) - 1)), scale + 52 * p);
    out[p] = negative ? -piece : piece;
  }
  return out;
}

}  // namespace ulpgate
