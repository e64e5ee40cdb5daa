// A stand-in for PyTorch's c10/util/Half.h, which the simd headers include for c10::Half: the kernel harness is
// cross-compiled for AArch64, where no torch headers are installed. Only what the headers use: a float16 held as its
// 16 bits (as c10::Half is), read as a float.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace c10 {

struct Half {
  uint16_t x;

  operator float() const {
    const uint32_t sign = static_cast<uint32_t>(x & 0x8000u) << 16;
    const uint32_t exponent = (x >> 10) & 0x1fu, mantissa = x & 0x3ffu;
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float32
      const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
      return sign ? -magnitude : magnitude;
    }
    // the infinities and NaNs keep an all-ones exponent; normal numbers rebias it from 15 to 127
    const uint32_t bits = sign | (exponent == 0x1f ? 0xffu : exponent + 112) << 23 | mantissa << 13;
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
  }
};

}  // namespace c10
