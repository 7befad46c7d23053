// cudnn.sdpa_bwd.*: cuDNN's fused flash-attention backward through the backend graph API
// (docs/design/cudnn_sdpa.md, "The backward graph"). The graph is the one the cuDNN frontend's
// SDPA backward node composes from primitive operations for cuDNN 9.19 (CompositeSDPABackward-
// Node::expand_node, no dropout, bias or score modifier), tensor for tensor and in its order,
// because the runtime-fused engine matches that pattern strictly:
//   D = rowsum(dO o O) x 1 (FP32, a device tensor); S = Q K^T x scale, [padding mask],
//   - stats, [causal mask], P = exp(.); dV = P^T dO (P in the I/O type); dP = dO V^T;
//   dS = (dP - D) o P x scale; dK = dS^T Q (dS in the I/O type); dQ = dS K into an FP32
//   accumulator, then dQ = identity(accumulator) -- or, deterministic, dQ = dS K directly.
// With grouped heads dK and dV are per query head (I/O type) summed by a reduction.
#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention/cudnn_graph.hpp"
#include "kernels/attention/cudnn_sdpa.hpp"
#include "kernels/cuda_check.hpp"

namespace ulpgate {
namespace {

using namespace attn::cudnn;

using Key = std::tuple<bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, bool, bool, bool>;

Key key_of(const attn::SdpaBackwardShape& s) {
  return {s.bf16, s.batch, s.heads, s.kv_heads, s.seq_q, s.seq_kv, s.head_dim, s.causal, s.padded, s.bshd, s.deterministic};
}

// Bottom-right causal needs the diagonal's shift where seq_q < seq_kv; at seq_q == seq_kv it is
// the top-left mask, the forward's. The shift is the case's seq_kv - seq_q as INT32 scalars,
// padded or not: the frontend, padded, shifts by each batch's lengths instead.
bool shifted_diagonal(const attn::SdpaBackwardShape& s) { return s.causal && s.seq_q != s.seq_kv; }

// The plan's uids, in this order: Q, K, V, O, dO, stats, dQ, dK, dV, scale, D (softmax_sum),
// [dQ accumulator], [seq_len_q, seq_len_kv]; the masks' -inf, the 1 and the diagonal's shift
// are the graph's constants.
std::unique_ptr<Plan> build_plan(cudnnHandle_t handle, const attn::SdpaBackwardShape& s) {
  auto p = std::make_unique<Plan>();
  Graph& g = p->g;
  const cudnnDataType_t io = s.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF, f = CUDNN_DATA_FLOAT;
  const std::int64_t b = s.batch, hq = s.heads, hk = s.kv_heads, sq = s.seq_q, skv = s.seq_kv, d = s.head_dim;
  const auto strides = [&](std::int64_t h, std::int64_t seq) { return bhsd_strides(s.bshd, h, seq, d); };
  const auto qs = strides(hq, sq), ks = strides(hk, skv);
  const std::array<std::int64_t, 4> kts{ks[0], ks[1], ks[3], ks[2]};  // K^T, V^T: K, V with the last two swapped, no copy
  const std::array<std::int64_t, 4> sdims{b, hq, sq, skv}, sstr{hq * sq * skv, sq * skv, skv, 1};
  const std::array<std::int64_t, 4> tdims{b, hq, skv, sq}, tstr{hq * sq * skv, sq * skv, 1, skv};  // S^T views
  const std::array<std::int64_t, 4> rdims{b, hq, sq, 1}, rstr{hq * sq, sq, 1, 1};
  std::int64_t uq, uk, uv, uo, udo, ustats, udq, udk, udv, uscale, usum, uacc = 0, ulq = 0, ulkv = 0;
  const Desc& q = g.tensor(io, {b, hq, sq, d}, qs, false, false, &uq);
  const Desc& kt = g.tensor(io, {b, hk, d, skv}, kts, false, false, &uk);
  const Desc& vt = g.tensor(io, {b, hk, d, skv}, kts, false, false, &uv);
  const Desc& o = g.tensor(io, {b, hq, sq, d}, qs, false, false, &uo);
  const Desc& dout = g.tensor(io, {b, hq, sq, d}, qs, false, false, &udo);
  const Desc& stats = g.tensor(f, rdims, rstr, false, false, &ustats);
  const Desc& dq = g.tensor(io, {b, hq, sq, d}, qs, false, false, &udq);
  const Desc& dk = g.tensor(io, {b, hk, skv, d}, ks, false, false, &udk);
  const Desc& dv = g.tensor(io, {b, hk, skv, d}, ks, false, false, &udv);
  const Desc& scale = g.tensor(f, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true, &uscale);
  const Desc* lq = nullptr;
  const Desc* lkv = nullptr;
  if (s.padded) {
    lq = &g.tensor(CUDNN_DATA_INT32, {b, 1, 1, 1}, {1, 1, 1, 1}, false, false, &ulq);
    lkv = &g.tensor(CUDNN_DATA_INT32, {b, 1, 1, 1}, {1, 1, 1, 1}, false, false, &ulkv);
  }
  const ScoresOf scores = [&](cudnnDataType_t t) -> const Desc& { return g.tensor(t, sdims, sstr, true, false); };
  const bool not_deterministic = false;  // the frontend sets the reductions' attribute, to false

  // D = rowsum(dO o O), times the frontend's 1 (its dropout's inverse scale), into a device
  // tensor of its own. The product's strides are the frontend's, as written.
  const Desc& do_o = g.tensor(f, {b, hq, sq, d}, {hq * sq * d, sq * d, hq * d, 1}, true, false);
  g.pointwise(CUDNN_POINTWISE_MUL, f, dout, &o, do_o);
  const Desc& do_o_sum = g.tensor(f, rdims, rstr, true, false);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, do_o, do_o_sum, &not_deterministic);
  const Desc& softmax_sum = g.tensor(f, rdims, rstr, false, false, &usum);
  g.pointwise(CUDNN_POINTWISE_MUL, f, do_o_sum, &g.constant(1.0f), softmax_sum);

  // P = exp(S scale [masked] - stats), S = Q K^T; the padding mask before the stats, the
  // causal one after them, as the frontend places them.
  const Desc& s0 = scores(f);
  g.matmul(q, kt, s0, lq, lkv);
  const Desc* cur = &scores(f);
  g.pointwise(CUDNN_POINTWISE_MUL, f, s0, &scale, *cur);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (s.padded) cur = &mask_padding(g, scores, *cur, *lq, *lkv, g.constant(neg_inf));
  const Desc& centred = scores(f);
  g.pointwise(CUDNN_POINTWISE_SUB, f, *cur, &stats, centred);
  cur = &centred;
  if (s.causal) {
    const Desc& inf = g.constant(neg_inf);
    const Desc* shift_kv = shifted_diagonal(s) ? &g.constant(static_cast<std::int32_t>(skv)) : nullptr;
    const Desc* shift_q = shifted_diagonal(s) ? &g.constant(static_cast<std::int32_t>(sq)) : nullptr;
    cur = &mask_causal(g, scores, *cur, inf, f, shift_kv, shift_q);
  }
  const Desc& prob = scores(f);
  g.pointwise(CUDNN_POINTWISE_EXP, f, *cur, nullptr, prob);

  // dV = P^T dO, P^T a view of P in the I/O type; per query head and summed with groups.
  const Desc& pt = g.tensor(io, tdims, tstr, true, false);
  g.reshape(prob, pt);
  const auto per_query_head = [&](const Desc& a, const Desc& bm, const Desc& out) {
    if (hq == hk) {
      g.matmul(a, bm, out, lkv, nullptr, lq);
      return;
    }
    const Desc& full = g.tensor(io, {b, hq, skv, d}, {hq * skv * d, skv * d, d, 1}, true, false);
    g.matmul(a, bm, full, lkv, nullptr, lq);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, full, out, &not_deterministic);
  };
  per_query_head(pt, dout, dv);

  // dS = (dO V^T - D) o P x scale.
  const Desc& dp = scores(f);
  g.matmul(dout, vt, dp, lq, lkv);
  const Desc& dp_d = scores(f);
  g.pointwise(CUDNN_POINTWISE_SUB, f, dp, &softmax_sum, dp_d);
  const Desc& dp_d_p = scores(f);
  g.pointwise(CUDNN_POINTWISE_MUL, f, dp_d, &prob, dp_d_p);
  const Desc& ds = scores(f);
  g.pointwise(CUDNN_POINTWISE_MUL, f, dp_d_p, &scale, ds);

  // dK = dS^T Q, dS^T a view of dS in the I/O type.
  const Desc& dst = g.tensor(io, tdims, tstr, true, false);
  g.reshape(ds, dst);
  per_query_head(dst, q, dk);

  // dQ = dS K, K a view of K^T (typed FP32, as the frontend's virtual tensors are by default):
  // into the FP32 accumulator, or straight into dQ.
  const Desc& kk = g.tensor(f, {b, hk, skv, d}, ks, true, false);
  g.reshape(kt, kk);
  if (s.deterministic) {
    g.matmul(ds, kk, dq, lq, nullptr, lkv);
  } else {
    const Desc& acc = g.tensor(f, {b, hq, sq, d}, {hq * sq * d, sq * d, d, 1}, false, false, &uacc);
    g.matmul(ds, kk, acc, lq, nullptr, lkv);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, f, acc, nullptr, dq);
  }

  choose_engine(handle, *p);
  p->uids = {uq, uk, uv, uo, udo, ustats, udq, udk, udv, uscale, usum};
  if (!s.deterministic) p->uids.push_back(uacc);
  if (s.padded) p->uids.insert(p->uids.end(), {ulq, ulkv});
  return p;
}

}  // namespace

namespace attn {

std::string cudnn_sdpa_backward(const SdpaBackwardShape& s, const void* q, const void* k, const void* v, const void* o,
                                const void* dout, const float* lse, void* dq, void* dk, void* dv, const int* seq_q,
                                const int* seq_kv, void* stream) {
  thread_local ThreadPlans<Key> state;
  const cudnnHandle_t handle = state.on(stream);
  auto& plan = state.plans[key_of(s)];
  if (!plan) plan = build_plan(handle, s);
  // The frontend's own workspace: D, and the dQ accumulator (cleared here; cuDNN 9.6 and
  // later clear it themselves).
  const std::size_t rows = static_cast<std::size_t>(s.batch * s.heads * s.seq_q);
  DeviceBuffer softmax_sum(rows * sizeof(float), stream), acc;
  float scale = s.scale;
  std::vector<void*> ptrs{const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), const_cast<void*>(o),
                          const_cast<void*>(dout), const_cast<float*>(lse), dq, dk, dv, &scale, softmax_sum.get()};
  if (!s.deterministic) {
    acc = DeviceBuffer(rows * static_cast<std::size_t>(s.head_dim) * sizeof(float), stream);
    ULPGATE_CHECK(cudaMemsetAsync(acc.get(), 0, acc.size(), static_cast<cudaStream_t>(stream)));
    ptrs.push_back(acc.get());
  }
  if (s.padded) ptrs.insert(ptrs.end(), {const_cast<int*>(seq_q), const_cast<int*>(seq_kv)});
  execute(handle, *plan, std::move(ptrs), stream);  // returns once done: the buffers and scale die here
  return plan->engine;
}

}  // namespace attn
}  // namespace ulpgate
