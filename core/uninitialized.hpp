// Vectors whose resize leaves the new elements unwritten, for arrays of 10^7..10^9 elements
// that are written in full right after (a large case's inputs, its reference values):
// std::vector's value-initialisation would zero them first on one thread; here whoever
// writes an element first pays, on as many threads as write it.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace ulpgate {

/// Value-initialisation becomes default-initialisation (nothing for double or std::byte),
/// and for implicit-lifetime types (trivially copyable and destructible, e.g. RefValue with
/// its member initialisers) nothing at all: the storage holds an object of the type from
/// its allocation, with unspecified bits until written. Construction with arguments is as
/// usual.
template <class T>
struct DefaultInitAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = DefaultInitAllocator<U>;
  };
  DefaultInitAllocator() = default;
  template <class U>
  DefaultInitAllocator(const DefaultInitAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    if constexpr (!(std::is_trivially_copyable_v<U> && std::is_trivially_destructible_v<U>))
      ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

/// A std::vector whose resize(n) does not write the new elements (see above).
template <class T>
using UninitVector = std::vector<T, DefaultInitAllocator<T>>;

}  // namespace ulpgate
