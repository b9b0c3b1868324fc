#pragma once
// One fuzz target = one function `int fuzz_<name>(const uint8_t*, size_t)`,
// defined in <name>_fuzzer.cpp and named with PAGODA_FUZZ_TARGET. In a
// -DPAGODA_FUZZ=ON build each file is its own libFuzzer binary
// (PAGODA_FUZZ_MAIN defines LLVMFuzzerTestOneInput); in the normal build all
// of them are linked into fuzz_regression_tests, which replays the committed
// corpora and every input that ever crashed (tests/fuzz/README.md).
//
// A target must never crash, hang or leak on any input: errors are Status
// values; the target only checks that what comes back is consistent.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pagoda::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// Aborts with a message when a target finds an inconsistency (a crash for libFuzzer).
[[noreturn]] void fail(const char* what);

}  // namespace pagoda::fuzz

#ifdef PAGODA_FUZZ_MAIN
#define PAGODA_FUZZ_TARGET(function)                                               \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {        \
    return ::pagoda::fuzz::function(data, size);                                    \
  }                                                                                 \
  [[noreturn]] void pagoda::fuzz::fail(const char* what) {                          \
    __builtin_fprintf(stderr, "fuzz target inconsistency: %s\n", what);             \
    __builtin_abort();                                                              \
  }
#else
#define PAGODA_FUZZ_TARGET(function)
#endif
