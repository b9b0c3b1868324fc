#pragma once
// CPU feature checks the kernels dispatch on, beyond __builtin_cpu_supports:
// Clang before 16 does not know "f16c" there (a compile error), so F16C is
// read from CPUID leaf 1 directly (ECX bit 29), which GCC and Clang both offer
// through <cpuid.h>.
//
// Thread safety: pure functions.

#include <cpuid.h>

namespace pagoda::kernels {

inline bool cpu_has_f16c() {
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (ecx & bit_F16C) != 0;
}

}  // namespace pagoda::kernels
