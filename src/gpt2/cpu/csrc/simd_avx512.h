// The kernel contract (simd_portable.h lists it) on AVX-512 F/BW/VL: 16 float32 lanes, one register per tile of 16
// output rows. With AVX512-VNNI the int16 pair products are one instruction (`vpdpwssd`), with AVX512-BF16 the
// bfloat16 ones (`vdpbf16ps`); without them, their two-instruction equivalents.
#pragma once

#include <c10/util/Half.h>
#include <immintrin.h>

#include <cstdint>

namespace GPT2_OPS::simd {

constexpr const char* NAME = "avx512";
constexpr int W = 16;
constexpr int ROW_BLOCK = 4;  // 4 x 4 accumulators of 32 registers
constexpr int REGISTERS = 32;  // vector registers
#ifdef __AVX512BF16__
constexpr bool NATIVE_BF16 = true;
#else
constexpr bool NATIVE_BF16 = false;
#endif

using F = __m512;
using I = __m512i;
using P = __m512i;

static inline F zero() { return _mm512_setzero_ps(); }
static inline F set1(float v) { return _mm512_set1_ps(v); }
static inline F load(const float* p) { return _mm512_loadu_ps(p); }
static inline void store(float* p, F v) { _mm512_storeu_ps(p, v); }
static inline F add(F a, F b) { return _mm512_add_ps(a, b); }
static inline F sub(F a, F b) { return _mm512_sub_ps(a, b); }
static inline F mul(F a, F b) { return _mm512_mul_ps(a, b); }
static inline F div(F a, F b) { return _mm512_div_ps(a, b); }
static inline F min(F a, F b) { return _mm512_min_ps(a, b); }
static inline F max(F a, F b) { return _mm512_max_ps(a, b); }
static inline F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
static inline F abs(F a) { return _mm512_abs_ps(a); }
static inline float reduce_add(F a) { return _mm512_reduce_add_ps(a); }
static inline float reduce_max(F a) { return _mm512_reduce_max_ps(a); }
static inline F round_even(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline F ldexp(F p, F n) { return _mm512_scalef_ps(p, n); }
static inline F load_bf16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
static inline F load_half(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
static inline F dot_bf16x2(F acc, const uint16_t* w, const uint16_t* xb, const float* xr) {
#ifdef __AVX512BF16__
  (void)xr;
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(w), (__m512bh)_mm512_loadu_si512(xb));
#else
  (void)xb;
  acc = _mm512_fmadd_ps(load_bf16(w), _mm512_loadu_ps(xr), acc);
  return _mm512_fmadd_ps(load_bf16(w + 16), _mm512_loadu_ps(xr + 16), acc);
#endif
}
static inline void store_bf16(uint16_t* p, F v) {
#ifdef __AVX512BF16__
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
#else
  alignas(64) float values[16];
  _mm512_store_ps(values, v);
  for (int i = 0; i < 16; i++) p[i] = float_to_bf16(values[i]);
#endif
}

static inline I izero() { return _mm512_setzero_si512(); }
static inline I iadd(I a, I b) { return _mm512_add_epi32(a, b); }
static inline int32_t ireduce_add(I a) { return _mm512_reduce_add_epi32(a); }
static inline F to_float(I a) { return _mm512_cvtepi32_ps(a); }
static inline I to_int(F a) { return _mm512_cvtps_epi32(a); }  // the default rounding: nearest even
static inline void store_i16(int16_t* p, I a) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(a));
}
static inline P load_i8_pairs(const uint8_t* p) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
static inline P load_u8_pairs(const uint8_t* p) {
  return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
static inline P low_nibbles(P a) { return _mm512_and_si512(a, _mm512_set1_epi16(0x0f)); }
static inline P high_nibbles(P a) { return _mm512_srli_epi16(a, 4); }
static inline I dot_pairs(I acc, P w, int32_t x) {
#ifdef __AVX512VNNI__
  return _mm512_dpwssd_epi32(acc, w, _mm512_set1_epi32(x));
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(w, _mm512_set1_epi32(x)));
#endif
}
static inline I even_lanes(P a) { return _mm512_srai_epi32(_mm512_slli_epi32(a, 16), 16); }
static inline I odd_lanes(P a) { return _mm512_srai_epi32(a, 16); }

}  // namespace GPT2_OPS::simd
