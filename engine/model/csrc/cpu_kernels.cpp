// CPU kernels for the native engine's decode path (float32), registered as torch operators.
//
// paged_attention: attention of a step's query tokens over K/V read in place from the paged pool,
//   block by block through each sequence's block table, with an online softmax (one pass, no
//   padded copy of the cache, no read of a slot past a query's causal limit). One work item is
//   one (sequence, KV head): all query tokens of that sequence and all query heads sharing that
//   KV head read each K/V block once while it is in L1. The pool may be float32, bfloat16 or int8
//   rows with an inline float32 scale (engine/model/kv_format.py): store_kv converts as it writes,
//   and attention widens each row to float32 in registers as it reads (an int8 key's dot product
//   and a value's softmax weight are multiplied by the row's scale once).
// small_batch_linear: y = x W^T (+ b) for a handful of rows (decode batches), reading each weight
//   row once for all rows of x; MKL's GEMM is several times slower than its own GEMV at 2-8 rows.
//
// Work is spread over torch's intra-op threads (at::parallel_for). Hot loops are compiled once per
// x86-64 level (AVX-512, AVX2, baseline) and picked at load time, so one build runs on any x86-64. The two
// whose tiles must fit the vector registers (attention's key chunks, the small-batch matmul's accumulators)
// are templates over the vector width, instantiated per level at that level's width (16, 8 or 4 floats):
// tiles sized for AVX-512's 32 registers spill on AVX2's 16 (attention 2x, the matmul 3-9x slower there, measured).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "vectors.h"


namespace {

// What the KV pool's rows hold (engine/model/kv_format.py): float32, bfloat16, or int8 values then a float32 scale.
enum class KVKind { kFloat, kBFloat16, kInt8 };

// W bfloat16 (as bits), their float32 bits, W int8 and W int16: what KVRow widens to a vector of W floats.
template <int W> struct NarrowLanes;
template <> struct NarrowLanes<4> {
  typedef uint16_t halves __attribute__((vector_size(8)));
  typedef int16_t shorts __attribute__((vector_size(8)));
  typedef uint32_t words __attribute__((vector_size(16)));
  typedef int8_t bytes __attribute__((vector_size(4)));
};
template <> struct NarrowLanes<8> {
  typedef uint16_t halves __attribute__((vector_size(16)));
  typedef int16_t shorts __attribute__((vector_size(16)));
  typedef uint32_t words __attribute__((vector_size(32)));
  typedef int8_t bytes __attribute__((vector_size(8)));
};
template <> struct NarrowLanes<16> {
  typedef uint16_t halves __attribute__((vector_size(32)));
  typedef int16_t shorts __attribute__((vector_size(32)));
  typedef uint32_t words __attribute__((vector_size(64)));
  typedef int8_t bytes __attribute__((vector_size(16)));
};

// One cache row's elements as floats, for each element type T of the pool: `kExtra` the elements a row holds
// beyond its `dim` values; for the pools attention widens (widen_rows), `load` widens W of them into a vector (in
// registers), `at` one, and `scale` is what the row's values are multiplied by (int8 rows: the 4 bytes after the
// row's `dim` values). A float32 pool's rows are read as they are.
template <typename T> struct KVRow;

template <> struct KVRow<float> {
  static constexpr int64_t kExtra = 0;
};

// bfloat16 as its bits: the high half of a float32.
template <> struct KVRow<uint16_t> {
  static constexpr int64_t kExtra = 0;
  template <int W> static PLAYGROUND_INLINE vec<W> load(const uint16_t* p) {
    typename NarrowLanes<W>::halves bits;
    std::memcpy(&bits, p, sizeof(bits));
    const auto wide = __builtin_convertvector(bits, typename NarrowLanes<W>::words) << 16;
    vec<W> v;
    std::memcpy(&v, &wide, sizeof(v));
    return v;
  }
  static PLAYGROUND_INLINE float at(const uint16_t* p) {
    const uint32_t bits = static_cast<uint32_t>(*p) << 16;
    float x;
    std::memcpy(&x, &bits, sizeof(x));
    return x;
  }
  static PLAYGROUND_INLINE float scale(const uint16_t*, int64_t) { return 1.f; }
};

template <> struct KVRow<int8_t> {
  static constexpr int64_t kExtra = sizeof(float);
  // Bytes to floats through 16-bit and 32-bit lanes: GCC lowers a direct byte-to-float conversion lane by lane
  // (sixteen scalar conversions; int8 attention ran 2.8x slower than float32's), each of these steps to one
  // sign-extending instruction.
  template <int W> static PLAYGROUND_INLINE vec<W> load(const int8_t* p) {
    typename NarrowLanes<W>::bytes b;
    std::memcpy(&b, p, sizeof(b));
    const auto shorts = __builtin_convertvector(b, typename NarrowLanes<W>::shorts);
    return __builtin_convertvector(__builtin_convertvector(shorts, ivec<W>), vec<W>);
  }
  static PLAYGROUND_INLINE float at(const int8_t* p) { return static_cast<float>(*p); }
  static PLAYGROUND_INLINE float scale(const int8_t* row, int64_t dim) {
    float s;
    std::memcpy(&s, row + dim, sizeof(s));
    return s;
  }
};

struct PagedShape {
  int64_t num_heads, groups, head_dim, block_size, num_slots, max_blocks, q_token_stride;
  float scale;
  KVKind kv_kind;
  const playground_cpu::Int8KVOps* int8_ops;  // an int8 pool read in integers (int8_path_fits), else null
};

// One work item of paged attention: all query rows of one (sequence, KV head).
struct AttendItem {
  const float* q;        // the step's queries [tokens, heads, dim] (row stride q_token_stride)
  float* out;            // [tokens, heads, dim]
  const void* k_head;    // this KV head's [slots, row] of the cache (rows of the pool's element type)
  const void* v_head;
  const int32_t* table;  // the sequence's block table
  int64_t kv_head, first_token, count, context_len;
};

// Scores of one query row (pre-scaled) against the W keys at `keys`, all of which are visible: dimension
// chunks outside, keys inside, so W accumulators and one query chunk are live (they fit AVX2's 16 registers).
template <int W>
PLAYGROUND_INLINE vec<W> full_chunk_scores(const float* q, const float* keys, int64_t dim) {
  vec<W> acc[W] = {};
  int64_t d = 0;
  for (; d + W <= dim; d += W) {
    const vec<W> q_chunk = load<W>(q + d);
    for (int t = 0; t < W; ++t) acc[t] += q_chunk * load<W>(keys + t * dim + d);
  }
  vec<W> scores = transpose_sums<W>(acc);
  for (; d < dim; ++d) {
    for (int t = 0; t < W; ++t) scores[t] += q[d] * keys[t * dim + d];
  }
  return scores;
}

// The same for the first `visible` (< W) keys; lanes past them are left 0 (masked by the caller).
template <int W>
PLAYGROUND_INLINE vec<W> partial_chunk_scores(const float* q, const float* keys, int64_t visible, int64_t dim) {
  vec<W> scores = {};
  for (int64_t t = 0; t < visible; ++t) scores[t] = dot<W>(q, keys + t * dim, dim);
  return scores;
}

// acc = acc * correction + sum over the chunk's visible keys of p[t] * value_t, DIM floats (0: any head_dim).
// Up to 8 output chunks stay in registers while the keys stream past.
template <int W, int DIM>
PLAYGROUND_INLINE void accumulate_values(float* acc, float correction, const float* p, const float* values,
                                         int64_t visible, int64_t runtime_dim) {
  const int64_t dim = DIM ? DIM : runtime_dim;
  if constexpr (DIM > 0 && DIM % W == 0) {
    constexpr int kChunks = DIM / W, kGroup = kChunks < 8 ? kChunks : 8;
    for (int g = 0; g < kChunks; g += kGroup) {
      vec<W> a[kGroup];
      for (int j = 0; j < kGroup; ++j) a[j] = load<W>(acc + (g + j) * W) * correction;
      for (int64_t t = 0; t < visible; ++t) {
        const vec<W> weight = splat<W>(p[t]);
        for (int j = 0; j < kGroup; ++j) a[j] += weight * load<W>(values + t * dim + (g + j) * W);
      }
      for (int j = 0; j < kGroup; ++j) store<W>(acc + (g + j) * W, a[j]);
    }
  } else {
    for (int64_t d = 0; d < dim; ++d) acc[d] *= correction;
    for (int64_t t = 0; t < visible; ++t) {
      for (int64_t d = 0; d < dim; ++d) acc[d] += p[t] * values[t * dim + d];
    }
  }
}


// How far ahead attention fetches keys and values: blocks lie anywhere in the pool, beyond the hardware
// prefetcher's reach. One block's worth of positions ahead, into L2: measured at batch 64, context 193 (one layer,
// two threads), 0.57-0.77x the time of 32 positions ahead into L1, on AVX-512 and AVX2 code alike.
constexpr int64_t kPrefetchPositions = 16;

// `count` cache rows of element type T (`stride` elements apart) as float32 rows of `dim` (int8 rows times their
// scale): a chunk's keys and values are widened once, into L1, for every query row that reads them.
template <int W, int DIM, typename T>
PLAYGROUND_INLINE void widen_rows(const T* rows, int64_t count, int64_t runtime_dim, int64_t stride, float* out) {
  const int64_t dim = DIM ? DIM : runtime_dim;
  for (int64_t t = 0; t < count; ++t) {
    const T* row = rows + t * stride;
    const float scale = KVRow<T>::scale(row, dim);
    int64_t d = 0;
    for (; d + W <= dim; d += W) store<W>(out + t * dim + d, KVRow<T>::template load<W>(row + d) * scale);
    for (; d < dim; ++d) out[t * dim + d] = KVRow<T>::at(row + d) * scale;
  }
}

// A chunk of an item's positions: its first slot in the pool and how many positions it holds.
struct Chunk {
  int64_t slot0, count;
};

// An item's positions chunk by chunk through its block table: at most `step` positions a chunk, never across a
// block's end. Advanced by additions, not a division per chunk (the block size is a runtime value).
class ChunkWalk {
 public:
  ChunkWalk(const PagedShape& s, const AttendItem& item, int64_t step) : s_(s), item_(item), step_(step) {}

  bool more() const { return position_ < item_.context_len; }
  int64_t position() const { return position_; }

  Chunk chunk() const { return at(block_, offset_, position_); }

  void advance(int64_t count) {
    position_ += count;
    offset_ += count;
    if (offset_ == s_.block_size) {
      offset_ = 0;
      ++block_;
    }
  }

  // Fetches the keys and values kPrefetchPositions ahead into L2; rows are `row_bytes` apart.
  void prefetch_ahead(int64_t row_bytes) const {
    if (position_ + kPrefetchPositions >= item_.context_len) return;
    int64_t block = block_, offset = offset_ + kPrefetchPositions;
    while (offset >= s_.block_size) {
      offset -= s_.block_size;
      ++block;
    }
    const Chunk ahead = at(block, offset, position_ + kPrefetchPositions);
    const char* keys = static_cast<const char*>(item_.k_head) + ahead.slot0 * row_bytes;
    const char* values = static_cast<const char*>(item_.v_head) + ahead.slot0 * row_bytes;
    for (int64_t line = 0; line < ahead.count * row_bytes; line += 64) {
      __builtin_prefetch(keys + line, 0, kPrefetchLocality);
      __builtin_prefetch(values + line, 0, kPrefetchLocality);
    }
  }

 private:
  Chunk at(int64_t block, int64_t offset, int64_t position) const {
    return {static_cast<int64_t>(item_.table[block]) * s_.block_size + offset,
            std::min(item_.context_len - position, std::min(step_, s_.block_size - offset))};
  }

  const PagedShape& s_;
  const AttendItem& item_;
  const int64_t step_;
  int64_t position_ = 0, block_ = 0, offset_ = 0;
};

// How many of a chunk's `count` positions from `position0` query i of the item sees: query i of `count` sees
// positions < context_len - (count - 1 - i), so keys past a row's limit never reach its softmax.
PLAYGROUND_INLINE int64_t visible_in_chunk(const AttendItem& item, int64_t i, int64_t position0, int64_t count) {
  return std::min(count, item.context_len - (item.count - 1 - i) - position0);
}

// 0, 1, ..., W - 1 as floats: which lanes of a chunk's scores hold visible keys.
template <int W>
PLAYGROUND_INLINE vec<W> lane_indices() {
  static const vec<W> lanes = [] {
    vec<W> v;
    for (int t = 0; t < W; ++t) v[t] = static_cast<float>(t);
    return v;
  }();
  return lanes;
}

// One step of a row's online softmax over a chunk's scores, V vectors of W lanes (lanes from `visible` on are
// masked): the scores become the chunk's weights exp(score - new maximum) in place; `correction` is what the row's
// accumulator must be multiplied by first. One reduction of each kind per chunk, however many vectors it spans.
template <int W, int V>
PLAYGROUND_INLINE void softmax_step(vec<W> (&scores)[V], int64_t visible, float& running_max, float& running_sum,
                                    float& correction) {
  const vec<W> lane_index = lane_indices<W>();
  vec<W> largest = splat<W>(kNegInf);
  for (int v = 0; v < V; ++v) {
    scores[v] = lane_index < static_cast<float>(visible - v * W) ? scores[v] : splat<W>(kNegInf);
    largest = largest > scores[v] ? largest : scores[v];
  }
  const float new_max = std::max(running_max, lane_max<W>(largest));
  correction = new_max > running_max ? std::exp(running_max - new_max) : 1.f;  // exp(0) without the call
  vec<W> total = {};
  for (int v = 0; v < V; ++v) {
    scores[v] = exp_lanes<W>(scores[v] - new_max);
    total += scores[v];
  }
  running_sum = running_sum * correction + lane_sum<W>(total);
  running_max = new_max;
}

// Every row's softmax state before the item's first chunk: zero accumulators and sums, a maximum of -infinity.
PLAYGROUND_INLINE void start_rows(int64_t rows, int64_t dim, float* accumulators, float* running_max,
                                  float* running_sum) {
  std::fill(accumulators, accumulators + rows * dim, 0.f);
  std::fill(running_max, running_max + rows, kNegInf);
  std::fill(running_sum, running_sum + rows, 0.f);
}

// The item's outputs: each row's accumulator divided by its softmax sum.
PLAYGROUND_INLINE void write_outputs(const PagedShape& s, const AttendItem& item, int64_t dim,
                                     const float* accumulators, const float* running_sum) {
  for (int64_t i = 0; i < item.count; ++i) {
    for (int64_t g = 0; g < s.groups; ++g) {
      const int64_t row = i * s.groups + g;
      float* out_row = item.out + ((item.first_token + i) * s.num_heads + item.kv_head * s.groups + g) * dim;
      const float inverse = 1.f / running_sum[row];
      for (int64_t d = 0; d < dim; ++d) out_row[d] = accumulators[row * dim + d] * inverse;
    }
  }
}

// The query row of item row `row` (query token i = row / groups, its g-th head sharing this KV head).
PLAYGROUND_INLINE const float* query_row(const PagedShape& s, const AttendItem& item, int64_t row, int64_t dim) {
  const int64_t i = row / s.groups, g = row % s.groups;
  return item.q + (item.first_token + i) * s.q_token_stride + (item.kv_head * s.groups + g) * dim;
}

// All query rows of one (sequence, KV head) over its visible keys, W keys at a time, read in place through the
// block table, so unwritten or stale slots are never used. Every row (each query token of each query head sharing
// this KV head) updates its online softmax from a chunk while the chunk is in L1; the rows' scaled queries,
// accumulators and softmax state live in `work` (attention_work_floats), and so does the chunk's keys and values
// widened to float32 when the pool holds another element type.
template <int W, int DIM, typename T>
PLAYGROUND_INLINE void attend_item_dim(const PagedShape& s, const AttendItem& item, float* work) {
  const int64_t dim = DIM ? DIM : s.head_dim;
  const int64_t stride = dim + KVRow<T>::kExtra;  // elements from one cache row to the next
  const T* k_head = static_cast<const T*>(item.k_head);
  const T* v_head = static_cast<const T*>(item.v_head);
  const int64_t rows = item.count * s.groups;
  float* queries = work;                 // [rows, dim], scaled
  float* accumulators = work + rows * dim;
  float* running_max = accumulators + rows * dim;
  float* running_sum = running_max + rows;
  for (int64_t row = 0; row < rows; ++row) {
    const float* q_row = query_row(s, item, row, dim);
    for (int64_t d = 0; d < dim; ++d) queries[row * dim + d] = q_row[d] * s.scale;
  }
  start_rows(rows, dim, accumulators, running_max, running_sum);
  float* widened_keys = running_sum + rows;  // a chunk's rows as float32, for pools of another element type
  float* widened_values = widened_keys + W * dim;
  alignas(64) float p[W];
  const int64_t step = std::min<int64_t>(W, s.block_size);
  for (ChunkWalk walk(s, item, step); walk.more(); ) {
    const Chunk chunk = walk.chunk();
    const int64_t position0 = walk.position();
    walk.prefetch_ahead(stride * static_cast<int64_t>(sizeof(T)));
    const float* keys;
    const float* values;
    if constexpr (std::is_same_v<T, float>) {
      keys = k_head + chunk.slot0 * dim;
      values = v_head + chunk.slot0 * dim;
    } else {
      widen_rows<W, DIM, T>(k_head + chunk.slot0 * stride, chunk.count, dim, stride, widened_keys);
      widen_rows<W, DIM, T>(v_head + chunk.slot0 * stride, chunk.count, dim, stride, widened_values);
      keys = widened_keys;
      values = widened_values;
    }
    for (int64_t i = 0; i < item.count; ++i) {
      const int64_t visible = visible_in_chunk(item, i, position0, chunk.count);
      if (visible <= 0) continue;
      for (int64_t g = 0; g < s.groups; ++g) {
        const int64_t row = i * s.groups + g;
        const vec<W> scores = visible == W ? full_chunk_scores<W>(queries + row * dim, keys, dim)
                                           : partial_chunk_scores<W>(queries + row * dim, keys, visible, dim);
        vec<W> weights[1] = {scores};
        float correction;
        softmax_step<W, 1>(weights, visible, running_max[row], running_sum[row], correction);
        store<W>(p, weights[0]);
        accumulate_values<W, DIM>(accumulators + row * dim, correction, p, values, visible, dim);
      }
    }
    walk.advance(chunk.count);
  }
  write_outputs(s, item, dim, accumulators, running_sum);
}

// W floats rounded to nearest (ties to even; |x| < 2^22) as W int16 lanes.
template <int W>
PLAYGROUND_INLINE void store_rounded_int16(int16_t* out, vec<W> x) {
  const vec<W> rounded = (x + 12582912.f) - 12582912.f;
  const auto shorts = __builtin_convertvector(__builtin_convertvector(rounded, ivec<W>), typename NarrowLanes<W>::shorts);
  std::memcpy(out, &shorts, sizeof(shorts));
}

constexpr float kInt16Max = 32767.f;

// What attend_item_int8 keeps in `work`, carved from it in this order (int8_work_floats says how many floats).
struct Int8Work {
  int16_t* queries;     // [rows, dim]: the scaled queries, int16, one scale per row
  float* query_scale;   // [rows]
  int32_t* raw;         // [rows, kChunkKeys]: a chunk's integer scores
  int16_t* weights;     // [rows, kChunkKeys]: a chunk's softmax weights times the values' scales, int16
  float* correction;    // [rows]: what each accumulator is multiplied by before this chunk's values are added
  int32_t* sums;        // [rows, dim]: a chunk's integer weighted sums of values
  float* accumulators;  // [rows, dim]
  float* running_max;   // [rows]
  float* running_sum;   // [rows]
  int16_t* scratch;     // [kChunkKeys, dim]: the chunk's keys, then its values, widened to int16 by the ops
};

PLAYGROUND_INLINE int64_t int8_work_floats(int64_t rows, int64_t dim) {
  return rows * (dim / 2 + 1 + playground_cpu::kChunkKeys * 3 / 2 + 1 + 2 * dim + 2) +
         playground_cpu::kChunkKeys * dim / 2;
}

PLAYGROUND_INLINE Int8Work carve_int8_work(float* work, int64_t rows, int64_t dim) {
  using playground_cpu::kChunkKeys;
  Int8Work w;
  w.queries = reinterpret_cast<int16_t*>(work);
  w.query_scale = work + rows * dim / 2;
  w.raw = reinterpret_cast<int32_t*>(w.query_scale + rows);
  w.weights = reinterpret_cast<int16_t*>(w.raw + rows * kChunkKeys);
  w.correction = reinterpret_cast<float*>(w.weights + rows * kChunkKeys);
  w.sums = reinterpret_cast<int32_t*>(w.correction + rows);
  w.accumulators = reinterpret_cast<float*>(w.sums + rows * dim);
  w.running_max = w.accumulators + rows * dim;
  w.running_sum = w.running_max + rows;
  w.scratch = reinterpret_cast<int16_t*>(w.running_sum + rows);
  return w;
}

// attend_item_dim for an int8 pool in integers (int8_kv.cpp): each query row quantized to int16 once, then per chunk
// its scores as exact integer dot products with the int8 keys (times the row's and each key's scale), its softmax
// weights times each value row's scale quantized to int16 (one scale per chunk), and their integer sums with the
// int8 values added into the float accumulators. Nothing of the pool is widened to float32. A chunk is kChunkKeys
// positions and may span blocks (the ops read its rows through pointers), so each row's online-softmax step (its
// lane reductions) and its accumulator update are paid once per 32 keys, not once per block of 16.
template <int W, int DIM>
PLAYGROUND_INLINE void attend_item_int8(const PagedShape& s, const AttendItem& item, float* work) {
  using playground_cpu::kChunkKeys;
  const vec<W> lane_index = lane_indices<W>();
  const int64_t dim = DIM ? DIM : s.head_dim;
  const int64_t stride = dim + KVRow<int8_t>::kExtra;
  const int8_t* k_head = static_cast<const int8_t*>(item.k_head);
  const int8_t* v_head = static_cast<const int8_t*>(item.v_head);
  const int64_t rows = item.count * s.groups;
  const Int8Work w = carve_int8_work(work, rows, dim);
  for (int64_t row = 0; row < rows; ++row) {
    const float* q_row = query_row(s, item, row, dim);
    float largest = 0.f;
    for (int64_t d = 0; d < dim; ++d) largest = std::max(largest, std::fabs(q_row[d]));
    const float row_scale = largest * s.scale / kInt16Max;
    const float inverse = largest > 0.f ? kInt16Max / largest : 0.f;
    for (int64_t d = 0; d < dim; d += W) store_rounded_int16<W>(w.queries + row * dim + d, load<W>(q_row + d) * inverse);
    w.query_scale[row] = row_scale;
  }
  start_rows(rows, dim, w.accumulators, w.running_max, w.running_sum);
  const playground_cpu::Int8KVOps& ops = *s.int8_ops;
  constexpr int V = kChunkKeys / W;  // vectors of W lanes a chunk's scores take
  alignas(64) float key_scale[kChunkKeys] = {}, value_scale[kChunkKeys] = {};
  const int8_t* key_rows[kChunkKeys];
  const int8_t* value_rows[kChunkKeys];
  for (ChunkWalk walk(s, item, kChunkKeys); walk.more(); ) {
    // A chunk of up to kChunkKeys positions, across blocks: the ops read its rows through pointers.
    const int64_t position0 = walk.position();
    int64_t count = 0;
    while (count < kChunkKeys && walk.more()) {
      const Chunk piece = walk.chunk();
      const int64_t taken = std::min(piece.count, kChunkKeys - count);
      walk.prefetch_ahead(stride);
      for (int64_t t = 0; t < taken; ++t, ++count) {
        key_rows[count] = k_head + (piece.slot0 + t) * stride;
        value_rows[count] = v_head + (piece.slot0 + t) * stride;
        key_scale[count] = KVRow<int8_t>::scale(key_rows[count], dim);
        value_scale[count] = KVRow<int8_t>::scale(value_rows[count], dim);
      }
      walk.advance(taken);
    }
    ops.scores(key_rows, count, w.queries, rows, dim, w.scratch, w.raw);
    // Every row's weights are at most 1 times a value row's scale: one int16 scale for the chunk covers them all.
    vec<W> largest_scales = {};
    for (int v = 0; v < V; ++v) {
      const vec<W> scales = lane_index < static_cast<float>(count - v * W) ? load<W>(value_scale + v * W) : vec<W>{};
      largest_scales = largest_scales > scales ? largest_scales : scales;
    }
    const float largest_value_scale = lane_max<W>(largest_scales);
    const float weight_scale = largest_value_scale / kInt16Max;
    const float to_int16 = largest_value_scale > 0.f ? kInt16Max / largest_value_scale : 0.f;
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t visible = visible_in_chunk(item, row / s.groups, position0, count);
      vec<W> weights[V] = {};
      w.correction[row] = 1.f;
      if (visible > 0) {
        const vec<W> row_scale = splat<W>(w.query_scale[row]);
        for (int v = 0; v < V; ++v) {
          ivec<W> raw;
          std::memcpy(&raw, w.raw + row * kChunkKeys + v * W, sizeof(raw));
          weights[v] = __builtin_convertvector(raw, vec<W>) * (load<W>(key_scale + v * W) * row_scale);
        }
        softmax_step<W, V>(weights, visible, w.running_max[row], w.running_sum[row], w.correction[row]);
        for (int v = 0; v < V; ++v) weights[v] = weights[v] * (load<W>(value_scale + v * W) * to_int16);
      }
      for (int v = 0; v < V; ++v) store_rounded_int16<W>(w.weights + row * kChunkKeys + v * W, weights[v]);
    }
    ops.values(value_rows, count, w.weights, rows, dim, w.scratch, w.sums);
    for (int64_t row = 0; row < rows; ++row) {
      float* acc = w.accumulators + row * dim;
      const int32_t* sums = w.sums + row * dim;
      const float correction = w.correction[row];
      for (int64_t d = 0; d < dim; d += W) {
        ivec<W> sum;
        std::memcpy(&sum, sums + d, sizeof(sum));
        store<W>(acc + d, load<W>(acc + d) * correction + __builtin_convertvector(sum, vec<W>) * weight_scale);
      }
    }
  }
  write_outputs(s, item, dim, w.accumulators, w.running_sum);
}

template <int W, typename T>
PLAYGROUND_INLINE void attend_item_rows(const PagedShape& s, const AttendItem& item, float* work) {
  switch (s.head_dim) {
    case 32: attend_item_dim<W, 32, T>(s, item, work); break;
    case 64: attend_item_dim<W, 64, T>(s, item, work); break;
    case 128: attend_item_dim<W, 128, T>(s, item, work); break;
    default: attend_item_dim<W, 0, T>(s, item, work); break;
  }
}

template <int W>
PLAYGROUND_INLINE void attend_int8_rows(const PagedShape& s, const AttendItem& item, float* work) {
  switch (s.head_dim) {
    case 64: attend_item_int8<W, 64>(s, item, work); break;
    case 128: attend_item_int8<W, 128>(s, item, work); break;
    default: attend_item_int8<W, 0>(s, item, work); break;
  }
}

template <int W>
PLAYGROUND_INLINE void attend_item(const PagedShape& s, const AttendItem& item, float* work) {
  switch (s.kv_kind) {
    case KVKind::kBFloat16: attend_item_rows<W, uint16_t>(s, item, work); break;
    case KVKind::kInt8:
      if (s.int8_ops) attend_int8_rows<W>(s, item, work);
      else attend_item_rows<W, int8_t>(s, item, work);
      break;
    default: attend_item_rows<W, float>(s, item, work); break;
  }
}

// Whether an int8 pool of this head_dim is read by the integer path (int8_kv.cpp); other dimensions widen its rows.
bool int8_path_fits(int64_t head_dim) {
  return head_dim % 32 == 0 && head_dim <= playground_cpu::kMaxInt8HeadDim;
}

// Floats of `work` one attention item needs: per query row, its scaled query and accumulator (head_dim each),
// running maximum and sum, and a chunk's widened keys and values; or what the integer path carves (Int8Work).
int64_t attention_work_floats(const PagedShape& s, int64_t max_count) {
  const int64_t rows = max_count * s.groups;
  if (s.int8_ops) return int8_work_floats(rows, s.head_dim);
  return rows * (2 * s.head_dim + 2) + 2 * playground_cpu::kChunkKeys * s.head_dim;  // the widest level's chunk
}

// Outputs `first`..`last` - 1 of y [ROWS, N] = x [ROWS, K] weight[N, K]^T: WIDE weight rows at a time, each
// streamed once for all ROWS rows of x (ROWS * WIDE accumulators stay in registers). The next pass's rows are
// fetched into L2 as this one computes: with 63 MB of weights (random-llama-20m's layers and LM head, beyond L3),
// 0.66-0.85x the time of the non-temporal hint at 1-8 rows on two threads, 0.57-0.75x on one; neutral in cache.
template <int W, int ROWS, int WIDE>
PLAYGROUND_INLINE void linear_rows(const float* x, const float* weight, const float* bias, float* y, int64_t K,
                                   int64_t N, int64_t first, int64_t last) {
  int64_t n = first;
  for (; n + WIDE <= last; n += WIDE) {
    vec<W> acc[WIDE][ROWS] = {};
    int64_t k = 0;
    for (; k + W <= K; k += W) {
      vec<W> w[WIDE];
      for (int j = 0; j < WIDE; ++j) {
        __builtin_prefetch(weight + (n + j + WIDE) * K + k, 0, kPrefetchLocality);
        w[j] = load<W>(weight + (n + j) * K + k);
      }
      for (int m = 0; m < ROWS; ++m) {
        const vec<W> a = load<W>(x + m * K + k);
        for (int j = 0; j < WIDE; ++j) acc[j][m] += a * w[j];
      }
    }
    for (int j = 0; j < WIDE; ++j) {
      const float* w_row = weight + (n + j) * K;
      for (int m = 0; m < ROWS; ++m) {
        float total = lane_sum<W>(acc[j][m]);
        for (int64_t r = k; r < K; ++r) total += x[m * K + r] * w_row[r];
        y[m * N + n + j] = bias ? total + bias[n + j] : total;
      }
    }
  }
  for (; n < last; ++n) {
    for (int m = 0; m < ROWS; ++m) {
      const float total = dot<W>(x + m * K, weight + n * K, K);
      y[m * N + n] = bias ? total + bias[n] : total;
    }
  }
}

// Weight rows per pass for ROWS rows of x: as many as keep every accumulator, weight vector and x vector in
// registers (AVX-512 has 32 vector registers, AVX2 and SSE 16).
template <int W>
constexpr int weight_rows_per_pass(int rows) {
  if constexpr (W == 16) return rows <= 5 ? 4 : 3;
  else return rows <= 2 ? 4 : rows <= 4 ? 2 : 1;
}

template <int W>
PLAYGROUND_INLINE void linear_block(int64_t rows, const float* x, const float* weight, const float* bias, float* y,
                                    int64_t K, int64_t N, int64_t first, int64_t last) {
  switch (rows) {
    case 1: linear_rows<W, 1, weight_rows_per_pass<W>(1)>(x, weight, bias, y, K, N, first, last); break;
    case 2: linear_rows<W, 2, weight_rows_per_pass<W>(2)>(x, weight, bias, y, K, N, first, last); break;
    case 3: linear_rows<W, 3, weight_rows_per_pass<W>(3)>(x, weight, bias, y, K, N, first, last); break;
    case 4: linear_rows<W, 4, weight_rows_per_pass<W>(4)>(x, weight, bias, y, K, N, first, last); break;
    case 5: linear_rows<W, 5, weight_rows_per_pass<W>(5)>(x, weight, bias, y, K, N, first, last); break;
    case 6: linear_rows<W, 6, weight_rows_per_pass<W>(6)>(x, weight, bias, y, K, N, first, last); break;
    case 7: linear_rows<W, 7, weight_rows_per_pass<W>(7)>(x, weight, bias, y, K, N, first, last); break;
    default: linear_rows<W, 8, weight_rows_per_pass<W>(8)>(x, weight, bias, y, K, N, first, last); break;
  }
}

// ---- the two kernels whose tiles depend on the vector registers, compiled once per x86-64 level ----
//
// Attention's W-key chunks and the small-batch matmul's tiles are sized for the registers of each level (16
// floats x 32 registers with AVX-512, 8 x 16 with AVX2, 4 x 16 with SSE2): one width for all would spill on
// AVX2 what fits AVX-512. The level is picked once, when the library is first used.
struct LevelKernels {
  void (*attend)(const PagedShape&, const AttendItem&, float*);
  void (*linear)(int64_t, const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
  const char* name;
};

#define PLAYGROUND_LEVEL(SUFFIX, TARGET, WIDTH)                                                                  \
  TARGET void attend_##SUFFIX(const PagedShape& s, const AttendItem& item, float* work) {                       \
    attend_item<WIDTH>(s, item, work);                                                                          \
  }                                                                                                              \
  TARGET void linear_##SUFFIX(int64_t rows, const float* x, const float* weight, const float* bias, float* y,   \
                              int64_t K, int64_t N, int64_t first, int64_t last) {                              \
    linear_block<WIDTH>(rows, x, weight, bias, y, K, N, first, last);                                           \
  }

#ifdef PLAYGROUND_X86_LEVELS
PLAYGROUND_LEVEL(avx512, __attribute__((target("arch=x86-64-v4"))), 16)
PLAYGROUND_LEVEL(avx2, __attribute__((target("arch=x86-64-v3"))), 8)
#endif
PLAYGROUND_LEVEL(baseline, , 4)
#undef PLAYGROUND_LEVEL

#ifdef PLAYGROUND_X86_LEVELS
constexpr LevelKernels kAvx512{attend_avx512, linear_avx512, "avx512"};
constexpr LevelKernels kAvx2{attend_avx2, linear_avx2, "avx2"};
#endif
constexpr LevelKernels kBaseline{attend_baseline, linear_baseline, "baseline"};

// The levels this CPU runs, best first.
std::vector<const LevelKernels*> supported_levels() {
  std::vector<const LevelKernels*> levels;
#ifdef PLAYGROUND_X86_LEVELS
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) levels.push_back(&kAvx512);
  if (__builtin_cpu_supports("x86-64-v3")) levels.push_back(&kAvx2);
#endif
  levels.push_back(&kBaseline);
  return levels;
}

std::atomic<const LevelKernels*>& active_level() {
  static std::atomic<const LevelKernels*> level{supported_levels().front()};
  return level;
}

const LevelKernels& level_kernels() { return *active_level().load(std::memory_order_relaxed); }

std::vector<std::string> kernel_levels() {
  std::vector<std::string> names;
  for (const LevelKernels* level : supported_levels()) names.emplace_back(level->name);
  return names;
}

// Runs the register-sized kernels at another level this CPU supports (tests compare every level); returns the
// level that was active.
std::string use_kernel_level(const std::string& name) {
  for (const LevelKernels* level : supported_levels()) {
    if (name == level->name) return active_level().exchange(level)->name;
  }
  TORCH_CHECK(false, "this CPU does not run kernel level '", name, "'");
}

// How many of torch's intra-op threads one at::parallel_for over `tasks` ranges ran on. at::parallel_for is a
// header template: a build without OpenMP runs every range on the calling thread, silently (a test checks this).
int64_t parallel_threads_used(int64_t tasks) {
  std::vector<std::atomic<bool>> used(static_cast<size_t>(std::max<int64_t>(at::get_num_threads(), 1)));
  at::parallel_for(0, tasks, 1, [&](int64_t, int64_t) { used[at::get_thread_num()] = true; });
  return std::count_if(used.begin(), used.end(), [](const std::atomic<bool>& flag) { return flag.load(); });
}

void check_cpu_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void check_cpu_int(const at::Tensor& t, const char* name, at::ScalarType type) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == type && t.is_contiguous(), name,
              " must be a contiguous CPU tensor of ", type);
}

// [tokens, heads, dim] float32 whose heads are contiguous (a view into a fused QKV output is fine).
void check_heads(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 3, name,
              " must be a [tokens, heads, dim] float32 CPU tensor");
  TORCH_CHECK(t.stride(2) == 1 && t.stride(1) == t.size(2), name, "'s heads must be contiguous");
}

// A K/V pool pair's element type, checked: contiguous CPU [kv_heads, slots, row] of float32 or bfloat16 (row =
// head_dim values), or int8 (row = head_dim values and their float32 scale's 4 bytes).
KVKind kv_kind_of(const at::Tensor& k_cache, const at::Tensor& v_cache, int64_t head_dim) {
  TORCH_CHECK(k_cache.device().is_cpu() && v_cache.device().is_cpu() && k_cache.is_contiguous() &&
              v_cache.is_contiguous() && k_cache.dim() == 3 && k_cache.sizes() == v_cache.sizes() &&
              k_cache.scalar_type() == v_cache.scalar_type(),
              "k_cache/v_cache must be contiguous CPU tensors [kv_heads, slots, row] of the same type and shape");
  KVKind kind;
  int64_t extra = 0;
  switch (k_cache.scalar_type()) {
    case at::kFloat: kind = KVKind::kFloat; break;
    case at::kBFloat16: kind = KVKind::kBFloat16; break;
    case at::kChar: kind = KVKind::kInt8; extra = KVRow<int8_t>::kExtra; break;
    default: TORCH_CHECK(false, "the KV caches must be float32, bfloat16 or int8, got ", k_cache.scalar_type());
  }
  TORCH_CHECK(k_cache.size(2) == head_dim + extra, "a ", k_cache.scalar_type(), " cache row holds ", head_dim + extra,
              " elements for head_dim ", head_dim, ", got ", k_cache.size(2));
  return kind;
}

// q/out [tokens, heads, dim]; k_cache/v_cache [kv_heads, slots, row] (see kv_kind_of); block_tables [seqs, max_blocks] int32;
// query_start, query_len, context_lens [seqs] int64: sequence n's queries are rows
// query_start[n] .. query_start[n] + query_len[n] - 1 of q; its last query sees context_lens[n] positions.
// Rows of `out` that belong to no sequence are left untouched.
void paged_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const at::Tensor& query_start, const at::Tensor& query_len,
                     const at::Tensor& context_lens, int64_t block_size, double scale, at::Tensor& out) {
  check_heads(q, "q");
  const KVKind kv_kind = kv_kind_of(k_cache, v_cache, q.size(2));
  check_cpu_float(out, "out");
  check_cpu_int(block_tables, "block_tables", at::kInt);
  check_cpu_int(query_start, "query_start", at::kLong);
  check_cpu_int(query_len, "query_len", at::kLong);
  check_cpu_int(context_lens, "context_lens", at::kLong);
  TORCH_CHECK(out.sizes() == q.sizes(), "q/out must be [tokens, heads, dim]");
  TORCH_CHECK(q.size(1) % k_cache.size(0) == 0, "head shapes do not match");
  TORCH_CHECK(block_size > 0 && k_cache.size(1) % block_size == 0, "the cache's slots are not whole blocks");
  const int64_t num_seqs = block_tables.size(0), kv_heads = k_cache.size(0);
  TORCH_CHECK(query_start.numel() == num_seqs && query_len.numel() == num_seqs && context_lens.numel() == num_seqs,
              "one query_start, query_len and context_len per block-table row");
  const bool integer_path = kv_kind == KVKind::kInt8 && int8_path_fits(q.size(2));
  const playground_cpu::Int8KVOps* int8_ops = integer_path ? &playground_cpu::int8_kv_ops(level_kernels().name) : nullptr;
  const PagedShape shape{q.size(1), q.size(1) / kv_heads, q.size(2), block_size, k_cache.size(1),
                         block_tables.size(1), q.stride(0), static_cast<float>(scale), kv_kind, int8_ops};
  const int64_t* starts = query_start.data_ptr<int64_t>();
  const int64_t* lens = query_len.data_ptr<int64_t>();
  const int64_t* contexts = context_lens.data_ptr<int64_t>();
  const int64_t num_blocks_total = k_cache.size(1) / block_size;
  for (int64_t n = 0; n < num_seqs; ++n) {
    TORCH_CHECK(lens[n] >= 0 && starts[n] >= 0 && starts[n] + lens[n] <= q.size(0), "query rows out of range");
    TORCH_CHECK(contexts[n] >= lens[n] && contexts[n] <= shape.max_blocks * block_size,
                "context length does not fit the block table");
  }
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  for (int64_t i = 0; i < block_tables.numel(); ++i) {
    TORCH_CHECK(tables[i] >= 0 && tables[i] < num_blocks_total, "block id out of range");
  }
  const float* q_data = q.data_ptr<float>();
  const char* k_data = static_cast<const char*>(k_cache.data_ptr());
  const char* v_data = static_cast<const char*>(v_cache.data_ptr());
  const int64_t head_bytes = k_cache.size(1) * k_cache.size(2) * k_cache.element_size();
  float* out_data = out.data_ptr<float>();
  const int64_t items = num_seqs * kv_heads;
  int64_t max_count = 0;
  for (int64_t n = 0; n < num_seqs; ++n) max_count = std::max(max_count, lens[n]);
  const int64_t work_floats = attention_work_floats(shape, max_count);
  const LevelKernels& kernels = level_kernels();
  // Items differ in cost (context lengths differ), so threads take them one at a time from a shared counter.
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), items);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> work(work_floats);
    for (int64_t worker = begin; worker < end; ++worker) {
      for (int64_t item = next++; item < items; item = next++) {
        const int64_t n = item / kv_heads, head = item % kv_heads;
        if (lens[n] == 0) continue;
        const AttendItem one{q_data, out_data, k_data + head * head_bytes, v_data + head * head_bytes,
                             tables + n * shape.max_blocks, head, starts[n], lens[n], contexts[n]};
        kernels.attend(shape, one, work.data());
      }
    }
  });
}

// ---- the small per-layer operations of a decoder layer, fused so that each is one pass and one call ----

// Rows of at least this many floats in total are worth spreading over threads.
constexpr int64_t kParallelGrainFloats = 1 << 15;

int64_t row_grain(int64_t row_floats) { return std::max<int64_t>(1, kParallelGrainFloats / std::max<int64_t>(1, row_floats)); }

// The row operations are compiled for every level by target_clones from one source, so they use vectors of 8
// floats, native on AVX2 and AVX-512: GCC lowers comparisons and selects on vectors wider than the target's
// registers lane by lane (16-float vectors made silu_mul about 4x slower on AVX2, measured).
constexpr int kRowWidth = 8;

// RMSNorm as transformers computes it in float32: out = weight * (x * 1 / sqrt(mean(x^2) + eps)).
PLAYGROUND_MULTIVERSION
void rms_norm_row(const float* x, const float* weight, float eps, float* out, int64_t n) {
  vec<kRowWidth> squares = {};
  int64_t i = 0;
  for (; i + kRowWidth <= n; i += kRowWidth) {
    const vec<kRowWidth> v = load<kRowWidth>(x + i);
    squares += v * v;
  }
  float total = lane_sum<kRowWidth>(squares);
  for (; i < n; ++i) total += x[i] * x[i];
  const float inverse = 1.f / std::sqrt(total / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) out[j] = weight[j] * (x[j] * inverse);
}

PLAYGROUND_MULTIVERSION
void add_rows(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = a[j] + b[j];
}

void check_rows(const at::Tensor& x, const at::Tensor& weight, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() >= 1 && x.stride(-1) == 1, name,
              " must be a float32 CPU tensor with contiguous rows");
  check_cpu_float(weight, "weight");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "weight must have one value per column");
}

at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  const at::Tensor x = x_in.contiguous();
  check_rows(x, weight, "x");
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(1, n);
  const float* x_data = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) rms_norm_row(x_data + r * n, w, static_cast<float>(eps), o + r * n, n);
  });
  return out;
}

// (rms_norm(x + residual), x + residual): a layer's residual sum and the next norm in one pass.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x_in, const at::Tensor& residual_in,
                                                const at::Tensor& weight, double eps) {
  const at::Tensor x = x_in.contiguous(), residual = residual_in.contiguous();
  check_rows(x, weight, "x");
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == at::kFloat, "residual must match x");
  at::Tensor total = at::empty_like(x), out = at::empty_like(x);
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(1, n);
  const float* a = x.data_ptr<float>();
  const float* b = residual.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* t = total.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      add_rows(a + r * n, b + r * n, t + r * n, n);
      rms_norm_row(t + r * n, w, static_cast<float>(eps), o + r * n, n);
    }
  });
  return {out, total};
}

// silu(gate) * up for x = [gate | up] (the fused gate/up projection's output), silu(g) = g / (1 + e^-g).
PLAYGROUND_MULTIVERSION
void silu_mul_row(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + kRowWidth <= n; i += kRowWidth) {
    const vec<kRowWidth> g = load<kRowWidth>(gate + i);
    store<kRowWidth>(out + i, g / (1.f + exp_lanes<kRowWidth>(-g)) * load<kRowWidth>(up + i));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}

at::Tensor silu_mul(const at::Tensor& x_in) {
  const at::Tensor x = x_in.contiguous();
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) % 2 == 0,
              "x must be a [tokens, 2 * intermediate] float32 CPU tensor");
  const int64_t rows = x.size(0), n = x.size(1) / 2;
  at::Tensor out = at::empty({rows, n}, x.options());
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, row_grain(2 * n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) silu_mul_row(in + r * 2 * n, in + r * 2 * n + n, o + r * n, n);
  });
  return out;
}

// Rotary embedding in place, "rotate half" style: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin per head,
// with cos/sin [tokens, dim] (both halves of a row hold the same angles, as transformers builds them).
PLAYGROUND_MULTIVERSION
void rotate_heads(float* x, int64_t token_stride, int64_t heads, int64_t dim, const float* cos, const float* sin,
                  int64_t token) {
  const int64_t half = dim / 2;
  const float* c = cos + token * dim;
  const float* s = sin + token * dim;
  for (int64_t h = 0; h < heads; ++h) {
    float* row = x + token * token_stride + h * dim;
    for (int64_t j = 0; j < half; ++j) {
      const float first = row[j], second = row[j + half];
      row[j] = first * c[j] - second * s[j];
      row[j + half] = second * c[j + half] + first * s[j + half];
    }
  }
}

void rotary_(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
  check_heads(q, "q");
  check_heads(k, "k");
  check_cpu_float(cos, "cos");
  check_cpu_float(sin, "sin");
  const int64_t tokens = q.size(0), dim = q.size(2);
  TORCH_CHECK(k.size(0) == tokens && k.size(2) == dim && dim % 2 == 0, "q and k must share tokens and an even dim");
  TORCH_CHECK(cos.numel() == tokens * dim && sin.numel() == tokens * dim, "cos/sin must be [tokens, dim]");
  float* q_data = q.data_ptr<float>();
  float* k_data = k.data_ptr<float>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  at::parallel_for(0, tokens, row_grain((q.size(1) + k.size(1)) * dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      rotate_heads(q_data, q.stride(0), q.size(1), dim, c, s, t);
      rotate_heads(k_data, k.stride(0), k.size(1), dim, c, s, t);
    }
  });
}

// One K or V row of `dim` floats as a cache row of the pool's element type (see KVRow): float32 copied, bfloat16
// rounded to nearest even (NaN kept a NaN), int8 quantized symmetrically: scale = max|x| / 127 (its 4 bytes after
// the values), q = round(x / scale) to nearest even, as engine/model/kv_format.py computes it (0 for a zero row).
PLAYGROUND_MULTIVERSION
void store_row(const float* x, float* row, int64_t dim) { std::memcpy(row, x, dim * sizeof(float)); }

PLAYGROUND_MULTIVERSION
void store_row(const float* x, uint16_t* row, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) {
    uint32_t bits;
    std::memcpy(&bits, x + d, sizeof(bits));
    row[d] = x[d] != x[d] ? 0x7FC0 : static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
  }
}

PLAYGROUND_MULTIVERSION
void store_row(const float* x, int8_t* row, int64_t dim) {
  float largest = 0.f;
  for (int64_t d = 0; d < dim; ++d) largest = std::max(largest, std::fabs(x[d]));
  const float scale = largest / 127.f;
  const float divisor = scale == 0.f ? 1.f : scale;
  for (int64_t d = 0; d < dim; ++d) row[d] = static_cast<int8_t>(std::nearbyint(x[d] / divisor));
  std::memcpy(row + dim, &scale, sizeof(scale));
}

template <typename T>
void store_rows(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
                const int64_t* slot) {
  const int64_t tokens = k.size(0), heads = k.size(1), dim = k.size(2), slots = k_cache.size(1);
  const int64_t stride = k_cache.size(2);
  const float* k_data = k.data_ptr<float>();
  const float* v_data = v.data_ptr<float>();
  T* kc = static_cast<T*>(k_cache.data_ptr());
  T* vc = static_cast<T*>(v_cache.data_ptr());
  at::parallel_for(0, tokens, row_grain(2 * heads * dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        store_row(k_data + t * k.stride(0) + h * dim, kc + (h * slots + slot[t]) * stride, dim);
        store_row(v_data + t * v.stride(0) + h * dim, vc + (h * slots + slot[t]) * stride, dim);
      }
    }
  });
}

// K/V rows [tokens, kv_heads, dim] into their slots of head-major caches [kv_heads, slots, row], converted to the
// caches' element type (see kv_kind_of).
void store_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slot_mapping) {
  check_heads(k, "k");
  check_heads(v, "v");
  const KVKind kind = kv_kind_of(k_cache, v_cache, k.size(2));
  check_cpu_int(slot_mapping, "slot_mapping", at::kLong);
  const int64_t tokens = k.size(0), slots = k_cache.size(1);
  TORCH_CHECK(v.sizes() == k.sizes() && k_cache.size(0) == k.size(1) && slot_mapping.numel() == tokens,
              "k/v [tokens, kv_heads, dim] and caches [kv_heads, slots, row] expected");
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(slot[t] >= 0 && slot[t] < slots, "slot out of range");
  switch (kind) {
    case KVKind::kBFloat16: store_rows<uint16_t>(k, v, k_cache, v_cache, slot); break;
    case KVKind::kInt8: store_rows<int8_t>(k, v, k_cache, v_cache, slot); break;
    default: store_rows<float>(k, v, k_cache, v_cache, slot); break;
  }
}

constexpr int64_t kMaxRowsPerPass = 8;
constexpr int64_t kOutputsPerTask = 64;

at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  check_cpu_float(x, "x");
  check_cpu_float(weight, "weight");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "x [M, K] and weight [N, K] expected");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  const float* bias_data = nullptr;
  if (bias.has_value() && bias->defined()) {
    check_cpu_float(*bias, "bias");
    TORCH_CHECK(bias->numel() == N, "bias must have one value per output");
    bias_data = bias->data_ptr<float>();
  }
  at::Tensor y = at::empty({M, N}, x.options());
  const float* x_data = x.data_ptr<float>();
  const float* w_data = weight.data_ptr<float>();
  float* y_data = y.data_ptr<float>();
  const int64_t tasks = (N + kOutputsPerTask - 1) / kOutputsPerTask;
  const LevelKernels& kernels = level_kernels();
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    const int64_t first = begin * kOutputsPerTask, last = std::min(N, end * kOutputsPerTask);
    // Each pass streams this task's weight rows once for up to kMaxRowsPerPass rows of x.
    for (int64_t m = 0; m < M; m += kMaxRowsPerPass) {
      const int64_t rows = std::min(kMaxRowsPerPass, M - m);
      kernels.linear(rows, x_data + m * K, w_data, bias_data, y_data + m * N, K, N, first, last);
    }
  });
  return y;
}

// ---- a whole small step's decoder layers in one call ----
//
// At a few tokens a step of a small model is mostly the fixed cost of calling ~15 operators per layer from
// Python: a decode step of a few sequences, a speculative verification (1 + k tokens of one sequence), a
// draft model's catch-up. This runs the same operators, in the same order, as the Python layers do with
// these kernels (so it computes the same numbers), for every layer and the final norm, in one call.
// Sequence n's tokens are rows query_start[n] .. query_start[n] + query_len[n] - 1 (see paged_attention).
// `layers` holds kLayerTensors entries per layer (see below; absent ones are None); `caches` K then V per layer.

// A linear layer's scales are None for a float32 weight, or those of a packed one (see packed_linear).
constexpr int64_t kLayerTensors = 14;
enum LayerTensor { kInputNorm, kQkv, kQkvBias, kQNorm, kKNorm, kOut, kOutBias, kPostNorm, kGateUp, kDown,
                   kQkvScales, kOutScales, kGateUpScales, kDownScales };

std::optional<at::Tensor> layer_tensor(const c10::List<std::optional<at::Tensor>>& layers, int64_t layer,
                                       LayerTensor which) {
  return layers.get(layer * kLayerTensors + which);
}

at::Tensor required(const std::optional<at::Tensor>& t, const char* name) {
  TORCH_CHECK(t.has_value() && t->defined(), name, " is required");
  return *t;
}

// One linear layer of decode_layers: its weight in float32, or packed with its scales.
at::Tensor layer_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& scales,
                        const std::optional<at::Tensor>& bias) {
  if (scales.has_value() && scales->defined()) return playground_cpu::packed_linear(x, weight, *scales, bias);
  return small_batch_linear(x, weight, bias);
}

at::Tensor decode_layers(const at::Tensor& embedded, const at::Tensor& cos, const at::Tensor& sin,
                         const c10::List<std::optional<at::Tensor>>& layers, const at::Tensor& final_norm,
                         const std::vector<at::Tensor>& caches, const at::Tensor& slot_mapping,
                         const at::Tensor& block_tables, const at::Tensor& query_start, const at::Tensor& query_len,
                         const at::Tensor& context_lens, int64_t num_heads,
                         int64_t num_kv_heads, int64_t head_dim, int64_t block_size, double eps, double scale) {
  const int64_t num_layers = static_cast<int64_t>(layers.size()) / kLayerTensors;
  TORCH_CHECK(static_cast<int64_t>(layers.size()) == num_layers * kLayerTensors &&
              static_cast<int64_t>(caches.size()) == 2 * num_layers, "one set of tensors and caches per layer");
  const int64_t tokens = embedded.size(0), q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  at::Tensor hidden = embedded.contiguous();
  at::Tensor normed;
  for (int64_t l = 0; l < num_layers; ++l) {
    auto get = [&](LayerTensor which) { return layer_tensor(layers, l, which); };
    normed = l == 0 ? rms_norm(hidden, required(get(kInputNorm), "input norm"), eps) : normed;
    const at::Tensor qkv = layer_linear(normed, required(get(kQkv), "qkv weight"), get(kQkvScales), get(kQkvBias));
    at::Tensor q = qkv.narrow(1, 0, q_size).view({tokens, num_heads, head_dim});
    at::Tensor k = qkv.narrow(1, q_size, kv_size).view({tokens, num_kv_heads, head_dim});
    const at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size).view({tokens, num_kv_heads, head_dim});
    if (get(kQNorm).has_value()) {
      q = rms_norm(q, *get(kQNorm), eps);
      k = rms_norm(k, required(get(kKNorm), "k norm"), eps);
    }
    rotary_(q, k, cos, sin);
    at::Tensor k_cache = caches[2 * l], v_cache = caches[2 * l + 1];
    store_kv(k, v, k_cache, v_cache, slot_mapping);
    at::Tensor attended = at::empty({tokens, num_heads, head_dim}, qkv.options());
    paged_attention(q, k_cache, v_cache, block_tables, query_start, query_len, context_lens, block_size, scale,
                    attended);
    const at::Tensor out = layer_linear(attended.view({tokens, q_size}), required(get(kOut), "o weight"),
                                        get(kOutScales), get(kOutBias));
    auto [post_normed, residual] = add_rms_norm(out, hidden, required(get(kPostNorm), "post norm"), eps);
    const at::Tensor gate_up = layer_linear(post_normed, required(get(kGateUp), "gate/up weight"),
                                            get(kGateUpScales), std::nullopt);
    const at::Tensor mlp = layer_linear(silu_mul(gate_up), required(get(kDown), "down weight"), get(kDownScales),
                                        std::nullopt);
    if (l + 1 < num_layers) {  // the next layer's input norm takes this layer's residual sum with it
      std::tie(normed, hidden) = add_rms_norm(mlp, residual, required(layer_tensor(layers, l + 1, kInputNorm),
                                                                       "input norm"), eps);
    } else {
      hidden = residual + mlp;
    }
  }
  return rms_norm(hidden, final_norm, eps);
}

// ---- a draft model's greedy proposals: several small steps, each fed its own argmax, in one call ----
//
// Sequence n first computes its chunk: `chunk_lens[n]` tokens of `chunk_tokens` (sequence after sequence) at
// `chunk_positions` (the tokens the draft has not seen yet, its newest token last), and takes the argmax of the
// first `vocab_size` logits at the chunk's last token as its first proposal; then each proposal is the input of
// a one-token decode step that gives the next, until sequence n has `steps[n]` proposals. A row whose logits are
// not all finite proposes nothing more. Returns [sequences, max steps] int64 token ids, -1 past each row's last
// proposal. The same kernels in the same order as the Python loop (embedding lookup, RoPE rows, decode_layers,
// the LM head as small_batch_linear on the scored rows, argmax), so the same numbers; every position written
// must have a KV slot in `block_tables`.

at::Tensor greedy_proposals(const at::Tensor& chunk_tokens, const at::Tensor& chunk_positions,
                            const at::Tensor& chunk_lens, const at::Tensor& steps, const at::Tensor& block_tables,
                            const at::Tensor& embedding, const at::Tensor& lm_head, int64_t vocab_size,
                            const at::Tensor& rope_cos, const at::Tensor& rope_sin,
                            const c10::List<std::optional<at::Tensor>>& layers, const at::Tensor& final_norm,
                            const std::vector<at::Tensor>& caches, int64_t num_heads, int64_t num_kv_heads,
                            int64_t head_dim, int64_t block_size, double eps, double scale) {
  check_cpu_int(chunk_tokens, "chunk_tokens", at::kLong);
  check_cpu_int(chunk_positions, "chunk_positions", at::kLong);
  check_cpu_int(chunk_lens, "chunk_lens", at::kLong);
  check_cpu_int(steps, "steps", at::kLong);
  check_cpu_int(block_tables, "block_tables", at::kInt);
  check_cpu_float(embedding, "embedding");
  check_cpu_float(lm_head, "lm_head");
  const int64_t rows = chunk_lens.numel();
  TORCH_CHECK(steps.numel() == rows && block_tables.size(0) == rows,
              "one chunk length, step count and block table per sequence");
  TORCH_CHECK(chunk_positions.numel() == chunk_tokens.numel() &&
              (rows == 0 || (chunk_lens.min().item<int64_t>() >= 1 && chunk_lens.sum().item<int64_t>() ==
                             chunk_tokens.numel())), "every sequence needs a chunk of at least one token");
  TORCH_CHECK(rows == 0 || steps.min().item<int64_t>() >= 1, "every sequence proposes at least one token");
  TORCH_CHECK(vocab_size > 0 && vocab_size <= lm_head.size(0), "vocab_size must be within the LM head's rows");
  if (rows == 0) return at::empty({0, 0}, chunk_tokens.options());
  const at::Tensor query_start = at::cumsum(chunk_lens, 0) - chunk_lens;
  const at::Tensor last_rows = query_start + chunk_lens - 1;
  at::Tensor positions = chunk_positions.index_select(0, last_rows);
  const int64_t max_steps = steps.max().item<int64_t>();
  TORCH_CHECK((positions + steps).max().item<int64_t>() <= block_tables.size(1) * block_size,
              "a position to write has no KV slot in its block table");
  const at::Tensor row_of_token = at::repeat_interleave(at::arange(rows, chunk_lens.options()), chunk_lens);
  auto run = [&](const at::Tensor& ids, const at::Tensor& position, const at::Tensor& tables,
                 const at::Tensor& token_tables, const at::Tensor& starts, const at::Tensor& lens,
                 const at::Tensor& scored) {
    const at::Tensor slots = token_tables.gather(1, at::floor_divide(position, block_size).unsqueeze(1)).squeeze(1)
                                 .to(at::kLong) * block_size + position.remainder(block_size);
    const at::Tensor embedded = embedding.index_select(0, ids);
    const at::Tensor hidden = decode_layers(
        embedded, rope_cos.index_select(0, position).to(embedded.scalar_type()),
        rope_sin.index_select(0, position).to(embedded.scalar_type()), layers, final_norm, caches, slots, tables,
        starts, lens, position.index_select(0, scored) + 1, num_heads, num_kv_heads, head_dim, block_size, eps, scale);
    return small_batch_linear(hidden.index_select(0, scored), lm_head, std::nullopt).narrow(1, 0, vocab_size);
  };
  at::Tensor proposals = at::full({rows, max_steps}, -1, chunk_tokens.options());
  at::Tensor tokens = at::empty({rows}, chunk_tokens.options()), remaining = steps.clone();
  for (int64_t step = 0; step < max_steps; ++step) {
    const at::Tensor live = step == 0 ? at::arange(rows, steps.options()) : (remaining > step).nonzero().squeeze(1);
    const int64_t count = live.numel();
    if (count == 0) break;
    at::Tensor logits;
    if (step == 0) {
      logits = run(chunk_tokens, chunk_positions, block_tables, block_tables.index_select(0, row_of_token),
                   query_start, chunk_lens, last_rows);
    } else {
      const at::Tensor tables = block_tables.index_select(0, live);
      const at::Tensor position = positions.index_select(0, live) + 1;
      const at::Tensor each = at::arange(count, position.options());
      logits = run(tokens.index_select(0, live), position, tables, tables, each, at::ones_like(position), each);
      positions.index_put_({live}, position);
    }
    const at::Tensor finite = at::isfinite(logits).all(1);
    const at::Tensor chosen = logits.argmax(1);
    proposals.select(1, step).index_put_({live}, at::where(finite, chosen, at::full_like(chosen, -1)));
    remaining.index_put_({live}, at::where(finite, remaining.index_select(0, live), at::full_like(chosen, step + 1)));
    tokens.index_put_({live}, chosen);
  }
  return proposals;
}

}  // namespace

const char* playground_cpu::active_level_name() { return level_kernels().name; }

TORCH_LIBRARY(playground_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor query_start, "
        "Tensor query_len, Tensor context_lens, int block_size, float scale, Tensor(a!) out) -> ()");
  m.def("small_batch_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("kernel_levels() -> str[]", &kernel_levels);
  m.def("use_kernel_level(str name) -> str", &use_kernel_level);
  m.def("parallel_threads_used(int tasks) -> int", &parallel_threads_used);
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("silu_mul(Tensor x) -> Tensor");
  m.def("rotary_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin) -> ()");
  m.def("store_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
  m.def("decode_layers(Tensor embedded, Tensor cos, Tensor sin, Tensor?[] layers, Tensor final_norm, "
        "Tensor(a!)[] caches, Tensor slot_mapping, Tensor block_tables, Tensor query_start, Tensor query_len, "
        "Tensor context_lens, int num_heads, "
        "int num_kv_heads, int head_dim, int block_size, float eps, float scale) -> Tensor");
  m.def("greedy_proposals(Tensor chunk_tokens, Tensor chunk_positions, Tensor chunk_lens, Tensor steps, "
        "Tensor block_tables, Tensor embedding, Tensor lm_head, int vocab_size, Tensor rope_cos, Tensor rope_sin, "
        "Tensor?[] layers, Tensor final_norm, Tensor(a!)[] caches, int num_heads, int num_kv_heads, int head_dim, int block_size, "
        "float eps, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(playground_cpu, CPU, m) {
  m.impl("paged_attention", &paged_attention);
  m.impl("small_batch_linear", &small_batch_linear);
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("silu_mul", &silu_mul);
  m.impl("rotary_", &rotary_);
  m.impl("store_kv", &store_kv);
  m.impl("decode_layers", &decode_layers);
  m.impl("greedy_proposals", &greedy_proposals);
}
