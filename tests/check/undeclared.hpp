// A kernel as a plugin that declares nothing sees it: the inner kernel's results under the
// default traits (nothing said of its accumulator, P or input rounding), for the tests of
// what the default rule admits (test_admitted.cpp, test_admitted_gpu.cpp).
#pragma once

#include <optional>
#include <string>

#include "kernels/kernel.hpp"

namespace ulpgate::test {

class Undeclared final : public Kernel {
 public:
  explicit Undeclared(Kernel& inner) : inner_(inner) {}
  std::string name() const override { return "undeclared." + inner_.name(); }
  std::string description() const override { return inner_.description() + " (declaring nothing)"; }
  KernelTraits traits() const override {
    const KernelTraits in = inner_.traits();
    KernelTraits t;
    t.memory = in.memory;
    t.deterministic = in.deterministic;
    t.writes_lse = in.writes_lse;
    t.thread_safe = in.thread_safe;
    return t;
  }
  std::optional<std::string> unsupported(const Case& c) const override { return inner_.unsupported(c); }
  void run(const Case& c, const KernelIo& io, RunNotes& notes) override { inner_.run(c, io, notes); }

 private:
  Kernel& inner_;
};

}  // namespace ulpgate::test
