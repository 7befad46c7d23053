#include "kernels/emulated/gemm_models.hpp"

#include <bit>
#include <cmath>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/tensor.hpp"
#include "kernels/emulated/model_name.hpp"

namespace ulpgate {
namespace {

// x rounded to FP32: encode's code is the float's bits. Round-to-nearest-even of a number
// is the hardware's double-to-float conversion (IEEE: correctly rounded, overflow to Inf;
// the models run without FTZ), 20x faster than encode; NaN goes through encode, whose NaN
// code is the one every other path gives.
float round32(double x, Rounding r) {
  if (r == Rounding::NearestEven && !std::isnan(x)) return static_cast<float>(x);
  return std::bit_cast<float>(static_cast<std::uint32_t>(encode(Format::FP32, x, r)));
}

// The next double after a finite nonzero x toward the side of lo's sign (nextafter without
// the library call): one step of the magnitude's bits, up where lo has x's sign.
double next_toward(double x, double lo) {
  if (x == 0.0) return std::nextafter(x, lo > 0 ? INFINITY : -INFINITY);
  const auto u = std::bit_cast<std::uint64_t>(x);
  return std::bit_cast<double>((lo > 0) == (x > 0) ? u + 1 : u - 1);
}

// round32(x + y) for doubles x, y, rounded once. TwoSum gives the exact sum as hi + lo; when
// lo != 0 the true sum lies strictly between hi and its FP64 neighbour towards lo, and no
// FP32 rounding boundary (those have at most 26 significant bits) lies in that open
// interval, so rounding the neighbour gives the same FP32 result as rounding the true sum.
float add_round32(double x, double y, Rounding r) {
  const double hi = x + y;
  if (!std::isfinite(hi)) return static_cast<float>(hi);
  const double yv = hi - x, lo = (x - (hi - yv)) + (y - yv);
  return round32(lo == 0.0 ? hi : next_toward(hi, lo), r);
}

// mag rounded to a multiple of 2^drop (drop >= 1) with rounding r, the value's sign given.
std::uint64_t round_magnitude(std::uint64_t mag, int drop, bool negative, Rounding r) {
  const std::uint64_t unit = std::uint64_t{1} << drop, low = mag & (unit - 1), kept = mag - low;
  if (low == 0) return mag;
  bool up = false;
  switch (r) {
    case Rounding::TowardZero: break;
    case Rounding::Up: up = !negative; break;
    case Rounding::Down: up = negative; break;
    case Rounding::NearestAway: up = low >= unit / 2; break;
    case Rounding::NearestEven: up = low > unit / 2 || (low == unit / 2 && ((kept >> drop) & 1)); break;
  }
  return up ? kept + unit : kept;
}

// One block-FMA step: acc and the exact products aligned to the largest, truncated to
// frac_bits below its leading bit, summed exactly, rounded (to out_bits, then) to the
// accumulator format.
float block_step(const AccumulationModel& m, float acc, const double* p, const int* pe, int n) {
  double naive = acc;  // IEEE semantics for NaN/Inf, and the sign of an all-zero sum
  bool finite = std::isfinite(acc);
  int emax = acc != 0.0f ? std::ilogb(acc) : INT32_MIN;
  for (int i = 0; i < n; ++i) {
    naive += p[i];
    finite &= std::isfinite(p[i]);
    if (p[i] != 0.0) emax = std::max(emax, pe ? pe[i] : std::ilogb(p[i]));
  }
  if (!finite || emax == INT32_MIN) return static_cast<float>(naive);  // NaN/Inf, or all zeros
  // Input-aligned (hardware-measured) models align to the accumulator's exponent field too,
  // which is its format's smallest normal exponent when it is zero or subnormal.
  if (m.align_inputs) emax = std::max(emax, info(m.acc_format).emin());
  const int q = emax - m.frac_bits;
  // |t| < 2^(emax+2) (2^(emax+1) aligned by the product itself), so |t / 2^q| < 2^(frac_bits+2)
  // <= 2^54: the scaling is exact and the cast truncates toward zero, which is the
  // alignment shifter dropping bits.
  std::int64_t sum = static_cast<std::int64_t>(std::ldexp(static_cast<double>(acc), -q));
  for (int i = 0; i < n; ++i) sum += static_cast<std::int64_t>(std::ldexp(p[i], -q));
  if (sum == 0) return 0.0f;
  std::uint64_t mag = static_cast<std::uint64_t>(std::llabs(sum));
  if (m.out_bits < 23) {  // a narrower accumulator: the sum rounded to out_bits below its leading bit
    const int drop = std::bit_width(mag) - 1 - m.out_bits;
    if (drop > 0) mag = round_magnitude(mag, drop, sum < 0, m.rounding);
  }
  const Code c = encode_scaled(m.acc_format, sum < 0, mag, q, m.rounding);
  // A sum that rounds to zero is +0, as an exact zero is: the H200's FP16-accumulating
  // mma.sync gives +0 for a negative sum below FP16's range (docs/results/probe_h200.md).
  const double v = decode(m.acc_format, c);
  return v == 0.0 ? 0.0f : static_cast<float>(v);
}

float pairwise(const double* a, const double* b, std::int64_t n, Rounding r) {
  if (n == 1) return round32(a[0] * b[0], r);  // the product is exact in FP64
  const std::int64_t h = n / 2;
  return add_round32(pairwise(a, b, h, r), pairwise(a + h, b + h, n - h, r), r);
}

double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

double scale(const Case& c, const char* op) {
  auto it = c.scales.find(op);
  return it == c.scales.end() ? 1.0 : it->second;
}

class EmulatedGemm final : public Kernel {
 public:
  explicit EmulatedGemm(AccumulationModel m) : m_(m) {}
  std::string name() const override { return m_.name(); }
  std::string description() const override {
    switch (m_.order) {
      case AccumulationModel::Order::SequentialFma:
        return "CPU model: sequential FP32 FMA accumulation";
      case AccumulationModel::Order::Pairwise:
        return "CPU model: FP32 products, pairwise (tree) FP32 summation";
      case AccumulationModel::Order::BlockFma:
        return fmt::format("CPU model: tensor-core block FMA, {} products per step, {} fraction "
                           "bits after alignment (truncated), accumulator {}{}",
                           m_.block, m_.frac_bits, name_of(m_.rounding),
                           m_.promote ? fmt::format(", promoted to FP32 every {} products", m_.promote) : "");
    }
    return "";
  }
  KernelTraits traits() const override {
    // A block-FMA model keeps frac_bits fraction bits (frac_bits + 1 of precision) at most.
    const int bits = m_.order == AccumulationModel::Order::BlockFma ? std::min(24, m_.frac_bits + 1) : 24;
    KernelTraits t{Memory::Host, true, bits};
    t.promote = m_.order == AccumulationModel::Order::BlockFma ? m_.promote : 0;
    t.thread_safe = true;
    // Block FMA truncates the aligned products whatever the accumulator's rounding.
    t.rounds_to_nearest = m_.order != AccumulationModel::Order::BlockFma && m_.rounding == Rounding::NearestEven;
    t.input_rounding = m_.input_rounding;
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override {
    if (c.op != Op::Gemm) return "CPU models cover GEMM only";
    for (const char* op : {"A", "B"})
      if (c.types.at(op) == Format::FP64) return "FP64 inputs: products are not exact in FP64";
    const Format compute = c.types.at("compute");
    if (compute != Format::FP32 && compute != Format::TF32)
      return "the CPU models accumulate in fp32 (compute must be fp32 or tf32)";
    return std::nullopt;
  }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override {
    const auto& g = c.gemm;
    const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), dv = gemm_view(c, "D");
    const Format fa = c.types.at("A"), fb = c.types.at("B"), fd = c.types.at("D");
    const void* A = io.in.at("A");
    const void* B = io.in.at("B");
    void* D = io.out.at("D");
    const bool with_c = c.beta != 0.0, with_bias = has_bias(c.epilogue);
    const MatrixView cv = with_c ? gemm_view(c, "C") : MatrixView{};
    const MatrixView biasv = with_bias ? gemm_view(c, "bias") : MatrixView{};
    // A thread per 2^16 modelled products at least (a small case runs on the calling thread:
    // starting threads would cost more than it).
    const unsigned threads = threads_for(static_cast<double>(g.batch) * g.m * g.n * static_cast<double>(g.k), 0x1p16);
    // TF32 compute: the inputs rounded to TF32 first, as the tensor cores take them.
    const bool tf32 = c.types.at("compute") == Format::TF32;
    const auto input = [&](double v) {
      return tf32 && std::isfinite(v) ? decode(Format::TF32, encode(Format::TF32, v, m_.input_rounding)) : v;
    };
    // op(B)'s columns decoded once (not once per row of A).
    std::vector<double> bcols(static_cast<std::size_t>(g.batch * g.n * g.k));
    parallel_for(g.batch * g.n, [&](std::int64_t col) {
      const std::int64_t b = col / g.n, j = col % g.n;
      for (std::int64_t k = 0; k < g.k; ++k) bcols[col * g.k + k] = input(decode(fb, load_code(fb, B, op_b_offset(c, bv, b, k, j))));
    }, threads);
    parallel_for(g.batch * g.m, [&](std::int64_t row) {
      const std::int64_t b = row / g.m, i = row % g.m;
      std::vector<double> arow(g.k);
      for (std::int64_t k = 0; k < g.k; ++k) arow[k] = input(decode(fa, load_code(fa, A, op_a_offset(c, av, b, i, k))));
      for (std::int64_t j = 0; j < g.n; ++j) {
        const float acc = model_dot(m_, arow.data(), &bcols[static_cast<std::size_t>((b * g.n + j) * g.k)], g.k);
        const double cval = with_c ? decode(c.types.at("C"), load_code(c.types.at("C"), io.in.at("C"), cv.offset(b, i, j))) : 0.0;
        const double bias = with_bias ? decode(c.types.at("bias"), load_code(c.types.at("bias"), io.in.at("bias"), biasv.offset(0, 0, j))) : 0.0;
        store_code(fd, D, dv.offset(b, i, j), model_epilogue(c, acc, cval, bias, m_.epilogue_rounded));
      }
    }, threads);
    notes["model"] = name();
  }

 private:
  static std::string name_of(Rounding r) { return std::string(ulpgate::name(r)); }
  AccumulationModel m_;
};

}  // namespace

std::string AccumulationModel::name() const {
  const std::string in = input_rounding == Rounding::NearestAway ? "" : fmt::format(",in={}", ulpgate::name(input_rounding));
  const std::string r = (rounding == Rounding::NearestEven ? "" : fmt::format(",round={}", ulpgate::name(rounding))) +
                        (split_k > 1 ? fmt::format(",splitk={}", split_k) : "") + in +
                        (epilogue_rounded ? ",epi=rounded" : "");
  switch (order) {
    case Order::SequentialFma: return "cpu.fp32_seq" + (r.empty() ? "" : ":" + r.substr(1));
    case Order::Pairwise: return "cpu.fp32_pairwise" + (r.empty() ? "" : ":" + r.substr(1));
    case Order::BlockFma:
      return fmt::format("cpu.blockfma:block={},frac={},round={}{}{}{}{}{}{}", block, frac_bits, ulpgate::name(rounding),
                         promote ? fmt::format(",promote={}", promote) : "", align_inputs ? fmt::format(",align={}{}", ulpgate::name(align_format),
                                                      align_format_b ? "/" + std::string(ulpgate::name(*align_format_b)) : "")
                                      : "",
                         out_bits < 23 ? fmt::format(",out={}", out_bits) : "",
                         interleave ? fmt::format(",interleave={}", interleave) : "",
                         acc_format != Format::FP32 ? fmt::format(",acc={}", ulpgate::name(acc_format)) : "",
                         in + (epilogue_rounded ? ",epi=rounded" : ""));
  }
  return "";
}

std::optional<AccumulationModel> AccumulationModel::parse(const std::string& text) {
  const std::string base = model_name::base(text);
  AccumulationModel m;
  if (base == "cpu.fp32_seq") {
    m.order = Order::SequentialFma;
  } else if (base == "cpu.fp32_pairwise") {
    m.order = Order::Pairwise;
  } else if (base == "cpu.blockfma") {
    m.order = Order::BlockFma;
    m.block = 0;
    m.frac_bits = 0;
  } else {
    return std::nullopt;
  }
  for (const model_name::Param& p : model_name::params(text)) {
    const std::string& key = p.key;
    const std::string& value = p.value;
    auto integer = [&](int lo, int hi) { return model_name::integer(text, p, lo, hi); };
    if (key == "round") {
      const auto r = parse_rounding(value);
      if (!r) throw InputError(fmt::format("kernel '{}': round must be rne, rna, rz, ru or rd, got '{}'", text, value));
      m.rounding = *r;
    } else if (key == "in") {
      const auto r = parse_rounding(value);
      if (!r) throw InputError(fmt::format("kernel '{}': in must be rne, rna, rz, ru or rd, got '{}'", text, value));
      m.input_rounding = *r;
    } else if (key == "epi" && value == "rounded") {
      m.epilogue_rounded = true;
    } else if (key == "splitk" && m.order == Order::SequentialFma) {
      m.split_k = integer(2, 1024);
    } else if (key == "block" && m.order == Order::BlockFma) {
      m.block = integer(1, 512);
    } else if (key == "frac" && m.order == Order::BlockFma) {
      m.frac_bits = integer(1, 52);
    } else if (key == "promote" && m.order == Order::BlockFma) {
      m.promote = integer(1, 1 << 20);
    } else if (key == "acc" && m.order == Order::BlockFma) {
      const auto f = parse_format(value);
      if (!f || (*f != Format::FP32 && *f != Format::FP16))
        throw InputError(fmt::format("kernel '{}': acc must be fp32 or fp16, got '{}'", text, value));
      m.acc_format = *f;
    } else if (key == "interleave" && m.order == Order::BlockFma) {
      m.interleave = integer(1, 512);
    } else if (key == "out" && m.order == Order::BlockFma) {
      m.out_bits = integer(1, 23);
    } else if (key == "align" && m.order == Order::BlockFma) {
      const auto slash = value.find('/');
      const std::string first = value.substr(0, slash);
      if (slash != std::string::npos) {
        const auto fb = parse_format(value.substr(slash + 1));
        if (!fb || *fb == Format::FP64 || first == "product")
          throw InputError(fmt::format("kernel '{}': align=A/B needs two input formats, got '{}'", text, value));
        m.align_format_b = *fb;
      }
      const auto f = parse_format(first);
      if (first != "product" && (!f || *f == Format::FP64))
        throw InputError(fmt::format("kernel '{}': align must be product or an input format (fp32, tf32, fp16, bf16, "
                                     "e4m3, e5m2), got '{}'", text, value));
      m.align_inputs = first != "product";
      if (f) m.align_format = *f;
    } else {
      throw InputError(fmt::format("kernel '{}': unknown parameter '{}'", text, key));
    }
  }
  if (m.align_inputs && m.frac_bits > 50)  // products up to 2^(frac + 2) units, 512 of them in an int64
    throw InputError(fmt::format("kernel '{}': frac must be at most 50 with align=inputs", text));
  if (m.order == Order::BlockFma && (m.block == 0 || m.frac_bits == 0))
    throw InputError(fmt::format("kernel '{}': cpu.blockfma needs block=N and frac=N (e.g. cpu.blockfma:block=16,frac=23,round=rz)", text));
  if (m.interleave && (m.promote == 0 || m.block % m.interleave != 0))
    throw InputError(fmt::format("kernel '{}': interleave needs promote=N and must divide block ({})", text, m.block));
  if (m.promote % m.block != 0)
    throw InputError(fmt::format("kernel '{}': promote must be a multiple of block ({})", text, m.block));
  return m;
}

std::int64_t interleaved_position(std::int64_t q, int block, int promote, int interleave) {
  if (!interleave) return q;
  const std::int64_t chunk = promote, steps = chunk / block, c = q / chunk, r = q % chunk;
  const std::int64_t step = r / block, j = r % block;
  return c * chunk + ((j / interleave) * steps + step) * interleave + j % interleave;
}

float model_dot(const AccumulationModel& m, const double* a, const double* b, std::int64_t k, float acc0) {
  switch (m.order) {
    case AccumulationModel::Order::SequentialFma: {
      // a[i]*b[i] is exact in FP64; the FMA's single rounding is add_round32's.
      const auto run = [&](std::int64_t from, std::int64_t to, float acc) {
        for (std::int64_t i = from; i < to; ++i) acc = add_round32(a[i] * b[i], acc, m.rounding);
        return acc;
      };
      if (m.split_k <= 1) return run(0, k, acc0);
      const std::int64_t part = (k + m.split_k - 1) / m.split_k;
      float total = acc0;
      for (std::int64_t from = 0; from < k; from += part)
        total = add_round32(total, run(from, std::min(k, from + part), 0.0f), Rounding::NearestEven);
      return total;
    }
    case AccumulationModel::Order::Pairwise:
      return k == 0 ? acc0 : add_round32(acc0, pairwise(a, b, k, m.rounding), m.rounding);
    case AccumulationModel::Order::BlockFma: {
      if (m.interleave) {  // deal each chunk's products to its steps, then run in step order
        const std::int64_t padded = (k + m.promote - 1) / m.promote * m.promote;
        std::vector<double> pa(static_cast<std::size_t>(padded), 0.0), pb(pa.size(), 0.0);
        for (std::int64_t q = 0; q < padded; ++q)
          if (const std::int64_t at = interleaved_position(q, m.block, m.promote, m.interleave); at < k)
            pa[static_cast<std::size_t>(q)] = a[at], pb[static_cast<std::size_t>(q)] = b[at];
        AccumulationModel in_order = m;
        in_order.interleave = 0;
        return model_dot(in_order, pa.data(), pb.data(), padded, acc0);
      }
      // Without promotion the block accumulator starts from acc0; with it, from 0, and
      // acc0 is the FP32 accumulator its chunks are added to.
      float acc = m.promote ? 0.0f : acc0, outer = acc0;
      std::vector<double> p(m.block);
      std::vector<int> pe(m.align_inputs ? m.block : 0);
      for (std::int64_t i = 0; i < k; i += m.block) {
        const int n = static_cast<int>(std::min<std::int64_t>(m.block, k - i));
        for (int j = 0; j < n; ++j) p[j] = a[i + j] * b[i + j];
        // The step's products, aligned by their own leading bits or (align_inputs) by their
        // factors' exponents.
        const int* aligned_by = nullptr;
        if (m.align_inputs) {
          const int emin = info(m.align_format).emin(), emin_b = info(m.align_format_b.value_or(m.align_format)).emin();
          for (int j = 0; j < n; ++j)
            pe[j] = p[j] != 0.0 ? std::max(std::ilogb(a[i + j]), emin) + std::max(std::ilogb(b[i + j]), emin_b) : 0;
          aligned_by = pe.data();
        }
        acc = block_step(m, acc, p.data(), aligned_by, n);
        if (m.promote && ((i + n) % m.promote == 0 || i + n == k)) {
          outer = add_round32(outer, acc, Rounding::NearestEven);
          acc = 0.0f;
        }
      }
      return m.promote ? outer : acc;
    }
  }
  return acc0;
}

Code model_epilogue(const Case& c, float acc, double c_value, double bias_value, bool rounded_before_bias) {
  const Format fd = c.types.at("D");
  float v = acc;
  const double sab = scale(c, "A") * scale(c, "B");
  if (sab != 1.0) v = v * static_cast<float>(sab);
  if (c.alpha != 1.0) v = static_cast<float>(c.alpha) * v;
  if (c.beta != 0.0)
    v = std::fma(static_cast<float>(c.beta), static_cast<float>(scale(c, "C") * c_value), v);
  if (rounded_before_bias && (has_bias(c.epilogue) || has_gelu(c.epilogue)) && std::isfinite(v))
    v = static_cast<float>(decode(fd, encode(fd, v, Rounding::NearestEven, is_fp8(fd) ? Overflow::Saturate : Overflow::NoSaturate)));
  if (has_bias(c.epilogue)) v = v + static_cast<float>(bias_value);
  switch (c.epilogue) {
    case Epilogue::Relu:
    case Epilogue::BiasRelu: v = v < 0.0f ? 0.0f : v; break;  // NaN stays NaN
    case Epilogue::Gelu:
    case Epilogue::BiasGelu: v = static_cast<float>(gelu_erf(v)); break;
    case Epilogue::GeluTanh:
    case Epilogue::BiasGeluTanh: v = static_cast<float>(gelu_tanh(v)); break;
    default: break;
  }
  if (scale(c, "D") != 1.0) v = v * static_cast<float>(scale(c, "D"));
  return encode(fd, v, Rounding::NearestEven, is_fp8(fd) ? Overflow::Saturate : Overflow::NoSaturate);
}

std::unique_ptr<Kernel> make_emulated_gemm(const AccumulationModel& m) { return std::make_unique<EmulatedGemm>(m); }

std::vector<AccumulationModel> default_models() {
  using O = AccumulationModel::Order;
  return {
      {O::SequentialFma, 1, 23, Rounding::NearestEven},
      {O::Pairwise, 1, 23, Rounding::NearestEven},
      {O::BlockFma, 4, 23, Rounding::TowardZero},   // Volta-like (Fasi et al.)
      {O::BlockFma, 16, 13, Rounding::TowardZero},  // a low-precision accumulator, FP8-fast-accumulation-like
  };
}

}  // namespace ulpgate
