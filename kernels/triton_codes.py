"""Small integer codes (quantized weights, KV values) to tensor-core operands, in Triton.

A non-negative code q OR-ed into the low mantissa bits of a power of two B is the float B + q, exactly, in
one integer operation, for two codes at once where they share a register (nibble_pairs): no int-to-float
conversion per element, and no packing of converted halves. The callers keep the offset B out of the
per-element work: they fold it into a per-row or per-output correction (kernels/quant_matmul) or subtract
it on packed pairs (kernels/paged_attention). fp32 operands (fp32 models, the interpreter) take the codes
as they are, B = 0.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def offset_codes(q, DTYPE: tl.constexpr):
    """Codes below 128 as DTYPE holding offset_code_base(DTYPE) + q: bf16 128 + q (its 7 mantissa bits hold
    q < 128), fp16 1024 + q."""
    if DTYPE == tl.float16:
        return (q.to(tl.int16) | 0x6400).to(tl.float16, bitcast=True)
    elif DTYPE == tl.bfloat16:
        return (q.to(tl.int16) | 0x4300).to(tl.bfloat16, bitcast=True)
    else:
        return q.to(tl.float32)


@triton.jit
def offset_code_base(DTYPE: tl.constexpr):
    if DTYPE == tl.float16:
        return 1024.0
    elif DTYPE == tl.bfloat16:
        return 128.0
    else:
        return 0.0


@triton.jit
def nibble_pairs(word, p: tl.constexpr, DTYPE: tl.constexpr):
    """Codes p and p + 4 of int32 words of eight 4-bit codes (code i in bits 4i..4i+3) as DTYPE [..., 2] =
    (code p, code p + 4) + nibble_pair_base(DTYPE). For half types the codes are shifted into the mantissa
    of 16.0, below the exponent one OR sets: one shift, one mask and one OR for the pair, which then shares
    a 32-bit register (low half first), as packed arithmetic and the tensor cores take it."""
    if DTYPE == tl.float16:  # 16 + q: q in mantissa bits 6..9 (step 1/64 between 16 and 32)
        SHIFT_F16: tl.constexpr = 4 * p - 6
        shifted = word >> SHIFT_F16 if SHIFT_F16 >= 0 else word << -SHIFT_F16
        bits = (shifted & 0x03C003C0) | 0x4C004C00
        lo = (bits & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
        return tl.join(lo, (bits >> 16).to(tl.int16).to(tl.float16, bitcast=True))
    elif DTYPE == tl.bfloat16:  # 16 + q: q in mantissa bits 3..6 (step 1/8)
        SHIFT_BF16: tl.constexpr = 4 * p - 3
        shifted = word >> SHIFT_BF16 if SHIFT_BF16 >= 0 else word << -SHIFT_BF16
        bits = (shifted & 0x00780078) | 0x41804180
        lo = (bits & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)
        return tl.join(lo, (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True))
    else:
        return tl.join(((word >> (4 * p)) & 15).to(DTYPE), ((word >> (4 * p + 16)) & 15).to(DTYPE))


@triton.jit
def nibble_pair_base(DTYPE: tl.constexpr):
    return 0.0 if DTYPE == tl.float32 else 16.0


@triton.jit
def six_bit_words(packed_ptr, rows, row_mask, k0, KP, BLOCK_N: tl.constexpr, GROUP_SIZE: tl.constexpr):
    """The 24-bit words holding 6-bit codes k0 .. k0 + GROUP_SIZE of `rows` ([BLOCK_N, GROUP_SIZE / 4] int32:
    word j holds the codes of columns k0 + 4j + p in bits 6p .. 6p + 5). packed_ptr: the rows [N, 3 KP / 4]
    bytes read as int32, three words holding four 24-bit words (sixteen codes)."""
    chunk = tl.arange(0, GROUP_SIZE // 16)
    row = packed_ptr + rows[:, None] * (KP * 3 // 16) + (k0 * 3 // 16 + 3 * chunk)[None, :]
    w0 = tl.load(row, mask=row_mask[:, None], other=0)
    w1 = tl.load(row + 1, mask=row_mask[:, None], other=0)
    w2 = tl.load(row + 2, mask=row_mask[:, None], other=0)
    word_a = w0 & 0xFFFFFF
    word_b = ((w0 >> 24) & 0xFF) | ((w1 & 0xFFFF) << 8)
    word_c = ((w1 >> 16) & 0xFFFF) | ((w2 & 0xFF) << 16)
    word_d = (w2 >> 8) & 0xFFFFFF
    # joined as [chunk, j, i] = (a, c), (b, d): flat index 4 chunk + 2j + i runs a, b, c, d
    return tl.reshape(tl.join(tl.join(word_a, word_c), tl.join(word_b, word_d)), (BLOCK_N, GROUP_SIZE // 4))


@triton.jit
def unpack_codes(
    packed_ptr, rows, row_mask, k0, KP, BITS: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_SIZE: tl.constexpr
):
    """The codes of columns k0 .. k0 + GROUP_SIZE of weight `rows`, in column order: int32 [BLOCK_N,
    GROUP_SIZE] (4 / 6-bit: unsigned; 8-bit: signed). packed_ptr: the rows as engine/quant/groupwise.py
    packs them (4-bit: bytes, the even column in the low nibble; 6-bit: read as int32, see six_bit_words;
    8-bit: int8), KP columns a row."""
    if BITS == 4:  # bytes, even column in the low nibble: (low, high) joined is the column order
        j = tl.arange(0, GROUP_SIZE // 2)
        byte = tl.load(
            packed_ptr + rows[:, None] * (KP // 2) + (k0 // 2 + j)[None, :], mask=row_mask[:, None], other=0
        ).to(tl.int32)
        return tl.reshape(tl.join(byte & 15, byte >> 4), (BLOCK_N, GROUP_SIZE))
    elif BITS == 6:  # word j holds columns 4j + p: joined as [j, p1, p0], p = 2 p1 + p0
        word = six_bit_words(packed_ptr, rows, row_mask, k0, KP, BLOCK_N, GROUP_SIZE)
        low = tl.join(word & 63, (word >> 12) & 63)
        high = tl.join((word >> 6) & 63, (word >> 18) & 63)
        return tl.reshape(tl.join(low, high), (BLOCK_N, GROUP_SIZE))
    else:
        kk = k0 + tl.arange(0, GROUP_SIZE)
        return tl.load(packed_ptr + rows[:, None] * KP + kk[None, :], mask=row_mask[:, None], other=0).to(
            tl.int32
        )


# FP4 (kernels/fp4_matmul, kernels/fused_moe): a code's sign moved to bit 15 and its magnitude bits (exponent
# e1 e0, mantissa m) to bits 11-9 are the fp16 number e2m1(code) x 2^-14 exactly (exponent 0 is fp16's
# subnormal range, where e2m1's 0.5 lands as 0.5 x 2^-14); an e4m3 scale's bits 6-0 moved to fp16 bits 13-7
# are e4m3 x 2^-8 (subnormals too); an e8m0 exponent s in fp32's exponent field is 2^(s - 127) (s = 0: 0).
# fp16 -> fp32 is exact; the powers of two are paid once a row (fp4_row_scales).
E2M1_UNIT = tl.constexpr(2.0**14)  # the fp16 bits of a code read as e2m1 x 2^-14
E4M3_UNIT = tl.constexpr(2.0**8)  # an e4m3 scale's as e4m3 x 2^-8
E2M1_MAGNITUDES = tl.constexpr(0x0E000E00)  # bits 9-11 of each half
E2M1_SIGNS = tl.constexpr(-0x7FFF8000)  # 0x80008000 as an int32: bit 15 of each half


@triton.jit
def e2m1_codes(c):
    """int32 codes 0..15 -> fp32 e2m1(code) x 2^-14."""
    bits = ((c & 8) << 12) | ((c & 7) << 9)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def e2m1_pairs(word, MAG: tl.constexpr, SIGN: tl.constexpr):
    """Codes j and j + 4 of each int32 word (eight codes, code i at bits 4i) as fp32 e2m1 x 2^-14, by way of
    one fp16 pair: the magnitude bits shifted by MAG to bits 9-11 and 25-27 (right where negative: the sign
    bits the shift brings in are masked off), the sign bits by SIGN to 15 and 31."""
    m = word << MAG if MAG >= 0 else word >> -MAG
    h = (m & E2M1_MAGNITUDES) | ((word << SIGN) & E2M1_SIGNS)
    lo = (h & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (h >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def fp4_scales(s, E8M0: tl.constexpr):
    """int32 scale codes -> fp32: 2^(s - 127) (e8m0; s = 0: 0) or e4m3(s) x 2^-8."""
    if E8M0:
        return (s << 23).to(tl.float32, bitcast=True)
    bits = ((s & 0x80) << 8) | ((s & 0x7F) << 7)
    return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def fp4_row_scales(mult_ptr, rows, E8M0: tl.constexpr):
    """Each row's fp32 multiplier (at mult_ptr + rows) times the powers of two its codes and scales are read
    with: 2^14, and 2^8 more for e4m3 scales."""
    unit = E2M1_UNIT if E8M0 else E2M1_UNIT * E4M3_UNIT
    return tl.load(mult_ptr + rows) * unit
