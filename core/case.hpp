// The case model: everything needed to reproduce one kernel run, serialised as JSON, and
// the memory contract every kernel and reference follows, made concrete by the views below:
//   GEMM  D[b] = scale_D ep(alpha scale_A scale_B op(A[b]) op(B[b]) + beta scale_C C[b] + bias)
//   Attention  O[b,h] = softmax(scale Q K^T + mask) V, optionally with its log-sum-exp LSE
//   Attention combine  O = sum_s exp(LSE_s - LSE) O_s, LSE = ln sum_s exp(LSE_s) (split-KV)
// Layouts, transposes, leading dimensions, batches, heads, the mask and LSE: see
// docs/concepts/cases.md ("Memory interpretation").
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/format.hpp"

namespace ulpgate {

enum class Op : std::uint8_t { Gemm, Attention, AttentionBackward, AttentionCombine };
enum class Layout : std::uint8_t { RowMajor, ColMajor };
enum class AttentionLayout : std::uint8_t { BHSD, BSHD };
/// ALiBi's two bias forms (docs/concepts/alibi.md), for query i, key j and a slope per head:
/// Flash: -slope |i + seq_kv - seq_q - j| (FlashAttention); FlashInfer: slope (j - i).
enum class AlibiForm : std::uint8_t { Flash, FlashInfer };
enum class Epilogue : std::uint8_t {
  None, Bias, Relu, Gelu, GeluTanh, BiasRelu, BiasGelu, BiasGeluTanh
};

std::string_view name(Op);
/// The op named "gemm", "attention", "attention_backward" or "attention_combine"; nullopt
/// for any other name.
std::optional<Op> parse_op(std::string_view name);
/// Attention forward or backward: the ops of Q, K and V (attention_combine shares
/// AttentionShape and attention_view but has none of them).
constexpr bool is_attention(Op o) { return o == Op::Attention || o == Op::AttentionBackward; }
/// The input whose format names a case's dtype: GEMM "A", attention "Q", combine "O_part".
std::string primary_input(Op op);
std::string_view name(Layout);
std::string_view name(AttentionLayout);
std::string_view name(AlibiForm);
std::string_view name(Epilogue);
bool has_bias(Epilogue e);
/// Whether the epilogue applies a GELU (erf or tanh form, with or without bias).
bool has_gelu(Epilogue e);

/// op(A) is M x K, op(B) K x N, C and D M x N. `layout` is the storage order of every matrix;
/// trans_a: A is stored K x M and read through op() = transpose (trans_b likewise). A leading
/// dimension counts the elements between rows (row-major) or columns (column-major); batches
/// are packed one after another (MatrixView::batch_stride).
struct GemmShape {
  std::int64_t m = 1, n = 1, k = 1, batch = 1;
  Layout layout = Layout::RowMajor;
  bool trans_a = false, trans_b = false;
  std::int64_t lda = 0, ldb = 0, ldc = 0, ldd = 0;  ///< 0: packed

  /// Rows and columns of A and B as stored (after undoing op()).
  std::int64_t a_rows() const { return trans_a ? k : m; }
  std::int64_t a_cols() const { return trans_a ? m : k; }
  std::int64_t b_rows() const { return trans_b ? n : k; }
  std::int64_t b_cols() const { return trans_b ? k : n; }
  /// Packed leading dimension of a rows x cols matrix in this layout.
  std::int64_t packed_ld(std::int64_t rows, std::int64_t cols) const {
    return layout == Layout::RowMajor ? cols : rows;
  }
  std::int64_t eff_lda() const { return lda ? lda : packed_ld(a_rows(), a_cols()); }
  std::int64_t eff_ldb() const { return ldb ? ldb : packed_ld(b_rows(), b_cols()); }
  std::int64_t eff_ldc() const { return ldc ? ldc : packed_ld(m, n); }
  std::int64_t eff_ldd() const { return ldd ? ldd : packed_ld(m, n); }
  bool operator==(const GemmShape&) const = default;
};

struct AttentionShape {
  std::int64_t batch = 1, heads = 1, seq_q = 1, seq_kv = 1, head_dim = 64, head_dim_v = 0;
  /// Heads of K and V: 0 means `heads` (multi-head attention); else 1 <= kv_heads <= heads
  /// and heads % kv_heads == 0 (grouped-query; 1: multi-query).
  std::int64_t kv_heads = 0;
  AttentionLayout layout = AttentionLayout::BHSD;
  bool causal = false;
  std::optional<double> softmax_scale;   ///< nullopt: 1/sqrt(head_dim)
  std::vector<std::int64_t> kv_lengths;  ///< one per batch; empty: all seq_kv
  /// Sliding window in FlashAttention's convention (docs/concepts/windows.md): query i sees key
  /// j iff i + (seq_kv - seq_q) - window_left <= j <= i + (seq_kv - seq_q) + window_right;
  /// -1 leaves that side unbounded. Causal is window_right = 0 (both may be given).
  std::int64_t window_left = -1, window_right = -1;
  bool windowed() const { return window_left >= 0 || window_right >= 0; }
  /// Soft-capping (docs/concepts/softcap.md): each scaled score x becomes cap tanh(x / cap)
  /// before masks and biases. 0: none.
  double softcap = 0;
  /// ALiBi (docs/concepts/alibi.md): slope_h times alibi_distance(i, j) added to the logit
  /// after soft-capping, one slope per query head (FP32 values). Empty: none.
  std::vector<double> alibi_slopes;
  AlibiForm alibi_form = AlibiForm::Flash;
  /// Attention sinks (docs/concepts/sinks.md): one logit per query head (FP32 values, -inf for
  /// none) in the softmax's denominator only; it has no value row. Empty: none.
  std::vector<double> sinks;
  /// Paged K/V (docs/concepts/paged-kv.md): K and V live in a pool of num_pages pages of
  /// page_size key positions each, laid out [page][kv head][slot][dim] for BHSD and
  /// [page][slot][kv head][dim] for BSHD (the HND and NHD caches). Key s of batch b is slot
  /// s % page_size of page page_table[b * pages_per_seq() + s / page_size]. A batch's row
  /// may be longer than seq_kv needs (its extra entries are never read); pages may appear out
  /// of order, be shared by several rows, or be in no row at all. page_size 0: contiguous.
  std::int64_t page_size = 0, num_pages = 0;
  std::vector<std::int64_t> page_table;
  /// attention_combine (docs/concepts/split-kv.md): the partial states per query row, each an
  /// O_s of head_dim values and its LSE_s; lse_base2: every LSE (the parts' and the output's)
  /// is log2 sum 2^x (FlashInfer's) instead of ln sum e^x. The other ops keep 1 and false.
  std::int64_t splits = 1;
  bool lse_base2 = false;
  bool paged() const { return page_size > 0; }
  /// Entries per batch in page_table (0 when not paged).
  std::int64_t pages_per_seq() const { return paged() ? static_cast<std::int64_t>(page_table.size()) / batch : 0; }
  /// The pages seq_kv keys take: ceil(seq_kv / page_size).
  std::int64_t pages_needed() const { return paged() ? (seq_kv + page_size - 1) / page_size : 0; }
  std::int64_t eff_head_dim_v() const { return head_dim_v ? head_dim_v : head_dim; }
  /// The softmax scale: softmax_scale where given, else 1/sqrt(head_dim) (as a double).
  double scale() const { return softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim))); }
  std::int64_t eff_kv_heads() const { return kv_heads ? kv_heads : heads; }
  /// The K/V head query head h reads.
  std::int64_t kv_head(std::int64_t h) const { return h / (heads / eff_kv_heads()); }
  /// Query head h's sink logit; -inf where it has none.
  double sink(std::int64_t h) const { return sinks.empty() ? -INFINITY : sinks[static_cast<std::size_t>(h)]; }
  bool operator==(const AttentionShape&) const = default;
};

/// Attention variants beyond causal masking, padding and grouped heads, as bits: a kernel
/// declares those it applies (KernelTraits::attention_variants), a case uses some.
enum AttentionVariant : unsigned {
  kAttnWindow = 1u,   ///< AttentionShape::window_left / window_right
  kAttnSoftcap = 2u,  ///< AttentionShape::softcap
  kAttnAlibi = 4u,    ///< AttentionShape::alibi_slopes, alibi_form
  kAttnSinks = 8u,    ///< AttentionShape::sinks
  kAttnPaged = 16u,   ///< AttentionShape::page_size, num_pages, page_table
  kAttnKvScales = 32u,  ///< Case::scales of K and V: an FP8 K/V cache (docs/concepts/fp8-kv.md)
  kAttnKvHeadScales = 64u,  ///< Case::head_scales of K and V: the cache scaled per K/V head
};
inline constexpr unsigned kAllAttentionVariants =
    kAttnWindow | kAttnSoftcap | kAttnAlibi | kAttnSinks | kAttnPaged | kAttnKvScales | kAttnKvHeadScales;

/// Whether an operand of format f may carry a per-tensor scale in Case::scales: FP8 (E4M3,
/// E5M2) only, as cuBLASLt's A/B/C/D scale pointers. A, B, C: stored x scale = value;
/// D: stored = scale x result (after the epilogue). Attention forward: K and V likewise
/// (stored x scale = value, an FP8 K/V cache). validate() refuses any other scale.
constexpr bool takes_scale(Format f) { return f == Format::E4M3 || f == Format::E5M2; }

/// One reproducible run. Operand names: GEMM A, B, C, D, bias; attention Q, K, V, O and,
/// when the case asks for it (types["LSE"] = fp32), LSE: ln sum_j exp(scale q_i . k_j) over
/// the visible keys, -inf for a row that sees none. Attention backward: Q, K, V, dO (drawn),
/// O and LSE (the forward's, derived from them: derived_inputs), dQ, dK, dV (outputs; dK and
/// dV per K/V head, summed over the query heads that read it).
/// Attention combine: O_part and LSE_part (drawn), O and optionally LSE (outputs), shaped as
/// the forward's O and LSE with `splits` partial states, the split index outermost.
/// types also holds "compute" (the accumulation format).
struct Case {
  Op op = Op::Gemm;
  std::string kernel;  ///< kernel name, "" if not bound to one
  GemmShape gemm;
  AttentionShape attention;
  std::map<std::string, Format> types;
  double alpha = 1.0, beta = 0.0;
  Epilogue epilogue = Epilogue::None;
  std::map<std::string, double> scales;     ///< per-tensor scales of FP8 A, B, C, D (takes_scale)
  /// Attention forward: an FP8 K or V scaled per K/V head (one scale per K/V head, stored x
  /// scale[head] = value), instead of a per-tensor scale in `scales`.
  std::map<std::string, std::vector<double>> head_scales;
  std::map<std::string, std::string> dist;  ///< input operand -> distribution spec
  std::uint64_t seed = 0;
  /// Attention backward only: the forward kernel whose O and LSE the backward takes (a
  /// chained forward + backward check: the forward is judged by its own rule, then its
  /// outputs are the backward's inputs); "" takes the exact forward rounded once.
  std::string forward_kernel;
  bool operator==(const Case&) const = default;

  /// The input operands that get generated data (A, B[, C][, bias]; Q, K, V; Q, K, V, dO).
  std::vector<std::string> inputs() const;
  /// Inputs computed from the generated ones (attention backward: O and LSE, the forward's
  /// outputs; check/ops/attention_backward.hpp); empty for the other ops.
  std::vector<std::string> derived_inputs() const;
};

/// Where each element of a GEMM operand lives in its buffer (the memory contract above).
/// rows x cols is the matrix as stored: A is a_rows() x a_cols() (K x M when trans_a),
/// B likewise, C and D are M x N, bias is 1 x N and shared by all batches.
struct MatrixView {
  std::int64_t rows = 0, cols = 0, ld = 0, batch = 1;
  Layout layout = Layout::RowMajor;
  std::int64_t batch_stride() const { return (layout == Layout::RowMajor ? rows : cols) * ld; }
  /// Elements of the whole buffer, padding included.
  std::int64_t elements() const { return batch * batch_stride(); }
  std::int64_t offset(std::int64_t b, std::int64_t r, std::int64_t c) const {
    return b * batch_stride() + (layout == Layout::RowMajor ? r * ld + c : c * ld + r);
  }
  /// Whether buffer element e is padding (not inside any batch's rows x cols).
  bool is_padding(std::int64_t e) const {
    const std::int64_t in = e % batch_stride(), minor = in % ld;
    return minor >= (layout == Layout::RowMajor ? cols : rows);
  }
};
/// The view of GEMM operand "A", "B", "C", "D" or "bias"; throws InputError otherwise.
MatrixView gemm_view(const Case& c, std::string_view operand);
/// Offsets of op(A)[b][i][k] and op(B)[b][k][j]: the logical operands, transposes undone.
inline std::int64_t op_a_offset(const Case& c, const MatrixView& a, std::int64_t b, std::int64_t i,
                                std::int64_t k) {
  return c.gemm.trans_a ? a.offset(b, k, i) : a.offset(b, i, k);
}
inline std::int64_t op_b_offset(const Case& c, const MatrixView& bv, std::int64_t b, std::int64_t k,
                                std::int64_t j) {
  return c.gemm.trans_b ? bv.offset(b, j, k) : bv.offset(b, k, j);
}

/// Where element [batch][head][position][dim] of attention operand "Q", "K", "V" or "O"
/// (backward: "dQ", "dK", "dV", "dO" as Q, K, V, O) lives (packed; layout bhsd or bshd);
/// "LSE" is [batch][head][position] (dim 1, bhsd). attention_combine's "O_part" and
/// "LSE_part" are O and LSE with splits x batch batches: split s of batch b is batch
/// s * batch + b of the view. heads is the operand's own:
/// eff_kv_heads() for K and V, so their head index is AttentionShape::kv_head(h) of query
/// head h. K and V of a paged case live in its page pool (AttentionShape::page_size): the
/// view holds a copy of the page table and elements() is the whole pool.
struct AttentionView {
  std::int64_t batch = 1, heads = 1, seq = 1, dim = 1;
  AttentionLayout layout = AttentionLayout::BHSD;
  std::int64_t page_size = 0, pages_per_seq = 0, num_pages = 0;  ///< page_size 0: packed
  std::shared_ptr<const std::vector<std::int64_t>> page_table;
  bool paged() const { return page_size > 0; }
  std::int64_t elements() const { return (paged() ? num_pages * page_size : batch * seq) * heads * dim; }
  std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) const {
    if (paged()) {
      const std::int64_t page = (*page_table)[static_cast<std::size_t>(b * pages_per_seq + s / page_size)];
      const std::int64_t slot = s % page_size;
      return layout == AttentionLayout::BHSD ? ((page * heads + h) * page_size + slot) * dim + d
                                             : ((page * page_size + slot) * heads + h) * dim + d;
    }
    return layout == AttentionLayout::BHSD ? ((b * heads + h) * seq + s) * dim + d
                                           : ((b * seq + s) * heads + h) * dim + d;
  }
  /// Where slot `slot` of pool page `page` starts for head h (paged views only).
  std::int64_t pool_offset(std::int64_t page, std::int64_t h, std::int64_t slot, std::int64_t d) const {
    return layout == AttentionLayout::BHSD ? ((page * heads + h) * page_size + slot) * dim + d
                                           : ((page * page_size + slot) * heads + h) * dim + d;
  }
  /// offset() of every element in logical (b, h, s, d) order.
  std::vector<std::int64_t> logical_offsets() const;
};
/// The view of attention operand "Q", "K", "V", "O", "LSE", "dO", "dQ", "dK" or "dV"
/// (backward cases only for the last four), "O_part" or "LSE_part" (combine cases only);
/// throws InputError otherwise.
AttentionView attention_view(const Case& c, std::string_view operand);
/// Elements of an operand's buffer, padding included (gemm_view or attention_view by c.op).
std::int64_t operand_elements(const Case& c, std::string_view operand);
/// How many keys query i of batch b sees: attention_visible_keys(c, b, i).size().
std::int64_t attention_visible_count(const Case& c, std::int64_t b, std::int64_t i);
/// The keys query i of batch b sees: first <= j < end (first == end: none). The batch's key
/// length, the causal mask and the window each bound it; the range is contiguous.
struct KeyRange {
  std::int64_t first = 0, end = 0;
  std::int64_t size() const { return end - first; }
  bool contains(std::int64_t j) const { return j >= first && j < end; }
};
KeyRange attention_visible_keys(const Case& c, std::int64_t b, std::int64_t i);
/// The attention variants case c uses (0 for GEMM).
unsigned attention_variants(const Case& c);
/// Their names, comma-separated ("window").
std::string attention_variant_names(unsigned variants);
/// ALiBi's signed distance for query i and key j in a's form: -|i + seq_kv - seq_q - j|
/// (Flash) or j - i (FlashInfer); the bias is slope times it.
std::int64_t alibi_distance(const AttentionShape& a, std::int64_t i, std::int64_t j);
/// The standard ALiBi slopes for `heads` heads, rounded to FP32 as the libraries keep them:
/// with n the largest power of two <= heads, 2^(-8k/n) for k = 1..n, then for the heads
/// beyond n the odd entries 2^(-4k/n), k = 1, 3, 5, ... of the table for 2n heads.
std::vector<double> alibi_standard_slopes(std::int64_t heads);
/// Paged K/V: for each page of the pool, the slots [0, n) that hold keys (n = 0: a page no
/// row reads) and the table entry b * pages_per_seq() + column whose keys are written there
/// (the row reading the most slots of it, the first such): shared pages hold one batch's
/// keys and the other rows read them.
struct PageUse {
  std::vector<std::int64_t> slots, owner;
};
PageUse page_use(const AttentionShape& a);
/// An attention input's value is its stored value times this: K or V's scale of K/V head
/// kv_head (case.head_scales), else its tensor's scale (case.scales), else 1.
double input_scale(const Case& c, std::string_view operand, std::int64_t kv_head);
/// input_scale of K or V for each K/V head of attention case c, head 0 first.
std::vector<double> kv_head_scales(const Case& c, std::string_view operand);
/// Pages a's K/V (AttentionShape::page_size) for its batch and seq_kv: each row takes
/// ceil(seq_kv / page_size) pages of a pool in an order shuffled by `seed`, and one more page
/// no row reads. page_size 0 makes K/V contiguous again.
void page_kv(AttentionShape& a, std::int64_t page_size, std::uint64_t seed);
/// A contiguous twin of paged case c (K and V packed as the layout says, the rest equal);
/// c itself when it is not paged.
Case unpaged(const Case& c);

/// Whether key j is visible to query i in batch b.
bool attention_visible(const Case& c, std::int64_t b, std::int64_t i, std::int64_t j);

/// A window given in another library's convention, as (window_left, window_right) of ours:
///   flash:L,R         FlashAttention's (left, right), -1 unbounded: itself
///   hf:W              Hugging Face sliding_window = W keys, self included (causal): (W - 1, 0)
///   flashinfer:L      FlashInfer window_left = L (keys left of the diagonal): (L, -1)
///   cudnn:B[,R]       cuDNN diagonal_band_left_bound = B (key j kept iff j > i' - B, i' the
///                     bottom-right aligned row), diagonal_band_right_bound = R (j <= i' + R;
///                     absent: unbounded): (B - 1, R)
/// Throws InputError naming the spec for anything else.
std::pair<std::int64_t, std::int64_t> window_from_convention(const std::string& spec);

/// The served variants as written on a command line (bench, sweep); "" leaves one out.
///   window   in any convention window_from_convention reads
///   softcap  "30": the cap, a positive number, rounded to FP32 as kernels keep it
///   alibi    "flash" or "flashinfer" (the form), the standard slopes for the case's heads;
///            "FORM:S" one slope for every head; "FORM:S1,S2,..." one per head (FP32-rounded)
///   sinks    "S" for every head or "S1,S2,..." one per head; "-inf" is no sink (FP32-rounded)
///   pages    "P": paged K/V, pages of P keys (page_kv, seed 0)
struct ServedVariantSpecs {
  std::string window, softcap, alibi, sinks, pages;
  bool any() const { return !window.empty() || !softcap.empty() || !alibi.empty() || !sinks.empty() || !pages.empty(); }
};
/// An FP8 K/V cache as written on a command line (--kv-cache, docs/concepts/fp8-kv.md): "e4m3"
/// or "e5m2", optionally ":FRAC" in (0, 1] (default 1), then ":head" for a scale per K/V head.
/// K and V of attention forward case c take the format, and their distributions (normal(0,1)
/// where c has none) are wrapped in amax(frac=FRAC[,per_head=1,spread=4], ...), which writes their
/// scales when the inputs are filled; K keeps its
/// (absent) distribution where k_drawn_with_q (Q's family draws it: logits, sink, masked).
/// Throws InputError naming the flag for anything else.
void apply_kv_cache(Case& c, const std::string& spec, bool k_drawn_with_q = false);

/// Sets a's window, soft cap, ALiBi and sinks from specs (a.heads must be set: slopes and sinks are
/// per query head). Throws InputError naming the flag and the spec for anything malformed.
void apply_served_variants(AttentionShape& a, const ServedVariantSpecs& specs);

inline constexpr int kCaseSchemaVersion = 1;

/// The largest size (M, N, K, batch, leading dimension, attention extent) a case may have:
/// what the libraries' 32-bit interfaces take.
inline constexpr std::int64_t kMaxCaseSize = (std::int64_t{1} << 31) - 1;
/// The most elements one operand's buffer may hold, padding included (2^40): offsets and
/// byte counts stay exact in 64 bits. What fits in memory is the runner's check.
inline constexpr std::int64_t kMaxBufferElements = std::int64_t{1} << 40;

/// The case's extents: GEMM "16x24x40 (M x N x K)", "2 x 16x24x40 (batch x M x N x K)"
/// when batched (without the order in parentheses unless with_order); attention "B2 H8 Sq4
/// Skv8 D64", H as "H8/2" with 2 K/V heads, D as "D64/32" with head_dim_v 32, and
/// " window(L,R)" after it for a sliding window.
std::string shape_text(const Case& c, bool with_order = true);

/// Serialises a case. Every field is written, defaults included.
nlohmann::json to_json(const Case& c);
/// Parses and validates; throws InputError naming the offending field
/// (e.g. "case.gemm.lda: must be 0 (packed) or >= 64, got 10").
Case case_from_json(const nlohmann::json& j);
/// Checks a case's consistency (shapes, leading dimensions, operands, scales: positive and
/// on FP8 operands only) and its caps (kMaxCaseSize, kMaxBufferElements); throws
/// InputError. case_from_json calls it.
void validate(const Case& c);

Case read_case_file(const std::string& path);
/// Writes atomically (temporary file + rename).
void write_case_file(const std::string& path, const Case& c);

}  // namespace ulpgate
