// Packed 8-bit and 4-bit weights multiplied in integers: y = x W^T (+ b) reading a quarter or an eighth of
// float32's bytes.
//
// Formats (packed by engine/quant/packed.py; K, the inputs, padded with zero weights to Kp, a multiple of the chunk):
//   8-bit: int8 [N, Kp], chunks of 64, symmetric, one float32 scale per output row: W[n, k] ~ scales[n] * q[n, k],
//          |q| <= 127.
//   4-bit: uint8 [N, Kp / 2], chunks of 128, one float32 scale per group of 32 inputs (scales [N, Kp / 32]):
//          W[n, k] ~ scales[n, k / 32] * (nibble - 8). Byte j of each 128-input chunk (64 bytes) holds input j in its
//          low nibble and input j + 64 in its high one, so one load and two masks give 128 bytes in input order.
// The activations are quantized on the fly, one symmetric int8 scale per row of x (|q| <= 127), so each output is
// an exact integer dot product times the row's and the weight's scales: every kernel level computes the same
// integers (the 8-bit results are bitwise equal across levels), and a row's result does not depend on how many
// rows share the call, so a prefill of many rows and a decode step of one compute the same numbers.
//
// Per level: AVX-512 VNNI (vpdpbusd: 64 products of unsigned by signed bytes a step, summed into 16 int32; its
// unsigned operand is the weight biased by 128 for 8-bit, the raw nibble for 4-bit, corrected by a per-row term
// computed once), AVX2 (vpmaddubsw + vpmaddwd, with the sign trick for 8-bit so no pair overflows 16 bits), and
// plain C++ elsewhere. Each weight row is streamed once for up to 8 rows of x, the next rows prefetched.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>
#include <string>
#include <vector>

#include "integer_lanes.h"
#include "kernels.h"
#include "vectors.h"

namespace {

constexpr int64_t kChunk8 = 64;        // inputs per 8-bit chunk
constexpr int64_t kChunk4 = 128;       // inputs per 4-bit chunk
constexpr int64_t kGroup = 32;         // 4-bit inputs sharing a scale
constexpr int64_t kMaxRowsPerPass = 8;
constexpr int64_t kOutputsPerTask = 32;
constexpr int64_t kMaxInputs = 1 << 16;  // keeps every int32 dot product exact: 255 * 127 * 65536 < 2^31

// x quantized for one call: per row Kp int8 values (zero past K), the row's scale, and what the weight's format
// needs besides: for 8-bit the sum of the row's values (the VNNI correction), for 4-bit, per 4 consecutive values,
// -8 times their sum (the nibbles' bias).
struct QuantizedRows {
  int64_t rows = 0, inputs = 0;
  std::vector<int8_t> values;
  std::vector<float> scale;
  std::vector<int32_t> sum;
  std::vector<int32_t> nibble_bias;
};

PLAYGROUND_MULTIVERSION
void quantize_row(const float* x, int64_t K, int64_t Kp, bool eight_bit, int8_t* q, float* scale, int32_t* sum,
                  int32_t* nibble_bias) {
  float amax = 0.f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  const float inverse = amax > 0.f ? 127.f / amax : 0.f;
  int32_t total = 0;
  for (int64_t k = 0; k < K; ++k) {
    const float r = x[k] * inverse;
    const int32_t v = static_cast<int32_t>(r + (r >= 0.f ? 0.5f : -0.5f));  // round half away from zero
    q[k] = static_cast<int8_t>(v);
    total += v;
  }
  std::memset(q + K, 0, Kp - K);
  *scale = amax / 127.f;
  if (eight_bit) {
    *sum = total;
  } else {
    for (int64_t k = 0; k < Kp; k += 4) nibble_bias[k / 4] = -8 * (q[k] + q[k + 1] + q[k + 2] + q[k + 3]);
  }
}

void quantize_rows(const at::Tensor& x, int64_t Kp, bool eight_bit, QuantizedRows& out) {
  const int64_t M = x.size(0), K = x.size(1);
  out.rows = M;
  out.inputs = Kp;
  out.values.resize(M * Kp);
  out.scale.resize(M);
  out.sum.resize(eight_bit ? M : 0);
  out.nibble_bias.resize(eight_bit ? 0 : M * Kp / 4);
  const float* data = x.data_ptr<float>();
  const int64_t stride = x.stride(0);
  at::parallel_for(0, M, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(K, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      quantize_row(data + m * stride, K, Kp, eight_bit, out.values.data() + m * Kp, out.scale.data() + m,
                   out.sum.data() + (eight_bit ? m : 0), out.nibble_bias.data() + (eight_bit ? 0 : m * Kp / 4));
    }
  });
}

// What one kernel pass needs: ROWS rows of quantized x, outputs first..last - 1 of y [rows, N].
struct Pass {
  const QuantizedRows* x;
  int64_t first_row;
  const void* weight;
  const float* scales;
  const float* bias;
  float* y;
  int64_t N, first, last;
};

PLAYGROUND_INLINE float finish(const Pass& p, int64_t m, int64_t n, float total) {
  const float value = total * p.x->scale[p.first_row + m];
  return p.bias ? value + p.bias[n] : value;
}

// ---- plain C++: the reference every vector level matches ----

template <int ROWS>
void int8_rows_plain(const Pass& p) {
  const int64_t Kp = p.x->inputs;
  const int8_t* weight = static_cast<const int8_t*>(p.weight);
  for (int64_t n = p.first; n < p.last; ++n) {
    const int8_t* w = weight + n * Kp;
    for (int m = 0; m < ROWS; ++m) {
      const int8_t* q = p.x->values.data() + (p.first_row + m) * Kp;
      int32_t total = 0;
      for (int64_t k = 0; k < Kp; ++k) total += static_cast<int32_t>(w[k]) * q[k];
      p.y[m * p.N + n] = finish(p, m, n, static_cast<float>(total) * p.scales[n]);
    }
  }
}

template <int ROWS>
void int4_rows_plain(const Pass& p) {
  const int64_t Kp = p.x->inputs;
  const uint8_t* weight = static_cast<const uint8_t*>(p.weight);
  for (int64_t n = p.first; n < p.last; ++n) {
    const uint8_t* w = weight + n * Kp / 2;
    const float* s = p.scales + n * Kp / kGroup;
    for (int m = 0; m < ROWS; ++m) {
      const int8_t* q = p.x->values.data() + (p.first_row + m) * Kp;
      float total = 0.f;
      for (int64_t c = 0; c < Kp; c += kChunk4) {
        int32_t group[4] = {};
        for (int64_t j = 0; j < kChunk4 / 2; ++j) {
          const uint8_t byte = w[c / 2 + j];
          group[j / kGroup] += ((byte & 15) - 8) * q[c + j];
          group[2 + j / kGroup] += ((byte >> 4) - 8) * q[c + kChunk4 / 2 + j];
        }
        for (int g = 0; g < 4; ++g) total += static_cast<float>(group[g]) * s[c / kGroup + g];
      }
      p.y[m * p.N + n] = finish(p, m, n, total);
    }
  }
}

#if defined(PLAYGROUND_X86_LEVELS)

// ---- AVX2: 32 products a step through 16-bit pairs ----

PLAYGROUND_AVX2 PLAYGROUND_INLINE int32_t sum_lanes_avx2(__m256i v) {
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i t = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1)));
}

PLAYGROUND_AVX2 PLAYGROUND_INLINE float sum_lanes_avx2(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// 32 signed weights times 32 signed activations as 8 int32 sums of 4: |w| times x with w's sign, so each 16-bit
// pair sum is at most 2 * 127 * 127.
PLAYGROUND_AVX2 PLAYGROUND_INLINE __m256i dot32_avx2(__m256i w, __m256i q) {
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

template <int ROWS, int WIDE>
PLAYGROUND_AVX2 void int8_rows_avx2(const Pass& p) {
  const int64_t Kp = p.x->inputs;
  const int8_t* weight = static_cast<const int8_t*>(p.weight);
  const int8_t* q = p.x->values.data() + p.first_row * Kp;
  int64_t n = p.first;
  for (; n + WIDE <= p.last; n += WIDE) {
    __m256i acc[WIDE][ROWS];
    for (int j = 0; j < WIDE; ++j)
      for (int m = 0; m < ROWS; ++m) acc[j][m] = _mm256_setzero_si256();
    for (int64_t k = 0; k < Kp; k += 32) {
      __m256i w[WIDE];
      for (int j = 0; j < WIDE; ++j) {
        __builtin_prefetch(weight + (n + j + WIDE) * Kp + k, 0, kPrefetchLocality);
        w[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(weight + (n + j) * Kp + k));
      }
      for (int m = 0; m < ROWS; ++m) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + m * Kp + k));
        for (int j = 0; j < WIDE; ++j) acc[j][m] = _mm256_add_epi32(acc[j][m], dot32_avx2(w[j], x));
      }
    }
    for (int j = 0; j < WIDE; ++j)
      for (int m = 0; m < ROWS; ++m)
        p.y[m * p.N + n + j] = finish(p, m, n + j, static_cast<float>(sum_lanes_avx2(acc[j][m])) * p.scales[n + j]);
  }
  if (n < p.last) int8_rows_plain<ROWS>(Pass{p.x, p.first_row, p.weight, p.scales, p.bias, p.y, p.N, n, p.last});
}

template <int ROWS, int WIDE>
PLAYGROUND_AVX2 void int4_rows_avx2(const Pass& p) {
  const int64_t Kp = p.x->inputs;
  const uint8_t* weight = static_cast<const uint8_t*>(p.weight);
  const int8_t* q = p.x->values.data() + p.first_row * Kp;
  const int32_t* bias4 = p.x->nibble_bias.data() + p.first_row * Kp / 4;
  const __m256i low_nibbles = _mm256_set1_epi8(15);
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t n = p.first;
  for (; n + WIDE <= p.last; n += WIDE) {
    __m256 acc[WIDE][ROWS];
    for (int j = 0; j < WIDE; ++j)
      for (int m = 0; m < ROWS; ++m) acc[j][m] = _mm256_setzero_ps();
    for (int64_t k = 0; k < Kp; k += kChunk4) {
      for (int half = 0; half < 2; ++half) {  // bytes 32 * half ..: groups `half` (low nibbles) and 2 + half (high)
        __m256i low[WIDE], high[WIDE];
        __m256 scale_low[WIDE], scale_high[WIDE];
        for (int j = 0; j < WIDE; ++j) {
          const uint8_t* row = weight + (n + j) * Kp / 2 + k / 2 + 32 * half;
          __builtin_prefetch(row + WIDE * Kp / 2, 0, kPrefetchLocality);
          const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
          low[j] = _mm256_and_si256(packed, low_nibbles);
          high[j] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low_nibbles);
          const float* s = p.scales + (n + j) * Kp / kGroup + k / kGroup;
          scale_low[j] = _mm256_broadcast_ss(s + half);
          scale_high[j] = _mm256_broadcast_ss(s + 2 + half);
        }
        for (int m = 0; m < ROWS; ++m) {
          const int64_t low_at = m * Kp + k + kGroup * half, high_at = low_at + kChunk4 / 2;
          const __m256i x_low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + low_at));
          const __m256i x_high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + high_at));
          const __m256i bias_low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias4 + low_at / 4));
          const __m256i bias_high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias4 + high_at / 4));
          for (int j = 0; j < WIDE; ++j) {
            const __m256i dot_low =
                _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(low[j], x_low), ones), bias_low);
            const __m256i dot_high =
                _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(high[j], x_high), ones), bias_high);
            acc[j][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_low), scale_low[j], acc[j][m]);
            acc[j][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_high), scale_high[j], acc[j][m]);
          }
        }
      }
    }
    for (int j = 0; j < WIDE; ++j)
      for (int m = 0; m < ROWS; ++m) p.y[m * p.N + n + j] = finish(p, m, n + j, sum_lanes_avx2(acc[j][m]));
  }
  if (n < p.last) int4_rows_plain<ROWS>(Pass{p.x, p.first_row, p.weight, p.scales, p.bias, p.y, p.N, n, p.last});
}

// ---- AVX-512 VNNI: 64 products a step into 16 int32 ----

PLAYGROUND_VNNI PLAYGROUND_INLINE __m128 sum4_ps(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 abcd = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
                                    _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(abcd),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

// Outputs n..n+3 of row m from their float totals (before the row's scale).
PLAYGROUND_VNNI PLAYGROUND_INLINE void finish4(const Pass& p, int64_t m, int64_t n, __m128 totals) {
  __m128 value = _mm_mul_ps(totals, _mm_set1_ps(p.x->scale[p.first_row + m]));
  if (p.bias) value = _mm_add_ps(value, _mm_loadu_ps(p.bias + n));
  _mm_storeu_ps(p.y + m * p.N + n, value);
}

// WIDE is a multiple of 4: accumulators are summed four at a time.
template <int ROWS, int WIDE>
PLAYGROUND_VNNI void int8_rows_vnni(const Pass& p) {
  const int64_t Kp = p.x->inputs;
  const int8_t* weight = static_cast<const int8_t*>(p.weight);
  const int8_t* q = p.x->values.data() + p.first_row * Kp;
  const __m512i bias128 = _mm512_set1_epi8(static_cast<char>(0x80));  // w ^ 0x80 = w + 128 as an unsigned byte
  int64_t n = p.first;
  for (; n + WIDE <= p.last; n += WIDE) {
    __m512i acc[WIDE][ROWS];
    for (int j = 0; j < WIDE; ++j)
      for (int m = 0; m < ROWS; ++m) acc[j][m] = _mm512_setzero_si512();
    for (int64_t k = 0; k < Kp; k += kChunk8) {
      __m512i w[WIDE];
      for (int j = 0; j < WIDE; ++j) {
        __builtin_prefetch(weight + (n + j + WIDE) * Kp + k, 0, kPrefetchLocality);
        w[j] = _mm512_xor_si512(_mm512_loadu_si512(weight + (n + j) * Kp + k), bias128);
      }
      for (int m = 0; m < ROWS; ++m) {
        const __m512i x = _mm512_loadu_si512(q + m * Kp + k);
        for (int j = 0; j < WIDE; ++j) acc[j][m] = _mm512_dpbusd_epi32(acc[j][m], w[j], x);
      }
    }
    for (int m = 0; m < ROWS; ++m) {
      const __m128i correction = _mm_set1_epi32(128 * p.x->sum[p.first_row + m]);
      for (int j = 0; j < WIDE; j += 4) {
        const __m128i totals = _mm_sub_epi32(sum4_epi32(acc[j][m], acc[j + 1][m], acc[j + 2][m], acc[j + 3][m]),
                                             correction);
        finish4(p, m, n + j, _mm_mul_ps(_mm_cvtepi32_ps(totals), _mm_loadu_ps(p.scales + n + j)));
      }
    }
  }
  if (n < p.last) int8_rows_plain<ROWS>(Pass{p.x, p.first_row, p.weight, p.scales, p.bias, p.y, p.N, n, p.last});
}

template <int ROWS, int WIDE>
PLAYGROUND_VNNI void int4_rows_vnni(const Pass& p) {
  const int64_t Kp = p.x->inputs;
  const uint8_t* weight = static_cast<const uint8_t*>(p.weight);
  const int8_t* q = p.x->values.data() + p.first_row * Kp;
  const int32_t* bias4 = p.x->nibble_bias.data() + p.first_row * Kp / 4;
  const __m512i low_nibbles = _mm512_set1_epi8(15);
  // Lanes 0-7 of a 64-input half cover its first group of 32, lanes 8-15 its second.
  const __m512i first_groups = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m512i last_groups = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
  int64_t n = p.first;
  for (; n + WIDE <= p.last; n += WIDE) {
    __m512 acc[WIDE][ROWS];
    for (int j = 0; j < WIDE; ++j)
      for (int m = 0; m < ROWS; ++m) acc[j][m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < Kp; k += kChunk4) {
      // One weight row at a time (its nibbles and scales live only while it is used): with the x rows reloaded from
      // L1 for each, four weight rows by four x rows of accumulators fit the 32 registers.
      for (int j = 0; j < WIDE; ++j) {
        const uint8_t* row = weight + (n + j) * Kp / 2 + k / 2;
        __builtin_prefetch(row + WIDE * Kp / 2, 0, kPrefetchLocality);
        const __m512i packed = _mm512_loadu_si512(row);
        const __m512i low = _mm512_and_si512(packed, low_nibbles);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles);
        const __m512 four = _mm512_castps128_ps512(_mm_loadu_ps(p.scales + (n + j) * Kp / kGroup + k / kGroup));
        const __m512 scale_low = _mm512_permutexvar_ps(first_groups, four);
        const __m512 scale_high = _mm512_permutexvar_ps(last_groups, four);
        for (int m = 0; m < ROWS; ++m) {
          const int8_t* x = q + m * Kp + k;
          const int32_t* bias = bias4 + (m * Kp + k) / 4;
          const __m512i dot_low = _mm512_dpbusd_epi32(_mm512_loadu_si512(bias), low, _mm512_loadu_si512(x));
          const __m512i dot_high =
              _mm512_dpbusd_epi32(_mm512_loadu_si512(bias + 16), high, _mm512_loadu_si512(x + kChunk4 / 2));
          acc[j][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_low), scale_low, acc[j][m]);
          acc[j][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_high), scale_high, acc[j][m]);
        }
      }
    }
    for (int m = 0; m < ROWS; ++m)
      for (int j = 0; j < WIDE; j += 4)
        finish4(p, m, n + j, sum4_ps(acc[j][m], acc[j + 1][m], acc[j + 2][m], acc[j + 3][m]));
  }
  if (n < p.last) int4_rows_plain<ROWS>(Pass{p.x, p.first_row, p.weight, p.scales, p.bias, p.y, p.N, n, p.last});
}


#endif  // PLAYGROUND_X86_LEVELS

using PassFunction = void (*)(const Pass&);

// The pass for `rows` (1..8) rows of x: weight rows per pass chosen so that every accumulator, weight vector and x
// vector stays in registers (32 with AVX-512, 16 with AVX2).
struct PackedKernels {
  PassFunction int8[kMaxRowsPerPass];
  PassFunction int4[kMaxRowsPerPass];
};

#define PLAYGROUND_ROWS_TABLE(FN, W1, W2, W4, W8)                                                                \
  { FN<1, W1>, FN<2, W2>, FN<3, W4>, FN<4, W4>, FN<5, W8>, FN<6, W8>, FN<7, W8>, FN<8, W8> }

template <int ROWS, int WIDE>
void int8_plain(const Pass& p) { int8_rows_plain<ROWS>(p); }
template <int ROWS, int WIDE>
void int4_plain(const Pass& p) { int4_rows_plain<ROWS>(p); }

const PackedKernels kPlain{PLAYGROUND_ROWS_TABLE(int8_plain, 1, 1, 1, 1), PLAYGROUND_ROWS_TABLE(int4_plain, 1, 1, 1, 1)};
#if defined(PLAYGROUND_X86_LEVELS)
const PackedKernels kAvx2{PLAYGROUND_ROWS_TABLE(int8_rows_avx2, 4, 4, 2, 1),
                          PLAYGROUND_ROWS_TABLE(int4_rows_avx2, 2, 2, 1, 1)};
// More than 4 rows of x: two passes (4 rows, then the rest), so that the accumulators stay in registers.
template <int ROWS>
void int8_vnni_in_two(const Pass& p) {
  int8_rows_vnni<4, 4>(p);
  int8_rows_vnni<ROWS - 4, ROWS <= 6 ? 8 : 4>(Pass{p.x, p.first_row + 4, p.weight, p.scales, p.bias, p.y + 4 * p.N,
                                                    p.N, p.first, p.last});
}

template <int ROWS>
void int4_vnni_in_two(const Pass& p) {
  int4_rows_vnni<4, 4>(p);
  int4_rows_vnni<ROWS - 4, 4>(Pass{p.x, p.first_row + 4, p.weight, p.scales, p.bias, p.y + 4 * p.N, p.N, p.first,
                                   p.last});
}

const PackedKernels kVnni{
    {int8_rows_vnni<1, 8>, int8_rows_vnni<2, 8>, int8_rows_vnni<3, 4>, int8_rows_vnni<4, 4>, int8_vnni_in_two<5>,
     int8_vnni_in_two<6>, int8_vnni_in_two<7>, int8_vnni_in_two<8>},
    {int4_rows_vnni<1, 4>, int4_rows_vnni<2, 4>, int4_rows_vnni<3, 4>, int4_rows_vnni<4, 4>, int4_vnni_in_two<5>,
     int4_vnni_in_two<6>, int4_vnni_in_two<7>, int4_vnni_in_two<8>}};
#endif
#undef PLAYGROUND_ROWS_TABLE

#if defined(PLAYGROUND_X86_LEVELS)
constexpr const PackedKernels* kX86[2] = {&kAvx2, &kVnni};
#else
constexpr const PackedKernels* kX86[2] = {nullptr, nullptr};
#endif

// The kernels for the active kernel level (integer_path).
const PackedKernels& packed_kernels() {
  return by_integer_path(playground_cpu::active_level_name(), kPlain, kX86[0], kX86[1]);
}

// Which instructions packed_linear runs now ("vnni", "avx2" or "plain"): tests compare every one.
std::string packed_kernel_name() {
  const PackedKernels* kernels = &packed_kernels();
#if defined(PLAYGROUND_X86_LEVELS)
  if (kernels == &kVnni) return "vnni";
  if (kernels == &kAvx2) return "avx2";
#endif
  return "plain";
}

thread_local QuantizedRows quantized_x;

}  // namespace

at::Tensor playground_cpu::packed_linear(const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor& scales,
                                         const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x_in.device().is_cpu() && x_in.scalar_type() == at::kFloat && x_in.dim() == 2, "x must be [M, K] float32");
  TORCH_CHECK(packed.device().is_cpu() && packed.is_contiguous() && packed.dim() == 2, "packed weight must be 2-D");
  TORCH_CHECK(scales.device().is_cpu() && scales.scalar_type() == at::kFloat && scales.is_contiguous(),
              "scales must be contiguous float32");
  const bool eight_bit = packed.scalar_type() == at::kChar;
  TORCH_CHECK(eight_bit || packed.scalar_type() == at::kByte, "packed weight must be int8 (8-bit) or uint8 (4-bit)");
  const at::Tensor x = x_in.stride(1) == 1 ? x_in : x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0);
  const int64_t Kp = eight_bit ? packed.size(1) : 2 * packed.size(1);
  const int64_t chunk = eight_bit ? kChunk8 : kChunk4;
  TORCH_CHECK(Kp % chunk == 0 && K <= Kp && Kp - K < chunk, "packed weight has ", Kp, " inputs, x has ", K);
  TORCH_CHECK(Kp <= kMaxInputs, "at most ", kMaxInputs, " inputs");
  TORCH_CHECK(scales.numel() == (eight_bit ? N : N * Kp / kGroup), "scales do not fit the packed weight");
  const float* bias_data = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N,
                "bias must be float32 with one value per output");
    bias_data = bias->data_ptr<float>();
  }
  QuantizedRows& rows = quantized_x;
  quantize_rows(x, Kp, eight_bit, rows);
  at::Tensor y = at::empty({M, N}, x.options());
  const PackedKernels& kernels = packed_kernels();
  const int64_t tasks = (N + kOutputsPerTask - 1) / kOutputsPerTask;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    const int64_t first = begin * kOutputsPerTask, last = std::min(N, end * kOutputsPerTask);
    for (int64_t m = 0; m < M; m += kMaxRowsPerPass) {
      const int64_t count = std::min(kMaxRowsPerPass, M - m);
      const Pass pass{&rows, m, packed.data_ptr(), scales.data_ptr<float>(), bias_data, y.data_ptr<float>() + m * N,
                      N, first, last};
      (eight_bit ? kernels.int8 : kernels.int4)[count - 1](pass);
    }
  });
  return y;
}

TORCH_LIBRARY_FRAGMENT(playground_cpu, m) {
  m.def("packed_linear(Tensor x, Tensor packed, Tensor scales, Tensor? bias) -> Tensor");
  m.def("packed_kernel_name() -> str", &packed_kernel_name);
}

TORCH_LIBRARY_IMPL(playground_cpu, CPU, m) {
  m.impl("packed_linear", &playground_cpu::packed_linear);
}
