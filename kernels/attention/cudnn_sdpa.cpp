// cudnn.sdpa.fp16 / cudnn.sdpa.bf16: cuDNN's fused scaled-dot-product attention through its
// backend graph API (docs/design/cudnn_sdpa.md). The graph is the one cuDNN's
// runtime-fused flash-attention engine recognises on 9.19, built from primitive operations:
//   S = Q K^T (float) -> S * scale -> [padding mask from kv_lengths] -> [causal mask]
//   -> max, subtract, exp, sum, [log, add: the statistics] divide -> P -> O = P V.
// The first engine configuration of heuristics mode A that finalizes is used; its global
// index and the cuDNN version go into every result's notes. Plans are cached per shape
// and thread (building one takes a fraction of a second).
#include "kernels/attention/cudnn_sdpa.hpp"

#include <cudnn.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "kernels/cuda_check.hpp"
#include "kernels/device.hpp"

namespace ulpgate {
namespace {

void check_cudnn(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) throw KernelError(fmt::format("cuDNN {}: {}", what, cudnnGetErrorString(s)));
}

// A backend descriptor, destroyed with its owner.
struct Desc {
  cudnnBackendDescriptor_t d = nullptr;
  explicit Desc(cudnnBackendDescriptorType_t type) { check_cudnn(cudnnBackendCreateDescriptor(type, &d), "create descriptor"); }
  ~Desc() {
    if (d) cudnnBackendDestroyDescriptor(d);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  template <class T>
  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const T* values, std::int64_t n = 1) {
    check_cudnn(cudnnBackendSetAttribute(d, name, type, n, values), "set attribute");
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& other) {
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &other.d);
  }
  void finalize(const char* what) { check_cudnn(cudnnBackendFinalize(d), what); }
};

// The graph's tensors and operations, kept alive as long as the plan.
struct Graph {
  std::vector<std::unique_ptr<Desc>> keep;
  std::int64_t next_uid = 1;
  Desc& add(cudnnBackendDescriptorType_t type) {
    keep.push_back(std::make_unique<Desc>(type));
    return *keep.back();
  }
  // A 4-D tensor {dims} with strides; virtual (intermediate) or by value (a host scalar).
  Desc& tensor(cudnnDataType_t type, std::array<std::int64_t, 4> dims, std::array<std::int64_t, 4> strides, bool is_virtual,
               bool by_value, std::int64_t* uid_out = nullptr) {
    Desc& t = add(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const std::int64_t uid = next_uid++, align = 16;
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &type);
    t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims.data(), 4);
    t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides.data(), 4);
    t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid);
    t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &align);
    if (is_virtual) {
      const bool v = true;
      t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &v);
    }
    if (by_value) {
      const bool v = true;
      t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &v);
    }
    t.finalize("tensor");
    if (uid_out) *uid_out = uid;
    return t;
  }
  // y = mode(x[, b][, t]) elementwise; math precision `prec`; axis for GEN_INDEX.
  Desc& pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec, const Desc& x, const Desc* b, const Desc& y,
                  const Desc* t = nullptr, std::int64_t axis = -1) {
    Desc& pw = add(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode);
    pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &prec);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    pw.finalize("pointwise descriptor");
    Desc& op = add(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    op.finalize("pointwise operation");
    ops.push_back(&op);
    return op;
  }
  Desc& matmul(const Desc& a, const Desc& b, const Desc& c, const Desc* m_override = nullptr, const Desc* n_override = nullptr,
               const Desc* k_override = nullptr) {
    Desc& mm = add(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f);
    mm.finalize("matmul descriptor");
    Desc& op = add(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    if (m_override) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, *m_override);
    if (n_override) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, *n_override);
    if (k_override) op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, *k_override);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    op.finalize("matmul operation");
    ops.push_back(&op);
    return op;
  }
  Desc& reduce(cudnnReduceTensorOp_t how, const Desc& x, const Desc& y) {
    Desc& r = add(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    r.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f);
    r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &how);
    r.finalize("reduction descriptor");
    Desc& op = add(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    op.finalize("reduction operation");
    ops.push_back(&op);
    return op;
  }
  std::vector<Desc*> ops;
};

// One shape's plan: the graph, the plan, the variant pack's ids in a fixed order (Q, K, V, O,
// scale[, -inf: masks only][, seq_len_q, seq_len_kv][, stats]), the workspace size and the
// engine chosen.
struct Plan {
  Graph g;
  std::unique_ptr<Desc> plan;
  std::vector<std::int64_t> uids;
  std::int64_t workspace = 0;
  std::string engine;
};

// Whether the graph masks scores (padding or causal), and so takes the -inf scalar.
bool masked(const attn::SdpaShape& s) { return s.padded || s.causal; }

using Key = std::tuple<bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, bool, bool, bool>;

// The scores' tensors of one graph: every intermediate of the softmax has their shape.
using ScoresOf = std::function<const Desc&(cudnnDataType_t)>;

// Rows < seq_len_q and columns < seq_len_kv kept, the rest -inf.
const Desc& mask_padding(Graph& g, const ScoresOf& scores, const Desc& cur, const Desc& lq, const Desc& lkv,
                         const Desc& neg_inf) {
  const Desc& row = scores(CUDNN_DATA_INT32);
  const Desc& col = scores(CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, cur, nullptr, row, nullptr, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, cur, nullptr, col, nullptr, 3);
  const Desc& row_in = scores(CUDNN_DATA_BOOLEAN);
  const Desc& col_in = scores(CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, row, &lq, row_in);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, col, &lkv, col_in);
  const Desc& keep = scores(CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, row_in, &col_in, keep);
  const Desc& next = scores(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, cur, &neg_inf, next, &keep);
  return next;
}

// Top-left aligned (seq_q == seq_kv here): column <= row kept, the rest -inf.
const Desc& mask_causal(Graph& g, const ScoresOf& scores, const Desc& cur, const Desc& neg_inf) {
  const Desc& row = scores(CUDNN_DATA_INT32);
  const Desc& col = scores(CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, cur, nullptr, row, nullptr, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, cur, nullptr, col, nullptr, 3);
  const Desc& keep = scores(CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, &col, keep);
  const Desc& next = scores(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, cur, &neg_inf, next, &keep);
  return next;
}

// The operation graph of p.g finalized, and the first engine configuration of heuristics A
// that finalizes into an execution plan (p.plan, p.engine, p.workspace).
void choose_engine(cudnnHandle_t handle, Plan& p) {
  Graph& g = p.g;
  Desc& graph = g.add(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> ops;
  for (Desc* op : g.ops) ops.push_back(op->d);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops.data(), static_cast<std::int64_t>(ops.size()));
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle);
  graph.finalize("operation graph");
  Desc& heur = g.add(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
  heur.finalize("heuristics");
  std::int64_t count = 0;
  check_cudnn(cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
              "heuristics count");
  if (count == 0) throw KernelUnsupported("cuDNN: no engine configuration for this attention graph");
  std::vector<std::unique_ptr<Desc>> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    cfgs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(cfgs.back()->d);
  }
  check_cudnn(cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, raw.data()),
              "heuristics results");
  std::string tried;
  for (std::int64_t i = 0; i < count && !p.plan; ++i) {
    auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle);
    plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw[static_cast<std::size_t>(i)]);
    const cudnnStatus_t st = cudnnBackendFinalize(plan->d);
    if (st != CUDNN_STATUS_SUCCESS) {
      tried += fmt::format("{}config {}: {}", tried.empty() ? "" : "; ", i, cudnnGetErrorString(st));
      continue;
    }
    // The engine's global index, for the record.
    cudnnBackendDescriptor_t engine = nullptr;
    Desc engine_desc(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    engine = engine_desc.d;
    std::int64_t n = 0, index = -1;
    if (cudnnBackendGetAttribute(raw[static_cast<std::size_t>(i)], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                 &engine) == CUDNN_STATUS_SUCCESS)
      cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
    p.engine = fmt::format("engine {} (heuristics A, config {} of {})", index, i, count);
    check_cudnn(cudnnBackendGetAttribute(plan->d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &p.workspace),
                "workspace size");
    p.plan = std::move(plan);
  }
  if (!p.plan) throw KernelUnsupported("cuDNN: no engine configuration finalized (" + tried + ")");
  for (auto& c : cfgs) g.keep.push_back(std::move(c));
}

std::unique_ptr<Plan> build_plan(cudnnHandle_t handle, const attn::SdpaShape& s) {
  auto p = std::make_unique<Plan>();
  Graph& g = p->g;
  const cudnnDataType_t io = s.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF, f = CUDNN_DATA_FLOAT;
  const std::int64_t b = s.batch, hq = s.heads, hk = s.kv_heads, sq = s.seq_q, skv = s.seq_kv, d = s.head_dim;
  // Logical {b, h, s, d}; BSHD stores [b, s, h, d].
  const auto strides = [&](std::int64_t h, std::int64_t seq) {
    return s.bshd ? std::array<std::int64_t, 4>{seq * h * d, d, h * d, 1} : std::array<std::int64_t, 4>{h * seq * d, seq * d, d, 1};
  };
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

struct ThreadState {
  cudnnHandle_t handle = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans;
  ~ThreadState() {
    plans.clear();
    if (handle) cudnnDestroy(handle);
  }
};

}  // namespace

namespace attn {

std::string cudnn_version() {
  const std::size_t v = cudnnGetVersion();
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

std::string cudnn_sdpa(const SdpaShape& s, const void* q, const void* k, const void* v, void* o, float* lse,
                       const int* seq_q, const int* seq_kv, void* stream) {
  thread_local ThreadState state;
  if (!state.handle) check_cudnn(cudnnCreate(&state.handle), "create handle");
  check_cudnn(cudnnSetStream(state.handle, static_cast<cudaStream_t>(stream)), "set stream");
  const Key key{s.bf16, s.batch, s.heads, s.kv_heads, s.seq_q, s.seq_kv, s.head_dim, s.causal, s.padded, s.bshd, s.stats};
  auto& plan = state.plans[key];
  if (!plan) plan = build_plan(state.handle, s);
  float scale = s.scale, neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<void*> ptrs{const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), o, &scale};
  if (masked(s)) ptrs.push_back(&neg_inf);
  if (s.padded) ptrs.insert(ptrs.end(), {const_cast<int*>(seq_q), const_cast<int*>(seq_kv)});
  if (s.stats) ptrs.push_back(lse);
  DeviceBuffer workspace(static_cast<std::size_t>(plan->workspace), stream);
  void* ws = workspace.get();
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, plan->uids.data(), static_cast<std::int64_t>(plan->uids.size()));
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(), static_cast<std::int64_t>(ptrs.size()));
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &ws);
  pack.finalize("variant pack");
  check_cudnn(cudnnBackendExecute(state.handle, plan->plan->d, pack.d), "execute");
  device_synchronize(stream);  // the workspace and the by-value scalars die on return
  return plan->engine;
}

}  // namespace attn
}  // namespace ulpgate
