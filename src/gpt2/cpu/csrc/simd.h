// The vector layer of the kernels: the scalar helpers every ISA shares, then one ISA's implementation of the kernel
// contract (simd_portable.h lists it), chosen by the build (gpt2/cpu/kernels.py passes -DGPT2_ISA_<NAME> with the
// matching compiler flags), then the vector math built on that contract.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#ifndef GPT2_OPS
#define GPT2_OPS gpt2
#endif

namespace GPT2_OPS {

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

}  // namespace GPT2_OPS

#if defined(GPT2_ISA_AVX512)
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__F16C__))
#error "GPT2_ISA_AVX512 needs -mavx512f -mavx512bw -mavx512vl -mf16c (or -march=native on such a CPU)"
#endif
#include "simd_avx512.h"
#elif defined(GPT2_ISA_AVX2)
#if !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#error "GPT2_ISA_AVX2 needs -mavx2 -mfma -mf16c"
#endif
#include "simd_avx2.h"
#elif defined(GPT2_ISA_NEON)
#if !(defined(__aarch64__) && defined(__ARM_NEON))
#error "GPT2_ISA_NEON needs an AArch64 compiler"
#endif
#include "simd_neon.h"
#else
#include "simd_portable.h"
#endif

namespace GPT2_OPS::simd {

constexpr int TILE_VECTORS = 16 / W;  // vectors per tile of 16 output rows

static inline float first_lane(F a) {
  float lanes[W];
  store(lanes, a);
  return lanes[0];
}

// exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2, with Cephes' expf polynomial (~1 ulp).
static inline F exp(F x) {
  x = min(max(x, set1(-88.3762626647949f)), set1(88.3762626647949f));
  const F n = round_even(mul(x, set1(1.44269504088896341f)));
  F r = fma(n, set1(-0.693359375f), x);
  r = fma(n, set1(2.12194440e-4f), r);
  F p = set1(1.9875691500e-4f);
  p = fma(p, r, set1(1.3981999507e-3f));
  p = fma(p, r, set1(8.3334519073e-3f));
  p = fma(p, r, set1(4.1665795894e-2f));
  p = fma(p, r, set1(1.6666665459e-1f));
  p = fma(p, r, set1(5.0000001201e-1f));
  p = fma(p, mul(r, r), add(r, set1(1.0f)));
  return ldexp(p, n);
}

// GPT-2's GELU, the tanh approximation, with tanh(u) = 1 - 2 / (exp(2u) + 1)
static inline F gelu(F x) {
  const F x3 = mul(mul(x, x), x);
  const F u = mul(set1(0.7978845608028654f), fma(set1(0.044715f), x3, x));
  const F e = exp(add(u, u));
  const F t = sub(set1(1.0f), div(set1(2.0f), add(e, set1(1.0f))));
  return mul(mul(set1(0.5f), x), add(set1(1.0f), t));
}

}  // namespace GPT2_OPS::simd
