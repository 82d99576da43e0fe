#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# version.sh - every binary answers --version (the release of
# include/hsflow.h, the git checkout, the build options) with exit 0 and
# lists it in --help; HS_VERSION in the environment does not turn a run into
# --version; both sides name their version at start.
. "$(dirname "$0")/lib.sh"

want=$(sed -n 's/^#define HSFLOW_VERSION_STRING "\([0-9.]*\)"$/\1/p' \
    "$(dirname "$0")/../../include/hsflow.h")
[ -n "$want" ] || fail "no HSFLOW_VERSION_STRING in include/hsflow.h"
for b in hs-consumer hs-producer hs-data hs-forward; do
    out=$("$HS_BIN/$b" --version) || fail "$b --version exited $?"
    echo "$out" | head -n 1 | grep -Eq "^$b $want( \(git [^)]+\))?\$" ||
        fail "$b --version printed '$out', expected '$b $want ...'"
    echo "$out" | grep -Eq '^build: CUDA (on|off).*, UCX .*, cuBLASLt .*, cuDNN ' ||
        fail "$b --version does not list the build options: '$out'"
    "$HS_BIN/$b" --help 2>&1 | grep -q -- '--version' || fail "$b --help does not list --version"
done
# After other flags too, and not from the environment.
"$CONSUMER" --epochs 2 --version | grep -q "^hs-consumer $want" || fail "--version after a flag"
start envv env HS_VERSION=1 "$CONSUMER" --listen 127.0.0.1:bad
expect_exit envv 2 30

data=$SCRATCH/d.jsonl
synth "$data" --sequences 20 --min-len 16 --max-len 200 --seed 3
start run "$CONSUMER" --loopback 1 --transport tcp --cache-gb 0.0625 -- --transport tcp \
    --data "$data" --token-budget 1024 --hidden-size 32 --layers 1 --source synthetic
expect_exit run 0 60
log_has run "consumer INFO\] hsflow $want .*listening on"
log_has run "producer .*INFO\] hsflow $want .*connected to 127\.0\.0\.1"
pass
