#!/usr/bin/env bash
# The Python package on the GPU machine, in one device call: runs ON that machine from the
# repository root, with the module built for its Python (3.12) carried in .carry/py3.12/flexjit
# (scripts/build_python_for.sh 3.12 builds it here). Logs under $OUT.
#   1. tests/python (pytest): the CPU backend, the PyTorch custom op and its autograd on CPU
#      tensors, and on the GPU the forward against torch.nn.attention.flex_attention and the
#      backward against an fp64 torch reference, eager and under torch.compile;
#   2. scripts/py_overhead.py: the host cost of a call from Python on CUDA tensors.
# T_PYTEST (default 330) and T_OVERHEAD (default 120) limit the steps, in seconds.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-$(mktemp -d /tmp/gpu_py_out.XXXXXX)}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/${PY_DIR:-.carry/py3.12}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
FLEXJIT_CACHE_DIR="$(mktemp -d /tmp/flexjit-cache.XXXXXX)"
export FLEXJIT_CACHE_DIR
trap 'rm -rf "$FLEXJIT_CACHE_DIR"' EXIT
python3 -c 'import sys, torch, flexjit; print("python", sys.version.split()[0], "torch", torch.__version__, "flexjit", flexjit.__version__, torch.cuda.get_device_name())'
echo "== pytest tests/python"
timeout -k 5 "${T_PYTEST:-330}" python3 -m pytest -q -rs -s tests/python > "$OUT/pytest.log" 2>&1
echo "rc=$?"
grep -E "passed|failed|error|FAILED|SKIPPED|dq |seed" "$OUT/pytest.log" | tail -40
echo "== py_overhead"
timeout -k 5 "${T_OVERHEAD:-120}" python3 scripts/py_overhead.py 2>&1 | tee "$OUT/py_overhead.log"
