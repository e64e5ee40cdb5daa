// The kernel contract (simd_portable.h lists it) on AArch64 NEON (Advanced SIMD, which every AArch64 CPU has: Apple
// M-series, AWS Graviton, Ampere, Raspberry Pi 4 and 5): 4 float32 lanes, four registers per tile of 16 output
// rows. The int16 pair products are `smull` + `smull2` + `addp` (4 int32 sums of two products each); bfloat16
// weights are widened to float32 in registers. The dot-product extension (`sdot`, __ARM_FEATURE_DOTPROD) multiplies
// int8 by int8, and the activations here are int16, so a CPU that has it runs the same instructions.
#pragma once

#include <arm_neon.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace GPT2_OPS::simd {

constexpr const char* NAME = "neon";
constexpr int W = 4;
constexpr int ROW_BLOCK = 4;  // 4 x 4 accumulators, the weights and an activation in 32 registers
constexpr int REGISTERS = 32;  // vector registers
constexpr bool NATIVE_BF16 = false;

using F = float32x4_t;
using I = int32x4_t;
using P = int16x8_t;

static inline F zero() { return vdupq_n_f32(0.0f); }
static inline F set1(float v) { return vdupq_n_f32(v); }
static inline F load(const float* p) { return vld1q_f32(p); }
static inline void store(float* p, F v) { vst1q_f32(p, v); }
static inline F add(F a, F b) { return vaddq_f32(a, b); }
static inline F sub(F a, F b) { return vsubq_f32(a, b); }
static inline F mul(F a, F b) { return vmulq_f32(a, b); }
static inline F div(F a, F b) { return vdivq_f32(a, b); }
static inline F min(F a, F b) { return vminq_f32(a, b); }
static inline F max(F a, F b) { return vmaxq_f32(a, b); }
static inline F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
static inline F abs(F a) { return vabsq_f32(a); }
static inline float reduce_add(F a) { return vaddvq_f32(a); }
static inline float reduce_max(F a) { return vmaxvq_f32(a); }
static inline F round_even(F a) { return vrndnq_f32(a); }
// p * 2^n as two factors 2^h * 2^(n - h), h = floor(n / 2): each exponent stays a normal float's for |n| <= 128
static inline F ldexp(F p, F n) {
  const I whole = vcvtnq_s32_f32(n), half = vshrq_n_s32(whole, 1);
  const I bias = vdupq_n_s32(127);
  const F first = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(half, bias), 23));
  const F second = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vsubq_s32(whole, half), bias), 23));
  return vmulq_f32(vmulq_f32(p, first), second);
}
static inline F load_bf16(const uint16_t* p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
static inline F load_half(const c10::Half* p) {  // c10::Half is the 16 bits of an IEEE float16
  return vcvt_f32_f16(vld1_f16(reinterpret_cast<const float16_t*>(p)));
}
static inline F dot_bf16x2(F acc, const uint16_t* w, const uint16_t*, const float* xr) {
  acc = vfmaq_f32(acc, load_bf16(w), vld1q_f32(xr));
  return vfmaq_f32(acc, load_bf16(w + 4), vld1q_f32(xr + 4));
}
static inline void store_bf16(uint16_t* p, F v) {
  float values[4];
  vst1q_f32(values, v);
  for (int i = 0; i < 4; i++) p[i] = float_to_bf16(values[i]);
}

static inline I izero() { return vdupq_n_s32(0); }
static inline I iadd(I a, I b) { return vaddq_s32(a, b); }
static inline int32_t ireduce_add(I a) { return vaddvq_s32(a); }
static inline F to_float(I a) { return vcvtq_f32_s32(a); }
static inline I to_int(F a) { return vcvtnq_s32_f32(a); }  // nearest, ties to even, whatever the rounding mode
static inline void store_i16(int16_t* p, I a) { vst1_s16(p, vmovn_s32(a)); }
static inline P load_i8_pairs(const uint8_t* p) { return vmovl_s8(vld1_s8(reinterpret_cast<const int8_t*>(p))); }
static inline P load_u8_pairs(const uint8_t* p) { return vreinterpretq_s16_u16(vmovl_u8(vld1_u8(p))); }
static inline P low_nibbles(P a) { return vandq_s16(a, vdupq_n_s16(0x0f)); }
static inline P high_nibbles(P a) { return vreinterpretq_s16_u16(vshrq_n_u16(vreinterpretq_u16_s16(a), 4)); }
// x broadcast as 8 int16 (lo, hi, lo, hi, ...): the products of the low and the high 4 lanes, then each adjacent two
// summed (`addp` of the two halves keeps the pairs in order)
static inline I dot_pairs(I acc, P w, int32_t x) {
  const P pair = vreinterpretq_s16_s32(vdupq_n_s32(x));
  const I low = vmull_s16(vget_low_s16(w), vget_low_s16(pair));
  const I high = vmull_high_s16(w, pair);
  return vaddq_s32(acc, vpaddq_s32(low, high));
}
static inline I even_lanes(P a) { return vshrq_n_s32(vshlq_n_s32(vreinterpretq_s32_s16(a), 16), 16); }
static inline I odd_lanes(P a) { return vshrq_n_s32(vreinterpretq_s32_s16(a), 16); }

}  // namespace GPT2_OPS::simd
