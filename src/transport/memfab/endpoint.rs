//! One endpoint of the in-memory fabric: the [`Fabric`] calls the protocol makes, each under the
//! fabric's lock.
#![forbid(unsafe_code)]

use super::*;

impl MemEndpoint {
    /// This endpoint's id (for fault injection).
    pub fn id(&self) -> EpId {
        EpId(self.id)
    }

    fn check_path(&self, path: usize) -> Result<()> {
        if path < self.paths.len() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "memfab path {path}; this endpoint has paths 0..{}",
                self.paths.len()
            )))
        }
    }

    fn post(&mut self, path: usize, op: Op) -> Result<()> {
        self.check_path(path)?;
        let mut g = lock(&self.inner, LOCK)?;
        g.eps[self.id].qps[path].queue.push_back(op);
        if !g.reorder {
            g.run_queue(self.id, path);
        }
        Ok(())
    }
}

impl Fabric for MemEndpoint {
    fn paths(&self) -> &[PathInfo] {
        &self.paths
    }

    /// `mem`'s address is a memfab address (a [`Lent::simulated`] one from [`MemFab::alloc`]);
    /// one outside the allocated regions is refused.
    fn register(&mut self, mem: &Lent, kind: MemKind) -> Result<Registration> {
        self.pinner_of().pin(mem.addr(), mem.len(), kind)
    }

    /// Memfab has no GPUs: a DMA-BUF registration is checked like [`Fabric::register`] of `mem`
    /// (the fd must be open during the call; it is not read).
    fn register_dmabuf(
        &mut self,
        mem: &Lent,
        _offset: u64,
        _fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<Registration> {
        self.register(mem, MemKind::Cuda)
    }

    fn deregister(&mut self, reg: &Registration) -> Result<()> {
        self.pinner_of().unpin(reg)
    }

    fn pinner(&self) -> Option<Arc<dyn Pinner>> {
        Some(Arc::new(self.pinner_of()))
    }

    /// Only on a device of its own: a shared device's cached pin serves every path at once.
    fn defer_paths(&mut self, paths: &[usize]) {
        let Ok(mut g) = lock(&self.inner, LOCK) else {
            return;
        };
        let ep = &mut g.eps[self.id];
        if ep.dev.is_some() {
            return;
        }
        let n = ep.roles.len();
        let lazy = ep.lazy.get_or_insert_with(Box::default);
        for &p in paths.iter().filter(|&&p| p < 32 && p < n) {
            lazy.deferred |= 1 << p;
        }
    }

    /// Keys every live data registration on `path` (under the fabric's lock, which a concurrent
    /// pin takes to file its registration: it sees `path` deferred and is keyed here, or sees it
    /// active and is keyed there).
    fn activate_path(&mut self, path: usize) -> Result<()> {
        self.check_path(path)?;
        let mut g = lock(&self.inner, LOCK)?;
        let bit = 1u32 << path.min(31);
        let ranges: Vec<(u64, (usize, usize, usize))> = match g.eps[self.id].lazy.as_mut() {
            Some(l) if l.deferred & bit != 0 => {
                l.deferred &= !bit;
                l.ranges.iter().map(|(t, r)| (*t, *r)).collect()
            }
            _ => return Ok(()),
        };
        for (token, (r, start, len)) in ranges {
            let mut all = Vec::with_capacity(2);
            let pk = g.key_path(self.id, path, r, start, len, &mut all);
            let ep = &mut g.eps[self.id];
            if let Some(l) = ep.lazy.as_mut() {
                l.late_keys.insert((token, path), pk);
            }
            if let Some(v) = ep.regs.get_mut(&token) {
                v.extend(all);
            }
            g.stats.pins += 1;
        }
        Ok(())
    }

    fn keys_on(&self, reg: &Registration, path: usize) -> Option<PathKeys> {
        if reg.has(path) {
            return Some(reg.keys[path]);
        }
        let g = lock(&self.inner, LOCK).ok()?;
        g.eps[self.id]
            .lazy
            .as_ref()?
            .late_keys
            .get(&(reg.token, path))
            .copied()
    }

    fn alloc_ctrl(&mut self, words: usize) -> Result<CtrlMem> {
        let mut g = lock(&self.inner, LOCK)?;
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
        let mut g = lock(&self.inner, LOCK)?;
        let (r, _) = split_addr(mem.addr);
        if let Some(reg) = g.regions.get_mut(r) {
            reg.words = AtomicWords::new(0);
            reg.len = 0;
        }
        Ok(())
    }

    fn ctrl_load(&self, addr: u64, order: Ordering) -> Result<u64> {
        let g = lock(&self.inner, LOCK)?;
        let (r, off) = g.region_range(addr, 8)?;
        if off % 8 != 0 {
            return Err(Error::Internal(format!("unaligned control word {addr:#x}")));
        }
        Ok(g.regions[r].words.words()[off / 8].load(order))
    }

    fn ctrl_store(&self, addr: u64, value: u64, order: Ordering) -> Result<()> {
        let g = lock(&self.inner, LOCK)?;
        let (r, off) = g.region_range(addr, 8)?;
        if off % 8 != 0 {
            return Err(Error::Internal(format!("unaligned control word {addr:#x}")));
        }
        g.regions[r].words.words()[off / 8].store(value, order);
        Ok(())
    }

    fn ctrl_read(&self, addr: u64, out: &mut [u64]) -> Result<()> {
        let g = lock(&self.inner, LOCK)?;
        let (r, off) = g.region_range(addr, 8 * out.len())?;
        if off % 8 != 0 {
            return Err(Error::Internal(format!("unaligned control word {addr:#x}")));
        }
        for (w, src) in out.iter_mut().zip(&g.regions[r].words.words()[off / 8..]) {
            *w = src.load(Ordering::Relaxed);
        }
        Ok(())
    }

    fn ctrl_write(&self, addr: u64, words: &[u64]) -> Result<()> {
        let g = lock(&self.inner, LOCK)?;
        let (r, off) = g.region_range(addr, 8 * words.len())?;
        if off % 8 != 0 {
            return Err(Error::Internal(format!("unaligned control word {addr:#x}")));
        }
        for (dst, &w) in g.regions[r].words.words()[off / 8..].iter().zip(words) {
            dst.store(w, Ordering::Relaxed);
        }
        Ok(())
    }

    fn post_write(&mut self, path: usize, wr: &WriteWr) -> Result<()> {
        self.post(path, Op::Write(*wr))
    }

    fn post_writes(&mut self, path: usize, wrs: &[WriteWr]) -> Result<()> {
        self.check_path(path)?;
        let mut g = lock(&self.inner, LOCK)?;
        g.stats.batches += 1;
        for wr in wrs {
            g.eps[self.id].qps[path].queue.push_back(Op::Write(*wr));
        }
        if !g.reorder {
            g.run_queue(self.id, path);
        }
        Ok(())
    }

    fn post_read(&mut self, path: usize, wr: &ReadWr) -> Result<()> {
        if self
            .paths
            .get(path)
            .is_some_and(|p| p.role == PathRole::Loopback)
        {
            self.prepare_flush()?;
        }
        self.post(path, Op::Read(*wr))
    }

    /// Loopback path `j` is device `j`; data path `i` is on device `i % loopbacks` (all on device
    /// 0 without loopbacks).
    fn path_device(&self, path: usize) -> usize {
        let loops: Vec<usize> = (0..self.paths.len())
            .filter(|&p| self.paths[p].role == PathRole::Loopback)
            .collect();
        match loops.iter().position(|&p| p == path) {
            Some(j) => j,
            None if loops.is_empty() => 0,
            None => path % loops.len(),
        }
    }

    fn prepare_flush(&mut self) -> Result<()> {
        let loops = self.paths.iter().any(|p| p.role == PathRole::Loopback);
        if loops && !self.flush_ready {
            lock(&self.inner, LOCK)?.stats.flush_preps += 1;
            self.flush_ready = true;
        }
        Ok(())
    }

    fn post_recv(&mut self, path: usize, wr_id: u64) -> Result<()> {
        self.check_path(path)?;
        let mut g = lock(&self.inner, LOCK)?;
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
        let mut g = lock(&self.inner, LOCK)?;
        if g.reorder {
            g.deliver_some();
        }
        let q = &mut g.eps[self.id].qps[path];
        let n = max.min(q.cq.len());
        out.extend(q.cq.drain(..n));
        Ok(n)
    }

    fn path_note(&self, path: usize) -> Option<String> {
        let g = lock(&self.inner, LOCK).ok()?;
        g.eps[self.id].qps.get(path).and_then(|q| q.note.clone())
    }

    fn health(&mut self) -> Result<()> {
        let mut g = lock(&self.inner, LOCK)?;
        g.stats.health_calls += 1;
        match &g.eps[self.id].health_error {
            Some(e) => Err(Error::System(e.clone())),
            None => Ok(()),
        }
    }

    fn path_health(&mut self, path: usize) -> Result<()> {
        let mut g = lock(&self.inner, LOCK)?;
        g.stats.path_health_calls += 1;
        match g.eps[self.id].qps.get(path) {
            Some(q) if q.carrier_down => Err(Error::System(format!(
                "memfab ep{} path{path}: the cable is out",
                self.id
            ))),
            _ => Ok(()),
        }
    }

    /// A fresh queue pair once the cable is back (queues and completions of the old one are gone);
    /// ready once the peer's end is rebuilt and was asked again after posting its receives.
    fn revive_path(&mut self, path: usize) -> Result<Revive> {
        self.check_path(path)?;
        let mut g = lock(&self.inner, LOCK)?;
        let peer = g.target_of(self.id, path);
        let q = &mut g.eps[self.id].qps[path];
        if q.carrier_down {
            return Ok(Revive::Down);
        }
        if q.error {
            q.error = false;
            q.sealed = false;
            q.init = true;
            q.fault = None;
            q.queue.clear();
            q.cq.clear();
            q.recvs.clear();
            return Ok(Revive::Rebuilt);
        }
        q.init = false;
        let p = &g.eps[peer].qps[path];
        Ok(if p.error || p.init {
            Revive::Pending
        } else {
            Revive::Ready
        })
    }

    fn shutdown(&mut self) -> Result<()> {
        let mut g = lock(&self.inner, LOCK)?;
        for path in 0..g.eps[self.id].qps.len() {
            g.kill_qp(self.id, path);
        }
        Ok(())
    }

    /// Moves this end's queue pair of `path` to the error state (and seals it, as verbs does).
    fn stop_path(&mut self, path: usize) -> Result<()> {
        self.check_path(path)?;
        lock(&self.inner, LOCK)?.kill_qp(self.id, path);
        Ok(())
    }

    /// This end's queue pair of `path` in the error state: nothing lands any more, and every
    /// completion of what did is queued (receives flushed after it).
    fn seal_path(&mut self, path: usize) -> Result<bool> {
        self.check_path(path)?;
        let mut g = lock(&self.inner, LOCK)?;
        if !g.eps[self.id].qps[path].sealed {
            g.kill_qp(self.id, path);
        }
        Ok(true)
    }
}
