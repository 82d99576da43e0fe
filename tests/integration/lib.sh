# SPDX-License-Identifier: Apache-2.0
# lib.sh - helpers shared by the integration scripts (sourced, not run):
# a scratch folder, background processes that are always cleaned up, free
# ports, bounded waits on log lines and process exits, and checks on the
# summary JSON. Every wait polls a condition under a deadline; none is a
# fixed sleep.
#
# Needs HS_BIN: the folder holding hs-consumer, hs-producer and hs-data.

set -u
HS_BIN=${HS_BIN:?set HS_BIN to the folder holding hs-consumer, hs-producer and hs-data}
CONSUMER=$HS_BIN/hs-consumer
PRODUCER=$HS_BIN/hs-producer
DATA=$HS_BIN/hs-data
for b in "$CONSUMER" "$PRODUCER" "$DATA"; do
    [ -x "$b" ] || { echo "FAIL: $b is missing; build the project first" >&2; exit 1; }
done

# A caller's HS_* settings would change what the tests run.
for v in $(compgen -e); do
    case $v in
    HS_BIN | HS_LOG_LEVEL | HS_SANITIZE) ;; # the last: set by CTest for a sanitized build
    HS_*) unset "$v" ;;
    esac
done

SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/hs-integration.XXXXXX")
TEST_NAME=$(basename "$0" .sh)${1:+-$1}
declare -A PID_OF=()
declare -A RC_OF=()

cleanup() {
    local rc=$?
    for name in "${!PID_OF[@]}"; do
        kill -9 "${PID_OF[$name]}" 2>/dev/null
    done
    wait 2>/dev/null
    if [ $rc -eq 0 ]; then
        rm -rf "$SCRATCH"
    else
        echo "$TEST_NAME: kept $SCRATCH for inspection" >&2
    fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP # so that cleanup runs when ctest gives up on us

fail() {
    echo "FAIL [$TEST_NAME]: $*" >&2
    for f in "$SCRATCH"/*.log; do
        [ -f "$f" ] || continue
        echo "---- last lines of $(basename "$f")" >&2
        grep -E 'Assertion|Sanitizer|runtime error|Segmentation' "$f" | head -n 5 >&2
        tail -n 25 "$f" >&2
    done
    exit 1
}

pass() { echo "PASS [$TEST_NAME]${1:+: $*}"; }

# reserve_port VAR: sets VAR to a TCP port on 127.0.0.1 that nothing listens
# on and that no other test takes while this one runs. Binding port 0 and
# letting it go was not enough: with tests in parallel the kernel handed the
# same port to another test before this one listened on it, and producers
# joined the wrong run. tests/python/ports.py names a port below the kernel's
# ephemeral range (no outgoing connection takes one as its source port) and
# free to bind; a lock on its file under /tmp, the one ports.py takes for the
# Python tests, held by this shell until it exits (even by SIGKILL), keeps
# the other tests off it.
PORT_LOCKS=/tmp/hsflow-test-ports-$(id -u)
mkdir -p "$PORT_LOCKS"
reserve_port() {
    # The locals carry a prefix: VAR is resolved by name, and a local of the
    # same name would hide the caller's.
    local -n _rp_out=$1
    local _rp_port _rp_fd
    for _ in $(seq 100); do
        _rp_port=$(python3 "$(dirname "${BASH_SOURCE[0]}")/../python/ports.py") ||
            fail "tests/python/ports.py named no port"
        exec {_rp_fd}>"$PORT_LOCKS/$_rp_port"
        if flock -n "$_rp_fd"; then
            _rp_out=$_rp_port
            return 0
        fi
        exec {_rp_fd}>&-
    done
    fail "no port free of other tests' locks after 100 tries"
}

# start NAME CMD...: runs CMD in the background, output in $SCRATCH/NAME.log.
# The process is CMD itself (exec), so signals sent to it reach the binary.
start() {
    local name=$1
    shift
    (exec "$@") >"$SCRATCH/$name.log" 2>&1 &
    PID_OF[$name]=$!
}

pid_of() { echo "${PID_OF[$1]}"; }

# running NAME: true while the process has not exited (zombies count as exited).
running() {
    local pid=${PID_OF[$1]} st
    st=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

# wait_exit NAME SECS: waits for the process to end, sets RC_OF[NAME].
wait_exit() {
    local name=$1 secs=$2 deadline
    deadline=$(($(date +%s) + secs))
    while running "$name"; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            kill -9 "${PID_OF[$name]}" 2>/dev/null
            fail "$name did not exit within $secs s"
        fi
        sleep 0.05
    done
    local rc=0
    wait "${PID_OF[$name]}" || rc=$?
    RC_OF[$name]=$rc
    unset "PID_OF[$name]"
}

# expect_exit NAME RC SECS: the process ends within SECS with exit code RC.
expect_exit() {
    wait_exit "$1" "$3"
    [ "${RC_OF[$1]}" -eq "$2" ] || fail "$1 exited with ${RC_OF[$1]}, expected $2"
}

# wait_log NAME REGEX SECS: waits until $SCRATCH/NAME.log has a line matching
# the extended regex; fails early if the process NAME ended first.
wait_log() {
    local name=$1 re=$2 secs=$3 deadline
    deadline=$(($(date +%s) + secs))
    until grep -Eq -- "$re" "$SCRATCH/$name.log" 2>/dev/null; do
        if [ -n "${PID_OF[$name]:-}" ] && ! running "$name"; then
            grep -Eq -- "$re" "$SCRATCH/$name.log" 2>/dev/null && return 0
            fail "$name ended before logging /$re/"
        fi
        [ "$(date +%s)" -lt "$deadline" ] || fail "no line matching /$re/ in $name.log within $secs s"
        sleep 0.05
    done
}

# wait_connecting NAME...: each producer has built its plan and is about to
# connect (it retries every 50 ms). Starting producers before the consumer
# and waiting here means they all join a run that lasts under a second, even
# on a slow machine.
wait_connecting() {
    for name in "$@"; do wait_log "$name" 'plan [0-9a-f]{16}: ' 60; done
}

# log_has NAME REGEX: the log of NAME has a matching line (extended regex).
log_has() {
    grep -Eq -- "$2" "$SCRATCH/$1.log" || fail "$1.log has no line matching /$2/"
}

# delivered NAME: batches delivered according to the consumer's latest
# status line ("12/104 batches | ..."), 0 before the first one.
delivered() {
    grep -Eo '[0-9]+/[0-9]+ batches' "$SCRATCH/$1.log" 2>/dev/null | tail -n 1 | cut -d/ -f1 | grep . || echo 0
}

# wait_delivered NAME N SECS: the consumer's status line shows >= N delivered.
wait_delivered() {
    local name=$1 n=$2 secs=$3 deadline
    deadline=$(($(date +%s) + secs))
    until [ "$(delivered "$name")" -ge "$n" ]; do
        running "$name" || fail "$name ended before delivering $n batches"
        [ "$(date +%s)" -lt "$deadline" ] || fail "$name did not deliver $n batches within $secs s"
        sleep 0.05
    done
}

# expect_json FILE EXPR...: each Python expression over the parsed JSON `d`
# must be true.
expect_json() {
    local file=$1
    shift
    [ -s "$file" ] || fail "no summary JSON at $file"
    python3 - "$file" "$@" <<'PY' || fail "summary check failed (see above)"
import json, sys
d = json.load(open(sys.argv[1]))
bad = [e for e in sys.argv[2:] if not eval(e, {}, {"d": d})]
for e in bad:
    print("  not true: %s" % e, file=sys.stderr)
if bad:
    print("  summary: %s" % json.dumps(d, sort_keys=True), file=sys.stderr)
    sys.exit(1)
PY
}

# json_get FILE KEY
json_get() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

# plan_batches FILE BUDGET [hs-data plan options]: batches per epoch.
plan_batches() {
    local file=$1 budget=$2
    shift 2
    "$DATA" plan "$file" --token-budget "$budget" "$@" | awk '/^batches /{print $2}'
}

# synth FILE [hs-data synth options]: a synthetic JSONL dataset.
synth() {
    local file=$1
    shift
    "$DATA" synth "$file" "$@" >/dev/null 2>"$SCRATCH/synth.err" || fail "hs-data synth failed: $(cat "$SCRATCH/synth.err")"
}

# hsflow_data ARGS...: the Python hsflow-data of this build (its store
# commands). Under ASan the interpreter is not instrumented while the
# library it loads is, so the sanitizer runtime is preloaded, without leak
# checking (Python keeps memory until exit on purpose), as for tests/python.
hsflow_data() {
    if [ "${HS_SANITIZE:-}" = address ]; then
        LD_PRELOAD="$(${CC:-cc} -print-file-name=libasan.so)" \
            ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$HS_BIN/hsflow-data" "$@"
    else
        "$HS_BIN/hsflow-data" "$@"
    fi
}
