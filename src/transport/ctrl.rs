//! Memory that a software fabric writes on behalf of its peer: an array of `AtomicU64` words
//! ([`AtomicWords`]) that an RDMA write emulated by a thread fills byte by byte with release stores,
//! while the protocol loads the words with the ordering it asks for (as a CPU polling NIC-written
//! memory would). Used by [`super::memfab`] (every region) and [`super::tcp`] (control memory).
//! [`Span`] is the range check every fabric shares (it lives in `sys` because `RawRegion` needs it).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

pub use crate::sys::rawmem::Span;

/// Zeroed `AtomicU64` words addressed by byte offset. The words never move, so [`AtomicWords::addr`]
/// is stable for the block's life (the TCP fabric hands it to the protocol as the control-memory
/// address).
pub struct AtomicWords {
    words: Box<[AtomicU64]>,
}

impl std::fmt::Debug for AtomicWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AtomicWords({} bytes at {:#x})", self.len(), self.addr())
    }
}

impl AtomicWords {
    /// `words` zeroed words.
    pub fn new(words: usize) -> AtomicWords {
        AtomicWords {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The words, for word-sized loads and stores with an ordering of the caller's choice.
    pub fn words(&self) -> &[AtomicU64] {
        &self.words
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.words.len() * 8
    }

    /// Whether there are no words.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// The process address of the first word.
    pub fn addr(&self) -> u64 {
        self.words.as_ptr() as usize as u64
    }

    /// Whether the process addresses `[addr, addr+len)` lie inside the words.
    pub fn contains(&self, addr: u64, len: usize) -> bool {
        Span::new(self.addr(), self.len() as u64).contains(addr, len as u64)
    }

    /// The byte offset of process address `addr`. An address below the words wraps to a huge
    /// offset, which every accessor refuses.
    pub fn offset_of(&self, addr: u64) -> usize {
        addr.wrapping_sub(self.addr()) as usize
    }

    fn check(&self, off: usize, len: usize) -> Result<()> {
        if off.checked_add(len).is_some_and(|e| e <= self.len()) {
            Ok(())
        } else {
            Err(Error::Internal(format!(
                "{len} bytes at offset {off} of {} bytes of atomic words",
                self.len()
            )))
        }
    }

    /// Loads `out.len()` bytes from byte offset `off`, each word with `Acquire`.
    pub fn load_bytes(&self, off: usize, out: &mut [u8]) -> Result<()> {
        self.check(off, out.len())?;
        let mut pos = off;
        let mut i = 0;
        while i < out.len() {
            let (w, b) = (pos / 8, pos % 8);
            let n = (8 - b).min(out.len() - i);
            let word = self.words[w].load(Ordering::Acquire).to_le_bytes();
            out[i..i + n].copy_from_slice(&word[b..b + n]);
            pos += n;
            i += n;
        }
        Ok(())
    }

    /// Stores `data` at byte offset `off` with `Release`: whole words with a store, partial words
    /// with a compare-exchange that keeps their other bytes.
    pub fn store_bytes(&self, off: usize, data: &[u8]) -> Result<()> {
        self.check(off, data.len())?;
        let mut pos = off;
        let mut i = 0;
        while i < data.len() {
            let (w, b) = (pos / 8, pos % 8);
            let n = (8 - b).min(data.len() - i);
            let part = &data[i..i + n];
            if n == 8 {
                let mut a = [0u8; 8];
                a.copy_from_slice(part);
                self.words[w].store(u64::from_le_bytes(a), Ordering::Release);
            } else {
                // The closure always returns `Some`, so the update cannot fail.
                let _ = self.words[w].fetch_update(Ordering::Release, Ordering::Relaxed, |cur| {
                    let mut a = cur.to_le_bytes();
                    a[b..b + n].copy_from_slice(part);
                    Some(u64::from_le_bytes(a))
                });
            }
            pos += n;
            i += n;
        }
        Ok(())
    }

    /// Copies `len` bytes from `src` at `soff` to `dst` at `doff` (an RDMA write or read between
    /// two blocks). Word-aligned copies move whole words (`Relaxed` loads, `Release` stores);
    /// anything else goes through bytes.
    pub fn copy_words(
        src: &AtomicWords,
        soff: usize,
        dst: &AtomicWords,
        doff: usize,
        len: usize,
    ) -> Result<()> {
        src.check(soff, len)?;
        dst.check(doff, len)?;
        if soff % 8 == 0 && doff % 8 == 0 {
            let full = len / 8;
            for k in 0..full {
                let v = src.words[soff / 8 + k].load(Ordering::Relaxed);
                dst.words[doff / 8 + k].store(v, Ordering::Release);
            }
            let tail = len % 8;
            if tail > 0 {
                let mut t = [0u8; 8];
                src.load_bytes(soff + full * 8, &mut t[..tail])?;
                dst.store_bytes(doff + full * 8, &t[..tail])?;
            }
        } else {
            let mut tmp = vec![0u8; len];
            src.load_bytes(soff, &mut tmp)?;
            dst.store_bytes(doff, &tmp)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_at_any_alignment() {
        let words = AtomicWords::new(4);
        words
            .store_bytes(3, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
            .unwrap();
        let mut out = [0u8; 13];
        words.load_bytes(2, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0]);
        let dst = AtomicWords::new(4);
        AtomicWords::copy_words(&words, 3, &dst, 9, 11).unwrap();
        let mut out2 = [0u8; 11];
        dst.load_bytes(9, &mut out2).unwrap();
        assert_eq!(out2, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        AtomicWords::copy_words(&words, 0, &dst, 0, 13).unwrap();
        dst.load_bytes(0, &mut out).unwrap();
        assert_eq!(&out[3..13], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    }

    #[test]
    fn ranges_are_checked() {
        let w = AtomicWords::new(4);
        assert!(w.contains(w.addr(), 32));
        assert!(!w.contains(w.addr() + 1, 32));
        assert!(!w.contains(w.addr().wrapping_sub(1), 2));
        assert_eq!(w.offset_of(w.addr() + 9), 9);
        assert!(
            w.load_bytes(w.offset_of(w.addr() - 8), &mut [0; 1])
                .is_err()
        );
        assert!(w.store_bytes(30, &[0; 3]).is_err());
        assert!(w.load_bytes(usize::MAX, &mut [0; 2]).is_err());
        assert!(AtomicWords::copy_words(&w, 0, &w, 8, 32).is_err());
        assert_eq!(w.len(), 32);
        assert!(AtomicWords::new(0).is_empty());
    }
}
