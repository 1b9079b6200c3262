#!/usr/bin/env bash
# Installs the Debian packages flexjit builds with, if any is missing. Used by setup.sh and
# test.sh; safe to run again. The CUDA toolkit (NVRTC) is expected at /usr/local/cuda.
set -euo pipefail
pkgs=(cmake ninja-build g++ clang clang-format libfmt-dev libcli11-dev catch2 llvm-16-dev
      nlohmann-json3-dev libxxhash-dev libdlpack-dev libssl-dev)
# scripts/sanitize.sh: clang's ASan/UBSan/libFuzzer runtimes; the tests use setpriv (util-linux).
pkgs+=(libclang-rt-14-dev util-linux git)
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
