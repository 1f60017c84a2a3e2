#!/usr/bin/env python3
"""Veth pairs and IPv4 addresses through rtnetlink, for hosts without iproute2.

gpu-selftest.sh uses this only when `ip` is missing (GPU images often lack iproute2): network
namespaces then come from util-linux (`unshare --net`, `nsenter`), and this file does the three
things `ip` would: create a veth pair whose ends live in two namespaces, bring a link up with an
MTU, and add an address. Python standard library only (socket.AF_NETLINK, struct); Linux only.

    netlink.py veth NAME PID_A PID_B      one veth pair, an end called NAME in the network
                                          namespace of each process (`ip link add NAME netns A
                                          type veth peer name NAME netns B`)
    netlink.py up NAME [--mtu N] [--addr A.B.C.D/P]
                                          in the caller's namespace: MTU, address, then up
                                          (`ip link set NAME mtu N up; ip addr add A/P dev NAME`)

Message layouts are the kernel's uapi (linux/rtnetlink.h, linux/if_link.h, linux/veth.h,
linux/if_addr.h). Exit status 0 on success; 1 with the kernel's errno text otherwise.
"""

import errno
import ipaddress
import os
import socket
import struct
import sys

NLMSG_ERROR = 2
RTM_NEWLINK = 16
RTM_NEWADDR = 20
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400

IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_LINKINFO = 18
IFLA_NET_NS_PID = 19
IFLA_INFO_KIND = 1
IFLA_INFO_DATA = 2
VETH_INFO_PEER = 1
IFA_ADDRESS = 1
IFA_LOCAL = 2
IFA_BROADCAST = 4
IFF_UP = 0x1
RT_SCOPE_UNIVERSE = 0

IFNAMSIZ = 16


def attr(kind, payload):
    """One rtattr: u16 length (header + payload, unpadded), u16 type, payload, padding to 4."""
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * ((4 - n % 4) % 4)


def ifname(name):
    raw = name.encode()
    if not raw or len(raw) >= IFNAMSIZ or b"/" in raw or b"\0" in raw:
        raise ValueError(f"interface name {name!r}: 1 to {IFNAMSIZ - 1} bytes, no '/'")
    return attr(IFLA_IFNAME, raw + b"\0")


def ifinfomsg(index=0, flags=0, change=0):
    # family, pad, type, index, flags, change
    return struct.pack("=BxHiII", socket.AF_UNSPEC, 0, index, flags, change)


def veth_request(name, pid_a, pid_b):
    """RTM_NEWLINK body: NAME in pid_a's namespace, its peer NAME in pid_b's."""
    peer = ifinfomsg() + ifname(name) + attr(IFLA_NET_NS_PID, struct.pack("=I", pid_b))
    info = attr(IFLA_INFO_KIND, b"veth\0") + attr(IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer))
    return ifinfomsg() + ifname(name) + attr(IFLA_NET_NS_PID, struct.pack("=I", pid_a)) + attr(IFLA_LINKINFO, info)


def link_request(index, mtu=None):
    body = ifinfomsg(index=index, flags=IFF_UP, change=IFF_UP)
    if mtu is not None:
        body += attr(IFLA_MTU, struct.pack("=I", mtu))
    return body


def addr_request(index, cidr):
    net = ipaddress.IPv4Interface(cidr)
    # family, prefixlen, flags, scope, index
    body = struct.pack("=BBBBI", socket.AF_INET, net.network.prefixlen, 0, RT_SCOPE_UNIVERSE, index)
    local = net.ip.packed
    body += attr(IFA_LOCAL, local) + attr(IFA_ADDRESS, local)
    if net.network.prefixlen <= 30:
        body += attr(IFA_BROADCAST, net.network.broadcast_address.packed)
    return body


def message(kind, flags, seq, body):
    # nlmsghdr: length, type, flags, seq, pid (0: the kernel fills it)
    return struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body


def parse_ack(data, seq):
    """The errno of the NLMSG_ERROR answering seq (0 = success); raises on anything else."""
    off = 0
    while off + 16 <= len(data):
        length, kind, _flags, got_seq, _pid = struct.unpack_from("=IHHII", data, off)
        if length < 16:
            raise OSError(errno.EPROTO, "malformed netlink reply")
        if kind == NLMSG_ERROR and got_seq == seq:
            (err,) = struct.unpack_from("=i", data, off + 16)
            return -err
        off += (length + 3) & ~3
    raise OSError(errno.EPROTO, f"no acknowledgement for request {seq}")


def request(kind, body, create=False):
    flags = NLM_F_REQUEST | NLM_F_ACK | (NLM_F_CREATE | NLM_F_EXCL if create else 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as s:
        s.bind((0, 0))
        s.settimeout(10)
        s.send(message(kind, flags, 1, body))
        err = parse_ack(s.recv(65536), 1)
    if err:
        raise OSError(err, os.strerror(err))


def main(argv):
    if len(argv) >= 1 and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    try:
        if len(argv) == 4 and argv[0] == "veth":
            request(RTM_NEWLINK, veth_request(argv[1], int(argv[2]), int(argv[3])), create=True)
            return 0
        if len(argv) >= 2 and argv[0] == "up":
            name, mtu, cidr = argv[1], None, None
            rest = argv[2:]
            while rest:
                if rest[0] == "--mtu" and len(rest) > 1:
                    mtu = int(rest[1])
                elif rest[0] == "--addr" and len(rest) > 1:
                    cidr = rest[1]
                else:
                    raise ValueError(f"unknown argument {rest[0]!r} (accepted: --mtu N, --addr A.B.C.D/P)")
                rest = rest[2:]
            index = socket.if_nametoindex(name)
            if cidr is not None:
                request(RTM_NEWADDR, addr_request(index, cidr), create=True)
            request(RTM_NEWLINK, link_request(index, mtu))
            return 0
    except (OSError, ValueError) as e:
        print(f"netlink.py {' '.join(argv)}: {e}", file=sys.stderr)
        return 1
    print("usage: netlink.py veth NAME PID_A PID_B | up NAME [--mtu N] [--addr A.B.C.D/P]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
