#!/usr/bin/env bash
# Builds the Python module for another CPython than python3 (e.g. the GPU machine's 3.12) and
# stages the package in .carry/py<version>/flexjit, for scripts/gpu_check_python.sh there.
#   scripts/build_python_for.sh 3.12            # interpreter: python3.12 on PATH, or pyenv's
#   PYTHON=/path/to/python3.12 scripts/build_python_for.sh 3.12
# On Python >= 3.12 the module is built for the stable ABI (abi3), so any later 3.x loads it.
set -euo pipefail
cd "$(dirname "$0")/.."
ver="${1:?usage: scripts/build_python_for.sh MAJOR.MINOR}"
py="${PYTHON:-}"
if [ -z "$py" ]; then
  py=$(command -v "python$ver" || true)
  # A pyenv shim is on PATH for every version pyenv knows, installed globally or not.
  if [ -n "$py" ] && ! "$py" --version >/dev/null 2>&1; then py=""; fi
  if [ -z "$py" ] && command -v pyenv >/dev/null; then
    root=$(pyenv root)
    py=$(ls -d "$root"/versions/"$ver".*/bin/python3 2>/dev/null | sort -V | tail -n 1 || true)
  fi
fi
if [ -z "$py" ] || [ ! -x "$py" ]; then
  echo "build_python_for.sh: no Python $ver found (set PYTHON)" >&2
  exit 1
fi
"$py" -c "import nanobind" 2>/dev/null || "$py" -m pip install -q nanobind
export PATH="/usr/local/cuda/bin:$PATH"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "build-py$ver" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DFLEXJIT_BUILD_PYTHON=ON -DFLEXJIT_BUILD_TESTS=OFF -DFLEXJIT_BUILD_CLI=OFF \
  -DPython_EXECUTABLE="$py" >/dev/null
ninja -C "build-py$ver" _flexjit flexjit-python-files _flexjit_stub
rm -rf ".carry/py$ver"
mkdir -p ".carry/py$ver"
cp -r "build-py$ver/python/flexjit" ".carry/py$ver/"
echo "staged .carry/py$ver/flexjit ($(du -sh ".carry/py$ver" | cut -f1)) for $("$py" --version)"
