// The integer half of attention over an int8 KV pool: a chunk's scores and its weighted sum of values as exact int32
// dot products, so that no key or value is ever widened to float32.
//
// cpu_kernels.cpp's attention quantizes each query row to int16 (one scale per row, |q| <= 32767) and each row's
// softmax weights times the values' scales over a chunk to int16 (one scale per chunk, 0..32767), and does the
// float arithmetic around these sums (the scales, the online softmax). Sixteen bits keep the rounding of the query and of the weights
// two orders of magnitude below the pool's own 8-bit rounding; the sums are exact, so every level here computes the
// same integers. Keys and values are sign-extended to int16 once per chunk into `scratch` (in L1), then every query
// row of the chunk reads them: per 32 products, one multiply-add of 16-bit pairs into int32 (AVX-512 VNNI
// vpdpwssd; AVX2 vpmaddwd + vpaddd), where widening to float32 took three instructions per 16 values and a float
// multiply-add per 16 products. For the values the pairs are two keys' values at one dimension, interleaved as the
// chunk is widened, multiplied by the two keys' weights.
//
// Bounds that keep every int32 exact: scores |q k| <= 32767 * 128 per product over at most kMaxInt8HeadDim
// dimensions; values 32767 * 128 per product over at most kChunkKeys keys.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "integer_lanes.h"
#include "kernels.h"
#include "vectors.h"

namespace {

using playground_cpu::kChunkKeys;

// The second key of the last pair when a chunk has an odd number of keys: the last key again, with weight 0.
PLAYGROUND_INLINE const int8_t* pair_partner(const int8_t* const* rows, int64_t t, int64_t count) {
  return rows[t + 1 < count ? t + 1 : t];
}

// Weights t and t + 1 of a row as one int32 (t in the low half): the two factors of one 16-bit pair. The weights
// past a chunk's `count` are 0 (Int8KVOps), so an odd count pairs its last key with a weight of 0.
PLAYGROUND_INLINE int32_t weight_pair(const int16_t* weights) {
  int32_t pair;
  std::memcpy(&pair, weights, sizeof(pair));
  return pair;
}

// ---- plain C++: the reference every level must equal ----

void scores_plain(const int8_t* const* keys, int64_t count, const int16_t* queries, int64_t rows, int64_t dim,
                  int16_t*, int32_t* raw) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < count; ++t) {
      int32_t total = 0;
      for (int64_t d = 0; d < dim; ++d) total += int32_t{queries[r * dim + d]} * int32_t{keys[t][d]};
      raw[r * kChunkKeys + t] = total;
    }
  }
}

void values_plain(const int8_t* const* values, int64_t count, const int16_t* weights, int64_t rows, int64_t dim,
                  int16_t*, int32_t* sums) {
  for (int64_t r = 0; r < rows; ++r) {
    int32_t* out = sums + r * dim;
    std::fill(out, out + dim, 0);
    for (int64_t t = 0; t < count; ++t) {
      const int32_t w = weights[r * kChunkKeys + t];
      for (int64_t d = 0; d < dim; ++d) out[d] += w * int32_t{values[t][d]};
    }
  }
}

#if defined(PLAYGROUND_X86_LEVELS)

// ---- AVX2: 16 pairs a step (vpmaddwd) ----
//
// Both paths are templates over STEPS, the vectors of 16-bit lanes one row of `dim` takes, so that a row's query and
// accumulators stay in registers; `with_constant` picks the instance for the call's `dim`.

// f.template operator()<N>() for the runtime n in 1..MAX (nothing for other n).
template <int MAX, typename F>
PLAYGROUND_INLINE void with_constant(int64_t n, F&& f) {
  [&]<int... S>(std::integer_sequence<int, S...>) {
    ((n == S + 1 ? (f.template operator()<S + 1>(), 0) : 0), ...);
  }(std::make_integer_sequence<int, MAX>{});
}

// Keys [count, dim] sign-extended to int16 rows of `dim`, padded with zero rows to a multiple of 4.
template <int STEPS>
PLAYGROUND_AVX2 void widen_keys_avx2(const int8_t* const* keys, int64_t count, int16_t* out) {
  constexpr int64_t dim = STEPS * 16;
  for (int64_t t = 0; t < count; ++t) {
    for (int s = 0; s < STEPS; ++s) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(keys[t] + s * 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + t * dim + s * 16), _mm256_cvtepi8_epi16(bytes));
    }
  }
  std::memset(out + count * dim, 0, ((-count) & 3) * dim * sizeof(int16_t));
}

template <int STEPS>
PLAYGROUND_AVX2 void scores_avx2_steps(const int8_t* const* keys, int64_t count, const int16_t* queries, int64_t rows,
                                       int16_t* scratch, int32_t* raw) {
  constexpr int64_t dim = STEPS * 16;
  widen_keys_avx2<STEPS>(keys, count, scratch);
  for (int64_t r = 0; r < rows; ++r) {
    __m256i q[STEPS];
    for (int s = 0; s < STEPS; ++s) q[s] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(queries + r * dim + s * 16));
    for (int64_t t = 0; t < count; t += 4) {
      __m256i acc[4];
      for (int j = 0; j < 4; ++j) {
        acc[j] = _mm256_setzero_si256();
        for (int s = 0; s < STEPS; ++s) {
          const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scratch + (t + j) * dim + s * 16));
          acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(k, q[s]));
        }
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(raw + r * kChunkKeys + t), sum4_epi32(acc[0], acc[1], acc[2], acc[3]));
    }
  }
}

void scores_avx2(const int8_t* const* keys, int64_t count, const int16_t* queries, int64_t rows, int64_t dim,
                 int16_t* scratch, int32_t* raw) {
  with_constant<16>(dim / 16, [&]<int STEPS>() { scores_avx2_steps<STEPS>(keys, count, queries, rows, scratch, raw); });
}

// Pairs of keys' values interleaved as int16: for pair p and 16 dimensions from d, one vector "lo" holding
// (v_2p[d + i], v_2p+1[d + i]) for i = 0..3 and 8..11, and one "hi" for i = 4..7 and 12..15 (vpunpck works within
// 128-bit lanes); values_avx2 puts the dimensions back in order once per row.
template <int STEPS>
PLAYGROUND_AVX2 void interleave_values_avx2(const int8_t* const* values, int64_t count, int16_t* out) {
  constexpr int64_t dim = STEPS * 16;
  for (int64_t t = 0; t < count; t += 2) {
    const int8_t* first = values[t];
    const int8_t* second = pair_partner(values, t, count);
    for (int s = 0; s < STEPS; ++s) {
      const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(first + s * 16)));
      const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(second + s * 16)));
      __m256i* to = reinterpret_cast<__m256i*>(out + (t / 2) * 2 * dim + 2 * s * 16);
      _mm256_storeu_si256(to, _mm256_unpacklo_epi16(a, b));
      _mm256_storeu_si256(to + 1, _mm256_unpackhi_epi16(a, b));
    }
  }
}

template <int STEPS>
PLAYGROUND_AVX2 void values_avx2_steps(const int8_t* const* values, int64_t count, const int16_t* weights, int64_t rows,
                                       int16_t* scratch, int32_t* sums) {
  constexpr int64_t dim = STEPS * 16;
  interleave_values_avx2<STEPS>(values, count, scratch);
  for (int64_t r = 0; r < rows; ++r) {
    __m256i lo[STEPS], hi[STEPS];
    for (int s = 0; s < STEPS; ++s) lo[s] = hi[s] = _mm256_setzero_si256();
    for (int64_t t = 0; t < count; t += 2) {
      const __m256i w = _mm256_set1_epi32(weight_pair(weights + r * kChunkKeys + t));
      const __m256i* from = reinterpret_cast<const __m256i*>(scratch + (t / 2) * 2 * dim);
      for (int s = 0; s < STEPS; ++s) {
        lo[s] = _mm256_add_epi32(lo[s], _mm256_madd_epi16(_mm256_loadu_si256(from + 2 * s), w));
        hi[s] = _mm256_add_epi32(hi[s], _mm256_madd_epi16(_mm256_loadu_si256(from + 2 * s + 1), w));
      }
    }
    for (int s = 0; s < STEPS; ++s) {
      __m256i* out = reinterpret_cast<__m256i*>(sums + r * dim + s * 16);
      _mm256_storeu_si256(out, _mm256_permute2x128_si256(lo[s], hi[s], 0x20));
      _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(lo[s], hi[s], 0x31));
    }
  }
}

void values_avx2(const int8_t* const* values, int64_t count, const int16_t* weights, int64_t rows, int64_t dim,
                 int16_t* scratch, int32_t* sums) {
  with_constant<16>(dim / 16, [&]<int STEPS>() { values_avx2_steps<STEPS>(values, count, weights, rows, scratch, sums); });
}

// ---- AVX-512 VNNI: 32 pairs a step (vpdpwssd) ----

template <int STEPS>
PLAYGROUND_VNNI void widen_keys_vnni(const int8_t* const* keys, int64_t count, int16_t* out) {
  constexpr int64_t dim = STEPS * 32;
  for (int64_t t = 0; t < count; ++t) {
    for (int s = 0; s < STEPS; ++s) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keys[t] + s * 32));
      _mm512_storeu_si512(out + t * dim + s * 32, _mm512_cvtepi8_epi16(bytes));
    }
  }
  std::memset(out + count * dim, 0, ((-count) & 3) * dim * sizeof(int16_t));
}

template <int STEPS>
PLAYGROUND_VNNI void scores_vnni_steps(const int8_t* const* keys, int64_t count, const int16_t* queries, int64_t rows,
                                       int16_t* scratch, int32_t* raw) {
  constexpr int64_t dim = STEPS * 32;
  widen_keys_vnni<STEPS>(keys, count, scratch);
  for (int64_t r = 0; r < rows; ++r) {
    __m512i q[STEPS];
    for (int s = 0; s < STEPS; ++s) q[s] = _mm512_loadu_si512(queries + r * dim + s * 32);
    for (int64_t t = 0; t < count; t += 4) {
      __m512i acc[4];
      for (int j = 0; j < 4; ++j) {
        acc[j] = _mm512_setzero_si512();
        for (int s = 0; s < STEPS; ++s) {
          acc[j] = _mm512_dpwssd_epi32(acc[j], _mm512_loadu_si512(scratch + (t + j) * dim + s * 32), q[s]);
        }
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(raw + r * kChunkKeys + t), sum4_epi32(acc[0], acc[1], acc[2], acc[3]));
    }
  }
}

// For a few query rows (a decode step's rows of one KV head: its group of query heads) widening a chunk into
// scratch costs as much as the products: each key is widened into registers and used there by every row.
constexpr int64_t kRegisterVectors = 8;  // ROWS x STEPS of queries (or of value accumulators) kept in registers

template <int STEPS, int ROWS>
PLAYGROUND_VNNI void scores_vnni_registers(const int8_t* const* keys, int64_t count, const int16_t* queries,
                                           int32_t* raw) {
  constexpr int64_t dim = STEPS * 32;
  __m512i q[ROWS][STEPS];
  for (int r = 0; r < ROWS; ++r)
    for (int s = 0; s < STEPS; ++s) q[r][s] = _mm512_loadu_si512(queries + r * dim + s * 32);
  for (int64_t t = 0; t < count; t += 4) {
    __m512i k[4][STEPS];
    for (int j = 0; j < 4; ++j) {
      const int8_t* key = keys[std::min<int64_t>(t + j, count - 1)];  // past count: a score nobody reads
      for (int s = 0; s < STEPS; ++s)
        k[j][s] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + s * 32)));
    }
    for (int r = 0; r < ROWS; ++r) {
      __m512i acc[4];
      for (int j = 0; j < 4; ++j) {
        acc[j] = _mm512_setzero_si512();
        for (int s = 0; s < STEPS; ++s) acc[j] = _mm512_dpwssd_epi32(acc[j], k[j][s], q[r][s]);
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(raw + r * kChunkKeys + t), sum4_epi32(acc[0], acc[1], acc[2], acc[3]));
    }
  }
}

// registers.template operator()<STEPS, ROWS>() where ROWS x STEPS vectors fit kRegisterVectors, else
// scratch.template operator()<STEPS>(), for `dim` = STEPS x 32.
template <typename Scratch, typename Registers>
PLAYGROUND_INLINE void by_rows(int64_t rows, int64_t dim, Scratch&& scratch, Registers&& registers) {
  with_constant<8>(dim / 32, [&]<int STEPS>() {
    if (rows * STEPS > kRegisterVectors) return scratch.template operator()<STEPS>();
    with_constant<kRegisterVectors>(rows, [&]<int ROWS>() {
      if constexpr (ROWS * STEPS <= kRegisterVectors) registers.template operator()<STEPS, ROWS>();
    });
  });
}

void scores_vnni(const int8_t* const* keys, int64_t count, const int16_t* queries, int64_t rows, int64_t dim,
                 int16_t* scratch, int32_t* raw) {
  by_rows(rows, dim, [&]<int STEPS>() { scores_vnni_steps<STEPS>(keys, count, queries, rows, scratch, raw); },
          [&]<int STEPS, int ROWS>() { scores_vnni_registers<STEPS, ROWS>(keys, count, queries, raw); });
}

// 32 dimensions' sums in order, from the "lo" and "hi" accumulators of interleaved pairs (below).
PLAYGROUND_VNNI inline __attribute__((always_inline)) void store_in_order(int32_t* out, __m512i lo, __m512i hi) {
  const __m512i first_half = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second_half = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  _mm512_storeu_si512(out, _mm512_permutex2var_epi32(lo, first_half, hi));
  _mm512_storeu_si512(out + 16, _mm512_permutex2var_epi32(lo, second_half, hi));
}

// As interleave_values_avx2, 32 dimensions at a time: "lo" holds i = 0..3, 8..11, 16..19, 24..27, "hi" the rest.
template <int STEPS>
PLAYGROUND_VNNI void interleave_values_vnni(const int8_t* const* values, int64_t count, int16_t* out) {
  constexpr int64_t dim = STEPS * 32;
  for (int64_t t = 0; t < count; t += 2) {
    const int8_t* first = values[t];
    const int8_t* second = pair_partner(values, t, count);
    for (int s = 0; s < STEPS; ++s) {
      const __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + s * 32)));
      const __m512i b = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(second + s * 32)));
      int16_t* to = out + (t / 2) * 2 * dim + 2 * s * 32;
      _mm512_storeu_si512(to, _mm512_unpacklo_epi16(a, b));
      _mm512_storeu_si512(to + 32, _mm512_unpackhi_epi16(a, b));
    }
  }
}

template <int STEPS>
PLAYGROUND_VNNI void values_vnni_steps(const int8_t* const* values, int64_t count, const int16_t* weights, int64_t rows,
                                       int16_t* scratch, int32_t* sums) {
  constexpr int64_t dim = STEPS * 32;
  interleave_values_vnni<STEPS>(values, count, scratch);
  for (int64_t r = 0; r < rows; ++r) {
    __m512i lo[STEPS], hi[STEPS];
    for (int s = 0; s < STEPS; ++s) lo[s] = hi[s] = _mm512_setzero_si512();
    for (int64_t t = 0; t < count; t += 2) {
      const __m512i w = _mm512_set1_epi32(weight_pair(weights + r * kChunkKeys + t));
      const int16_t* from = scratch + (t / 2) * 2 * dim;
      for (int s = 0; s < STEPS; ++s) {
        lo[s] = _mm512_dpwssd_epi32(lo[s], _mm512_loadu_si512(from + 2 * s * 32), w);
        hi[s] = _mm512_dpwssd_epi32(hi[s], _mm512_loadu_si512(from + 2 * s * 32 + 32), w);
      }
    }
    for (int s = 0; s < STEPS; ++s) store_in_order(sums + r * dim + s * 32, lo[s], hi[s]);
  }
}

// values_vnni_steps for a few rows: each pair of value rows interleaved in registers and used there by every row.
template <int STEPS, int ROWS>
PLAYGROUND_VNNI void values_vnni_registers(const int8_t* const* values, int64_t count, const int16_t* weights,
                                           int32_t* sums) {
  constexpr int64_t dim = STEPS * 32;
  __m512i lo[ROWS][STEPS], hi[ROWS][STEPS];
  for (int r = 0; r < ROWS; ++r)
    for (int s = 0; s < STEPS; ++s) lo[r][s] = hi[r][s] = _mm512_setzero_si512();
  for (int64_t t = 0; t < count; t += 2) {
    const int8_t* first = values[t];
    const int8_t* second = pair_partner(values, t, count);
    __m512i w[ROWS];
    for (int r = 0; r < ROWS; ++r) w[r] = _mm512_set1_epi32(weight_pair(weights + r * kChunkKeys + t));
    for (int s = 0; s < STEPS; ++s) {
      const __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + s * 32)));
      const __m512i b = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(second + s * 32)));
      const __m512i pairs_lo = _mm512_unpacklo_epi16(a, b), pairs_hi = _mm512_unpackhi_epi16(a, b);
      for (int r = 0; r < ROWS; ++r) {
        lo[r][s] = _mm512_dpwssd_epi32(lo[r][s], pairs_lo, w[r]);
        hi[r][s] = _mm512_dpwssd_epi32(hi[r][s], pairs_hi, w[r]);
      }
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int s = 0; s < STEPS; ++s) store_in_order(sums + r * dim + s * 32, lo[r][s], hi[r][s]);
}

void values_vnni(const int8_t* const* values, int64_t count, const int16_t* weights, int64_t rows, int64_t dim,
                 int16_t* scratch, int32_t* sums) {
  by_rows(rows, dim, [&]<int STEPS>() { values_vnni_steps<STEPS>(values, count, weights, rows, scratch, sums); },
          [&]<int STEPS, int ROWS>() { values_vnni_registers<STEPS, ROWS>(values, count, weights, sums); });
}

#endif  // PLAYGROUND_X86_LEVELS

const playground_cpu::Int8KVOps kPlain{scores_plain, values_plain, "plain"};
#if defined(PLAYGROUND_X86_LEVELS)
const playground_cpu::Int8KVOps kAvx2{scores_avx2, values_avx2, "avx2"};
const playground_cpu::Int8KVOps kVnni{scores_vnni, values_vnni, "vnni"};
constexpr const playground_cpu::Int8KVOps* kX86[2] = {&kAvx2, &kVnni};
#else
constexpr const playground_cpu::Int8KVOps* kX86[2] = {nullptr, nullptr};
#endif

}  // namespace

const playground_cpu::Int8KVOps& playground_cpu::int8_kv_ops(const char* level) {
  return by_integer_path(level, kPlain, kX86[0], kX86[1]);
}

namespace {

// The integer sums over one chunk on kernel level `level`'s path, for tests: `keys` and `values` [count, dim + 4] int8 pool rows,
// `queries` [rows, dim] int16, `weights` [rows, kChunkKeys] int16 (0 past count). Returns the raw scores
// [rows, count] and the sums [rows, dim], both int32.
std::tuple<at::Tensor, at::Tensor> int8_kv_chunk_sums(const at::Tensor& keys, const at::Tensor& values,
                                                      const at::Tensor& queries, const at::Tensor& weights,
                                                      const std::string& level) {
  using playground_cpu::kMaxInt8HeadDim;
  const int64_t count = keys.size(0), dim = queries.size(1), rows = queries.size(0);
  TORCH_CHECK(keys.scalar_type() == at::kChar && values.scalar_type() == at::kChar && keys.is_contiguous() &&
              values.is_contiguous() && keys.sizes() == values.sizes() && keys.size(1) == dim + 4,
              "keys and values must be contiguous int8 [count, dim + 4]");
  TORCH_CHECK(count >= 1 && count <= kChunkKeys, "a chunk holds 1 to ", kChunkKeys, " keys");
  TORCH_CHECK(dim % 32 == 0 && dim <= kMaxInt8HeadDim, "dim must be a multiple of 32 up to ", kMaxInt8HeadDim);
  TORCH_CHECK(queries.scalar_type() == at::kShort && queries.is_contiguous(), "queries must be contiguous int16");
  TORCH_CHECK(weights.scalar_type() == at::kShort && weights.is_contiguous() && weights.size(0) == rows &&
              weights.size(1) == kChunkKeys, "weights must be contiguous int16 [rows, ", kChunkKeys, "]");
  const playground_cpu::Int8KVOps& ops = playground_cpu::int8_kv_ops(level.c_str());
  std::vector<int16_t> scratch(kChunkKeys * dim);
  std::vector<const int8_t*> key_rows(count), value_rows(count);
  for (int64_t t = 0; t < count; ++t) {
    key_rows[t] = keys.data_ptr<int8_t>() + t * (dim + 4);
    value_rows[t] = values.data_ptr<int8_t>() + t * (dim + 4);
  }
  at::Tensor raw = at::zeros({rows, kChunkKeys}, keys.options().dtype(at::kInt));
  at::Tensor sums = at::empty({rows, dim}, keys.options().dtype(at::kInt));
  ops.scores(key_rows.data(), count, queries.data_ptr<int16_t>(), rows, dim, scratch.data(), raw.data_ptr<int32_t>());
  ops.values(value_rows.data(), count, weights.data_ptr<int16_t>(), rows, dim, scratch.data(), sums.data_ptr<int32_t>());
  return {raw.narrow(1, 0, count), sums};
}

std::string int8_kv_path(const std::string& level) { return playground_cpu::int8_kv_ops(level.c_str()).name; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(playground_cpu, m) {
  m.def("int8_kv_chunk_sums(Tensor keys, Tensor values, Tensor queries, Tensor weights, str level) -> "
        "(Tensor, Tensor)");
  m.def("int8_kv_path(str level) -> str", &int8_kv_path);
}

TORCH_LIBRARY_IMPL(playground_cpu, CPU, m) {
  m.impl("int8_kv_chunk_sums", &int8_kv_chunk_sums);
}
