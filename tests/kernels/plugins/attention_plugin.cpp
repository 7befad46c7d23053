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
//   ATTENTION_PLUGIN_ABI=6  "test.attention_v6": a version this ulpgate does not know
// Versions 1 to 4 lay their kernel list out as plugin.h did then (1 to 3: no writes_lse; 4:
// no declared arithmetic). Written
// against include/ulpgate/plugin.h only.
#include <cmath>
#include <cstdio>
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
  if (a.type_q != ULPGATE_FP32 || a.type_k != ULPGATE_FP32 || a.type_v != ULPGATE_FP32 ||
      a.type_o != ULPGATE_FP32 || a.type_compute != ULPGATE_FP32) {
    std::snprintf(why, why_size, "FP32 Q, K, V, O and compute only");
    return 0;
  }
  return 1;
}

int64_t at(const ulpgate_attention_problem& a, int64_t heads, int64_t seq, int64_t dim, int64_t b, int64_t h,
           int64_t s, int64_t d) {
  return a.layout == ULPGATE_BHSD ? ((b * heads + h) * seq + s) * dim + d : ((b * seq + s) * heads + h) * dim + d;
}

int run_attention(const ulpgate_problem* p, bool write_lse, bool drop_last_key) {
  const ulpgate_attention_problem& a = p->attention;
#if ATTENTION_PLUGIN_ABI >= 2
  const int64_t kv_heads = p->kv_heads;
#else
  const int64_t kv_heads = a.heads;  // version 1: K and V have `heads` heads
#endif
  const float* Q = static_cast<const float*>(a.q);
  const float* K = static_cast<const float*>(a.k);
  const float* V = static_cast<const float*>(a.v);
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
        for (int64_t j = 0; j < visible; ++j) {
          float dot = 0.0f;
          for (int64_t d = 0; d < a.head_dim; ++d)
            dot = std::fma(Q[at(a, a.heads, a.seq_q, a.head_dim, b, h, i, d)],
                           K[at(a, kv_heads, a.seq_kv, a.head_dim, b, hk, j, d)], dot);
          keys.push_back(j), s.push_back(scale * dot);
        }
        float m = -INFINITY, l = 0.0f;
        for (float x : s) m = std::fmax(m, x);
        for (float& x : s) l += (x = std::exp(x - m));
        for (int64_t d = 0; d < a.head_dim_v; ++d) {
          float acc = 0.0f;
          for (size_t t = 0; t < keys.size(); ++t)
            acc = std::fma(s[t], V[at(a, kv_heads, a.seq_kv, a.head_dim_v, b, hk, keys[t], d)], acc);
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
ulpgate_kernel declared() {
  ulpgate_kernel k{};
  k.name = NAME, k.description = DESCRIPTION, k.memory = ULPGATE_HOST_MEMORY, k.deterministic = 1;
  k.supports = supports, k.run = run, k.writes_lse = 1, k.p_bits = 24;
  return k;
}
const ulpgate_kernel kKernels[] = {declared()};
const ulpgate_plugin kPlugin = {ATTENTION_PLUGIN_ABI, 1, kKernels};
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
