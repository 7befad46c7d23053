#include "distributions/fill.hpp"
#include "distributions/fill_gpu.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "distributions/gendot.hpp"
#include "distributions/sampling.hpp"
#include "core/error.hpp"
#include "core/parallel.hpp"
#include "core/rng.hpp"

namespace ulpgate {
namespace {

using sampling::Kind;
using sampling::Sampler;
// An operand's values before rounding to its format, every one written by the fill.
using Values = std::vector<double, DefaultInitAllocator<double>>;

[[noreturn]] void fail(std::string_view op, const std::string& msg) {
  throw InputError(fmt::format("case.dist.{}: {}", op, msg));
}

// The logical shape of an input and where each logical element lives in its buffer.
// Elements of an operand worth a thread of their own when filling (a few ms of sampling),
// handed out in chunks of kFillGrain.
constexpr double kFillPerThread = 0x1p15;
constexpr std::int64_t kFillGrain = 4096;
constexpr int kMaxDims = 8;

struct Operand {
  std::string name;
  Format format;
  std::uint32_t stream;
  std::vector<std::int64_t> dims;  // logical extents (docs/concepts/cases.md table)
  int reduction_axis, channel_axis;
  std::int64_t storage;            // buffer elements, padding included
  std::function<std::int64_t(const std::int64_t*)> offset;
  // Paged K/V (AttentionShape::page_size): the pool's view and which slots hold keys. A line
  // (b, h, s, :) is stored only by the table entry owning its page (a shared page holds one
  // batch's keys); the rest of the pool is not padding of one kind (store_pool).
  std::optional<AttentionView> pool;
  std::shared_ptr<const PageUse> pages;

  std::int64_t count() const {
    std::int64_t n = 1;
    for (auto d : dims) n *= d;
    return n;
  }
  std::int64_t stride(int axis) const {
    std::int64_t s = 1;
    for (int a = static_cast<int>(dims.size()) - 1; a > axis; --a) s *= dims[a];
    return s;
  }
  /// The coordinates of logical index idx.
  void coordinates(std::int64_t idx, std::int64_t* x) const {
    for (int a = static_cast<int>(dims.size()) - 1; a >= 0; --a) {
      x[a] = idx % dims[a];
      idx /= dims[a];
    }
  }
  /// Calls fn(logical index) for every logical element, on several threads when there are
  /// enough of them (each element is a pure function of its index: any order gives the
  /// same bits).
  template <class Fn>
  void for_each_parallel(Fn&& fn) const {
    const std::int64_t n = count();
    parallel_for(n, fn, threads_for(static_cast<double>(n), kFillPerThread), kFillGrain);
  }
  /// Calls fn(logical index, coordinates) for every logical element, in index order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    std::vector<std::int64_t> coord(dims.size(), 0);
    const std::int64_t n = count();
    for (std::int64_t idx = 0; idx < n; ++idx) {
      fn(idx, coord.data());
      for (int a = static_cast<int>(dims.size()) - 1; a >= 0; --a) {
        if (++coord[a] < dims[a]) break;
        coord[a] = 0;
      }
    }
  }
};

Operand describe(const Case& c, const std::string& op) {
  Operand o;
  o.name = op;
  o.format = c.types.at(op);
  o.stream = operand_stream(op);
  if (c.op == Op::Gemm) {
    const auto& g = c.gemm;
    const MatrixView v = gemm_view(c, op);
    o.storage = v.elements();
    if (op == "A") {
      o.dims = {g.batch, g.m, g.k};
      o.reduction_axis = o.channel_axis = 2;
      o.offset = [&c, v](const std::int64_t* x) { return op_a_offset(c, v, x[0], x[1], x[2]); };
    } else if (op == "B") {
      o.dims = {g.batch, g.k, g.n};
      o.reduction_axis = o.channel_axis = 1;
      o.offset = [&c, v](const std::int64_t* x) { return op_b_offset(c, v, x[0], x[1], x[2]); };
    } else if (op == "C") {
      o.dims = {g.batch, g.m, g.n};
      o.reduction_axis = o.channel_axis = 2;
      o.offset = [v](const std::int64_t* x) { return v.offset(x[0], x[1], x[2]); };
    } else {  // bias
      o.dims = {g.n};
      o.reduction_axis = o.channel_axis = 0;
      o.offset = [v](const std::int64_t* x) { return v.offset(0, 0, x[0]); };
    }
  } else {
    const AttentionView v = attention_view(c, op);
    o.storage = v.elements();
    o.dims = {v.batch, v.heads, v.seq, v.dim};
    o.channel_axis = 3;
    o.reduction_axis = op == "V" ? 2 : 3;
    o.offset = [v](const std::int64_t* x) { return v.offset(x[0], x[1], x[2], x[3]); };
    if (v.paged()) o.pool = v, o.pages = std::make_shared<const PageUse>(page_use(c.attention));
  }
  return o;
}

// Finite values left in a pool page's slots past the keys it holds (a partial last page):
// what a serving cache holds there, old keys. +-8, the sign alternating by slot, so that a
// kernel reading them as keys changes its output whatever the sign of q . k.
constexpr double kStaleSlotValue = 8.0;

// The pool of a paged operand: unread pages get the padding poison, slots past a page's keys
// stale finite values, and each key line is written by its page's owner alone.
void store_pool(const Operand& o, const Values& vals, Tensor& t) {
  const AttentionView& v = *o.pool;
  const PageUse& use = *o.pages;
  t.fill_code(padding_poison(o.format));
  for (std::int64_t p = 0; p < v.num_pages; ++p) {
    const std::int64_t used = use.slots[static_cast<std::size_t>(p)];
    if (used == 0) continue;
    for (std::int64_t slot = used; slot < v.page_size; ++slot)
      for (std::int64_t h = 0; h < v.heads; ++h)
        for (std::int64_t d = 0; d < v.dim; ++d)
          t.set_value(static_cast<std::size_t>(v.pool_offset(p, h, slot, d)), slot % 2 ? -kStaleSlotValue : kStaleSlotValue);
  }
  const std::int64_t lines = v.batch * v.heads * v.seq;
  parallel_for(lines, [&](std::int64_t l) {
    const std::int64_t s = l % v.seq, b = l / (v.seq * v.heads), h = (l / v.seq) % v.heads;
    const std::int64_t entry = b * v.pages_per_seq + s / v.page_size;
    if (use.owner[static_cast<std::size_t>((*v.page_table)[static_cast<std::size_t>(entry)])] != entry) return;
    for (std::int64_t d = 0; d < v.dim; ++d)
      t.set_value(static_cast<std::size_t>(v.offset(b, h, s, d)), vals[static_cast<std::size_t>(l * v.dim + d)]);
  }, threads_for(static_cast<double>(o.count()), kFillPerThread), std::max<std::int64_t>(1, kFillGrain / v.dim));
}

const DistSpec& core_of(const DistSpec& s) { return s.base ? core_of(*s.base) : s; }

// Folds a spec (its core family and any outliers/specials wrappers) into a Sampler.
Sampler resolve(const DistSpec& s, const Case& c, const Operand& o) {
  const auto& fi = info(o.format);
  if (s.base) {
    Sampler r = resolve(*s.base, c, o);
    if (s.family == "outliers") {
      r.outlier_rate = s["rate"];
      r.outlier_scale = s["scale"];
    } else if (s.family == "specials") {
      if (!fi.has_inf && s["inf"] > 0)
        throw InputError(fmt::format("dist \"{}\": {} has no Inf (inf must be 0)", s.text.empty() ? s.canonical() : s.text,
                                     fi.name));
      r.nan_rate = s["nan"];
      r.inf_rate = s["inf"];
      r.negzero_rate = s["negzero"];
    }
    return r;  // amax: applied to the whole tensor in fill_operand
  }
  const std::string& f = s.family;
  Sampler r;
  auto set = [&](Kind k, double a, double b = 0, double cc = 0, double d = 0) {
    r.kind = k, r.a = a, r.b = b, r.c = cc, r.d = d;
  };
  const double red = static_cast<double>(o.dims[o.reduction_axis]);
  if (f == "uniform") set(Kind::Uniform, s["lo"], s["hi"]);
  else if (f == "normal") set(Kind::Normal, s["mean"], s["std"]);
  else if (f == "lognormal") set(Kind::LogNormal, s["mu"], s["sigma"]);
  else if (f == "student_t") set(Kind::StudentT, s["nu"], s["scale"]);
  else if (f == "cauchy") set(Kind::Cauchy, s["loc"], s["scale"]);
  else if (f == "activations") set(Kind::Activations, s["std"], s["rate"], s["scale"]);
  else if (f == "weights") set(Kind::Normal, 0.0, s["gain"] / std::sqrt(s["fan_in"] > 0 ? s["fan_in"] : red));
  else if (f == "softmax") set(Kind::SoftmaxWeight, s["std"]);
  else if (f == "sparse") set(Kind::Sparse, s["density"], s["std"]);
  else if (f == "relu") set(Kind::Relu, s["mean"], s["std"]);
  else if (f == "positive") set(Kind::Positive, 0.0, s["std"]);
  else if (f == "near_overflow")
    set(Kind::NearOverflow, s["lo"] * fi.max_finite(), s["hi"] * fi.max_finite());
  else if (f == "subnormal")
    set(Kind::Subnormal, s["rate"], fi.min_subnormal(), std::ldexp(1.0, fi.frac_bits), fi.min_normal());
  else if (f == "lse")
    set(Kind::Lse, s["mean"], s["std"], s["empty"], s["step"]);
  else if (f == "exact")
    set(Kind::Exact, s["max"] > 0 ? s["max"] : exact_auto_max(c, o.name), std::ldexp(1.0, -static_cast<int>(s["frac"])));
  else
    throw std::logic_error("resolve: family " + f + " is not per-element");
  return r;
}

void check_scope(const DistSpec& s, const Case& c, const std::string& op) {
  const FamilyInfo* fam = find_family(s.family);
  const bool gemm = c.op == Op::Gemm;
  switch (fam->scope) {
    case Scope::Any: return;
    case Scope::GemmAB:
      if (gemm && (op == "A" || op == "B")) return;
      fail(op, fmt::format("{} is only for GEMM A and B (it builds them together)", s.family));
    case Scope::GemmABC:
      if (gemm ? op == "A" || op == "B" || op == "C" : c.op == Op::Attention && (op == "K" || op == "V")) return;
      fail(op, fmt::format("{} is only for GEMM A, B, C and attention K, V (case.scales has no {} scale)", s.family, op));
    case Scope::AttnQK:
      if (is_attention(c.op) && (op == "Q" || op == "K")) return;
      fail(op, fmt::format("{} is only for attention Q and K (it builds them together)", s.family));
    case Scope::CombineLse:
      if (c.op == Op::AttentionCombine && op == "LSE_part") return;
      fail(op, fmt::format("{} is only for attention_combine's LSE_part (partial log-sum-exps)", s.family));
  }
}

// Writes logical values into a poisoned buffer of the operand's storage size, a line along
// the last axis at a time (its coordinates found once, then stepped).
Tensor store(const Operand& o, const Values& vals) {
  // Every logical element is written below, on the fill's threads; padding (storage beyond
  // them) gets the poison first.
  Tensor t(o.format, static_cast<std::size_t>(o.storage), Tensor::uninitialized);
  if (o.pool) {
    store_pool(o, vals, t);
    return t;
  }
  if (o.storage > o.count()) t.fill_code(padding_poison(o.format));
  const std::int64_t n = o.count(), line = o.dims.empty() ? 1 : std::max<std::int64_t>(1, o.dims.back());
  const std::int64_t lines = line ? n / line : 0;
  const int last = static_cast<int>(o.dims.size()) - 1;
  parallel_for(lines, [&](std::int64_t l) {
    std::int64_t x[kMaxDims];
    o.coordinates(l * line, x);
    for (std::int64_t j = 0; j < line; ++j) {
      x[last] = j;
      t.set_value(static_cast<std::size_t>(o.offset(x)), vals[static_cast<std::size_t>(l * line + j)]);
    }
  }, threads_for(static_cast<double>(n), kFillPerThread), std::max<std::int64_t>(1, kFillGrain / line));
  return t;
}

// vals[i - begin] = the core sample of logical element i, for i in [begin, end). Built twice: for
// the baseline x86-64 and, where the CPU has it, with FMA instructions (sample_range_fma:
// this loop with every call inlined), so that the samplers' std::fma is one instruction
// instead of a library call. Both give the same bits: an FMA is correctly rounded either
// way, and nothing is contracted (-ffp-contract=off).
void sample_range(const Sampler& s, std::uint64_t seed, std::uint32_t stream, std::int64_t begin, std::int64_t end,
                  std::int64_t channel_stride, std::int64_t channels, double* vals) {
  for (std::int64_t idx = begin; idx < end; ++idx)
    vals[idx - begin] = sampling::sample_core(s, seed, stream, static_cast<std::uint64_t>(idx),
                                              static_cast<std::uint64_t>((idx / channel_stride) % channels));
}
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("fma"), flatten)) void sample_range_fma(const Sampler& s, std::uint64_t seed, std::uint32_t stream,
                                                              std::int64_t begin, std::int64_t end,
                                                              std::int64_t channel_stride, std::int64_t channels,
                                                              double* vals) {
  sample_range(s, seed, stream, begin, end, channel_stride, channels, vals);
}
const bool kHaveFma = __builtin_cpu_supports("fma");
#endif

}  // namespace

void sample_core_range(const Sampler& s, std::uint64_t seed, std::uint32_t stream, std::int64_t begin, std::int64_t end,
                       std::int64_t channel_stride, std::int64_t channels, double* out, bool allow_fma) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (allow_fma && kHaveFma) return sample_range_fma(s, seed, stream, begin, end, channel_stride, channels, out);
#endif
  sample_range(s, seed, stream, begin, end, channel_stride, channels, out);
}

namespace {

#ifdef ULPGATE_GPU_FILL
// ULPGATE_FILL=cpu keeps every fill on the CPU (tests compare the two paths).
bool gpu_fill_enabled() {
  const char* e = std::getenv("ULPGATE_FILL");
  return !(e && std::string_view(e) == "cpu");
}
#endif

// Per-element families, softmax normalisation, modifiers and amax scaling.
#ifdef ULPGATE_GPU_FILL
// Where a packed operand (no padding) keeps its logical elements, if its axes are laid out
// one inside the other in some order (any transpose or layout of a GEMM or attention
// operand): each axis's storage step is the offset of its unit vector (the offset function
// is affine), and sorted by step, each step is the extent below it.
std::optional<detail::StorageOrder> storage_order(const Operand& o) {
  if (o.pool || o.storage != o.count() || o.dims.size() > detail::StorageOrder::kMaxAxes) return std::nullopt;
  std::int64_t x[kMaxDims] = {};
  if (o.offset(x) != 0) return std::nullopt;
  detail::StorageOrder order;
  for (int a = 0; a < static_cast<int>(o.dims.size()); ++a) {
    if (o.dims[a] < 2) continue;
    x[a] = 1;
    const int i = order.axes++;
    order.storage_stride[i] = o.offset(x), order.dim[i] = o.dims[a], order.logical_stride[i] = o.stride(a);
    x[a] = 0;
  }
  std::vector<int> by_step(static_cast<std::size_t>(order.axes));
  std::iota(by_step.begin(), by_step.end(), 0);
  std::sort(by_step.begin(), by_step.end(), [&](int a, int b) { return order.storage_stride[a] < order.storage_stride[b]; });
  std::int64_t below = 1;
  for (const int a : by_step) {
    if (order.storage_stride[a] != below) return std::nullopt;
    below *= order.dim[a];
  }
  if (order.axes == 0) order.axes = 1, order.storage_stride[0] = 1, order.dim[0] = 1, order.logical_stride[0] = 1;
  return order;
}
#endif

Tensor fill_operand(Case& c, const Operand& o, const DistSpec& spec) {
  const Sampler sampler = resolve(spec, c, o);
  const std::uint64_t seed = c.seed;
#ifdef ULPGATE_GPU_FILL
  // A large packed operand (any axis order), not normalised (softmax) nor scaled (amax)
  // after sampling: sampled, rounded and stored on the GPU, its storage words copied
  // straight into the tensor (encode's bits: core/format_rne.hpp).
  if (o.count() >= detail::kGpuFillValues && sampler.kind != Kind::SoftmaxWeight && spec.family != "amax" &&
      o.format != Format::FP64 && gpu_fill_enabled()) {
    if (const auto order = storage_order(o)) {
      Tensor t(o.format, static_cast<std::size_t>(o.storage), Tensor::uninitialized);
      const std::int64_t channel_stride = o.stride(o.channel_axis), channels = o.dims[o.channel_axis];
      if (detail::gpu_sample_store(sampler, seed, o.stream, o.count(), channel_stride, channels, *order,
                                   rne_format(o.format), static_cast<int>(storage_bytes(o.format)), t.data()))
        return t;
    }
  }
#endif
  Values vals(static_cast<std::size_t>(o.count()));
  const std::int64_t channel_stride = o.stride(o.channel_axis), channels = o.dims[o.channel_axis];
  const std::int64_t n = o.count(), chunks = (n + kFillGrain - 1) / kFillGrain;
  // Large operands on the GPU where there is one: the same bits, core and modifiers at once
  // (softmax weights normalise between the two: on the CPU).
  bool sampled_on_gpu = false;
#ifdef ULPGATE_GPU_FILL
  if (n >= detail::kGpuFillValues && sampler.kind != Kind::SoftmaxWeight && gpu_fill_enabled())
    sampled_on_gpu = detail::gpu_sample_range(sampler, seed, o.stream, n, channel_stride, channels, vals.data());
#endif
  if (!sampled_on_gpu)
    parallel_for(chunks, [&](std::int64_t chunk) {
      const std::int64_t begin = chunk * kFillGrain;
      sample_core_range(sampler, seed, o.stream, begin, std::min(n, begin + kFillGrain), channel_stride, channels,
                        vals.data() + begin);
    }, threads_for(static_cast<double>(n), kFillPerThread));
  if (sampler.kind == Kind::SoftmaxWeight) {
    // Normalise each line along the reduction axis, summing in coordinate order.
    const std::int64_t len = o.dims[o.reduction_axis], stride = o.stride(o.reduction_axis);
    o.for_each([&](std::int64_t idx, const std::int64_t* x) {
      if (x[o.reduction_axis] != 0) return;
      double sum = 0.0;
      for (std::int64_t r = 0; r < len; ++r) sum += vals[static_cast<std::size_t>(idx + r * stride)];
      for (std::int64_t r = 0; r < len; ++r) vals[static_cast<std::size_t>(idx + r * stride)] /= sum;
    });
  }
  if (!sampled_on_gpu)
    o.for_each_parallel([&](std::int64_t i) {
      const auto e = static_cast<std::size_t>(i);
      vals[e] = sampling::apply_modifiers(sampler, seed, o.stream, e, vals[e]);
    });
  // amax is FP8's storage step: any other operand holds its base values, unscaled (scales
  // are FP8-only, takes_scale; a plugin gets 1 there and a kernel would ignore anything else).
  if (spec.family == "amax" && takes_scale(o.format)) {
    // One scale for the tensor, or one per head: axis 1 of attention's logical order
    // [batch][head][seq][dim], so element e is in head (e / (seq dim)) % heads.
    const bool per_head = spec["per_head"] != 0;
    if (per_head && c.op != Op::Attention)
      throw InputError(fmt::format("case.dist.{}: amax per_head=1 is for attention K and V", o.name));
    const std::int64_t groups = per_head ? o.dims[1] : 1, run = per_head ? o.dims[2] * o.dims[3] : o.count();
    const auto group_of = [&](std::size_t e) { return static_cast<std::size_t>(static_cast<std::int64_t>(e) / run % groups); };
    // Heads of different ranges, as real caches have: head g's values times 2^(spread u_g),
    // u_g drawn at counter indices no element takes (they stay below 2^62).
    std::vector<double> factor(static_cast<std::size_t>(groups), 1.0), amax(factor.size(), 0.0), scales(factor.size(), 1.0);
    if (per_head && spec["spread"] > 0)
      for (std::int64_t g = 0; g < groups; ++g) {
        const std::uint64_t index = (std::uint64_t{1} << 62) + static_cast<std::uint64_t>(g);
        const double u = 2 * to_unit_closed_open(low64(random_block(seed, o.stream, index))) - 1;
        factor[static_cast<std::size_t>(g)] = std::exp2(spec["spread"] * u);
      }
    for (std::size_t e = 0; e < vals.size(); ++e) {
      double& v = vals[e];
      const std::size_t g = group_of(e);
      v *= factor[g];
      if (std::isfinite(v)) amax[g] = std::max(amax[g], std::fabs(v));
    }
    // The scale is an FP32 number, as cuBLASLt's scale pointers; kept in FP32's normal range.
    // Rounded up, so that amax / scale stays at or below frac * max finite.
    for (std::size_t g = 0; g < scales.size(); ++g)
      if (amax[g] > 0.0)
        scales[g] = std::clamp(round_to(Format::FP32, amax[g] / (spec["frac"] * info(o.format).max_finite()), Rounding::Up),
                               0x1p-126, 0x1p127);
    for (std::size_t e = 0; e < vals.size(); ++e) vals[e] /= scales[group_of(e)];
    if (per_head) c.head_scales[o.name] = scales;
    else c.scales[o.name] = scales[0];
  }
  return store(o, vals);
}

// A format whose values are all values of the other one (so one GenDot pair fits both).
bool contained(Format a, Format b) {
  const auto &fa = info(a), &fb = info(b);
  return fa.precision() <= fb.precision() && fa.emax() <= fb.emax() &&
         fa.emin() - fa.frac_bits >= fb.emin() - fb.frac_bits;
}

// GenDot: pair r = b * pairs + (i mod pairs) gives op(A)[b][i][:] = +-x_r and
// op(B)[b][:][j] = +-y_r (signs per row / column), so every C[b][i][j] with i = j mod pairs
// is a GenDot dot product (a sign flip does not change the condition number).
void fill_gendot(Case& c, const DistSpec& spec, std::map<std::string, Tensor>& out) {
  const auto& g = c.gemm;
  const Format fa = c.types.at("A"), fb = c.types.at("B");
  Format common = fa;
  if (contained(fb, fa)) common = fb;
  else if (!contained(fa, fb))
    fail("A", fmt::format("gendot needs A and B formats where one contains the other, got {} and {}",
                          name(fa), name(fb)));
  const auto pairs = static_cast<std::int64_t>(spec["pairs"]);
  if (g.batch * pairs > 65536)
    fail("A", fmt::format("gendot: batch x pairs must be <= 65536, got {}", g.batch * pairs));
  std::vector<DotPair> dots;
  for (std::int64_t r = 0; r < g.batch * pairs; ++r) {
    const std::uint32_t stream = sampling::with_draw(kStreamA, sampling::kDrawGenDot) |
                                 (static_cast<std::uint32_t>(r) << 16);
    try {
      dots.push_back(gendot(static_cast<std::size_t>(g.k), spec["cond"], common, c.seed, stream));
    } catch (const InputError& e) {
      fail("A", fmt::format("dist \"{}\": {}", spec.text, e.what()));
    }
  }
  auto sign = [&](std::uint32_t stream, std::int64_t line) {
    return sampling::unit(c.seed, sampling::with_draw(stream, sampling::kDrawLine),
                          static_cast<std::uint64_t>(line)) < 0.5 ? -1.0 : 1.0;
  };
  for (const char* op : {"A", "B"}) {
    const Operand o = describe(c, op);
    Values vals(static_cast<std::size_t>(o.count()));
    const bool is_a = o.name == "A";
    o.for_each([&](std::int64_t idx, const std::int64_t* x) {
      const std::int64_t b = x[0], line = is_a ? x[1] : x[2], k = is_a ? x[2] : x[1];
      const DotPair& p = dots[static_cast<std::size_t>(b * pairs + line % pairs)];
      const double s = sign(o.stream, b * (is_a ? g.m : g.n) + line);
      vals[static_cast<std::size_t>(idx)] = s * (is_a ? p.x : p.y)[static_cast<std::size_t>(k)];
    });
    out[op] = store(o, vals);
  }
}

// Attention logits / sink / masked: Q and K normal(0, sigma) with sigma chosen so that the
// scaled logits softmax_scale * q.k have standard deviation `std` (Var(q.k) = D sigma^4).
void fill_attention_qk(Case& c, const DistSpec& spec, std::map<std::string, Tensor>& out) {
  auto& a = c.attention;
  const double d = static_cast<double>(a.head_dim);
  const double scale = a.scale();
  if (scale == 0.0) fail("Q", fmt::format("{} needs a nonzero softmax_scale", spec.family));
  const double sigma = std::sqrt(spec["std"] / (std::fabs(scale) * std::sqrt(d)));
  Sampler normal;
  normal.kind = Kind::Normal;
  normal.a = 0.0;
  normal.b = sigma;
  const bool sink = spec.family == "sink";
  if (sink && spec["key"] >= static_cast<double>(a.seq_kv))
    fail("K", fmt::format("sink key {} is beyond seq_kv {}", spec["key"], a.seq_kv));
  // The sink: every query gets +m in dimension 0 and the sink key holds logit / (scale m) there,
  // so its logit with any query is logit * (1 + z/m) + (the other dimensions), z ~ N(0, sigma).
  const double m = sigma > 0 ? 4.0 * sigma : 1.0;
  for (const char* op : {"Q", "K"}) {
    const Operand o = describe(c, op);
    const bool is_q = o.name == "Q";
    Values vals(static_cast<std::size_t>(o.count()));
    o.for_each([&](std::int64_t idx, const std::int64_t* x) {
      double v = sampling::sample(normal, c.seed, o.stream, static_cast<std::uint64_t>(idx), 0);
      if (sink && x[3] == 0) {
        if (is_q) v += m;
        else if (x[2] == static_cast<std::int64_t>(spec["key"])) v = spec["logit"] / (scale * m);
      }
      vals[static_cast<std::size_t>(idx)] = v;
    });
    out[op] = store(o, vals);
  }
  if (spec.family == "masked") {
    // Batches whose draw falls below frac get kv_length 0 (every row fully masked); at least
    // the batch with the smallest draw, so the case always has fully masked rows.
    if (a.kv_lengths.empty()) a.kv_lengths.assign(static_cast<std::size_t>(a.batch), a.seq_kv);
    std::int64_t lowest = 0;
    double lowest_u = 2.0;
    for (std::int64_t b = 0; b < a.batch; ++b) {
      const double u = sampling::unit(c.seed, sampling::with_draw(kStreamK, sampling::kDrawLine),
                                      static_cast<std::uint64_t>(b));
      if (u < spec["frac"]) a.kv_lengths[static_cast<std::size_t>(b)] = 0;
      if (u < lowest_u) lowest_u = u, lowest = b;
    }
    a.kv_lengths[static_cast<std::size_t>(lowest)] = 0;
  }
}

DistSpec parse_for(const Case& c, const std::string& op) {
  auto it = c.dist.find(op);
  const std::string text = it == c.dist.end() ? std::string(kDefaultDist) : it->second;
  try {
    return parse_dist(text);
  } catch (const InputError& e) {
    fail(op, e.what());
  }
}

// The joint spec of two operands built together: given on either; if on both, the same.
const DistSpec* joint(const std::map<std::string, DistSpec>& specs, const Case& c, const char* p,
                      const char* q, Scope scope) {
  const DistSpec* first = nullptr;
  for (const char* op : {p, q}) {
    const DistSpec& s = specs.at(op);
    if (find_family(s.family)->scope != scope) continue;
    if (!first) {
      first = &s;
      continue;
    }
    if (s.canonical() != first->canonical())
      fail(op, fmt::format("\"{}\" must equal {}'s \"{}\" (they are built together) or be absent",
                           s.text, p, first->text));
  }
  if (!first) return nullptr;
  for (const char* op : {p, q}) {
    const auto it = c.dist.find(op);
    if (it != c.dist.end() && find_family(specs.at(op).family)->scope != scope)
      fail(op, fmt::format("must be absent or \"{}\": {} and {} are built together", first->text, p, q));
  }
  return first;
}

}  // namespace

std::uint32_t operand_stream(std::string_view op) {
  if (op == "A") return kStreamA;
  if (op == "B") return kStreamB;
  if (op == "C") return kStreamC;
  if (op == "bias") return kStreamBias;
  if (op == "Q") return kStreamQ;
  if (op == "K") return kStreamK;
  if (op == "V") return kStreamV;
  if (op == "dO") return kStreamDO;
  if (op == "O_part") return kStreamOPart;
  if (op == "LSE_part") return kStreamLsePart;
  throw InputError(fmt::format("no input operand \"{}\"", op));
}

Code padding_poison(Format f) {
  const auto& fi = info(f);
  if (f == Format::E4M3) return 0xFF;
  const Code exp_all_ones = ((Code{1} << fi.exp_bits) - 1) << fi.frac_bits;
  const Code quiet = Code{1} << (fi.frac_bits - 1);
  const Code payload = 0x5A5A5A5A5A5A5A5Aull & (quiet - 1);
  return exp_all_ones | quiet | payload;
}

double exact_auto_max(const Case& c, std::string_view op) {
  const Format f = c.types.at(std::string(op));
  int p_out;
  std::int64_t len;
  if (c.op == Op::Gemm) {
    p_out = std::min(info(c.types.at("D")).precision(), info(c.types.at("compute")).precision());
    len = c.gemm.k + 2;  // + C and bias terms, each no larger than one product's bound
  } else {
    p_out = info(c.types.at("compute")).precision();
    len = c.op == Op::AttentionCombine ? c.attention.splits : op == "V" ? c.attention.seq_kv : c.attention.head_dim;
  }
  const int log_len = static_cast<int>(std::ceil(std::log2(static_cast<double>(len))));
  int e = static_cast<int>(std::floor((p_out - log_len) / 2.0));
  e = std::min(e, info(f).precision());
  while (e > 0 && std::ldexp(1.0, e) > info(f).max_finite()) --e;
  return std::ldexp(1.0, std::max(e, 0));
}

std::map<std::string, Tensor> fill_inputs(Case& c) {
  std::map<std::string, DistSpec> specs;
  for (const std::string& op : c.inputs()) {
    if (!c.types.count(op)) throw InputError(fmt::format("case.types.{}: missing", op));
    specs.emplace(op, parse_for(c, op));
    check_scope(specs.at(op), c, op);
  }
  std::map<std::string, Tensor> out;
  if (c.op == Op::Gemm) {
    if (const DistSpec* g = joint(specs, c, "A", "B", Scope::GemmAB)) fill_gendot(c, *g, out);
  } else if (const DistSpec* q = is_attention(c.op) ? joint(specs, c, "Q", "K", Scope::AttnQK) : nullptr) {
    fill_attention_qk(c, *q, out);
  }
  for (const std::string& op : c.inputs()) {
    if (out.count(op)) continue;
    try {
      out[op] = fill_operand(c, describe(c, op), specs.at(op));
    } catch (const InputError& e) {
      const std::string msg = e.what();
      if (msg.rfind("case.", 0) == 0) throw;
      fail(op, msg);
    }
  }
  return out;
}

}  // namespace ulpgate
