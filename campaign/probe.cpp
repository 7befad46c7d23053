#include "campaign/probe.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/rng.hpp"
#include "check/runner.hpp"
#include "kernels/emulated/gemm_models.hpp"
#if ULPGATE_HAVE_CUDA
#include "kernels/probe/mma_unit.hpp"
#endif

namespace ulpgate {
namespace {

// Steps of `block` products from index 0: each step's values, zero padded.
std::vector<double> in_steps(std::initializer_list<std::initializer_list<double>> steps, int block) {
  std::vector<double> p;
  for (const auto& step : steps) {
    if (step.size() > static_cast<std::size_t>(block)) throw std::logic_error("probe: a step longer than the block");
    p.insert(p.end(), step.begin(), step.end());
    p.resize(p.size() + static_cast<std::size_t>(block) - step.size(), 0.0);
  }
  return p;
}

// The first j in [from, to] whose 2^-j the experiment loses; 0 when it keeps every one.
int first_lost(int from, int to, const std::function<bool(double)>& kept) {
  for (int j = from; j <= to; ++j)
    if (!kept(std::ldexp(1.0, -j))) return j;
  return 0;
}

}  // namespace

std::string ProbedAccumulation::describe() const {
  const std::string f = frac ? fmt::format("{} fraction bits", *frac) : fmt::format(">= {} fraction bits", frac_at_least);
  const std::string r = rounding_moot ? "no rounding (no step's sum passes FP32's 24 bits)"
                        : rounding    ? std::string(name(*rounding))
                                      : "rounding not observable (no step sum it can build needs rounding)";
  return fmt::format("block {}, {}{}, {}{}{}{}{}", block, f,
                     align_inputs ? (*align_inputs ? fmt::format(" (aligned by the factors' exponents{})",
                                                                 align_format ? fmt::format(" as {}", name(*align_format)) : "")
                                                   : std::string(" (aligned by each product)"))
                                  : "",
                     r, accumulator != Format::FP32 ? fmt::format(", accumulated in {}", name(accumulator))
                        : out < 23                  ? fmt::format(", each step's sum kept to {} fraction bits", out)
                                                    : "",
                     interleave ? fmt::format(", {} steps per chunk dealt {} products at a time", promote / block, interleave) : "",
                     promote ? fmt::format(", {} FP32 every {} products", interleave ? "chunks added in" : "promoted to", promote) : "",
                     validated ? fmt::format("; the model agrees on {} random dot products", validated)
                               : "; not validated (a parameter is not known)");
}

AccumulationModel ProbedAccumulation::model(Format input) const {
  AccumulationModel m;
  m.order = AccumulationModel::Order::BlockFma, m.block = block, m.frac_bits = frac.value_or(52);
  m.rounding = rounding.value_or(Rounding::TowardZero), m.promote = promote;
  m.align_inputs = align_inputs.value_or(false), m.align_format = align_format.value_or(input);
  m.out_bits = out, m.interleave = interleave, m.acc_format = accumulator;
  if (info(accumulator).frac_bits <= out) m.out_bits = 23;  // the format's own precision: no second rounding
  return m;
}

namespace {

// x is a normal finite value of f.
bool normal_value(double x, Format f) {
  if (!std::isfinite(x) || x == 0) return false;
  const FormatInfo& fi = info(f);
  return std::fabs(x) >= fi.min_normal() && std::fabs(x) <= fi.max_finite() && decode(f, encode(f, x)) == x;
}

}  // namespace

std::optional<std::pair<double, double>> split_product(double p, Format input) {
  if (p == 0) return std::pair{0.0, 1.0};
  if (!std::isfinite(p)) return std::nullopt;
  int e = 0;
  const double frac = std::frexp(std::fabs(p), &e);  // |p| = frac 2^e, frac in [0.5, 1)
  auto m = static_cast<std::uint64_t>(std::ldexp(frac, 53));
  int q = e - 53;  // |p| = m 2^q
  const int tz = std::countr_zero(m);
  m >>= tz, q += tz;  // m odd
  const int bits = std::min(info(input).frac_bits + 1, 20);  // significand bits (FP32's split: m < 2^20 only)
  const std::uint64_t limit = std::uint64_t{1} << bits;
  if (m >= limit * limit) return std::nullopt;
  for (std::uint64_t d = 1; d < limit; d += 2) {
    if (m % d != 0 || m / d >= limit) continue;
    const std::uint64_t other = m / d;
    // a = d 2^qa near sqrt(|p|), then outwards until both are normal values
    const int target = static_cast<int>(std::floor(std::log2(std::fabs(p)) / 2));
    const int qa0 = target - static_cast<int>(std::floor(std::log2(static_cast<double>(d))));
    for (int step = 0; step <= 600; ++step) {
      const int qa = qa0 + (step % 2 ? (step + 1) / 2 : -(step / 2));
      const double a = std::ldexp(static_cast<double>(d), qa), b = std::ldexp(static_cast<double>(other), q - qa);
      if (normal_value(a, input) && normal_value(b, input)) return std::pair{p < 0 ? -a : a, b};
    }
  }
  return std::nullopt;
}

namespace {

// An mn x mn x K GEMM case of `input` factors the kernel takes: any layout and transpose
// (op(A) rows and op(B) columns are contiguous vectors in all of them; cuBLASLt FP8: TN
// only), K padded to a multiple of 16 where the kernel needs it (FP8 again): the zero
// products appended add nothing after the probe's terms and leave its blocks where they
// were. TF32 inputs are FP32 tensors of TF32 values with TF32 compute (dtype tf32).
Case probe_case(Kernel& kernel, Format input, std::int64_t mn, std::int64_t k) {
  const Format stored = input == Format::TF32 ? Format::FP32 : input;
  Case c;
  std::optional<std::string> why;  // the first refusal
  for (const std::int64_t padded : {k, (k + 15) / 16 * 16})
    for (int variant = 0; variant < 8; ++variant) {
      c = Case{};
      c.op = Op::Gemm;
      c.kernel = kernel.name();
      c.gemm.m = c.gemm.n = mn;
      c.gemm.k = padded;
      c.gemm.trans_a = variant & 1, c.gemm.trans_b = variant & 2;
      c.gemm.layout = variant & 4 ? Layout::ColMajor : Layout::RowMajor;
      c.types = {{"A", stored}, {"B", stored}, {"D", Format::FP32}, {"compute", input == Format::TF32 ? Format::TF32 : Format::FP32}};
      validate(c);
      const auto no = kernel.unsupported(c);
      if (!no) return c;
      if (!why) why = no;
    }
  throw InputError(fmt::format("kernel '{}' does not take the probe's {} x {} x {} {} GEMM in any layout: {}", kernel.name(),
                               mn, mn, k, name(input), *why));
}

// The probe's products as factors of the unit's input format, zero padded to `length`
// (FP32: A the products, B ones; otherwise split_product's two normal values).
std::pair<std::vector<double>, std::vector<double>> factors(std::span<const double> p, Format input, std::size_t length) {
  std::vector<double> a(std::max(length, p.size()), 0.0), b(a.size(), 0.0);
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (input == Format::FP32) {
      a[i] = p[i], b[i] = 1.0;
      continue;
    }
    const auto ab = split_product(p[i], input);
    if (!ab) throw std::logic_error(fmt::format("probe: {:a} is not a product of two normal {} values", p[i], name(input)));
    a[i] = ab->first, b[i] = ab->second;
  }
  return {std::move(a), std::move(b)};
}

// Runs the case on inputs whose op(A) row d and op(B) column d hold dot d's factors (every
// other element zero), d < dots <= mn; D[d][d] is dot d.
std::vector<float> run_diagonal(Kernel& kernel, const Case& c, Format input, const std::vector<double>& a,
                                const std::vector<double>& b, std::int64_t dots, std::int64_t k) {
  const Format stored = input == Format::TF32 ? Format::FP32 : input;
  const MatrixView av = gemm_view(c, "A"), bv = gemm_view(c, "B"), dv = gemm_view(c, "D");
  std::map<std::string, Tensor> in{{"A", Tensor(stored, static_cast<std::size_t>(av.elements()))},
                                   {"B", Tensor(stored, static_cast<std::size_t>(bv.elements()))}};
  for (std::int64_t d = 0; d < dots; ++d)
    for (std::int64_t i = 0; i < k; ++i) {
      in.at("A").set_value(static_cast<std::size_t>(op_a_offset(c, av, 0, d, i)), a[static_cast<std::size_t>(d * k + i)]);
      in.at("B").set_value(static_cast<std::size_t>(op_b_offset(c, bv, 0, i, d)), b[static_cast<std::size_t>(d * k + i)]);
    }
  const RunOutcome out = run_kernel(kernel, c, in);
  if (out.status != Disposition::Ok)
    throw std::runtime_error(fmt::format("kernel '{}' failed on a probe case: {}", kernel.name(), out.message));
  std::vector<float> r(static_cast<std::size_t>(dots));
  for (std::int64_t d = 0; d < dots; ++d)
    r[static_cast<std::size_t>(d)] = static_cast<float>(decode(Format::FP32, out.outputs.at("D").code(static_cast<std::size_t>(dv.offset(0, d, d)))));
  return r;
}

}  // namespace

ProbeDot kernel_unit(Kernel& kernel, Format input, std::int64_t mn) {
  if (mn < 1) throw InputError("probe: M = N must be at least 1");
  return [&kernel, input, mn](std::span<const double> p) {
    // D[0][0] of an mn x mn x K GEMM (mn > 1 makes a library take the path it takes for
    // real shapes: at 1 x 1 cuBLAS reduces like a GEMV).
    const auto k = static_cast<std::int64_t>(p.size());
    const Case c = probe_case(kernel, input, mn, k);
    const auto [a, b] = factors(p, input, static_cast<std::size_t>(c.gemm.k));
    return run_diagonal(kernel, c, input, a, b, 1, c.gemm.k).front();
  };
}

ProbeBatch kernel_batch(Kernel& kernel, Format input, std::int64_t mn) {
  if (mn < 1) throw InputError("probe: M = N must be at least 1");
  ProbeBatch batch;
  batch.input = input;
  batch.step = 16;  // K a multiple of 16: every kernel takes it
  batch.run = [&kernel, input, mn](const std::vector<double>& a, const std::vector<double>& b, std::int64_t dots,
                                   std::int64_t k) {
    const Case c = probe_case(kernel, input, mn, k);
    if (c.gemm.k != k) throw std::logic_error("kernel_batch: K must be one the kernel takes");
    std::vector<float> out;
    for (std::int64_t first = 0; first < dots; first += mn) {  // mn dots per GEMM, on its diagonal
      const std::int64_t n = std::min(mn, dots - first);
      const std::vector<double> pa(a.begin() + first * k, a.begin() + (first + n) * k), pb(b.begin() + first * k, b.begin() + (first + n) * k);
      const std::vector<float> r = run_diagonal(kernel, c, input, pa, pb, n, k);
      out.insert(out.end(), r.begin(), r.end());
    }
    return out;
  };
  return batch;
}

std::pair<ProbeDot, ProbeBatch> mma_unit(const std::string& instruction) {
#if ULPGATE_HAVE_CUDA
  const MmaInstruction* inst = find_mma_instruction(instruction);
  if (!inst) {
    std::string names;
    for (const MmaInstruction& i : mma_instructions()) names += (names.empty() ? "" : ", ") + i.name;
    throw InputError(fmt::format("unknown instruction '{}' ({})", instruction, names));
  }
  if (!mma_available()) throw InputError(fmt::format("instruction '{}': no CUDA device of compute capability 8.9 or more here", instruction));
  if (inst->warpgroup && !wgmma_available())
    throw InputError(fmt::format("instruction '{}': wgmma needs a device of compute capability 9.0 (sm_90a)", instruction));
  // TF32 operands go as FP32 words (the instruction reads the top 19 bits).
  const Format stored = inst->input == Format::TF32 ? Format::FP32 : inst->input;
  const auto word = [stored](double v) { return static_cast<std::uint32_t>(code_to_storage(stored, encode(stored, v))); };
  ProbeBatch batch;
  batch.input = inst->input;
  batch.converts_to = mma_converts_inputs(*inst);
  batch.accumulator = inst->accumulator;
  batch.step = inst->k;
  batch.run = [inst, word](const std::vector<double>& a, const std::vector<double>& b, std::int64_t dots, std::int64_t k) {
    std::vector<std::uint32_t> wa(a.size()), wb(b.size());
    for (std::size_t i = 0; i < a.size(); ++i) wa[i] = word(a[i]), wb[i] = word(b[i]);
    return mma_dots(*inst, wa, wb, dots, k);
  };
  ProbeDot dot = [inst, batch](std::span<const double> p) {
    const std::size_t k = std::max<std::size_t>((p.size() + inst->k - 1) / inst->k * inst->k, inst->k);
    const auto [a, b] = factors(p, inst->input, k);
    return batch.run(a, b, 1, static_cast<std::int64_t>(a.size())).front();
  };
  return {dot, batch};
#else
  throw InputError(fmt::format("instruction '{}': this build has no CUDA", instruction));
#endif
}

ProbedAccumulation probe_unit(const ProbeDot& dot, const ProbeBatch& batch, int max_block, int max_promote) {
  ProbedAccumulation p = probe_accumulation(dot, max_block, max_promote, 0, batch.input, batch.accumulator);
  p.align_inputs = probe_alignment(p, batch);
  if (p.align_inputs.value_or(false)) p.align_format = batch.converts_to;
  return p;
}

std::optional<bool> probe_alignment(const ProbedAccumulation& p, const ProbeBatch& unit) {
  if (!p.frac || p.block < 3 || !unit.run) return std::nullopt;
  // (1.5 2^h x 1.5 2^(s-h)), (-1.5 2^h x 1.5 2^(s-h)), 2^(s-frac) in one step, s the
  // experiments' scale: the products' exponent sum is s, the product 2.25 2^s's leading bit
  // s + 1. Aligned by the sum, 2^(s-frac) is the last bit kept; by the product, it is lost.
  const int s = p.scale_exponent, h = s / 2;
  const auto tiny = split_product(std::ldexp(1.0, s - *p.frac), unit.input);
  const double x = std::ldexp(1.5, h), y = std::ldexp(1.5, s - h);
  const auto normal = [&](double v) { return decode(unit.input, encode(unit.input, v)) == v && std::fabs(v) >= info(unit.input).min_normal(); };
  if (!tiny || !normal(x) || !normal(y)) return std::nullopt;
  const auto at = [&](std::int64_t q) { return static_cast<std::size_t>(interleaved_position(q, p.block, p.promote, p.interleave)); };
  const std::int64_t used = static_cast<std::int64_t>(at(2)) + 1;
  const std::int64_t k = (used + unit.step - 1) / unit.step * unit.step;
  std::vector<double> a(static_cast<std::size_t>(k), 0.0), b(a.size(), 0.0);
  a[at(0)] = x, b[at(0)] = y, a[at(1)] = -x, b[at(1)] = y, a[at(2)] = tiny->first, b[at(2)] = tiny->second;
  const double got = unit.run(a, b, 1, k).front();
  if (got == std::ldexp(1.0, s - *p.frac)) return true;
  if (got == 0.0) return false;
  throw std::runtime_error(fmt::format("probe: the alignment experiment gave {:a}, neither 2^{} nor 0", got, s - *p.frac));
}

void for_each_random_batch(Format input, std::int64_t dots, std::int64_t span, std::int64_t step, std::uint64_t seed,
                           const std::function<void(const RandomDotBatch&)>& f) {
  const FormatInfo& fi = info(input);
  step = std::max<std::int64_t>(1, step);
  // A value of the input format: a sign, an exponent in [-4, 4] and random fraction bits
  // (rounded to the format), or (subnormal class, one in four) a random subnormal.
  const auto draw = [&](const RandomBlock& r, bool subnormal) {
    double v;
    if (subnormal && r.w[3] % 4 == 0 && fi.frac_bits > 0)
      v = std::ldexp(static_cast<double>(1 + r.w[2] % ((1u << std::min(fi.frac_bits, 23)) - 1)), fi.emin() - fi.frac_bits);
    else
      v = decode(input, encode(input, std::ldexp(1.0 + static_cast<double>(r.w[0] >> 9) * 0x1p-23, static_cast<int>(r.w[1] % 9) - 4)));
    return (r.w[1] >> 16) & 1 ? -v : v;
  };
  constexpr std::int64_t kBatch = 1 << 15;
  for (std::int64_t first = 0; first < dots; first += kBatch) {
    // This batch's dots grouped by padded length (one launch each).
    std::map<std::int64_t, std::vector<std::int64_t>> by_k;
    for (std::int64_t d = first; d < std::min(dots, first + kBatch); ++d) {
      const std::uint32_t w = random_block(seed, 20, static_cast<std::uint64_t>(d)).w[0];
      const std::int64_t k = 1 + static_cast<std::int64_t>(w % static_cast<std::uint64_t>(span));
      by_k[(k + step - 1) / step * step].push_back(d);
    }
    for (auto& [kp, ids] : by_k) {
      RandomDotBatch batch;
      batch.k = kp;
      const auto n = static_cast<std::int64_t>(ids.size());
      batch.a.assign(static_cast<std::size_t>(n * kp), 0.0);
      batch.b.assign(batch.a.size(), 0.0);
      batch.cls.resize(ids.size());
      batch.length.resize(ids.size());
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int64_t d = ids[static_cast<std::size_t>(j)];
        const RandomBlock head = random_block(seed, 20, static_cast<std::uint64_t>(d));
        const std::int64_t k = 1 + static_cast<std::int64_t>(head.w[0] % static_cast<std::uint64_t>(span));
        const int c = static_cast<int>(head.w[1] % 3);  // 0 normal, 1 cancelling, 2 subnormal
        batch.cls[static_cast<std::size_t>(j)] = c;
        batch.length[static_cast<std::size_t>(j)] = k;
        double* x = batch.a.data() + j * kp;
        double* y = batch.b.data() + j * kp;
        const std::int64_t half = k / 2;
        for (std::int64_t q = 0; q < k; ++q) {
          const RandomBlock r = random_block(seed, 21, (static_cast<std::uint64_t>(d) << 20) + static_cast<std::uint64_t>(q));
          if (c == 1 && q >= half && q - half < half) {  // cancel product q - half, one factor off by an ulp or not
            x[q] = -x[q - half];
            const double base = y[q - half];
            y[q] = r.w[0] % 2 ? base : decode(input, r.w[0] % 4 == 1 ? next_up(input, encode(input, base)) : next_down(input, encode(input, base)));
            continue;
          }
          x[q] = draw(r, c == 2);
          const RandomBlock r2 = random_block(seed, 22, (static_cast<std::uint64_t>(d) << 20) + static_cast<std::uint64_t>(q));
          y[q] = draw(r2, c == 2);
        }
      }
      batch.ids = std::move(ids);
      f(batch);
    }
  }
}

BatchValidation validate_batched(const ProbedAccumulation& p, const ProbeBatch& unit, Format input, std::int64_t dots,
                                 std::uint64_t seed) {
  if (!p.known()) throw std::logic_error("validate_batched: the probed model is not fully known");
  const AccumulationModel m = p.model(input);
  const std::int64_t span = std::max<std::int64_t>(8 * p.block, 3 * p.promote) + 7;
  BatchValidation out;
  static constexpr const char* kClass[] = {"normal", "cancelling", "subnormal"};
  std::int64_t* const count[] = {&out.normal, &out.cancelling, &out.subnormal};
  for_each_random_batch(input, dots, span, unit.step, seed, [&](const RandomDotBatch& batch) {
    const std::int64_t kp = batch.k;
    const auto n = static_cast<std::int64_t>(batch.ids.size());
    const std::vector<float> got = unit.run(batch.a, batch.b, n, kp);
    for (std::int64_t j = 0; j < n; ++j) {
      const auto u = static_cast<std::size_t>(j);
      const float want = model_dot(m, batch.a.data() + j * kp, batch.b.data() + j * kp, kp);
      if (std::bit_cast<std::uint32_t>(want) != std::bit_cast<std::uint32_t>(got[u])) {
        std::string terms;
        for (std::int64_t q = 0; q < std::min<std::int64_t>(kp, 8); ++q)
          terms += fmt::format("{}{:a} x {:a}", q ? ", " : "", batch.a[static_cast<std::size_t>(j * kp + q)],
                               batch.b[static_cast<std::size_t>(j * kp + q)]);
        throw std::runtime_error(fmt::format("the inferred {} gives {:a} where the unit gives {:a} (random dot product {} "
                                             "of {} products, {} class: {}{})",
                                             m.name(), want, got[u], batch.ids[u], kp, kClass[batch.cls[u]], terms,
                                             kp > 8 ? ", ..." : ""));
      }
      ++*count[batch.cls[u]];
    }
  });
  return out;
}

std::int64_t dump_batched(const ProbeBatch& unit, const std::string& unit_name, std::int64_t dots, std::int64_t span,
                          const std::string& path, std::uint64_t seed) {
  const Format input = unit.input;
  const int bytes = (info(input).bits + 7) / 8;
  if (bytes > 4) throw InputError(fmt::format("probe --dump: {} inputs: a dump's words are at most 32 bits", name(input)));
  std::string out = fmt::format("ulpgate-dots 1 unit={} input={} step={} seed={} span={}\n", unit_name, name(input),
                                unit.step, seed, span);
  std::int64_t written = 0;
  const auto put = [&](std::uint32_t w, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((w >> (8 * i)) & 0xff));
  };
  for_each_random_batch(input, dots, span, unit.step, seed, [&](const RandomDotBatch& batch) {
    const auto n = static_cast<std::int64_t>(batch.ids.size());
    const std::vector<float> got = unit.run(batch.a, batch.b, n, batch.k);
    for (std::int64_t j = 0; j < n; ++j) {
      const auto u = static_cast<std::size_t>(j);
      const std::int64_t k = batch.length[u];
      put(static_cast<std::uint32_t>(k), 4);
      put(static_cast<std::uint32_t>(batch.cls[u]), 4);
      put(std::bit_cast<std::uint32_t>(got[u]), 4);
      for (const auto* v : {&batch.a, &batch.b})
        for (std::int64_t q = 0; q < k; ++q) put(static_cast<std::uint32_t>(encode(input, (*v)[static_cast<std::size_t>(j * batch.k + q)])), bytes);
      ++written;
    }
  });
  write_text_file_atomically(path, out);
  return written;
}

DotDump read_dots(const std::string& path) {
  const std::string text = read_whole_file(path, "dump of ulpgate probe");
  const std::size_t eol = text.find('\n');
  const auto bad = [&](const std::string& why) { return InputError(fmt::format("{}: not a dump of ulpgate probe ({})", path, why)); };
  if (eol == std::string::npos || text.rfind("ulpgate-dots 1 ", 0) != 0) throw bad("no 'ulpgate-dots 1' header line");
  DotDump d;
  std::string input;
  std::istringstream head(text.substr(15, eol - 15));
  for (std::string field; head >> field;) {
    const std::size_t eq = field.find('=');
    const std::string key = field.substr(0, eq), value = eq == std::string::npos ? "" : field.substr(eq + 1);
    if (key == "unit") d.unit = value;
    else if (key == "input") input = value;
    else if (key == "step") d.step = std::atoi(value.c_str());
  }
  const auto format = parse_format(input);
  if (!format) throw bad(fmt::format("input format '{}'", input));
  d.input = *format;
  const std::size_t bytes = static_cast<std::size_t>((info(d.input).bits + 7) / 8);
  if (bytes > 4) throw bad(fmt::format("input format {}: a dump's words are at most 32 bits", input));
  std::size_t at = eol + 1;
  const auto get = [&](std::size_t n) {
    if (at + n > text.size()) throw bad(fmt::format("truncated at byte {}", at));
    std::uint32_t w = 0;
    for (std::size_t i = 0; i < n; ++i) w |= static_cast<std::uint32_t>(static_cast<unsigned char>(text[at + i])) << (8 * i);
    at += n;
    return w;
  };
  while (at < text.size()) {
    DumpedDot dot;
    const std::uint32_t k = get(4);
    dot.cls = static_cast<int>(get(4));
    dot.result = std::bit_cast<float>(get(4));
    if (k > (text.size() - at) / bytes) throw bad(fmt::format("a dot product of {} factors past the end", k));
    for (auto* v : {&dot.a, &dot.b})
      for (std::uint32_t q = 0; q < k; ++q) v->push_back(decode(d.input, get(bytes)));
    d.dots.push_back(std::move(dot));
  }
  return d;
}

namespace {

// The experiments of probe_accumulation, each filling in its parameters of r_ in turn: a
// later experiment is built on what the earlier ones found.
class Prober {
 public:
  Prober(const ProbeDot& dot, int max_block, int max_promote, Format input, Format accumulator)
      : dot_(dot), max_block_(max_block), max_promote_(max_promote), input_(input), acc_(info(accumulator)),
        fp32_(input == Format::FP32) {
    r_.accumulator = accumulator;
  }
  ProbedAccumulation probe(int validate);

 private:
  bool can_raw(double v) const;
  bool can(double v) const;
  int reach_below(bool scaled) const;
  void choose_scale();
  double run(const std::vector<double>& p) const;
  bool tiny_kept_at(int t) const;
  void probe_block();
  void probe_frac();
  std::optional<bool> step_exact(std::vector<double> terms) const;
  void probe_out();
  void probe_promotion();
  std::optional<std::vector<double>> rounding_terms(double sum, double top) const;
  void probe_rounding();
  void probe_wide_single();
  void validate_model(int validate);

  const ProbeDot& dot_;
  const int max_block_, max_promote_;
  const Format input_;
  const FormatInfo& acc_;
  const bool fp32_;
  ProbedAccumulation r_;
  int s_ = 0;  // the experiments' scale exponent
  int tiny_bits_ = 0;
  double tiny_ = 0.0;  // the block experiment's tiny term 2^-tiny_bits_
};

ProbedAccumulation Prober::probe(int validate) {
  choose_scale();
  tiny_bits_ = reach_below(true);
  tiny_ = std::ldexp(1.0, -tiny_bits_);
  probe_block();
  probe_frac();
  probe_out();
  probe_promotion();
  probe_rounding();
  // A width so narrow that no step's sum (block products and the accumulator, each below
  // 2^(frac+2) units of the grid) passes the result's out + 1 bits (FP32's 24) never
  // rounds: the rounding is moot, and the model's (toward zero) gives the same bits.
  if (!r_.rounding && r_.frac && *r_.frac + 2 + static_cast<int>(std::ceil(std::log2(r_.block + 1.0))) <= r_.out + 1)
    r_.rounding = Rounding::TowardZero, r_.rounding_moot = true;
  probe_wide_single();
  validate_model(validate);
  return r_;
}

// Which products the unit's inputs can make: FP32 numbers (B = 1), else products of two
// normal values of the input format.
bool Prober::can_raw(double v) const {
  return fp32_ ? static_cast<double>(static_cast<float>(v)) == v : split_product(v, input_).has_value();
}

bool Prober::can(double v) const {
  return can_raw(std::ldexp(v, s_)) && std::fabs(std::ldexp(v, s_)) >= acc_.min_subnormal();
}

// The tiny term 2^-bits of the block experiment: the smallest power of two the products
// can make, at most 2^-100.
int Prober::reach_below(bool scaled) const {
  int bits = 100;
  while (bits > 2 && !(scaled ? can(std::ldexp(1.0, -bits)) : can_raw(std::ldexp(1.0, -bits)))) --bits;
  return bits;
}

// The experiments are built around 1. Where the products' range below 1 is short (FP16
// and FP8: 2^-28, 2^-12), they run at the scale 2^s of the largest power of two product
// (less one, for the terms near 2): every term times 2^s, the result divided by it (the
// block-FMA model is scale-invariant while nothing overflows or underflows).
// A narrow accumulator (FP16) bounds the scale from above (sums up to 4 x 2^s must stay
// finite) and the terms from below (its smallest subnormal).
void Prober::choose_scale() {
  if (!fp32_ && reach_below(false) < 48)
    for (int e = std::min(40, acc_.emax() - 2); e > 0 && s_ == 0; --e)
      if (can_raw(std::ldexp(1.0, e + 1)) && can_raw(std::ldexp(1.0, e))) s_ = e;
  r_.scale_exponent = s_;
}

// The experiments below are written in step order; run() deals them as the unit does
// once the block experiment has seen an interleaved chunk.
double Prober::run(const std::vector<double>& p) const {
  const std::int64_t n = static_cast<std::int64_t>(p.size());
  const std::int64_t len = r_.interleave ? (n + r_.promote - 1) / r_.promote * r_.promote : n;
  std::vector<double> q(static_cast<std::size_t>(len), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    q[static_cast<std::size_t>(interleaved_position(i, r_.block, r_.promote, r_.interleave))] =
        std::ldexp(p[static_cast<std::size_t>(i)], s_);
  return std::ldexp(static_cast<double>(dot_(q)), -s_);
}

bool Prober::tiny_kept_at(int t) const {
  std::vector<double> p(static_cast<std::size_t>(t) + 1, 0.0);
  p[0] = 1.0, p[1] = -1.0, p[static_cast<std::size_t>(t)] = tiny_;
  return run(p) == tiny_;
}

// Block: 2^-100 after (1, -1) is lost while it shares their step. Kept at the block and
// every index after it, unless the unit deals its products to steps in groups
// (interleave): then the first index kept, g, is the group, the next one lost again is
// the group's turn to come back to the step of (1, -1) after `steps` groups, and the
// groups at multiples of steps x g stay lost until the chunk (steps x block) ends.
void Prober::probe_block() {
  int first = 0, again = 0;
  for (int t = 2; t <= max_block_ && first == 0; ++t)
    if (tiny_kept_at(t)) first = t;
  if (first == 0)
    throw std::runtime_error(
        fmt::format("probe: 2^-{} lost behind (1, -1) at every distance up to {} products", tiny_bits_, max_block_));
  for (int t = first + 1; t <= std::min(max_block_, 8 * first) && again == 0; ++t)
    if (!tiny_kept_at(t)) again = t;
  if (again == 0) {
    r_.block = first;
    return;
  }
  const int g = first, steps = again / first;
  if (again % g != 0 || steps < 2)
    throw std::runtime_error(fmt::format("probe: 2^-{} behind (1, -1) kept first at {} products, lost again at {}: "
                                         "not a chunk dealt to its steps in groups", tiny_bits_, first, again));
  int m = 2;
  while (m * steps * g <= 8 * max_block_ && !tiny_kept_at(m * steps * g)) ++m;
  if (m * steps * g > 8 * max_block_)
    throw std::runtime_error(fmt::format("probe: an interleaved chunk (groups of {}, {} steps) longer than {} products",
                                         g, steps, 8 * max_block_));
  r_.block = m * g, r_.interleave = g, r_.promote = steps * m * g;
}

// Fraction bits with (1), (-1, 2^-j): kept up to frac when the two share a step. Where
// nothing is lost and the first experiment could not tell 1 from 2, the unit adds one
// product at a time (the -1 cancels the accumulator before 2^-j arrives).
void Prober::probe_frac() {
  const int pad = std::max(r_.block, 2);
  const int widest = std::min(60, tiny_bits_);
  const int lost = first_lost(1, widest, [&](double e) { return run(in_steps({{1.0}, {-1.0, e}}, pad)) == e; });
  if (lost > 0) {
    r_.block = pad, r_.frac = lost - 1;
  } else if (r_.block >= 3) {
    r_.frac_at_least = widest;
  } else {
    r_.block = 1;  // one product per step: a lone 1 + 2^-j is aligned to itself, up to 23
    int j = 1;     // (where the format can make 1 + 2^-j)
    const auto one_plus = [](int bits) { return 1.0 + std::ldexp(1.0, -bits); };
    while (j <= 23 && can(one_plus(j)) && run(std::vector<double>{one_plus(j)}) == one_plus(j)) ++j;
    if (j <= 23 && can(one_plus(j))) r_.frac = j - 1;
    else r_.frac_at_least = j - 1;
  }
}

// Whether the terms, in one step, come back as their exact sum; nullopt where the products
// cannot make them.
std::optional<bool> Prober::step_exact(std::vector<double> terms) const {
  if (!std::all_of(terms.begin(), terms.end(), [&](double v) { return can(v); })) return std::nullopt;
  double sum = 0;
  for (const double t : terms) sum += t;
  terms.resize(static_cast<std::size_t>(r_.block), 0.0);
  return run(terms) == sum;
}

// The step's result: 1 + 2^-j in one step (kept by the alignment while j <= frac) comes
// back exact while the result holds j fraction bits; past the width, 2^c ones and 2^-frac
// (a sum with c more bits above the alignment's) while it holds frac + c. Nothing lost
// up to the carries a step of ones can make: FP32's 23 bits for the model.
void Prober::probe_out() {
  if (!r_.frac || r_.block < 2) return;
  const int w = *r_.frac;
  int out = 0;
  for (int j = 1; j <= std::min(w, 23) && out == 0; ++j) {
    const auto e = step_exact({1.0, std::ldexp(1.0, -j)});
    if (!e) break;
    if (!*e) out = j - 1;
  }
  for (int c = 1; out == 0 && w < 23 && (1 << c) + 1 <= r_.block && w + c <= 23; ++c) {
    std::vector<double> terms(static_cast<std::size_t>(1) << c, 1.0);
    terms.push_back(std::ldexp(1.0, -w));
    const auto e = step_exact(terms);
    if (!e) break;
    if (!*e) out = w + c - 1;
  }
  if (out > 0) r_.out = out;
}

// Promotion, where the width is below FP32's: 2^-(frac+1) kept once it starts a new chunk.
// Kept exactly from the promotion length on (t a multiple of the block): doubling, then
// bisection.
void Prober::probe_promotion() {
  if (r_.interleave || !r_.frac || *r_.frac >= 23 || !can(std::ldexp(1.0, -(*r_.frac + 1)))) return;
  const double e = std::ldexp(1.0, -(*r_.frac + 1));
  const auto kept_at = [&](int t) {
    std::vector<double> p(static_cast<std::size_t>(t) + 1, 0.0);
    p[0] = 1.0, p[static_cast<std::size_t>(t)] = e;
    return run(p) == 1.0 + e;
  };
  int lo = 0, hi = r_.block;  // blocks: lost at lo (0: none tried), kept at hi
  while (hi <= max_promote_ && !kept_at(hi)) lo = hi, hi *= 2;
  if (hi > max_promote_) return;
  while (hi - lo > r_.block) {
    const int mid = lo + (hi - lo) / (2 * r_.block) * r_.block;
    (kept_at(mid) ? hi : lo) = mid;
  }
  r_.promote = hi;
}

// The products of a rounding experiment summing to `sum`: (2 - g as often as it fits, then
// the rest) in one step, or the first in the step before when one more than the block is
// needed (not where every block is promoted); nullopt for more terms than that.
std::optional<std::vector<double>> Prober::rounding_terms(double sum, double top) const {
  std::vector<double> terms;
  double rest = sum;  // exact: multiples of g below 2^(e_top + 1) (probe_rounding's g and e_top)
  while (rest >= top && terms.size() <= static_cast<std::size_t>(r_.block)) terms.push_back(top), rest -= top;
  if (rest > 0) terms.push_back(rest);
  const auto makeable = [&] { return std::all_of(terms.begin(), terms.end(), [&](double v) { return can(v); }); };
  if (!makeable()) {  // a narrow input format: ones and the remainder below 1 (3 g, say)
    terms.assign(static_cast<std::size_t>(std::floor(sum)), 1.0);
    if (sum > std::floor(sum)) terms.push_back(sum - std::floor(sum));
    if (terms.size() > static_cast<std::size_t>(r_.block) + 1 || !makeable()) return std::nullopt;
  }
  const auto n = static_cast<std::int64_t>(terms.size());
  if (n <= r_.block) {
    terms.resize(static_cast<std::size_t>(r_.block), 0.0);
    return terms;
  }
  if (n == r_.block + 1 && (r_.promote == 0 || r_.promote > r_.block)) {
    std::vector<double> p(static_cast<std::size_t>(2 * r_.block), 0.0);
    p[0] = terms[0];
    std::copy(terms.begin() + 1, terms.end(), p.begin() + r_.block);
    return p;
  }
  return std::nullopt;
}

// Rounding, where a step's sum can need it. On the width's grid g = 2^-w (w = frac, at
// most 23) a sum of terms below 2 reaching 2^E, E = 24 - w, has more bits than FP32 holds:
// 2^E + 3g lies halfway between 2^E + 2g and 2^E + 4g, 2^E + g between 2^E and 2^E + 2g.
// More terms than rounding_terms() takes, and the unit never rounds a sum we can build.
void Prober::probe_rounding() {
  // the step's result rounds at out bits below its leading bit: w = min(frac, out) and
  // e_top = out + 1 - w put that rounding between g and 2 g
  const int w = std::min(r_.frac.value_or(r_.out), r_.out), e_top = r_.out + 1 - w;
  const double g = std::ldexp(1.0, -w), top = 2.0 - g, base = std::ldexp(1.0, e_top);
  const auto pa = rounding_terms(base + 3 * g, top), pc = rounding_terms(base + g, top);
  if (!pa || !pc) return;
  std::vector<double> pb = *pa;
  for (double& v : pb) v = -v;
  const double a = run(*pa), b = run(pb), c = run(*pc);
  const double up = base + 4 * g, down = base + 2 * g;
  const bool a_up = a == up, b_away = b == -up, c_up = c == base + 2 * g;
  if ((a != up && a != down) || (b != -up && b != -down) || (c != base && c != base + 2 * g))
    throw std::runtime_error(fmt::format("probe: the rounding experiments gave {}, {}, {}: not a rounding of the ties "
                                         "2^{} + 3 2^-{} and 2^{} + 2^-{}",
                                         a, b, c, e_top, w, e_top, w));
  if (a_up && b_away) r_.rounding = c_up ? Rounding::NearestAway : Rounding::NearestEven;
  else if (!a_up && !b_away) r_.rounding = Rounding::TowardZero;
  else r_.rounding = a_up ? Rounding::Up : Rounding::Down;
  if (c_up != (r_.rounding == Rounding::NearestAway || r_.rounding == Rounding::Up))
    throw std::runtime_error(fmt::format("probe: the rounding experiments disagree ({}, {}, {})", a, b, c));
}

// One product per step with at least 23 fraction bits: the width shows in how a bit below
// the accumulator's last place decides the rounding after a 1 (nearest even: 2^-24 + 2^-j,
// a tie broken upward by 2^-j when kept; toward zero or down: -2^-j, 1 - 2^-24 when kept;
// up: 2^-j, 1 + 2^-23 when kept), observable up to 47 (the products are FP32 numbers).
// Nearest-away is left at "at least 23".
void Prober::probe_wide_single() {
  if (!fp32_ || r_.block != 1 || r_.frac || !r_.rounding || *r_.rounding == Rounding::NearestAway) return;
  const Rounding mode = *r_.rounding;
  const auto kept = [&](double e) {
    if (mode == Rounding::NearestEven) return run({1.0, 0x1p-24 + e}) == 1.0 + 0x1p-23;
    if (mode == Rounding::Up) return run({1.0, e}) == 1.0 + 0x1p-23;
    return run({1.0, -e}) == 1.0 - 0x1p-24;
  };
  // nearest even: 24 bits or 23 from 1 + 3 2^-24 (a tie to 1 + 2^-22 only when kept)
  const bool even = mode == Rounding::NearestEven;
  if (even && run({1.0, 3 * 0x1p-24}) != 1.0 + 0x1p-22) {
    r_.frac = 23;
    return;
  }
  const int lost_wide = first_lost(even ? 25 : 24, 47, kept);
  if (lost_wide > 0) r_.frac = lost_wide - 1;
  else r_.frac_at_least = 48;
}

// Product q of random dot product i: a sign, an exponent in [-8, 8], 23 random fraction
// bits: an FP32 number; for other inputs the product of two such values (exponents in
// [-4, 4], normal) rounded to the input format.
double random_product(Format input, int i, std::int64_t q) {
  const bool fp32 = input == Format::FP32;
  const RandomBlock b = random_block(0x9e3779b9, 19, (static_cast<std::uint64_t>(i) << 24) + static_cast<std::uint64_t>(q));
  const auto draw = [&](std::uint32_t bits, std::uint32_t exp) {
    const int e = fp32 ? static_cast<int>(exp % 17) - 8 : static_cast<int>(exp % 9) - 4;
    const double v = std::ldexp(1.0 + static_cast<double>(bits >> 9) * 0x1p-23, e);
    return fp32 ? v : decode(input, encode(input, v));
  };
  const double v = fp32 ? draw(b.w[0], b.w[1]) : draw(b.w[0], b.w[1]) * draw(b.w[3], b.w[1] >> 8);
  return (b.w[2] & 1) ? -v : v;
}

// Validation: the inferred model against the unit on random FP32 products (not where a
// width below 48 bits or the rounding is left unknown: no single model stands for the
// unit then).
void Prober::validate_model(int validate) {
  const AccumulationModel m = r_.model(input_);
  const std::int64_t span = std::max<std::int64_t>(8 * r_.block, 3 * r_.promote) + 7;
  if (!r_.known()) validate = 0;
  for (int i = 0; i < validate; ++i) {
    const std::uint32_t w = random_block(0x9e3779b9, 18, static_cast<std::uint64_t>(i)).w[0];
    const std::int64_t k = 1 + static_cast<std::int64_t>(w % static_cast<std::uint64_t>(span));
    std::vector<double> p(static_cast<std::size_t>(k)), ones(p.size(), 1.0);
    for (std::int64_t q = 0; q < k; ++q) p[static_cast<std::size_t>(q)] = random_product(input_, i, q);
    const float want = model_dot(m, p.data(), ones.data(), k), got = dot_(p);
    if (std::bit_cast<std::uint32_t>(want) != std::bit_cast<std::uint32_t>(got))
      throw std::runtime_error(fmt::format("the inferred {} gives {} where the unit gives {} (random dot product {} of "
                                           "{} products)",
                                           m.name(), want, got, i, k));
    ++r_.validated;
  }
}

}  // namespace

ProbedAccumulation probe_accumulation(const ProbeDot& dot, int max_block, int max_promote, int validate, Format input,
                                      Format accumulator) {
  return Prober(dot, max_block, max_promote, input, accumulator).probe(validate);
}

}  // namespace ulpgate
