// Helpers shared by the distribution tests: small cases and logical element access.
#pragma once

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "distributions/fill.hpp"
#include "core/case.hpp"

namespace ulpgate::test {

/// A GEMM case: A is batch x m x k, B batch x k x n, every operand in `f`, FP32 compute.
inline Case gemm_case(std::int64_t m, std::int64_t n, std::int64_t k, Format f,
                      const std::string& dist_a = "", const std::string& dist_b = "",
                      std::int64_t batch = 1, std::uint64_t seed = 1234) {
  Case c;
  c.op = Op::Gemm;
  c.gemm.m = m, c.gemm.n = n, c.gemm.k = k, c.gemm.batch = batch;
  c.types = {{"A", f}, {"B", f}, {"D", f}, {"compute", Format::FP32}};
  if (!dist_a.empty()) c.dist["A"] = dist_a;
  if (!dist_b.empty()) c.dist["B"] = dist_b;
  c.seed = seed;
  return c;
}

/// An attention case in format f (compute FP32).
inline Case attention_case(std::int64_t batch, std::int64_t heads, std::int64_t sq, std::int64_t skv,
                           std::int64_t d, Format f, const std::string& dist_q = "",
                           std::uint64_t seed = 99) {
  Case c;
  c.op = Op::Attention;
  c.attention.batch = batch, c.attention.heads = heads, c.attention.seq_q = sq;
  c.attention.seq_kv = skv, c.attention.head_dim = d;
  c.types = {{"Q", f}, {"K", f}, {"V", f}, {"O", f}, {"compute", Format::FP32}};
  if (!dist_q.empty()) c.dist["Q"] = dist_q;
  c.seed = seed;
  return c;
}

/// op(A) (or op(B)) as a dense batch x rows x cols array of values, read through the views.
inline std::vector<double> logical_gemm(const Case& c, const std::map<std::string, Tensor>& t,
                                        const std::string& op) {
  const auto& g = c.gemm;
  const MatrixView v = gemm_view(c, op);
  const std::int64_t rows = op == "A" ? g.m : op == "B" ? g.k : g.m;
  const std::int64_t cols = op == "A" ? g.k : g.n;
  std::vector<double> out;
  for (std::int64_t b = 0; b < g.batch; ++b)
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t col = 0; col < cols; ++col) {
        const std::int64_t off = op == "A"   ? op_a_offset(c, v, b, r, col)
                                 : op == "B" ? op_b_offset(c, v, b, r, col)
                                             : v.offset(b, r, col);
        out.push_back(t.at(op).value(static_cast<std::size_t>(off)));
      }
  return out;
}

/// Q, K or V as a dense [b][h][s][d] array of values.
inline std::vector<double> logical_attention(const Case& c, const std::map<std::string, Tensor>& t,
                                             const std::string& op) {
  const AttentionView v = attention_view(c, op);
  std::vector<double> out;
  for (std::int64_t b = 0; b < v.batch; ++b)
    for (std::int64_t h = 0; h < v.heads; ++h)
      for (std::int64_t s = 0; s < v.seq; ++s)
        for (std::int64_t d = 0; d < v.dim; ++d)
          out.push_back(t.at(op).value(static_cast<std::size_t>(v.offset(b, h, s, d))));
  return out;
}

/// Bitwise equality of two value arrays (NaN equal to NaN with the same bits, -0 != +0).
inline bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) return false;
  return true;
}

}  // namespace ulpgate::test
