// The one interface every kernel under test implements, and the registry that names them.
//
// A kernel computes the op of a Case (GEMM or attention; memory contract in
// docs/concepts/cases.md) from operand buffers that the runner prepared in the kernel's
// memory space.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/case.hpp"

namespace ulpgate {

enum class Memory { Host, Device };

/// The model rule's factor and the largest case (batch x M x N x K) it runs the model on
/// (the CPU emulation costs about 10 ns a term).
inline constexpr double kDeclaredModelFactor = 4.0;
inline constexpr std::int64_t kDeclaredModelTerms = std::int64_t{1} << 27;

struct KernelTraits {
  Memory memory = Memory::Host;
  bool deterministic = true;  ///< bitwise repeatable run to run
  /// The precision (bits, implicit bit included) the kernel is designed to accumulate
  /// with, when it is not the compute format's (e.g. a model of a narrow accumulator);
  /// 0: the compute format's. The tolerance model uses it.
  int accumulator_bits = 0;
  /// Products after which a narrow accumulator (accumulator_bits) is added to an FP32 one
  /// and restarts from zero, as FP8 tensor-core GEMMs promote partial sums; 0: never. The
  /// tolerance model uses it.
  int promote = 0;
  /// Where accumulator_bits and promote come from when measured rather than designed, e.g.
  /// "probe, NVIDIA H200, 2026-12-03" (reports say it next to the kernel); empty otherwise.
  std::string arithmetic_source{};
  /// A bit-accurate CPU model of the kernel's accumulation (a cpu.blockfma name, e.g. from
  /// the probe); empty: none. Checks then apply the model rule: the kernel's max normalised
  /// error at most kDeclaredModelFactor x the model's on the same inputs (a kernel worse
  /// than its own hardware allows), on GEMM cases of at most kDeclaredModelTerms terms.
  std::string accumulation_model{};
  /// Attention: the precision (bits) P is rounded to before P V (flash kernels: FP16 11,
  /// BF16 8; 24: P kept in FP32, the tighter rule). 0: undeclared, and the default rule
  /// admits P rounded to the inputs' 16-bit format (BF16 for FP8 inputs), as fused kernels
  /// do (docs: the precision rule's admitted arithmetics).
  int p_bits = 0;
  /// How the kernel rounds its inputs where it rounds them (TF32 compute: FP32 inputs to 11
  /// bits): cvt.rna (to nearest, ties away) unless declared otherwise. The bias test judges
  /// the kernel against the exact result of the inputs rounded this way.
  Rounding input_rounding = Rounding::NearestAway;
  /// Attention and attention combine: the kernel writes the log-sum-exp output (core/case.hpp,
  /// "LSE") where a case asks for it. false: such cases are not supported (the runner says
  /// so, and generators do not draw them for the kernel).
  bool writes_lse = false;
  /// Attention: the variants the kernel applies (bits of core/case.hpp AttentionVariant, e.g.
  /// kAttnWindow). A case using one it lacks is not supported (the runner says so), and
  /// generators do not draw it for the kernel.
  unsigned attention_variants = 0;
  /// Attention backward: dQ is accumulated across key blocks with atomic adds, so its bits
  /// may change from run to run. dK and dV must repeat bit for bit whatever the kernel
  /// declares, and so must dQ of a kernel without this trait.
  bool atomic_dq = false;
  /// unsupported() and run() may be called from several threads at once (the CPU models:
  /// pure functions of their inputs; cuBLAS and cuBLASLt: a handle per thread). A device
  /// kernel that says so must also do all its device work on KernelIo::stream (each
  /// thread's own stream, check/runner). Otherwise a worker checking cases concurrently
  /// calls them one at a time (campaign/isolate.hpp), on the legacy default stream.
  bool thread_safe = false;
  /// The kernel accumulates with round-to-nearest (FP32 FMA in CUDA C, the CPU models of
  /// RNE accumulation): each rounding error is zero-mean, so the precision rule (check/
  /// analyze.hpp) allows the random-rounding scale only. false (unknown, the default, and
  /// tensor cores, which truncate): the rule also allows round-toward-zero's bias.
  bool rounds_to_nearest = false;
  /// The accumulation flushes subnormal results to zero somewhere (CUDA's atomicAdd on FP32:
  /// PTX atom/red .add.f32 flush subnormal inputs and results to sign-preserving zero): the
  /// tolerance's underflow allowance per operation is then the smallest normal number of
  /// the compute format, not its smallest subnormal.
  bool flushes_subnormals = false;
  /// GELU epilogues: the kernel evaluates tanh (or erf) with an absolute error of at most
  /// this (e.g. cuBLASLt's, measured on the H200: tests/kernels/test_library_gpu.cpp), so
  /// GELU(v) = v/2 (1 + tanh(...)) is off by up to activation_error |v| / 2 beyond the
  /// accumulation's error; 0: evaluated as accurately as FP32 arithmetic allows.
  double activation_error = 0;
};

/// Operand buffers, in the kernel's memory space. Inputs: A, B[, C][, bias] or Q, K, V;
/// outputs: D, or O [and LSE]. Each buffer holds the operand's storage words (tensor.hpp), laid out
/// as gemm_view()/attention_view() say.
struct KernelIo {
  std::map<std::string, const void*> in;
  std::map<std::string, void*> out;
  void* stream = nullptr;  ///< cudaStream_t for device kernels (nullptr: default stream)
};

/// What a kernel reports about a run: chosen algorithm, workspace, library version, ...
using RunNotes = std::map<std::string, std::string>;

/// A kernel failure (the library returned an error, the launch failed). The message names
/// the failing call.
class KernelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The kernel cannot run this case after all (e.g. a library found no algorithm): the
/// runner records "not supported", not a failure.
class KernelUnsupported : public KernelError {
 public:
  using KernelError::KernelError;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  virtual KernelTraits traits() const = 0;
  /// nullopt if the kernel can run the case; otherwise why not ("fp8 needs K % 16 == 0").
  virtual std::optional<std::string> unsupported(const Case& c) const = 0;
  bool supports(const Case& c) const { return !unsupported(c).has_value(); }
  /// Runs the case. Throws KernelError on failure.
  virtual void run(const Case& c, const KernelIo& io, RunNotes& notes) = 0;
};

/// The kernels available in this process: built-in ones, and plugins loaded at run time.
class Registry {
 public:
  void add(std::unique_ptr<Kernel> k);
  Kernel* find(const std::string& name) const;
  /// find(), and for a CPU model name with parameters ("cpu.blockfma:block=8,frac=20,
  /// round=rz") builds and adds that model. nullptr if neither; InputError for a model name
  /// with bad parameters.
  Kernel* resolve(const std::string& name);
  const std::vector<std::unique_ptr<Kernel>>& all() const { return kernels_; }
  /// Kernels whose name starts with prefix (e.g. "cpu." or "cublaslt.").
  std::vector<Kernel*> matching(const std::string& prefix) const;

 private:
  std::vector<std::unique_ptr<Kernel>> kernels_;
};

/// Whether a usable CUDA device exists (false when built without CUDA).
bool cuda_device_available();

/// Why a kernel with device memory is not supported on a machine without a CUDA device.
inline constexpr const char* kNeedsCudaDevice = "needs a CUDA device; none here";

}  // namespace ulpgate
