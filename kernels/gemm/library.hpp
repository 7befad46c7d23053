// cuBLAS and cuBLASLt backends (kernels/gemm/cublas.cpp, cublaslt.cpp). cuBLAS is
// column-major, so a row-major case is run as its transpose: D^T = op(B)^T op(A)^T, with
// the A and B buffers swapped. The full mapping: see docs/kernels/cublas.md.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/case.hpp"
#include "kernels/kernel.hpp"

namespace ulpgate {

/// One T per calling thread (a cuBLAS handle and what belongs to it): the library kernels
/// are called by several threads at once (KernelTraits::thread_safe), and a handle must not
/// be shared by threads that set its stream. make() creates a thread's T on its first call.
template <class T>
class PerThread {
 public:
  template <class Make>
  T& get(Make&& make) {
    std::lock_guard lock(mu_);
    std::unique_ptr<T>& t = by_thread_[std::this_thread::get_id()];
    if (!t) t = std::make_unique<T>(make());
    return *t;
  }

 private:
  std::mutex mu_;
  std::map<std::thread::id, std::unique_ptr<T>> by_thread_;
};

/// The case as cuBLAS sees it (see the comment above).
struct ColumnMajorGemm {
  cublasOperation_t op1 = CUBLAS_OP_N, op2 = CUBLAS_OP_N;
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  std::string x, y;  ///< operand names behind X and Y ("A"/"B")
  std::int64_t ld_x = 0, ld_y = 0, ld_c = 0, ld_d = 0;
  std::int64_t stride_x = 0, stride_y = 0, stride_c = 0, stride_d = 0;
  /// Rows and columns of X and Y as stored column-major (before op1/op2).
  std::int64_t x_rows() const { return op1 == CUBLAS_OP_N ? m : k; }
  std::int64_t x_cols() const { return op1 == CUBLAS_OP_N ? k : m; }
  std::int64_t y_rows() const { return op2 == CUBLAS_OP_N ? k : n; }
  std::int64_t y_cols() const { return op2 == CUBLAS_OP_N ? n : k; }
};
ColumnMajorGemm to_column_major(const Case& c);

/// The CUDA data type that stores a format (TF32 is stored as CUDA_R_32F).
cudaDataType_t cuda_data_type(Format f);

/// Every cuBLAS and cuBLASLt kernel variant (requires a CUDA device to run).
std::vector<std::unique_ptr<Kernel>> make_library_kernels();
std::vector<std::unique_ptr<Kernel>> make_cublas_kernels();
std::vector<std::unique_ptr<Kernel>> make_cublaslt_kernels();

}  // namespace ulpgate
