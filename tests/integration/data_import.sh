#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# data_import.sh - hs-data import and info stream: their peak memory stays
# bounded (well under what the dataset takes in memory), they agree on the
# fingerprint, they show progress on a terminal (and not in a log), and they
# end with the real elapsed time.
. "$(dirname "$0")/lib.sh"

d=$SCRATCH/data
mkdir "$d"
# 8 M tokens: 40 MB of ids and masks once in memory, a 62 MB JSONL
synth "$d/big.jsonl" --sequences 4000 --min-len 1000 --max-len 3000 --seed 2
limit_kb=24576
if [ -n "${HS_SANITIZE:-}" ]; then
    # ASan's shadow memory and its quarantine of freed blocks (kept small
    # here) add to the peak; a reader that held the file would still need
    # far more than this.
    limit_kb=65536
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=4"
fi

# peak_kb CMD...: runs CMD (stdout to $d/out.txt, stderr to $d/err.txt) and
# prints its peak resident memory in KiB; fails if CMD fails.
peak_kb() {
    python3 -c '
import resource, subprocess, sys
out, err = sys.argv[1], sys.argv[2]
with open(out, "w") as o, open(err, "w") as e:
    rc = subprocess.run(sys.argv[3:], stdout=o, stderr=e).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if rc == 0 else -1)
' "$d/out.txt" "$d/err.txt" "$@"
}

kb=$(peak_kb "$DATA" import "$d/big.jsonl" "$d/big.hst")
[ "$kb" -ge 0 ] || fail "hs-data import failed: $(cat "$d/err.txt")"
[ "$kb" -le $limit_kb ] || fail "hs-data import peaked at $kb KiB (limit $limit_kb) on an 8 M-token file"
grep -Eq '^wrote .*big.hst: 4000 sequences, [0-9]+ tokens, fingerprint [0-9a-f]{16} in [0-9.]+ s' "$d/out.txt" \
    || fail "import did not end with counts and elapsed time: $(cat "$d/out.txt")"
fp=$(sed -E 's/.*fingerprint ([0-9a-f]{16}).*/\1/' "$d/out.txt")
[ ! -s "$d/err.txt" ] || fail "import wrote to stderr without a terminal: $(cat -v "$d/err.txt")"
import_kb=$kb

kb=$(peak_kb env TMPDIR="$d" "$DATA" info "$d/big.jsonl")
[ "$kb" -ge 0 ] || fail "hs-data info failed: $(cat "$d/err.txt")"
[ "$kb" -le $limit_kb ] || fail "hs-data info peaked at $kb KiB (limit $limit_kb) on an 8 M-token file"
grep -q "fingerprint   $fp" "$d/out.txt" || fail "info on the JSONL gave another fingerprint than import ($fp)"
grep -Eq '^read in +[0-9.]+ s' "$d/out.txt" || fail "info did not report its elapsed time"
[ "$(ls -A "$d" | sort | tr '\n' ' ')" = "big.hst big.jsonl err.txt out.txt " ] \
    || fail "temporary files left behind: $(ls -A "$d")"
"$DATA" info "$d/big.hst" >"$d/hst.txt" 2>&1 || fail "info on the .hst failed"
grep -q "fingerprint   $fp" "$d/hst.txt" || fail "the .hst has another fingerprint than the JSONL"

# progress on a terminal (script(1) gives the command one), on stderr
if command -v script >/dev/null; then
    script -qec "$DATA import $d/big.jsonl $d/tty.hst" /dev/null >"$d/tty.txt" 2>&1 \
        || fail "import under a terminal failed: $(cat -v "$d/tty.txt")"
    grep -aq 'hs-data import: parse .* GB (' "$d/tty.txt" || fail "no progress line on a terminal: $(cat -v "$d/tty.txt" | head -c 400)"
    grep -aq 'wrote .*tty.hst' "$d/tty.txt" || fail "no result line under a terminal"
fi
pass "import peak $import_kb KiB, info peak $kb KiB (limit $limit_kb), fingerprint $fp"
