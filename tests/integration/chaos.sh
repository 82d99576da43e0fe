#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# chaos.sh - exactly once under repeated crashes: three --reconnect producers
# feed a --journal consumer for 3 epochs of verified synthetic data while
# producers are SIGKILLed and restarted one after another (20 times), and
# the consumer itself is SIGKILLed once, half-way through the kills, and
# restarted on the same port with the same journal.
#
# Proven at the end, from the restarted consumer's --summary-json and the
# journal both consumers wrote: the run is complete; every (epoch, batch) of
# the 3 epochs was released exactly once across the two consumers (0 lost,
# 0 duplicated); no batch failed its checksum or the element-by-element
# synthetic check.
#
# Each victim is first ready (never cut while it sends the plan), then
# frozen with SIGSTOP until the current consumer has delivered two more
# batches, so that it holds tickets when the SIGKILL comes; every wait has a
# deadline. A producer that ends on its own is restarted too, and counted.
# The run (3 x 119 batches, each held 150 ms by the consumer: about a minute)
# is several times longer than the kills take on an idle machine, so that
# they are all done long before it ends on a loaded one.
. "$(dirname "$0")/lib.sh"
transport=${1:-tcp} # tcp, shm or ucx
kills=${HS_CHAOS_KILLS:-20}
consumer_kill_at=$((kills / 2))

data=$SCRATCH/d.jsonl
synth "$data" --sequences 240 --min-len 16 --max-len 2000 --seed 21
per_epoch=$(plan_batches "$data" 2048)
total=$((3 * per_epoch))
journal=$SCRATCH/run.journal
reserve_port port
copts=(--listen 127.0.0.1:$port --transport "$transport" --cache-gb 0.25 --epochs 3
    --journal "$journal" --verify-synthetic --train-ms 150 --status-interval 0.1)
popts=(--to 127.0.0.1:$port --transport "$transport" --reconnect --connect-timeout 60
    --data "$data" --token-budget 2048 --hidden-size 256 --layers 2,16,29
    --source synthetic --gpus cpu:1 --prefetch 2)

declare -A NAME_OF=() # slot -> the name of its current incarnation
incarnation=0
self_exits=0
consumer=c1

# start_producer SLOT: a new incarnation of producer SLOT (p1..p3).
start_producer() {
    incarnation=$((incarnation + 1)) # global on purpose
    NAME_OF[$1]=$1-$incarnation
    start "$1" "$PRODUCER" "${popts[@]}" --name "${NAME_OF[$1]}"
}

# revive: restarts every producer that ended without being killed here;
# once the kills are over (finishing=1), one that ended with 0 was told the
# run is complete and stays ended.
finishing=0
revive() {
    local slot
    for slot in p1 p2 p3; do
        [ -n "${PID_OF[$slot]:-}" ] || continue
        running "$slot" && continue
        wait_exit "$slot" 5
        [ "$finishing" -eq 1 ] && [ "${RC_OF[$slot]}" -eq 0 ] && continue
        self_exits=$((self_exits + 1))
        echo "$(date +%T.%N | cut -c1-12) chaos: producer ${NAME_OF[$slot]} ended on its own" \
            "(exit ${RC_OF[$slot]}); restarting; its last lines:" >&2
        tail -n 4 "$SCRATCH/$slot.log" | sed 's/^/    /' >&2
        start_producer "$slot"
    done
}

# consumer_logs REGEX SECS: the current consumer logs a matching line;
# producers that end on their own meanwhile are restarted.
consumer_logs() {
    local deadline=$(($(date +%s) + $2))
    until grep -Eq -- "$1" "$SCRATCH/$consumer.log"; do
        running "$consumer" || fail "$consumer ended before logging /$1/"
        [ "$(date +%s)" -lt "$deadline" ] || fail "no line matching /$1/ in $consumer.log within $2 s"
        revive
        sleep 0.05
    done
}

# wait_ready SLOT SECS: the current incarnation of SLOT is ready with the
# current consumer (it may be restarted meanwhile).
wait_ready() {
    local deadline=$(($(date +%s) + $2))
    until grep -Eq "producer ${NAME_OF[$1]} .*ready" "$SCRATCH/$consumer.log"; do
        running "$consumer" || fail "$consumer ended before producer ${NAME_OF[$1]} was ready"
        [ "$(date +%s)" -lt "$deadline" ] || fail "producer ${NAME_OF[$1]} not ready within $2 s"
        revive
        sleep 0.05
    done
}

# progress N SECS: the current consumer delivers N more batches (producers
# that end on their own are restarted meanwhile).
progress() {
    local want=$(($(delivered "$consumer") + $1)) deadline=$(($(date +%s) + $2))
    until [ "$(delivered "$consumer")" -ge "$want" ]; do
        running "$consumer" || fail "$consumer ended before delivering $want batches"
        [ "$(date +%s)" -lt "$deadline" ] || fail "$consumer did not reach $want delivered batches within $2 s"
        revive
        sleep 0.05
    done
}

start c1 "$CONSUMER" "${copts[@]}"
for s in p1 p2 p3; do start_producer "$s"; done
for s in p1 p2 p3; do wait_ready "$s" 60; done
progress 3 60

for k in $(seq 1 "$kills"); do
    s=p$(((k - 1) % 3 + 1))
    wait_ready "$s" 60
    # Frozen first, the victim is granted tickets it never finishes; once
    # the others have moved the run on, it surely holds some when it dies.
    kill -STOP "$(pid_of "$s")" 2>/dev/null
    progress 2 60
    kill -KILL "$(pid_of "$s")" 2>/dev/null
    wait_exit "$s" 10
    [ "${RC_OF[$s]}" -eq 137 ] || self_exits=$((self_exits + 1))
    start_producer "$s"

    if [ "$k" -eq "$consumer_kill_at" ]; then
        kill -KILL "$(pid_of c1)"
        wait_exit c1 10
        [ "${RC_OF[c1]}" -eq 137 ] || fail "c1 ended with ${RC_OF[c1]} before its SIGKILL"
        released=$(($(wc -l <"$journal") - 1))
        [ "$released" -lt "$total" ] || fail "the run ended before the consumer was killed"
        consumer=c2
        start c2 "$CONSUMER" "${copts[@]}" --summary-json "$SCRATCH/s2.json"
        consumer_logs "resuming from the journal" 60
    fi
done
left=$((total - $(wc -l <"$journal") + 1))
[ "$left" -gt 0 ] || fail "the run ended before the $kills kills were done"

# No more kills: the run completes, and every producer is told so.
finishing=1
deadline=$(($(date +%s) + 180))
while running c2; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "c2 did not complete the run within 180 s of the last kill"
    revive
    sleep 0.1
done
expect_exit c2 0 5
# Every producer still there was told BYE and ends with 0; only one restarted
# too late to join (it gives up after --connect-timeout) may end otherwise.
for s in p1 p2 p3; do
    [ -n "${PID_OF[$s]:-}" ] || continue
    wait_exit "$s" 90
    if [ "${RC_OF[$s]}" -ne 0 ] && grep -q "welcomed by consumer" "$SCRATCH/$s.log"; then
        fail "producer ${NAME_OF[$s]} ended with ${RC_OF[$s]} after the run completed"
    fi
done
log_has c2 'producer p[123]-[0-9]+ .*gone: [1-9][0-9]* ticket\(s\) back to the front of the queue'

expect_json "$SCRATCH/s2.json" 'd["complete"] is True' \
    'd["duplicates"] == 0' 'd["checksum_failures"] == 0' \
    'd["batches_delivered"] == d["batches_planned"]' \
    "d['batches_planned'] + d['batches_resumed'] == $total" 'd["batches_resumed"] > 0' \
    'd["leases_returned"] >= 1'
python3 - "$journal" "$per_epoch" <<'PY' || fail "journal: some batch was lost or released twice"
import collections, sys
lines = open(sys.argv[1]).read().splitlines()
assert lines[0].startswith("hsflow-journal 1 plan="), lines[0]
n = int(sys.argv[2])
pairs = collections.Counter(tuple(map(int, l.split())) for l in lines[1:])
want = {(e, b) for e in range(3) for b in range(n)}
lost = sorted(want - set(pairs))
twice = sorted(p for p, c in pairs.items() if c > 1)
extra = sorted(set(pairs) - want)
assert not lost and not twice and not extra, "lost %s, twice %s, unknown %s" % (lost[:10], twice[:10], extra[:10])
PY
pass "$kills producer SIGKILLs and 1 consumer SIGKILL over $transport: $total/$total batches" \
    "exactly once ($(json_get "$SCRATCH/s2.json" batches_resumed) released before the consumer" \
    "restart), $(json_get "$SCRATCH/s2.json" leases_returned) lease(s) returned after it," \
    "$self_exits producer exit(s) on their own"
