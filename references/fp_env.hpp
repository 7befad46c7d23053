// The floating-point environment the references and analyzers are written for, set for a scope.
#pragma once

#include <xmmintrin.h>

#include <cfenv>

namespace ulpgate {

/// For its lifetime, the SSE control register holds the IEEE defaults (round to nearest,
/// subnormals kept: no FTZ or DAZ, exceptions masked) and the x87 unit rounds to nearest;
/// the caller's are restored after. A kernel under test runs in the same process and may
/// have changed them (fesetround sets both units, _mm_setcsr only SSE): with DAZ a
/// subnormal input reads as zero, and the slice splitting, the double-double's low word and
/// the analyzers' double arithmetic need round to nearest. Threads started inside the scope
/// inherit it. Costs two register reads where nothing changed.
class ReferenceFpEnv {
 public:
  ReferenceFpEnv() : saved_(_mm_getcsr()), saved_x87_(std::fegetround()) {
    if (saved_x87_ != FE_TONEAREST) std::fesetround(FE_TONEAREST);  // both units: SSE set again below
    if (sse_changed() || saved_x87_ != FE_TONEAREST) _mm_setcsr(kDefault);
  }
  ~ReferenceFpEnv() {
    if (saved_x87_ != FE_TONEAREST) std::fesetround(saved_x87_);
    if (sse_changed() || saved_x87_ != FE_TONEAREST) _mm_setcsr(saved_);
  }
  ReferenceFpEnv(const ReferenceFpEnv&) = delete;
  ReferenceFpEnv& operator=(const ReferenceFpEnv&) = delete;

 private:
  static constexpr unsigned kDefault = 0x1F80;    // all exceptions masked, RN, no FTZ/DAZ
  static constexpr unsigned kStatusFlags = 0x3F;  // sticky exception flags: left alone
  bool sse_changed() const { return (saved_ & ~kStatusFlags) != kDefault; }
  unsigned saved_;
  int saved_x87_;
};

/// Restores, at the end of its scope, the whole floating-point environment it found (both
/// units' control words and flags): what a kernel run leaves set ends with the run, so that
/// neither the judging nor the next case drawn in the same process sees it.
class RestoreFpEnv {
 public:
  RestoreFpEnv() { std::fegetenv(&saved_); }
  ~RestoreFpEnv() { std::fesetenv(&saved_); }
  RestoreFpEnv(const RestoreFpEnv&) = delete;
  RestoreFpEnv& operator=(const RestoreFpEnv&) = delete;

 private:
  std::fenv_t saved_;
};

}  // namespace ulpgate
