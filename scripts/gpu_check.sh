#!/usr/bin/env bash
# The GPU check: on a CUDA machine, the kernel tests and the parity tests on the GPU, then the kernel
# microbenchmark table. Everything lands under $OUT (default ./gpu_out). Runs from a source tree with the
# machine's own torch / triton: PYTHONPATH=. is set here; pure-Python wheels it lacks (gguf) may be
# installed beforehand into a folder on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 - <<'PY' 2>&1 | tee "$OUT/device.txt"
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)
print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
PY
status=0
python3 -m pytest -q -p no:cacheprovider tests/kernels tests/engine/test_gpu_parity.py \
  -k "not test_dispatch" 2>&1 | tee "$OUT/pytest.txt" || status=1
python3 benchmarks/gpu_kernels.py --json "$OUT/kernels.json" --markdown "$OUT/kernels.md" 2>&1 \
  | tee "$OUT/bench.txt" || status=1
echo "gpu_check exit status: $status" | tee -a "$OUT/device.txt"
exit $status
