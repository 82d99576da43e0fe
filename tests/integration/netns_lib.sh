# SPDX-License-Identifier: Apache-2.0
# netns_lib.sh - two "hosts" on one machine for the scripts that need a real
# link (sourced after lib.sh): netns_setup makes network namespaces $ns_c
# (the consumer's) and $ns_p (the producers'), joined by a veth pair called
# hs0 on both sides, $net.1 <-> $net.2, and removes them when the script
# exits. It exits 77 (skipped) only where the kernel or the sandbox refuses
# network namespaces or veth pairs (not root, no CAP_NET_ADMIN, no veth).

skip() {
    echo "SKIP [$TEST_NAME]: $*" >&2
    rm -rf "$SCRATCH"
    trap - EXIT
    exit 77
}

netns_cleanup() {
    ip netns pids "$ns_c" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns pids "$ns_p" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip link del "$veth_c" 2>/dev/null # deleting one end removes both
    ip netns del "$ns_c" 2>/dev/null
    ip netns del "$ns_p" 2>/dev/null
    true
}

netns_setup() {
    command -v ip >/dev/null || skip "the ip command (iproute2) is missing"
    # Unique names: tests using namespaces may run at the same time.
    local id=$$
    ns_c=hs-c-$id ns_p=hs-p-$id veth_c=hsc$id veth_p=hsp$id
    net=10.77.$((id % 250 + 1))
    # lib.sh's cleanup (kill processes, keep the scratch folder on failure)
    # runs after the namespaces are gone, with the script's exit status.
    trap 'rc=$?; netns_cleanup; (exit $rc); cleanup' EXIT
    ip netns add "$ns_c" 2>"$SCRATCH/ns.err" ||
        skip "the kernel refuses network namespaces here: $(cat "$SCRATCH/ns.err")"
    ip netns add "$ns_p" 2>"$SCRATCH/ns.err" ||
        skip "the kernel refuses a second network namespace: $(cat "$SCRATCH/ns.err")"
    ip link add "$veth_c" type veth peer name "$veth_p" 2>"$SCRATCH/ns.err" ||
        skip "cannot create a veth pair: $(cat "$SCRATCH/ns.err")"
    # From here on a failure is a real failure: namespaces work.
    ip link set "$veth_c" netns "$ns_c" || fail "cannot move $veth_c into $ns_c"
    ip link set "$veth_p" netns "$ns_p" || fail "cannot move $veth_p into $ns_p"
    ip -n "$ns_c" link set "$veth_c" name hs0 || fail "cannot rename $veth_c"
    ip -n "$ns_p" link set "$veth_p" name hs0 || fail "cannot rename $veth_p"
    ip -n "$ns_c" addr add "$net.1/24" dev hs0 || fail "cannot address hs0 in $ns_c"
    ip -n "$ns_p" addr add "$net.2/24" dev hs0 || fail "cannot address hs0 in $ns_p"
    local ns
    for ns in "$ns_c" "$ns_p"; do
        ip -n "$ns" link set lo up || fail "cannot bring lo up in $ns"
        ip -n "$ns" link set hs0 up || fail "cannot bring hs0 up in $ns"
    done
}
