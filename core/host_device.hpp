// ULPGATE_HD: a function compiled for the host, and for the device when nvcc compiles it
// (code shared bit for bit by the CPU and GPU paths: rng.hpp, format_rne.hpp).
#pragma once

#if !defined(ULPGATE_HD)
#if defined(__CUDACC__)
#define ULPGATE_HD __host__ __device__ __forceinline__
#else
#define ULPGATE_HD inline
#endif
#endif
