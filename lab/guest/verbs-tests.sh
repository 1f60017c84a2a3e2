#!/bin/sh
# The verbs tests of .ci/steps/82-lab-verbs.sh inside one soft-RoCE lab VM (busybox sh): run by the
# lab's `payload` check as /opt/payload/run, next to the binaries the step copied there, with the
# node's LAB_* variables (/tmp/lab.env). In order:
#   1. examples/verbs_smoke on every cable (both nodes at once, right after boot: it pairs the ends
#      over TCP on the cable, with its own deadline): RC write/read with immediates, then a bad rkey
#      (remote access error) and the flushed request after it;
#   2. the cargo test binaries whose tests have a branch for hosts with RDMA devices (they print
#      RDMA-BRANCH lines there): tests/abi.rs (but the nm check: no binutils in the VM),
#      tests/bench_host.rs, tests/relay_verbs.rs's verbs leg, and the library's verbs:: unit
#      tests;
#   3. examples/async_events on this node's first cable while its netdev goes down and up again: it
#      must read IBV_EVENT_PORT_ERR and IBV_EVENT_PORT_ACTIVE.
# Exit status 0 when every step passed; the CI step also counts the markers in the output.
# shellcheck disable=SC2154 # LAB_* come from the environment (/tmp/lab.env)
set -u
rc=0
step() {
    echo "PAYLOAD-STEP $*"
    "$@" || { echo "PAYLOAD-FAIL $* (exit $?)"; rc=1; }
}
step ./verbs_smoke
step ./abi --skip exports_exactly_the_vtables --nocapture --test-threads=1
step ./bench_host --nocapture --test-threads=1
step ./relay_verbs _when_the_host_has_rdma --nocapture --test-threads=1
step ./unit verbs:: --nocapture --test-threads=1

eval "set -- \$LAB_LINK_0"
ifn=$2 dev=$3
echo "PAYLOAD-STEP async_events $dev, $ifn down and up"
./async_events "$dev" 8 > /tmp/events.txt 2>&1 &
pid=$!
sleep 2
/usr/sbin/ip link set "$ifn" down
sleep 2
/usr/sbin/ip link set "$ifn" up
wait "$pid" || { echo "PAYLOAD-FAIL async_events (exit $?)"; rc=1; }
cat /tmp/events.txt
if grep -q "port 1: IBV_EVENT_PORT_ERR" /tmp/events.txt && grep -q "port 1: IBV_EVENT_PORT_ACTIVE" /tmp/events.txt; then
    echo "ASYNC-EVENTS node $LAB_NODE $dev: PORT_ERR and PORT_ACTIVE"
else
    echo "PAYLOAD-FAIL async_events: $dev reported no IBV_EVENT_PORT_ERR and IBV_EVENT_PORT_ACTIVE"
    rc=1
fi
exit $rc
