# shellcheck shell=sh
# Addressing of the lab, in one place (sourced by lab/run.sh on the host; the results go into the
# initramfs config, so guests never compute addresses themselves).
#
# For now a fixed table: link L (1-based, in topology-file order) is the point-to-point subnet
# 10.100.L.0/30; the lower-numbered node of the link gets .1, the higher one .2. `switchless plan`
# may replace this function later: it must print "PREFIXLEN IP_LOW IP_HIGH" for a link id.
lab_link_addr() { # $1 = link id (1..250) -> "30 10.100.L.1 10.100.L.2"
    if [ "$1" -lt 1 ] || [ "$1" -gt 250 ]; then
        echo "lab_link_addr: link id $1 out of range (accepted: 1..250)" >&2
        return 1
    fi
    echo "30 10.100.$1.1 10.100.$1.2"
}

# Management network (bootstrap of `switchless bench`, like the Ethernet a real cluster's
# NCCL_SOCKET_IFNAME names): one extra NIC per VM on a shared hub, 192.168.77.<node>/24. It carries
# no RDMA device.
lab_mgmt_addr() { # $1 = node (1..250) -> "24 192.168.77.N"
    echo "24 192.168.77.$1"
}
