// Test equipment for the default rule's admitted arithmetics (tests/check/test_admitted.cpp):
// host kernels a user would write against include/ulpgate/plugin.h only, correct ones with
// the arithmetic mainstream kernels use and ones with a deviation a correct kernel never has.
//   test.fa2              FlashAttention-2 style: keys in blocks of 64, online softmax in FP32,
//                         P = exp(s - m) rounded to the inputs' FP16/BF16 before P V, FP32
//                         accumulators, O rounded once; declares nothing
//   test.fa2_fp32p        the same with P kept in FP32; declares p_bits 24
//   test.fa2_p4           P rounded to 4 bits (an FP8 E4M3 P): beyond what is admitted
//   test.tf32             TF32 GEMM: inputs rounded to TF32 as cvt.rna does, FP32 FMA
//                         accumulation in k order; declares nothing
//   test.tf32_rz          the same with inputs truncated to TF32 (their low 13 bits dropped)
//   test.tf32_rz_declared the truncating kernel declaring it (ULPGATE_INPUTS_TRUNCATE)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "ulpgate/plugin.h"

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float half_to_float(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  if (e == 0x1f) return m ? NAN : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -24);
  return sign * std::ldexp(static_cast<float>(m | 0x400), e - 25);
}

// Round to nearest even, as cvt.rn.f16.f32.
uint16_t float_to_half(float f) {
  const uint16_t sign = (bits_of(f) >> 16) & 0x8000;
  if (std::isnan(f)) return sign | 0x7e00;
  const float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < std::ldexp(1.0f, -14)) return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(a, 24)));
  int e;
  const float m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  int q = static_cast<int>(std::nearbyint(std::ldexp(m, 11)));
  if (q == 2048) q = 1024, ++e;
  return sign | static_cast<uint16_t>(((e - 1 + 15) << 10) + (q - 1024));
}

float bf16_to_float(uint16_t b) { return from_bits(static_cast<uint32_t>(b) << 16); }

// Round to nearest even, as cvt.rn.bf16.f32.
uint16_t float_to_bf16(float f) {
  const uint32_t u = bits_of(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// x rounded to `bits` of precision (nearest even, no exponent limit).
float round_to_bits(float x, int bits) {
  if (x == 0.0f || !std::isfinite(x)) return x;
  int e;
  std::frexp(x, &e);
  return std::ldexp(std::nearbyint(std::ldexp(x, bits - e)), e - bits);
}

float load(const void* p, int32_t type, int64_t i) {
  switch (type) {
    case ULPGATE_FP16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case ULPGATE_BF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}
void store(void* p, int32_t type, int64_t i, float v) {
  switch (type) {
    case ULPGATE_FP16: static_cast<uint16_t*>(p)[i] = float_to_half(v); break;
    case ULPGATE_BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

// ---- attention ----

enum class PRounding { InputFormat, Fp32, FourBits };

int attention_supports(const ulpgate_problem* p, char* why, size_t why_size) {
  if (p->struct_size < sizeof(ulpgate_problem) || p->op != ULPGATE_OP_ATTENTION) {
    std::snprintf(why, why_size, "attention only");
    return 0;
  }
  const ulpgate_attention_problem& a = p->attention;
  const bool half_inputs = a.type_q == ULPGATE_FP16 || a.type_q == ULPGATE_BF16;
  const bool o_ok = a.type_o == a.type_q || a.type_o == ULPGATE_FP32;
  if (!half_inputs || a.type_k != a.type_q || a.type_v != a.type_q || !o_ok || a.type_compute != ULPGATE_FP32) {
    std::snprintf(why, why_size, "FP16 or BF16 Q, K, V; O in their format or FP32; FP32 compute");
    return 0;
  }
  return 1;
}

int64_t at(const ulpgate_attention_problem& a, int64_t heads, int64_t seq, int64_t dim, int64_t b, int64_t h,
           int64_t s, int64_t d) {
  return a.layout == ULPGATE_BHSD ? ((b * heads + h) * seq + s) * dim + d : ((b * seq + s) * heads + h) * dim + d;
}

int run_flash(const ulpgate_problem* p, PRounding p_rounding) {
  constexpr int64_t kBlock = 64;
  const ulpgate_attention_problem& a = p->attention;
  const int64_t kv_heads = p->kv_heads;
  const float scale = static_cast<float>(a.softmax_scale);
  std::vector<float> q(a.head_dim), s(kBlock), acc(a.head_dim_v);
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h)
      for (int64_t i = 0; i < a.seq_q; ++i) {
        const int64_t hk = h / (a.heads / kv_heads);
        int64_t visible = a.kv_lengths[b];
        if (a.causal && i + a.seq_kv - a.seq_q + 1 < visible) visible = i + a.seq_kv - a.seq_q + 1;
        for (int64_t d = 0; d < a.head_dim; ++d) q[d] = load(a.q, a.type_q, at(a, a.heads, a.seq_q, a.head_dim, b, h, i, d));
        float m = -INFINITY, l = 0.0f;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j0 = 0; j0 < visible; j0 += kBlock) {
          const int64_t n = visible - j0 < kBlock ? visible - j0 : kBlock;
          float block_max = -INFINITY;
          for (int64_t t = 0; t < n; ++t) {
            float dot = 0.0f;
            for (int64_t d = 0; d < a.head_dim; ++d)
              dot = std::fma(q[d], load(a.k, a.type_k, at(a, kv_heads, a.seq_kv, a.head_dim, b, hk, j0 + t, d)), dot);
            s[t] = scale * dot;
            block_max = std::fmax(block_max, s[t]);
          }
          const float m_new = std::fmax(m, block_max);
          const float correction = std::exp(m - m_new);  // 0 on the first block (m = -inf)
          l *= correction;
          for (float& x : acc) x *= correction;
          for (int64_t t = 0; t < n; ++t) {
            const float pt = std::exp(s[t] - m_new);
            l += pt;  // the row sum takes P in FP32, as FlashAttention-2 does
            float p16 = pt;
            if (p_rounding == PRounding::InputFormat)
              p16 = a.type_q == ULPGATE_FP16 ? half_to_float(float_to_half(pt)) : bf16_to_float(float_to_bf16(pt));
            else if (p_rounding == PRounding::FourBits)
              p16 = round_to_bits(pt, 4);
            for (int64_t d = 0; d < a.head_dim_v; ++d)
              acc[d] = std::fma(p16, load(a.v, a.type_v, at(a, kv_heads, a.seq_kv, a.head_dim_v, b, hk, j0 + t, d)), acc[d]);
          }
          m = m_new;
        }
        for (int64_t d = 0; d < a.head_dim_v; ++d)
          store(a.o, a.type_o, at(a, a.heads, a.seq_q, a.head_dim_v, b, h, i, d), l > 0.0f ? acc[d] / l : 0.0f);
        if (p->want_lse && p->lse)
          static_cast<float*>(p->lse)[(b * a.heads + h) * a.seq_q + i] = l > 0.0f ? m + std::log(l) : -INFINITY;
      }
  return 0;
}

int run_fa2(const ulpgate_problem* p, char*, size_t) { return run_flash(p, PRounding::InputFormat); }
int run_fa2_fp32p(const ulpgate_problem* p, char*, size_t) { return run_flash(p, PRounding::Fp32); }
int run_fa2_p4(const ulpgate_problem* p, char*, size_t) { return run_flash(p, PRounding::FourBits); }

// ---- TF32 GEMM ----

int tf32_supports(const ulpgate_problem* p, char* why, size_t why_size) {
  if (p->struct_size < sizeof(ulpgate_problem) || p->op != ULPGATE_OP_GEMM) {
    std::snprintf(why, why_size, "GEMM only");
    return 0;
  }
  const ulpgate_gemm_problem& g = p->gemm;
  if (g.type_a != ULPGATE_FP32 || g.type_b != ULPGATE_FP32 || g.type_d != ULPGATE_FP32 ||
      g.type_compute != ULPGATE_TF32 || (g.c && g.type_c != ULPGATE_FP32) || g.epilogue != ULPGATE_EPI_NONE) {
    std::snprintf(why, why_size, "FP32 A, B, C, D with TF32 compute, no epilogue");
    return 0;
  }
  return 1;
}

int64_t element(const ulpgate_gemm_problem& g, int64_t ld, int64_t row, int64_t col) {
  return g.layout == ULPGATE_ROW_MAJOR ? row * ld + col : col * ld + row;
}

float to_tf32(float x, bool truncate) {
  if (!std::isfinite(x)) return x;
  const uint32_t u = bits_of(x);
  return from_bits(truncate ? (u & ~0x1fffu) : ((u + 0x1000u) & ~0x1fffu));
}

int run_tf32(const ulpgate_problem* p, bool truncate) {
  const ulpgate_gemm_problem& g = p->gemm;
  const float* A = static_cast<const float*>(g.a);
  const float* B = static_cast<const float*>(g.b);
  const float* C = static_cast<const float*>(g.c);
  float* D = static_cast<float*>(g.d);
  for (int64_t bt = 0; bt < g.batch; ++bt)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        float acc = 0.0f;
        for (int64_t k = 0; k < g.k; ++k) {
          const float x = A[bt * g.batch_stride_a + (g.trans_a ? element(g, g.lda, k, i) : element(g, g.lda, i, k))];
          const float y = B[bt * g.batch_stride_b + (g.trans_b ? element(g, g.ldb, j, k) : element(g, g.ldb, k, j))];
          acc = std::fma(to_tf32(x, truncate), to_tf32(y, truncate), acc);
        }
        float d = static_cast<float>(g.alpha) * acc;
        if (C) d += static_cast<float>(g.beta) * C[bt * g.batch_stride_c + element(g, g.ldc, i, j)];
        D[bt * g.batch_stride_d + element(g, g.ldd, i, j)] = d;
      }
  return 0;
}

int run_tf32_rna(const ulpgate_problem* p, char*, size_t) { return run_tf32(p, false); }
int run_tf32_rz(const ulpgate_problem* p, char*, size_t) { return run_tf32(p, true); }

ulpgate_kernel kernel(const char* name, const char* description, int (*supports)(const ulpgate_problem*, char*, size_t),
                      int (*run)(const ulpgate_problem*, char*, size_t), int32_t writes_lse, int32_t p_bits,
                      int32_t input_rounding) {
  ulpgate_kernel k{};
  k.name = name, k.description = description, k.memory = ULPGATE_HOST_MEMORY, k.deterministic = 1;
  k.supports = supports, k.run = run, k.writes_lse = writes_lse;
  k.p_bits = p_bits, k.input_rounding = input_rounding;
  return k;
}

const ulpgate_kernel kKernels[] = {
    kernel("test.fa2", "flash attention, P in the inputs' 16-bit format", attention_supports, run_fa2, 1, 0, 0),
    kernel("test.fa2_fp32p", "flash attention, P in FP32 (declared)", attention_supports, run_fa2_fp32p, 1, 24, 0),
    kernel("test.fa2_p4", "flash attention, P in 4 bits", attention_supports, run_fa2_p4, 1, 0, 0),
    kernel("test.tf32", "TF32 GEMM, inputs rounded to nearest", tf32_supports, run_tf32_rna, 0, 0, 0),
    kernel("test.tf32_rz", "TF32 GEMM, inputs truncated", tf32_supports, run_tf32_rz, 0, 0, 0),
    kernel("test.tf32_rz_declared", "TF32 GEMM, inputs truncated (declared)", tf32_supports, run_tf32_rz, 0, 0,
           ULPGATE_INPUTS_TRUNCATE),
};
const ulpgate_plugin kPlugin = {ULPGATE_PLUGIN_ABI_VERSION, sizeof kKernels / sizeof kKernels[0], kKernels};

}  // namespace

extern "C" const ulpgate_plugin* ulpgate_plugin_entry(void) { return &kPlugin; }
