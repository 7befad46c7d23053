// cuDNN's backend graph API in small RAII pieces: descriptors, a graph that keeps its tensors
// and operations alive, the attention masks, the engine choice, execution and a per-thread
// plan cache. Shared by the fused attention forward (cudnn_sdpa.cpp) and backward
// (cudnn_sdpa_backward.cpp); only files built with cuDNN include it.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/device.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate::attn::cudnn {

inline void check_cudnn(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) throw KernelError(fmt::format("cuDNN {}: {}", what, cudnnGetErrorString(s)));
}

/// A backend descriptor, destroyed with its owner.
// The strides of a logical {b, h, seq, d} tensor: BSHD stores [b, seq, h, d], BHSD
// [b, h, seq, d].
inline std::array<std::int64_t, 4> bhsd_strides(bool bshd, std::int64_t h, std::int64_t seq, std::int64_t d) {
  return bshd ? std::array<std::int64_t, 4>{seq * h * d, d, h * d, 1} : std::array<std::int64_t, 4>{h * seq * d, seq * d, d, 1};
}

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

/// The graph's tensors and operations (in the order added), kept alive as long as the plan.
struct Graph {
  /// A by-value scalar that is the same on every run (a mask's -inf, the frontend's 1):
  /// its uid and its 4 bytes, handed to the variant pack by execute().
  struct Constant {
    std::int64_t uid;
    std::int32_t bits;
  };
  std::vector<std::unique_ptr<Desc>> keep;
  std::vector<Desc*> ops;
  std::vector<Constant> constants;
  std::int64_t next_uid = 1;

  Desc& add(cudnnBackendDescriptorType_t type) {
    keep.push_back(std::make_unique<Desc>(type));
    return *keep.back();
  }
  /// A 4-D tensor {dims} with strides; virtual (intermediate) or by value (a host scalar).
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
  /// A by-value FP32 or INT32 scalar {1, 1, 1, 1} of a fixed value (Graph::constants).
  const Desc& constant(float value) {
    std::int64_t uid = 0;
    const Desc& t = tensor(CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true, &uid);
    std::int32_t bits = 0;
    std::memcpy(&bits, &value, sizeof bits);
    constants.push_back({uid, bits});
    return t;
  }
  const Desc& constant(std::int32_t value) {
    std::int64_t uid = 0;
    const Desc& t = tensor(CUDNN_DATA_INT32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true, &uid);
    constants.push_back({uid, value});
    return t;
  }
  /// y = mode(x[, b][, t]) elementwise; math precision `prec`; axis for GEN_INDEX.
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
  /// c = a b (FP32 compute); the overrides: per-batch M, N, K (int32 {b, 1, 1, 1} tensors).
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
  /// y = reduce(x) over the dimensions where y has extent 1 (FP32 compute); `deterministic`
  /// given: the descriptor's IS_DETERMINISTIC attribute set to it (as the frontend does).
  Desc& reduce(cudnnReduceTensorOp_t how, const Desc& x, const Desc& y, const bool* deterministic = nullptr) {
    Desc& r = add(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    r.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f);
    r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &how);
    if (deterministic) r.set(CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, deterministic);
    r.finalize("reduction descriptor");
    Desc& op = add(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    op.finalize("reduction operation");
    ops.push_back(&op);
    return op;
  }
  /// y = x seen with y's dimensions, strides and data type (a transpose, or P in the input type).
  Desc& reshape(const Desc& x, const Desc& y) {
    Desc& op = add(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op.finalize("reshape operation");
    ops.push_back(&op);
    return op;
  }
};

/// One shape's plan: the graph, the execution plan, the uids of the variant pack's device
/// tensors and per-run scalars in the order execute() is given their pointers, the
/// workspace size and the engine chosen.
struct Plan {
  Graph g;
  std::unique_ptr<Desc> plan;
  std::vector<std::int64_t> uids;
  std::int64_t workspace = 0;
  std::string engine;
};

/// The scores' tensors of one graph: every intermediate of the softmax has their shape.
using ScoresOf = std::function<const Desc&(cudnnDataType_t)>;

/// Rows < seq_len_q and columns < seq_len_kv kept, the rest -inf.
inline const Desc& mask_padding(Graph& g, const ScoresOf& scores, const Desc& cur, const Desc& lq, const Desc& lkv,
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

/// Column <= row + s_kv - s_q kept, the rest -inf: top-left aligned (column <= row) without
/// s_kv and s_q, bottom-right aligned with them (INT32 scalars, the frontend's diagonal band
/// mask before cuDNN 9.21). index_prec: the GEN_INDEX operations' math precision.
inline const Desc& mask_causal(Graph& g, const ScoresOf& scores, const Desc& cur, const Desc& neg_inf,
                               cudnnDataType_t index_prec = CUDNN_DATA_INT32, const Desc* s_kv = nullptr,
                               const Desc* s_q = nullptr) {
  const Desc& row = scores(CUDNN_DATA_INT32);
  const Desc& col = scores(CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, index_prec, cur, nullptr, row, nullptr, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, index_prec, cur, nullptr, col, nullptr, 3);
  const Desc* diag = &row;
  if (s_kv && s_q) {
    const Desc& plus = scores(CUDNN_DATA_INT32);
    g.pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_INT32, row, s_kv, plus);
    const Desc& shifted = scores(CUDNN_DATA_INT32);
    g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_INT32, plus, s_q, shifted);
    diag = &shifted;
  }
  const Desc& keep = scores(CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, *diag, &col, keep);
  const Desc& next = scores(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, cur, &neg_inf, next, &keep);
  return next;
}

/// The operation graph of p.g finalized, and the first engine configuration of heuristics A
/// that finalizes into an execution plan (p.plan, p.engine, p.workspace). Throws
/// KernelUnsupported when none does.
inline void choose_engine(cudnnHandle_t handle, Plan& p) {
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

/// Runs plan p on `stream` with `ptrs` (one per p.uids, in order) and the graph's constants,
/// and a workspace of p.workspace bytes; returns once the run is done (the workspace and the
/// by-value scalars the pointers name die with the caller's frame).
inline void execute(cudnnHandle_t handle, const Plan& p, std::vector<void*> ptrs, void* stream) {
  std::vector<std::int64_t> uids = p.uids;
  for (const Graph::Constant& c : p.g.constants) {
    uids.push_back(c.uid);
    ptrs.push_back(const_cast<std::int32_t*>(&c.bits));
  }
  DeviceBuffer workspace(static_cast<std::size_t>(p.workspace), stream);
  void* ws = workspace.get();
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), static_cast<std::int64_t>(uids.size()));
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, ptrs.data(), static_cast<std::int64_t>(ptrs.size()));
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &ws);
  pack.finalize("variant pack");
  check_cudnn(cudnnBackendExecute(handle, p.plan->d, pack.d), "execute");
  device_synchronize(stream);
}

/// A thread's cuDNN handle and its plans by shape (building one takes a fraction of a
/// second); the plans go before the handle.
template <class Key>
struct ThreadPlans {
  cudnnHandle_t handle = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans;
  ThreadPlans() = default;
  ThreadPlans(const ThreadPlans&) = delete;
  ThreadPlans& operator=(const ThreadPlans&) = delete;
  ~ThreadPlans() {
    plans.clear();
    if (handle) cudnnDestroy(handle);
  }
  /// The handle, created on first use, set to run on `stream`.
  cudnnHandle_t on(void* stream) {
    if (!handle) check_cudnn(cudnnCreate(&handle), "create handle");
    check_cudnn(cudnnSetStream(handle, static_cast<cudaStream_t>(stream)), "set stream");
    return handle;
  }
};

}  // namespace ulpgate::attn::cudnn
