/* ulpgate plugin C ABI, version 10 (versions 1 to 9 still load: see "Versions" below).
 *
 * A plugin is a shared library that exports one function,
 *
 *     const ulpgate_plugin* ulpgate_plugin_entry(void);
 *
 * returning a static description of its kernels. ulpgate loads it with
 * `--plugin path.so` (repeatable) and runs its kernels like built-in ones.
 *
 * Memory contract (the same as ulpgate's Case, see docs/concepts/cases.md):
 *   GEMM       D[b] = scale_d * epilogue(alpha * scale_a * scale_b * op(A[b]) op(B[b])
 *                                        + beta * scale_c * C[b] + bias)
 *              with the scales of ulpgate_gemm_problem (1 unless the operand is FP8).
 *              op(A) is M x K, op(B) K x N, C and D M x N, bias N entries (one per output
 *              column, shared by all batches). `layout` is the storage order of every
 *              matrix; trans_a means A is stored K x M. ld* are leading dimensions (row-major:
 *              elements between rows; column-major: between columns), never 0 here.
 *              Batch b of X starts at b * batch_stride_x elements.
 *   Attention  O[b,h] = softmax(softmax_scale * Q K^T + mask) V; key j is visible to query
 *              i of batch b iff j < kv_lengths[b] and (when causal) j <= i + seq_kv - seq_q.
 *              Packed [batch][heads][seq][dim] (BHSD) or [batch][seq][heads][dim] (BSHD).
              Q and O have `heads` heads, K and V have ulpgate_problem.kv_heads heads
              (grouped-query attention; kv_heads == heads is multi-head, 1 multi-query):
              query head h reads K/V head h / (heads / kv_heads).
 *   Attention backward (version 6): from Q, K, V, dO and the forward's O and LSE (inputs),
 *              dV = P^T dO, dP = dO V^T, D = rowsum(dO o O), dS = P o (dP - D),
 *              dQ = softmax_scale dS K, dK = softmax_scale dS^T Q, with P = exp(softmax_scale
 *              Q K^T - LSE) over the visible keys; dK and dV of a K/V head sum over the query
 *              heads of its group. dO, dQ, dK, dV are laid out as O, Q, K, V.
 *   Attention combine (version 10): split-KV decoding's merge of partial states, per query
 *              row LSE = ln sum_s exp(LSE_s), O = sum_s exp(LSE_s - LSE) O_s (log2 and 2^x in
 *              base 2); a split with LSE_s = -inf is empty. Memory: see
 *              ulpgate_attention_combine_problem (docs/concepts/split-kv.md).
 * Element storage: FP64/FP32 as IEEE words, TF32 as FP32 words with the low 13 bits zero,
 * FP16/BF16 as 16-bit words, FP8 as bytes (OCP E4M3 "fn" / E5M2).
 * Pointers are host or device pointers as the kernel's `memory` says. Outputs are
 * poisoned with a NaN pattern before each call: write every element, and nothing else.
 */
#ifndef ULPGATE_PLUGIN_H
#define ULPGATE_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Versions. 2 appended ulpgate_problem.kv_heads (every earlier field keeps its offset). A
   plugin built against version 1 still loads, but it would read K and V as having `heads`
   heads, so ulpgate never hands it an attention problem with kv_heads != heads: such cases
   are "not supported" by it, with a reason that says why. 3 appended want_lse and lse (the
   attention log-sum-exp output); plugins of versions 1 and 2 are never handed a case that
   asks for it, a version-3 kernel is asked whenever a case does (its supports() decides).
   4 appended ulpgate_kernel.writes_lse: only a kernel that sets it is handed cases with the
   log-sum-exp, and no such case is drawn for the others (ulpgate reads the kernel list of an
   older plugin with the shorter descriptor it was built with). 5 appended the arithmetic a
   kernel declares (ulpgate_kernel.accumulator_bits, promote, p_bits, input_rounding); a
   kernel of an older version, or one that leaves them 0, is judged by the default rule.
   6 added the attention backward op (ULPGATE_OP_ATTENTION_BACKWARD, ulpgate_problem.backward)
   and appended ulpgate_kernel.atomic_dq; older plugins are never handed a backward case.
   7 appended the served attention variants (ulpgate_problem.window_left to sinks) and
   ulpgate_kernel.attention_variants, the ones a kernel applies; a kernel is handed a case
   with a variant only where it declares that variant, so older plugins never see one.
   8 appended paged K/V (ulpgate_problem.page_size to page_table, ULPGATE_VARIANT_PAGED)
   and an FP8 K/V cache's scales (scale_k, scale_v, ULPGATE_VARIANT_KV_SCALES); only a
   version-8 kernel may declare them.
   9 appended an FP8 K/V cache's per-head scales (head_scale_k, head_scale_v,
   ULPGATE_VARIANT_KV_HEAD_SCALES); only a version-9 kernel may declare them.
   10 added the attention combine op (ULPGATE_OP_ATTENTION_COMBINE, ulpgate_problem.combine);
   older plugins are never handed a combine case. */
#define ULPGATE_PLUGIN_ABI_VERSION 10u

typedef enum {
  ULPGATE_FP64 = 0, ULPGATE_FP32 = 1, ULPGATE_TF32 = 2, ULPGATE_FP16 = 3,
  ULPGATE_BF16 = 4, ULPGATE_E4M3 = 5, ULPGATE_E5M2 = 6
} ulpgate_format;

typedef enum {
  ULPGATE_OP_GEMM = 0, ULPGATE_OP_ATTENTION = 1, ULPGATE_OP_ATTENTION_BACKWARD = 2,
  ULPGATE_OP_ATTENTION_COMBINE = 3  /* version 10 */
} ulpgate_op;
typedef enum { ULPGATE_ROW_MAJOR = 0, ULPGATE_COL_MAJOR = 1 } ulpgate_layout;
typedef enum { ULPGATE_BHSD = 0, ULPGATE_BSHD = 1 } ulpgate_attention_layout;
typedef enum {
  ULPGATE_EPI_NONE = 0, ULPGATE_EPI_BIAS = 1, ULPGATE_EPI_RELU = 2, ULPGATE_EPI_GELU = 3,
  ULPGATE_EPI_GELU_TANH = 4, ULPGATE_EPI_BIAS_RELU = 5, ULPGATE_EPI_BIAS_GELU = 6,
  ULPGATE_EPI_BIAS_GELU_TANH = 7
} ulpgate_epilogue;
typedef enum { ULPGATE_HOST_MEMORY = 0, ULPGATE_DEVICE_MEMORY = 1 } ulpgate_memory;
/* Version 7: ALiBi's distance for query i and key j (docs/concepts/alibi.md). */
typedef enum {
  ULPGATE_ALIBI_FLASH = 0,      /* -|i + seq_kv - seq_q - j| (FlashAttention) */
  ULPGATE_ALIBI_FLASHINFER = 1  /* j - i (FlashInfer) */
} ulpgate_alibi_form;
/* Version 7: the attention variants a kernel applies (ulpgate_kernel.attention_variants). */
#define ULPGATE_VARIANT_WINDOW 1u   /* window_left, window_right */
#define ULPGATE_VARIANT_SOFTCAP 2u  /* softcap */
#define ULPGATE_VARIANT_ALIBI 4u    /* alibi_slopes, alibi_form */
#define ULPGATE_VARIANT_SINKS 8u    /* sinks */
#define ULPGATE_VARIANT_PAGED 16u   /* version 8: page_size, num_pages, pages_per_seq, page_table */
#define ULPGATE_VARIANT_KV_SCALES 32u  /* version 8: scale_k, scale_v */
#define ULPGATE_VARIANT_KV_HEAD_SCALES 64u  /* version 9: head_scale_k, head_scale_v */
/* How a kernel rounds the inputs it narrows (TF32 compute: FP32 inputs to TF32). */
typedef enum {
  ULPGATE_INPUTS_ROUND_TO_NEAREST = 0, /* cvt.rna: to nearest, ties away (the default) */
  ULPGATE_INPUTS_TRUNCATE = 1,         /* cvt.rz: toward zero, e.g. dropping the low bits */
  ULPGATE_INPUTS_TIES_TO_EVEN = 2      /* cvt.rn: to nearest, ties to even (cuBLAS, cuBLASLt) */
} ulpgate_input_rounding;

typedef struct {
  int64_t m, n, k, batch;
  int32_t layout;             /* ulpgate_layout */
  int32_t trans_a, trans_b;   /* 0 or 1 */
  int64_t lda, ldb, ldc, ldd;
  int64_t batch_stride_a, batch_stride_b, batch_stride_c, batch_stride_d;
  int32_t type_a, type_b, type_c, type_d, type_bias, type_compute; /* ulpgate_format; -1: none */
  double alpha, beta;
  int32_t epilogue;           /* ulpgate_epilogue */
  /* Per-tensor scales of FP8 (E4M3/E5M2) operands, as cuBLASLt's scale pointers; exactly 1
     for every other operand, so a kernel without FP8 operands may ignore them. A, B, C: the value of an element is its stored value x scale_a / scale_b / scale_c.
     D: the stored element is scale_d x the epilogue's result, in type_d (bias and
     activation apply before scale_d). */
  double scale_a, scale_b, scale_c, scale_d;
  const void* a;
  const void* b;
  const void* c;              /* NULL when beta == 0 */
  const void* bias;           /* NULL without a bias epilogue */
  void* d;
} ulpgate_gemm_problem;

typedef struct {
  int64_t batch, heads, seq_q, seq_kv, head_dim, head_dim_v;
  int32_t layout;             /* ulpgate_attention_layout */
  int32_t causal;
  double softmax_scale;       /* already resolved (1/sqrt(head_dim) by default) */
  const int64_t* kv_lengths;  /* batch entries, host memory */
  int32_t type_q, type_k, type_v, type_o, type_compute;
  const void* q;
  const void* k;
  const void* v;
  void* o;
} ulpgate_attention_problem;

/* Version 6: the gradients of an attention backward problem. The shape, Q, K, V and their
   types are in ulpgate_problem.attention; attention.o holds the forward's output O (an
   input here: read it, never write it) and ulpgate_problem.lse its log-sum-exp (FP32, [b][h][i],
   natural log, +inf for a row that sees no key: exp(s - LSE) is then 0; an input too). */
typedef struct {
  int32_t type_do, type_dq, type_dk, type_dv;  /* ulpgate_format */
  const void* d_o;            /* laid out as O */
  void* dq;                   /* laid out as Q */
  void* dk;                   /* laid out as K (kv_heads heads) */
  void* dv;                   /* laid out as V (kv_heads heads) */
} ulpgate_attention_backward_problem;

/* Version 10: the partial states of an attention combine problem. The shape and the output
   are in ulpgate_problem.attention: batch, heads, seq_q, head_dim (head_dim_v equal to it),
   layout, type_o and type_compute (FP32), o, laid out as an attention forward's O; no keys
   (seq_kv 0, kv_lengths, q, k, v NULL, types -1; ulpgate_problem.kv_heads 0). want_lse and
   lse: the merged log-sum-exp, an output laid out as the forward's ([b][h][i], FP32, in this
   problem's base; -inf for a row whose splits are all empty, whose O is then 0).
     o_part    type_o_part (FP32, FP16 or BF16) elements, split s of batch b laid out as
               batch s * batch + b of an O with splits * batch batches:
               [split][batch][heads][seq_q][head_dim] (ULPGATE_BHSD),
               [split][batch][seq_q][heads][head_dim] (ULPGATE_BSHD)
     lse_part  FP32, [split][batch][heads][seq_q] whatever the layout
   A split whose LSE_s is -inf is empty: its weight is 0 and its O_s must not be read (it may
   hold NaN). Both are inputs, in the kernel's memory as o and lse. */
typedef struct {
  int64_t splits;             /* >= 1 partial states per query row */
  int32_t lse_base;           /* 0: natural log (ln sum e^x); 1: base 2 (log2 sum 2^x), every LSE */
  int32_t type_o_part;        /* ulpgate_format */
  const void* o_part;
  const float* lse_part;
} ulpgate_attention_combine_problem;

typedef struct {
  uint32_t struct_size;       /* sizeof(ulpgate_problem) of the caller: check it */
  int32_t op;                 /* ulpgate_op: which member below is valid */
  ulpgate_gemm_problem gemm;
  ulpgate_attention_problem attention;
  void* stream;               /* cudaStream_t for device kernels (NULL: default stream) */
  /* Version 2. Attention: the heads of K and V (1 <= kv_heads <= heads, heads % kv_heads
     == 0; equal to heads for multi-head attention). GEMM: 0. */
  int64_t kv_heads;
  /* Version 3. Attention (and, version 10, attention combine): 1 when the case asks for the
     log-sum-exp output too (only kernels that set ulpgate_kernel.writes_lse are asked;
     supports() may still refuse), else 0; GEMM: 0. lse: where to write it
     (NULL in supports() and when not asked): FP32, batch x heads x seq_q elements laid out
     [b][h][i] whatever the layout, LSE = ln sum_j exp(softmax_scale q_i . k_j) over the
     visible keys, -inf (or +inf, FlashAttention's convention) for a row without one. In the
     kernel's memory, as q, k, v, o. */
  int32_t want_lse;
  void* lse;
  /* Version 6. Attention backward (op ULPGATE_OP_ATTENTION_BACKWARD): see above; want_lse
     is 0 and lse is the forward's LSE, an input. Other ops: zeros. */
  ulpgate_attention_backward_problem backward;
  /* Version 7. Attention forward, the served variants; each is handed only to a kernel that
     declares it, and is "none" otherwise:
       window_left, window_right  key j visible to query i only if i' - window_left <= j <=
                                  i' + window_right, i' = i + seq_kv - seq_q; -1: that side
                                  unbounded (docs/concepts/windows.md)
       softcap                    each scaled score x becomes softcap tanh(x / softcap),
                                  before masks and biases; 0: none (softcap.md)
       alibi_slopes, alibi_form   slope[h] times the distance (ulpgate_alibi_form) added to
                                  the logit; heads entries, host memory; NULL: none (alibi.md)
       sinks                      one logit per query head in the softmax's denominator only
                                  (no value row), -inf: none for that head; heads entries,
                                  host memory; NULL: none (sinks.md). The LSE includes it.
     The log-sum-exp is of the logits: ln(sum_j exp(logit_ij) + exp(sink)). */
  int64_t window_left, window_right;
  double softcap;
  const float* alibi_slopes;
  int32_t alibi_form;
  const float* sinks;
  /* Version 8. Paged K/V (docs/concepts/paged-kv.md), handed only to a kernel that declares
     ULPGATE_VARIANT_PAGED; page_size 0 otherwise (K and V contiguous). attention.k and .v are
     then pools of num_pages pages of page_size keys, laid out [page][kv head][slot][dim] for
     ULPGATE_BHSD and [page][slot][kv head][dim] for ULPGATE_BSHD; key s of batch b is slot
     s % page_size of page page_table[b * pages_per_seq + s / page_size]. page_table: batch x
     pages_per_seq entries, host memory; a row may hold more entries than seq_kv needs, pages
     may be shared between rows, and pool slots that hold no key are not zero. */
  int64_t page_size, num_pages, pages_per_seq;
  const int64_t* page_table;
  /* Version 8. An FP8 K/V cache's per-tensor scales (docs/concepts/fp8-kv.md): the value of a
     K or V element is its stored value times scale_k or scale_v. Handed only to a kernel that
     declares ULPGATE_VARIANT_KV_SCALES; exactly 1 otherwise. */
  double scale_k, scale_v;
  /* Version 9. An FP8 K/V cache scaled per K/V head: the value of a K or V element of K/V
     head h is its stored value times head_scale_k[h] or head_scale_v[h] (kv_heads entries
     each, host memory; scale_k and scale_v are then 1). Handed only to a kernel that declares
     ULPGATE_VARIANT_KV_HEAD_SCALES; NULL otherwise, and where that operand has no per-head
     scales. */
  const double* head_scale_k;
  const double* head_scale_v;
  /* Version 10. Attention combine (op ULPGATE_OP_ATTENTION_COMBINE): see above; other ops:
     zeros. As for the backward op, supports() says whether a kernel takes combine cases
     (p->op); older plugins are never asked. */
  ulpgate_attention_combine_problem combine;
} ulpgate_problem;

typedef struct {
  const char* name;           /* unique, e.g. "myplugin.gemm_fp16" */
  const char* description;
  int32_t memory;             /* ulpgate_memory */
  int32_t deterministic;      /* 1 if bitwise repeatable */
  /* Returns 1 if the kernel can run the problem (data pointers are NULL here); else 0
     and writes a reason into why (NUL-terminated, at most why_size bytes). */
  int (*supports)(const ulpgate_problem* p, char* why, size_t why_size);
  /* Runs the problem; returns 0 on success, else nonzero with a message in err. */
  int (*run)(const ulpgate_problem* p, char* err, size_t err_size);
  /* Version 4. Attention (and, version 10, attention combine): 1 if run() writes
     ulpgate_problem.lse when want_lse is 1. 0 (the default of an initializer that leaves it
     out): the kernel writes O only, and ulpgate never draws or hands it a case that asks for
     the log-sum-exp. */
  int32_t writes_lse;
  /* Version 5: the arithmetic the kernel is designed with, where the default rule would
     judge it wrongly (0 everywhere: undeclared, the default rule; docs/concepts/precision.md
     lists what it admits). Declaring is never needed for a mainstream kernel; a declaration
     gets the rule of exactly that arithmetic, which may be tighter.
       accumulator_bits  precision (implicit bit included) of the accumulator where it is not
                         the compute format's, e.g. 14 for FP8 tensor cores; 0: the compute
                         format's (FP8 inputs: 14 bits promoted every 128 products)
       promote           products after which that accumulator is added to an FP32 one; 0:
                         never (or, with accumulator_bits 0, undeclared)
       p_bits            attention: precision P is rounded to before P V (FP16 11, BF16 8,
                         24: P kept in FP32, the tighter rule); 0: P in the inputs' 16-bit
                         format admitted
       input_rounding    ulpgate_input_rounding */
  int32_t accumulator_bits;
  int32_t promote;
  int32_t p_bits;
  int32_t input_rounding;
  /* Version 6. Attention backward: 1 if dQ is accumulated with atomic adds, so that its bits
     may change from run to run (dK and dV must still repeat bit for bit); 0: every output
     repeats. */
  int32_t atomic_dq;
  /* Version 7. The attention variants run() applies, ULPGATE_VARIANT_* bits; 0: none, and
     ulpgate never draws or hands the kernel a case with one. */
  uint32_t attention_variants;
} ulpgate_kernel;

typedef struct {
  uint32_t abi_version;       /* ULPGATE_PLUGIN_ABI_VERSION (1 to 9 are still accepted) */
  uint32_t kernel_count;
  const ulpgate_kernel* kernels;
} ulpgate_plugin;

typedef const ulpgate_plugin* (*ulpgate_plugin_entry_fn)(void);
#define ULPGATE_PLUGIN_ENTRY "ulpgate_plugin_entry"

#ifdef __cplusplus
}
#endif

#endif /* ULPGATE_PLUGIN_H */
