// cudnn.sdpa.fp16 / cudnn.sdpa.bf16: cuDNN's fused scaled-dot-product attention through its
// backend graph API (docs/design/cudnn_sdpa.md). The graph is the one cuDNN's
// runtime-fused flash-attention engine recognises on 9.19, built from primitive operations:
//   S = Q K^T (float) -> S * scale -> [padding mask from kv_lengths] -> [causal mask]
//   -> max, subtract, exp, sum, [log, add: the statistics] divide -> P -> O = P V.
// The first engine configuration of heuristics mode A that finalizes is used; its global
// index and the cuDNN version go into every result's notes. Plans are cached per shape
// and thread (building one takes a fraction of a second).
#include "kernels/attention/cudnn_sdpa.hpp"

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "kernels/attention/cudnn_graph.hpp"

namespace ulpgate {
namespace {

using namespace attn::cudnn;

// Whether the graph masks scores (padding or causal), and so takes the -inf scalar.
bool masked(const attn::SdpaShape& s) { return s.padded || s.causal; }

using Key = std::tuple<bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, bool, bool, bool>;

std::unique_ptr<Plan> build_plan(cudnnHandle_t handle, const attn::SdpaShape& s) {
  auto p = std::make_unique<Plan>();
  Graph& g = p->g;
  const cudnnDataType_t io = s.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF, f = CUDNN_DATA_FLOAT;
  const std::int64_t b = s.batch, hq = s.heads, hk = s.kv_heads, sq = s.seq_q, skv = s.seq_kv, d = s.head_dim;
  const auto strides = [&](std::int64_t h, std::int64_t seq) { return bhsd_strides(s.bshd, h, seq, d); };
  std::int64_t uq, uk, uv, uo, uscale, uinf = 0, ulq = 0, ulkv = 0, ustats = 0;
  const Desc& q = g.tensor(io, {b, hq, sq, d}, strides(hq, sq), false, false, &uq);
  const auto ks = strides(hk, skv);
  const Desc& kt = g.tensor(io, {b, hk, d, skv}, {ks[0], ks[1], ks[3], ks[2]}, false, false, &uk);  // K^T: no copy
  const Desc& v = g.tensor(io, {b, hk, skv, d}, ks, false, false, &uv);
  const Desc& o = g.tensor(io, {b, hq, sq, d}, strides(hq, sq), false, false, &uo);
  const Desc& scale = g.tensor(f, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true, &uscale);
  // -inf for the masks, only where a mask uses it: a variant pack naming a tensor the graph
  // does not use is refused at execution (CUDNN_STATUS_BAD_PARAM_NULL_POINTER on the H200).
  const Desc* neg_inf = masked(s) ? &g.tensor(f, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true, &uinf) : nullptr;
  const std::array<std::int64_t, 4> sdims{b, hq, sq, skv}, sstr{hq * sq * skv, sq * skv, skv, 1};
  const std::array<std::int64_t, 4> rdims{b, hq, sq, 1}, rstr{hq * sq, sq, 1, 1};
  const ScoresOf scores = [&](cudnnDataType_t t) -> const Desc& { return g.tensor(t, sdims, sstr, true, false); };
  const Desc* lq = nullptr;
  const Desc* lkv = nullptr;
  if (s.padded) {
    lq = &g.tensor(CUDNN_DATA_INT32, {b, 1, 1, 1}, {1, 1, 1, 1}, false, false, &ulq);
    lkv = &g.tensor(CUDNN_DATA_INT32, {b, 1, 1, 1}, {1, 1, 1, 1}, false, false, &ulkv);
  }
  const Desc& s0 = scores(CUDNN_DATA_FLOAT);
  g.matmul(q, kt, s0, lq, lkv);
  const Desc* cur = &scores(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, f, s0, &scale, *cur);
  if (s.padded) cur = &mask_padding(g, scores, *cur, *lq, *lkv, *neg_inf);
  if (s.causal) cur = &mask_causal(g, scores, *cur, *neg_inf);
  const Desc& m = g.tensor(f, rdims, rstr, true, false);
  g.reduce(CUDNN_REDUCE_TENSOR_MAX, *cur, m);
  const Desc& z = scores(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_SUB, f, *cur, &m, z);
  const Desc& e = scores(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_EXP, f, z, nullptr, e);
  const Desc& l = g.tensor(f, rdims, rstr, true, false);
  g.reduce(CUDNN_REDUCE_TENSOR_ADD, e, l);
  // The softmax statistics (log-sum-exp, max + log(sum)) as cuDNN's frontend always builds them:
  // an output where the case asks for the LSE, else virtual (the fused engine's pattern has
  // them even when nothing reads them).
  const Desc& log_l = g.tensor(f, rdims, rstr, true, false);
  g.pointwise(CUDNN_POINTWISE_LOG, f, l, nullptr, log_l);
  const Desc& stats = g.tensor(f, rdims, rstr, !s.stats, false, s.stats ? &ustats : nullptr);
  g.pointwise(CUDNN_POINTWISE_ADD, f, m, &log_l, stats);
  // P in the input type, as the second matmul takes it: the engines refuse a float P ("A and B
  // need to have the same datatype in the matmul", cuDNN 9.19's log on the H200).
  const Desc& prob = scores(io);
  g.pointwise(CUDNN_POINTWISE_DIV, f, e, &l, prob);
  g.matmul(prob, v, o, lq, nullptr, lkv);

  choose_engine(handle, *p);
  p->uids = {uq, uk, uv, uo, uscale};
  if (neg_inf) p->uids.push_back(uinf);
  if (s.padded) p->uids.insert(p->uids.end(), {ulq, ulkv});
  if (s.stats) p->uids.push_back(ustats);
  return p;
}

}  // namespace

namespace attn {

std::string cudnn_version() {
  const std::size_t v = cudnnGetVersion();
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

std::string cudnn_sdpa(const SdpaShape& s, const void* q, const void* k, const void* v, void* o, float* lse,
                       const int* seq_q, const int* seq_kv, void* stream) {
  thread_local attn::cudnn::ThreadPlans<Key> state;
  const cudnnHandle_t handle = state.on(stream);
  const Key key{s.bf16, s.batch, s.heads, s.kv_heads, s.seq_q, s.seq_kv, s.head_dim, s.causal, s.padded, s.bshd, s.stats};
  auto& plan = state.plans[key];
  if (!plan) plan = build_plan(handle, s);
  float scale = s.scale, neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<void*> ptrs{const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), o, &scale};
  if (masked(s)) ptrs.push_back(&neg_inf);
  if (s.padded) ptrs.insert(ptrs.end(), {const_cast<int*>(seq_q), const_cast<int*>(seq_kv)});
  if (s.stats) ptrs.push_back(lse);
  execute(handle, *plan, std::move(ptrs), stream);  // returns once done: scale and neg_inf die here
  return plan->engine;
}

}  // namespace attn
}  // namespace ulpgate
