// Helpers shared by the attention combine tests: cases, inputs drawn as split-KV decoding
// leaves them (LSE_s around a row's centre, empty splits with garbage rows, empty rows), and
// a run of a host or device kernel with its outputs poisoned first.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/tensor.hpp"
#include "kernels/device.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate::test_support {

inline Case combine_case(std::int64_t batch, std::int64_t heads, std::int64_t seq_q, std::int64_t head_dim, std::int64_t splits,
                         AttentionLayout layout, bool base2, Format part, Format out, bool lse = true) {
  Case c;
  c.op = Op::AttentionCombine;
  AttentionShape& a = c.attention;
  a.batch = batch, a.heads = heads, a.seq_q = seq_q, a.head_dim = head_dim, a.splits = splits;
  a.layout = layout, a.lse_base2 = base2;
  c.types = {{"O_part", part}, {"LSE_part", Format::FP32}, {"O", out}, {"compute", Format::FP32}};
  if (lse) c.types["LSE"] = Format::FP32;
  return c;
}

/// How the partial states are drawn. Per row: a centre (uniform in +-centre), LSE_s = centre +
/// spread x normal; each split empty (LSE_s = -inf, its O_s NaN: garbage a kernel must not
/// read) with probability p_empty, every split of the row with p_empty_row; O_s uniform in
/// [lo, hi), rounded to O_part's format.
struct CombineFill {
  double centre = 10, spread = 3, p_empty = 0.2, p_empty_row = 0.1, lo = -1, hi = 1;
};

inline std::map<std::string, Tensor> combine_inputs(const Case& c, const CombineFill& f, std::uint64_t seed) {
  const AttentionShape& a = c.attention;
  const AttentionView pv = attention_view(c, "O_part"), lv = attention_view(c, "LSE_part");
  Tensor part(c.types.at("O_part"), static_cast<std::size_t>(pv.elements()));
  Tensor lse(Format::FP32, static_cast<std::size_t>(lv.elements()));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0, 1);
  std::normal_distribution<double> normal(0, 1);
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.heads; ++h)
      for (std::int64_t i = 0; i < a.seq_q; ++i) {
        const double centre = f.centre * (2 * unit(rng) - 1);
        const bool empty_row = unit(rng) < f.p_empty_row;
        for (std::int64_t s = 0; s < a.splits; ++s) {
          const std::int64_t sb = s * a.batch + b;
          const bool empty = empty_row || unit(rng) < f.p_empty;
          lse.set_value(static_cast<std::size_t>(lv.offset(sb, h, i, 0)),
                        empty ? -std::numeric_limits<double>::infinity() : centre + f.spread * normal(rng));
          for (std::int64_t d = 0; d < a.head_dim; ++d)
            part.set_value(static_cast<std::size_t>(pv.offset(sb, h, i, d)),
                           empty ? std::numeric_limits<double>::quiet_NaN() : f.lo + (f.hi - f.lo) * unit(rng));
        }
      }
  return {{"O_part", std::move(part)}, {"LSE_part", std::move(lse)}};
}

/// Split s of row (b, h, i) made empty: LSE_s = -inf, O_s NaN.
inline void make_empty(const Case& c, std::map<std::string, Tensor>& in, std::int64_t s, std::int64_t b, std::int64_t h,
                       std::int64_t i) {
  const std::int64_t sb = s * c.attention.batch + b;
  in.at("LSE_part").set_value(static_cast<std::size_t>(attention_view(c, "LSE_part").offset(sb, h, i, 0)), -INFINITY);
  for (std::int64_t d = 0; d < c.attention.head_dim; ++d)
    in.at("O_part").set_value(static_cast<std::size_t>(attention_view(c, "O_part").offset(sb, h, i, d)), NAN);
}

/// Inputs on which an FP32 combine is exact up to its division (combine_inputs' empty splits
/// and rows, then): base 2, integer LSE_s within 12 of each other around an integer centre in
/// +-1e4 give weights 2^-k (LSE_s - max exact, exp2 exact); base e, equal LSE_s give weights 1;
/// O_s integers in [-8, 8], so every product and partial sum fits 24 bits.
inline std::map<std::string, Tensor> exact_by_construction(const Case& c, std::uint64_t seed) {
  const AttentionShape& a = c.attention;
  const AttentionView pv = attention_view(c, "O_part"), lv = attention_view(c, "LSE_part");
  std::map<std::string, Tensor> in = combine_inputs(c, {}, seed);
  std::mt19937_64 rng(seed + 1);
  const double centre = std::round(std::uniform_real_distribution<double>(-1e4, 1e4)(rng));
  for (std::int64_t sb = 0; sb < a.splits * a.batch; ++sb)
    for (std::int64_t h = 0; h < a.heads; ++h)
      for (std::int64_t i = 0; i < a.seq_q; ++i) {
        const auto at = static_cast<std::size_t>(lv.offset(sb, h, i, 0));
        if (in.at("LSE_part").value(at) == -INFINITY) continue;
        in.at("LSE_part").set_value(at, a.lse_base2 ? centre + static_cast<double>(rng() % 13) : centre);
        for (std::int64_t d = 0; d < a.head_dim; ++d)
          in.at("O_part").set_value(static_cast<std::size_t>(pv.offset(sb, h, i, d)), static_cast<double>(rng() % 17) - 8);
      }
  return in;
}

/// The combine in long double, per element of O (at its offset in O's buffer) and per row
/// (at its offset in LSE's): m = max LSE_s, w_s = exp(LSE_s - m) over the non-empty splits,
/// l = sum w_s, O = sum w_s O_s / l, its magnitude sum w_s |O_s| / l (the scale of an FP32
/// combine's error) and LSE = m + log l; a row without a non-empty split: O = 0, magnitude 0,
/// LSE = -inf.
struct ExactCombine {
  std::vector<long double> o, magnitude;  ///< by O's offsets
  std::vector<long double> lse;           ///< by LSE's offsets ([batch][heads][seq_q])
  std::vector<int> splits_used;           ///< the row's non-empty splits, by LSE's offsets
};

inline ExactCombine exact_combine(const Case& c, const std::map<std::string, Tensor>& in) {
  const AttentionShape& a = c.attention;
  const AttentionView pv = attention_view(c, "O_part"), lpv = attention_view(c, "LSE_part"), ov = attention_view(c, "O"),
                      lv = attention_view(c, "LSE");
  const Tensor &part = in.at("O_part"), &lse_part = in.at("LSE_part");
  ExactCombine x;
  x.o.assign(static_cast<std::size_t>(ov.elements()), 0), x.magnitude.assign(x.o.size(), 0);
  x.lse.assign(static_cast<std::size_t>(lv.elements()), -INFINITY), x.splits_used.assign(x.lse.size(), 0);
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.heads; ++h)
      for (std::int64_t i = 0; i < a.seq_q; ++i) {
        std::vector<std::int64_t> used;
        std::vector<long double> lse, w;
        long double m = -INFINITY, l = 0;
        for (std::int64_t s = 0; s < a.splits; ++s) {
          const long double v = lse_part.value(static_cast<std::size_t>(lpv.offset(s * a.batch + b, h, i, 0)));
          if (v != -INFINITY) used.push_back(s), lse.push_back(v), m = std::max(m, v);
        }
        for (const long double v : lse) w.push_back(a.lse_base2 ? std::exp2(v - m) : std::exp(v - m)), l += w.back();
        const auto row = static_cast<std::size_t>(lv.offset(b, h, i, 0));
        x.splits_used[row] = static_cast<int>(used.size());
        if (used.empty()) continue;
        x.lse[row] = m + (a.lse_base2 ? std::log2(l) : std::log(l));
        for (std::int64_t d = 0; d < a.head_dim; ++d) {
          long double sum = 0, mag = 0;
          for (std::size_t t = 0; t < used.size(); ++t) {
            const long double o = part.value(static_cast<std::size_t>(pv.offset(used[t] * a.batch + b, h, i, d)));
            sum += w[t] * o, mag += w[t] * std::fabs(o);
          }
          const auto at = static_cast<std::size_t>(ov.offset(b, h, i, d));
          x.o[at] = sum / l, x.magnitude[at] = mag / l;
        }
      }
  return x;
}

struct CombineOutputs {
  Tensor o, lse;              ///< lse empty where the case asks for none
  std::int64_t unwritten = 0;  ///< output elements still holding the poison
};

/// A NaN no arithmetic writes (hardware writes canonical NaNs): an element still holding it
/// was not written.
inline Code combine_poison(Format f) { return canonical_nan(f) ^ 2; }

/// Runs k on c: host kernels on the tensors, device kernels on device copies.
inline CombineOutputs run_combine(Kernel& k, const Case& c, const std::map<std::string, Tensor>& in) {
  CombineOutputs out;
  out.o = Tensor(c.types.at("O"), static_cast<std::size_t>(attention_view(c, "O").elements()));
  out.o.fill_code(combine_poison(out.o.format()));
  const bool with_lse = c.types.count("LSE") > 0;
  if (with_lse) {
    out.lse = Tensor(Format::FP32, static_cast<std::size_t>(attention_view(c, "LSE").elements()));
    out.lse.fill_code(combine_poison(Format::FP32));
  }
  RunNotes notes;
  KernelIo io;
  if (k.traits().memory == Memory::Host) {
    io.in = {{"O_part", in.at("O_part").data()}, {"LSE_part", in.at("LSE_part").data()}};
    io.out["O"] = out.o.data();
    if (with_lse) io.out["LSE"] = out.lse.data();
    k.run(c, io, notes);
  } else {
    const DeviceBuffer part = to_device(in.at("O_part")), lse_part = to_device(in.at("LSE_part")), o = to_device(out.o);
    const DeviceBuffer lse = with_lse ? to_device(out.lse) : DeviceBuffer();
    io.in = {{"O_part", part.get()}, {"LSE_part", lse_part.get()}};
    io.out["O"] = o.get();
    if (with_lse) io.out["LSE"] = lse.get();
    k.run(c, io, notes);
    to_host(out.o, o);
    if (with_lse) to_host(out.lse, lse);
  }
  for (const Tensor* t : {&out.o, &out.lse})
    for (std::size_t e = 0; e < t->size(); ++e) out.unwritten += t->code(e) == combine_poison(t->format());
  return out;
}

}  // namespace ulpgate::test_support
