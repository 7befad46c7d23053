// Rounding exact values (MPFR numbers) to a format, straight to the target: never through
// FP64 first, so there is no double rounding. And the fractional ULP error of a computed
// value against an exact one.
#pragma once

#include <stdint.h>  // before mpfr.h: enables the intmax_t functions (mpfr_set_uj_2exp)
#include <mpfr.h>

#include "core/format.hpp"

namespace ulpgate {

/// Rounds the exact value x once to the format and encodes it (same rules as encode()).
Code encode_exact(Format f, mpfr_srcptr x, Rounding r = Rounding::NearestEven,
                  Overflow o = Overflow::NoSaturate);

/// Signed fractional error in ULPs: (computed - exact) / ulp_of(f, exact), where the
/// difference is formed exactly and only the quotient is rounded (to the nearest double).
/// NaN if either is NaN; +-Inf if exactly one of them is infinite (or they are
/// opposite infinities); 0 for equal infinities.
double ulp_error(Format f, Code computed, mpfr_srcptr exact);
/// The same, for an exact value that is a double.
double ulp_error(Format f, Code computed, double exact);

/// MPFR keeps per-thread caches (the constants log 2 and pi, which mpfr_exp and
/// mpfr_const_pi fill). A thread that makes an Mpfr frees them when it exits, so the
/// reference's worker threads leave nothing behind (LeakSanitizer reported them).
inline void free_mpfr_caches_at_thread_exit() {
  struct Release {
    ~Release() { mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE); }
  };
  static thread_local Release release;
  (void)release;
}

/// RAII holder for an mpfr_t.
class Mpfr {
 public:
  explicit Mpfr(mpfr_prec_t prec) {
    free_mpfr_caches_at_thread_exit();
    mpfr_init2(v_, prec);
  }
  Mpfr(mpfr_prec_t prec, double x) : Mpfr(prec) { mpfr_set_d(v_, x, MPFR_RNDN); }
  ~Mpfr() { mpfr_clear(v_); }
  Mpfr(const Mpfr&) = delete;
  Mpfr& operator=(const Mpfr&) = delete;
  mpfr_ptr get() { return v_; }
  mpfr_srcptr get() const { return v_; }
  operator mpfr_ptr() { return v_; }
  operator mpfr_srcptr() const { return v_; }

 private:
  mpfr_t v_;
};

}  // namespace ulpgate
