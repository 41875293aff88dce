"""Group-wise quantized matmul (naive.py, triton.py; dequant.py: long prefill chunks through cuBLAS).

MIN_GROUP: the smallest group each width's fused kernel takes (every tl.dot needs K >= 16: a 4-bit product
spans half a group, a 6-bit one a quarter); the loader dequantizes narrower groups.
DEQUANT_MIN_M: from this many rows of x on, the Triton path dequantizes the weight into a scratch buffer a
slice at a time and multiplies with cuBLAS (dequant.py) instead of the fused GEMM.
DEQUANT_SCRATCH_BYTES: that buffer, one per device and dtype (a row of the memory ledger).
GEMV_MAX_M: up to this many rows of x, the split-K GEMV (decode and draft verification shapes)."""

MIN_GROUP = {4: 32, 6: 64, 8: 16}
# an H200 (2026-12-04, 4-bit, 17408 x 5120): the dequantized slices took 143 us at M = 64 where the fused
# GEMM took 207, 289 / 346 at 128, 371 / 621 at 256 (docs/benchmarks.md); 256 was an estimate
DEQUANT_MIN_M = 64
DEQUANT_SCRATCH_BYTES = 64 << 20

# rows of x the split-K GEMV takes: its programs hold 16 rows (the smallest tensor-core tile) whatever M
# is, so M = 16 costs it what M = 1 does (186 / 192 instructions per KB of 4-bit weight on SM 9.0), where
# the GEMM at M = 16 issues ~440 per KB (half an H200's bandwidth at most) with all of K in each program
GEMV_MAX_M = 16
