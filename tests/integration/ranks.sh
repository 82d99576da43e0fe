#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ranks.sh - data-parallel consumer ranks fed by producers that connect to
# every rank (DESIGN §11). Each case runs 4 ranks x 3 producers x 2 epochs of
# synthetic, verified batches; each rank's journal is the exact list of what
# it delivered, so the checks are on what the trainers got:
#   drop     every kept batch exactly once across the ranks, the same count
#            per rank per epoch, the n % 4 tail of each epoch skipped
#   repeat   every batch at least once, the short ranks' extra batches
#            taken again, the same count per rank per epoch
#   faults   a producer SIGKILLed mid-epoch (its leases on every rank come
#            back) and a rank SIGKILLed and restarted with its journal
#            (it resumes its own shard; the producers reconnect)
#   mismatch producers refuse ranks of differing world sizes, and two rank 0s
#   collision  2 ranks plus a second rank 0 with producers of its own: the
#            shared rank 1 tells through the producers, and the later rank 0
#            stops naming both; the first rank 0 and rank 1 complete
#   late     2 ranks, the second started after the first has delivered: the
#            producers feed rank 0 while they keep trying rank 1 (no ticket
#            of rank 0 waits for a rank that is not up), then rank 1
#   store    chaos over fp8 states and a --store per rank: 2 ranks, one
#            producer frozen and then SIGKILLed holding leases, another
#            frozen and thawed; every kept batch exactly once per rank per
#            epoch, and both stores verify offline (hsflow-data store verify)
. "$(dirname "$0")/lib.sh"
mode=${1:-drop}
W=4
[ "$mode" != late ] && [ "$mode" != collision ] && [ "$mode" != store ] || W=2

data=$SCRATCH/d.jsonl
# faults: a longer run (14 batches per rank per epoch), so both kills land mid-run
seqs=150
[ "$mode" != faults ] && [ "$mode" != store ] || seqs=300
synth "$data" --sequences $seqs --min-len 16 --max-len 1500 --seed 5
n=$(plan_batches "$data" 4096)
[ "$mode" = late ] || [ "$mode" = collision ] || [ "$mode" = store ] || [ $((n % W)) -ne 0 ] ||
    fail "the test wants a plan that does not divide by $W ranks; got $n"

popts=(--data "$data" --token-budget 4096 --hidden-size 64 --layers 2,16 --source synthetic
    --gpus cpu:1 --prefetch 2 --connect-timeout 60)
# An optional second argument names the transport of every process (faults:
# the stopped producer must still hold leases when it is killed, which the
# faster transports on one host, shared memory and TCP, can leave it without:
# CMake gives UCX where it is built, as auto did before it picked per link).
tp=()
[ -z "${2:-}" ] || tp=(--transport "$2")
popts+=("${tp[@]}")

# start_rank R UNEVEN [consumer options]: rank R of W on port PORT[R].
start_rank() {
    local r=$1 uneven=$2
    shift 2
    start "rank$r" "$CONSUMER" --rank "$r" --world $W --uneven "$uneven" \
        --listen "127.0.0.1:${PORT[$r]}" --cache-gb 0.05 --epochs 2 --verify-synthetic \
        --journal "$SCRATCH/rank$r.journal" --status-interval 0.1 \
        --summary-json "$SCRATCH/rank$r.json" "${tp[@]}" "$@"
}

# check_shards UNEVEN: the journals against the rules of the --uneven mode.
check_shards() {
    python3 - "$SCRATCH" "$n" $W "$1" <<'PY' || fail "the ranks' shards are wrong (see above)"
import collections, math, sys
scratch, n, w, uneven = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
m = n // w if uneven == "drop" else math.ceil(n / w)
union = collections.Counter()
for r in range(w):
    lines = open("%s/rank%d.journal" % (scratch, r)).read().splitlines()
    assert lines[0].endswith(" rank=%d world=%d uneven=%s" % (r, w, uneven)), lines[0]
    pairs = [tuple(map(int, l.split())) for l in lines[1:]]
    assert len(pairs) == len(set(pairs)), "rank %d delivered a batch twice" % r
    for e in range(2):
        got = sum(1 for pe, _ in pairs if pe == e)
        assert got == m, "rank %d epoch %d: %d batches, every rank must get %d" % (r, e, got, m)
    union.update(pairs)
for e in range(2):
    per = {b: union[(e, b)] for b in range(n)}
    if uneven == "drop":
        assert all(c <= 1 for c in per.values()), "epoch %d: a batch went to two ranks" % e
        assert sum(per.values()) == w * m and n - w * m == list(per.values()).count(0)
    else:
        assert all(c >= 1 for c in per.values()), "epoch %d: a batch went to no rank" % e
        assert sum(per.values()) == w * m, "epoch %d: %d deliveries" % (e, sum(per.values()))
print("shards: %d batches/epoch, %d per rank, %s" % (n, m, uneven))
PY
}

declare -a PORT
for r in $(seq 0 $((W - 1))); do
    reserve_port p
    PORT[$r]=$p
done
to=$(for r in $(seq 0 $((W - 1))); do printf '127.0.0.1:%s,' "${PORT[$r]}"; done)
to=${to%,}

case $mode in
drop | repeat)
    for p in 1 2 3; do start "p$p" "$PRODUCER" --to "$to" "${popts[@]}" --name "p$p"; done
    wait_connecting p1 p2 p3
    # Each rank's run lasts seconds (a cache of a few batches, a trainer of
    # 150 ms a batch): every producer reaches every rank before that rank
    # has all its batches, however slowly the ranks start on a loaded box.
    for r in $(seq 0 $((W - 1))); do start_rank "$r" "$mode" --train-ms 150 --cache-gb 0.004; done
    for r in $(seq 0 $((W - 1))); do expect_exit "rank$r" 0 90; done
    for p in 1 2 3; do expect_exit "p$p" 0 30; done
    for r in $(seq 0 $((W - 1))); do
        log_has "rank$r" "rank $r of $W: [0-9]+ batches per epoch \($mode"
        expect_json "$SCRATCH/rank$r.json" 'd["complete"] is True' 'd["duplicates"] == 0' \
            'd["checksum_failures"] == 0' 'd["producers_seen"] == 3'
    done
    check_shards "$mode"
    pass "$W ranks x 3 producers x 2 epochs, --uneven $mode"
    ;;
faults)
    # --train-ms and a cache of a few batches stretch the run (producers
    # included) over seconds, so the kills land mid-run; --reconnect lets the
    # producers join the restarted rank. p1 joins alone and is frozen
    # (SIGSTOP) once every rank has given it tickets. What it had already
    # sent still lands, so the ranks then deliver a few batches with p2 and
    # p3 in: the ranks' fair share gives the frozen p1 tickets again (p2 and
    # p3 each hold about a share of the small caches), which it never
    # completes, and SIGKILL ends it holding leases.
    for r in $(seq 0 $((W - 1))); do
        start_rank "$r" drop --train-ms 150 --cache-gb 0.004 --lease-timeout 20
    done
    start p1 "$PRODUCER" --to "$to" "${popts[@]}" --name p1 --reconnect
    for r in $(seq 0 $((W - 1))); do wait_log "rank$r" "producer p1 .* ready" 60; done
    kill -STOP "$(pid_of p1)"
    for p in 2 3; do
        start "p$p" "$PRODUCER" --to "$to" "${popts[@]}" --name "p$p" --reconnect
    done
    for r in $(seq 0 $((W - 1))); do
        for p in 2 3; do wait_log "rank$r" "producer p$p .* ready" 60; done
    done
    sum0=$(($(delivered rank0) + $(delivered rank1) + $(delivered rank3)))
    deadline=$(($(date +%s) + 60))
    until [ $(($(delivered rank0) + $(delivered rank1) + $(delivered rank3))) -ge $((sum0 + 6)) ]; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "ranks 0, 1 and 3 delivered under 6 batches in 60 s"
        sleep 0.05
    done
    kill -KILL "$(pid_of p1)"
    wait_exit p1 10
    [ "${RC_OF[p1]}" -eq 137 ] || fail "p1 ended with ${RC_OF[p1]}, not by SIGKILL"

    wait_delivered rank2 3 60
    kill -KILL "$(pid_of rank2)"
    wait_exit rank2 10
    before=$(($(wc -l <"$SCRATCH/rank2.journal") - 1))
    [ "$before" -lt $((2 * (n / W))) ] || fail "rank 2 had finished before it was killed"
    mv "$SCRATCH/rank2.log" "$SCRATCH/rank2-first.log"
    start_rank 2 drop --train-ms 150 --cache-gb 0.004 --lease-timeout 20
    wait_log rank2 "resuming from the journal" 60
    for r in $(seq 0 $((W - 1))); do expect_exit "rank$r" 0 120; done
    for p in 2 3; do expect_exit "p$p" 0 60; done
    returned=0
    for r in 0 1 3; do
        log_has "rank$r" 'producer p1 .* (gone|disconnected)'
        returned=$((returned + $(json_get "$SCRATCH/rank$r.json" leases_returned)))
        expect_json "$SCRATCH/rank$r.json" 'd["complete"] is True' 'd["duplicates"] == 0' \
            'd["checksum_failures"] == 0'
    done
    # p1 usually holds tickets of the ranks when it dies, and they come back.
    # UCX's endpoint timeout can drop the stopped p1 first, within a second
    # and holding none; either way it is gone from every rank (checked above)
    # and each batch is delivered once (below).
    [ "$returned" -ge 1 ] || echo "note: p1 held no tickets when the ranks dropped it"
    expect_json "$SCRATCH/rank2.json" 'd["complete"] is True' "d['batches_resumed'] == $before"
    check_shards drop
    pass "a producer and a rank SIGKILLed; rank 2 resumed after $before batch(es)"
    ;;
late)
    # Before, a producer connected its consumers one by one and started its
    # workers only then: rank 0's tickets waited, unworked, for rank 1 (up
    # to --connect-timeout, past the lease on a loaded machine). Rank 0's
    # trainer is slow (as a DDP rank's is, held by its peer), so it is still
    # running when rank 1 comes.
    start_rank 0 drop --train-ms 300
    for p in 1 2; do start "p$p" "$PRODUCER" --to "$to" "${popts[@]}" --name "p$p"; done
    wait_delivered rank0 3 30
    for p in 1 2; do log_has "p$p" "consumer 127.0.0.1:${PORT[1]} is not reachable yet"; done
    for p in 1 2; do running "p$p" || fail "p$p ended before rank 1 came up"; done
    # rank 1's run lasts seconds too (a small cache, a slow trainer), so
    # both producers reach it before it has every batch, whatever the load
    start_rank 1 drop --train-ms 300 --cache-gb 0.004
    for r in 0 1; do expect_exit "rank$r" 0 90; done
    for p in 1 2; do
        expect_exit "p$p" 0 30
        log_has "p$p" "connected to 127.0.0.1:${PORT[1]} over"
    done
    for r in 0 1; do
        expect_json "$SCRATCH/rank$r.json" 'd["complete"] is True' 'd["duplicates"] == 0' \
            'd["leases_returned"] == 0' 'd["producers_seen"] == 2'
    done
    check_shards drop
    pass "rank 0 fed while rank 1 was not up; rank 1 fed when it came"
    ;;
store)
    # fp8 rows into each rank's own store. p1 is frozen once both ranks
    # have given it tickets, p2 and p3 then carry the run; p3 is frozen for
    # 3 s (short of the lease) and thawed, and p1 is killed holding leases.
    # The second epoch is served from each rank's store where it holds the
    # batch, by the producers otherwise.
    popts+=(--hs-dtype fp8)
    for r in 0 1; do
        start_rank "$r" drop --train-ms 150 --cache-gb 0.004 --lease-timeout 20 \
            --store "$SCRATCH/store$r"
    done
    start p1 "$PRODUCER" --to "$to" "${popts[@]}" --name p1
    for r in 0 1; do wait_log "rank$r" "producer p1 .* ready" 60; done
    kill -STOP "$(pid_of p1)"
    for p in 2 3; do start "p$p" "$PRODUCER" --to "$to" "${popts[@]}" --name "p$p"; done
    for r in 0 1; do
        for p in 2 3; do wait_log "rank$r" "producer p$p .* ready" 60; done
    done
    wait_delivered rank0 3 60
    kill -STOP "$(pid_of p3)"
    sleep 3
    kill -CONT "$(pid_of p3)"
    kill -KILL "$(pid_of p1)"
    wait_exit p1 10
    [ "${RC_OF[p1]}" -eq 137 ] || fail "p1 ended with ${RC_OF[p1]}, not by SIGKILL"
    for r in 0 1; do expect_exit "rank$r" 0 120; done
    for p in 2 3; do expect_exit "p$p" 0 60; done
    for r in 0 1; do
        log_has "rank$r" 'dtype=fp8'
        expect_json "$SCRATCH/rank$r.json" 'd["complete"] is True' 'd["duplicates"] == 0' \
            'd["checksum_failures"] == 0' 'd["store_bad"] == 0'
        hsflow_data store verify "$SCRATCH/store$r" >"$SCRATCH/verify$r.log" 2>&1 ||
            fail "rank $r's store does not verify: $(tail -n 3 "$SCRATCH/verify$r.log")"
        grep -Eq 'verified [1-9][0-9]* region\(s\): [0-9]+ good, 0 bad' "$SCRATCH/verify$r.log" ||
            fail "rank $r's store holds no verified region: $(cat "$SCRATCH/verify$r.log")"
    done
    check_shards drop
    pass "fp8 into a store per rank, p1 frozen then killed, p3 frozen and thawed: exactly once, both stores verify"
    ;;
collision)
    # a (rank 0) and c (rank 1) fed by p1; later b, a second rank 0, fed by
    # p2, which also feeds c. Nothing connects a and b but c: through c's
    # producers each learns of the other, and b, the later, stops.
    reserve_port pb
    start_rank 0 drop --train-ms 150 --cache-gb 0.004
    start_rank 1 drop --train-ms 150 --cache-gb 0.004
    start p1 "$PRODUCER" --to "127.0.0.1:${PORT[0]},127.0.0.1:${PORT[1]}" "${popts[@]}" --name p1
    wait_delivered rank0 2 60
    start b "$CONSUMER" --rank 0 --world $W --listen "127.0.0.1:$pb" --cache-gb 0.004 \
        --epochs 2 --train-ms 150 --summary-json "$SCRATCH/b.json"
    start p2 "$PRODUCER" --to "127.0.0.1:$pb,127.0.0.1:${PORT[1]}" "${popts[@]}" --name p2
    wait_exit b 60
    [ "${RC_OF[b]}" -ne 0 ] || fail "the second rank 0 ran to its end beside the first"
    expect_json "$SCRATCH/b.json" 'd["complete"] is False'
    log_has b "two consumers claim rank 0 of 2: this one, .* and .* started [0-9.]+ s earlier\), seen through producer p2 .*This one started later and stops"
    log_has rank0 "another consumer claims rank 0 of 2 too: .*seen through producer p1 .*; it started later and stops"
    log_has rank1 "producers report 2 consumers claiming rank 0 of 2"
    for r in 0 1; do expect_exit "rank$r" 0 90; done
    expect_exit p1 0 30
    wait_exit p2 30
    for r in 0 1; do
        expect_json "$SCRATCH/rank$r.json" 'd["complete"] is True' 'd["duplicates"] == 0'
    done
    check_shards drop
    pass "a second rank 0 with producers of its own stopped; rank 0 and rank 1 complete"
    ;;
mismatch)
    start a "$CONSUMER" --rank 0 --world 2 --listen "127.0.0.1:${PORT[0]}" --cache-gb 0.05
    start b "$CONSUMER" --rank 1 --world 3 --listen "127.0.0.1:${PORT[1]}" --cache-gb 0.05
    start p "$PRODUCER" --to "127.0.0.1:${PORT[0]},127.0.0.1:${PORT[1]}" "${popts[@]}"
    wait_exit p 60
    [ "${RC_OF[p]}" -ne 0 ] || fail "the producer accepted ranks of world sizes 2 and 3"
    log_has p 'differ in world size: .* rank 0 of 2, .* rank 1 of 3'
    # the two are named in --to order, whichever welcome arrives first
    start pr "$PRODUCER" --to "127.0.0.1:${PORT[1]},127.0.0.1:${PORT[0]}" "${popts[@]}"
    wait_exit pr 60
    [ "${RC_OF[pr]}" -ne 0 ] || fail "the producer accepted ranks of world sizes 3 and 2"
    log_has pr 'differ in world size: .* rank 1 of 3, .* rank 0 of 2'
    kill -9 "$(pid_of b)"
    wait_exit b 10
    start c "$CONSUMER" --rank 0 --world 2 --listen "127.0.0.1:${PORT[2]}" --cache-gb 0.05
    start p2 "$PRODUCER" --to "127.0.0.1:${PORT[0]},127.0.0.1:${PORT[2]}" "${popts[@]}"
    wait_exit p2 60
    [ "${RC_OF[p2]}" -ne 0 ] || fail "the producer accepted two rank 0s"
    log_has p2 'both rank 0 of 2'
    start bad "$CONSUMER" --rank 2 --world 2 --listen 127.0.0.1:0
    expect_exit bad 2 10
    log_has bad 'rank 2 is not below --world 2'
    pass "inconsistent rank sets refused"
    ;;
*) fail "unknown mode $mode" ;;
esac
