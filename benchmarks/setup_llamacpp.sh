#!/usr/bin/env bash
# Builds llama-cpp-python (llama.cpp's CPU build) in its own venv, .venv-llamacpp, for
# benchmarks/cpu_throughput.py to run as a side-by-side baseline. Never a project dependency.
# Compiling takes about 6 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LLAMACPP_VENV:-.venv-llamacpp}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
CMAKE_ARGS="-DGGML_NATIVE=ON" "$VENV/bin/pip" install -q "llama-cpp-python==${LLAMACPP_VERSION:-0.3.36}"
"$VENV/bin/python" -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__)"
