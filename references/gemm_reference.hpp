// GEMM ground truth: every element of D = scale_D * act(alpha * scale_A * scale_B * op(A) op(B)
// + beta * scale_C * C + bias) computed exactly (or, for GELU, certified by Ziv's strategy)
// and held as a RefValue, so it rounds correctly to D's format or any other.
// Semantics (docs/concepts/cases.md), scales, activations and paths: see
// docs/concepts/references.md.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/case.hpp"
#include "core/parallel.hpp"
#include "core/tensor.hpp"
#include "core/uninitialized.hpp"
#include "references/ref_value.hpp"
#include "references/sliced_gemm.hpp"

namespace ulpgate {

/// GEMM reference values, indexed logically: element (b, i, j) is at (b * m + i) * n + j,
/// whatever D's layout and leading dimension.
struct GemmReference {
  std::int64_t batch = 0, m = 0, n = 0;
  Format d_format = Format::FP32;
  /// D before its rounding: exact, or for GELU the certified 128-bit window. alpha = 0
  /// follows BLAS: A and B are not referenced, D = act(beta sC C + bias) even where A B has
  /// NaN or Inf (and `intermediate` is then +Inf, so that the analyzers also accept the
  /// NaN of a kernel that multiplies by alpha anyway).
  UninitVector<RefValue> values;
  /// The condition term sum_k |op(A)_ik op(B)_kj|, computed exactly, rounded to nearest.
  std::vector<double> condition;
  /// The same scale for the whole epilogue input, in D's units:
  /// scale_D (|alpha sA sB| condition + |beta sC c_ij| + |bias_j|), rounded to nearest.
  std::vector<double> magnitude;
  /// A bound on every intermediate a floating-point evaluation holds before scale_D and the
  /// activation: max(condition, |alpha sA sB| condition + |beta sC c_ij| + |bias_j|), over
  /// the finite terms only (an Inf or NaN input counts as 0 here).
  std::vector<double> intermediate;
  /// With a sliced path: the elements whose dot product the digits did not certify and the
  /// superaccumulator computed; -1 without one.
  std::int64_t recomputed = -1;
  /// Which path computed the dot products: "cpu" (superaccumulator), "sliced" (a sliced
  /// path the caller gave, e.g. the CPU emulation), "gpu" (int8 digit products on the
  /// device; the rest on the CPU).
  std::string path = "cpu";

  std::int64_t index(std::int64_t b, std::int64_t i, std::int64_t j) const { return (b * m + i) * n + j; }
  const RefValue& at(std::int64_t b, std::int64_t i, std::int64_t j) const { return values[index(b, i, j)]; }
  /// The correctly rounded (RNE) value in D's format of element (b, i, j).
  Code expected(std::int64_t b, std::int64_t i, std::int64_t j) const { return at(b, i, j).round_to(d_format); }
};

/// Computes the reference for a GEMM case from its input tensors ("A", "B", and "C" when
/// beta != 0, "bias" for bias epilogues), each in its operand's format and laid out as the
/// case says. Throws InputError if a tensor is missing, of the wrong format, or too small.
/// sliced: take the dot products of FP32-or-narrower operands from this sliced path
/// (references/sliced_gemm.hpp), certified, the rest from the superaccumulator; the epilogue
/// is the same either way, and so is every value. nullptr: as reference_path() says.
GemmReference gemm_reference(const Case& c, const std::map<std::string, Tensor>& inputs,
                             unsigned threads = default_threads(), const SlicedPath* sliced = nullptr);

/// Where GEMM references taken without an explicit sliced path compute their dot products:
/// auto: on the GPU (int8 digit products, certified) when a CUDA device is present and the
/// case has at least kGpuReferenceTerms product terms, on the CPU otherwise (and when the
/// GPU path fails: a note on stderr); cpu: always the superaccumulator; gpu: the GPU path
/// for every case it applies to (an error without a device).
enum class ReferencePath { Auto, Cpu, Gpu };
void set_reference_path(ReferencePath p);
ReferencePath reference_path();
/// "auto", "cpu" or "gpu"; nullopt otherwise.
std::optional<ReferencePath> parse_reference_path(std::string_view s);
/// batch x M x N x K at which auto takes the GPU (measured: docs/results/gpu_reference_h200.md).
inline constexpr double kGpuReferenceTerms = 0x1p29;
/// Whether this build and machine have the GPU path.
bool gpu_reference_available();

/// act applied to the exact value t (any precision), times scale_d, as a RefValue (the
/// epilogue's last step, exposed for tests).
RefValue apply_activation(Epilogue e, mpfr_srcptr t, double scale_d);

}  // namespace ulpgate
