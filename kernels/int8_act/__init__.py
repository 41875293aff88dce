"""Activations quantized to int8 per token and per group of input columns, for the int8 prefill matmul
(kernels/int8_matmul): a scale and a code sum per (row, group)."""

QMAX = 127  # codes in [-QMAX, QMAX]: symmetric, so -x quantizes to -q
