//! [`ModelEndpoint`]'s side of the model fabric: the [`Fabric`] calls (registration, posting, polling,
//! control memory) on the shared state of [`super`], and what dropping an endpoint releases.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use super::{Inner, ModelEndpoint, lock, split_addr};
use crate::error::{Error, Result};
use crate::sys::rawmem::Lent;
use crate::transport::fabric::{
    Completion, CtrlMem, Fabric, MemKind, PathInfo, ReadWr, Registration, WcOpcode, WcStatus,
    WriteWr,
};

impl Drop for ModelEndpoint {
    fn drop(&mut self) {
        let Ok(mut g) = lock(&self.inner) else {
            return;
        };
        let Some(ep) = g.eps.get_mut(self.id) else {
            return;
        };
        ep.gone = true;
        let regs = std::mem::take(&mut ep.regs);
        for q in ep.qps.iter_mut() {
            q.error = true;
            q.pending.clear();
            q.cq.clear();
            q.recvs.clear();
        }
        for key in regs.into_values().flatten() {
            g.keys.remove(&key);
        }
    }
}

impl ModelEndpoint {
    fn check_path(&self, path: usize) -> Result<()> {
        if path < self.paths.len() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "model fabric path {path}; this endpoint has paths 0..{}",
                self.paths.len()
            )))
        }
    }

    fn ctrl_word(g: &Inner, addr: u64, words: usize) -> Result<(usize, usize)> {
        let (r, off) = g.region_range(addr, 8 * words)?;
        if off % 8 != 0 || g.regions[r].bytes.is_none() {
            return Err(Error::Internal(format!(
                "control word {addr:#x} is unaligned or not in memory with backing store"
            )));
        }
        Ok((r, off))
    }
}

fn load(bytes: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&bytes[off..off + 8]);
    u64::from_le_bytes(a)
}

impl Fabric for ModelEndpoint {
    fn paths(&self) -> &[PathInfo] {
        &self.paths
    }

    /// `mem`'s address is a model-fabric address ([`Lent::simulated`]).
    fn register(&mut self, mem: &Lent, _kind: MemKind) -> Result<Registration> {
        let mut g = lock(&self.inner)?;
        let (r, off) = g.region_range(mem.addr(), mem.len())?;
        Ok(g.register(self.id, r, off, mem.len()))
    }

    fn deregister(&mut self, reg: &Registration) -> Result<()> {
        let mut g = lock(&self.inner)?;
        let Some(keys) = g.eps[self.id].regs.remove(&reg.token) else {
            return Err(Error::InvalidArgument(format!(
                "deregistration of unknown model fabric registration {}",
                reg.token
            )));
        };
        for k in keys {
            g.keys.remove(&k);
        }
        Ok(())
    }

    fn alloc_ctrl(&mut self, words: usize) -> Result<CtrlMem> {
        let mut g = lock(&self.inner)?;
        let r = g.alloc_region(words * 8, true)?;
        let reg = g.register(self.id, r, 0, words * 8);
        Ok(CtrlMem {
            addr: ((r as u64) + 1) << 32,
            words,
            reg,
        })
    }

    fn free_ctrl(&mut self, mem: &CtrlMem) -> Result<()> {
        self.deregister(&mem.reg)?;
        let mut g = lock(&self.inner)?;
        let (r, _) = split_addr(mem.addr);
        if let Some(reg) = g.regions.get_mut(r).filter(|reg| reg.ctrl) {
            reg.bytes = Some(Vec::new());
            reg.len = 0;
        }
        Ok(())
    }

    // The clock does not move while callers run, so no ordering is needed beyond the lock's.
    fn ctrl_load(&self, addr: u64, _order: Ordering) -> Result<u64> {
        let g = lock(&self.inner)?;
        let (r, off) = Self::ctrl_word(&g, addr, 1)?;
        Ok(g.regions[r].bytes.as_deref().map_or(0, |b| load(b, off)))
    }

    fn ctrl_store(&self, addr: u64, value: u64, _order: Ordering) -> Result<()> {
        self.ctrl_write(addr, &[value])
    }

    fn ctrl_read(&self, addr: u64, out: &mut [u64]) -> Result<()> {
        let g = lock(&self.inner)?;
        let (r, off) = Self::ctrl_word(&g, addr, out.len())?;
        if let Some(b) = g.regions[r].bytes.as_deref() {
            for (i, w) in out.iter_mut().enumerate() {
                *w = load(b, off + 8 * i);
            }
        }
        Ok(())
    }

    fn ctrl_write(&self, addr: u64, words: &[u64]) -> Result<()> {
        let mut g = lock(&self.inner)?;
        let (r, off) = Self::ctrl_word(&g, addr, words.len())?;
        if let Some(b) = g.regions[r].bytes.as_mut() {
            for (i, w) in words.iter().enumerate() {
                b[off + 8 * i..off + 8 * i + 8].copy_from_slice(&w.to_le_bytes());
            }
        }
        Ok(())
    }

    fn post_write(&mut self, path: usize, wr: &WriteWr) -> Result<()> {
        self.post_writes(path, std::slice::from_ref(wr))
    }

    fn post_writes(&mut self, path: usize, wrs: &[WriteWr]) -> Result<()> {
        self.check_path(path)?;
        let mut g = lock(&self.inner)?;
        g.eps[self.id].qps[path].pending.extend(wrs.iter().copied());
        Ok(())
    }

    fn post_read(&mut self, path: usize, _wr: &ReadWr) -> Result<()> {
        Err(Error::InvalidArgument(format!(
            "RDMA read on model fabric path {path}: the model has no loopback paths (host memory only)"
        )))
    }

    fn post_recv(&mut self, path: usize, wr_id: u64) -> Result<()> {
        self.check_path(path)?;
        let mut g = lock(&self.inner)?;
        let q = &mut g.eps[self.id].qps[path];
        if q.error {
            q.cq.push_back(Completion::without_data(
                wr_id,
                WcStatus::WR_FLUSH_ERR,
                WcOpcode::RecvRdmaWithImm,
            ));
        } else {
            q.recvs.push_back(wr_id);
        }
        Ok(())
    }

    fn poll(&mut self, path: usize, max: usize, out: &mut Vec<Completion>) -> Result<usize> {
        self.check_path(path)?;
        let mut g = lock(&self.inner)?;
        let q = &mut g.eps[self.id].qps[path];
        let n = max.min(q.cq.len());
        out.extend(q.cq.drain(..n));
        Ok(n)
    }

    /// The queue pair to the error state: queued work and posted receives flush, and what
    /// arrives for it later fails (a verbs QP in the error state; this also seals it).
    fn stop_path(&mut self, path: usize) -> Result<()> {
        self.check_path(path)?;
        let mut g = lock(&self.inner)?;
        g.kill_end(self.id, path);
        Ok(())
    }

    fn seal_path(&mut self, path: usize) -> Result<bool> {
        self.stop_path(path)?;
        Ok(true)
    }

    fn shutdown(&mut self) -> Result<()> {
        let mut g = lock(&self.inner)?;
        let ep = &mut g.eps[self.id];
        for q in ep.qps.iter_mut() {
            q.error = true;
            while let Some(w) = q.pending.pop_front() {
                q.cq.push_back(Completion::without_data(
                    w.wr_id,
                    WcStatus::WR_FLUSH_ERR,
                    WcOpcode::RdmaWrite,
                ));
            }
            while let Some(wr_id) = q.recvs.pop_front() {
                q.cq.push_back(Completion::without_data(
                    wr_id,
                    WcStatus::WR_FLUSH_ERR,
                    WcOpcode::RecvRdmaWithImm,
                ));
            }
        }
        Ok(())
    }
}
