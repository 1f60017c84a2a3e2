//! The request slab: each send or recv comm leases one fixed table of [`SLOTS`] request slots at
//! connect/accept and gives it back at close, so `isend`/`irecv`/`iflush`/`test` allocate nothing and
//! take no process-wide lock (NCCL IB keeps a fixed request pool per comm the same way).
//!
//! NCCL holds a request as an opaque `void*` that it never dereferences, so the plugin hands out a
//! [`RequestId`] (slab index, slot, generation), not an address: `test` finds the slab in a per-backend
//! directory of `OnceLock`s (lock-free reads) and checks the slot's generation under the slot's own
//! lock. Any value is safe to test: a completed request, one of a closed comm, a pointer of another
//! kind or a made-up number names no live slot and is an error, never a read of freed memory. Slabs
//! are recycled, never freed (a closed comm's slots move to the next generation first), so memory is
//! bounded by the most comms open at once (256 slots of a few dozen bytes each).
#![forbid(unsafe_code)]

use std::sync::{Mutex, OnceLock};

use super::{Backend, MAX_GROUPED_RECVS};
use crate::error::{Error, Result};
use crate::sync::lock;
use crate::transport::wire::{MAX_RECVS, MAX_REQUESTS};

/// Request slots per comm: `NCCL_NET_MAX_REQUESTS` (32) × `maxRecvs` (8), what NCCL's README asks of a
/// send comm (NCCL IB's `NET_IB_MAX_REQUESTS`); a recv comm uses at most 32 receives and 32 flushes of
/// them.
pub const SLOTS: usize = MAX_REQUESTS * MAX_RECVS;

const SLOT_BITS: u32 = 8;
const SLAB_BITS: u32 = 20;
const GEN_BITS: u32 = 64 - SLOT_BITS - SLAB_BITS;
const GEN_MAX: u64 = (1 << GEN_BITS) - 1;
/// Slabs per directory chunk; chunks are allocated as comms are created.
const CHUNK: usize = 1024;
/// Directory entries: room for 2^20 comms open at once in one process.
const DIR: usize = (1 << SLAB_BITS) / CHUNK;

const _: () = assert!(SLOTS == 1 << SLOT_BITS, "a slot index fills SLOT_BITS");

/// What a request is waiting for; decides how many sizes `test` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// One size.
    Send,
    /// One size per buffer.
    Recv(usize),
    /// No sizes.
    Flush,
}

impl RequestKind {
    fn sizes(self) -> usize {
        match self {
            RequestKind::Send => 1,
            RequestKind::Recv(n) => n.min(MAX_GROUPED_RECVS),
            RequestKind::Flush => 0,
        }
    }
}

/// An in-flight request in its slot.
struct Request<B: Backend> {
    kind: RequestKind,
    inner: B::Request,
}

/// NCCL's `void* request`: bits 0..8 the slot, 8..28 the slab, 28..64 the slot's generation (≥ 1, so
/// never NULL nor NCCL's `0x1` hint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestId(u64);

impl RequestId {
    fn new(slab: u32, slot: usize, generation: u64) -> RequestId {
        RequestId(
            (generation << (SLOT_BITS + SLAB_BITS)) | (u64::from(slab) << SLOT_BITS) | slot as u64,
        )
    }

    /// The value NCCL holds.
    pub fn to_raw(self) -> u64 {
        self.0
    }

    /// What NCCL passed back; checked against the slabs by [`test()`].
    pub fn from_raw(raw: u64) -> RequestId {
        RequestId(raw)
    }

    fn slot(self) -> usize {
        (self.0 & ((1 << SLOT_BITS) - 1)) as usize
    }

    fn slab(self) -> usize {
        ((self.0 >> SLOT_BITS) & ((1 << SLAB_BITS) - 1)) as usize
    }

    fn generation(self) -> u64 {
        self.0 >> (SLOT_BITS + SLAB_BITS)
    }
}

/// One slot: its generation (the one a request posted now gets) and the request, if one is in flight.
struct Entry<B: Backend> {
    generation: u64,
    req: Option<Request<B>>,
}

fn next_generation(g: u64) -> u64 {
    if g >= GEN_MAX { 1 } else { g + 1 }
}

/// One comm's slots. The slot locks are per slot and the free list per comm: `isend` and `test` on
/// NCCL's progress thread meet `closeSend` on its service thread only there.
struct Slab<B: Backend> {
    index: u32,
    slots: Box<[Mutex<Entry<B>>]>,
    /// Free slot indices; its capacity is [`SLOTS`] from the start, so a push never allocates.
    free: Mutex<Vec<u16>>,
}

impl<B: Backend> Slab<B> {
    fn new(index: u32) -> Slab<B> {
        Slab {
            index,
            slots: (0..SLOTS)
                .map(|_| {
                    Mutex::new(Entry {
                        generation: 1,
                        req: None,
                    })
                })
                .collect(),
            free: Mutex::new((0..SLOTS as u16).rev().collect()),
        }
    }

    /// Takes a free slot, runs `post`, and files its request there; the slot goes back on `None` or an
    /// error.
    fn post(
        &self,
        kind: RequestKind,
        post: impl FnOnce() -> Result<Option<B::Request>>,
    ) -> Result<Option<RequestId>> {
        let Some(i) = lock(&self.free, "request slab")?.pop() else {
            return Err(Error::InvalidUsage(format!(
                "more than {SLOTS} requests in flight on one comm (NCCL_NET_MAX_REQUESTS {MAX_REQUESTS} \
                 x maxRecvs {MAX_RECVS}); test() the completed ones before posting more"
            )));
        };
        let i = usize::from(i);
        match post() {
            Ok(Some(inner)) => {
                let mut e = lock(&self.slots[i], "request slot")?;
                e.req = Some(Request { kind, inner });
                Ok(Some(RequestId::new(self.index, i, e.generation)))
            }
            other => {
                lock(&self.free, "request slab")?.push(i as u16);
                other.map(|_| None)
            }
        }
    }

    /// Polls the request `id` names; on completion frees its slot (the id is dead from then on).
    fn test(&self, id: RequestId, sizes: &mut [usize; MAX_GROUPED_RECVS]) -> Result<Option<usize>> {
        let slot = id.slot();
        let mut e = lock(&self.slots[slot], "request slot")?;
        if e.generation != id.generation() {
            return Err(not_live(id));
        }
        let Some(req) = e.req.as_mut() else {
            return Err(not_live(id));
        };
        let n = req.kind.sizes();
        if !B::test(&mut req.inner, &mut sizes[..n])? {
            return Ok(None);
        }
        e.req = None;
        e.generation = next_generation(e.generation);
        drop(e);
        lock(&self.free, "request slab")?.push(slot as u16);
        Ok(Some(n))
    }

    /// Drops every request still in flight (a comm closed on abort) and moves each used slot to its next
    /// generation, so no id handed out before names a slot of the next comm that leases the slab.
    fn reset(&self) {
        for s in self.slots.iter() {
            let mut e = s.lock().unwrap_or_else(|p| p.into_inner());
            if e.req.take().is_some() {
                e.generation = next_generation(e.generation);
            }
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        free.clear();
        free.extend((0..SLOTS as u16).rev());
    }
}

fn not_live(id: RequestId) -> Error {
    Error::InvalidArgument(format!(
        "test request {:#x} is not a live request (completed or its comm closed already, or another \
         kind of object)",
        id.0
    ))
}

/// Every slab of one backend type: a directory of lazily made chunks (read without a lock), and the
/// spare slabs of closed comms (locked only at connect, accept and close).
pub struct Slabs<B: Backend> {
    dir: [OnceLock<Chunk<B>>; DIR],
    pool: Mutex<Pool<B>>,
}

/// [`CHUNK`] directory entries, each set once when its slab is made.
type Chunk<B> = Box<[OnceLock<&'static Slab<B>>]>;

struct Pool<B: Backend> {
    spare: Vec<&'static Slab<B>>,
    made: u32,
}

impl<B: Backend> std::fmt::Debug for Slabs<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slabs").finish_non_exhaustive()
    }
}

impl<B: Backend> Slabs<B> {
    /// No slabs yet (for a `static`).
    pub const fn new() -> Slabs<B> {
        Slabs {
            dir: [const { OnceLock::new() }; DIR],
            pool: Mutex::new(Pool {
                spare: Vec::new(),
                made: 0,
            }),
        }
    }

    /// A slab for a new comm: a spare one, else a new one (made once, never freed).
    fn lease(&'static self) -> Result<Lease<B>> {
        let mut pool = lock(&self.pool, "request slabs")?;
        if let Some(slab) = pool.spare.pop() {
            return Ok(Lease { slab, slabs: self });
        }
        let index = pool.made;
        let i = index as usize;
        if i >= DIR * CHUNK {
            return Err(Error::System(format!(
                "{} comms open at once; at most {} are supported in one process",
                i,
                DIR * CHUNK
            )));
        }
        // Reserve room for every slab made so far in the spare list, so giving one back (in `Drop`) never
        // allocates.
        pool.spare.try_reserve(i + 1).map_err(|e| {
            Error::System(format!("no memory for the request slab of a new comm: {e}"))
        })?;
        let chunk =
            self.dir[i / CHUNK].get_or_init(|| (0..CHUNK).map(|_| OnceLock::new()).collect());
        let slab: &'static Slab<B> = Box::leak(Box::new(Slab::new(index)));
        chunk[i % CHUNK]
            .set(slab)
            .map_err(|_| Error::Internal(format!("request slab {index} was made twice")))?;
        pool.made += 1;
        Ok(Lease { slab, slabs: self })
    }

    fn find(&self, i: usize) -> Option<&'static Slab<B>> {
        self.dir
            .get(i / CHUNK)?
            .get()?
            .get(i % CHUNK)?
            .get()
            .copied()
    }
}

impl<B: Backend> Default for Slabs<B> {
    fn default() -> Self {
        Slabs::new()
    }
}

/// A comm's slab, given back (its requests dropped, its slots moved on a generation) when the comm
/// goes.
pub struct Lease<B: Backend> {
    slab: &'static Slab<B>,
    slabs: &'static Slabs<B>,
}

impl<B: Backend> Lease<B> {
    /// A slab of `B`'s pool.
    pub fn new() -> Result<Lease<B>> {
        B::slot().slabs.lease()
    }

    /// Takes a free slot, runs `post`, and files its request there; the slot goes back on `None` or an
    /// error. No slot free: [`Error::InvalidUsage`] naming the limit.
    pub fn post(
        &self,
        kind: RequestKind,
        post: impl FnOnce() -> Result<Option<B::Request>>,
    ) -> Result<Option<RequestId>> {
        self.slab.post(kind, post)
    }
}

impl<B: Backend> Drop for Lease<B> {
    fn drop(&mut self) {
        self.slab.reset();
        let mut pool = self.slabs.pool.lock().unwrap_or_else(|p| p.into_inner());
        // Room was reserved when the slab was made: one spare entry per slab ever made.
        pool.spare.push(self.slab);
    }
}

/// `test(request)`: `Ok(Some(n))` when complete, with `n` byte counts in `sizes` (1 for a send, one per
/// buffer for a receive, 0 for a flush); the request is freed then. `Ok(None)` while in flight.
pub fn test<B: Backend>(
    id: RequestId,
    sizes: &mut [usize; MAX_GROUPED_RECVS],
) -> Result<Option<usize>> {
    let slab = B::slot()
        .slabs
        .find(id.slab())
        .ok_or_else(|| not_live(id))?;
    slab.test(id, sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_never_null_or_the_hint() {
        let id = RequestId::new((1 << SLAB_BITS) - 1, SLOTS - 1, GEN_MAX);
        assert_eq!(
            (id.slab(), id.slot(), id.generation()),
            ((1 << SLAB_BITS) - 1, SLOTS - 1, GEN_MAX)
        );
        let first = RequestId::new(0, 0, 1);
        assert!(first.to_raw() > 1);
        assert_eq!(next_generation(GEN_MAX), 1);
    }
}
