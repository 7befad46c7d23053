// _ulpgate: the C++ half of the Python module. Cases, records and results cross the
// boundary as JSON text (the formats the CLI reads and writes), tensors as flat NumPy arrays
// of storage words (core/npy.hpp's dtypes); python/ulpgate/__init__.py builds the API on it.
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/case.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/npy.hpp"
#include "distributions/fill.hpp"
#include "check/check.hpp"
#include "campaign/fuzz.hpp"
#include "check/ops/op.hpp"
#include "campaign/record.hpp"
#include "check/runner.hpp"
#include "references/attention_combine.hpp"
#include "references/attention_reference.hpp"
#include "references/gemm_reference.hpp"
#include "reports/report.hpp"

namespace py = pybind11;

namespace ulpgate {
namespace {

Case parse_case(const std::string& text) { return case_from_json(parse_json(text)); }
std::string dump(const nlohmann::json& j) { return j.dump(); }

Format parse_format_or_throw(const std::string& s) {
  const auto f = parse_format(s);
  if (!f) throw InputError(fmt::format("format '{}': expected fp64, fp32, tf32, fp16, bf16, e4m3 or e5m2", s));
  return *f;
}

// A copy of a tensor's storage words as a flat array of its npy dtype.
py::array to_array(const Tensor& t) {
  py::array a(py::dtype(std::string(npy_dtype(t.format()))), std::vector<py::ssize_t>{static_cast<py::ssize_t>(t.size())});
  if (t.size_bytes()) std::memcpy(a.mutable_data(), t.data(), t.size_bytes());
  return a;
}

// A flat array (any shape, C order) of format f's npy dtype as a tensor: the caller checked
// dtype and size (ulpgate/__init__.py); checked again here, as core/npy.hpp would.
Tensor to_tensor(const py::array& a, Format f) {
  const py::dtype want(std::string(npy_dtype(f)));
  if (!a.dtype().is(want) || !(a.flags() & py::array::c_style))
    throw InputError(fmt::format("array of dtype {} given for {} (expects a C-contiguous {})",
                                 std::string(py::str(a.dtype())), name(f), std::string(npy_dtype(f))));
  Tensor t(f, static_cast<std::size_t>(a.size()), Tensor::uninitialized);
  if (t.size_bytes()) std::memcpy(t.data(), a.data(), t.size_bytes());
  check_tf32_words(t);  // as tensor_from_npy
  return t;
}

std::map<std::string, Tensor> to_tensors(const Case& c, const py::dict& arrays) {
  std::map<std::string, Tensor> out;
  for (const auto& [k, v] : arrays) {
    const std::string name = py::cast<std::string>(k);
    const auto t = c.types.find(name);
    if (t == c.types.end() || name == "compute")
      throw InputError(fmt::format("'{}' is not an operand of this {} case", name, ulpgate::name(c.op)));
    out.emplace(name, to_tensor(py::cast<py::array>(v), t->second));
  }
  return out;
}

// Shape and strides (in elements) of an operand's logical view over its buffer: GEMM op(A)
// (batch, M, K), op(B) (batch, K, N), C and D (batch, M, N), bias (N,); attention
// (batch, heads, seq, dim) in either layout (LSE: dim 1); attention_combine's O_part and
// LSE_part (splits, batch, heads, seq_q, dim), the split outermost.
py::tuple logical_view(const std::string& case_json, const std::string& operand) {
  const Case c = parse_case(case_json);
  std::vector<std::int64_t> shape, strides;
  if (c.op == Op::Gemm) {
    const MatrixView v = gemm_view(c, operand);
    const bool row = v.layout == Layout::RowMajor;
    const std::int64_t rs = row ? v.ld : 1, cs = row ? 1 : v.ld;
    const bool transposed = (operand == "A" && c.gemm.trans_a) || (operand == "B" && c.gemm.trans_b);
    if (operand == "bias") {
      shape = {v.cols}, strides = {cs};
    } else if (transposed) {
      shape = {v.batch, v.cols, v.rows}, strides = {v.batch_stride(), cs, rs};
    } else {
      shape = {v.batch, v.rows, v.cols}, strides = {v.batch_stride(), rs, cs};
    }
  } else {
    const AttentionView v = attention_view(c, operand);
    shape = {v.batch, v.heads, v.seq, v.dim};
    strides = v.layout == AttentionLayout::BHSD ? std::vector<std::int64_t>{v.heads * v.seq * v.dim, v.seq * v.dim, v.dim, 1}
                                                : std::vector<std::int64_t>{v.seq * v.heads * v.dim, v.dim, v.heads * v.dim, 1};
    if (operand == "O_part" || operand == "LSE_part") {  // view batch s * batch + b: split s of batch b
      const std::int64_t batch = c.attention.batch;
      shape[0] = batch, shape.insert(shape.begin(), c.attention.splits);
      strides.insert(strides.begin(), batch * strides[0]);
    }
  }
  return py::make_tuple(shape, strides, operand_elements(c, operand), std::string(npy_dtype(c.types.at(operand))));
}

// case_inputs: the case as filled (amax scales, kv_lengths) and its input buffers.
py::tuple fill(const std::string& case_json) {
  Case c = parse_case(case_json);
  const std::map<std::string, Tensor> inputs = case_inputs(c);
  py::dict arrays;
  for (const auto& [k, t] : inputs) arrays[py::str(k)] = to_array(t);
  return py::make_tuple(dump(to_json(c)), arrays);
}

// The exact outputs rounded to double, in logical order and shape. Every element, without
// the sampling of long attention prefills that checks do (check/ops/attention.cpp). A combine
// row with a NaN or Inf in a non-empty split's O_s has NaN outputs (no exact merge).
py::dict reference(const std::string& case_json) {
  Case c = parse_case(case_json);
  const std::map<std::string, Tensor> inputs = fill_inputs(c);
  std::vector<RefValue> values, lse;
  std::vector<py::ssize_t> shape;
  std::string output;
  {
    py::gil_scoped_release release;
    if (c.op == Op::Gemm) {
      GemmReference r = gemm_reference(c, inputs);
      values.assign(r.values.begin(), r.values.end());
      shape = {c.gemm.batch, c.gemm.m, c.gemm.n}, output = "D";
    } else if (c.op == Op::AttentionCombine) {
      CombineReference r = combine_reference(c, inputs);
      values = std::move(r.values);
      if (c.types.count("LSE")) lse = std::move(r.lse);
      const AttentionShape& a = c.attention;
      shape = {a.batch, a.heads, a.seq_q, a.head_dim}, output = "O";
    } else {
      AttentionReference r = attention_reference(c, inputs);
      values = std::move(r.values);
      if (c.types.count("LSE")) lse = std::move(r.lse);
      const AttentionShape& a = c.attention;
      shape = {a.batch, a.heads, a.seq_q, a.eff_head_dim_v()}, output = "O";
    }
  }
  py::array_t<double> out(shape);
  double* p = out.mutable_data();
  for (std::size_t i = 0; i < values.size(); ++i) p[i] = values[i].to_double();
  py::dict d;
  d[py::str(output)] = out;
  if (!lse.empty()) {  // [batch][heads][seq_q]
    py::array_t<double> l(std::vector<py::ssize_t>{shape[0], shape[1], shape[2]});
    for (std::size_t i = 0; i < lse.size(); ++i) l.mutable_data()[i] = lse[i].to_double();
    d["LSE"] = l;
  }
  return d;
}

py::array encode_array(const py::array_t<double, py::array::c_style | py::array::forcecast>& x, const std::string& fmt) {
  const Format f = parse_format_or_throw(fmt);
  Tensor t(f, static_cast<std::size_t>(x.size()), Tensor::uninitialized);
  const double* v = x.data();
  for (std::size_t i = 0; i < t.size(); ++i) t.set_value(i, v[i]);
  py::array a = to_array(t);
  return a.reshape(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
}

py::array decode_array(const py::array& words, const std::string& fmt) {
  const Format f = parse_format_or_throw(fmt);
  const py::array flat = py::array::ensure(words, py::array::c_style);
  const Tensor t = to_tensor(flat, f);
  const std::vector<py::ssize_t> shape(words.shape(), words.shape() + words.ndim());
  if (f == Format::FP64) {
    py::array_t<double> out(shape);
    std::memcpy(out.mutable_data(), t.data(), t.size_bytes());
    return out;
  }
  py::array_t<float> out(shape);
  decode_floats(f, t.data(), 0, 1, static_cast<std::int64_t>(t.size()), out.mutable_data());
  return out;
}

std::string check(const std::string& case_json, const py::dict& outputs, const std::string& kernel, int p_bits) {
  const Case c = parse_case(case_json);
  const std::map<std::string, Tensor> tensors = to_tensors(c, outputs);
  if (p_bits != 0 && (c.op != Op::Attention || p_bits < 2 || p_bits > 24))
    throw InputError(fmt::format("p_bits {}: attention cases only, 0 (undeclared) or 2 to 24 bits", p_bits));
  py::gil_scoped_release release;
  KernelTraits declared;
  declared.p_bits = p_bits;
  CaseResult r = check_given_outputs(c, tensors, kernel, declared);
  r.origin = "check";
  return dump(case_result_to_json(r));
}

// Writes a record of the given case results (record.hpp's JSON) with this process's
// environment; returns it.
std::string write_record(const std::string& path, const std::vector<std::string>& results, const std::string& kind,
                         const std::string& command) {
  RunRecord rec;
  rec.kind = kind;
  rec.command = command;
  rec.environment = capture_environment();
  for (const std::string& r : results) rec.cases.push_back(case_result_from_json(parse_json(r), "result"));
  if (!rec.cases.empty()) rec.seed = rec.cases.front().spec.seed;
  write_record_file(path, rec);
  return dump(to_json(rec));
}

std::string render(const std::string& record_json, const std::string& what) {
  const RunRecord r = record_from_json(parse_json(record_json));
  if (what == "markdown") return render_markdown(r);
  if (what == "junit") return render_junit(r);
  throw InputError(fmt::format("render: '{}' is not markdown or junit", what));
}

// A Python callable as a host kernel. run() hands `call` (ulpgate/__init__.py) the case and
// its input buffers; `call` returns each output's whole buffer, of which the logical elements
// are copied (padding stays as the runner poisoned it, as for check_given_outputs). The GIL
// is held throughout the campaign (in process, one case at a time).
class PythonKernel final : public Kernel {
 public:
  PythonKernel(std::string name, py::object call, py::object supports, KernelTraits traits)
      : name_(std::move(name)), call_(std::move(call)), supports_(std::move(supports)), traits_(std::move(traits)) {}
  std::string name() const override { return name_; }
  std::string description() const override { return "a Python callable"; }
  KernelTraits traits() const override { return traits_; }
  std::optional<std::string> unsupported(const Case& c) const override {
    const py::object why = supports_(dump(to_json(c)));
    if (why.is_none()) return std::nullopt;
    return py::cast<std::string>(why);
  }
  void run(const Case& c, const KernelIo& io, RunNotes&) override {
    py::dict inputs;
    for (const auto& [k, p] : io.in) {
      Tensor t(c.types.at(k), static_cast<std::size_t>(operand_elements(c, k)), Tensor::uninitialized);
      std::memcpy(t.data(), p, t.size_bytes());
      inputs[py::str(k)] = to_array(t);
    }
    py::object result;
    try {
      result = call_(dump(to_json(c)), inputs);
    } catch (py::error_already_set& e) {
      // Ctrl-C and exit end the campaign (fuzz() raises them again); anything else the
      // callable raises is this case's failure, as a kernel's error.
      if (e.matches(PyExc_KeyboardInterrupt) || e.matches(PyExc_SystemExit)) {
        interrupt = std::move(e);
        throw InputError("interrupted");
      }
      throw KernelError(fmt::format("the Python kernel raised {}", e.what()));
    }
    const std::map<std::string, Tensor> outputs = to_tensors(c, py::cast<py::dict>(result));
    for (const auto& [k, dst] : io.out) {
      const auto it = outputs.find(k);
      if (it == outputs.end()) throw KernelError(fmt::format("the Python kernel gave no output {}", k));
      const std::vector<std::int64_t> offsets = op_module(c.op).output_offsets(c, k);
      const std::size_t w = storage_bytes(it->second.format());
      for (const std::int64_t e : offsets)
        std::memcpy(static_cast<std::byte*>(dst) + e * w, static_cast<const std::byte*>(it->second.data()) + e * w, w);
    }
  }
  std::optional<py::error_already_set> interrupt;

 private:
  std::string name_;
  py::object call_, supports_;
  KernelTraits traits_;
};

struct FuzzArgs {
  std::string name, dtype, op, sizes, out;
  std::int64_t cases = 20, max_k = 4096;
  std::uint64_t seed = 1;
  double seconds = 0;
  bool metamorphic = true, gelu = true, deterministic = true, rounds_to_nearest = false, lse = false;
  unsigned variants = 0;  ///< the attention variants the callable applies (core/case.hpp kAttn*)
};

std::string fuzz(py::object call, py::object supports, const FuzzArgs& a, const std::function<void(py::dict)>& progress) {
  KernelTraits traits;
  traits.deterministic = a.deterministic;
  traits.rounds_to_nearest = a.rounds_to_nearest;
  traits.writes_lse = a.lse;
  if (a.variants & ~kAllAttentionVariants) throw InputError(fmt::format("variants {:#x}: unknown bits", a.variants));
  traits.attention_variants = a.variants;
  auto owned = std::make_unique<PythonKernel>(a.name, std::move(call), std::move(supports), traits);
  PythonKernel* k = owned.get();
  Registry registry;
  registry.add(std::move(owned));
  FuzzOptions o;
  const std::optional<Op> parsed = parse_op(a.op);
  if (!parsed)
    throw InputError(fmt::format("op '{}': expected gemm, attention, attention_backward or attention_combine", a.op));
  const Op op = *parsed;
  const auto dtypes = op_module(op).dtypes();
  if (std::find(dtypes.begin(), dtypes.end(), a.dtype) == dtypes.end())
    throw InputError(fmt::format("dtype '{}': {} takes {}", a.dtype, a.op, fmt::join(dtypes, ", ")));
  o.targets = {{a.name, a.dtype, op}};
  if (a.cases < 0) throw InputError(fmt::format("cases {}: must be >= 0", a.cases));
  if (a.max_k < 1) throw InputError(fmt::format("max_k {}: must be >= 1", a.max_k));
  o.cases = a.cases, o.seed = a.seed, o.max_k = a.max_k, o.seconds = a.seconds;
  const auto sizes = parse_size_schedule(a.sizes);
  if (!sizes) throw InputError(fmt::format("sizes '{}': expected small, realistic or large", a.sizes));
  o.sizes = *sizes;
  o.metamorphic = a.metamorphic, o.gelu = a.gelu;
  if (!a.out.empty()) o.cases_dir = a.out + "/cases", o.corpus_dir = a.out + "/corpus";
  RunRecord r;
  try {
    r = run_fuzz(registry, o, [&](const FuzzProgress& p) {
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (progress) progress(py::dict(py::arg("cases") = p.cases, py::arg("failures") = p.failures,
                                      py::arg("total") = p.total, py::arg("elapsed") = p.elapsed));
    });
  } catch (const InputError&) {
    if (k->interrupt) k->interrupt->restore(), throw py::error_already_set();
    throw;
  }
  return dump(to_json(r));
}

}  // namespace
}  // namespace ulpgate

PYBIND11_MODULE(_ulpgate, m) {
  using namespace ulpgate;
  m.doc() = "ulpgate's C++ library (python/ulpgate/__init__.py is the API)";
  m.attr("__version__") = ULPGATE_VERSION;
  // The CLI's exit-2 errors, one line naming the problem, as ValueError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
  m.def("normalise_case", [](const std::string& text) { return dump(to_json(parse_case(text))); },
        "Parses and validates a case's JSON; the case as ulpgate writes it (every field).");
  m.def("read_case", [](const std::string& path) { return dump(to_json(read_case_file(path))); });
  m.def("write_case", [](const std::string& path, const std::string& text) { write_case_file(path, parse_case(text)); });
  m.def("outputs_of", [](const std::string& text) { return outputs_of(parse_case(text)); });
  m.def("logical_view", &logical_view);
  m.def("fill", &fill);
  m.def("reference", &reference);
  m.def("encode", &encode_array);
  m.def("decode", &decode_array);
  m.def("check", &check);
  m.def("write_record", &write_record);
  m.def("render", &render);
  m.def("write_record_json", [](const std::string& path, const std::string& text) {
    write_record_file(path, record_from_json(parse_json(text)));
  });
  m.def("read_record", [](const std::string& path) { return dump(to_json(read_record_file(path))); });
  m.def("fuzz", [](py::object call, py::object supports, const std::string& name, const std::string& dtype,
                   const std::string& op, std::int64_t cases, std::uint64_t seed, std::int64_t max_k,
                   const std::string& sizes, double seconds, bool metamorphic, bool gelu, bool deterministic,
                   bool rounds_to_nearest, bool lse, unsigned variants, const std::string& out,
                   const std::function<void(py::dict)>& progress) {
    FuzzArgs a;
    a.name = name, a.dtype = dtype, a.op = op, a.cases = cases, a.seed = seed, a.max_k = max_k, a.sizes = sizes;
    a.seconds = seconds, a.metamorphic = metamorphic, a.gelu = gelu, a.deterministic = deterministic;
    a.rounds_to_nearest = rounds_to_nearest, a.lse = lse, a.variants = variants, a.out = out;
    return fuzz(std::move(call), std::move(supports), a, progress);
  });
}
