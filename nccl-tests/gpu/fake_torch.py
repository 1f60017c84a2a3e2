"""A stand-in for the few parts of torch and torch.distributed that selftest.run_rank uses, so that
test_selftest.py runs the driver itself (its buffers, operations, checks and rows) on a machine
without torch or a GPU: tensors are Python lists, and the ranks are threads of one process that
exchange their buffers at a barrier. `install(nranks, fault=None)` puts it in sys.modules;
`fault="alltoall"` swaps two blocks of every alltoall so a test can see the driver catch it.
Test support only: small sizes, no speed.
"""

import struct
import sys
import threading
import types


class DType:
    def __init__(self, name, is_float):
        self.name, self.is_float = name, is_float

    def __repr__(self):
        return f"torch.{self.name}"


float32 = DType("float32", True)
float64 = DType("float64", True)
bfloat16 = DType("bfloat16", True)
int64 = DType("int64", False)


def _cast(v, dtype):
    if not dtype.is_float:
        return int(v)
    v = float(v)
    if dtype is bfloat16:
        # round to nearest even in the top 16 bits of the float32, as a bf16 conversion does
        (u,) = struct.unpack("<I", struct.pack("<f", v))
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        (v,) = struct.unpack("<f", struct.pack("<I", u))
    elif dtype is float32:
        (v,) = struct.unpack("<f", struct.pack("<f", v))
    return v


class Tensor:
    def __init__(self, data, dtype):
        self.data, self.dtype = [_cast(x, dtype) for x in data], dtype

    def _zip(self, other, f, dtype=None):
        o = other.data if isinstance(other, Tensor) else [other] * len(self.data)
        return Tensor([f(a, b) for a, b in zip(self.data, o)], dtype or self.dtype)

    def __mul__(self, o):
        return self._zip(o, lambda a, b: a * b)

    def __add__(self, o):
        return self._zip(o, lambda a, b: a + b)

    __radd__ = __add__

    def __sub__(self, o):
        return self._zip(o, lambda a, b: a - b)

    def __mod__(self, o):
        return self._zip(o, lambda a, b: a % b)

    def __ne__(self, o):
        return self._zip(o, lambda a, b: int(a != b), int64)

    def __len__(self):
        return len(self.data)

    def to(self, dtype):
        return Tensor(self.data, dtype)

    def cpu(self):
        return self

    def tolist(self):
        return list(self.data)

    def sum(self):
        return Tensor([sum(self.data)], self.dtype)

    def item(self):
        return self.data[0]

    def fill_(self, v):
        self.data = [_cast(v, self.dtype)] * len(self.data)
        return self

    def copy_(self, src):
        assert len(src.data) == len(self.data), "copy_ between different sizes"
        self.data = [_cast(x, self.dtype) for x in src.data]
        return self


def arange(start, end, dtype=int64, device=None):
    return Tensor(range(start, end), dtype)


def div(t, d, rounding_mode=None):
    assert rounding_mode == "floor"
    return Tensor([x // d for x in t.data], t.dtype)


def empty(n, dtype=float32, device=None):
    return Tensor([0] * n, dtype)


def tensor(values, dtype=float32, device=None):
    return Tensor(values, dtype)


def cat(ts):
    return Tensor([x for t in ts for x in t.data], ts[0].dtype)


def device(kind, index=0):
    return (kind, index)


class _World:
    """The ranks (threads) and the buffers they have put down for the current operation."""

    def __init__(self, nranks, fault):
        self.n, self.fault = nranks, fault
        self.barrier = threading.Barrier(nranks, timeout=60)
        self.slots = [None] * nranks
        self.local = threading.local()

    def exchange(self, mine):
        """Every rank's `mine`, in rank order (a collective step)."""
        r = self.local.rank
        self.slots[r] = mine
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()
        return got


_world = None


class _Work:
    def wait(self):
        return True


class P2POp:
    def __init__(self, op, t, peer):
        self.op, self.t, self.peer = op, t, peer


def _dist():
    d = types.ModuleType("torch.distributed")

    def rank():
        return _world.local.rank

    def init_process_group(backend, init_method=None, rank=0, world_size=1, device_id=None):
        assert backend == "nccl" and world_size == _world.n
        _world.local.rank = rank

    def all_reduce(t):
        parts = _world.exchange(list(t.data))
        t.data = [_cast(sum(p[i] for p in parts), t.dtype) for i in range(len(t.data))]

    def all_gather_into_tensor(out, inp):
        parts = _world.exchange(list(inp.data))
        out.data = [x for p in parts for x in p]

    def reduce_scatter_tensor(out, inp):
        parts = _world.exchange(list(inp.data))
        c, r = len(out.data), rank()
        out.data = [_cast(sum(p[r * c + i] for p in parts), out.dtype) for i in range(c)]

    def all_to_all_single(out, inp):
        parts = _world.exchange(list(inp.data))
        c, r = len(out.data) // _world.n, rank()
        blocks = [p[r * c:(r + 1) * c] for p in parts]
        if _world.fault == "alltoall" and len(blocks) > 1 and c > 0:
            blocks[0], blocks[1] = blocks[1], blocks[0]
        out.data = [x for b in blocks for x in b]

    def broadcast(t, src=0):
        parts = _world.exchange(list(t.data))
        t.data = list(parts[src])

    def batch_isend_irecv(ops):
        me = rank()
        sends = {o.peer: list(o.t.data) for o in ops if o.op is isend}
        parts = _world.exchange(sends)
        for o in ops:
            if o.op is irecv:
                o.t.data = list(parts[o.peer][me])
        return [_Work() for _ in ops]

    def isend(*a, **k):
        raise AssertionError("isend is only used through batch_isend_irecv")

    def irecv(*a, **k):
        raise AssertionError("irecv is only used through batch_isend_irecv")

    def barrier():
        _world.exchange(None)

    def destroy_process_group():
        pass

    for f in (init_process_group, all_reduce, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single,
              broadcast, batch_isend_irecv, isend, irecv, barrier, destroy_process_group):
        setattr(d, f.__name__, f)
    d.P2POp = P2POp
    return d


def install(nranks, fault=None):
    """Puts the stand-in into sys.modules as torch and torch.distributed."""
    global _world
    _world = _World(nranks, fault)
    me = sys.modules[__name__]
    cuda = types.ModuleType("torch.cuda")
    cuda.set_device = lambda d: None
    cuda.synchronize = lambda: None
    cuda.get_device_name = lambda d=None: "fake GPU (fake_torch.py)"
    cuda.nccl = types.SimpleNamespace(version=lambda: (2, 0, 0))
    me.cuda = cuda
    me.__version__ = "fake"
    me.distributed = _dist()
    sys.modules["torch"] = me
    sys.modules["torch.distributed"] = me.distributed
    sys.modules["torch.cuda"] = cuda


def uninstall():
    for k in ("torch", "torch.distributed", "torch.cuda"):
        sys.modules.pop(k, None)
