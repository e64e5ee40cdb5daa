"""ggml's Q4_K ("k-quant", 4.5 bits a weight), written by us in numpy: the gguf package reads it but cannot write it.

One block (ggml's `block_q4_K`, 144 bytes) holds a super-block of 256 values, eight sub-blocks of 32:

| bytes | what |
|---|---|
| 0-1 | `d`, f16: the step of the sub-blocks' 6-bit scales |
| 2-3 | `dmin`, f16: the step of the sub-blocks' 6-bit minimums |
| 4-15 | the eight 6-bit scales and eight 6-bit minimums, packed (`_pack_scales`) |
| 16-143 | 256 4-bit quants: per 64 values, byte i holds value i (low nibble) and value 32 + i (high nibble) |

Value `k` of sub-block `j` reads back as `d * scale[j] * q[k] - dmin * min[j]`.

Each sub-block's scale and minimum come from the search ggml's reference quantizer runs (`make_qkx2_quants`):
start from the sub-block's range, then try 21 slightly different steps, refit scale and minimum to each step's
quants by weighted least squares (weights |x| + the sub-block's root mean square, so large values count more),
and keep whichever fit has the least weighted squared error. The eight scales (and minimums) are then stored as
6-bit multiples of the largest, and every value is quantized once more against the stored, rounded scales.
The blocks are ggml's own quantize_row_q4_K_ref's but for float rounding in sums (98% of blocks, 99.9% of bytes on
Gaussian weights), with the same error: a round trip's root-mean-square error is 0.0715 of the weights' own on
Gaussian weights, 0.093 on heavy-tailed (Student's t, 3 degrees of freedom) ones. tests/test_gguf_q4.py bounds
both, the first against libggml-base itself where GPT2_LLAMA_CPP_BIN names llama.cpp's build/bin.
"""

from __future__ import annotations

import numpy as np

QK_K = 256  # values in a super-block (ggml's QK_K)
SUB_BLOCK = 32  # values sharing one scale and minimum
SUB_BLOCKS = QK_K // SUB_BLOCK
Q4_K_BLOCK_BYTES = 2 + 2 + 12 + QK_K // 2
LEVELS = 15  # the largest 4-bit quant
SCALE_LEVELS = 63  # the largest 6-bit scale or minimum
# The step search of ggml's quantize_row_q4_K_ref: steps range / (LEVELS + RMIN + RDELTA * i), i = 0..NSTEP.
RMIN, RDELTA, NSTEP = -1.0, 0.1, 20


def quantize_q4_k(array: np.ndarray) -> np.ndarray:
    """Q4_K blocks of `array` (..., n) with n a multiple of 256: uint8 (..., n // 256 * 144), as
    `gguf.quants.quantize` shapes its blocks (`gguf.quants.dequantize(blocks, Q4_K)` reads it back)."""
    values = np.asarray(array, dtype=np.float32)
    if values.ndim == 0 or values.shape[-1] % QK_K:
        raise ValueError(f"Q4_K needs rows that are a multiple of {QK_K} values; got shape {values.shape}")
    x = values.reshape(-1, SUB_BLOCKS, SUB_BLOCK)  # (S, 8, 32): S super-blocks
    scales, minimums, quants = _fit_sub_blocks(x)  # (S, 8), (S, 8) as positive offsets, (S, 8, 32)

    max_scale = scales.max(axis=1, initial=0.0)  # (S,): scales are >= 0, as the minimum is subtracted
    max_minimum = minimums.max(axis=1, initial=0.0)
    scale_codes = _six_bits(scales, max_scale)  # (S, 8) in 0..63
    minimum_codes = _six_bits(minimums, max_minimum)
    d = (max_scale / SCALE_LEVELS).astype(np.float16)
    dmin = (max_minimum / SCALE_LEVELS).astype(np.float16)

    # quantize again against what a reader will see: the f16 steps times the 6-bit codes
    step = d.astype(np.float32)[:, None] * scale_codes  # (S, 8)
    offset = dmin.astype(np.float32)[:, None] * minimum_codes
    with np.errstate(divide="ignore", invalid="ignore"):
        requantized = np.clip(np.rint((x + offset[..., None]) / step[..., None]), 0, LEVELS)
    quants = np.where(step[..., None] > 0, requantized, quants).astype(np.uint8)  # a zero step keeps the fit's

    blocks = np.concatenate(
        [d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), _pack_scales(scale_codes, minimum_codes),
         _pack_nibbles(quants)],
        axis=1,
    )  # fmt: skip
    return blocks.reshape(*values.shape[:-1], values.shape[-1] // QK_K * Q4_K_BLOCK_BYTES)


def _fit_sub_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scale, minimum, quants) of each 32-value sub-block of x (..., 32) with x ~ scale * q - minimum, q in 0..15:
    ggml's make_qkx2_quants step search, every sub-block at once. minimum >= 0 (the range always includes 0)."""
    weights = np.sqrt(np.mean(x * x, axis=-1, keepdims=True)) + np.abs(x)  # (..., 32)
    high = x.max(axis=-1, keepdims=True)  # (..., 1)
    low = np.minimum(x.min(axis=-1, keepdims=True), 0.0)
    span = high - low
    flat = span == 0  # all values equal (and <= 0): scale 0, minimum -low
    span = np.where(flat, 1.0, span)

    scale = span / LEVELS
    best_q = np.clip(np.rint((x - low) * (LEVELS / span)), 0, LEVELS)
    best_error = _weighted_error(x, weights, scale, low, best_q)
    best_scale, best_low = scale, low
    sum_w = weights.sum(axis=-1, keepdims=True)
    sum_x = (weights * x).sum(axis=-1, keepdims=True)
    for step in range(NSTEP + 1):
        # each try starts from the best minimum so far, as ggml's search does
        span = high - best_low
        span = np.where(span != 0, span, 1.0)
        q = np.clip(np.rint((x - best_low) * ((LEVELS + RMIN + RDELTA * step) / span)), 0, LEVELS)
        sum_l = (weights * q).sum(axis=-1, keepdims=True)
        sum_l2 = (weights * q * q).sum(axis=-1, keepdims=True)
        sum_xl = (weights * q * x).sum(axis=-1, keepdims=True)
        det = sum_w * sum_l2 - sum_l * sum_l
        solvable = det > 0
        det = np.where(solvable, det, 1.0)
        fit_scale = (sum_w * sum_xl - sum_x * sum_l) / det  # weighted least squares of x on q
        fit_low = (sum_l2 * sum_x - sum_l * sum_xl) / det
        positive = fit_low > 0  # the minimum may not lie above 0: refit the scale alone through 0
        fit_scale = np.where(positive, sum_xl / np.where(sum_l2 > 0, sum_l2, 1.0), fit_scale)
        fit_low = np.where(positive, 0.0, fit_low)
        error = _weighted_error(x, weights, fit_scale, fit_low, q)
        better = solvable & (error < best_error)
        best_q = np.where(better, q, best_q)
        best_error = np.where(better, error, best_error)
        best_scale = np.where(better, fit_scale, best_scale)
        best_low = np.where(better, fit_low, best_low)
    best_scale = np.where(flat, 0.0, best_scale)
    best_q = np.where(flat, 0.0, best_q)
    return best_scale[..., 0], -best_low[..., 0], best_q.astype(np.uint8)


def _weighted_error(
    x: np.ndarray, weights: np.ndarray, scale: np.ndarray, low: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """Weighted squared error (..., 1) of reading q back as scale * q + low."""
    return (weights * np.square(scale * q + low - x)).sum(axis=-1, keepdims=True)


def _six_bits(values: np.ndarray, largest: np.ndarray) -> np.ndarray:
    """values (S, 8) as multiples 0..63 of largest (S,) / 63."""
    inverse = np.divide(SCALE_LEVELS, largest, out=np.zeros_like(largest), where=largest > 0)
    return np.clip(np.rint(values * inverse[:, None]), 0, SCALE_LEVELS).astype(np.uint8)


def _pack_scales(scales: np.ndarray, minimums: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and minimums (S, 8) in ggml's 12 bytes (S, 12) (its get_scale_min_k4 unpacks them):
    bytes 0-3: scales 0-3, and in their top 2 bits the top 2 bits of scales 4-7;
    bytes 4-7: minimums 0-3, and in their top 2 bits the top 2 bits of minimums 4-7;
    bytes 8-11: the low 4 bits of scales 4-7 (low nibble) and of minimums 4-7 (high nibble)."""
    first, last = scales[:, :4], scales[:, 4:]
    first_min, last_min = minimums[:, :4], minimums[:, 4:]
    return np.concatenate(
        [first | ((last >> 4) << 6), first_min | ((last_min >> 4) << 6), (last & 0x0F) | ((last_min & 0x0F) << 4)],
        axis=1,
    ).astype(np.uint8)


def _pack_nibbles(quants: np.ndarray) -> np.ndarray:
    """Quants (S, 8, 32) in 0..15 as ggml's 128 bytes (S, 128): per 64 values (two sub-blocks), byte i holds the first
    sub-block's value i in its low nibble and the second's in its high."""
    pairs = quants.reshape(-1, QK_K // 64, 2, SUB_BLOCK)  # (S, 4, 2, 32)
    return (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, QK_K // 2)
