#!/usr/bin/env bash
# Installs the Debian packages flexjit builds with, if any is missing. Used by setup.sh and
# test.sh; safe to run again. The CUDA toolkit (NVRTC) is expected at /usr/local/cuda.
set -euo pipefail
pkgs=(cmake ninja-build g++ clang clang-format libfmt-dev libcli11-dev catch2 llvm-16-dev
      nlohmann-json3-dev libxxhash-dev libdlpack-dev libssl-dev)
# scripts/sanitize.sh: clang's ASan/UBSan/libFuzzer runtimes; the tests use setpriv (util-linux).
pkgs+=(libclang-rt-14-dev util-linux git)
pkgs+=(ccache)  # scripts/test_packaging.sh rebuilds the library shared from ccache's objects
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "flexjit: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ ! -e /usr/local/cuda/include/nvrtc.h ] && ! command -v nvcc >/dev/null; then
  echo "flexjit: the CUDA toolkit (NVRTC) was not found at /usr/local/cuda" >&2
  exit 1
fi

# Python build and test dependencies (python/, tests/python), from PyPI into python3's
# environment: nanobind and scikit-build-core build the module, NumPy and pytest test it.
py_missing=()
for m in nanobind:nanobind scikit_build_core:scikit-build-core numpy:numpy pytest:pytest; do
  python3 -c "import ${m%%:*}" 2>/dev/null || py_missing+=("${m#*:}")
done
py_has() { python3 -c "import sysconfig, os, sys; sys.exit(0 if $1 else 1)" 2>/dev/null; }
if ! python3 -m pip --version >/dev/null 2>&1 || ! py_has "os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))"; then
  echo "flexjit: installing python3-pip python3-dev"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-pip python3-dev
fi
if [ ${#py_missing[@]} -gt 0 ]; then
  echo "flexjit: pip installing ${py_missing[*]}"
  pip_flags=(--quiet --disable-pip-version-check)
  # Debian's own python3 is externally managed (PEP 668).
  py_has "os.path.exists(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED'))" &&
    pip_flags+=(--break-system-packages)
  python3 -m pip install "${pip_flags[@]}" "${py_missing[@]}"
fi
