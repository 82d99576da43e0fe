#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# install.sh BUILD CMAKE CC PKG_CONFIG - installs BUILD into a temporary
# prefix and proves the install tree is usable on its own: the binaries
# answer --version from there, and tests/install/app.c builds and runs
# against it through pkg-config (libhsflow.so) and through
# find_package(hsflow) (hsflow::hsflow and hsflow::hsflow_static).
set -euo pipefail
build=$1 cmake=$2 cc=$3 pkgconfig=$4
here=$(cd "$(dirname "$0")" && pwd)
prefix=$(mktemp -d "${TMPDIR:-/tmp}/hs-install.XXXXXX")
trap 'rm -rf "$prefix"' EXIT
fail() { echo "FAIL [install]: $*" >&2; exit 1; }

"$cmake" --install "$build" --prefix "$prefix/usr" >"$prefix/install.log" ||
    fail "cmake --install failed: $(tail -n 5 "$prefix/install.log")"
for f in bin/hs-consumer bin/hs-producer bin/hs-data bin/hs-forward include/hsflow.h \
    lib/libhsflow.so lib/libhsflow.a lib/pkgconfig/hsflow.pc lib/cmake/hsflow/hsflowConfig.cmake \
    lib/cmake/hsflow/hsflowConfigVersion.cmake; do
    [ -e "$prefix/usr/$f" ] || fail "$f was not installed"
done
want=$(sed -n 's/^#define HSFLOW_VERSION_STRING "\([0-9.]*\)"$/\1/p' "$prefix/usr/include/hsflow.h")
"$prefix/usr/bin/hs-consumer" --version | grep -q "^hs-consumer $want" ||
    fail "the installed hs-consumer does not answer --version"

# Relocatable: the install tree is moved before use.
mv "$prefix/usr" "$prefix/moved"
root=$prefix/moved
expect_run() { # expect_run EXE: runs it and checks what it prints
    local out
    out=$("$@") || fail "$* failed"
    [[ $out == "hsflow $want cache "* ]] || fail "$* printed '$out'"
}

export PKG_CONFIG_PATH=$root/lib/pkgconfig
[ "$("$pkgconfig" --modversion hsflow)" = "$want" ] || fail "pkg-config --modversion hsflow"
# HS_APP_CFLAGS: what a sanitized build's programs need (set by CTest).
# shellcheck disable=SC2046,SC2086
"$cc" -std=c11 -Wall -Werror ${HS_APP_CFLAGS:-} "$here/app.c" -o "$prefix/app_pc" \
    $("$pkgconfig" --cflags --libs hsflow) ||
    fail "building against hsflow.pc failed"
LD_LIBRARY_PATH=$root/lib expect_run "$prefix/app_pc"
mkdir -p "$prefix/proj"
cat >"$prefix/proj/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(app C)
find_package(hsflow $want REQUIRED)
add_executable(app_shared $here/app.c)
target_link_libraries(app_shared PRIVATE hsflow::hsflow)
add_executable(app_static $here/app.c)
target_link_libraries(app_static PRIVATE hsflow::hsflow_static)
CMAKE
"$cmake" -S "$prefix/proj" -B "$prefix/proj/build" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_C_FLAGS="${HS_APP_CFLAGS:-}" \
    -DCMAKE_PREFIX_PATH="$root" >"$prefix/cmake.log" 2>&1 ||
    fail "find_package(hsflow) failed: $(tail -n 20 "$prefix/cmake.log")"
"$cmake" --build "$prefix/proj/build" >"$prefix/build.log" 2>&1 ||
    fail "building against hsflow::hsflow failed: $(tail -n 20 "$prefix/build.log")"
expect_run "$prefix/proj/build/app_shared"
expect_run "$prefix/proj/build/app_static"
echo "PASS [install]: $want installed to a prefix, built through pkg-config and find_package"
