#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# slow_link.sh tcp|ucx - exactly once over a slow link with a producer that
# is frozen and thawed: the producer's namespace sends through a veth
# throttled to 4 MB/s (tc tbf), so each payload (up to 12 MiB) takes 1 to 3 s
# to arrive, longer than the consumer's 1 s --lease-timeout. Bytes arriving are
# progress: no lease may expire while a payload streams in (they once all
# did, forever, and nothing was delivered). Twice during the run the
# producer is frozen (SIGSTOP) for 3 s; over TCP its lease then expires
# (no byte comes) and it rejoins once thawed (--reconnect), and the run completes with every batch
# delivered exactly once and every element checked (--verify-synthetic).
#   tcp  --transport tcp (payload bytes are seen as they come)
#   ucx  --transport ucx with UCX_TLS=tcp over the veth (UCX shows a payload
#        only whole: the lease bound grows with the bytes in flight, 1 s a
#        MiB, so a 3 s freeze during a payload need not expire it)
# Exits 77 (skipped) where network namespaces, veth pairs or tc are refused.
. "$(dirname "$0")/lib.sh"
mode=${1:?usage: slow_link.sh tcp|ucx}
case $mode in tcp | ucx) ;; *) fail "unknown mode $mode" ;; esac
. "$(dirname "$0")/netns_lib.sh"
command -v tc >/dev/null || skip "the tc command (iproute2) is missing"
netns_setup
ip netns exec "$ns_p" tc qdisc add dev hs0 root tbf rate 32mbit burst 64kb latency 2s \
    2>"$SCRATCH/tc.err" || skip "tc refuses a tbf qdisc here: $(cat "$SCRATCH/tc.err")"

data=$SCRATCH/d.jsonl
synth "$data" --sequences 24 --min-len 400 --max-len 2000 --seed 5
budget=2048
per_epoch=$(plan_batches "$data" $budget)
[ "${per_epoch:-0}" -gt 0 ] || fail "hs-data plan gave no batch count"
umask 077
head -c 48 /dev/urandom | base64 >"$SCRATCH/secret"
case $mode in
tcp) tp=(--transport tcp) envs=(-u UCX_NET_DEVICES) ;;
ucx) tp=(--transport ucx) envs=(UCX_TLS=tcp UCX_NET_DEVICES=hs0) ;;
esac
port=7000 # the namespace is ours alone
start consumer ip netns exec "$ns_c" env "${envs[@]}" "$CONSUMER" --listen "$net.1:$port" \
    --cache-gb 0.1 --epochs 1 --lease-timeout 1 --verify-synthetic --status-interval 0.5 \
    --secret-file "$SCRATCH/secret" --summary-json "$SCRATCH/summary.json" "${tp[@]}"
wait_log consumer 'listening on' 30
# 1536 x 2 bytes x 2 layers: 6 KiB a token, 12 MiB for a full 2048-token batch
start producer ip netns exec "$ns_p" env "${envs[@]}" "$PRODUCER" --to "$net.1:$port" \
    --name slow --reconnect --connect-timeout 60 --secret-file "$SCRATCH/secret" \
    --data "$data" --token-budget $budget --hidden-size 1536 --layers 2,16 \
    --source synthetic --gpus cpu:1 --prefetch 1 "${tp[@]}"
wait_delivered consumer 1 90
for cycle in 1 2; do
    kill -STOP "$(pid_of producer)"
    sleep 3
    kill -CONT "$(pid_of producer)"
    wait_delivered consumer $((1 + cycle * 2)) 90
done
expect_exit consumer 0 180
expect_exit producer 0 60

expect_json "$SCRATCH/summary.json" \
    'd["complete"] is True' \
    "d['batches_planned'] == $per_epoch" \
    'd["batches_delivered"] == d["batches_planned"]' \
    'd["duplicates"] == 0' \
    'd["checksum_failures"] == 0'
# the leases that expired were those of the frozen producer, not of a payload
# streaming in: with a 1 s lease and 1.5 s payloads, every one would have
expired=$(grep -c 'dropped: no progress' "$SCRATCH/consumer.log" || true)
[ "$expired" -le 2 ] ||
    fail "$expired leases expired for 2 freezes: payloads arriving were not counted as progress"
[ "$mode" = ucx ] || [ "$expired" -ge 1 ] ||
    fail "no lease expired while the producer was frozen for 3 s"
pass "$mode: $per_epoch batches of up to 12 MiB over a 4 MB/s link with a 1 s lease, exactly once; $expired lease(s) expired in 2 freezes"
