"""FP4 weight matmul (naive.py, triton.py): an NVFP4 / MXFP4 checkpoint's matrices held as stored.

Layout (engine/formats/hf_fp4.py reads it from the checkpoint; nothing is rounded again):
* packed uint8 [N, K / 2]: e2m1 codes, column 2j in byte j's low nibble, 2j + 1 in its high one; a code's
  bit 3 is the sign, bits 0-2 index the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6;
* scale_codes uint8 [N, ceil(K / group_size)]: each group's scale, e4m3 bits (NVFP4, groups of 16) or an
  e8m0 exponent (MXFP4, groups of 32: 2^(s - 127); s = 0, 2^-127, is read as 0);
* multiplier fp32 [N]: the tensor's scale, per row (the shards of a fused projection keep their own).

w[n, k] = e2m1(code) x scale(group of k) x multiplier[n], in fp32.

GEMV_MAX_M: up to this many rows of x the weight streams through the split-K GEMVs (decode, draft
verification); then the tensor-core tile kernel by 16-row blocks, and from DEQUANT_MIN_M rows (prompt
chunks) the weight is dequantized a slice at a time into the scratch buffer cuBLAS multiplies
(kernels/quant_matmul/dequant.py's), as the integer formats' are from their DEQUANT_MIN_M.
STEP: weight columns a GEMV or dequantization step decodes (whole groups of 16 and 32)."""

GROUPS = {16: "e4m3", 32: "e8m0"}  # the group sizes the kernels take, and their scale codes
GEMV_MAX_M = 16
DEQUANT_MIN_M = 64
STEP = 128
