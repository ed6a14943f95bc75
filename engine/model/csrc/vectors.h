// Vectors of W floats for the engine's CPU kernels, shared by every source file in csrc/.
//
// GCC vector extensions rather than intrinsics: one source compiles at each x86-64 level (16, 8 or 4 floats a
// vector) and on any other CPU. Everything here is inline and local to each file that includes it.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PLAYGROUND_X86_LEVELS
#define PLAYGROUND_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PLAYGROUND_MULTIVERSION
#endif
#define PLAYGROUND_INLINE inline __attribute__((always_inline))

namespace {

// A vector of W floats (W = 4, 8 or 16: one SSE, AVX2 or AVX-512 register) and of W int32.
template <int W> struct Lanes;
template <> struct Lanes<4> {
  typedef float f __attribute__((vector_size(16)));
  typedef int32_t i __attribute__((vector_size(16)));
};
template <> struct Lanes<8> {
  typedef float f __attribute__((vector_size(32)));
  typedef int32_t i __attribute__((vector_size(32)));
};
template <> struct Lanes<16> {
  typedef float f __attribute__((vector_size(64)));
  typedef int32_t i __attribute__((vector_size(64)));
};
template <int W> using vec = typename Lanes<W>::f;
template <int W> using ivec = typename Lanes<W>::i;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <int W>
PLAYGROUND_INLINE vec<W> load(const float* p) {
  vec<W> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <int W>
PLAYGROUND_INLINE void store(float* p, vec<W> v) { std::memcpy(p, &v, sizeof(v)); }

template <int W>
PLAYGROUND_INLINE vec<W> splat(float x) { return vec<W>{} + x; }

template <int W>
PLAYGROUND_INLINE vec<W / 2> low_half(vec<W> v) {
  if constexpr (W == 16) return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  else return __builtin_shufflevector(v, v, 0, 1, 2, 3);
}

template <int W>
PLAYGROUND_INLINE vec<W / 2> high_half(vec<W> v) {
  if constexpr (W == 16) return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  else return __builtin_shufflevector(v, v, 4, 5, 6, 7);
}

// Sums and maxima of a vector's lanes as a tree (log2(W) dependent steps, not W - 1).
template <int W>
PLAYGROUND_INLINE float lane_sum(vec<W> v) {
  if constexpr (W == 4) return (v[0] + v[2]) + (v[1] + v[3]);
  else return lane_sum<W / 2>(low_half<W>(v) + high_half<W>(v));
}

template <int W>
PLAYGROUND_INLINE float lane_max(vec<W> v) {
  if constexpr (W == 4) return std::max(std::max(v[0], v[1]), std::max(v[2], v[3]));
  else {
    const vec<W / 2> a = low_half<W>(v), b = high_half<W>(v);
    return lane_max<W / 2>(a > b ? a : b);
  }
}

// e^x per lane (x <= 88), within about 2 ulp: e^x = 2^n e^r with |r| <= ln2 / 2, e^r by a degree-6 polynomial.
// Lanes below -87.3 give 0; NaN stays NaN.
template <int W>
PLAYGROUND_INLINE vec<W> exp_lanes(vec<W> x) {
  const vec<W> t = x * 1.44269504088896341f;
  const vec<W> n = (t + 12582912.f) - 12582912.f;  // round to nearest
  const vec<W> r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  vec<W> p = splat<W>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vec<W> e_r = p * r * r + r + 1.f;
  const ivec<W> exponent = (__builtin_convertvector(n, ivec<W>) + 127) << 23;
  vec<W> scale;
  std::memcpy(&scale, &exponent, sizeof(scale));
  vec<W> y = e_r * scale;
  y = x < -87.3f ? vec<W>{} : y;
  return x != x ? x : y;
}

// Lane t of the result = sum of acc[t]'s lanes, for W vectors: a log2(W)-level transpose-add. The vectors are
// taken in bit-reversed order so that the sums come out in natural order.
template <int W>
PLAYGROUND_INLINE vec<W> transpose_sums(const vec<W>* acc) {
  if constexpr (W == 16) {
    static constexpr int kBitReversed[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    vec<16> b[8], c[4], e[2];
    for (int i = 0; i < 8; ++i) {
      const vec<16> x = acc[kBitReversed[2 * i]], y = acc[kBitReversed[2 * i + 1]];
      b[i] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
             __builtin_shufflevector(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    }
    for (int i = 0; i < 4; ++i) {
      c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
             __builtin_shufflevector(b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    }
    for (int i = 0; i < 2; ++i) {
      e[i] = __builtin_shufflevector(c[2 * i], c[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
             __builtin_shufflevector(c[2 * i], c[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
    return __builtin_shufflevector(e[0], e[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
           __builtin_shufflevector(e[0], e[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  } else if constexpr (W == 8) {
    static constexpr int kBitReversed[8] = {0, 4, 2, 6, 1, 5, 3, 7};
    vec<8> b[4], c[2];
    for (int i = 0; i < 4; ++i) {
      const vec<8> x = acc[kBitReversed[2 * i]], y = acc[kBitReversed[2 * i + 1]];
      b[i] = __builtin_shufflevector(x, y, 0, 1, 2, 3, 8, 9, 10, 11) +
             __builtin_shufflevector(x, y, 4, 5, 6, 7, 12, 13, 14, 15);
    }
    for (int i = 0; i < 2; ++i) {
      c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
             __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    }
    return __builtin_shufflevector(c[0], c[1], 0, 8, 2, 10, 4, 12, 6, 14) +
           __builtin_shufflevector(c[0], c[1], 1, 9, 3, 11, 5, 13, 7, 15);
  } else {
    const vec<4> b0 = __builtin_shufflevector(acc[0], acc[2], 0, 1, 4, 5) +
                      __builtin_shufflevector(acc[0], acc[2], 2, 3, 6, 7);
    const vec<4> b1 = __builtin_shufflevector(acc[1], acc[3], 0, 1, 4, 5) +
                      __builtin_shufflevector(acc[1], acc[3], 2, 3, 6, 7);
    return __builtin_shufflevector(b0, b1, 0, 4, 2, 6) + __builtin_shufflevector(b0, b1, 1, 5, 3, 7);
  }
}

template <int W>
PLAYGROUND_INLINE float dot(const float* a, const float* b, int64_t n) {
  vec<W> acc = {};
  int64_t i = 0;
  for (; i + W <= n; i += W) acc += load<W>(a + i) * load<W>(b + i);
  float total = lane_sum<W>(acc);
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

// The cache the kernels prefetch into: L2 (prefetcht1), which holds more misses in flight than L1; a burst of
// prefetches into L1 (prefetcht0) stalled attention's loop.
constexpr int kPrefetchLocality = 2;

}  // namespace
