#!/usr/bin/env python3
"""Did NCCL use the plugin? Reads the per-process logs NCCL writes (NCCL_DEBUG=INFO,
NCCL_DEBUG_SUBSYS=INIT,NET, NCCL_DEBUG_FILE) and checks, per process:

* NCCL loaded the plugin and which ncclNet ABI it took, and that this is the newest both know
  (anything older means a symbol went missing);
* every communicator used the plugin's network, and connected its channels through it;
* NCCL saw the ranks as different hosts (nNodes = nranks: NCCL_HOSTID did its job);
* the plugin logged its per-connection route lines, both directions.

Every string below is quoted from its source. NCCL: NVIDIA/nccl at tag v2.30.7-1, checked to be the
same text at v2.28.9-1 and v2.29.7-1 (line numbers differ). The plugin: src/plugin/switchless/mod.rs.
Standard library only.

    nccllog.py [--nranks N] [--plugin NAME] FILE...     prints the checks; exit 0 when all pass
"""

import re
import sys

# src/plugin/net/net_v12.cc:18 (and net_v11.cc:86, net_v10.cc:124, ... one per version):
#   INFO(NCCL_INIT | NCCL_NET, "NET/Plugin: Loaded net plugin %s (v12)", ncclNet_v12->name);
LOADED = re.compile(r"NET/Plugin: Loaded net plugin (\S+) \(v(\d+)\)")
# src/plugin/net.cc:126 (2.28+): "Successfully loaded external network plugin %s" (the library's path)
LOADED_PATH = re.compile(r"Successfully loaded external network plugin (\S+)")
# src/init.cc:486: INFO(NCCL_INIT, "Using network %s", comm->ncclNet->name);
USING = re.compile(r"Using network (\S+)")
# src/plugin/net.cc:228 (2.27+): "Assigned NET plugin %s to comm"
ASSIGNED = re.compile(r"Assigned NET plugin (\S+) to comm")
# src/init.cc:695-701 (showVersion): "NCCL version " MAJOR.MINOR.PATCH SUFFIX "+cuda" CUDA_MAJOR.CUDA_MINOR
VERSION = re.compile(r"NCCL version (\d+)\.(\d+)\.(\d+)(\S*)")
# src/init.cc:1422: "comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL %d"
TOPOLOGY = re.compile(r"comm \S+ rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+)")
# src/transport/net.cc:324/328 [send], 377 [receive]:
#   "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s"
CHANNEL = re.compile(r"Channel \d+/\d+ : \d+\[\d+\] -> \d+\[\d+\] \[(send|receive)\] via NET/([^/\s]+)/\d+")
# src/plugin/net.cc:208 and :349 (WARN), src/plugin/plugin_open.cc:124 and the dlopen error
# "%s/Plugin: %s: %s" (library, dlerror text) just above it.
FAILURES = (
    re.compile(r"Failed to initialize NET plugin \S+"),
    re.compile(r"Failed to initialize any NET plugin"),
    re.compile(r"NET/Plugin: Could not find:.*"),
    re.compile(r"NET/Plugin: \S+\.so[^:]*: .*"),
)
# The plugin's per-connection route line (src/plugin/switchless/mod.rs, `describe`, logged once
# per connection by the connector and once by the acceptor):
#   "NET/switchless: connected to peer ... on NCCL device D (NAME), K path(s), tcp A -> B: [0] ..."
#   "NET/switchless: accepted from connector ... on NCCL device D (NAME), K path(s), tcp A <- B: ..."
ROUTE = re.compile(r"NET/switchless: (connected to|accepted from) (.+?) on NCCL device (\d+) \((\S*)\), (\d+) path\(s\)")
# src/debug.cc:330-354: [timestamp] "host:pid:tid " then "[cudaDev] NCCL INFO msg" or
# "[cudaDev] file:line (func) NCCL WARN msg".
NCCL_LINE = re.compile(r"(?:^|\s)NCCL (?P<level>INFO|WARN) (?P<msg>.*)$")


# The newest ncclNet the plugin exports (src/ffi/vtables.rs: ncclNetPlugin_v6 ... ncclNetPlugin_v12).
PLUGIN_NEWEST_ABI = 12


def expected_abi(major, minor):
    """The ncclNet version NCCL should take: the newest both sides know. NCCL tries its
    ncclNetVersion[] (src/plugin/net.cc) in order: {12, 11, ...} from 2.30 (2.31.2's library has
    nothing newer), {11, ...} in 2.28 and 2.29, {10, ...} in 2.27. None for older releases."""
    if (major, minor) >= (2, 30):
        newest = 12
    elif (major, minor) >= (2, 28):
        newest = 11
    elif (major, minor) == (2, 27):
        newest = 10
    else:
        return None
    return min(newest, PLUGIN_NEWEST_ABI)


class Process:
    """What one log file (one process) says."""

    def __init__(self, path):
        self.path = path
        self.nccl_lines = 0
        self.loaded = {}  # name -> set of ABI versions
        self.paths = set()
        self.using = []
        self.assigned = []
        self.version = None
        self.nodes = []  # (rank, nRanks, nNodes, localRanks)
        self.channels = {}  # (direction, net) -> count
        self.routes = {"connected to": 0, "accepted from": 0}
        self.route_examples = []
        self.failures = []
        self.warnings = []

    def feed(self, line):
        m = NCCL_LINE.search(line.rstrip("\n"))
        if not m:
            return
        self.nccl_lines += 1
        msg = m.group("msg").strip()
        if m.group("level") == "WARN" and len(self.warnings) < 5 and msg not in self.warnings:
            self.warnings.append(msg)
        if x := LOADED.search(msg):
            self.loaded.setdefault(x.group(1), set()).add(int(x.group(2)))
        elif x := LOADED_PATH.search(msg):
            self.paths.add(x.group(1))
        elif x := USING.match(msg):
            self.using.append(x.group(1))
        elif x := ASSIGNED.search(msg):
            self.assigned.append(x.group(1))
        elif x := VERSION.match(msg):
            self.version = (int(x.group(1)), int(x.group(2)), int(x.group(3)), x.group(4))
        elif x := TOPOLOGY.search(msg):
            self.nodes.append(tuple(int(x.group(k)) for k in range(1, 5)))
        elif x := CHANNEL.search(msg):
            k = (x.group(1), x.group(2))
            self.channels[k] = self.channels.get(k, 0) + 1
        elif x := ROUTE.search(msg):
            self.routes[x.group(1)] += 1
            if len(self.route_examples) < 2:
                self.route_examples.append(msg)
        else:
            for f in FAILURES:
                if f.search(msg) and msg not in self.failures:
                    self.failures.append(msg)


class Verdict:
    def __init__(self):
        self.processes = []
        self.problems = []
        self.abis = []
        self.versions = []

    def lines(self):
        out = []
        for p in self.processes:
            ver = ".".join(map(str, p.version[:3])) + p.version[3] if p.version else "?"
            abi = ", ".join(f"{n} v{'/v'.join(map(str, sorted(v)))}" for n, v in sorted(p.loaded.items())) or "none"
            chans = ", ".join(f"{d} via NET/{n}: {c}" for (d, n), c in sorted(p.channels.items())) or "none"
            nodes = ", ".join(f"rank {r}/{nr} on {nn} node(s)" for r, nr, nn, _ in p.nodes) or "?"
            out.append(
                f"{p.path}: NCCL {ver}; loaded {abi}; using {', '.join(sorted(set(p.using))) or 'nothing'}; "
                f"{nodes}; channels {chans}; route lines: {p.routes['connected to']} connected, "
                f"{p.routes['accepted from']} accepted"
            )
            for e in p.route_examples[:1]:
                out.append(f"    e.g. {e[:300]}")
            for f in p.failures:
                out.append(f"    plugin failure: {f[:300]}")
            for w in p.warnings:
                out.append(f"    WARN: {w[:300]}")
        return out


def check(processes, nranks, plugin="switchless"):
    v = Verdict()
    v.processes = processes
    if not processes:
        v.problems.append("no NCCL log files: nothing shows the plugin was used")
    for p in processes:
        where = p.path
        if p.nccl_lines == 0:
            v.problems.append(f"{where}: no NCCL log lines (is NCCL_DEBUG=INFO set and NCCL_DEBUG_FILE right?)")
            continue
        mine = {n.lower(): s for n, s in p.loaded.items()}.get(plugin.lower())
        if not mine:
            hint = f" ({p.failures[0][:200]})" if p.failures else ""
            v.problems.append(f"{where}: NCCL never loaded the '{plugin}' plugin{hint}")
        else:
            for a in sorted(mine):
                if a not in v.abis:
                    v.abis.append(a)
            if p.version:
                want = expected_abi(p.version[0], p.version[1])
                if want is not None and max(mine) != want:
                    v.problems.append(
                        f"{where}: NCCL {p.version[0]}.{p.version[1]} took ncclNet v{max(mine)}, expected v{want} "
                        f"(the newest both know; does the plugin still export ncclNetPlugin_v{want}?)"
                    )
        if p.version and p.version[:3] not in v.versions:
            v.versions.append(p.version[:3])
        if not p.using:
            v.problems.append(f"{where}: no 'Using network' line: no communicator got past network set-up")
        other = sorted({u for u in p.using if u.lower() != plugin.lower()})
        if other:
            v.problems.append(f"{where}: NCCL used {', '.join(other)} instead of '{plugin}'")
        for r, nr, nn, _ in p.nodes:
            if nn != nr:
                v.problems.append(
                    f"{where}: rank {r} sees {nn} node(s) for {nr} ranks: NCCL does not take the ranks for different "
                    f"hosts (NCCL_HOSTID), so it may not use the network between them"
                )
                break
        for d in ("send", "receive"):
            if not any(c for (dd, n), c in p.channels.items() if dd == d and n.lower() == plugin.lower()):
                v.problems.append(f"{where}: no channel [{d}] via NET/{plugin}")
        for kind in ("connected to", "accepted from"):
            if p.routes[kind] == 0:
                v.problems.append(f"{where}: no 'NET/switchless: {kind} ...' route line from the plugin")
    return v


def check_files(paths, nranks=2, plugin="switchless"):
    procs = []
    for path in paths:
        p = Process(path)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    p.feed(line)
        except OSError as e:
            p.failures.append(f"cannot read: {e}")
        procs.append(p)
    return check(procs, nranks, plugin)


def main(argv):
    nranks, plugin, files = 2, "switchless", []
    i = 0
    while i < len(argv):
        if argv[i] == "--nranks" and i + 1 < len(argv):
            nranks = int(argv[i + 1])
            i += 2
        elif argv[i] == "--plugin" and i + 1 < len(argv):
            plugin = argv[i + 1]
            i += 2
        elif argv[i] in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        else:
            files.append(argv[i])
            i += 1
    v = check_files(files, nranks, plugin)
    print("\n".join(v.lines()))
    for p in v.problems:
        print("problem: " + p)
    print("plugin used: yes" if not v.problems else "plugin used: NOT CONFIRMED")
    return 0 if not v.problems else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
