#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# cli_devices.sh - the device flags of hs-consumer and hs-producer:
# --list-devices prints the RDMA report and exits 0; --require-rdma fails
# early and clearly with --transport tcp, and on a machine without RDMA
# devices; --nic with a name libibverbs does not know is an error naming the
# known devices; --nic auto without RDMA devices leaves the choice to UCX;
# the flags work from HS_* variables too, and --help describes them.
set -u
HS_BIN=${HS_BIN:?set HS_BIN to the folder holding hs-consumer and hs-producer}
for v in $(compgen -e); do case $v in HS_BIN) ;; HS_*) unset "$v" ;; esac; done
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
# expect RC REGEX CMD...: CMD exits with RC and its output matches REGEX.
expect() {
    local rc=$1 re=$2 out got
    shift 2
    out=$(timeout 20 "$@" 2>&1)
    got=$?
    [ "$got" -eq "$rc" ] || fail "$* exited $got, expected $rc; output: $out"
    grep -Eq -- "$re" <<<"$out" || fail "$* printed no line matching /$re/; output: $out"
}

ndev=$(ls /sys/class/infiniband 2>/dev/null | wc -l)
pargs=(--to 127.0.0.1:1 --data /nonexistent.jsonl --layers 2 --hidden-size 8 --connect-timeout 1)
for bin in hs-consumer hs-producer; do
    b=$HS_BIN/$bin
    [ "$bin" = hs-producer ] && args=("${pargs[@]}") || args=(--listen 127.0.0.1:0)
    expect 0 '--list-devices' "$b" --help
    expect 0 '--require-rdma' "$b" --help
    expect 0 '--nic auto' "$b" --help
    expect 0 'RDMA devices|no RDMA devices found' "$b" --list-devices
    HS_LIST_DEVICES=1 expect 0 'RDMA devices|no RDMA devices found' "$b"
    expect 2 'require-rdma cannot be met with --transport tcp' "$b" "${args[@]}" --transport tcp --require-rdma
    expect 2 "libibverbs knows no RDMA device 'hs_no_such_nic'" "$b" "${args[@]}" --nic hs_no_such_nic
    HS_NIC=hs_no_such_nic expect 2 "libibverbs knows no RDMA device" "$b" "${args[@]}"
    expect 2 'expected auto or NAME' "$b" "${args[@]}" --nic ''
    if [ "$ndev" -eq 0 ]; then
        expect 0 'no RDMA devices found \(libibverbs sees none\): UCX will use TCP/shared memory' "$b" --list-devices
        msg='--require-rdma: no RDMA device on this machine \(ibv_get_device_list found none\); drop --require-rdma to run over TCP'
        expect 2 "$msg" "$b" "${args[@]}" --require-rdma
        HS_REQUIRE_RDMA=1 expect 2 "$msg" "$b" "${args[@]}"
        expect 2 'no RDMA device on this machine' "$b" "${args[@]}" --transport ucx --require-rdma --nic auto
    fi
done
# --nic auto without RDMA devices: UCX's choice, said in the log, and the
# consumer goes on to listen (stopped by timeout's SIGINT: status 124).
if [ "$ndev" -eq 0 ]; then
    expect 124 'nic auto: no RDMA device .*UCX chooses' env HS_LOG_LEVEL=info \
        timeout -s INT 2 "$HS_BIN/hs-consumer" --listen 127.0.0.1:0 --nic auto --status-interval 0
fi
[ $fails -eq 0 ] || { echo "$fails check(s) failed" >&2; exit 1; }
echo "PASS: device flags of hs-consumer and hs-producer ($ndev RDMA device(s) here)"
