#!/usr/bin/env python3
"""Prints "INCLUDE_DIR LIB_DIR" of the NCCL that PyTorch uses: the nvidia-nccl-cu* wheel's nccl.h
and libnccl.so.2, so that nccl_selftest.cu builds and runs against the same library.

Looks in the installed distributions named nvidia-nccl* (importlib.metadata: their file lists,
whatever the wheel's layout), then under every sys.path entry's nvidia/ folder. Exit 1, naming
what was searched, when either file is missing. Standard library only.
"""

import glob
import os
import sys
from importlib import metadata


def from_distributions():
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if not name.startswith("nvidia-nccl"):
            continue
        inc = lib = None
        for f in dist.files or []:
            p = str(dist.locate_file(f))
            if p.endswith(os.sep + "nccl.h"):
                inc = os.path.dirname(p)
            elif os.path.basename(p) == "libnccl.so.2":
                lib = os.path.dirname(p)
        if inc and lib:
            return inc, lib, f"{name} {dist.version}"
    return None


def from_paths():
    for base in sys.path:
        heads = glob.glob(os.path.join(base, "nvidia", "**", "nccl.h"), recursive=True)
        libs = glob.glob(os.path.join(base, "nvidia", "**", "libnccl.so.2"), recursive=True)
        if heads and libs:
            return os.path.dirname(heads[0]), os.path.dirname(libs[0]), base
    return None


def main():
    found = from_distributions() or from_paths()
    if not found:
        print("ncclwheel.py: no nccl.h + libnccl.so.2 in an nvidia-nccl* distribution or under "
              f"nvidia/ in {sys.path}", file=sys.stderr)
        return 1
    inc, lib, what = found
    print(inc, lib, what)
    return 0


if __name__ == "__main__":
    sys.exit(main())
