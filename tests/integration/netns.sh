#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# netns.sh tcp|ucx|ucx-default - two "hosts" on one machine: the consumer in
# one network namespace, two producers in another, joined by a veth pair
# (10.77.N.1 <-> 10.77.N.2, the interface is called hs0 on both sides). The
# peer is not on loopback, so both sides use --secret-file. Two epochs, every
# hidden-state element checked (--verify-synthetic), every batch delivered
# exactly once, and the bytes must really have crossed the veth: the
# consumer's hs0 received at least the payload bytes of the run.
#   tcp          --transport tcp
#   ucx          --transport ucx with UCX_TLS=tcp and UCX_NET_DEVICES=hs0:
#                the namespaces share the machine's memory, so without this
#                UCX may take shared memory and bypass the veth
#   ucx-default  --transport ucx with UCX's own choice (UCX_TLS unset): the
#                run must complete; the lanes UCX took are printed
#   auto         no --transport: two hosts without an RDMA device, so
#                hsflow's TCP (not shared memory, not UCX) carries both
# Exits 77 (skipped) only where the kernel or the sandbox refuses network
# namespaces or veth pairs (not root, no CAP_NET_ADMIN, no veth module).
. "$(dirname "$0")/lib.sh"
mode=${1:?usage: netns.sh tcp|ucx|ucx-default|auto}
case $mode in tcp | ucx | ucx-default | auto) ;; *) fail "unknown mode $mode" ;; esac

. "$(dirname "$0")/netns_lib.sh"
netns_setup

data=$SCRATCH/d.jsonl
synth "$data" --sequences 160 --min-len 16 --max-len 2000 --seed 11
budget=4096
per_epoch=$(plan_batches "$data" $budget)
[ "${per_epoch:-0}" -gt 0 ] || fail "hs-data plan gave no batch count"
umask 077
head -c 48 /dev/urandom | base64 >"$SCRATCH/secret"

envs=()
case $mode in
tcp) tp=(--transport tcp) ;;
auto) tp=() ;;
ucx) tp=(--transport ucx) envs=(UCX_TLS=tcp UCX_NET_DEVICES=hs0) ;;
ucx-default) tp=(--transport ucx) envs=(-u UCX_TLS -u UCX_NET_DEVICES) ;;
esac
# ip netns exec and env both exec, so the process lib.sh tracks is the binary
[ ${#envs[@]} -gt 0 ] || envs=(-u UCX_NET_DEVICES)

rx_before=$(ip netns exec "$ns_c" cat /sys/class/net/hs0/statistics/rx_bytes)
port=7000 # the namespace is ours alone
for i in 0 1; do
    start p$i ip netns exec "$ns_p" env "${envs[@]}" "$PRODUCER" --to "$net.1:$port" --name p$i \
        --connect-timeout 60 --secret-file "$SCRATCH/secret" --summary-json "$SCRATCH/p$i.json" \
        --data "$data" --token-budget $budget --hidden-size 256 --layers 2,16,29 \
        --source synthetic --gpus cpu:1 "${tp[@]}"
done
wait_connecting p0 p1
start consumer ip netns exec "$ns_c" env "${envs[@]}" "$CONSUMER" --listen "$net.1:$port" --cache-gb 0.25 \
    --epochs 2 --verify-synthetic --secret-file "$SCRATCH/secret" \
    --summary-json "$SCRATCH/summary.json" "${tp[@]}"
expect_exit consumer 0 120
for i in 0 1; do expect_exit p$i 0 30; done
rx_after=$(ip netns exec "$ns_c" cat /sys/class/net/hs0/statistics/rx_bytes)

expect_json "$SCRATCH/summary.json" \
    'd["complete"] is True' \
    "d['batches_planned'] == 2 * $per_epoch" \
    'd["batches_delivered"] == d["batches_planned"]' \
    'd["duplicates"] == 0' \
    'd["checksum_failures"] == 0' \
    'd["protocol_errors"] == 0' \
    'd["producers_seen"] == 2' \
    'd["producers_dropped"] == 0' \
    'd["epochs"] == 2'
sum=0
for i in 0 1; do sum=$((sum + $(json_get "$SCRATCH/p$i.json" batches))); done
[ $sum -eq $((2 * per_epoch)) ] || fail "producers computed $sum batches for a run of $((2 * per_epoch))"
log_has consumer "producer p0 \\(${net//./\\.}\\.2:[0-9]+\\)"

bytes=$(json_get "$SCRATCH/summary.json" bytes)
crossed=$((rx_after - rx_before))
lanes=$(grep -Eo 'ucx: [^"]*' "$SCRATCH/consumer.log" | head -n 1)
if [ "$mode" = ucx-default ]; then
    pass "$((2 * per_epoch)) batches verified across namespaces; UCX's own choice: ${lanes:-?}; $crossed B crossed hs0 for $bytes B of payload"
    exit 0
fi
[ "$crossed" -ge "$bytes" ] ||
    fail "only $crossed bytes crossed hs0 for $bytes bytes of payload: the traffic did not go over the veth (${lanes:-no ucx lanes logged})"
if [ "$mode" = auto ]; then
    expect_json "$SCRATCH/summary.json" "d['producer_transports'] == {'shm': 0, 'tcp': 2, 'ucx': 0}"
    # the consumer offers shared memory to producers of its own host; these
    # are in another namespace and came over TCP; UCX was never started
    ! grep -q 'ucx: \|ucx transport\|UCX_TLS' "$SCRATCH/consumer.log" "$SCRATCH/p0.log" ||
        fail "auto between two hosts without RDMA used UCX"
fi
if [ "$mode" = ucx ]; then
    grep -Eq 'ucx: .*tcp/hs0' "$SCRATCH/consumer.log" "$SCRATCH/p0.log" ||
        fail "no connection logged as carried by UCX tcp/hs0 (got: ${lanes:-nothing})"
fi
pass "$mode: $((2 * per_epoch)) batches verified from $ns_p to $ns_c over hs0, $crossed B crossed for $bytes B of payload${lanes:+ ($lanes)}"
