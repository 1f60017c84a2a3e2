//! A ref-counted registration cache: one pin per (device, page-aligned range, kind), shared by every
//! connection of the process that registers the same buffer on that device.
//!
//! NCCL registers one user buffer once per connection (per peer); without a cache each
//! registration pins the pages again (N× the time, N× the locked-memory accounting). The fabrics
//! (verbs, memfab) key their device-level registrations here: [`RegCache::acquire`] finds an entry
//! and takes a reference, [`RegCache::insert`] files a fresh pin, [`RegCache::release`] drops a
//! reference and hands the pin back with the last one so the caller frees it (outside its lock).
//! Pure bookkeeping: it never pins or frees anything itself.
//!
//! Bounds: at most [`CacheLimits::max_entries`] entries and [`CacheLimits::max_bytes`] bytes; a pin
//! that would exceed them is not cached (the caller keeps it for its one registration, as without
//! a cache), so a bound changes sharing, never whether a registration works.
#![forbid(unsafe_code)]

use std::collections::HashMap;

use crate::error::{Error, Result};

/// Granularity of pinning on 4 KiB-page systems (tests); the cache uses the system's page size
/// ([`crate::sys::page_size`]: 64 KiB on some AArch64 kernels).
pub const PAGE: u64 = 4096;

/// What kind of memory a cached pin covers (a host pin cannot serve a GPU registration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegKind {
    /// Host memory (`ibv_reg_mr`).
    Host,
    /// GPU memory through peer memory (`ibv_reg_mr` of a CUDA pointer).
    Cuda,
    /// GPU memory exported as a DMA-BUF (`ibv_reg_dmabuf_mr`).
    Dmabuf,
}

/// The key of one cached pin: the device it is registered on and the page range it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// The device (verbs: the protection domain's device; memfab: the simulated device).
    pub dev: u64,
    /// First byte, rounded down to a page ([`crate::sys::page_size`]).
    pub start: u64,
    /// One past the last byte, rounded up to a page.
    pub end: u64,
    /// Host, CUDA or DMA-BUF.
    pub kind: RegKind,
}

impl CacheKey {
    /// The key of `[addr, addr+len)` on `dev`: the range widened to whole pages. Fails for an empty
    /// range or one that wraps the address space.
    pub fn new(dev: u64, addr: u64, len: u64, kind: RegKind) -> Result<CacheKey> {
        Self::with_page(dev, addr, len, kind, crate::sys::page_size())
    }

    /// [`CacheKey::new`] with pages of `page` bytes (a power of two).
    pub fn with_page(dev: u64, addr: u64, len: u64, kind: RegKind, page: u64) -> Result<CacheKey> {
        let last = len
            .checked_sub(1)
            .and_then(|l| addr.checked_add(l))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "registration {addr:#x}+{len} bytes is empty or wraps the address space"
                ))
            })?;
        let start = addr & !(page - 1);
        let end = (last | (page - 1)).checked_add(1).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "registration {addr:#x}+{len} bytes reaches the last page of the address space"
            ))
        })?;
        Ok(CacheKey {
            dev,
            start,
            end,
            kind,
        })
    }

    /// Bytes the pin covers (whole pages).
    pub fn bytes(&self) -> u64 {
        self.end - self.start
    }
}

/// Bounds of a [`RegCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    /// Entries (distinct pins) at most.
    pub max_entries: usize,
    /// Bytes covered by all entries together at most.
    pub max_bytes: u64,
}

impl Default for CacheLimits {
    /// 65,536 entries and 16 TiB: far above what NCCL registers (a few buffers per communicator),
    /// so only a runaway caller meets them.
    fn default() -> Self {
        CacheLimits {
            max_entries: 1 << 16,
            max_bytes: 16 << 40,
        }
    }
}

/// Counters of a [`RegCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Entries now.
    pub entries: usize,
    /// Bytes covered by the entries now.
    pub bytes: u64,
    /// Registrations served by an existing entry.
    pub hits: u64,
    /// Pins filed as new entries.
    pub inserts: u64,
    /// Pins not cached because a bound was reached.
    pub refused: u64,
}

/// What [`RegCache::insert`] did with a fresh pin.
#[derive(Debug, PartialEq, Eq)]
pub enum Inserted<V> {
    /// Filed with one reference; the caller uses it.
    Filed(V),
    /// Another caller filed the same key meanwhile: use `shared` (a reference was taken) and free
    /// `unused`, the caller's own pin.
    Raced {
        /// The entry's pin (referenced for the caller).
        shared: V,
        /// The caller's pin, not filed: free it.
        unused: V,
    },
    /// A bound was reached: not cached. The caller keeps the pin for its one registration and
    /// frees it itself (not through [`RegCache::release`]).
    Uncached(V),
}

struct Entry<V> {
    pin: V,
    refs: u64,
}

/// The cache. See the module docs. `V` is the device-level pin (verbs: an `Arc` of the memory
/// region; memfab: its keys); it is cloned to each user.
pub struct RegCache<V: Clone> {
    map: HashMap<CacheKey, Entry<V>>,
    limits: CacheLimits,
    stats: CacheStats,
}

impl<V: Clone> std::fmt::Debug for RegCache<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegCache")
            .field("limits", &self.limits)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<V: Clone> Default for RegCache<V> {
    fn default() -> Self {
        RegCache::new(CacheLimits::default())
    }
}

impl<V: Clone> RegCache<V> {
    /// An empty cache with these bounds.
    pub fn new(limits: CacheLimits) -> RegCache<V> {
        RegCache {
            map: HashMap::new(),
            limits,
            stats: CacheStats::default(),
        }
    }

    /// The entry for `key`, with a reference taken for the caller; `None`: pin, then
    /// [`Self::insert`].
    pub fn acquire(&mut self, key: &CacheKey) -> Option<V> {
        let e = self.map.get_mut(key)?;
        e.refs = e.refs.saturating_add(1);
        self.stats.hits += 1;
        Some(e.pin.clone())
    }

    /// Files a fresh pin of `key` (made without the cache's lock, after [`Self::acquire`] missed).
    pub fn insert(&mut self, key: CacheKey, pin: V) -> Inserted<V> {
        if let Some(e) = self.map.get_mut(&key) {
            e.refs = e.refs.saturating_add(1);
            self.stats.hits += 1;
            return Inserted::Raced {
                shared: e.pin.clone(),
                unused: pin,
            };
        }
        let bytes = self.stats.bytes.saturating_add(key.bytes());
        if self.map.len() >= self.limits.max_entries || bytes > self.limits.max_bytes {
            self.stats.refused += 1;
            return Inserted::Uncached(pin);
        }
        self.map.insert(
            key,
            Entry {
                pin: pin.clone(),
                refs: 1,
            },
        );
        self.stats.bytes = bytes;
        self.stats.entries = self.map.len();
        self.stats.inserts += 1;
        Inserted::Filed(pin)
    }

    /// Drops one reference to `key`; the pin with the last one (the caller frees it), else `None`.
    /// An unknown key is an error (a double release).
    pub fn release(&mut self, key: &CacheKey) -> Result<Option<V>> {
        let e = self.map.get_mut(key).ok_or_else(|| {
            Error::Internal(format!(
                "release of registration {:#x}..{:#x} on device {}, which is not cached",
                key.start, key.end, key.dev
            ))
        })?;
        e.refs -= 1;
        if e.refs > 0 {
            return Ok(None);
        }
        let pin = self.map.remove(key).map(|e| e.pin);
        self.stats.bytes = self.stats.bytes.saturating_sub(key.bytes());
        self.stats.entries = self.map.len();
        Ok(pin)
    }

    /// References held on `key` (0: not cached).
    pub fn refs(&self, key: &CacheKey) -> u64 {
        self.map.get(key).map_or(0, |e| e.refs)
    }

    /// Every entry's key and pin (in no order): what a cache shared by several devices holds on
    /// one of them.
    pub fn pins(&self) -> impl Iterator<Item = (&CacheKey, &V)> {
        self.map.iter().map(|(k, e)| (k, &e.pin))
    }

    /// The counters.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cover_whole_pages() {
        let k = CacheKey::with_page(1, 0x1234, 10, RegKind::Host, PAGE).unwrap();
        assert_eq!((k.start, k.end, k.bytes()), (0x1000, 0x2000, 4096));
        let k = CacheKey::with_page(1, 0x1ff8, 16, RegKind::Host, PAGE).unwrap();
        assert_eq!((k.start, k.end), (0x1000, 0x3000), "straddles two pages");
        let k = CacheKey::with_page(1, 0x4000, 64 << 20, RegKind::Cuda, PAGE).unwrap();
        assert_eq!(k.bytes(), 64 << 20);
        assert!(CacheKey::with_page(1, 0x1000, 0, RegKind::Host, PAGE).is_err());
        assert!(CacheKey::with_page(1, u64::MAX - 10, 100, RegKind::Host, PAGE).is_err());
        assert!(CacheKey::with_page(1, u64::MAX - 10, 5, RegKind::Host, PAGE).is_err());
        // Two buffers in the same pages share a key; another device or kind does not.
        let a = CacheKey::with_page(1, 0x1000, 100, RegKind::Host, PAGE).unwrap();
        assert_eq!(
            a,
            CacheKey::with_page(1, 0x1800, 100, RegKind::Host, PAGE).unwrap()
        );
        assert_ne!(
            a,
            CacheKey::with_page(2, 0x1000, 100, RegKind::Host, PAGE).unwrap()
        );
        assert_ne!(
            a,
            CacheKey::with_page(1, 0x1000, 100, RegKind::Cuda, PAGE).unwrap()
        );
    }

    #[test]
    fn keys_follow_the_systems_page_size() {
        // 64 KiB pages (some AArch64 kernels): a range within one page is that whole page.
        let k = CacheKey::with_page(1, 0x1_2345, 10, RegKind::Dmabuf, 64 << 10).unwrap();
        assert_eq!((k.start, k.end), (0x1_0000, 0x2_0000));
        let sys = crate::sys::page_size();
        assert!(sys.is_power_of_two() && sys >= 4096, "{sys}");
        let k = CacheKey::new(1, sys + 1, 1, RegKind::Host).unwrap();
        assert_eq!((k.start, k.bytes()), (sys, sys));
    }

    #[test]
    fn eight_registrations_pin_once_and_the_last_release_frees() {
        let mut c: RegCache<u32> = RegCache::default();
        let k = CacheKey::with_page(7, 0x10_0000, 64 << 20, RegKind::Host, PAGE).unwrap();
        assert_eq!(c.acquire(&k), None);
        assert_eq!(c.insert(k, 42), Inserted::Filed(42));
        for _ in 1..8 {
            assert_eq!(c.acquire(&k), Some(42));
        }
        let s = c.stats();
        assert_eq!((s.entries, s.bytes, s.hits, s.inserts), (1, 64 << 20, 7, 1));
        assert_eq!(c.refs(&k), 8);
        for _ in 1..8 {
            assert_eq!(c.release(&k).unwrap(), None);
        }
        assert_eq!(c.release(&k).unwrap(), Some(42), "the last reference frees");
        assert_eq!((c.stats().entries, c.stats().bytes), (0, 0));
        assert!(c.release(&k).is_err(), "a double release is refused");
    }

    #[test]
    fn a_racing_pin_is_given_back_and_bounds_leave_pins_uncached() {
        let mut c: RegCache<u32> = RegCache::new(CacheLimits {
            max_entries: 2,
            max_bytes: 3 * PAGE,
        });
        let k1 = CacheKey::with_page(1, 0, 10, RegKind::Host, PAGE).unwrap();
        assert_eq!(c.insert(k1, 1), Inserted::Filed(1));
        assert_eq!(
            c.insert(k1, 2),
            Inserted::Raced {
                shared: 1,
                unused: 2
            }
        );
        assert_eq!(c.refs(&k1), 2);
        // Bytes: 1 page + 4 pages > 3 pages.
        let big = CacheKey::with_page(1, 0x10000, 4 * PAGE, RegKind::Host, PAGE).unwrap();
        assert_eq!(c.insert(big, 3), Inserted::Uncached(3));
        let k2 = CacheKey::with_page(1, 0x20000, 10, RegKind::Host, PAGE).unwrap();
        assert_eq!(c.insert(k2, 4), Inserted::Filed(4));
        // Entries: 2 already.
        let k3 = CacheKey::with_page(1, 0x30000, 10, RegKind::Host, PAGE).unwrap();
        assert_eq!(c.insert(k3, 5), Inserted::Uncached(5));
        assert_eq!(c.stats().refused, 2);
        assert_eq!(c.refs(&big), 0);
    }
}
