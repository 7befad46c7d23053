// The floating-point environment the references are written for, set for a scope.
#pragma once

#include <xmmintrin.h>

namespace ulpgate {

/// For its lifetime, the SSE control register holds the IEEE defaults (round to nearest,
/// subnormals kept: no FTZ or DAZ, exceptions masked); the caller's is restored after.
/// A kernel under test runs in the same process and may have changed it: with DAZ a
/// subnormal input reads as zero, and the slice splitting needs round to nearest. Threads
/// started inside the scope inherit it. Costs one register read where nothing changed.
class ReferenceFpEnv {
 public:
  ReferenceFpEnv() : saved_(_mm_getcsr()) {
    if ((saved_ & ~kStatusFlags) != kDefault) _mm_setcsr(kDefault);
  }
  ~ReferenceFpEnv() {
    if ((saved_ & ~kStatusFlags) != kDefault) _mm_setcsr(saved_);
  }
  ReferenceFpEnv(const ReferenceFpEnv&) = delete;
  ReferenceFpEnv& operator=(const ReferenceFpEnv&) = delete;

 private:
  static constexpr unsigned kDefault = 0x1F80;    // all exceptions masked, RN, no FTZ/DAZ
  static constexpr unsigned kStatusFlags = 0x3F;  // sticky exception flags: left alone
  unsigned saved_;
};

}  // namespace ulpgate
