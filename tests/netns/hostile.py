#!/usr/bin/env python3
"""A hostile client for tests/netns/hostile.sh: from its own namespace it scans a port range of a
rank's host and throws everything the security review lists at each port it finds listening (the
plugin's handshake listener and its TCP data-stream listeners): malformed handshake hellos and
frames, garbage, truncated and oversized headers, stream hellos with a guessed tag, slow writers,
a flood of silent connections from several source addresses, and connects from a spoofed source (the
real peer's address). It never knows the handle's nonce. It runs until --stop names a file that
exists, then writes a JSON report (--report) with what it did.

Usage: hostile.py --target IP --ports LO-HI --skip PORT --sources IP,IP --spoof IP --ready FILE
                  --stop FILE --report FILE"""
import argparse
import json
import os
import socket
import struct
import time

HOLD_MAX = 300  # sockets held open at once (silent flood, slow writers); the oldest go first


def frames(rnd):
    """Malformed handshake frames (header: magic SWHS, version 2, type, 2 reserved, u32 length)."""
    def hs(ty, payload, version=2, length=None):
        n = len(payload) if length is None else length
        return b"SWHS" + bytes([version, ty, 0, 0]) + struct.pack("<I", n) + payload

    return [
        b"GET / HTTP/1.0\r\n\r\n",
        rnd(300),
        hs(1, b"", length=0xFFFFFFFF),  # oversized
        b"SWHS\x02",  # truncated header
        hs(4, b""),  # Ready before any Hello
        hs(1, rnd(64)),  # a Hello whose tag no key made
        hs(1, rnd(200), version=9),  # wrong version
        hs(2, rnd(48)),  # a Reply sent to a listener
        hs(3, b"x" * 2000),  # a Reject
        # A TCP stream hello (magic SWTS, version 2, 1 path, path 0, 1 stream, stream 0) with a
        # guessed connection id, nonce and tag, then a random frame header.
        b"SWTS" + bytes([2, 1, 0, 1, 0]) + bytes(7) + rnd(8) + rnd(32) + rnd(40),
        # The same with path and stream numbers past any count.
        b"SWTS" + bytes([2, 255, 254, 255, 254]) + bytes(7) + rnd(8) + rnd(32),
        # The old stream hello (version 1, a guessed nonce in clear).
        b"SWTS" + bytes([1, 1, 0, 1, 0]) + bytes(7) + rnd(8) + rnd(40),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--ports", required=True)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--sources", required=True)
    ap.add_argument("--spoof", required=True)
    ap.add_argument("--ready", required=True)
    ap.add_argument("--stop", required=True)
    ap.add_argument("--report", required=True)
    a = ap.parse_args()
    lo, hi = (int(x) for x in a.ports.split("-"))
    sources = a.sources.split(",")
    rnd = os.urandom
    held = []
    stats = {"passes": 0, "ports_hit": [], "attacks": 0, "connections": 0, "garbage_frames": 0,
             "flood_connections": 0, "spoof_attempts": 0, "spoof_connected": 0,
             "bytes_back": 0}
    hit = set()
    last = {}
    k = 0

    def connect(port, src, timeout=0.05):
        nonlocal k
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((src, 0))
        s.settimeout(timeout)
        try:
            s.connect((a.target, port))
        except OSError:
            s.close()
            return None
        stats["connections"] += 1
        k += 1
        return s

    def hold(s):
        held.append(s)
        while len(held) > HOLD_MAX:
            held.pop(0).close()

    def attack(port):
        stats["attacks"] += 1
        # A silent flood from one source first (it must not evict a real connector in flight),
        # then every malformed frame, then a slow writer, each on its own connection. A connect
        # that fails means the listener just closed; the rest are still tried.
        for _ in range(40):
            s = connect(port, sources[0])
            if s is None:
                break
            stats["flood_connections"] += 1
            hold(s)
        for i, f in enumerate(frames(rnd)):
            s = connect(port, sources[i % len(sources)])
            if s is None:
                continue
            try:
                s.sendall(f)
                stats["garbage_frames"] += 1
                s.settimeout(0.02)
                try:
                    stats["bytes_back"] += len(s.recv(4096))
                except OSError:
                    pass
            except OSError:
                pass
            # Half of them linger (a client that sent a bad frame and waits), half close at once.
            if i % 2:
                hold(s)
            else:
                s.close()
        s = connect(port, sources[-1])
        if s is not None:
            try:
                s.sendall(b"S")
            except OSError:
                pass
            hold(s)
        # The real peer's address, from this host: the SYN-ACK goes to the real peer, so the
        # connection never opens.
        stats["spoof_attempts"] += 1
        s = connect(port, a.spoof, timeout=0.2)
        if s is not None:
            stats["spoof_connected"] += 1
            s.close()

    open(a.ready, "w").close()
    while not os.path.exists(a.stop):
        stats["passes"] += 1
        for port in range(lo, hi + 1):
            if port == a.skip:
                continue
            s = connect(port, sources[port % len(sources)], timeout=0.01)
            if s is None:
                continue
            s.close()
            now = time.monotonic()
            if now - last.get(port, -1.0) < 0.5:
                continue
            last[port] = now
            hit.add(port)
            attack(port)
    for s in held:
        s.close()
    stats["ports_hit"] = sorted(hit)
    with open(a.report, "w") as f:
        json.dump(stats, f)


if __name__ == "__main__":
    main()
