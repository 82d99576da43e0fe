#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# exports.sh LIB HEADER - libhsflow.so exports exactly the functions of
# include/hsflow.h: every one of them (a trainer or the Python binding can
# call it), and nothing else (`nm -D --defined-only`): no module internal, no
# C++ runtime symbol, which a process loading another library with the same
# names would otherwise get mixed up with.
set -euo pipefail
lib=$1 header=$2
command -v nm >/dev/null || { echo "SKIP: nm is not installed (binutils)"; exit 77; }
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWwDdBbRrVvi]$/ {print $3}' | sed 's/@.*//' |
    sort -u)
declared=$(grep -oE '^HSFLOW_API [^(]*\b(hs|hsflow)_[a-z0-9_]+\(' "$header" |
    grep -oE '\b(hs|hsflow)_[a-z0-9_]+\($' | tr -d '(' | sort -u)
[ -n "$declared" ] || { echo "FAIL: no HSFLOW_API function found in $header"; exit 1; }
extra=$(comm -23 <(echo "$exported") <(echo "$declared"))
missing=$(comm -13 <(echo "$exported") <(echo "$declared"))
rc=0
if [ -n "$extra" ]; then
    echo "FAIL: $lib exports $(echo "$extra" | wc -l) symbol(s) that are not in $header:"
    echo "$extra" | head -20
    rc=1
fi
if [ -n "$missing" ]; then
    echo "FAIL: functions of $header that $lib does not export (add them to cmake/hsflow.map):"
    echo "$missing"
    rc=1
fi
bad=$(echo "$exported" | grep -Ev '^(hs|hsflow)_' || true)
[ -z "$bad" ] || { echo "FAIL: exports outside the hs_/hsflow_ names: $bad"; rc=1; }
[ $rc -ne 0 ] || echo "PASS: $lib exports the $(echo "$declared" | wc -l) functions of $header, no other"
exit $rc
