// Runs the kernels of src/gpt2/cpu/csrc/kernels.h, and the contract functions (simd_portable.h lists them) that
// cpu_decode.cpp calls outside those kernels or at edges their inputs do not reach, on fixed seeded inputs, and
// prints the results as text: tests/test_kernel_harness.py compares each ISA's build (NEON cross-compiled and run
// under qemu, AVX2 and AVX-512 natively) with the portable build's line by line. kernels.h needs nothing of torch
// but c10::Half, which tests/native/stub stands in for.
//
// Every result is printed in an order that does not depend on W, the lanes of a vector. Lines:
//   info <key> <value>           what the build is (its NAME, W, ROW_BLOCK, NATIVE_BF16)
//   exact <name> <values>        must equal the portable build's line character for character: lanewise IEEE
//                                operations, conversions, rounding and integers (floats printed with %a)
//   close <name> <values>        float sums whose order of addition depends on W (compared to 1e-5)
//   check <name> ok|mismatch     the build's own comparison of a kernel with plain scalar code on the same bytes
// Built with -ffp-contract=off, so that the compiler fuses no multiply and add the contract keeps apart.
#include <cinttypes>
#include <cstdio>
#include <string>

#include "kernels.h"

using namespace GPT2_OPS;

static_assert(sizeof(v::I) == 4 * W, "an I is W int32 lanes in memory order");

// splitmix64: the same numbers with every compiler and standard library
struct Random {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform(float low, float high) {
    return low + (high - low) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
  // signed values of magnitudes 2^-20 .. 2^20 (one draw a statement: the order arguments are evaluated in varies)
  float wide() {
    const float mantissa = uniform(-1.0f, 1.0f);
    return std::ldexp(mantissa, below(41) - 20);
  }
};

static void print_floats(const char* kind, const std::string& name, const float* x, size_t n) {
  std::printf("%s %s", kind, name.c_str());
  for (size_t i = 0; i < n; i++) std::printf(" %a", static_cast<double>(x[i]));
  std::printf("\n");
}

static void print_floats(const char* kind, const std::string& name, const std::vector<float>& x) {
  print_floats(kind, name, x.data(), x.size());
}

template <typename Int>
static void print_ints(const std::string& name, const std::vector<Int>& x) {
  std::printf("exact %s", name.c_str());
  for (const Int value : x) std::printf(" %" PRId64, static_cast<int64_t>(value));
  std::printf("\n");
}

static void print_check(const std::string& name, bool ok) {
  std::printf("check %s %s\n", name.c_str(), ok ? "ok" : "mismatch");
}

static void spill(int32_t* out, v::I a) { std::memcpy(out, &a, sizeof a); }

// the values, then random ones up to a multiple of 16 (of every W)
static std::vector<float> padded(std::vector<float> values, Random& random, float scale) {
  while (values.size() % 16 != 0) values.push_back(random.uniform(-scale, scale));
  return values;
}

// ------------------------------------------------------------------------ contract functions beyond the kernels
// round_even (exp's) and to_int (quantize_rows') at ties, values just below a half and float32's integer edge (2^23
// and past it every float is one), and to_float back
static void rounding(Random& random) {
  const std::vector<float> x = padded({0.5f, -0.5f, 1.5f, -1.5f, 2.5f, -2.5f, 3.5f, -3.5f, 4.5f, -4.5f, 0.0f, -0.0f,
                                       0.49999997f, -0.49999997f, 1.4999999f, 8388607.5f, -8388607.5f, 8388609.0f,
                                       16777215.0f, -16777215.0f, 1e-30f, -1e-30f, 32767.5f, -32768.5f, 1234.5f,
                                       -1235.5f},
                                      random, 1000.0f);
  std::vector<float> rounded(x.size()), back(x.size());
  std::vector<int32_t> ints(x.size());
  for (size_t i = 0; i < x.size(); i += W) {
    v::store(&rounded[i], v::round_even(v::load(&x[i])));
    const v::I lanes = v::to_int(v::load(&x[i]));
    spill(&ints[i], lanes);
    v::store(&back[i], v::to_float(lanes));
  }
  print_floats("exact", "round_even", rounded);
  print_ints("to_int", ints);
  print_floats("exact", "to_float", back);
}

// p * 2^n for every n in [-128, 128]: normal, subnormal and (3 * 2^128) infinite results
static void powers_of_two() {
  std::vector<float> p, n;
  for (int e = -128; e <= 128; e++)
    for (float factor : {1.0f, 1.5f, 0.7f, 1.9999999f, -1.25f, 0.5000001f, 3.0f}) {
      p.push_back(factor);
      n.push_back(static_cast<float>(e));
    }
  while (p.size() % 16 != 0) {
    p.push_back(1.0f);
    n.push_back(0.0f);
  }
  std::vector<float> out(p.size());
  for (size_t i = 0; i < p.size(); i += W) v::store(&out[i], v::ldexp(v::load(&p[i]), v::load(&n[i])));
  print_floats("exact", "ldexp", out);
}

// exp (the attention softmax's), across and past its clamp at +-88.376, where n = +-128
static void exponential(Random& random) {
  std::vector<float> x = {0.0f,  -0.0f, 1e-30f, -1e-30f, 1.0f,   -1.0f,   0.6931472f, 88.3762626647949f,
                          -88.3762626647949f, 88.0f, -87.5f, 88.72f, -103.0f, 100.0f};
  for (int i = 0; i <= 200; i++) x.push_back(-100.0f + static_cast<float>(i));
  x = padded(x, random, 90.0f);
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); i += W) v::store(&out[i], v::exp(v::load(&x[i])));
  print_floats("exact", "exp", out);
}

// reduce_max of negative values (the kernels take it of magnitudes only, where a maximum starting at 0 would pass)
static void negative_maxima(Random& random) {
  std::vector<float> maxima(8);
  for (float& maximum : maxima) {
    float x[16];
    for (float& value : x) value = -std::fabs(random.wide());
    v::F largest = v::load(x);
    for (int i = W; i < 16; i += W) largest = v::max(largest, v::load(x + i));
    maximum = v::reduce_max(largest);
  }
  print_floats("exact", "reduce_max", maxima);
}

// float bits other than NaNs (which print differently by sign and payload)
static uint16_t bf16_bits(Random& random) {
  for (;;) {
    const auto bits = static_cast<uint16_t>(random.next());
    if ((bits & 0x7f80u) != 0x7f80u || (bits & 0x7fu) == 0) return bits;
  }
}

static uint16_t half_bits(Random& random) {
  for (;;) {
    const auto bits = static_cast<uint16_t>(random.next());
    if ((bits & 0x7c00u) != 0x7c00u || (bits & 0x3ffu) == 0) return bits;
  }
}

// load_bf16 and load_half of zeros, subnormals, infinities and the largest finite values; store_bf16 (the int4
// dequantization's) at ties to even both ways, rounding into infinity and a NaN
static void sixteen_bit_floats(Random& random) {
  constexpr int N = 64;
  uint16_t bf16[N];
  const uint16_t special_bf16[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x7f80, 0xff80, 0x7f7f, 0x3f80};
  for (int i = 0; i < N; i++) bf16[i] = i < 8 ? special_bf16[i] : bf16_bits(random);
  float out[N];
  for (int i = 0; i < N; i += W) v::store(out + i, v::load_bf16(bf16 + i));
  print_floats("exact", "load_bf16", out, N);

  c10::Half half[N];
  const uint16_t special_half[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x0400, 0x7bff, 0x7c00, 0xfc00, 0x3c00, 0x3555};
  for (int i = 0; i < N; i++) half[i].x = i < 10 ? special_half[i] : half_bits(random);
  for (int i = 0; i < N; i += W) v::store(out + i, v::load_half(half + i));
  print_floats("exact", "load_half", out, N);

  const uint32_t special_floats[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f808001u,
                                     0x7f7fffffu, 0x7fc00001u, 0x00000001u, 0x80000000u};
  float values[N];
  for (int i = 0; i < N; i++) {
    if (i < 8) std::memcpy(&values[i], &special_floats[i], 4);
    else values[i] = random.wide();
  }
  std::vector<uint16_t> stored(N);
  for (int i = 0; i < N; i += W) v::store_bf16(&stored[i], v::load(values + i));
  print_ints("store_bf16", stored);
}

// ------------------------------------------------------------------------ the int8 and int4 tile products
// One tile (16 output rows by K inputs) of random bytes in the layouts of cpu_decode.cpp's header, against ROWS
// activation rows: all at once past FEW_ROWS (PROMPT_ROWS at a time, the rest together), as tiled_product takes
// them, and the first FEW_ROWS block by block as a decode step takes them.
constexpr int64_t K = 2 * BLOCK, BLOCKS = K / BLOCK, ROWS = 14;  // past any ISA's PROMPT_ROWS (12 at most)

// W[r, k] read from the tile's bytes as cpu_decode.cpp's header lays them out, one code at a time
static int32_t weight_code(Kind kind, const std::vector<uint8_t>& tile, int64_t r, int64_t k) {
  if (kind == I8) return static_cast<int8_t>(tile[(k / 2) * 2 * TILE + 2 * r + k % 2]);  // (K/2, 16, 2)
  // (K/32, 8 chunks, 16, 2): chunk c's byte 2r + j = code(4c + j) | code(4c + 2 + j) << 4
  const uint8_t byte = tile[(k / BLOCK) * BLOCK * TILE / 2 + (k % BLOCK / 4) * 2 * TILE + 2 * r + k % 2];
  return k % 4 < 2 ? byte & 0x0f : byte >> 4;
}

// params: I4's (BLOCKS, 2, 16) float16 scales and minimums
template <Kind kind>
static void tile_product(const char* name, const std::vector<uint8_t>& tile, const c10::Half* params,
                         const QuantizedRows& xq) {
  std::vector<float> sums(ROWS * TILE, 0.0f), streamed(FEW_ROWS * TILE, 0.0f);
  bool decoded = true;
  for (int64_t b = 0; b < BLOCKS; b++) {
    // pair p as cpu_decode.cpp's dequantization reads it: lane i of vector h is row hW + i, inputs 2p and 2p + 1
    for_each_pair<kind>(tile.data(), b, [&](int64_t pair, int h, v::P pairs) {
      int32_t even[W], odd[W];
      spill(even, v::even_lanes(pairs));
      spill(odd, v::odd_lanes(pairs));
      for (int i = 0; i < W; i++) {
        const int64_t row = h * W + i, k = b * BLOCK + 2 * pair;
        decoded = decoded && even[i] == weight_code(kind, tile, row, k);
        decoded = decoded && odd[i] == weight_code(kind, tile, row, k + 1);
      }
    });
    const c10::Half* block_params = kind == I4 ? params + b * 2 * TILE : nullptr;
    accumulate_rows_streaming<kind, FEW_ROWS>(tile.data(), block_params, xq, 0, K, BLOCKS, b, streamed.data());
  }
  const std::vector<int32_t> panels = row_panels(xq, ROWS, K);
  for (int64_t n = 0; n < ROWS; n += PROMPT_ROWS) {
    const int64_t rows = std::min<int64_t>(PROMPT_ROWS, ROWS - n);
    tile_rows_upto<kind, PROMPT_ROWS>(rows, tile.data(), params, xq, panels.data() + n * K / 2, n, K,
                                      sums.data() + n * TILE);
  }
  // the same sums one row at a time: each block's exact integer dot product, then the kernel's float operations in
  // its order, which makes them equal to the bit
  std::vector<float> expected(ROWS * TILE, 0.0f);
  for (int64_t n = 0; n < ROWS; n++)
    for (int64_t r = 0; r < TILE; r++)
      for (int64_t b = 0; b < BLOCKS; b++) {
        int32_t dot = 0;
        for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; k++)
          dot += weight_code(kind, tile, r, k) * xq.codes[n * K + k];
        const float x_scale = xq.scales[n * BLOCKS + b];
        float& sum = expected[n * TILE + r];
        if (kind == I8) {
          sum = std::fma(static_cast<float>(dot), x_scale, sum);
        } else {
          const float scale = params[b * 2 * TILE + r], minimum = params[b * 2 * TILE + TILE + r];
          sum = std::fma(minimum, xq.sums[n * BLOCKS + b], std::fma(static_cast<float>(dot) * x_scale, scale, sum));
        }
      }
  print_floats("exact", std::string(name) + ".sums", sums);
  print_check(std::string(name) + ".decode_equals_scalar", decoded);
  const bool same = std::memcmp(sums.data(), expected.data(), 4 * sums.size()) == 0;
  print_check(std::string(name) + ".sums_equal_scalar", same);
  const bool streamed_same = std::memcmp(streamed.data(), expected.data(), 4 * streamed.size()) == 0;
  print_check(std::string(name) + ".streamed_sums_equal_scalar", streamed_same);
}

static void tiles(Random& random) {
  std::vector<float> x(ROWS * K);
  for (float& value : x) value = random.uniform(-3.0f, 3.0f);
  x[5] = 100.0f;  // a block's largest value: codes +-32767 beside small ones
  std::fill(x.begin() + 4 * K + BLOCK, x.begin() + 5 * K, 0.0f);  // an all-zero block: scale 0
  const QuantizedRows xq = quantize_rows(x.data(), ROWS, K);
  print_ints("quantize_rows.codes", xq.codes);
  print_floats("exact", "quantize_rows.scales", xq.scales);
  print_floats("exact", "quantize_rows.sums", xq.sums);

  std::vector<uint8_t> tile(TILE * K);
  for (uint8_t& byte : tile) byte = static_cast<uint8_t>(random.next());
  tile[0] = tile[1] = 0x80;  // -128
  tile[2] = 0x7f;
  tile_product<I8>("tile_int8", tile, nullptr, xq);
  tile.resize(TILE * K / 2);
  tile[0] = 0xff;
  tile[1] = 0x00;
  std::vector<c10::Half> params(BLOCKS * 2 * TILE);
  for (c10::Half& param : params) {  // float16 of either sign, exponents 2^-7 .. 2^-2
    const int sign = random.below(2) << 15;
    param.x = static_cast<uint16_t>(sign | (0x2000 + random.below(0x1800)));
  }
  tile_product<I4>("tile_int4", tile, params.data(), xq);
}

// ------------------------------------------------------------------------ the row-major products
// rowmajor_blocks of R weight rows against ns = 1 .. MAX_ROWS activation rows: sums (R, ns) one after the other.
// Positive terms, so that adding them in any order agrees to ~1e-6.
template <typename Wt, int64_t R>
static void rowmajor(const std::string& name, const std::vector<Wt>& w, const RowActivations& x, int64_t k) {
  std::vector<float> out;
  for (int64_t ns = 1; ns <= MAX_ROWS; ns++) {
    float sums[R * MAX_ROWS] = {};
    rowmajor_blocks<Wt, R, MAX_ROWS, MAX_ROWS>(ns, w.data(), x, k, sums);
    for (int64_t r = 0; r < R; r++) out.insert(out.end(), sums + r * MAX_ROWS, sums + r * MAX_ROWS + ns);
  }
  print_floats("close", "rowmajor_blocks." + name + ".R" + std::to_string(R), out);
}

static void row_major_products(Random& random) {
  constexpr int64_t k = 293;  // steps of all the kernel's chains, then single steps, then a scalar tail on every ISA
  std::vector<float> wf(4 * k), xf(MAX_ROWS * k), xr(MAX_ROWS * k);
  std::vector<uint16_t> wb(4 * k), xb(MAX_ROWS * k);
  for (size_t i = 0; i < wf.size(); i++) {
    wf[i] = random.uniform(0.01f, 2.0f);
    wb[i] = float_to_bf16(random.uniform(0.01f, 2.0f));
  }
  for (size_t i = 0; i < xf.size(); i++) {
    xf[i] = random.uniform(0.01f, 2.0f);
    xb[i] = float_to_bf16(xf[i]);
    xr[i] = bf16_to_float(xb[i]);
  }
  const RowActivations floats{xf.data(), nullptr, nullptr}, bfloats{nullptr, xb.data(), xr.data()};
  rowmajor<float, 1>("float32", wf, floats, k);
  rowmajor<float, 2>("float32", wf, floats, k);
  rowmajor<float, 4>("float32", wf, floats, k);
  rowmajor<uint16_t, 1>("bfloat16", wb, bfloats, k);
  rowmajor<uint16_t, 2>("bfloat16", wb, bfloats, k);
  rowmajor<uint16_t, 4>("bfloat16", wb, bfloats, k);
}

// ------------------------------------------------------------------------ the decode step
// layer_norm over C = 101: vectors, then a scalar tail on every ISA
static void norm(Random& random) {
  constexpr int64_t C = 101;
  std::vector<float> x(C), gain(C), bias(C), y(C);
  for (int64_t i = 0; i < C; i++) {
    x[i] = random.uniform(1.0f, 3.0f);
    gain[i] = random.uniform(0.5f, 1.5f);
    bias[i] = random.uniform(4.0f, 5.0f);  // outputs away from 0, where the relative tolerance holds
  }
  layer_norm(x.data(), y.data(), gain.data(), bias.data(), C, 1e-5f);
  print_floats("close", "layer_norm", y);
}

// gelu_inplace across GELU's saturation, 253 values: vectors, then a tail of one lane at a time on every ISA
static void gelu() {
  std::vector<float> x = {0.0f, -0.0f, 1e-20f, -1e-20f, 20.0f, -20.0f, 100.0f, -100.0f, 1e4f, -1e4f, 3.0f, -3.0f};
  for (int i = 0; i <= 240; i++) x.push_back(-12.0f + 0.1f * static_cast<float>(i));
  gelu_inplace(x.data(), static_cast<int64_t>(x.size()));
  print_floats("exact", "gelu_inplace", x);
}

// A query against S cached keys (dot_row), and S cached values weighted (weighted_sum), cache rows wider than hs
// as heads share them. T = float or the bits of bfloat16. hs = 64 takes weighted_sum's register path, 21 its
// scalar one and a tail of dot_row on every ISA; one weight is 0, a masked column.
template <typename T>
static void attention(const char* name, int64_t hs, Random& random) {
  constexpr int64_t S = 6;
  const int64_t stride = hs + 8;
  std::vector<float> q(hs), weights(S), dots(S), out(hs);
  std::vector<T> keys(S * stride), values(S * stride);
  for (float& value : q) value = random.uniform(0.01f, 2.0f);
  for (size_t i = 0; i < keys.size(); i++) {
    store_from_float(keys.data(), i, random.uniform(0.01f, 2.0f));
    store_from_float(values.data(), i, random.uniform(-2.0f, 2.0f));
  }
  for (float& weight : weights) weight = random.uniform(0.01f, 1.0f);
  weights[2] = 0.0f;
  for (int64_t s = 0; s < S; s++) dots[s] = dot_row(q.data(), keys.data() + s * stride, hs);
  weighted_sum(out.data(), weights.data(), 0.37f, values.data(), stride, S, hs);
  const std::string suffix = std::string(".") + name + "." + std::to_string(hs);
  print_floats("close", "dot_row" + suffix, dots);
  print_floats("exact", "weighted_sum" + suffix, out);  // each output the same operations in the same order
}

int main() {
  std::printf("info NAME %s\ninfo W %d\ninfo ROW_BLOCK %d\ninfo NATIVE_BF16 %d\n", v::NAME, v::W, v::ROW_BLOCK,
              v::NATIVE_BF16 ? 1 : 0);
  Random random{20240611};
  rounding(random);
  powers_of_two();
  exponential(random);
  negative_maxima(random);
  sixteen_bit_floats(random);
  tiles(random);
  row_major_products(random);
  norm(random);
  gelu();
  for (int64_t hs : {64, 21}) {
    attention<float>("float32", hs, random);
    attention<uint16_t>("bfloat16", hs, random);
  }
  return 0;
}
