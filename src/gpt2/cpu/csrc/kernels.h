// The kernels of cpu_decode.cpp that need nothing of ATen: the activations' quantization, one block of each product,
// and the decode step's LayerNorm, GELU and attention rows, each written once on the vector layer of simd.h. The
// ops in cpu_decode.cpp split the work over threads and call these; tests/native/kernel_harness.cpp calls them too,
// without torch, for each ISA (NEON cross-compiled and run under qemu), against the portable build's results.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace GPT2_OPS {

namespace v = simd;  // the vector layer: v::F (W floats), v::I (W int32), v::P (W int16 pairs)
constexpr int W = v::W;
constexpr int TV = v::TILE_VECTORS;

enum Kind : int64_t { F32 = 0, BF16 = 1, I8 = 2, I4 = 3 };
constexpr int64_t TILE = 16;    // output rows per tile
constexpr int64_t BLOCK = 32;   // inputs per activation-quantization block (and per int4 group)
constexpr int64_t MAX_ROWS = 4; // row-major formats: activation rows computed together while a weight block is loaded
// Up to this many activation rows, row-major products take one weight row at a time against all of them (one
// sequential stream a thread, as for one row), and int8 / int4 ones each block against all of them; past it,
// v::ROW_BLOCK weight rows a block, and a whole int8 / int4 tile against PROMPT_ROWS rows, which do more arithmetic
// per load. For the 124M float32 model the first is faster up to 4 rows and the second at 8
// (`gpt2 bench decode --precisions float32 --batch-sizes 1,2,4,8` re-derives FEW_ROWS).
constexpr int64_t FEW_ROWS = 4;
// Activation rows an int8 / int4 tile multiplies at once past FEW_ROWS (`tile_rows`): R x TV int32 dot products and
// as many float sums, with a vector of weights and one of activations, in the ISA's registers.
constexpr int PROMPT_ROWS = std::clamp((v::REGISTERS - 4) / (2 * TV), 1, 12);

// How far ahead of the weights being read a thread asks for cache lines (`prefetch_ahead`): a stream of weights
// then keeps more lines in flight than the out-of-order window alone reaches, the more so with narrow vectors. 2048
// bytes is the fastest of 0 / 1024 / 2048 / 4096 / 8192 for the 124M model's float32 and bfloat16 decode on AVX-512
// and AVX2 (`GPT2_KERNEL_CFLAGS=-DGPT2_PREFETCH_BYTES=N gpt2 bench decode --precisions float32,bfloat16`).
#ifndef GPT2_PREFETCH_BYTES
#define GPT2_PREFETCH_BYTES 2048
#endif
constexpr int64_t PREFETCH_BYTES = GPT2_PREFETCH_BYTES;

static_assert(TILE % W == 0 && BLOCK % (2 * W) == 0, "a tile and a block are whole vectors");

// The cache lines PREFETCH_BYTES past the `bytes` about to be read at `at`.
template <typename T>
static inline void prefetch_ahead(const T* at, int64_t bytes) {
  const char* ahead = reinterpret_cast<const char*>(at) + PREFETCH_BYTES;
  for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(ahead + line);
}

// ------------------------------------------------------------------------------------------ activations
// x (N, K) float32 -> int16 codes (N, K) and one scale per block of 32 (N, K/32): x ~= code * scale.
// Also each block's sum of the values the codes stand for (N, K/32), which the int4 minimum multiplies.
struct QuantizedRows {
  std::vector<int16_t> codes;
  std::vector<float> scales;
  std::vector<float> sums;
};

static QuantizedRows quantize_rows(const float* x, int64_t N, int64_t K) {
  const int64_t blocks = K / BLOCK;
  QuantizedRows q{std::vector<int16_t>(N * K), std::vector<float>(N * blocks), std::vector<float>(N * blocks)};
  for (int64_t n = 0; n < N; n++) {
    for (int64_t b = 0; b < blocks; b++) {
      const float* values = x + n * K + b * BLOCK;
      int16_t* codes = q.codes.data() + n * K + b * BLOCK;
      v::F largest = v::zero();
      for (int64_t i = 0; i < BLOCK; i += W) largest = v::max(largest, v::abs(v::load(values + i)));
      const float amax = v::reduce_max(largest);
      const v::F inverse = v::set1(amax > 0.0f ? 32767.0f / amax : 0.0f);
      v::I total = v::izero();
      for (int64_t i = 0; i < BLOCK; i += W) {
        const v::I code = v::to_int(v::mul(v::load(values + i), inverse));  // nearest, ties to even
        v::store_i16(codes + i, code);
        total = v::iadd(total, code);
      }
      const float scale = amax / 32767.0f;
      q.scales[n * blocks + b] = scale;
      q.sums[n * blocks + b] = scale * static_cast<float>(v::ireduce_add(total));
    }
  }
  return q;
}

// The activation codes as the int8 / int4 products of many rows read them: per group of PROMPT_ROWS rows (the last
// padded with zeros), for each pair of inputs (2p, 2p + 1) the group's rows side by side as 32-bit lanes:
// (groups, K / 2, PROMPT_ROWS) int32. Each row's pair is then one broadcast at an offset known when compiling, where
// rows K apart take an address register each (12 rows spill them to the stack).
static std::vector<int32_t> row_panels(const QuantizedRows& xq, int64_t N, int64_t K) {
  const int64_t groups = (N + PROMPT_ROWS - 1) / PROMPT_ROWS, pairs = K / 2;
  std::vector<int32_t> panels(groups * pairs * PROMPT_ROWS, 0);
  for (int64_t n = 0; n < N; n++) {
    int32_t* group = panels.data() + (n / PROMPT_ROWS) * pairs * PROMPT_ROWS + n % PROMPT_ROWS;
    for (int64_t p = 0; p < pairs; p++) std::memcpy(group + p * PROMPT_ROWS, xq.codes.data() + n * K + 2 * p, 4);
  }
  return panels;
}

// ------------------------------------------------------------------------------------------ the products
// Every product writes y[n, o] = (accumulate ? y[n, o] : 0) + sum_k W[o, k] x[n, k] + bias[o] for o < O, with
// y's rows `ldy` floats apart. Work is split over output rows across torch's intra-op threads, and each
// thread streams its share of the weight from memory once whatever N is.
struct Output {
  float* y;
  int64_t ldy;
  const float* bias;  // nullptr: none
  bool accumulate;
  void store(int64_t n, int64_t o, float value) const {
    if (bias) value += bias[o];
    float& slot = y[n * ldy + o];
    slot = accumulate ? slot + value : value;
  }
  // row n's outputs o0..o0+rows-1 from values[0..rows), each times scale[o] where given (int8's row scales); a whole
  // tile of 16 as vectors
  void store_tile(int64_t n, int64_t o0, int64_t rows, const float* values, const float* scale) const {
    if (rows < TILE) {
      for (int64_t r = 0; r < rows; r++) store(n, o0 + r, scale ? values[r] * scale[o0 + r] : values[r]);
      return;
    }
    for (int64_t i = 0; i < TILE; i += W) {
      v::F value = v::load(values + i);
      if (scale) value = v::mul(value, v::load(scale + o0 + i));
      if (bias) value = v::add(value, v::load(bias + o0 + i));
      float* slot = y + n * ldy + o0 + i;
      v::store(slot, accumulate ? v::add(v::load(slot), value) : value);
    }
  }
};

// The activations of a row-major product: xf float32 (F32), or for BF16 xb their bfloat16 bits and xr the same
// values widened back to float32 (each ISA multiplies whichever it can). Rows K apart.
struct RowActivations {
  const float* xf;
  const uint16_t* xb;
  const float* xr;
  RowActivations at(int64_t row, int64_t K) const {
    return {xf ? xf + row * K : nullptr, xb ? xb + row * K : nullptr, xr ? xr + row * K : nullptr};
  }
};

// W[row] . x over [k, k + V) into acc, V = W inputs (F32) or 2W (BF16)
template <typename Wt>
static inline v::F dot_step(v::F acc, const Wt* row, const RowActivations& x, int64_t k) {
  if constexpr (std::is_same_v<Wt, float>) return v::fma(v::load(row + k), v::load(x.xf + k), acc);
  else return v::dot_bf16x2(acc, row + k, x.xb + k, x.xr + k);
}

template <typename Wt>
constexpr int64_t STEP = std::is_same_v<Wt, float> ? W : 2 * W;  // inputs one dot_step takes

template <typename Wt>
static inline float scalar_product(const Wt* row, const RowActivations& x, int64_t k) {
  if constexpr (std::is_same_v<Wt, float>) return row[k] * x.xf[k];
  else return bf16_to_float(row[k]) * x.xr[k];
}

// sums[r * NR + n] = W[r] . x[n] for R weight rows (`w`, K apart) and NS activation rows. NS is a compile-time
// count so the R x NS accumulators stay in registers (a runtime count spills them to the stack).
template <typename Wt, int64_t R, int64_t NR, int64_t NS>
static inline void rowmajor_block(const Wt* w, const RowActivations& x, int64_t K, float* sums) {
  // C independent chains of sums per (weight row, activation row), over alternating vectors of k: with few rows
  // (1 x 2 ... 1 x 4) one chain each would wait on the latency of its previous fused multiply-add.
  constexpr int64_t C = R * NS >= 8 ? 1 : (R * NS >= 4 ? 2 : 4);
  constexpr int64_t V = STEP<Wt>;
  v::F acc[C][R][NS];
  for (int64_t c = 0; c < C; c++)
    for (int64_t r = 0; r < R; r++)
      for (int64_t n = 0; n < NS; n++) acc[c][r][n] = v::zero();
  auto step = [&](int64_t c, int64_t k) {
    for (int64_t r = 0; r < R; r++) prefetch_ahead(w + r * K + k, V * sizeof(Wt));
    for (int64_t n = 0; n < NS; n++) {
      const RowActivations xn = x.at(n, K);
      for (int64_t r = 0; r < R; r++) acc[c][r][n] = dot_step(acc[c][r][n], w + r * K, xn, k);
    }
  };
  int64_t k = 0;
  for (; k + C * V <= K; k += C * V)
    for (int64_t c = 0; c < C; c++) step(c, k + c * V);
  for (; k + V <= K; k += V) step(0, k);
  for (int64_t r = 0; r < R; r++)
    for (int64_t n = 0; n < NS; n++) {
      v::F total = acc[0][r][n];
      for (int64_t c = 1; c < C; c++) total = v::add(total, acc[c][r][n]);
      float sum = v::reduce_add(total);
      for (int64_t rest = k; rest < K; rest++) sum += scalar_product(w + r * K, x.at(n, K), rest);
      sums[r * NR + n] = sum;
    }
}

// rowmajor_block for a runtime count ns in [1, NS]
template <typename Wt, int64_t R, int64_t NR, int64_t NS>
static inline void rowmajor_blocks(int64_t ns, const Wt* w, const RowActivations& x, int64_t K, float* sums) {
  if constexpr (NS > 1) {
    if (ns < NS) return rowmajor_blocks<Wt, R, NR, NS - 1>(ns, w, x, K, sums);
  }
  rowmajor_block<Wt, R, NR, NS>(w, x, K, sums);
}

// Calls visit(p, h, pairs) for each pair p of inputs (2p, 2p + 1) of a tile's block b, decoded: vector h of the
// tile's 16 rows as int16 pairs.
template <Kind kind, typename Visit>
static inline void for_each_pair(const uint8_t* tile_weights, int64_t b, Visit&& visit) {
  if constexpr (kind == I8) {
    const uint8_t* bw = tile_weights + b * BLOCK * TILE;  // 16 pairs x 16 rows x 2 bytes
#pragma GCC unroll 16  // whole, so that each pair's chain of sums (pair % A) is a register, not a stack slot
    for (int64_t pair = 0; pair < BLOCK / 2; pair++)
      for (int h = 0; h < TV; h++) visit(pair, h, v::load_i8_pairs(bw + pair * 2 * TILE + 2 * W * h));
  } else {
    const uint8_t* bw = tile_weights + b * BLOCK * TILE / 2;  // 8 chunks x 16 rows x 2 bytes
#pragma GCC unroll 8
    for (int64_t chunk = 0; chunk < BLOCK / 4; chunk++)
      for (int h = 0; h < TV; h++) {
        const v::P bytes = v::load_u8_pairs(bw + chunk * 2 * TILE + 2 * W * h);
        visit(2 * chunk, h, v::low_nibbles(bytes));       // codes of inputs 4c, 4c+1
        visit(2 * chunk + 1, h, v::high_nibbles(bytes));  // codes of inputs 4c+2, 4c+3
      }
  }
}

static inline void load_group_params(const c10::Half* params, v::F* scale, v::F* minimum) {
  for (int h = 0; h < TV; h++) {
    scale[h] = v::load_half(params + h * W);
    minimum[h] = v::load_half(params + TILE + h * W);
  }
}

// The exact int32 dot products of one block with activation rows n..n+R-1, A chains per row and vector so that about
// 8 independent `dot_pairs` are in flight (one chain would wait on each product's latency); then scaled into the
// rows' float sums.
template <int R>
struct BlockDots {
  static constexpr int A = R * TV >= 8 ? 1 : 8 / (R * TV);
  v::I dot[R][TV][A];
  const QuantizedRows& xq;
  const int16_t* x;  // row n's codes of this block; rows K apart
  int64_t K;

  BlockDots(const QuantizedRows& xq, int64_t n, int64_t K, int64_t b)
      : xq(xq), x(xq.codes.data() + n * K + b * BLOCK), K(K) {
    for (int r = 0; r < R; r++)
      for (int h = 0; h < TV; h++)
        for (int a = 0; a < A; a++) dot[r][h][a] = v::izero();
  }

  void add(int64_t pair, int h, v::P pairs) {
    for (int r = 0; r < R; r++) {
      int32_t x_pair;  // activations 2p, 2p + 1 of the row as one 32-bit lane (memcpy: no aliasing of int16 data)
      std::memcpy(&x_pair, x + r * K + 2 * pair, sizeof x_pair);
      dot[r][h][pair % A] = v::dot_pairs(dot[r][h][pair % A], pairs, x_pair);
    }
  }

  // the same with the rows' pairs read from their panel (`row_panels`), block b's part: pair p of row r at
  // panel[p * PROMPT_ROWS + r], an offset the compiler knows
  void add(int64_t pair, int h, v::P pairs, const int32_t* panel) {
    for (int r = 0; r < R; r++) dot[r][h][pair % A] = v::dot_pairs(dot[r][h][pair % A], pairs, panel[pair * PROMPT_ROWS + r]);
  }

  // acc[r] (the 16 rows' float sums of activation row n + r) += the dots times the block's activation scale (I8: the
  // row scales come at the end), times the group's scale plus its minimum times the activations' sum (I4)
  template <Kind kind>
  void scale_into(int64_t n, int64_t blocks, int64_t b, const v::F* scale, const v::F* minimum, v::F (&acc)[R][TV]) const {
    for (int r = 0; r < R; r++) {
      const int64_t at = (n + r) * blocks + b;
      const v::F x_scale = v::set1(xq.scales[at]);
      for (int h = 0; h < TV; h++) {
        v::I total = dot[r][h][0];
        for (int a = 1; a < A; a++) total = v::iadd(total, dot[r][h][a]);
        if constexpr (kind == I8) {
          acc[r][h] = v::fma(v::to_float(total), x_scale, acc[r][h]);
        } else {
          const v::F scaled = v::mul(v::to_float(total), x_scale);
          acc[r][h] = v::fma(minimum[h], v::set1(xq.sums[at]), v::fma(scaled, scale[h], acc[r][h]));
        }
      }
    }
  }

  // the same into sums[n + r, 16 rows] in memory
  template <Kind kind>
  void scale_into(int64_t n, int64_t blocks, int64_t b, const v::F* scale, const v::F* minimum, float* sums) const {
    v::F acc[R][TV];
    for (int r = 0; r < R; r++)
      for (int h = 0; h < TV; h++) acc[r][h] = v::load(sums + (n + r) * TILE + h * W);
    scale_into<kind>(n, blocks, b, scale, minimum, acc);
    for (int r = 0; r < R; r++)
      for (int h = 0; h < TV; h++) v::store(sums + (n + r) * TILE + h * W, acc[r][h]);
  }
};

// sums[n, 16 rows] += block b of a tile . rows n..n+R-1 of x, for a few rows (N <= 4): each pair multiplied into
// every row as it is decoded (no decoded block kept: with narrow vectors AVX2's would be 32 registers of 16), the
// sums in memory from block to block.
template <Kind kind, int R>
static inline void accumulate_rows_streaming(const uint8_t* tile_weights, const c10::Half* params,
                                             const QuantizedRows& xq, int64_t n, int64_t K, int64_t blocks, int64_t b,
                                             float* sums) {
  BlockDots<R> dots(xq, n, K, b);
  for_each_pair<kind>(tile_weights, b, [&](int64_t pair, int h, v::P pairs) { dots.add(pair, h, pairs); });
  v::F scale[TV], minimum[TV];
  if constexpr (kind == I4) load_group_params(params, scale, minimum);
  dots.template scale_into<kind>(n, blocks, b, scale, minimum, sums);
}

// out[r, 16 rows] = a tile's 16 rows . activation rows n..n+R-1 over all K inputs (before int8's row scales), for
// many rows (prompts): each pair multiplied into all R rows as it is decoded, and the float sums kept in registers
// from block to block (R = PROMPT_ROWS fills them). `panel`: the rows' group in `row_panels`.
template <Kind kind, int R>
static inline void tile_rows(const uint8_t* tile_weights, const c10::Half* tile_params, const QuantizedRows& xq,
                             const int32_t* panel, int64_t n, int64_t K, float* out) {
  const int64_t blocks = K / BLOCK;
  v::F acc[R][TV];
  for (int r = 0; r < R; r++)
    for (int h = 0; h < TV; h++) acc[r][h] = v::zero();
  constexpr int64_t block_bytes = kind == I8 ? BLOCK * TILE : BLOCK * TILE / 2;
  for (int64_t b = 0; b < blocks; b++) {
    prefetch_ahead(tile_weights + b * block_bytes, block_bytes);  // the first rows of a tile read it from memory
    BlockDots<R> dots(xq, n, K, b);
    const int32_t* block_panel = panel + b * BLOCK / 2 * PROMPT_ROWS;
    for_each_pair<kind>(tile_weights, b, [&](int64_t pair, int h, v::P pairs) { dots.add(pair, h, pairs, block_panel); });
    v::F scale[TV], minimum[TV];
    if constexpr (kind == I4) load_group_params(tile_params + b * 2 * TILE, scale, minimum);
    dots.template scale_into<kind>(n, blocks, b, scale, minimum, acc);
  }
  for (int r = 0; r < R; r++)
    for (int h = 0; h < TV; h++) v::store(out + r * TILE + h * W, acc[r][h]);
}

// tile_rows for a runtime count rows in [1, R]
template <Kind kind, int R>
static inline void tile_rows_upto(int64_t rows, const uint8_t* tile_weights, const c10::Half* tile_params,
                                  const QuantizedRows& xq, const int32_t* panel, int64_t n, int64_t K, float* out) {
  if constexpr (R > 1) {
    if (rows < R) return tile_rows_upto<kind, R - 1>(rows, tile_weights, tile_params, xq, panel, n, K, out);
  }
  tile_rows<kind, R>(tile_weights, tile_params, xq, panel, n, K, out);
}

// ------------------------------------------------------------------------------------------ the decode step
// LayerNorm over C with population variance: y = (x - mean) / sqrt(var + eps) * gain + bias.
static void layer_norm(const float* x, float* y, const float* gain, const float* bias, int64_t C, float eps) {
  int64_t i = 0;
  v::F sum = v::zero();
  for (; i + W <= C; i += W) sum = v::add(sum, v::load(x + i));
  float total = v::reduce_add(sum);
  for (; i < C; i++) total += x[i];
  const float mean = total / static_cast<float>(C);
  const v::F m = v::set1(mean);
  v::F sq = v::zero();
  for (i = 0; i + W <= C; i += W) {
    const v::F d = v::sub(v::load(x + i), m);
    sq = v::fma(d, d, sq);
  }
  float squares = v::reduce_add(sq);
  for (; i < C; i++) squares += (x[i] - mean) * (x[i] - mean);
  const float rstd = 1.0f / std::sqrt(squares / static_cast<float>(C) + eps);
  const v::F r = v::set1(rstd);
  for (i = 0; i + W <= C; i += W) {
    const v::F normed = v::mul(v::sub(v::load(x + i), m), r);
    v::store(y + i, v::fma(normed, v::load(gain + i), v::load(bias + i)));
  }
  for (; i < C; i++) y[i] = (x[i] - mean) * rstd * gain[i] + bias[i];
}

static void gelu_inplace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + W <= n; i += W) v::store(x + i, v::gelu(v::load(x + i)));
  for (; i < n; i++) x[i] = v::first_lane(v::gelu(v::set1(x[i])));  // the same formula, one lane
}

template <typename T>
static inline float load_as_float(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>) return p[i];
  else return bf16_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
}

template <typename T>
static inline void store_from_float(T* p, int64_t i, float value) {
  if constexpr (std::is_same_v<T, float>) p[i] = value;
  else reinterpret_cast<uint16_t*>(p)[i] = float_to_bf16(value);
}

template <typename T>
static inline v::F load_vector(const T* p) {  // W values of a cache row as float32
  if constexpr (std::is_same_v<T, float>) return v::load(p);
  else return v::load_bf16(reinterpret_cast<const uint16_t*>(p));
}

// q . key over hs values (a query row against one cached key)
template <typename T>
static inline float dot_row(const float* q, const T* key, int64_t hs) {
  int64_t i = 0;
  v::F acc = v::zero();
  for (; i + W <= hs; i += W) acc = v::fma(v::load(q + i), load_vector(key + i), acc);
  float total = v::reduce_add(acc);
  for (; i < hs; i++) total += q[i] * load_as_float(key, i);
  return total;
}

// out = sum_s weights[s] * scale * values[s] over S cached value rows `stride` apart, hs values each
template <typename T>
static void weighted_sum(float* out, const float* weights, float scale, const T* values, int64_t stride, int64_t S,
                         int64_t hs) {
  constexpr int64_t HEAD = 64;  // GPT-2's head size: the output row stays in registers over all S rows
  if (hs == HEAD) {
    v::F acc[HEAD / W];
    for (int64_t j = 0; j < HEAD / W; j++) acc[j] = v::zero();
    for (int64_t s = 0; s < S; s++) {
      if (weights[s] == 0.0f) continue;  // a masked column
      const v::F weight = v::set1(weights[s]);
      for (int64_t j = 0; j < HEAD / W; j++) acc[j] = v::fma(weight, load_vector(values + s * stride + W * j), acc[j]);
    }
    for (int64_t j = 0; j < HEAD / W; j++) v::store(out + W * j, v::mul(acc[j], v::set1(scale)));
    return;
  }
  for (int64_t i = 0; i < hs; i++) out[i] = 0.0f;
  for (int64_t s = 0; s < S; s++) {
    if (weights[s] == 0.0f) continue;
    for (int64_t i = 0; i < hs; i++) out[i] += weights[s] * load_as_float(values + s * stride, i);
  }
  for (int64_t i = 0; i < hs; i++) out[i] *= scale;
}

}  // namespace GPT2_OPS
