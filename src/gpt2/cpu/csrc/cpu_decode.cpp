// CPU kernels for decoding GPT-2; gpt2/cpu/kernels.py builds this file on first use (torch's extension builder),
// once per instruction set (-DGPT2_ISA_AVX512, _AVX2, _NEON, or none: the portable loops), and falls back to the
// PyTorch layouts when it cannot.
//
// Why: decoding reads every weight once per step, so at 1-16 rows a CPU decodes at the speed it streams the
// weights from memory. PyTorch's one-row products stream bf16 / int8 / int4 weights well below that speed, and a
// step of ~250 small framework ops costs 2-3 ms on top. Here every precision streams at close to the memory's
// speed, and `Decoder::step` runs a whole one-token step (embeddings, the blocks, the final LayerNorm, the LM
// head) in one call.
//
// Every kernel is written once, on the vector layer of simd.h: a small contract (vectors of W float32 lanes, int16
// pair products, bfloat16 and float16 widening) that each ISA's header implements (simd_avx512.h, simd_avx2.h,
// simd_neon.h) and simd_portable.h implements in plain C++ as the reference the others are tested against.
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
//   exact integer dot products of int16 pairs (`vpdpwssd`, `vpmaddwd`, `smull` + `addp`), scaled once per block.
// O is padded to a multiple of 16 in the tiled formats; K must be a multiple of 32 (kernels.py checks).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

// The namespace of the ops (torch.ops.<GPT2_OPS>, torch.classes.<GPT2_OPS>) and of this file's C++ names: each ISA's
// build gets its own (kernels.py), so that several can be loaded in one process without sharing C++ type names.
#include "kernels.h"

namespace GPT2_OPS {

// F32 and BF16 against one activation row (a lone decode step): y[0, o] = W[o] . x, weight row after weight row,
// four accumulators a row. Each thread reads its share of W as one sequential stream, which the hardware
// prefetchers follow best: faster than blocks of 8 weight rows read side by side (8 streams 3 KB apart) where
// memory is fast, equal where it is contended (`gpt2 bench decode --precisions float32,bfloat16`).
template <typename Wt>
static void rowwise_product(const Wt* w, const RowActivations& x, int64_t K, int64_t O, const Output& out) {
  constexpr int64_t V = STEP<Wt>;
  at::parallel_for(0, O, 64, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; o++) {
      const Wt* row = w + o * K;
      v::F acc[4] = {v::zero(), v::zero(), v::zero(), v::zero()};
      int64_t k = 0;
      for (; k + 4 * V <= K; k += 4 * V) {
        prefetch_ahead(row + k, 4 * V * sizeof(Wt));
        for (int64_t j = 0; j < 4; j++) acc[j] = dot_step(acc[j], row, x, k + V * j);
      }
      for (; k + V <= K; k += V) acc[0] = dot_step(acc[0], row, x, k);
      float total = v::reduce_add(v::add(v::add(acc[0], acc[1]), v::add(acc[2], acc[3])));
      for (; k < K; k++) total += scalar_product(row, x, k);
      out.store(0, o, total);
    }
  });
}

// F32 and BF16 against several activation rows: row-major weights (Wt = float or the bfloat16 bits as uint16_t), R
// rows at a time against NR activation rows, a horizontal sum per row at the end.
template <typename Wt, int64_t R = v::ROW_BLOCK, int64_t NR = MAX_ROWS>
static void rowmajor_product(const Wt* w, const RowActivations& x, int64_t N, int64_t K, int64_t O, const Output& out) {
  at::parallel_for(0, (O + R - 1) / R, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; block++) {
      const int64_t o0 = block * R, rows = std::min(R, O - o0);
      for (int64_t n0 = 0; n0 < N; n0 += NR) {
        const int64_t ns = std::min(NR, N - n0);
        float sums[R][NR] = {};
        if (rows == R) {
          rowmajor_blocks<Wt, R, NR, NR>(ns, w + o0 * K, x.at(n0, K), K, &sums[0][0]);
        } else {
          for (int64_t r = 0; r < rows; r++)
            rowmajor_blocks<Wt, 1, NR, NR>(ns, w + (o0 + r) * K, x.at(n0, K), K, &sums[r][0]);
        }
        for (int64_t r = 0; r < rows; r++)
          for (int64_t n = 0; n < ns; n++) out.store(n0 + n, o0 + r, sums[r][n]);
      }
    }
  });
}

// I8 and I4: tiles of 16 output rows, whose 16 partial sums are TV vectors (no horizontal sums); each activation row
// takes its exact int32 dot products with a block of 32 inputs of the tile, scaled into its float sums once per block.
// A few rows (decode steps): every thread streams its share of the weights once, block by block for all rows, the
// sums in memory. More (prompts, evaluation): PROMPT_ROWS rows at a time against a whole tile, the sums in
// registers; the rows of a chunk (~256 KB of activation codes, which the cache keeps) go against all of a thread's
// tiles before the next chunk.
template <Kind kind>
static void tiled_product(const uint8_t* w, const float* row_scale, const c10::Half* group_params,
                          const QuantizedRows& xq, int64_t N, int64_t K, int64_t O, const Output& out) {
  if (N == 0) return;
  const int64_t tiles = (O + TILE - 1) / TILE, blocks = K / BLOCK;
  const int64_t tile_bytes = kind == I8 ? TILE * K : TILE * K / 2;
  auto tile_params = [&](int64_t tile) { return kind == I4 ? group_params + tile * blocks * 2 * TILE : nullptr; };
  if (N > FEW_ROWS) {
    const int64_t chunk = std::max<int64_t>(PROMPT_ROWS, (1 << 17) / K / PROMPT_ROWS * PROMPT_ROWS);
    const std::vector<int32_t> panels = row_panels(xq, N, K);
    at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
      float sums[PROMPT_ROWS * TILE];
      for (int64_t n0 = 0; n0 < N; n0 += chunk)
        for (int64_t tile = begin; tile < end; tile++) {
          const int64_t o0 = tile * TILE, outputs = std::min(TILE, O - o0);
          for (int64_t n = n0; n < std::min(N, n0 + chunk); n += PROMPT_ROWS) {
            const int64_t rows = std::min<int64_t>(PROMPT_ROWS, N - n);
            const int32_t* panel = panels.data() + n * K / 2;  // group n / PROMPT_ROWS
            tile_rows_upto<kind, PROMPT_ROWS>(rows, w + tile * tile_bytes, tile_params(tile), xq, panel, n, K, sums);
            for (int64_t r = 0; r < rows; r++) out.store_tile(n + r, o0, outputs, sums + r * TILE, row_scale);
          }
        }
    });
    return;
  }
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    float sums[FEW_ROWS * TILE];  // (N, 16) float sums of the current tile
    for (int64_t tile = begin; tile < end; tile++) {
      const int64_t o0 = tile * TILE;
      const uint8_t* tile_weights = w + tile * tile_bytes;
      std::fill(sums, sums + N * TILE, 0.0f);
      for (int64_t b = 0; b < blocks; b++) {
        const c10::Half* params = kind == I4 ? tile_params(tile) + b * 2 * TILE : nullptr;
        prefetch_ahead(tile_weights + b * tile_bytes / blocks, tile_bytes / blocks);
        if (params) prefetch_ahead(params, 2 * TILE * sizeof(c10::Half));
        static_assert(FEW_ROWS == 4, "the cases are the counts up to FEW_ROWS");
        switch (N) {
          case 1: accumulate_rows_streaming<kind, 1>(tile_weights, params, xq, 0, K, blocks, b, sums); break;
          case 2: accumulate_rows_streaming<kind, 2>(tile_weights, params, xq, 0, K, blocks, b, sums); break;
          case 3: accumulate_rows_streaming<kind, 3>(tile_weights, params, xq, 0, K, blocks, b, sums); break;
          default: accumulate_rows_streaming<kind, 4>(tile_weights, params, xq, 0, K, blocks, b, sums);
        }
      }
      for (int64_t n = 0; n < N; n++) out.store_tile(n, o0, std::min(TILE, O - o0), sums + n * TILE, row_scale);
    }
  });
}

struct Linear {
  int64_t kind;
  at::Tensor weight;  // see the formats at the top
  at::Tensor scale;   // I8: (O padded,) float32 per row; I4: (O/16, K/32, 2, 16) float16; else undefined
  at::Tensor bias;    // (O,) float32 or undefined
  int64_t in_features, out_features;

  void apply(const float* x, int64_t N, const Output& out) const {
    const int64_t K = in_features, O = out_features;
    if (kind == F32) {
      const RowActivations rows{x, nullptr, nullptr};
      row_major(weight.data_ptr<float>(), rows, N, out);
    } else if (kind == BF16) {
      std::vector<uint16_t> xb(N * K);
      std::vector<float> xr(N * K);
      for (int64_t i = 0; i < N * K; i++) {
        xb[i] = float_to_bf16(x[i]);
        xr[i] = bf16_to_float(xb[i]);
      }
      const RowActivations rows{nullptr, xb.data(), xr.data()};
      row_major(reinterpret_cast<const uint16_t*>(weight.data_ptr()), rows, N, out);
    } else {
      const QuantizedRows xq = quantize_rows(x, N, K);
      const auto* w = reinterpret_cast<const uint8_t*>(weight.data_ptr());
      if (kind == I8) tiled_product<I8>(w, scale.data_ptr<float>(), nullptr, xq, N, K, O, out);
      else tiled_product<I4>(w, nullptr, scale.data_ptr<c10::Half>(), xq, N, K, O, out);
    }
  }

  // F32 and BF16: one row streams the weight row by row, a few rows one weight row against all of them, more
  // rows v::ROW_BLOCK weight rows at a time (FEW_ROWS)
  template <typename Wt>
  void row_major(const Wt* w, const RowActivations& rows, int64_t N, const Output& out) const {
    const int64_t K = in_features, O = out_features;
    if (N == 1) rowwise_product<Wt>(w, rows, K, O, out);
    else if (N <= FEW_ROWS) rowmajor_product<Wt, 1>(w, rows, N, K, O, out);
    else rowmajor_product<Wt>(w, rows, N, K, O, out);
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

// The weight W (O, K) a packed or bfloat16 layer stands for, contiguous in `dtype`, for prefills, where one big matrix
// product over the weight dequantized on the fly beats streaming it block by block (row-major as nn.Linear holds
// it: oneDNN's product, which gpt2/cpu/kernels.py calls with it, is ~20% faster than over the transposed layout).
static at::Tensor dequantize_op(const at::Tensor& weight, const c10::optional<at::Tensor>& scale, int64_t kind,
                                int64_t in_features, int64_t out_features, at::ScalarType dtype) {
  const Linear linear = make_linear(kind, weight, scale, c10::nullopt, in_features, out_features);
  if (kind == F32 || kind == BF16) return weight.to(dtype);
  const int64_t K = in_features, O = out_features, blocks = K / BLOCK, tiles = (O + TILE - 1) / TILE;
  // With native bfloat16 products, bfloat16 is written directly (rounded to nearest even, as .to(bfloat16) rounds):
  // one pass over half the bytes of a float32 matrix and its conversion, which took ~60% of an int8 prefill's products
  const bool direct_bf16 = v::NATIVE_BF16 && dtype == at::kBFloat16;
  at::Tensor result = at::empty({tiles * TILE, K}, direct_bf16 ? at::kBFloat16 : at::kFloat);  // whole tiles
  float* rows = direct_bf16 ? nullptr : result.data_ptr<float>();
  uint16_t* rows_bf16 = direct_bf16 ? reinterpret_cast<uint16_t*>(result.data_ptr()) : nullptr;
  const auto* w = reinterpret_cast<const uint8_t*>(linear.weight.data_ptr());
  const float* row_scale = kind == I8 ? linear.scale.data_ptr<float>() : nullptr;
  const c10::Half* group_params = kind == I4 ? linear.scale.data_ptr<c10::Half>() : nullptr;
  const int64_t tile_bytes = kind == I8 ? TILE * K : TILE * K / 2;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    float block[BLOCK][TILE];  // one block as the vectors give it: input k of the tile's 16 rows
    for (int64_t tile = begin; tile < end; tile++) {
      const int64_t o0 = tile * TILE;
      for (int64_t b = 0; b < blocks; b++) {
        v::F scale[TV], minimum[TV];
        if (kind == I8) {
          for (int h = 0; h < TV; h++) {
            scale[h] = v::load(row_scale + o0 + h * W);
            minimum[h] = v::zero();
          }
        } else {
          load_group_params(group_params + (tile * blocks + b) * 2 * TILE, scale, minimum);
        }
        // pair p as int16 lanes (lane 2r + j = row r, input 2p + j): inputs 2p and 2p + 1 of the rows
        auto write = [&](int64_t pair, int h, v::P pairs) {
          v::store(&block[2 * pair][h * W], v::fma(v::to_float(v::even_lanes(pairs)), scale[h], minimum[h]));
          v::store(&block[2 * pair + 1][h * W], v::fma(v::to_float(v::odd_lanes(pairs)), scale[h], minimum[h]));
        };
        if (kind == I8) for_each_pair<I8>(w + tile * tile_bytes, b, write);
        else for_each_pair<I4>(w + tile * tile_bytes, b, write);
        for (int64_t r = 0; r < TILE; r++) {  // transposed into the rows' 32 inputs of this block
          const int64_t at = (o0 + r) * K + b * BLOCK;
          if (direct_bf16) {
            for (int64_t i = 0; i < BLOCK; i++) rows_bf16[at + i] = float_to_bf16(block[i][r]);
          } else {
            for (int64_t i = 0; i < BLOCK; i++) rows[at + i] = block[i][r];
          }
        }
      }
    }
  });
  at::Tensor cut = result.narrow(0, 0, O);  // contiguous: whole rows
  return direct_bf16 || dtype == at::kFloat ? cut : cut.to(dtype);
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
    for (; s + W <= S; s += W) v::store(weights + s, v::exp(v::load(weights + s)));
    for (; s < S; s++) weights[s] = v::first_lane(v::exp(v::set1(weights[s])));  // the same formula, one lane
    if (visible)
      for (s = 0; s < S; s++)
        if (!visible[s]) weights[s] = 0.0f;
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
