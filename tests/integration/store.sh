#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# store.sh MODE - the consumer's --store (docs/store.md):
#   replay    one epoch online with --store (every batch verified, the store
#             complete), then two epochs from the store alone: no producer
#             at all, every batch read back and verified, none ticketed
#   killed    the consumer is killed (SIGKILL, a test hook) halfway through
#             writing a region; at restart the torn region is not in the
#             store, a torn index record and a flipped byte in a stored
#             region are found too, and those batches are computed again by
#             a producer, never delivered from the store
#   mismatch  a store of another dataset, of another layout and of another
#             dtype refuses the producer, naming what differs
#   enospc    the disk fills (a test hook fails the 3rd write with ENOSPC):
#             one warning, the store stops growing, the run completes
#   target    a store filled by a model producer names its target (the
#             fingerprint of config.json and the weights); replayed alone it
#             says which (log and --summary-json); --expect-target of another
#             target is refused at start, naming both; new weights copied
#             into the same folder give another fingerprint, and a producer
#             of them is refused by the store (naming both) when the store
#             lacks batches
#   shared    two ranks given the same --store: the second is refused at
#             start (exit 2) naming the folder and the first's pid, the
#             first completes and its store verifies; once it has ended the
#             folder is free again
. "$(dirname "$0")/lib.sh"
mode=${1:?usage: store.sh replay|killed|mismatch|enospc|target|shared [tcp|shm]}
tpk=${2:-tcp} # the transport of every process

data=$SCRATCH/d.jsonl
synth "$data" --sequences 200 --min-len 16 --max-len 2000 --seed 1
budget=4096
per_epoch=$(plan_batches "$data" $budget)
[ "${per_epoch:-0}" -gt 0 ] || fail "hs-data plan gave no batch count"
store=$SCRATCH/store
popts=(--data "$data" --token-budget $budget --hidden-size 256 --layers 2,16,29
    --source synthetic --gpus cpu:1 --transport "$tpk")
copts=(--cache-gb 0.25 --verify-synthetic --transport "$tpk" --status-interval 1)

# online NAME EPOCHS: a loopback run with the store. Its producer takes
# each ticket 150 ms late (its --fault hook), so batches come no faster than
# the writer stores them on any disk here and none is skipped (a writer
# behind the producers skips batches by design: a later epoch stores them).
online() {
    local name=$1 epochs=$2
    shift 2
    start "$name" "$CONSUMER" --loopback 1 "${copts[@]}" --epochs "$epochs" \
        --store "$store" --summary-json "$SCRATCH/$name.json" "$@" -- "${popts[@]}" \
        --fault delay_ms=150
}

# stored: batches the store holds, from its index as the consumer reads it
stored() {
    grep -Eo 'store [^ ]+: [0-9]+ of [0-9]+ batches stored' "$SCRATCH/$1.log" | tail -n 1 |
        awk '{print $3}'
}

# offline NAME EPOCHS: the store alone, no producer; must complete
offline() {
    local name=$1 epochs=$2
    start "$name" "$CONSUMER" --listen 127.0.0.1:0 "${copts[@]}" --epochs "$epochs" \
        --store "$store" --summary-json "$SCRATCH/$name.json"
    expect_exit "$name" 0 60
    log_has "$name" "run defined by the store $store"
    expect_json "$SCRATCH/$name.json" 'd["complete"] is True' \
        "d['batches_delivered'] == $epochs * $per_epoch" \
        "d['store_hits'] == $epochs * $per_epoch" 'd["store_misses"] == 0' \
        'd["producers_seen"] == 0' 'd["checksum_failures"] == 0' 'd["duplicates"] == 0' \
        'd["store_bad"] == 0'
}

case $mode in
replay)
    online first 1
    expect_exit first 0 90
    expect_json "$SCRATCH/first.json" 'd["complete"] is True' \
        "d['batches_delivered'] == $per_epoch" "d['store_misses'] == $per_epoch" \
        'd["store_hits"] == 0' 'd["checksum_failures"] == 0'
    log_has first "store .*, $per_epoch of $per_epoch stored, 0 skipped"
    offline second 2
    pass "replay: $per_epoch batches stored online, then $((2 * per_epoch)) from the store alone"
    ;;
killed)
    # the 5th region is half written when the consumer dies
    start first env HS_STORE_FAULT=kill=5 "$CONSUMER" --loopback 1 "${copts[@]}" --epochs 1 \
        --store "$store" -- "${popts[@]}" --fault delay_ms=150
    wait_exit first 60
    [ "${RC_OF[first]}" -eq 137 ] || fail "the consumer should have been killed, exit ${RC_OF[first]}"
    [ "$(stat -c %s "$store/index.hsi")" -eq $((4 * 64)) ] ||
        fail "index.hsi should hold the 4 records written before the kill, has $(stat -c %s "$store/index.hsi") bytes"
    # a torn index record (half of a 5th) and a flipped byte in the body of
    # the 2nd stored region
    head -c 32 /dev/urandom >>"$store/index.hsi"
    python3 - "$store" <<'PY' || fail "could not damage the store"
import struct, sys
d = sys.argv[1]
rec = open(d + "/index.hsi", "rb").read()[64:128]
_, batch, shard, _, _, _, off, nbytes = struct.unpack_from("<6I2Q", rec)
with open("%s/shard-%05u.hsd" % (d, shard), "r+b") as f:
    f.seek(off + nbytes - 1)
    b = f.read(1)
    f.seek(off + nbytes - 1)
    f.write(bytes([b[0] ^ 0x5A]))
print(batch)
PY
    online second 1
    expect_exit second 0 90
    log_has second 'its last record is cut short'
    log_has second "store .*: 4 of $per_epoch batches stored"
    # the damaged region fails its check when read back, is never delivered
    # and is computed again
    log_has second 'failed its check .* computed again'
    expect_json "$SCRATCH/second.json" 'd["complete"] is True' \
        "d['batches_delivered'] == $per_epoch" 'd["store_hits"] == 3' 'd["store_bad"] == 1' \
        "d['store_misses'] == $per_epoch - 3" 'd["checksum_failures"] == 0' 'd["duplicates"] == 0'
    [ "$(stored second)" = 4 ] || fail "the second run should start from 4 stored batches"
    offline third 2
    pass "killed: torn region, torn record and a flipped byte recomputed, then replayed"
    ;;
mismatch)
    online first 1
    expect_exit first 0 90
    # another dataset: same shape, other contents
    other=$SCRATCH/other.jsonl
    synth "$other" --sequences 200 --min-len 16 --max-len 2000 --seed 2
    fp=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["dataset_fingerprint"])' "$store/store.json")
    reserve_port port
    # the trainer holds each batch 2 s, so the run lasts while producers try
    start c2 "$CONSUMER" --listen 127.0.0.1:$port "${copts[@]}" --epochs 1 --store "$store" \
        --train-ms 2000
    wait_log c2 'run defined by the store' 30
    base=(--to 127.0.0.1:$port --token-budget $budget --source synthetic --gpus cpu:1
        --transport "$tpk" --connect-timeout 30)
    start q1 "$PRODUCER" "${base[@]}" --data "$other" --hidden-size 256 --layers 2,16,29 --name q1
    expect_exit q1 2 30
    log_has q1 "not the run of the store: dataset fingerprint [0-9a-f]{16}, the store holds $fp"
    start q2 "$PRODUCER" "${base[@]}" --data "$data" --hidden-size 256 --layers 2,16 --name q2
    expect_exit q2 2 30
    log_has q2 'not the run of the store: layout H=256,layers=2,16,dtype=bf16, the store holds H=256,layers=2,16,29,dtype=bf16'
    start q3 "$PRODUCER" "${base[@]}" --data "$data" --hidden-size 256 --layers 2,16,29 \
        --hs-dtype fp8 --name q3
    expect_exit q3 2 30
    log_has q3 'the store holds H=256,layers=2,16,29,dtype=bf16'
    log_has q3 'dtype=fp8'
    kill -TERM "$(pid_of c2)"
    wait_exit c2 30
    # a pinned run that the store does not hold is refused at start
    start c3 "$CONSUMER" --listen 127.0.0.1:0 "${copts[@]}" --store "$store" \
        --expect-layout H=256,layers=2,16,29,dtype=fp8
    expect_exit c3 2 30
    log_has c3 'holds layout H=256,layers=2,16,29,dtype=bf16, --expect-layout is H=256,layers=2,16,29,dtype=fp8'
    pass "mismatch: other dataset, layout and dtype refused, naming what differs"
    ;;
enospc)
    start first env HS_STORE_FAULT=enospc=3 "$CONSUMER" --loopback 2 "${copts[@]}" --epochs 2 \
        --train-ms 10 --store "$store" --summary-json "$SCRATCH/first.json" -- "${popts[@]}"
    expect_exit first 0 90
    [ "$(grep -c 'the disk is full' "$SCRATCH/first.log")" -eq 1 ] || fail "expected exactly one disk-full warning"
    expect_json "$SCRATCH/first.json" 'd["complete"] is True' \
        "d['batches_delivered'] == 2 * $per_epoch" 'd["store_full"] is True' \
        'd["store_writes"] == 2' 'd["checksum_failures"] == 0'
    # what was stored before the disk filled is whole and replays
    [ "$(stat -c %s "$store/index.hsi")" -eq 128 ] || fail "index.hsi should hold 2 records"
    online second 1
    expect_exit second 0 90
    log_has second "store .*: 2 of $per_epoch batches stored"
    expect_json "$SCRATCH/second.json" 'd["complete"] is True' 'd["store_hits"] == 2' \
        'd["store_bad"] == 0'
    pass "enospc: one warning, the run completed, the store kept what it had"
    ;;
target)
    root=$(cd "$(dirname "$0")/../.." && pwd)
    model=$SCRATCH/model
    cp -r "$root/tests/data/qwen3" "$model"
    mdata=$SCRATCH/m.jsonl
    synth "$mdata" --sequences 24 --min-len 4 --max-len 150 --vocab 128 --seed 3
    mbatches=$(plan_batches "$mdata" 512)
    mopts=(--data "$mdata" --token-budget 512 --source model --model "$model" --layers 1,3
        --gpus cpu:1 --transport tcp)
    start first "$CONSUMER" --loopback 1 --cache-gb 0.05 --transport tcp --epochs 1 \
        --store "$store" --summary-json "$SCRATCH/first.json" -- "${mopts[@]}" --fault delay_ms=100
    expect_exit first 0 120
    fp=$(sed -n 's/.*target .*: fingerprint \([0-9a-f]\{16\}\) .*/\1/p' "$SCRATCH/first.log" | head -n 1)
    [ -n "$fp" ] || fail "the producer did not log its target's fingerprint"
    expect_json "$SCRATCH/first.json" 'd["complete"] is True' "d['target_fingerprint'] == '$fp'" \
        "d['store_misses'] == $mbatches" "d['target'] == '$model'"
    [ -f "$model/.hsflow-target" ] || fail "no fingerprint cache beside the weights"
    # the store alone: complete, and it says whose states it holds
    start third "$CONSUMER" --listen 127.0.0.1:0 --cache-gb 0.05 --transport tcp --epochs 1 \
        --store "$store" --summary-json "$SCRATCH/third.json" --expect-target "$fp"
    expect_exit third 0 60
    log_has third "run target: $fp \\($model\\): the states the store holds were computed by it"
    expect_json "$SCRATCH/third.json" 'd["complete"] is True' 'd["producers_seen"] == 0' \
        "d['target_fingerprint'] == '$fp'" "d['store_hits'] == $mbatches"
    start fourth "$CONSUMER" --listen 127.0.0.1:0 --cache-gb 0.05 --transport tcp --epochs 1 \
        --store "$store" --expect-target 00000000000000aa
    expect_exit fourth 2 30
    log_has fourth "holds the states of target $fp \\($model\\), --expect-target is 00000000000000aa"
    # new weights in the same folder: one bf16 weight changes in its last bit
    python3 - "$model/model.safetensors" <<'PY' || fail "could not change the weights"
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(-2, 2)
    b = f.read(1)
    f.seek(-2, 2)
    f.write(bytes([b[0] ^ 1]))
PY
    # the store keeps one batch, so the consumer waits for producers of the rest
    truncate -s 64 "$store/index.hsi"
    reserve_port port
    start c2 "$CONSUMER" --listen 127.0.0.1:$port --cache-gb 0.05 --transport tcp --epochs 1 \
        --store "$store"
    wait_log c2 "run target: $fp \\($model\\): the states the store holds" 30
    start q "$PRODUCER" --to 127.0.0.1:$port --connect-timeout 30 --name q "${mopts[@]}"
    expect_exit q 2 60
    log_has q "target [0-9a-f]{16} \\('$model'\\), the store holds the states of $fp \\('$model'\\)"
    # the changed file is read again, the other one comes from the cache
    log_has first "target $model: fingerprint $fp \\(config.json and 2 weight file\\(s\\): 2 read"
    log_has q "target $model: fingerprint [0-9a-f]{16} \\(config.json and 2 weight file\\(s\\): 1 read .* 1 unchanged"
    if grep -q "fingerprint $fp" "$SCRATCH/q.log"; then fail "new weights gave the old fingerprint"; fi
    kill -TERM "$(pid_of c2)"
    wait_exit c2 30
    pass "target: new weights refused by the store naming both fingerprints; the store names its target"
    ;;
shared)
    reserve_port p0
    reserve_port p1
    start rank0 "$CONSUMER" --rank 0 --world 2 --listen 127.0.0.1:$p0 "${copts[@]}" --epochs 1 \
        --store "$store" --summary-json "$SCRATCH/rank0.json"
    wait_log rank0 'listening' 30
    start rank1 "$CONSUMER" --rank 1 --world 2 --listen 127.0.0.1:$p1 "${copts[@]}" --epochs 1 \
        --store "$store"
    expect_exit rank1 2 30
    log_has rank1 "store $store is in use by another consumer \\(pid $(pid_of rank0)\\).*--store of its own"
    start prod "$PRODUCER" --to 127.0.0.1:$p0 "${popts[@]}" --connect-timeout 30
    expect_exit rank0 0 90
    expect_exit prod 0 30
    expect_json "$SCRATCH/rank0.json" 'd["complete"] is True' 'd["checksum_failures"] == 0' \
        'd["batches_delivered"] == d["batches_planned"] > 0'
    hsflow_data store verify "$store" >"$SCRATCH/verify.log" 2>&1 ||
        fail "the store does not verify: $(cat "$SCRATCH/verify.log")"
    # the lock went with its holder: the folder opens again
    start again "$CONSUMER" --rank 0 --world 2 --listen 127.0.0.1:0 "${copts[@]}" --epochs 1 \
        --store "$store"
    wait_log again "store $store: [0-9]+ of $per_epoch batches stored" 30
    kill -TERM "$(pid_of again)"
    wait_exit again 30
    pass "shared: the second consumer of one store refused naming it, the first completed"
    ;;
*) fail "unknown mode $mode" ;;
esac
