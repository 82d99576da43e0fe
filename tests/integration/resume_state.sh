#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# resume_state.sh - hs-consumer --save-state / --resume-state. A run writes its
# position atomically while it goes; one copy of it stands for the trainer's
# checkpoint, and the consumer is SIGKILLed some batches later (its --journal
# has recorded more than the state). Restarted with that state and the same
# journal, the state wins: the journal is rewritten to the state's batches and
# the run delivers exactly the others, so the journal ends holding every
# batch of every epoch once. The final state of a complete run resumes to
# nothing; a malformed state, one of another --epochs, producers of
# another plan, and a --save-state onto the journal are refused, naming
# what is wrong.
. "$(dirname "$0")/lib.sh"
# An optional argument names the transport of every process (default: none
# given, so auto: shared memory on one host).
tp=()
[ -z "${1:-}" ] || tp=(--transport "$1")

data=$SCRATCH/d.jsonl
synth "$data" --sequences 200 --min-len 16 --max-len 2000 --seed 11
per_epoch=$(plan_batches "$data" 4096)
state=$SCRATCH/state.json
journal=$SCRATCH/run.journal
popts=(--data "$data" --token-budget 4096 --hidden-size 256 --layers 2,16,29
    --source synthetic --gpus cpu:1 "${tp[@]}")

"$CONSUMER" --help | grep -q -- "--resume-state FILE" || fail "--help lacks --resume-state"
"$CONSUMER" --help | grep -q -- "--save-state FILE" || fail "--help lacks --save-state"

# state_field FILE KEY
state_field() { json_get "$1" "$2"; }

# run 1: saves its state every 0.1 s; killed well after the copy we keep
start c1 "$CONSUMER" "${tp[@]}" --loopback 2 --cache-gb 0.25 --epochs 2 --journal "$journal" \
    --save-state "$state" --save-state-interval 0.1 --train-ms 25 --status-interval 0.1 \
    -- "${popts[@]}"
deadline=$(($(date +%s) + 60))
until [ -s "$state" ] && [ "$(state_field "$state" delivered)" -ge $((per_epoch / 3)) ]; do
    running c1 || fail "c1 ended before saving a state"
    [ "$(date +%s)" -lt "$deadline" ] || fail "no state with $((per_epoch / 3)) batches within 60 s"
    sleep 0.05
done
cp "$state" "$SCRATCH/checkpoint.json" # atomic renames: always a whole state
saved=$(state_field "$SCRATCH/checkpoint.json" delivered)
wait_delivered c1 $((saved + 6)) 60
producers=$(ps -o pid= --ppid "$(pid_of c1)" || true)
kill -9 "$(pid_of c1)"
wait_exit c1 10
for p in $producers; do kill -9 "$p" 2>/dev/null || true; done
journaled=$(($(wc -l <"$journal") - 1))
[ "$journaled" -gt "$saved" ] || fail "the journal ($journaled) is not ahead of the state ($saved)"

# run 2: resumes from the checkpoint's state; the state wins over the journal
start c2 "$CONSUMER" "${tp[@]}" --loopback 2 --cache-gb 0.25 --epochs 2 --journal "$journal" \
    --resume-state "$SCRATCH/checkpoint.json" --save-state "$state" \
    --summary-json "$SCRATCH/s2.json" -- "${popts[@]}"
expect_exit c2 0 120
log_has c2 "give way to the resume state"
log_has c2 "rewritten to the resume state's $saved batch"
log_has c2 "resuming from the resume state"
[ "${1:-}" != shm ] || expect_json "$SCRATCH/s2.json" \
    "d['producer_transports']['shm'] == d['producers_seen'] > 0"
expect_json "$SCRATCH/s2.json" "d['complete']" "d['duplicates'] == 0" \
    "d['batches_resumed'] == $saved" \
    "d['batches_planned'] == 2 * $per_epoch - $saved"
python3 - "$journal" "$per_epoch" "$SCRATCH/checkpoint.json" <<'PY' || fail "journal contents"
import base64, json, sys
lines = open(sys.argv[1]).read().splitlines()
assert lines[0].startswith("hsflow-journal 1 plan="), lines[0]
pairs = [tuple(map(int, l.split())) for l in lines[1:]]
n = int(sys.argv[2])
assert len(pairs) == len(set(pairs)) == 2 * n, (len(pairs), len(set(pairs)), 2 * n)
assert set(pairs) == {(e, b) for e in range(2) for b in range(n)}
# the journal starts with the state's batches, the restart's releases follow
st = json.load(open(sys.argv[3]))
named = {(e, b) for e in range(st["epochs_done"]) for b in range(n)}
for p in st["partial"]:
    bits = base64.b64decode(p["bitmap"])
    named |= {(p["epoch"], b) for b in range(n) if bits[b // 8] >> (b % 8) & 1}
assert len(named) == st["delivered"]
assert set(pairs[:len(named)]) == named, "the journal was not rewritten to the state"
PY
expect_json "$state" "d['epochs_done'] == 2" "d['delivered'] == 2 * $per_epoch" \
    "d['partial'] == []" "d['plan'] == '$(head -c 38 "$journal" | sed 's/.*plan=//')'"

# run 3: the final state of a complete run leaves nothing to do (and one file
# can be both the state resumed from and the state saved)
start c3 "$CONSUMER" "${tp[@]}" --loopback 1 --cache-gb 0.25 --epochs 2 --resume-state "$state" \
    --save-state "$state" --summary-json "$SCRATCH/s3.json" -- "${popts[@]}"
expect_exit c3 0 60
log_has c3 "nothing left to do"
expect_json "$SCRATCH/s3.json" "d['complete']" "d['batches_planned'] == 0" \
    "d['batches_resumed'] == 2 * $per_epoch"
expect_json "$state" "d['epochs_done'] == 2" "d['delivered'] == 2 * $per_epoch"

# refusals, each naming what is wrong
echo '{"hsflow_state": 1, "plan": "abc' >"$SCRATCH/bad.json"
start c4 "$CONSUMER" "${tp[@]}" --loopback 1 --cache-gb 0.25 --epochs 2 --resume-state "$SCRATCH/bad.json" \
    -- "${popts[@]}"
expect_exit c4 2 30
log_has c4 "resume state is not valid JSON"
start c5 "$CONSUMER" "${tp[@]}" --loopback 1 --cache-gb 0.25 --epochs 3 \
    --resume-state "$SCRATCH/checkpoint.json" -- "${popts[@]}"
expect_exit c5 2 30
log_has c5 "saved by a run of 2 epoch\(s\), this consumer runs 3: give --epochs 2"
start c6 "$CONSUMER" "${tp[@]}" --loopback 1 --cache-gb 0.25 --epochs 2 --resume-state "$SCRATCH/none.json" \
    -- "${popts[@]}"
expect_exit c6 2 30
log_has c6 "--resume-state .*none.json: cannot open it"
start c7 "$CONSUMER" "${tp[@]}" --loopback 1 --cache-gb 0.25 --epochs 2 \
    --resume-state "$SCRATCH/checkpoint.json" -- "${popts[@]}" --seed 99
wait_exit c7 60
[ "${RC_OF[c7]}" -ne 0 ] || fail "a run with producers of another plan succeeded"
log_has c7 "resume state was saved for plan [0-9a-f]{16} \([0-9]+ batches/epoch\), the producer offers plan"
start c8 "$CONSUMER" "${tp[@]}" --loopback 1 --cache-gb 0.25 --epochs 2 --journal "$journal" \
    --save-state "$journal" -- "${popts[@]}"
expect_exit c8 2 30
log_has c8 "--save-state .*: give it a file of its own"
pass "resume from a saved state"
