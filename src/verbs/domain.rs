//! [`Domain`]: the one protection domain of an RDMA device, shared by every connection of the
//! process, with its registration cache (`transport::regcache`): the same user buffer registered
//! on many connections is one memory region, referenced by each registration ([`Pin`]) and
//! deregistered with the last.
//!
//! Registrations cover whole pages (the kernel pins pages anyway). A DMA-BUF registration is
//! cached only when its range is page-aligned (widening it would move its offset in the DMA-BUF).

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::context::Context;
use super::memory::{MemoryRegion, ProtectionDomain};
use super::types::Access;
use crate::config::RelaxedOrdering;
use crate::error::{Error, Result};
use crate::sync::lock;
use crate::transport::regcache::{CacheKey, Inserted, RegCache, RegKind};

/// A device's shared protection domain and registration cache. See the module docs.
pub struct Domain {
    pd: Arc<ProtectionDomain>,
    cache: Mutex<RegCache<Arc<MemoryRegion>>>,
    /// Bytes of the regions held outside the cache (past its bounds, or unaligned DMA-BUFs).
    uncached: AtomicU64,
    relaxed: RelaxedOrdering,
}

impl std::fmt::Debug for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domain")
            .field("device", &self.pd.context().name())
            .finish()
    }
}

/// One registration's reference to a memory region of a [`Domain`]; dropping it releases the
/// reference (the region is deregistered with the last one).
pub struct Pin {
    mr: Arc<MemoryRegion>,
    /// `None`: not cached (past the cache's bounds, or an unaligned DMA-BUF): this pin owns the
    /// region alone.
    key: Option<CacheKey>,
    domain: Arc<Domain>,
}

impl Pin {
    /// The region's local and remote keys.
    pub fn keys(&self) -> (u32, u32) {
        (self.mr.lkey(), self.mr.rkey())
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let Some(key) = self.key else {
            // This pin owned its region alone: it is deregistered with the pin.
            let n = self.mr.len() as u64;
            let _ = self
                .domain
                .uncached
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(n))
                });
            return;
        };
        // The last reference hands the region back; it is deregistered after the lock is left.
        let last = match lock(&self.domain.cache, "registration cache") {
            Ok(mut c) => c.release(&key).ok().flatten(),
            Err(_) => None,
        };
        drop(last);
    }
}

/// Access of data memory: RDMA, with PCIe relaxed ordering or without.
fn data_access(relaxed: bool) -> Access {
    if relaxed {
        Access::RDMA | Access::RELAXED_ORDERING
    } else {
        Access::RDMA
    }
}

/// Whether each try of a data registration asks for relaxed ordering, in order
/// (`NCCL_IB_PCI_RELAXED_ORDERING`): `2` tries with it, then without it (an old library or device
/// may refuse the flag); `1` only with it; `0` only without it.
pub fn relaxed_tries(mode: RelaxedOrdering) -> &'static [bool] {
    match mode {
        RelaxedOrdering::Auto => &[true, false],
        RelaxedOrdering::On => &[true],
        RelaxedOrdering::Off => &[false],
    }
}

/// Runs `reg` with each access [`relaxed_tries`] gives until one succeeds; the last error otherwise
/// (with `1`, naming the knob).
fn register_with<T>(mode: RelaxedOrdering, mut reg: impl FnMut(Access) -> Result<T>) -> Result<T> {
    let mut last = None;
    for &relaxed in relaxed_tries(mode) {
        match reg(data_access(relaxed)) {
            Ok(m) => return Ok(m),
            Err(e) => last = Some(e),
        }
    }
    let e = last.unwrap_or_else(|| Error::Internal("no registration was tried".into()));
    Err(match mode {
        RelaxedOrdering::On => e.context(
            "registration with PCIe relaxed ordering (NCCL_IB_PCI_RELAXED_ORDERING=1; 2 falls back \
             without it)",
        ),
        _ => e,
    })
}

impl Domain {
    /// Allocates the device's protection domain; data registrations use relaxed ordering as
    /// `relaxed` says.
    pub fn new(ctx: &Arc<Context>, relaxed: RelaxedOrdering) -> Result<Arc<Domain>> {
        Ok(Arc::new(Domain {
            pd: ProtectionDomain::new(ctx)?,
            cache: Mutex::new(RegCache::default()),
            uncached: AtomicU64::new(0),
            relaxed,
        }))
    }

    /// The protection domain (QPs of every connection on the device are created in it).
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The opened device.
    pub fn context(&self) -> &Arc<Context> {
        self.pd.context()
    }

    /// Registers `[addr, addr+len)` of host or GPU (peer-memory) memory: a cache hit takes a
    /// reference; a miss registers the whole pages (outside the cache's lock), with relaxed
    /// ordering as [`relaxed_tries`] says, and files the region.
    ///
    /// # Safety
    /// The pages holding `addr..addr+len` must stay mapped until the returned [`Pin`] (and every
    /// other pin of the same pages) is dropped: the NIC reads and writes them by DMA.
    pub unsafe fn register(self: &Arc<Self>, addr: u64, len: usize, kind: RegKind) -> Result<Pin> {
        let key = CacheKey::new(self.key_dev(), addr, len as u64, kind)?;
        if let Some(mr) = lock(&self.cache, "registration cache")?.acquire(&key) {
            return Ok(self.pin(mr, Some(key)));
        }
        let (start, bytes) = (key.start as *mut u8, key.bytes() as usize);
        let mr = register_with(self.relaxed, |access| {
            // SAFETY: the caller keeps the pages of the range mapped while a pin of them lives;
            // the whole pages are mapped when any byte in them is.
            unsafe { MemoryRegion::register(&self.pd, start, bytes, access) }
        })?;
        Ok(self.file(key, Arc::new(mr)))
    }

    /// Registers `len` bytes at `offset` of a DMA-BUF, addressed as `addr` (`ibv_reg_dmabuf_mr`),
    /// with relaxed ordering as for host memory; cached when the range is page-aligned.
    pub fn register_dmabuf(
        self: &Arc<Self>,
        addr: u64,
        len: usize,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<Pin> {
        let key = CacheKey::new(self.key_dev(), addr, len as u64, RegKind::Dmabuf)?;
        let aligned = key.start == addr && key.bytes() == len as u64;
        if aligned {
            if let Some(mr) = lock(&self.cache, "registration cache")?.acquire(&key) {
                return Ok(self.pin(mr, Some(key)));
            }
        }
        let mr = register_with(self.relaxed, |access| {
            MemoryRegion::register_dmabuf(&self.pd, offset, len, addr, fd, access)
        })?;
        let mr = Arc::new(mr);
        Ok(if aligned {
            self.file(key, mr)
        } else {
            self.pin(mr, None)
        })
    }

    /// The device's part of a cache key: the domain's address, unique while it lives (and its
    /// cache lives in it).
    fn key_dev(self: &Arc<Self>) -> u64 {
        Arc::as_ptr(self) as usize as u64
    }

    /// Bytes of data memory the device holds registered now: each cached region's whole pages
    /// once, however many registrations share it, plus the regions kept outside the cache
    /// (control memory, registered per connection outside the domain, is not counted).
    pub fn pinned_bytes(&self) -> u64 {
        let cached = lock(&self.cache, "registration cache").map_or(0, |c| c.stats().bytes);
        cached.saturating_add(self.uncached.load(Ordering::Relaxed))
    }

    fn pin(self: &Arc<Self>, mr: Arc<MemoryRegion>, key: Option<CacheKey>) -> Pin {
        if key.is_none() {
            self.uncached.fetch_add(mr.len() as u64, Ordering::Relaxed);
        }
        Pin {
            mr,
            key,
            domain: Arc::clone(self),
        }
    }

    /// Files a fresh region; a racing registration of the same pages wins and ours is released.
    fn file(self: &Arc<Self>, key: CacheKey, mr: Arc<MemoryRegion>) -> Pin {
        let res = match lock(&self.cache, "registration cache") {
            Ok(mut c) => c.insert(key, mr),
            Err(_) => Inserted::Uncached(mr),
        };
        match res {
            Inserted::Filed(mr) => self.pin(mr, Some(key)),
            Inserted::Raced { shared, unused } => {
                drop(unused);
                self.pin(shared, Some(key))
            }
            Inserted::Uncached(mr) => self.pin(mr, None),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn relaxed_ordering_tries_follow_the_knob() {
        assert_eq!(relaxed_tries(RelaxedOrdering::Auto), &[true, false]);
        assert_eq!(relaxed_tries(RelaxedOrdering::On), &[true]);
        assert_eq!(relaxed_tries(RelaxedOrdering::Off), &[false]);
        let relaxed = Access::RDMA | Access::RELAXED_ORDERING;
        // A device that refuses the flag: 2 falls back, 1 fails naming the knob, 0 never asks.
        let refuses = |mode| {
            let mut seen = Vec::new();
            let r = register_with(mode, |a| {
                seen.push(a);
                if a == relaxed {
                    Err(Error::System("ibv_reg_mr: Invalid argument".into()))
                } else {
                    Ok(())
                }
            });
            (r, seen)
        };
        let (r, seen) = refuses(RelaxedOrdering::Auto);
        assert_eq!((r, seen), (Ok(()), vec![relaxed, Access::RDMA]));
        let (r, seen) = refuses(RelaxedOrdering::On);
        assert_eq!(seen, vec![relaxed]);
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("NCCL_IB_PCI_RELAXED_ORDERING=1") && e.contains("Invalid argument"),
            "{e}"
        );
        let (r, seen) = refuses(RelaxedOrdering::Off);
        assert_eq!((r, seen), (Ok(()), vec![Access::RDMA]));
        // A device that takes it: one try, with it, for 1 and 2.
        for mode in [RelaxedOrdering::Auto, RelaxedOrdering::On] {
            let mut seen = Vec::new();
            register_with(mode, |a| {
                seen.push(a);
                Ok(())
            })
            .unwrap();
            assert_eq!(seen, vec![relaxed]);
        }
    }
}
