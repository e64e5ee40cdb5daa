// The kernel contract (simd_portable.h lists it) on AVX2 + FMA + F16C, what x86 CPUs without AVX-512 have (AMD Zen 1-3,
// Intel client CPUs): 8 float32 lanes, two registers per tile of 16 output rows. The int16 pair products are
// `vpmaddwd` (8 int32 sums of two products each); bfloat16 weights are widened to float32 in registers.
#pragma once

#include <c10/util/Half.h>
#include <immintrin.h>

#include <cstdint>

namespace GPT2_OPS::simd {

constexpr const char* NAME = "avx2";
constexpr int W = 8;
constexpr int ROW_BLOCK = 2;  // 2 x 4 accumulators, the weights and an activation in 16 registers
constexpr int REGISTERS = 16;  // vector registers
constexpr bool NATIVE_BF16 = false;

using F = __m256;
using I = __m256i;
using P = __m256i;

static inline F zero() { return _mm256_setzero_ps(); }
static inline F set1(float v) { return _mm256_set1_ps(v); }
static inline F load(const float* p) { return _mm256_loadu_ps(p); }
static inline void store(float* p, F v) { _mm256_storeu_ps(p, v); }
static inline F add(F a, F b) { return _mm256_add_ps(a, b); }
static inline F sub(F a, F b) { return _mm256_sub_ps(a, b); }
static inline F mul(F a, F b) { return _mm256_mul_ps(a, b); }
static inline F div(F a, F b) { return _mm256_div_ps(a, b); }
static inline F min(F a, F b) { return _mm256_min_ps(a, b); }
static inline F max(F a, F b) { return _mm256_max_ps(a, b); }
static inline F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
static inline F abs(F a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
static inline float reduce_add(F a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
static inline float reduce_max(F a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
static inline F round_even(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// p * 2^n as two factors 2^h * 2^(n - h), h = floor(n / 2): each exponent stays a normal float's for |n| <= 128
static inline F ldexp(F p, F n) {
  const __m256i whole = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(whole, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const F first = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const F second = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(whole, half), bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, first), second);
}
static inline F load_bf16(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
static inline F load_half(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
static inline F dot_bf16x2(F acc, const uint16_t* w, const uint16_t*, const float* xr) {
  acc = _mm256_fmadd_ps(load_bf16(w), _mm256_loadu_ps(xr), acc);
  return _mm256_fmadd_ps(load_bf16(w + 8), _mm256_loadu_ps(xr + 8), acc);
}
static inline void store_bf16(uint16_t* p, F v) {
  alignas(32) float values[8];
  _mm256_store_ps(values, v);
  for (int i = 0; i < 8; i++) p[i] = float_to_bf16(values[i]);
}

static inline I izero() { return _mm256_setzero_si256(); }
static inline I iadd(I a, I b) { return _mm256_add_epi32(a, b); }
static inline int32_t ireduce_add(I a) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}
static inline F to_float(I a) { return _mm256_cvtepi32_ps(a); }
static inline I to_int(F a) { return _mm256_cvtps_epi32(a); }  // the default rounding: nearest even
static inline void store_i16(int16_t* p, I a) {
  // packs works within 128-bit halves: [a0-3 a0-3 | a4-7 a4-7]; quadwords 0 and 2 are a0-7 in order
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, a), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
static inline P load_i8_pairs(const uint8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
static inline P load_u8_pairs(const uint8_t* p) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
static inline P low_nibbles(P a) { return _mm256_and_si256(a, _mm256_set1_epi16(0x0f)); }
static inline P high_nibbles(P a) { return _mm256_srli_epi16(a, 4); }
static inline I dot_pairs(I acc, P w, int32_t x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(w, _mm256_set1_epi32(x)));
}
static inline I even_lanes(P a) { return _mm256_srai_epi32(_mm256_slli_epi32(a, 16), 16); }
static inline I odd_lanes(P a) { return _mm256_srai_epi32(a, 16); }

}  // namespace GPT2_OPS::simd
