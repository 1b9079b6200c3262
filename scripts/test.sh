#!/usr/bin/env bash
# Builds with warnings as errors and runs every test. GPU tests skip visibly without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
echo "== clang-format check"
git ls-files '*.h' '*.cpp' '*.cuh' | xargs clang-format --dry-run -Werror
cmake -S . -B build-test -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXJIT_WERROR=ON >/dev/null
ninja -C build-test
# A private cache directory: tests never touch the user's cache.
export FLEXJIT_CACHE_DIR="$(mktemp -d)"
trap 'rm -rf "$FLEXJIT_CACHE_DIR"' EXIT
build-test/flexjit-tests --order rand "$@"
# ASan + UBSan build of the GPU-free tests, and the .fx parser fuzz target (docs/fuzzing.md).
[ "${SKIP_SANITIZE:-0}" = 1 ] || bash scripts/sanitize.sh
