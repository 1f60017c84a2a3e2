#!/bin/sh
# Builds NCCL's IB transport as an ncclNet plugin for the soft-RoCE lab, host memory only, so that
# the latency-ab payload can run it as build B beside switchless (issue 36: "at least NCCL IB's").
# The transport is the net_ib fork in Mellanox/nccl-rdma-sharp-plugins (checked at 2f5ac02); it
# exports ncclNetPlugin_v6..v11, and `switchless bench` drives v12, so v12shim.c (ours) exports a v12
# table over its v11 one. stub/ stands in for CUDA's runtime header (types only: nothing here calls
# CUDA) and for autotools' config.h. One line of the checkout is fixed before the build: its
# "Could not find real path" WARN passes a char where a string is expected, which crashes on rxe
# (a virtual device has no /sys/class/infiniband/<dev>/device).
# Usage: lab/payloads/latency-ab/ibext/build.sh CHECKOUT OUT.so
#   then: cp OUT.so B/libnccl-net-switchless.so (B/switchless: this tree's own release binary) and
#   run the payload with --guest-env "LAT_B_ENV=NCCL_IB_HCA:rxe_eth1" (both nodes on cable 1: NCCL
#   IB picks a device by locality, not by which cable reaches the peer).
set -eu
src=$1; out=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cp -r "$src/src" "$src/include" "$work/"
sed -i 's/WARN("Could not find real path of %s", \*device_path)/WARN("Could not find real path of %s", device_path)/' \
    "$work/src/p2p_plugin.c"
cd "$work"
gcc -O2 -fPIC -shared -D_GNU_SOURCE -I"$here/stub" -Iinclude src/ibvwrap.c src/utils.c src/param.c \
    src/socket.c src/p2p_plugin.c src/ib_plugin.c "$here/v12shim.c" -o "$out" -libverbs -lmlx5 -ldl -lpthread
