// What the integer kernels (quantized_linear.cpp, int8_kv.cpp) share: which instructions this CPU and the active
// kernel level give them, the target attributes of each path, and the lane sums both need.
//
// Intrinsics, not GCC vector extensions: the integer multiply-adds (vpmaddwd, vpmaddubsw, AVX-512 VNNI's vpdpbusd
// and vpdpwssd) have no vector-extension spelling. Each path is compiled for its own target; which one runs is
// picked per call from the active kernel level, so tests can run every path on one CPU.

#pragma once

#include <cstring>

#include "vectors.h"  // PLAYGROUND_X86_LEVELS

#if defined(PLAYGROUND_X86_LEVELS)
#include <immintrin.h>
#define PLAYGROUND_AVX2 __attribute__((target("arch=x86-64-v3")))
#define PLAYGROUND_VNNI __attribute__((target("arch=x86-64-v4,avx512vnni")))
#endif

namespace {

enum class IntegerPath { kVnni, kAvx2, kPlain };

// For kernel level `level` (active_level_name's names): VNNI where "avx512" runs on a CPU that has it, AVX2 on "avx2"
// (or an AVX-512 CPU without VNNI), plain C++ on "baseline" and elsewhere. The caller passes the level (read on every
// call: tests switch levels), so that these kernels depend on no other source file.
inline IntegerPath integer_path(const char* level) {
#if defined(PLAYGROUND_X86_LEVELS)
  static const bool vnni = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v4") && __builtin_cpu_supports("avx512vnni");
  }();
  const bool avx512 = std::strcmp(level, "avx512") == 0;
  if (avx512 && vnni) return IntegerPath::kVnni;
  if (avx512 || std::strcmp(level, "avx2") == 0) return IntegerPath::kAvx2;
#endif
  return IntegerPath::kPlain;
}

// A file's kernels for `level`'s path, from its plain set and its x86 ones (null where they are not compiled).
template <typename Kernels>
const Kernels& by_integer_path(const char* level, const Kernels& plain, const Kernels* avx2, const Kernels* vnni) {
  switch (integer_path(level)) {
    case IntegerPath::kVnni: return *vnni;
    case IntegerPath::kAvx2: return *avx2;
    default: return plain;
  }
}

#if defined(PLAYGROUND_X86_LEVELS)

// The lane sums of four vectors at once, as one vector [sum a, sum b, sum c, sum d]: a transpose-add rather than
// four separate reductions.
PLAYGROUND_AVX2 inline __attribute__((always_inline)) __m128i sum4_epi32(__m256i a, __m256i b, __m256i c,
                                                                        __m256i d) {
  const __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

PLAYGROUND_VNNI inline __attribute__((always_inline)) __m128i sum4_epi32(__m512i a, __m512i b, __m512i c,
                                                                        __m512i d) {
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  const __m512i abcd = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  const __m256i half = _mm256_add_epi32(_mm512_castsi512_si256(abcd), _mm512_extracti64x4_epi64(abcd, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
}

#endif  // PLAYGROUND_X86_LEVELS

}  // namespace
