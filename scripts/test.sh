#!/usr/bin/env bash
# Builds with warnings as errors and runs every test. GPU tests skip visibly without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
echo "== clang-format check"
git ls-files '*.h' '*.cpp' '*.cuh' | xargs clang-format --dry-run -Werror
echo "== documentation references"
python3 scripts/check_doc_links.py
echo "== layers"; python3 scripts/check_layers.py
# ccache (when present) lets scripts/test_packaging.sh build the shared library from these objects.
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B build-test -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXJIT_WERROR=ON "${launcher[@]}" \
  -DFLEXJIT_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" >/dev/null
ninja -C build-test
# A private cache directory: tests never touch the user's cache.
export FLEXJIT_CACHE_DIR="$(mktemp -d)"
trap 'rm -rf "$FLEXJIT_CACHE_DIR"' EXIT
build-test/flexjit-tests --order rand "$@"
# The installed package and the examples/ project against it (static, shared, add_subdirectory).
bash scripts/test_packaging.sh build-test
# The Python package (CPU backend with NumPy; GPU and PyTorch tests skip visibly without them).
PYTHONPATH="$PWD/build-test/python" python3 -m pytest -q -rs tests/python
# ASan + UBSan build of the GPU-free tests, and the .fx parser fuzz target (docs/fuzzing.md).
[ "${SKIP_SANITIZE:-0}" = 1 ] || bash scripts/sanitize.sh
