// CPU kernels for decoding GPT-2; gpt2/cpu/kernels.py builds this file on first use (torch's extension
// builder, -O3 -march=native) and falls back to the PyTorch layouts when it cannot.
//
// Why: decoding reads every weight once per step, so at 1-16 rows a CPU decodes at the speed it streams the
// weights from memory. PyTorch's one-row products stream bf16 / int8 / int4 weights well below that speed, and a
// step of ~250 small framework ops costs 2-3 ms on top. Here every precision streams at close to the memory's
// speed, and `Decoder::step` runs a whole one-token step (embeddings, the blocks, the final LayerNorm, the LM
// head) in one call.
//
// Notation: N = rows of activations (tokens), K = in_features, O = out_features, B = batch rows of a decode
// step, C = n_embd, nh = heads, hs = head size, S = key columns visible, L = layers.
//
// Weight formats (`Kind`):
//   F32   (O, K) float32 row-major: nn.Linear's own weight, shared with the model.
//   BF16  (O, K) bfloat16 row-major: likewise. Activations are rounded to bfloat16 first, as a bfloat16
//         model's matmul does, and products are summed in float32.
//   I8    tiles of 16 output rows: (O/16, K/2, 16, 2) int8 (byte 2r+j of a pair = W[r, k+j]), and one float32
//         scale per row: W = q * scale.
//   I4    tiles of 16 output rows, groups of 32 inputs: (O/16, K/32, 8, 16, 2) uint8 holding two 4-bit codes
//         (chunk c of a group covers inputs 4c..4c+3; byte 2r+j = code(r, 4c+j) | code(r, 4c+2+j) << 4), and
//         (O/16, K/32, 2, 16) float16 scale and minimum per row and group: W = code * scale + minimum.
//   For I8 and I4 the activations are quantized to int16 in blocks of 32 with one float scale each (error at
//   most 1/65534 of the block's largest value, far below the weights' own quantization), so the products are
//   exact integer dot products (AVX-512 VNNI `vpdpwssd`), scaled once per block.
// O is padded to a multiple of 16 in the tiled formats; K must be a multiple of 32 (kernels.py checks).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define GPT2_AVX512 1
#include <immintrin.h>
#endif

// The namespace of the ops (torch.ops.gpt2, torch.classes.gpt2) and of this file's C++ names; a test builds a
// portable copy under another, which must not share C++ type names with this one.
#ifndef GPT2_OPS
#define GPT2_OPS gpt2
#endif

namespace GPT2_OPS {

enum Kind : int64_t { F32 = 0, BF16 = 1, I8 = 2, I4 = 3 };
constexpr int64_t TILE = 16;    // output rows per tile (one AVX-512 register of float32)
constexpr int64_t BLOCK = 32;   // inputs per activation-quantization block (and per int4 group)
constexpr int64_t MAX_ROWS = 4; // row-major formats: activation rows computed together while 4 weight rows are loaded
// Up to this many activation rows, row-major products take one weight row at a time against all of them (one
// sequential stream a thread, as for one row); past it, 4 weight rows a block (4 x 4 sums in registers), which
// does more arithmetic per load. For the 124M float32 model the first is faster up to 4 rows and the second at 8
// (`gpt2 bench decode --precisions float32 --batch-sizes 1,2,4,8` re-derives FEW_ROWS).
constexpr int64_t FEW_ROWS = 4;

// ------------------------------------------------------------------------------------------ scalar helpers
static inline float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t float_to_bf16(float f) {  // round to nearest even, as torch does
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

static inline float gelu_tanh(float x) {  // GPT-2's GELU, the tanh approximation
  const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

#ifdef GPT2_AVX512
// exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2, with Cephes' expf polynomial (~1 ulp).
static inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.3762626647949f)), _mm512_set1_ps(88.3762626647949f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

static inline __m512 gelu512(__m512 x) {  // tanh(u) = 1 - 2 / (exp(2u) + 1)
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  const __m512 u = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f), _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x3, x));
  const __m512 e = exp512(_mm512_add_ps(u, u));
  const __m512 t = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(_mm512_set1_ps(1.0f), t));
}

// 16 int32 lanes += pairs of int16 products: the VNNI instruction, or its two-instruction equivalent.
static inline __m512i dot_pairs(__m512i acc, __m512i a, __m512i b) {
#ifdef __AVX512VNNI__
  return _mm512_dpwssd_epi32(acc, a, b);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}
#endif

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
      const float* v = x + n * K + b * BLOCK;
      int16_t* codes = q.codes.data() + n * K + b * BLOCK;
      int32_t total = 0;
#ifdef GPT2_AVX512
      const __m512 first = _mm512_loadu_ps(v), second = _mm512_loadu_ps(v + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(first), _mm512_abs_ps(second)));
      const __m512 inverse = _mm512_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
      const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(first, inverse));  // rounds to nearest even
      const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(second, inverse));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), _mm512_cvtepi32_epi16(a));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 16), _mm512_cvtepi32_epi16(c));
      total = _mm512_reduce_add_epi32(_mm512_add_epi32(a, c));
#else
      float amax = 0.0f;
      for (int64_t i = 0; i < BLOCK; i++) amax = std::max(amax, std::fabs(v[i]));
      const float inverse = amax > 0.0f ? 32767.0f / amax : 0.0f;
      for (int64_t i = 0; i < BLOCK; i++) {
        const int32_t code = static_cast<int32_t>(std::nearbyint(v[i] * inverse));
        codes[i] = static_cast<int16_t>(code);
        total += code;
      }
#endif
      const float scale = amax / 32767.0f;
      q.scales[n * blocks + b] = scale;
      q.sums[n * blocks + b] = scale * static_cast<float>(total);
    }
  }
  return q;
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
};

#ifdef GPT2_AVX512
static inline __m512 widen_bf16(const uint16_t* p) {  // 16 bfloat16 values (their bits) as float32
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// sums[r * NR + n] = W[r] . x[n] for R weight rows (`w`, K apart) and NS activation rows (xf or xb, K apart). NS
// is a compile-time count so the R x NS accumulators stay in registers (a runtime count spills them to the stack).
template <typename W, int64_t R, int64_t NR, int64_t NS>
static inline void rowmajor_block(const W* w, const float* xf, const uint16_t* xb, int64_t K, float* sums) {
  // C independent chains of sums per (weight row, activation row), over alternating vectors of k: with few rows
  // (1 x 2 ... 1 x 4) one chain each would wait on the latency of its previous fused multiply-add.
  constexpr int64_t C = R * NS >= 8 ? 1 : (R * NS >= 4 ? 2 : 4);
  __m512 acc[C][R][NS];
  for (int64_t c = 0; c < C; c++)
    for (int64_t r = 0; r < R; r++)
      for (int64_t n = 0; n < NS; n++) acc[c][r][n] = _mm512_setzero_ps();
  // one vector step: 16 inputs (F32) or 32 (BF16) at k into chain c
  auto step = [&](int64_t c, int64_t k) {
    if constexpr (std::is_same_v<W, float>) {
      __m512 wv[R];
      for (int64_t r = 0; r < R; r++) wv[r] = _mm512_loadu_ps(w + r * K + k);
      for (int64_t n = 0; n < NS; n++) {
        const __m512 xv = _mm512_loadu_ps(xf + n * K + k);
        for (int64_t r = 0; r < R; r++) acc[c][r][n] = _mm512_fmadd_ps(wv[r], xv, acc[c][r][n]);
      }
    } else {
#ifdef __AVX512BF16__
      __m512i wv[R];
      for (int64_t r = 0; r < R; r++) wv[r] = _mm512_loadu_si512(w + r * K + k);
      for (int64_t n = 0; n < NS; n++) {
        const __m512i xv = _mm512_loadu_si512(xb + n * K + k);
        for (int64_t r = 0; r < R; r++) acc[c][r][n] = _mm512_dpbf16_ps(acc[c][r][n], (__m512bh)wv[r], (__m512bh)xv);
      }
#else
      for (int64_t half = 0; half < 32; half += 16) {
        __m512 wv[R];
        for (int64_t r = 0; r < R; r++) wv[r] = widen_bf16(w + r * K + k + half);
        for (int64_t n = 0; n < NS; n++) {
          const __m512 xv = widen_bf16(xb + n * K + k + half);
          for (int64_t r = 0; r < R; r++) acc[c][r][n] = _mm512_fmadd_ps(wv[r], xv, acc[c][r][n]);
        }
      }
#endif
    }
  };
  constexpr int64_t V = std::is_same_v<W, float> ? 16 : 32;  // inputs a vector step takes
  int64_t k = 0;
  for (; k + C * V <= K; k += C * V)
    for (int64_t c = 0; c < C; c++) step(c, k + c * V);
  for (; k < K; k += V) step(0, k);
  for (int64_t r = 0; r < R; r++)
    for (int64_t n = 0; n < NS; n++) {
      __m512 total = acc[0][r][n];
      for (int64_t c = 1; c < C; c++) total = _mm512_add_ps(total, acc[c][r][n]);
      sums[r * NR + n] = _mm512_reduce_add_ps(total);
    }
}

// rowmajor_block for a runtime count ns in [1, NS]
template <typename W, int64_t R, int64_t NR, int64_t NS>
static inline void rowmajor_blocks(int64_t ns, const W* w, const float* xf, const uint16_t* xb, int64_t K, float* sums) {
  if constexpr (NS > 1) {
    if (ns < NS) return rowmajor_blocks<W, R, NR, NS - 1>(ns, w, xf, xb, K, sums);
  }
  rowmajor_block<W, R, NR, NS>(w, xf, xb, K, sums);
}
#endif

// F32 and BF16 against one activation row (a lone decode step): y[0, o] = W[o] . x, weight row after weight row,
// four accumulators a row. Each thread reads its share of W as one sequential stream, which the hardware
// prefetchers follow best: faster than blocks of 8 weight rows read side by side (8 streams 3 KB apart) where
// memory is fast, equal where it is contended (`gpt2 bench decode --precisions float32,bfloat16`).
template <typename W>
static void rowwise_product(const W* w, const float* xf, const uint16_t* xb, int64_t K, int64_t O, const Output& out) {
  at::parallel_for(0, O, 64, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; o++) {
      const W* row = w + o * K;
      int64_t k = 0;
      float total = 0.0f;
#ifdef GPT2_AVX512
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      if constexpr (std::is_same_v<W, float>) {
        for (; k + 64 <= K; k += 64)
          for (int64_t j = 0; j < 4; j++)
            acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(row + k + 16 * j), _mm512_loadu_ps(xf + k + 16 * j), acc[j]);
        for (; k + 16 <= K; k += 16) acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(row + k), _mm512_loadu_ps(xf + k), acc[0]);
      } else {
        // 32 bfloat16 pairs a vector: with AVX512-BF16 one dot-product instruction, else widened to float32
        auto dot32 = [&](__m512 a, int64_t at) {
#ifdef __AVX512BF16__
          return _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(row + at), (__m512bh)_mm512_loadu_si512(xb + at));
#else
          a = _mm512_fmadd_ps(widen_bf16(row + at), widen_bf16(xb + at), a);
          return _mm512_fmadd_ps(widen_bf16(row + at + 16), widen_bf16(xb + at + 16), a);
#endif
        };
        for (; k + 128 <= K; k += 128)
          for (int64_t j = 0; j < 4; j++) acc[j] = dot32(acc[j], k + 32 * j);
        for (; k + 32 <= K; k += 32) acc[0] = dot32(acc[0], k);
      }
      total = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
#endif
      for (; k < K; k++) {
        if constexpr (std::is_same_v<W, float>) total += row[k] * xf[k];
        else total += bf16_to_float(row[k]) * bf16_to_float(xb[k]);
      }
      out.store(0, o, total);
    }
  });
}

// F32 and BF16 against several activation rows: row-major weights (W = float or the bfloat16 bits as uint16_t), R
// rows at a time against NR activation rows, a horizontal sum per row at the end. xf: the activations (F32); xb:
// the activations rounded to bfloat16 (BF16).
template <typename W, int64_t R = 4, int64_t NR = MAX_ROWS>
static void rowmajor_product(const W* w, const float* xf, const uint16_t* xb, int64_t N, int64_t K, int64_t O,
                             const Output& out) {
  at::parallel_for(0, (O + R - 1) / R, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; block++) {
      const int64_t o0 = block * R, rows = std::min(R, O - o0);
      for (int64_t n0 = 0; n0 < N; n0 += NR) {
        const int64_t ns = std::min(NR, N - n0);
        float sums[R][NR] = {};
#ifdef GPT2_AVX512
        if (rows == R) {
          const W* wb = w + o0 * K;
          const float* xfb = xf ? xf + n0 * K : nullptr;
          const uint16_t* xbb = xb ? xb + n0 * K : nullptr;
          rowmajor_blocks<W, R, NR, NR>(ns, wb, xfb, xbb, K, &sums[0][0]);
        } else
#endif
        {
          for (int64_t r = 0; r < rows; r++)
            for (int64_t n = 0; n < ns; n++) {
              float total = 0.0f;
              for (int64_t k = 0; k < K; k++) {
                if constexpr (std::is_same_v<W, float>) {
                  total += w[(o0 + r) * K + k] * xf[(n0 + n) * K + k];
                } else {
                  total += bf16_to_float(w[(o0 + r) * K + k]) * bf16_to_float(xb[(n0 + n) * K + k]);
                }
              }
              sums[r][n] = total;
            }
        }
        for (int64_t r = 0; r < rows; r++)
          for (int64_t n = 0; n < ns; n++) out.store(n0 + n, o0 + r, sums[r][n]);
      }
    }
  });
}

#ifdef GPT2_AVX512
// sums[n, 16 rows] += the tile's block b (decoded into wv: 16 registers of int16 pairs) . rows n..n+R-1 of x.
template <Kind kind, int R>
static inline void accumulate_rows(const __m512i* wv, __m512 scale, __m512 minimum, const QuantizedRows& xq, int64_t n,
                                   int64_t K, int64_t blocks, int64_t b, float* sums) {
  constexpr int A = 8 / R;  // chains per row
  __m512i dot[R][A];
  for (int r = 0; r < R; r++)
    for (int a = 0; a < A; a++) dot[r][a] = _mm512_setzero_si512();
  for (int64_t pair = 0; pair < BLOCK / 2; pair++)
    for (int r = 0; r < R; r++) {
      int32_t x_pair;  // activations 2p, 2p + 1 of row n + r as one 32-bit lane (memcpy: no aliasing of int16 data)
      std::memcpy(&x_pair, xq.codes.data() + (n + r) * K + b * BLOCK + 2 * pair, sizeof x_pair);
      dot[r][pair % A] = dot_pairs(dot[r][pair % A], wv[pair], _mm512_set1_epi32(x_pair));
    }
  for (int r = 0; r < R; r++) {
    __m512i total = dot[r][0];
    for (int a = 1; a < A; a++) total = _mm512_add_epi32(total, dot[r][a]);
    const int64_t at = (n + r) * blocks + b;
    float* row = sums + (n + r) * TILE;
    __m512 acc = _mm512_loadu_ps(row);
    if constexpr (kind == I8) {
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(xq.scales[at]), acc);
    } else {
      const __m512 scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(xq.scales[at]));
      acc = _mm512_fmadd_ps(minimum, _mm512_set1_ps(xq.sums[at]), _mm512_fmadd_ps(scaled, scale, acc));
    }
    _mm512_storeu_ps(row, acc);
  }
}
#endif

// I8 and I4: tiles of 16 output rows; one register holds a tile's 16 partial sums, so no horizontal sums.
// For each block of 32 inputs the tile's weights are decoded into 16 registers of int16 pairs once, then every
// activation row takes its exact int32 dot products against them, scaled into its float sums once per block.
template <Kind kind>
static void tiled_product(const uint8_t* w, const float* row_scale, const at::Half* group_params,
                          const QuantizedRows& xq, int64_t N, int64_t K, int64_t O, const Output& out) {
  const int64_t tiles = (O + TILE - 1) / TILE, blocks = K / BLOCK;
  const int64_t tile_bytes = kind == I8 ? TILE * K : TILE * K / 2;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> sums(N * TILE);  // (N, 16) float sums of the current tile
    for (int64_t tile = begin; tile < end; tile++) {
      const uint8_t* tw = w + tile * tile_bytes;
      const int64_t o0 = tile * TILE, rows = std::min(TILE, O - o0);
      std::fill(sums.begin(), sums.end(), 0.0f);
      for (int64_t b = 0; b < blocks; b++) {
#ifdef GPT2_AVX512
        __m512i wv[BLOCK / 2];  // pair p of inputs (2p, 2p + 1) for the 16 rows, as int16
        if constexpr (kind == I8) {
          const uint8_t* bw = tw + b * BLOCK * TILE;  // 16 pairs x 16 rows x 2 bytes
          for (int64_t pair = 0; pair < BLOCK / 2; pair++)
            wv[pair] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw + pair * 32)));
        } else {
          const uint8_t* bw = tw + b * BLOCK * TILE / 2;  // 8 chunks x 16 rows x 2 bytes
          const __m512i low_nibbles = _mm512_set1_epi16(0x0f);
          for (int64_t chunk = 0; chunk < BLOCK / 4; chunk++) {
            const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw + chunk * 32)));
            wv[2 * chunk] = _mm512_and_si512(bytes, low_nibbles);  // codes of inputs 4c, 4c+1
            wv[2 * chunk + 1] = _mm512_srli_epi16(bytes, 4);        // codes of inputs 4c+2, 4c+3
          }
        }
        __m512 scale = _mm512_setzero_ps(), minimum = _mm512_setzero_ps();
        if constexpr (kind == I4) {
          const at::Half* params = group_params + (tile * blocks + b) * 2 * TILE;
          scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(params)));
          minimum = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(params + TILE)));
        }
        // Rows go 4 at a time (one at a time for the rest), with 8 independent chains of int32 sums in flight
        // (4 rows x 2, or 1 row x 8): a single chain of 16 dependent `vpdpwssd` would wait on their latency.
        int64_t n = 0;
        for (; n + 4 <= N; n += 4) accumulate_rows<kind, 4>(wv, scale, minimum, xq, n, K, blocks, b, sums.data());
        for (; n < N; n++) accumulate_rows<kind, 1>(wv, scale, minimum, xq, n, K, blocks, b, sums.data());
#else
        for (int64_t n = 0; n < N; n++) {
          const int16_t* x = xq.codes.data() + n * K + b * BLOCK;
          const int64_t at = n * blocks + b;
          for (int64_t r = 0; r < TILE; r++) {
            int32_t total = 0;
            for (int64_t i = 0; i < BLOCK; i++) {
              int32_t code;
              if constexpr (kind == I8) {
                code = static_cast<int8_t>(tw[b * BLOCK * TILE + (i / 2) * 32 + 2 * r + (i % 2)]);
              } else {
                const uint8_t byte = tw[b * BLOCK * TILE / 2 + (i / 4) * 32 + 2 * r + (i % 2)];
                code = (i % 4) < 2 ? (byte & 0x0f) : (byte >> 4);
              }
              total += code * x[i];
            }
            if constexpr (kind == I8) {
              sums[n * TILE + r] += static_cast<float>(total) * xq.scales[at];
            } else {
              const at::Half* params = group_params + (tile * blocks + b) * 2 * TILE;
              sums[n * TILE + r] += static_cast<float>(total) * xq.scales[at] * static_cast<float>(params[r]);
              sums[n * TILE + r] += static_cast<float>(params[TILE + r]) * xq.sums[at];
            }
          }
        }
#endif
      }
      for (int64_t n = 0; n < N; n++)
        for (int64_t r = 0; r < rows; r++) {
          const float value = sums[n * TILE + r];
          out.store(n, o0 + r, kind == I8 ? value * row_scale[o0 + r] : value);
        }
    }
  });
}

// A linear layer in one of the formats; x (N, K) float32 contiguous.
struct Linear {
  int64_t kind;
  at::Tensor weight;  // see the formats at the top
  at::Tensor scale;   // I8: (O padded,) float32 per row; I4: (O/16, K/32, 2, 16) float16; else undefined
  at::Tensor bias;    // (O,) float32 or undefined
  int64_t in_features, out_features;

  void apply(const float* x, int64_t N, const Output& out) const {
    const int64_t K = in_features, O = out_features;
    if (kind == F32) {
      const float* w = weight.data_ptr<float>();
      if (N == 1) {
        rowwise_product<float>(w, x, nullptr, K, O, out);
      } else if (N <= FEW_ROWS) {
        rowmajor_product<float, 1>(w, x, nullptr, N, K, O, out);
      } else {
        rowmajor_product(w, x, nullptr, N, K, O, out);
      }
    } else if (kind == BF16) {
      std::vector<uint16_t> xb(N * K);
      for (int64_t i = 0; i < N * K; i++) xb[i] = float_to_bf16(x[i]);
      const auto* w = reinterpret_cast<const uint16_t*>(weight.data_ptr());
      if (N == 1) {
        rowwise_product<uint16_t>(w, nullptr, xb.data(), K, O, out);
      } else if (N <= FEW_ROWS) {
        rowmajor_product<uint16_t, 1>(w, nullptr, xb.data(), N, K, O, out);
      } else {
        rowmajor_product(w, nullptr, xb.data(), N, K, O, out);
      }
    } else {
      const QuantizedRows xq = quantize_rows(x, N, K);
      const auto* w = reinterpret_cast<const uint8_t*>(weight.data_ptr());
      if (kind == I8) tiled_product<I8>(w, scale.data_ptr<float>(), nullptr, xq, N, K, O, out);
      else tiled_product<I4>(w, nullptr, scale.data_ptr<at::Half>(), xq, N, K, O, out);
    }
  }
};

static Linear make_linear(int64_t kind, const at::Tensor& weight, const c10::optional<at::Tensor>& scale,
                          const c10::optional<at::Tensor>& bias, int64_t in_features, int64_t out_features) {
  TORCH_CHECK(kind >= F32 && kind <= I4, "unknown weight kind ", kind);
  TORCH_CHECK(weight.device().is_cpu() && weight.is_contiguous(), "weights must be contiguous CPU tensors");
  TORCH_CHECK(in_features % BLOCK == 0, "in_features must be a multiple of ", BLOCK, ", got ", in_features);
  const at::ScalarType expected[] = {at::kFloat, at::kBFloat16, at::kChar, at::kByte};
  TORCH_CHECK(weight.scalar_type() == expected[kind], "weight dtype ", weight.scalar_type(), " does not match kind ", kind);
  // Every shape is checked: the kernels index by in_features and out_features alone.
  const int64_t K = in_features, O = out_features, tiles = (O + TILE - 1) / TILE;
  std::vector<int64_t> shape{O, K};
  if (kind == I8) shape = {tiles, K / 2, TILE, 2};
  if (kind == I4) shape = {tiles, K / BLOCK, BLOCK / 4, TILE, 2};
  TORCH_CHECK(weight.sizes() == at::IntArrayRef(shape), "weight shape ", weight.sizes(), " does not hold ", O, " x ",
              K, " weights of kind ", kind);
  Linear linear{kind, weight, at::Tensor(), at::Tensor(), in_features, out_features};
  if (kind == I8 || kind == I4) {
    TORCH_CHECK(scale.has_value(), "int8 and int4 weights need their scales");
    linear.scale = scale->contiguous();
    if (kind == I8) {
      TORCH_CHECK(linear.scale.scalar_type() == at::kFloat && linear.scale.numel() == tiles * TILE,
                  "int8 scales must be float32, one per row padded to ", tiles * TILE);
    } else {
      const std::vector<int64_t> params{tiles, K / BLOCK, 2, TILE};
      TORCH_CHECK(linear.scale.scalar_type() == at::kHalf && linear.scale.sizes() == at::IntArrayRef(params),
                  "int4 scales and minimums must be float16 of shape (", tiles, ", ", K / BLOCK, ", 2, ", TILE, ")");
    }
  }
  if (bias.has_value()) {
    linear.bias = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(linear.bias.numel() == O, "bias must hold ", O, " values, got ", linear.bias.numel());
  }
  return linear;
}

// y = x W^T + b for x (..., K) in any float dtype; returns (..., O) float32. What the Python layers call.
static at::Tensor linear_op(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& scale,
                            const c10::optional<at::Tensor>& bias, int64_t kind, int64_t out_features) {
  const int64_t K = x.size(-1);
  const Linear linear = make_linear(kind, weight, scale, bias, K, out_features);
  const at::Tensor rows = x.reshape({-1, K}).to(at::kFloat).contiguous();
  at::Tensor y = at::empty({rows.size(0), out_features}, rows.options());
  const float* b = linear.bias.defined() ? linear.bias.data_ptr<float>() : nullptr;
  linear.apply(rows.data_ptr<float>(), rows.size(0), Output{y.data_ptr<float>(), out_features, b, false});
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out_features;
  return y.view(shape);
}


// The weight a packed or bfloat16 layer stands for, for prefills, where one big matrix product over the weight
// dequantized on the fly beats streaming it block by block. bfloat16: W (O, K) in `dtype`. int8 / int4: W^T as a
// contiguous (K, O) matrix in `dtype` (a tile's 16 rows are 16 consecutive floats there), so W = result.t().
static at::Tensor dequantize_op(const at::Tensor& weight, const c10::optional<at::Tensor>& scale, int64_t kind,
                                int64_t in_features, int64_t out_features, at::ScalarType dtype) {
  const Linear linear = make_linear(kind, weight, scale, c10::nullopt, in_features, out_features);
  if (kind == F32 || kind == BF16) return weight.to(dtype);
  const int64_t K = in_features, O = out_features, blocks = K / BLOCK, tiles = (O + TILE - 1) / TILE;
#if defined(GPT2_AVX512) && defined(__AVX512BF16__)
  // bfloat16 written directly (rounded to nearest even, as .to(bfloat16) rounds): one pass over half the bytes of a
  // float32 matrix and its conversion, which took ~60% of an int8 prefill's products
  const bool direct_bf16 = dtype == at::kBFloat16;
#else
  const bool direct_bf16 = false;
#endif
  at::Tensor result = at::empty({K, tiles * TILE}, direct_bf16 ? at::kBFloat16 : at::kFloat);  // whole tiles
  float* wt = direct_bf16 ? nullptr : result.data_ptr<float>();
  [[maybe_unused]] uint16_t* wtb = direct_bf16 ? reinterpret_cast<uint16_t*>(result.data_ptr()) : nullptr;
  const int64_t ld = tiles * TILE;
  const auto* w = reinterpret_cast<const uint8_t*>(linear.weight.data_ptr());
  const float* row_scale = kind == I8 ? linear.scale.data_ptr<float>() : nullptr;
  const at::Half* group_params = kind == I4 ? linear.scale.data_ptr<at::Half>() : nullptr;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; tile++) {
      const int64_t o0 = tile * TILE;
      for (int64_t b = 0; b < blocks; b++) {
        float scale16[TILE], minimum16[TILE];
        for (int64_t r = 0; r < TILE; r++) {
          if (kind == I8) {
            scale16[r] = row_scale[o0 + r];
            minimum16[r] = 0.0f;
          } else {
            const at::Half* params = group_params + (tile * blocks + b) * 2 * TILE;
            scale16[r] = static_cast<float>(params[r]);
            minimum16[r] = static_cast<float>(params[TILE + r]);
          }
        }
#ifdef GPT2_AVX512
        // pairs of inputs as 32 int16 lanes (lane 2r + j = row r, input 2p + j), written as two rows of W^T
        const __m512 scales = _mm512_loadu_ps(scale16), minimums = _mm512_loadu_ps(minimum16);
        auto store = [&](int64_t k, __m512 values) {  // row k of W^T, this tile's 16 columns
#ifdef __AVX512BF16__
          if (direct_bf16) {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(wtb + k * ld + o0), (__m256i)_mm512_cvtneps_pbh(values));
            return;
          }
#endif
          _mm512_storeu_ps(wt + k * ld + o0, values);
        };
        auto write_pair = [&](__m512i pairs, int64_t k) {
          const __m512i even = _mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16), odd = _mm512_srai_epi32(pairs, 16);
          store(k, _mm512_fmadd_ps(_mm512_cvtepi32_ps(even), scales, minimums));
          store(k + 1, _mm512_fmadd_ps(_mm512_cvtepi32_ps(odd), scales, minimums));
        };
        if (kind == I8) {
          const uint8_t* bw = w + tile * TILE * K + b * BLOCK * TILE;
          for (int64_t pair = 0; pair < BLOCK / 2; pair++)
            write_pair(_mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw + pair * 32))), b * BLOCK + 2 * pair);
        } else {
          const uint8_t* bw = w + tile * TILE * K / 2 + b * BLOCK * TILE / 2;
          for (int64_t chunk = 0; chunk < BLOCK / 4; chunk++) {
            const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw + chunk * 32)));
            write_pair(_mm512_and_si512(bytes, _mm512_set1_epi16(0x0f)), b * BLOCK + 4 * chunk);
            write_pair(_mm512_srli_epi16(bytes, 4), b * BLOCK + 4 * chunk + 2);
          }
        }
#else
        for (int64_t i = 0; i < BLOCK; i++) {  // input k = b * 32 + i: one contiguous row of 16 in W^T
          float* target = wt + (b * BLOCK + i) * ld + o0;
          for (int64_t r = 0; r < TILE; r++) {
            float code;
            if (kind == I8) {
              code = static_cast<float>(static_cast<int8_t>(w[tile * TILE * K + b * BLOCK * TILE + (i / 2) * 32 + 2 * r + (i % 2)]));
            } else {
              const uint8_t byte = w[tile * TILE * K / 2 + b * BLOCK * TILE / 2 + (i / 4) * 32 + 2 * r + (i % 2)];
              code = static_cast<float>((i % 4) < 2 ? (byte & 0x0f) : (byte >> 4));
            }
            target[r] = code * scale16[r] + minimum16[r];
          }
        }
#endif
      }
    }
  });
  at::Tensor cut = result.narrow(1, 0, O);
  if (direct_bf16 || dtype == at::kFloat) return O == ld ? result : cut.contiguous();
  return cut.to(dtype).contiguous();
}

// ------------------------------------------------------------------------------------------ the decode step
// LayerNorm over C with population variance: y = (x - mean) / sqrt(var + eps) * gain + bias.
static void layer_norm(const float* x, float* y, const float* gain, const float* bias, int64_t C, float eps) {
  int64_t i = 0;
  float total = 0.0f, squares = 0.0f;
#ifdef GPT2_AVX512
  __m512 sum = _mm512_setzero_ps();
  for (; i + 16 <= C; i += 16) sum = _mm512_add_ps(sum, _mm512_loadu_ps(x + i));
  total = _mm512_reduce_add_ps(sum);
#endif
  for (; i < C; i++) total += x[i];
  const float mean = total / static_cast<float>(C);
  i = 0;
#ifdef GPT2_AVX512
  __m512 sq = _mm512_setzero_ps();
  const __m512 m = _mm512_set1_ps(mean);
  for (; i + 16 <= C; i += 16) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), m);
    sq = _mm512_fmadd_ps(d, d, sq);
  }
  squares = _mm512_reduce_add_ps(sq);
#endif
  for (; i < C; i++) squares += (x[i] - mean) * (x[i] - mean);
  const float rstd = 1.0f / std::sqrt(squares / static_cast<float>(C) + eps);
  i = 0;
#ifdef GPT2_AVX512
  const __m512 r = _mm512_set1_ps(rstd);
  for (; i + 16 <= C; i += 16) {
    const __m512 normed = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), m), r);
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(normed, _mm512_loadu_ps(gain + i), _mm512_loadu_ps(bias + i)));
  }
#endif
  for (; i < C; i++) y[i] = (x[i] - mean) * rstd * gain[i] + bias[i];
}

static void gelu_inplace(float* x, int64_t n) {
  int64_t i = 0;
#ifdef GPT2_AVX512
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, gelu512(_mm512_loadu_ps(x + i)));
#endif
  for (; i < n; i++) x[i] = gelu_tanh(x[i]);
}

template <typename T>
static inline float load_as_float(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>) return p[i];
  else return bf16_to_float(reinterpret_cast<const uint16_t*>(p)[i]);
}

template <typename T>
static inline void store_from_float(T* p, int64_t i, float v) {
  if constexpr (std::is_same_v<T, float>) p[i] = v;
  else reinterpret_cast<uint16_t*>(p)[i] = float_to_bf16(v);
}

#ifdef GPT2_AVX512
template <typename T>
static inline __m512 load16(const T* p) {  // 16 values of a cache row as float32
  if constexpr (std::is_same_v<T, float>) return _mm512_loadu_ps(p);
  else return widen_bf16(reinterpret_cast<const uint16_t*>(p));
}
#endif

// q . key over hs values (a query row against one cached key)
template <typename T>
static inline float dot_row(const float* q, const T* key, int64_t hs) {
  int64_t i = 0;
  float total = 0.0f;
#ifdef GPT2_AVX512
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= hs; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load16(key + i), acc);
  total = _mm512_reduce_add_ps(acc);
#endif
  for (; i < hs; i++) total += q[i] * load_as_float(key, i);
  return total;
}

// out = sum_s weights[s] * scale * values[s] over S cached value rows `stride` apart, hs values each
template <typename T>
static void weighted_sum(float* out, const float* weights, float scale, const T* values, int64_t stride, int64_t S,
                         int64_t hs) {
#ifdef GPT2_AVX512
  if (hs == 64) {  // GPT-2's head size: the output row stays in four registers over all S rows
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t s = 0; s < S; s++) {
      if (weights[s] == 0.0f) continue;  // a masked column
      const __m512 w = _mm512_set1_ps(weights[s]);
      for (int64_t j = 0; j < 4; j++) acc[j] = _mm512_fmadd_ps(w, load16(values + s * stride + 16 * j), acc[j]);
    }
    for (int64_t j = 0; j < 4; j++) _mm512_storeu_ps(out + 16 * j, _mm512_mul_ps(acc[j], _mm512_set1_ps(scale)));
    return;
  }
#endif
  for (int64_t i = 0; i < hs; i++) out[i] = 0.0f;
  for (int64_t s = 0; s < S; s++) {
    if (weights[s] == 0.0f) continue;
    for (int64_t i = 0; i < hs; i++) out[i] += weights[s] * load_as_float(values + s * stride, i);
  }
  for (int64_t i = 0; i < hs; i++) out[i] *= scale;
}

class Decoder : public torch::CustomClassHolder {
 public:
  // norms: per layer ln_1 gain, ln_1 bias, ln_2 gain, ln_2 bias, then ln_f gain and bias.
  // linears (weights, scales, biases, kinds): per layer c_attn, attn.c_proj, c_fc, mlp.c_proj, then the LM head.
  Decoder(int64_t n_head, double eps, at::Tensor wte, at::Tensor wpe, std::vector<at::Tensor> norms,
          std::vector<at::Tensor> weights, std::vector<c10::optional<at::Tensor>> scales,
          std::vector<c10::optional<at::Tensor>> biases, std::vector<int64_t> kinds, std::vector<int64_t> out_features)
      : n_head_(n_head), eps_(static_cast<float>(eps)), wte_(wte.contiguous()), wpe_(wpe.contiguous()) {
    n_layer_ = static_cast<int64_t>(kinds.size() - 1) / 4;
    C_ = wte_.size(1);
    TORCH_CHECK(static_cast<int64_t>(norms.size()) == 4 * n_layer_ + 2, "expected 4 norms a layer plus ln_f");
    TORCH_CHECK(C_ % n_head_ == 0, "n_embd must divide into heads");
    TORCH_CHECK(wte_.scalar_type() == wpe_.scalar_type(), "wte and wpe must share a dtype");
    for (auto& norm : norms) norms_.push_back(norm.to(at::kFloat).contiguous());
    for (size_t i = 0; i < kinds.size(); i++) {
      const int64_t in = (i % 4 == 3 && i < kinds.size() - 1) ? 4 * C_ : C_;
      linears_.push_back(make_linear(kinds[i], weights[i], scales[i], biases[i], in, out_features[i]));
    }
    vocab_ = linears_.back().out_features;
  }

  // tokens, positions: (B,) int64. key_mask: (B, column + 1), nonzero = may attend, or None (every column).
  // k_cache, v_cache: (L, B, nh, max_len, hs) float32 or bfloat16 (any strides but the last). The step writes
  // the new keys and values at `column` and attends over columns [0, column]. Returns logits (B, V) float32.
  at::Tensor step(const at::Tensor& tokens, const at::Tensor& positions, const c10::optional<at::Tensor>& key_mask,
                  const at::Tensor& k_cache, const at::Tensor& v_cache, int64_t column) {
    return dispatch(tokens, positions, key_mask, k_cache, v_cache, column, false);
  }

  // T consecutive tokens of one sequence (a speculative verification, a short prompt): tokens, positions (T,);
  // the cache (L, 1, nh, max_len, hs). Token t writes its keys and values at column + t and attends causally over
  // columns [0, column + t]; the weights are read once for all T rows. Returns logits (T, V) float32.
  at::Tensor extend(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& k_cache,
                    const at::Tensor& v_cache, int64_t column) {
    return dispatch(tokens, positions, c10::nullopt, k_cache, v_cache, column, true);
  }

 private:
  at::Tensor dispatch(const at::Tensor& tokens, const at::Tensor& positions, const c10::optional<at::Tensor>& key_mask,
                      const at::Tensor& k_cache, const at::Tensor& v_cache, int64_t column, bool chained) {
    TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "k and v caches must share a dtype");
    TORCH_CHECK(k_cache.dim() == 5 && k_cache.sizes() == v_cache.sizes(), "k and v caches must be (L, B, nh, max_len, hs)");
    TORCH_CHECK(k_cache.size(0) == n_layer_ && k_cache.size(2) == n_head_ && k_cache.size(4) == C_ / n_head_,
                "the cache was made for another model shape");
    TORCH_CHECK(k_cache.stride(4) == 1 && v_cache.stride(4) == 1, "cache rows must be contiguous");
    TORCH_CHECK(tokens.dim() == 1 && positions.sizes() == tokens.sizes(), "tokens and positions must be (B,)");
    TORCH_CHECK(column >= 0, "column must be >= 0");
    if (k_cache.scalar_type() == at::kFloat)
      return run<float>(tokens, positions, key_mask, k_cache, v_cache, column, chained);
    TORCH_CHECK(k_cache.scalar_type() == at::kBFloat16, "the cache must be float32 or bfloat16");
    return run<at::BFloat16>(tokens, positions, key_mask, k_cache, v_cache, column, chained);
  }

  // chained = false: row b is sequence b, at `column`. chained = true: row b is token b of sequence 0, at column + b
  // (every row's keys and values are written before any row attends, so each sees the rows before it).
  template <typename T>
  at::Tensor run(const at::Tensor& tokens_in, const at::Tensor& positions_in, const c10::optional<at::Tensor>& key_mask,
                 const at::Tensor& k_cache, const at::Tensor& v_cache, int64_t column, bool chained) {
    const at::Tensor tokens = tokens_in.to(at::kLong).contiguous(), positions = positions_in.to(at::kLong).contiguous();
    const int64_t B = tokens.size(0), C = C_, nh = n_head_, hs = C / nh;
    const int64_t S = chained ? column + B : column + 1;  // key columns of the row that sees the most
    TORCH_CHECK(B >= 1, "at least one token is needed");
    if (chained) {
      TORCH_CHECK(k_cache.size(1) == 1 && k_cache.size(3) >= S, "the cache does not fit one sequence of column + T");
    } else {
      TORCH_CHECK(k_cache.size(1) == B && k_cache.size(3) > column, "the cache does not fit the batch and column");
    }
    auto sequence = [&](int64_t b) { return chained ? int64_t{0} : b; };  // the cache row of activation row b
    auto at_column = [&](int64_t b) { return chained ? column + b : column; };
    at::Tensor mask;
    if (key_mask.has_value()) {
      mask = key_mask->to(at::kBool).contiguous();
      TORCH_CHECK(mask.size(0) == B && mask.size(1) == S, "key_mask must be (B, column + 1)");
    }
    const bool* visible = mask.defined() ? mask.data_ptr<bool>() : nullptr;
    const int64_t* token = tokens.data_ptr<int64_t>();
    const int64_t* position = positions.data_ptr<int64_t>();

    // Activations, float32 throughout: x the residual stream (B, C), h a normalized copy, qkv (B, 3C),
    // z the heads' outputs side by side (B, C), f the MLP's hidden layer (B, 4C), p attention weights (B*nh, S).
    std::vector<float> x(B * C), h(B * C), qkv(B * 3 * C), z(B * C), f(B * 4 * C), p(B * nh * S);
    for (int64_t b = 0; b < B; b++) {
      TORCH_CHECK(token[b] >= 0 && token[b] < wte_.size(0) && position[b] >= 0 && position[b] < wpe_.size(0),
                  "token or position out of range");
      for (int64_t i = 0; i < C; i++) x[b * C + i] = embedding(wte_, token[b], i) + embedding(wpe_, position[b], i);
    }
    auto* k_base = reinterpret_cast<T*>(k_cache.data_ptr());
    auto* v_base = reinterpret_cast<T*>(v_cache.data_ptr());
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));

    for (int64_t l = 0; l < n_layer_; l++) {
      const Linear* lin = &linears_[4 * l];
      for (int64_t b = 0; b < B; b++)
        layer_norm(&x[b * C], &h[b * C], norms_[4 * l].data_ptr<float>(), norms_[4 * l + 1].data_ptr<float>(), C, eps_);
      lin[0].apply(h.data(), B, output(qkv.data(), 3 * C, lin[0], false));

      // attention, one (row, head) per task: write k, v at `column`, then softmax(q k^T / sqrt(hs)) v
      T* k_layer = k_base + l * k_cache.stride(0);
      T* v_layer = v_base + l * v_cache.stride(0);
      for (int64_t b = 0; b < B; b++) {
        for (int64_t head = 0; head < nh; head++) {
          T* keys = k_layer + sequence(b) * k_cache.stride(1) + head * k_cache.stride(2) + at_column(b) * k_cache.stride(3);
          T* values = v_layer + sequence(b) * v_cache.stride(1) + head * v_cache.stride(2) + at_column(b) * v_cache.stride(3);
          for (int64_t i = 0; i < hs; i++) {
            store_from_float(keys, i, qkv[b * 3 * C + C + head * hs + i]);
            store_from_float(values, i, qkv[b * 3 * C + 2 * C + head * hs + i]);
          }
        }
      }
      at::parallel_for(0, B * nh, 1, [&](int64_t begin, int64_t end) {
        for (int64_t task = begin; task < end; task++) {
          const int64_t b = task / nh, head = task % nh, seen_columns = at_column(b) + 1;
          // (max_len, hs) each, rows stride(3) apart
          const T* keys = k_layer + sequence(b) * k_cache.stride(1) + head * k_cache.stride(2);
          const T* values = v_layer + sequence(b) * v_cache.stride(1) + head * v_cache.stride(2);
          const float* q = &qkv[b * 3 * C + head * hs];
          // softmax over the visible columns: exp(score - max) there, 0 where masked
          float* weights = &p[task * S];
          const bool* row_visible = visible ? visible + b * S : nullptr;
          float top = -INFINITY;
          for (int64_t s = 0; s < seen_columns; s++) {
            const bool seen = !row_visible || row_visible[s];
            weights[s] = seen ? dot_row(q, keys + s * k_cache.stride(3), hs) * scale : 0.0f;
            if (seen) top = std::max(top, weights[s]);
          }
          for (int64_t s = 0; s < seen_columns; s++) weights[s] -= top;
          exp_inplace(weights, seen_columns, row_visible);
          float total = 0.0f;
          for (int64_t s = 0; s < seen_columns; s++) total += weights[s];
          weighted_sum(&z[b * C + head * hs], weights, 1.0f / total, values, v_cache.stride(3), seen_columns, hs);
        }
      });
      lin[1].apply(z.data(), B, output(x.data(), C, lin[1], true));  // x += attn.c_proj(z)

      for (int64_t b = 0; b < B; b++)
        layer_norm(&x[b * C], &h[b * C], norms_[4 * l + 2].data_ptr<float>(), norms_[4 * l + 3].data_ptr<float>(), C, eps_);
      lin[2].apply(h.data(), B, output(f.data(), 4 * C, lin[2], false));
      gelu_inplace(f.data(), B * 4 * C);
      lin[3].apply(f.data(), B, output(x.data(), C, lin[3], true));  // x += mlp.c_proj(gelu(c_fc(h)))
    }
    for (int64_t b = 0; b < B; b++)
      layer_norm(&x[b * C], &h[b * C], norms_[4 * n_layer_].data_ptr<float>(), norms_[4 * n_layer_ + 1].data_ptr<float>(), C, eps_);
    at::Tensor logits = at::empty({B, vocab_}, at::kFloat);
    linears_.back().apply(h.data(), B, output(logits.data_ptr<float>(), vocab_, linears_.back(), false));
    return logits;
  }

  static Output output(float* y, int64_t ldy, const Linear& linear, bool accumulate) {
    return Output{y, ldy, linear.bias.defined() ? linear.bias.data_ptr<float>() : nullptr, accumulate};
  }

  static float embedding(const at::Tensor& table, int64_t row, int64_t i) {
    if (table.scalar_type() == at::kFloat) return table.data_ptr<float>()[row * table.size(1) + i];
    return bf16_to_float(reinterpret_cast<const uint16_t*>(table.data_ptr())[row * table.size(1) + i]);
  }

  // weights[s] = exp(weights[s]) where visible (or everywhere when visible is null); masked entries stay 0.
  static void exp_inplace(float* weights, int64_t S, const bool* visible) {
    int64_t s = 0;
#ifdef GPT2_AVX512
    for (; s + 16 <= S; s += 16) {
      __m512 e = exp512(_mm512_loadu_ps(weights + s));
      if (visible) {
        const __mmask16 keep = _mm_cmpneq_epi8_mask(_mm_loadu_si128(reinterpret_cast<const __m128i*>(visible + s)), _mm_setzero_si128());
        e = _mm512_maskz_mov_ps(keep, e);
      }
      _mm512_storeu_ps(weights + s, e);
    }
#endif
    for (; s < S; s++) weights[s] = (visible && !visible[s]) ? 0.0f : std::exp(weights[s]);
  }

  int64_t n_head_;
  float eps_;
  at::Tensor wte_, wpe_;
  int64_t n_layer_ = 0, C_ = 0, vocab_ = 0;
  std::vector<at::Tensor> norms_;
  std::vector<Linear> linears_;
};

}  // namespace GPT2_OPS

#define GPT2_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)

GPT2_LIBRARY(GPT2_OPS, m) {
  m.class_<GPT2_OPS::Decoder>("Decoder")
      .def(torch::init<int64_t, double, at::Tensor, at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>,
                       std::vector<c10::optional<at::Tensor>>, std::vector<c10::optional<at::Tensor>>,
                       std::vector<int64_t>, std::vector<int64_t>>())
      .def("step", &GPT2_OPS::Decoder::step)
      .def("extend", &GPT2_OPS::Decoder::extend);
  m.def("linear(Tensor x, Tensor weight, Tensor? scale, Tensor? bias, int kind, int out_features) -> Tensor",
        &GPT2_OPS::linear_op);
  m.def("dequantize(Tensor weight, Tensor? scale, int kind, int in_features, int out_features, ScalarType dtype) -> Tensor",
        &GPT2_OPS::dequantize_op);
}
