#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mem_registry.sh - what is planted in the node's cache registry cannot
# stop a consumer nor write to its terminal. On a stand-in system with
# 4 GiB available (HS_SYSTEM_ROOT), a live claim of 2^64-1 bytes whose text
# carries escape codes is skipped and counted, and a consumer of 0.25 GiB
# starts; a live claim of 3.88 GiB is counted, and the consumer refuses
# (exit 2) naming it with the escape codes made printable. No byte of the
# consumer's output is an escape code.
. "$(dirname "$0")/lib.sh"

fake=$SCRATCH/sys
mkdir -p "$fake/proc"
printf 'MemTotal: %d kB\nMemAvailable: %d kB\n' $((16 << 20)) $((4 << 20)) >"$fake/proc/meminfo"
registry=$fake/dev/shm/hsflow-cache-$(id -u)
mkdir -p -m 700 "$registry"

# holder BYTES WHO: a claim of this process's, held locked as a live
# consumer's is, until it is killed.
cat >"$SCRATCH/holder.py" <<'PY'
import fcntl, os, sys, time
path = os.path.join(sys.argv[1], "%d.0.claim" % os.getpid())
f = open(path, "w")
f.write("pid %d\nbytes %s\nwho %s\n" % (os.getpid(), sys.argv[2], sys.argv[3]))
f.flush()
fcntl.flock(f, fcntl.LOCK_EX)
print("holding", path, flush=True)
time.sleep(300)
PY
start forged python3 "$SCRATCH/holder.py" "$registry" 18446744073709551615 $'\e[31mall of it\e[0m'
wait_log forged holding 30
start c1 env HS_SYSTEM_ROOT="$fake" "$CONSUMER" --listen 127.0.0.1:0 --cache-gb 0.25 --epochs 1
wait_log c1 "listening on" 30
log_has c1 "skipped 1 entry that is no claim of this user's consumers"
kill -TERM "$(pid_of c1)"
wait_exit c1 30

start fair python3 "$SCRATCH/holder.py" "$registry" $((31 << 27)) $'\e[2Jrank 7\a'
wait_log fair holding 30
start c2 env HS_SYSTEM_ROOT="$fake" "$CONSUMER" --listen 127.0.0.1:0 --cache-gb 0.25 --epochs 1
expect_exit c2 2 30
log_has c2 "1 other consumer on this node will still take \(\?\[2Jrank 7\? \(pid [0-9]+\) claimed 3\.88 GiB"
for name in c1 c2; do
    if grep -q $'\e' "$SCRATCH/$name.log"; then fail "$name printed an escape code"; fi
done
pass "a forged claim skipped, a fair one counted, both printed as plain text"
