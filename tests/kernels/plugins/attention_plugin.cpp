// Test equipment for the plugin ABI's versions (tests/kernels/test_plugin.cpp): one host
// FP32 attention kernel, the arithmetic of cpu.attn_naive (FMA dot products, max, exp,
// row sum, FMA of P V, one division), built once per ABI version:
//   ATTENTION_PLUGIN_ABI=4  "test.attention_v4": declares writes_lse and writes m + ln l when
//                           asked; "test.attention_v4_no_lse": the same O, no LSE (declares
//                           nothing); "test.attention_v4_wrong_o": no LSE, and O without the
//                           last visible key of each row (an off-by-one)
//   ATTENTION_PLUGIN_ABI=3  "test.attention_v3": writes the log-sum-exp m + ln l when asked
//   ATTENTION_PLUGIN_ABI=2  "test.attention_v2": reads K/V head h / (heads / kv_heads)
//   ATTENTION_PLUGIN_ABI=1  "test.attention_v1": declares ABI 1 and, as a plugin written
//                           before kv_heads existed, reads K/V head h
//   ATTENTION_PLUGIN_ABI=5  "test.attention_v5": writes the LSE, declares the arithmetic of
//                           cpu.attn_naive (P in FP32: p_bits 24)
//   ATTENTION_PLUGIN_ABI=6  "test.attention_v6" as version 5; "test.attention_bwd_v6": the
//                           backward (the arithmetic of cpu.attn_bwd_naive), declaring p_bits
//                           24 and atomic_dq; "test.attention_bwd_v6_no_d": dS without D
//   ATTENTION_PLUGIN_ABI=7  "test.attention_v7" as version 5, and applies every served variant
//                           (window, soft cap, ALiBi, sinks), declaring them;
//                           "test.attention_v7_no_sink": declares them too, ignores the sinks
//   ATTENTION_PLUGIN_ABI=8  "test.attention_v8" as version 7, and reads paged K/V, declaring it;
//                           "test.attention_v8_no_table": declares it too, reads entry e as page e
//   ATTENTION_PLUGIN_ABI=9  "test.attention_v9" as version 8, and takes an FP8 K/V cache (E4M3
//                           or E5M2) with per-tensor or per-head scales, declaring both;
//                           "test.attention_v9_head0": applies head 0's scale to every head
//   ATTENTION_PLUGIN_ABI=10 "test.attention_v10" as version 9; "test.attention_combine_v10": the
//                           split-KV combine (the arithmetic of cpu.attn_combine), FP32, FP16 or
//                           BF16 partial states into FP32 O and LSE, writes_lse;
//                           "test.attention_combine_v10_no_guard": empty splits not skipped
//   ATTENTION_PLUGIN_ABI=11 "test.attention_v11": a version this ulpgate does not know
// Versions 1 to 4 lay their kernel list out as plugin.h did then (1 to 3: no writes_lse; 4:
// no declared arithmetic). Written
// against include/ulpgate/plugin.h only.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ulpgate/plugin.h"

#ifndef ATTENTION_PLUGIN_ABI
#error "define ATTENTION_PLUGIN_ABI"
#endif
#define STRINGIFY2(x) #x
#define STRINGIFY(x) STRINGIFY2(x)

namespace {

int supports(const ulpgate_problem* p, char* why, size_t why_size) {
  if (p->struct_size < sizeof(ulpgate_problem) || p->op != ULPGATE_OP_ATTENTION) {
    std::snprintf(why, why_size, "attention only");
    return 0;
  }
  const ulpgate_attention_problem& a = p->attention;
#if ATTENTION_PLUGIN_ABI >= 9
  const auto kv_ok = [](int32_t t) { return t == ULPGATE_FP32 || t == ULPGATE_E4M3 || t == ULPGATE_E5M2; };
  if (a.type_q != ULPGATE_FP32 || !kv_ok(a.type_k) || !kv_ok(a.type_v) || a.type_o != ULPGATE_FP32 ||
      a.type_compute != ULPGATE_FP32) {
    std::snprintf(why, why_size, "FP32 Q, O and compute, K and V in FP32 or FP8 only");
    return 0;
  }
#else
  if (a.type_q != ULPGATE_FP32 || a.type_k != ULPGATE_FP32 || a.type_v != ULPGATE_FP32 ||
      a.type_o != ULPGATE_FP32 || a.type_compute != ULPGATE_FP32) {
    std::snprintf(why, why_size, "FP32 Q, K, V, O and compute only");
    return 0;
  }
#endif
  return 1;
}

// Element idx of K or V (type t: FP32, or E4M3 / E5M2 bytes) times scale, in FP32.
float kv_value(const void* base, int32_t t, int64_t idx, double scale) {
  if (t == ULPGATE_FP32) return static_cast<const float*>(base)[idx];
  const unsigned x = static_cast<const unsigned char*>(base)[idx];
  const bool e4m3 = t == ULPGATE_E4M3;
  const int mant_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const int e = static_cast<int>((x & 0x7Fu) >> mant_bits), m = static_cast<int>(x & ((1u << mant_bits) - 1));
  double v;
  if (e4m3 && e == 15 && m == 7) v = NAN;
  else if (!e4m3 && e == 31) v = m ? NAN : INFINITY;
  else if (e == 0) v = std::ldexp(m, 1 - bias - mant_bits);
  else v = std::ldexp(m + (1 << mant_bits), e - bias - mant_bits);
  return static_cast<float>((x & 0x80u ? -v : v) * scale);
}

int64_t at(const ulpgate_attention_problem& a, int64_t heads, int64_t seq, int64_t dim, int64_t b, int64_t h,
           int64_t s, int64_t d) {
  return a.layout == ULPGATE_BHSD ? ((b * heads + h) * seq + s) * dim + d : ((b * seq + s) * heads + h) * dim + d;
}

// Key s of batch b in K or V (kv_heads heads of dim elements): through the page table where
// the problem is paged (version 8); no_table reads entry e as page e.
int64_t key_at(const ulpgate_problem* p, int64_t kv_heads, int64_t dim, int64_t b, int64_t h, int64_t s, int64_t d,
               bool no_table) {
  const ulpgate_attention_problem& a = p->attention;
#if ATTENTION_PLUGIN_ABI >= 8
  if (p->page_size > 0) {
    const int64_t entry = b * p->pages_per_seq + s / p->page_size, slot = s % p->page_size;
    const int64_t page = no_table ? entry % p->num_pages : p->page_table[entry];
    return a.layout == ULPGATE_BHSD ? ((page * kv_heads + h) * p->page_size + slot) * dim + d
                                    : ((page * p->page_size + slot) * kv_heads + h) * dim + d;
  }
#else
  (void)p, (void)no_table;
#endif
  return at(a, kv_heads, a.seq_kv, dim, b, h, s, d);
}

int run_attention(const ulpgate_problem* p, bool write_lse, bool drop_last_key, bool ignore_sinks = false,
                  bool no_table = false, bool head0_scale = false) {
  const ulpgate_attention_problem& a = p->attention;
  // K and V of K/V head hk as FP32 values, an FP8 cache's scales applied (version 9).
  const auto scale_of = [&](double tensor, const double* heads, int64_t hk) {
#if ATTENTION_PLUGIN_ABI >= 9
    return heads ? heads[head0_scale ? 0 : hk] : tensor;
#else
    (void)heads, (void)hk, (void)head0_scale;
    return tensor;
#endif
  };
#if ATTENTION_PLUGIN_ABI >= 9
  const double scale_k = p->scale_k, scale_v = p->scale_v;
  const double *head_k = p->head_scale_k, *head_v = p->head_scale_v;
#else
  const double scale_k = 1.0, scale_v = 1.0;
  const double *head_k = nullptr, *head_v = nullptr;
#endif
#if ATTENTION_PLUGIN_ABI >= 2
  const int64_t kv_heads = p->kv_heads;
#else
  const int64_t kv_heads = a.heads;  // version 1: K and V have `heads` heads
#endif
  const float* Q = static_cast<const float*>(a.q);
  float* O = static_cast<float*>(a.o);
  const float scale = static_cast<float>(a.softmax_scale);
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h)
      for (int64_t i = 0; i < a.seq_q; ++i) {
        const int64_t hk = h / (a.heads / kv_heads);
        std::vector<int64_t> keys;
        std::vector<float> s;
        int64_t visible = a.kv_lengths[b];
        if (a.causal) visible = visible < i + a.seq_kv - a.seq_q + 1 ? visible : i + a.seq_kv - a.seq_q + 1;
        if (drop_last_key) --visible;
        int64_t first = 0;
        float sink = -INFINITY;
#if ATTENTION_PLUGIN_ABI >= 7
        const int64_t diag = i + a.seq_kv - a.seq_q;
        if (p->window_right >= 0 && diag + p->window_right + 1 < visible) visible = diag + p->window_right + 1;
        if (p->window_left >= 0 && diag - p->window_left > 0) first = diag - p->window_left;
        if (p->sinks && !ignore_sinks) sink = p->sinks[h];
#else
        (void)ignore_sinks;
#endif
        for (int64_t j = first; j < visible; ++j) {
          float dot = 0.0f;
          for (int64_t d = 0; d < a.head_dim; ++d)
            dot = std::fma(Q[at(a, a.heads, a.seq_q, a.head_dim, b, h, i, d)],
                           kv_value(a.k, a.type_k, key_at(p, kv_heads, a.head_dim, b, hk, j, d, no_table),
                                    scale_of(scale_k, head_k, hk)),
                           dot);
          float x = scale * dot;
#if ATTENTION_PLUGIN_ABI >= 7
          const float cap = static_cast<float>(p->softcap);
          if (cap != 0.0f) x = cap * std::tanh(x / cap);
          if (p->alibi_slopes) {
            const int64_t dist = p->alibi_form == ULPGATE_ALIBI_FLASHINFER ? j - i : -std::llabs(diag - j);
            x = std::fma(p->alibi_slopes[h], static_cast<float>(dist), x);
          }
#endif
          keys.push_back(j), s.push_back(x);
        }
        float m = sink, l = 0.0f;
        for (float x : s) m = std::fmax(m, x);
        for (float& x : s) l += (x = std::exp(x - m));
        if (sink != -INFINITY) l += std::exp(sink - m);
        for (int64_t d = 0; d < a.head_dim_v; ++d) {
          float acc = 0.0f;
          for (size_t t = 0; t < keys.size(); ++t)
            acc = std::fma(s[t],
                           kv_value(a.v, a.type_v, key_at(p, kv_heads, a.head_dim_v, b, hk, keys[t], d, no_table),
                                    scale_of(scale_v, head_v, hk)),
                           acc);
          O[at(a, a.heads, a.seq_q, a.head_dim_v, b, h, i, d)] = l > 0.0f ? acc / l : 0.0f;
        }
#if ATTENTION_PLUGIN_ABI >= 3
        if (write_lse && p->lse)
          static_cast<float*>(p->lse)[(b * a.heads + h) * a.seq_q + i] = l > 0.0f ? m + std::log(l) : -INFINITY;
#else
        (void)write_lse;
#endif
      }
  return 0;
}

int run(const ulpgate_problem* p, char*, size_t) { return run_attention(p, true, false); }

#if ATTENTION_PLUGIN_ABI == 6
int supports_backward(const ulpgate_problem* p, char* why, size_t why_size) {
  if (p->struct_size < sizeof(ulpgate_problem) || p->op != ULPGATE_OP_ATTENTION_BACKWARD) {
    std::snprintf(why, why_size, "attention backward only");
    return 0;
  }
  const ulpgate_attention_problem& a = p->attention;
  const ulpgate_attention_backward_problem& g = p->backward;
  for (int32_t t : {a.type_q, a.type_k, a.type_v, a.type_o, a.type_compute, g.type_do, g.type_dq, g.type_dk, g.type_dv})
    if (t != ULPGATE_FP32) {
      std::snprintf(why, why_size, "FP32 operands only");
      return 0;
    }
  return 1;
}

// FP32 throughout, one query row at a time: P from the stored LSE, D from the stored O.
int run_backward(const ulpgate_problem* p, bool with_d) {
  const ulpgate_attention_problem& a = p->attention;
  const ulpgate_attention_backward_problem& g = p->backward;
  const int64_t kvh = p->kv_heads, hd = a.head_dim, dv = a.head_dim_v;
  const auto* Q = static_cast<const float*>(a.q);
  const auto* K = static_cast<const float*>(a.k);
  const auto* V = static_cast<const float*>(a.v);
  const auto* O = static_cast<const float*>(a.o);
  const auto* L = static_cast<const float*>(p->lse);
  const auto* dO = static_cast<const float*>(g.d_o);
  auto* dQ = static_cast<float*>(g.dq);
  auto* dK = static_cast<float*>(g.dk);
  auto* dV = static_cast<float*>(g.dv);
  const float scale = static_cast<float>(a.softmax_scale);
  std::vector<float> dk(static_cast<size_t>(a.batch * kvh * a.seq_kv * hd), 0.0f);
  std::vector<float> dvv(static_cast<size_t>(a.batch * kvh * a.seq_kv * dv), 0.0f);
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h)
      for (int64_t i = 0; i < a.seq_q; ++i) {
        const int64_t hk = h / (a.heads / kvh);
        int64_t visible = a.kv_lengths[b];
        if (a.causal) visible = visible < i + a.seq_kv - a.seq_q + 1 ? visible : i + a.seq_kv - a.seq_q + 1;
        float d_sum = 0.0f;
        for (int64_t d = 0; d < dv; ++d)
          d_sum = std::fma(dO[at(a, a.heads, a.seq_q, dv, b, h, i, d)], O[at(a, a.heads, a.seq_q, dv, b, h, i, d)], d_sum);
        std::vector<float> dq(static_cast<size_t>(hd), 0.0f);
        for (int64_t j = 0; j < visible; ++j) {
          float s = 0.0f, dp = 0.0f;
          for (int64_t d = 0; d < hd; ++d)
            s = std::fma(Q[at(a, a.heads, a.seq_q, hd, b, h, i, d)], K[at(a, kvh, a.seq_kv, hd, b, hk, j, d)], s);
          const float pr = std::exp(scale * s - L[(b * a.heads + h) * a.seq_q + i]);
          for (int64_t d = 0; d < dv; ++d) {
            const float o = dO[at(a, a.heads, a.seq_q, dv, b, h, i, d)];
            float& acc = dvv[static_cast<size_t>(((b * kvh + hk) * a.seq_kv + j) * dv + d)];
            acc = std::fma(pr, o, acc);
            dp = std::fma(o, V[at(a, kvh, a.seq_kv, dv, b, hk, j, d)], dp);
          }
          const float ds = with_d ? pr * (dp - d_sum) : pr * dp;
          for (int64_t d = 0; d < hd; ++d) {
            float& acc = dk[static_cast<size_t>(((b * kvh + hk) * a.seq_kv + j) * hd + d)];
            acc = std::fma(ds, Q[at(a, a.heads, a.seq_q, hd, b, h, i, d)], acc);
            dq[static_cast<size_t>(d)] = std::fma(ds, K[at(a, kvh, a.seq_kv, hd, b, hk, j, d)], dq[static_cast<size_t>(d)]);
          }
        }
        for (int64_t d = 0; d < hd; ++d) dQ[at(a, a.heads, a.seq_q, hd, b, h, i, d)] = scale * dq[static_cast<size_t>(d)];
      }
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t hk = 0; hk < kvh; ++hk)
      for (int64_t j = 0; j < a.seq_kv; ++j) {
        for (int64_t d = 0; d < hd; ++d)
          dK[at(a, kvh, a.seq_kv, hd, b, hk, j, d)] = scale * dk[static_cast<size_t>(((b * kvh + hk) * a.seq_kv + j) * hd + d)];
        for (int64_t d = 0; d < dv; ++d)
          dV[at(a, kvh, a.seq_kv, dv, b, hk, j, d)] = dvv[static_cast<size_t>(((b * kvh + hk) * a.seq_kv + j) * dv + d)];
      }
  return 0;
}
int run_bwd(const ulpgate_problem* p, char*, size_t) { return run_backward(p, true); }
int run_bwd_no_d(const ulpgate_problem* p, char*, size_t) { return run_backward(p, false); }
#endif

#if ATTENTION_PLUGIN_ABI >= 10
int supports_combine(const ulpgate_problem* p, char* why, size_t why_size) {
  if (p->struct_size < sizeof(ulpgate_problem) || p->op != ULPGATE_OP_ATTENTION_COMBINE) {
    std::snprintf(why, why_size, "attention combine only");
    return 0;
  }
  const int32_t part = p->combine.type_o_part;
  if ((part != ULPGATE_FP32 && part != ULPGATE_FP16 && part != ULPGATE_BF16) || p->attention.type_o != ULPGATE_FP32 ||
      p->attention.type_compute != ULPGATE_FP32) {
    std::snprintf(why, why_size, "FP32, FP16 or BF16 partial states into an FP32 O only");
    return 0;
  }
  return 1;
}

// Element idx of O_part (FP32, FP16 or BF16 words) as FP32.
float part_value(const void* base, int32_t t, int64_t idx) {
  if (t == ULPGATE_FP32) return static_cast<const float*>(base)[idx];
  const unsigned x = static_cast<const uint16_t*>(base)[idx];
  if (t == ULPGATE_BF16) {
    const uint32_t word = x << 16;
    float f;
    std::memcpy(&f, &word, sizeof f);
    return f;
  }
  const int e = static_cast<int>((x >> 10) & 31u), m = static_cast<int>(x & 1023u);
  const double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? std::ldexp(m, -24) : std::ldexp(m + 1024, e - 25);
  return static_cast<float>(x & 0x8000u ? -v : v);
}

// FP32 per query row: m = the largest LSE_s of the non-empty splits, w_s = exp(LSE_s - m)
// (exp2 in base 2), l = sum w_s and acc = sum w_s O_s by FMA in split order, O = acc / l,
// LSE = m + log l; a row of empty splits: O = 0, LSE = -inf. no_guard takes empty splits into
// the max and the sums (0 x an empty split's NaN, -inf - -inf).
int run_combine(const ulpgate_problem* p, bool no_guard) {
  const ulpgate_attention_problem& a = p->attention;
  const ulpgate_attention_combine_problem& c = p->combine;
  float* O = static_cast<float*>(a.o);
  float* L = p->want_lse ? static_cast<float*>(p->lse) : nullptr;
  const bool base2 = c.lse_base == 1;
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h)
      for (int64_t i = 0; i < a.seq_q; ++i) {
        // Split s of batch b is batch s * batch + b of the partial O and LSE.
        const auto lse_of = [&](int64_t s) { return c.lse_part[((s * a.batch + b) * a.heads + h) * a.seq_q + i]; };
        const auto skipped = [&](float x) { return x == -INFINITY && !no_guard; };
        float m = -INFINITY;
        bool any = false;
        for (int64_t s = 0; s < c.splits; ++s)
          if (const float x = lse_of(s); !skipped(x)) any = true, m = std::fmax(m, x);
        float l = 0.0f;
        std::vector<float> acc(static_cast<size_t>(a.head_dim), 0.0f);
        for (int64_t s = 0; s < c.splits && any; ++s) {
          const float x = lse_of(s);
          if (skipped(x)) continue;
          const float w = base2 ? std::exp2(x - m) : std::exp(x - m);
          l += w;
          for (int64_t d = 0; d < a.head_dim; ++d)
            acc[static_cast<size_t>(d)] = std::fma(
                w, part_value(c.o_part, c.type_o_part, at(a, a.heads, a.seq_q, a.head_dim, s * a.batch + b, h, i, d)),
                acc[static_cast<size_t>(d)]);
        }
        for (int64_t d = 0; d < a.head_dim; ++d)
          O[at(a, a.heads, a.seq_q, a.head_dim, b, h, i, d)] = any ? acc[static_cast<size_t>(d)] / l : 0.0f;
        if (L) L[(b * a.heads + h) * a.seq_q + i] = any ? m + (base2 ? std::log2(l) : std::log(l)) : -INFINITY;
      }
  return 0;
}
int run_combine_guarded(const ulpgate_problem* p, char*, size_t) { return run_combine(p, false); }
int run_combine_no_guard(const ulpgate_problem* p, char*, size_t) { return run_combine(p, true); }
#endif

// The kernel descriptor of plugin.h versions 1 to 3, and of version 4.
struct KernelBeforeV4 {
  const char* name;
  const char* description;
  int32_t memory;
  int32_t deterministic;
  int (*supports)(const ulpgate_problem*, char*, size_t);
  int (*run)(const ulpgate_problem*, char*, size_t);
};
struct KernelV4 {
  KernelBeforeV4 head;
  int32_t writes_lse;
};
#define NAME "test.attention_v" STRINGIFY(ATTENTION_PLUGIN_ABI)
#define DESCRIPTION "FP32 attention, three passes (as cpu.attn_naive)"

#if ATTENTION_PLUGIN_ABI >= 5
// The kernel descriptor of versions 5 and 6 (version 7 appended attention_variants).
struct KernelV6 {
  KernelBeforeV4 head;
  int32_t writes_lse, accumulator_bits, promote, p_bits, input_rounding, atomic_dq;
};
[[maybe_unused]] KernelV6 as_v6(const ulpgate_kernel& k) {
  return {{k.name, k.description, k.memory, k.deterministic, k.supports, k.run}, k.writes_lse, k.accumulator_bits,
          k.promote, k.p_bits, k.input_rounding, k.atomic_dq};
}
ulpgate_kernel declared() {
  ulpgate_kernel k{};
  k.name = NAME, k.description = DESCRIPTION, k.memory = ULPGATE_HOST_MEMORY, k.deterministic = 1;
  k.supports = supports, k.run = run, k.writes_lse = 1, k.p_bits = 24;
  return k;
}
#if ATTENTION_PLUGIN_ABI == 6
ulpgate_kernel backward(const char* name, int (*fn)(const ulpgate_problem*, char*, size_t)) {
  ulpgate_kernel k{};
  k.name = name, k.description = "FP32 attention backward (as cpu.attn_bwd_naive)", k.memory = ULPGATE_HOST_MEMORY;
  k.deterministic = 1, k.supports = supports_backward, k.run = fn, k.p_bits = 24, k.atomic_dq = 1;
  return k;
}
const KernelV6 kKernels[] = {as_v6(declared()), as_v6(backward("test.attention_bwd_v6", run_bwd)),
                             as_v6(backward("test.attention_bwd_v6_no_d", run_bwd_no_d))};
#elif ATTENTION_PLUGIN_ABI >= 7
[[maybe_unused]] int run_no_sink(const ulpgate_problem* p, char*, size_t) { return run_attention(p, true, false, true); }
ulpgate_kernel with_variants(ulpgate_kernel k, const char* name, int (*fn)(const ulpgate_problem*, char*, size_t)) {
  k.name = name, k.run = fn;
  k.attention_variants = ULPGATE_VARIANT_WINDOW | ULPGATE_VARIANT_SOFTCAP | ULPGATE_VARIANT_ALIBI | ULPGATE_VARIANT_SINKS;
#if ATTENTION_PLUGIN_ABI >= 8
  k.attention_variants |= ULPGATE_VARIANT_PAGED;
#endif
#if ATTENTION_PLUGIN_ABI >= 9
  k.attention_variants |= ULPGATE_VARIANT_KV_SCALES | ULPGATE_VARIANT_KV_HEAD_SCALES;
#endif
  return k;
}
#if ATTENTION_PLUGIN_ABI >= 10
ulpgate_kernel combine(const char* name, int (*fn)(const ulpgate_problem*, char*, size_t)) {
  ulpgate_kernel k{};
  k.name = name, k.description = "FP32 split-KV combine (as cpu.attn_combine)", k.memory = ULPGATE_HOST_MEMORY;
  k.deterministic = 1, k.supports = supports_combine, k.run = fn, k.writes_lse = 1;
  return k;
}
const ulpgate_kernel kKernels[] = {with_variants(declared(), NAME, run),
                                   combine("test.attention_combine_v" STRINGIFY(ATTENTION_PLUGIN_ABI), run_combine_guarded),
                                   combine("test.attention_combine_v" STRINGIFY(ATTENTION_PLUGIN_ABI) "_no_guard",
                                           run_combine_no_guard)};
#elif ATTENTION_PLUGIN_ABI >= 9
int run_head0(const ulpgate_problem* p, char*, size_t) { return run_attention(p, true, false, false, false, true); }
const ulpgate_kernel kKernels[] = {with_variants(declared(), NAME, run),
                                   with_variants(declared(), "test.attention_v9_head0", run_head0)};
#elif ATTENTION_PLUGIN_ABI >= 8
int run_no_table(const ulpgate_problem* p, char*, size_t) { return run_attention(p, true, false, false, true); }
const ulpgate_kernel kKernels[] = {with_variants(declared(), NAME, run),
                                   with_variants(declared(), "test.attention_v8_no_table", run_no_table)};
#else
const ulpgate_kernel kKernels[] = {with_variants(declared(), NAME, run),
                                   with_variants(declared(), "test.attention_v7_no_sink", run_no_sink)};
#endif
#else
const KernelV6 kKernels[] = {as_v6(declared())};
#endif
const ulpgate_plugin kPlugin = {ATTENTION_PLUGIN_ABI, sizeof kKernels / sizeof kKernels[0],
                                reinterpret_cast<const ulpgate_kernel*>(kKernels)};
#elif ATTENTION_PLUGIN_ABI == 4
int run_no_lse(const ulpgate_problem* p, char*, size_t) { return run_attention(p, false, false); }
int run_wrong_o(const ulpgate_problem* p, char*, size_t) { return run_attention(p, false, true); }
const KernelV4 kKernels[] = {
    {{NAME, DESCRIPTION, ULPGATE_HOST_MEMORY, 1, supports, run}, 1},
    {{"test.attention_v4_no_lse", "the same, O only", ULPGATE_HOST_MEMORY, 1, supports, run_no_lse}, 0},
    {{"test.attention_v4_wrong_o", "O only, without the last visible key", ULPGATE_HOST_MEMORY, 1, supports, run_wrong_o},
     0},
};
const ulpgate_plugin kPlugin = {4, sizeof kKernels / sizeof kKernels[0], reinterpret_cast<const ulpgate_kernel*>(kKernels)};
#else
const KernelBeforeV4 kKernels[] = {{NAME, DESCRIPTION, ULPGATE_HOST_MEMORY, 1, supports, run}};
const ulpgate_plugin kPlugin = {ATTENTION_PLUGIN_ABI, 1, reinterpret_cast<const ulpgate_kernel*>(kKernels)};
#endif

}  // namespace

extern "C" const ulpgate_plugin* ulpgate_plugin_entry(void) { return &kPlugin; }
