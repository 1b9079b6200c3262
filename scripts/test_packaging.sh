#!/usr/bin/env bash
# The packaging checks (docs/packaging.md), run by scripts/test.sh after the C++ tests:
#  1. `cmake --install` of the already-built tree (default build-test: static library + CLI)
#     into a temporary prefix; examples/ built against it with find_package and run.
#  2. The same with a shared library (build-shared: BUILD_SHARED_LIBS=ON, only the library;
#     its objects come from ccache when the first build used it), plus a check that it exports
#     only flexjit's public API.
#  3. the tests that run the CLI as another user, from a copy of the build in a directory that
#     only its owner can enter (as root: also as `nobody` from its own private directory).
#  4. add_subdirectory: a consumer project configures with flexjit inside it (configure only).
# SKIP_SHARED=1 skips 2, SKIP_PRIVATE=1 skips 3.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build-test}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

fail() { echo "test_packaging: FAILED: $*" >&2; exit 1; }

# example PREFIX NAME: builds examples/ against PREFIX and runs it.
example() {
  local prefix="$1" name="$2"
  cmake -S examples -B "$tmp/example-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" > "$tmp/example-$name.log" || { cat "$tmp/example-$name.log"; fail "configure ($name)"; }
  grep -E '^-- flexjit ' "$tmp/example-$name.log"
  ninja -C "$tmp/example-$name" > /dev/null
  # flexjit's headers must compile without its private dependencies' include paths.
  if ninja -C "$tmp/example-$name" -t commands custom_mod | grep custom_mod.cpp | grep -E -- '-I[^ ]*(llvm|cuda|openssl)' ; then
    fail "the example's compile line carries a private dependency's include path ($name)"
  fi
  "$tmp/example-$name/custom_mod" || fail "the example ($name)"
}

echo "== packaging: install $BUILD (static) into a temporary prefix, build examples/ against it"
cmake --install "$BUILD" --prefix "$tmp/static" > /dev/null
for f in include/flexjit/flexjit.h lib/libflexjit.a bin/flexjit lib/cmake/flexjit/flexjitConfig.cmake \
         lib/cmake/flexjit/flexjitConfigVersion.cmake lib/cmake/flexjit/flexjitTargets.cmake; do
  [ -e "$tmp/static/$f" ] || fail "cmake --install did not install $f"
done
"$tmp/static/bin/flexjit" mods list > /dev/null || fail "the installed CLI"
example "$tmp/static" static

if [ "${SKIP_SHARED:-0}" != 1 ]; then
  echo "== packaging: shared library (build-shared)"
  cmake -S . -B build-shared -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLEXJIT_WERROR=ON "${launcher[@]}" \
    -DBUILD_SHARED_LIBS=ON -DFLEXJIT_BUILD_TESTS=OFF -DFLEXJIT_BUILD_CLI=OFF -DFLEXJIT_BUILD_BENCH=OFF \
    > /dev/null
  ninja -C build-shared flexjit > /dev/null
  cmake --install build-shared --prefix "$tmp/shared" > /dev/null
  so="$(ls "$tmp"/shared/lib/libflexjit.so.*.*.* | head -n 1)"
  readelf -d "$so" | grep -q 'SONAME.*libflexjit.so.0.1' || fail "no SONAME libflexjit.so.0.1 in $so"
  exported="$(nm -D --defined-only "$so" | c++filt)"
  # Every exported symbol is flexjit's public API: in namespace flexjit, not in one of its
  # internal namespaces (nor LLVM's, fmt's, or std:: template instantiations).
  names="$(cut -d' ' -f3- <<< "$exported" | sed -E 's/^(typeinfo name for|typeinfo for|vtable for) //')"
  internal="$(grep -vE '^flexjit::' <<< "$names" | grep -vE '^_(init|fini)$' || true)
$(grep -E '^flexjit::(jit|cuda|ir|passes|codegen|cpu|runtime|embedded|tune|util)::' <<< "$names" || true)"
  internal="$(sed '/^$/d' <<< "$internal")"
  [ -z "$internal" ] || { head -n 20 <<< "$internal"; fail "libflexjit.so exports internals"; }
  grep -q 'flexjit::flex_attention_cpu' <<< "$exported" || fail "libflexjit.so does not export flex_attention_cpu"
  echo "libflexjit.so exports $(wc -l <<< "$names") symbols, all of namespace flexjit's public API"
  example "$tmp/shared" shared
  if readelf -d "$tmp/example-shared/custom_mod" | grep NEEDED | grep -E 'LLVM|nvrtc|crypto|xxhash'; then
    fail "the example links flexjit's private dependencies directly"
  fi
fi

# A checkout in a directory that only its owner can enter (`mktemp -d`, /root: issue 35): the
# tests that run the CLI as another user must not depend on where the build folder is. The test
# binary and the CLI are copied into such a directory and those tests run from there; as root,
# once more as `nobody` from a private directory of its own (a normal user's checkout).
if [ "${SKIP_PRIVATE:-0}" != 1 ] && [ -x "$BUILD/flexjit-tests" ] && [ -x "$BUILD/flexjit" ]; then
  echo "== packaging: the CLI tests from a directory only its owner can enter"
  private_tests='[cli][cache],[npy]'
  mkdir -m 0700 "$tmp/private"
  cp "$BUILD/flexjit-tests" "$BUILD/flexjit" "$tmp/private/"
  mkdir -m 0700 "$tmp/private/cache"
  (cd "$tmp/private" && FLEXJIT_CACHE_DIR="$tmp/private/cache" ./flexjit-tests "$private_tests") \
    || fail "the CLI tests from a private directory ($(id -un))"
  if [ "$(id -u)" = 0 ] && command -v setpriv > /dev/null; then
    user_dir="$(mktemp -d)"
    cp "$BUILD/flexjit-tests" "$BUILD/flexjit" "$user_dir/"
    mkdir "$user_dir/cache"
    chown -R 65534:65534 "$user_dir"
    chmod 0700 "$user_dir" "$user_dir/cache"
    (cd "$user_dir" && setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/nonexistent \
      FLEXJIT_CACHE_DIR="$user_dir/cache" ./flexjit-tests "$private_tests") \
      || { rm -rf "$user_dir"; fail "the CLI tests as nobody from a private directory"; }
    rm -rf "$user_dir"
  fi
fi

echo "== packaging: add_subdirectory(flexjit) configures, without tests or CLI"
mkdir -p "$tmp/consumer"
cat > "$tmp/consumer/CMakeLists.txt" << CM
cmake_minimum_required(VERSION 3.25)
project(consumer LANGUAGES CXX)
add_subdirectory("$PWD" flexjit)
add_executable(app "$PWD/examples/custom_mod.cpp")
target_link_libraries(app PRIVATE flexjit::flexjit)
CM
cmake -S "$tmp/consumer" -B "$tmp/consumer/build" -G Ninja > "$tmp/consumer.log" || { cat "$tmp/consumer.log"; fail "add_subdirectory"; }
targets="$(ninja -C "$tmp/consumer/build" -t targets all)"
grep -q '^app:' <<< "$targets" || fail "add_subdirectory: no app target"
grep -qE '^flexjit-tests:|^flexjit/flexjit-tests:' <<< "$targets" && fail "add_subdirectory builds the tests"
echo "packaging: OK"
