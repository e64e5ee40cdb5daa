// The kernel contract in plain C++, one lane a "vector": the scalar reference every ISA's header is tested against
// (GPT2_CPU_ISA=portable), and the path of CPUs no vector header covers.
//
// The contract (every simd_*.h defines these in GPT2_OPS::simd; cpu_decode.cpp writes each kernel once with them):
//   W                          float32 lanes of a vector F; TILE (16) is a multiple of W
//   F                          W float32 values; I: W int32 values; P: W pairs of int16 (2W int16 values)
//   zero set1 load store add sub mul div min max fma(a, b, c) = a * b + c, abs, reduce_add reduce_max
//                              (min and max of a NaN: either operand, as the ISA has it)
//   round_even(F)              to the nearest integer, ties to even, as float
//   ldexp(p, n)                p * 2^n for integral n in [-128, 128] (n as float)
//   load_bf16(p)               W bfloat16 (their bits) widened to float32
//   load_half(p)               W float16 widened to float32
//   dot_bf16x2(acc, w, xb, xr) acc + the products of 2W bfloat16 weights w with the activations: xb their bfloat16
//                              bits, xr the same values widened to float32 (an ISA reads whichever it multiplies)
//   store_bf16(p, v)           W float32 rounded to bfloat16 (nearest even) and stored
//   NATIVE_BF16                whether the ISA multiplies bfloat16 natively (then dequantizing straight to bfloat16
//                              pays)
//   izero iadd ireduce_add to_float(I); to_int(F) (nearest even); store_i16(p, I) (W int16, values in range)
//   load_i8_pairs(p)           2W int8 bytes sign-extended into a P; load_u8_pairs(p) zero-extended
//   low_nibbles(P) high_nibbles(P)   each int16 & 0x0f, and >> 4 (values 0..255)
//   dot_pairs(acc, w, x)       acc[i] + w[2i] * x.lo + w[2i + 1] * x.hi for an int32 x holding two int16
//   even_lanes(P) odd_lanes(P) the W int16 at even (odd) positions, sign-extended to I
//   ROW_BLOCK                  weight rows a row-major block multiplies at once (what the registers hold)
//   REGISTERS                  vector registers the ISA has (the int8 / int4 products of many rows fill them)
#pragma once

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace GPT2_OPS::simd {

constexpr const char* NAME = "portable";
constexpr int W = 1;
constexpr int ROW_BLOCK = 4;
constexpr int REGISTERS = 32;  // vector registers
constexpr bool NATIVE_BF16 = false;

using F = float;
using I = int32_t;
struct P {
  int16_t lane[2];
};

static inline F zero() { return 0.0f; }
static inline F set1(float v) { return v; }
static inline F load(const float* p) { return *p; }
static inline void store(float* p, F v) { *p = v; }
static inline F add(F a, F b) { return a + b; }
static inline F sub(F a, F b) { return a - b; }
static inline F mul(F a, F b) { return a * b; }
static inline F div(F a, F b) { return a / b; }
static inline F min(F a, F b) { return std::min(a, b); }
static inline F max(F a, F b) { return std::max(a, b); }
static inline F fma(F a, F b, F c) { return std::fma(a, b, c); }
static inline F abs(F a) { return std::fabs(a); }
static inline float reduce_add(F a) { return a; }
static inline float reduce_max(F a) { return a; }
static inline F round_even(F a) { return std::nearbyint(a); }
static inline F ldexp(F p, F n) { return std::ldexp(p, static_cast<int>(n)); }
static inline F load_bf16(const uint16_t* p) { return bf16_to_float(*p); }
static inline F load_half(const c10::Half* p) { return static_cast<float>(*p); }
static inline F dot_bf16x2(F acc, const uint16_t* w, const uint16_t*, const float* xr) {
  acc = fma(load_bf16(w), xr[0], acc);
  return fma(load_bf16(w + 1), xr[1], acc);
}
static inline void store_bf16(uint16_t* p, F v) { *p = float_to_bf16(v); }

static inline I izero() { return 0; }
static inline I iadd(I a, I b) { return a + b; }
static inline int32_t ireduce_add(I a) { return a; }
static inline F to_float(I a) { return static_cast<float>(a); }
static inline I to_int(F a) { return static_cast<int32_t>(std::nearbyint(a)); }
static inline void store_i16(int16_t* p, I a) { *p = static_cast<int16_t>(a); }
static inline P load_i8_pairs(const uint8_t* p) {
  return P{{static_cast<int8_t>(p[0]), static_cast<int8_t>(p[1])}};
}
static inline P load_u8_pairs(const uint8_t* p) { return P{{p[0], p[1]}}; }
static inline P low_nibbles(P a) {
  return P{{static_cast<int16_t>(a.lane[0] & 0x0f), static_cast<int16_t>(a.lane[1] & 0x0f)}};
}
static inline P high_nibbles(P a) {
  return P{{static_cast<int16_t>(a.lane[0] >> 4), static_cast<int16_t>(a.lane[1] >> 4)}};
}
static inline I dot_pairs(I acc, P w, int32_t x) {
  int16_t pair[2];
  std::memcpy(pair, &x, 4);
  return acc + w.lane[0] * pair[0] + w.lane[1] * pair[1];
}
static inline I even_lanes(P a) { return a.lane[0]; }
static inline I odd_lanes(P a) { return a.lane[1]; }

}  // namespace GPT2_OPS::simd
