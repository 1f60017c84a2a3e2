//! The NIC of the in-memory fabric: executes queued work requests (key checks, copies, completions,
//! faults) under the fabric's lock.
#![forbid(unsafe_code)]

use super::*;

impl Inner {
    pub(super) fn next_rand(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Checks that `key` (owned by endpoint `ep`, path `path`) covers `[addr, addr+len)`; returns
    /// (region, offset).
    pub(super) fn check_key(
        &self,
        key: u32,
        ep: usize,
        path: usize,
        addr: u64,
        len: usize,
    ) -> Option<(usize, usize)> {
        let k = self.keys.get(&key)?;
        let (region, off) = split_addr(addr);
        let owner = match k.dev {
            Some(d) => self.eps.get(ep).and_then(|e| e.dev) == Some(d),
            None => k.ep == ep && k.path == path,
        };
        let ok = owner
            && k.region == region
            && Span::new(k.start as u64, k.len as u64).contains(off as u64, len as u64);
        ok.then_some((region, off))
    }

    pub(super) fn register(
        &mut self,
        ep: usize,
        region: usize,
        start: usize,
        len: usize,
    ) -> Registration {
        self.register_on(ep, region, start, len, 0)
    }

    /// Whether region `r` is control memory.
    pub(super) fn is_ctrl(&self, r: usize) -> bool {
        self.regions.get(r).is_some_and(|x| x.ctrl)
    }

    /// One key pair for `(ep, path)` on `[start, start+len)` of `region`; its keys go to `all`.
    pub(super) fn key_path(
        &mut self,
        ep: usize,
        path: usize,
        region: usize,
        start: usize,
        len: usize,
        all: &mut Vec<u32>,
    ) -> PathKeys {
        let mut pk = PathKeys::default();
        for slot in [&mut pk.lkey, &mut pk.rkey] {
            self.next_key = self.next_key.wrapping_add(0x9e37).max(1);
            let key = self.next_key;
            self.keys.insert(
                key,
                Key {
                    dev: None,
                    ep,
                    path,
                    region,
                    start,
                    len,
                },
            );
            *slot = key;
            all.push(key);
        }
        pk
    }

    /// [`Self::register`] leaving the paths in `skip` (bit = path) without keys.
    pub(super) fn register_on(
        &mut self,
        ep: usize,
        region: usize,
        start: usize,
        len: usize,
        skip: u32,
    ) -> Registration {
        let npaths = self.eps[ep].roles.len();
        let mut keys = Vec::with_capacity(npaths);
        let mut all = Vec::with_capacity(2 * npaths);
        for path in 0..npaths {
            if path < 32 && skip & (1 << path) != 0 {
                keys.push(PathKeys::default());
                continue;
            }
            let pk = self.key_path(ep, path, region, start, len, &mut all);
            keys.push(pk);
        }
        self.next_token += 1;
        let token = self.next_token;
        self.eps[ep].regs.insert(token, all);
        Registration {
            keys,
            token,
            missing: skip & ((1u64 << npaths.min(32)) - 1) as u32,
        }
    }

    /// The whole pages of `key` within region `r`: (offset, length), cut at the region's end.
    pub(super) fn page_span(&self, r: usize, key: &CacheKey) -> (usize, usize) {
        let (_, start) = split_addr(key.start);
        let rlen = self.regions.get(r).map_or(0, |x| x.len);
        let end = (start as u64 + key.bytes()).min(rlen as u64) as usize;
        (start, end.saturating_sub(start))
    }

    /// A fresh key pair for a cached pin of `[start, start+len)` of region `r` on device `dev`.
    pub(super) fn cached_keys(
        &mut self,
        dev: u64,
        r: usize,
        start: usize,
        len: usize,
    ) -> CachedPin {
        let mut k = [0u32; 2];
        for slot in &mut k {
            self.next_key = self.next_key.wrapping_add(0x9e37).max(1);
            *slot = self.next_key;
            self.keys.insert(
                *slot,
                Key {
                    dev: Some(dev),
                    ep: usize::MAX,
                    path: usize::MAX,
                    region: r,
                    start,
                    len,
                },
            );
        }
        CachedPin {
            lkey: k[0],
            rkey: k[1],
            bytes: len as u64,
        }
    }

    /// Drops one reference to a cached pin; the last one removes its keys and pinned bytes.
    pub(super) fn release_cached(&mut self, key: &CacheKey) {
        if let Ok(Some(p)) = self.cache.release(key) {
            self.keys.remove(&p.lkey);
            self.keys.remove(&p.rkey);
            self.stats.pinned_bytes = self.stats.pinned_bytes.saturating_sub(p.bytes);
        }
        self.stats.cache = self.cache.stats();
    }

    pub(super) fn target_of(&self, ep: usize, path: usize) -> usize {
        match self.eps[ep].roles[path] {
            PathRole::Data => self.eps[ep].peer,
            PathRole::Loopback => ep,
        }
    }

    pub(super) fn complete(&mut self, ep: usize, path: usize, c: Completion) {
        self.eps[ep].qps[path].cq.push_back(c);
    }

    pub(super) fn fail(
        &mut self,
        ep: usize,
        path: usize,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
    ) {
        self.eps[ep].qps[path].error = true;
        self.complete(ep, path, Completion::without_data(wr_id, status, opcode));
    }

    /// Puts one end's queue pair in the error state and seals it: queued work and posted receives
    /// complete with `WR_FLUSH_ERR`, and nothing lands at this end any more (writes held on the
    /// wire for it are dropped).
    pub(super) fn kill_qp(&mut self, ep: usize, path: usize) {
        let q = &mut self.eps[ep].qps[path];
        q.error = true;
        q.sealed = true;
        q.init = false;
        while let Some(op) = q.queue.pop_front() {
            let (wr_id, opcode) = match op {
                Op::Write(w) => (w.wr_id, WcOpcode::RdmaWrite),
                Op::Read(r) => (r.wr_id, WcOpcode::RdmaRead),
            };
            q.cq.push_back(Completion::without_data(
                wr_id,
                WcStatus::WR_FLUSH_ERR,
                opcode,
            ));
        }
        while let Some(wr_id) = q.recvs.pop_front() {
            q.cq.push_back(Completion::without_data(
                wr_id,
                WcStatus::WR_FLUSH_ERR,
                WcOpcode::RecvRdmaWithImm,
            ));
        }
        let before = self.late.len();
        let late = std::mem::take(&mut self.late);
        self.late = late
            .into_iter()
            .filter(|l| !(l.path == path && self.target_of(l.ep, l.path) == ep))
            .collect();
        self.stats.late_dropped += (before - self.late.len()) as u64;
    }

    /// Pulls the cable of `path` of `ep`: both ends fail; `mode` says what becomes of the work
    /// queued at either end (see [`InFlight`]).
    pub(super) fn kill(&mut self, ep: usize, path: usize) {
        self.fault(ep, path, InFlight::Drop);
    }

    pub(super) fn fault(&mut self, ep: usize, path: usize, mode: InFlight) {
        let Some(role) = self.eps.get(ep).and_then(|e| e.roles.get(path)).copied() else {
            return;
        };
        let peer = self.target_of(ep, path);
        let ends = if role == PathRole::Data {
            vec![ep, peer]
        } else {
            vec![ep]
        };
        for &e in &ends {
            if let Some(q) = self.eps.get_mut(e).and_then(|x| x.qps.get_mut(path)) {
                q.carrier_down = true;
            }
        }
        match mode {
            InFlight::Drop => {
                for &e in &ends {
                    if self.eps.get(e).is_some_and(|x| path < x.qps.len()) {
                        self.kill_qp(e, path);
                    }
                }
            }
            InFlight::LandLost => {
                // Each end's queued work lands (both directions of the cable), its poster told
                // it failed: the first with the transport's retry error, the rest flushed.
                self.fail_queued(&ends, path, |fab, e, w| {
                    if fab.land(e, path, &w, "completion lost") {
                        fab.stats.landed_lost += 1;
                    }
                });
            }
            InFlight::Delay { ops } => {
                let due = self.executed.saturating_add(ops);
                self.fail_queued(&ends, path, |fab, ep, wr| {
                    fab.late.push_back(LateWrite { ep, path, wr, due });
                });
            }
        }
    }

    /// Fails the work queued on `path` at each of `ends`: every write goes to `on_write` (which
    /// lands it now or later), and its poster sees the transport's retry error on the first entry
    /// and a flush on the rest, as a real queue pair reports a pulled cable; the queue pair is left
    /// in error.
    fn fail_queued(
        &mut self,
        ends: &[usize],
        path: usize,
        mut on_write: impl FnMut(&mut Self, usize, WriteWr),
    ) {
        for &e in ends {
            let mut first = true;
            while let Some(op) = self.eps[e].qps[path].queue.pop_front() {
                let (wr_id, opcode) = match op {
                    Op::Write(w) => {
                        let wr_id = w.wr_id;
                        on_write(self, e, w);
                        (wr_id, WcOpcode::RdmaWrite)
                    }
                    Op::Read(r) => (r.wr_id, WcOpcode::RdmaRead),
                };
                let st = if first {
                    WcStatus::RETRY_EXC_ERR
                } else {
                    WcStatus::WR_FLUSH_ERR
                };
                first = false;
                self.complete(e, path, Completion::without_data(wr_id, st, opcode));
            }
            self.eps[e].qps[path].error = true;
        }
    }

    /// Lands write `w` posted by `ep` on `path` outside the normal execution (a fault's): keys
    /// checked, bytes copied, a receive consumed for its immediate; nothing completes at the
    /// poster. `false` (nothing lands) when the target's end is sealed, a key does not match, or
    /// a write with an immediate finds no receive.
    pub(super) fn land(&mut self, ep: usize, path: usize, w: &WriteWr, why: &str) -> bool {
        let t = self.target_of(ep, path);
        if self.eps[t].qps[path].sealed {
            return false;
        }
        let len = w.local.len as usize;
        let (Some((sr, so)), Some((dr, doff))) = (
            self.check_key(w.local.lkey, ep, path, w.local.addr, len),
            self.check_key(w.remote.rkey, t, path, w.remote.addr, len),
        ) else {
            return false;
        };
        let recv = match w.imm {
            Some(_) => match self.eps[t].qps[path].recvs.pop_front() {
                Some(r) => Some(r),
                None => return false,
            },
            None => None,
        };
        self.watch(dr, doff, len, ep, path, w, why);
        if len > 0 && (self.copy_data || self.regions[dr].ctrl || self.regions[sr].ctrl) {
            // Checked keys: an error here is a region that shrank, which the fault ignores.
            let _ = self.copy(sr, so, dr, doff, len);
        }
        self.stats.bytes += len as u64;
        if let (Some(recv_id), Some(imm)) = (recv, w.imm) {
            self.complete(
                t,
                path,
                Completion {
                    wr_id: recv_id,
                    status: WcStatus::SUCCESS,
                    opcode: WcOpcode::RecvRdmaWithImm,
                    byte_len: w.local.len,
                    imm: Some(imm),
                },
            );
        }
        true
    }

    /// Lands the held writes that are due (all of them with `all`), in order.
    pub(super) fn land_late(&mut self, all: bool) {
        while let Some(l) = self.late.front().copied() {
            if !all && l.due > self.executed {
                return;
            }
            self.late.pop_front();
            if self.land(l.ep, l.path, &l.wr, "held on the wire, landed late") {
                self.stats.late_landed += 1;
            } else {
                self.stats.late_dropped += 1;
            }
        }
    }

    /// Records a write landing in a guarded range ([`MemFab::guard`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn watch(
        &mut self,
        region: usize,
        off: usize,
        len: usize,
        ep: usize,
        path: usize,
        w: &WriteWr,
        why: &str,
    ) {
        if self.guards.is_empty() || len == 0 {
            return;
        }
        let hits: Vec<String> = self
            .guards
            .iter()
            .filter(|g| g.region == region && off < g.start + g.len && g.start < off + len)
            .map(|g| {
                format!(
                    "a write of {len} bytes by ep{ep} path {path} (wr_id {:#x}, {why}) landed at offset {} of {}",
                    w.wr_id,
                    off.max(g.start) - g.start,
                    g.what
                )
            })
            .collect();
        self.violations.extend(hits);
    }

    /// A kill due before the next work request: lands half of `op` first when asked and `op` is a
    /// write on the killed path.
    pub(super) fn kill_due(&mut self, ep: usize, path: usize, op: &Op) {
        self.land_late(false);
        let Some(k) = self.kill_at.filter(|k| self.executed >= k.at) else {
            return;
        };
        self.kill_at = None;
        let on_path = path == k.path && (ep == k.ep || ep == self.target_of(k.ep, k.path));
        if let (true, true, Op::Write(w)) = (k.partial, on_path, op) {
            let half = w.local.len as usize / 2;
            let t = self.target_of(ep, path);
            let src = self.check_key(w.local.lkey, ep, path, w.local.addr, half);
            let dst = self.check_key(w.remote.rkey, t, path, w.remote.addr, half);
            if let (Some((sr, so)), Some((dr, doff)), true) = (src, dst, half > 0) {
                self.watch(dr, doff, half, ep, path, w, "cut mid-way");
                if self.copy_data || self.regions[dr].ctrl {
                    // Checked keys: an error here is a region that shrank, which the kill ignores.
                    let _ = self.copy(sr, so, dr, doff, half);
                }
            }
        }
        self.fault(k.ep, k.path, k.mode);
    }

    /// Executes one queued op of (ep, path).
    pub(super) fn execute(&mut self, ep: usize, path: usize) {
        let Some(op) = self.eps[ep].qps[path].queue.front().copied() else {
            return;
        };
        // A fault due now takes the op under way with the rest of its queue.
        self.kill_due(ep, path, &op);
        if self.eps[ep].qps[path].queue.pop_front().is_none() {
            return;
        }
        self.executed += 1;
        let (wr_id, opcode) = match op {
            Op::Write(w) => (w.wr_id, WcOpcode::RdmaWrite),
            Op::Read(r) => (r.wr_id, WcOpcode::RdmaRead),
        };
        if self.eps[ep].qps[path].error {
            self.fail(ep, path, wr_id, WcStatus::WR_FLUSH_ERR, opcode);
            return;
        }
        if let Some(st) = self.eps[ep].qps[path].fault.take() {
            self.fail(ep, path, wr_id, st, opcode);
            return;
        }
        let t = self.target_of(ep, path);
        if t != ep && self.eps[t].qps[path].error {
            self.fail(ep, path, wr_id, WcStatus::RETRY_EXC_ERR, opcode);
            return;
        }
        match op {
            Op::Write(w) => {
                let len = w.local.len as usize;
                let Some((sr, so)) = self.check_key(w.local.lkey, ep, path, w.local.addr, len)
                else {
                    self.fail(ep, path, wr_id, WcStatus::LOC_PROT_ERR, opcode);
                    return;
                };
                let Some((dr, doff)) = self.check_key(w.remote.rkey, t, path, w.remote.addr, len)
                else {
                    self.fail(ep, path, wr_id, WcStatus::REM_ACCESS_ERR, opcode);
                    return;
                };
                let recv = if w.imm.is_some() {
                    match self.eps[t].qps[path].recvs.pop_front() {
                        Some(r) => Some(r),
                        None => {
                            self.fail(ep, path, wr_id, WcStatus::RNR_RETRY_EXC_ERR, opcode);
                            return;
                        }
                    }
                } else {
                    None
                };
                self.watch(dr, doff, len, ep, path, &w, "executed");
                if len > 0
                    && (self.copy_data || self.regions[dr].ctrl || self.regions[sr].ctrl)
                    && self.copy(sr, so, dr, doff, len).is_err()
                {
                    self.fail(ep, path, wr_id, WcStatus::GENERAL_ERR, opcode);
                    return;
                }
                self.stats.writes += 1;
                self.stats.inline_writes += u64::from(w.inline);
                self.stats.bytes += len as u64;
                self.eps[ep].qps[path].bytes += len as u64;
                if let (Some(recv_id), Some(imm)) = (recv, w.imm) {
                    self.stats.imm_writes += 1;
                    self.complete(
                        t,
                        path,
                        Completion {
                            wr_id: recv_id,
                            status: WcStatus::SUCCESS,
                            opcode: WcOpcode::RecvRdmaWithImm,
                            byte_len: w.local.len,
                            imm: Some(imm),
                        },
                    );
                }
                if w.signaled {
                    self.complete(
                        ep,
                        path,
                        Completion::without_data(wr_id, WcStatus::SUCCESS, opcode),
                    );
                }
            }
            Op::Read(r) => {
                let len = r.local.len as usize;
                let Some((dr, doff)) = self.check_key(r.local.lkey, ep, path, r.local.addr, len)
                else {
                    self.fail(ep, path, wr_id, WcStatus::LOC_PROT_ERR, opcode);
                    return;
                };
                let Some((sr, so)) = self.check_key(r.remote.rkey, t, path, r.remote.addr, len)
                else {
                    self.fail(ep, path, wr_id, WcStatus::REM_ACCESS_ERR, opcode);
                    return;
                };
                if self.copy(sr, so, dr, doff, len).is_err() {
                    self.fail(ep, path, wr_id, WcStatus::GENERAL_ERR, opcode);
                    return;
                }
                self.stats.reads += 1;
                self.complete(
                    ep,
                    path,
                    Completion {
                        wr_id,
                        status: WcStatus::SUCCESS,
                        opcode,
                        byte_len: r.local.len,
                        imm: None,
                    },
                );
            }
        }
    }

    /// Copies between regions whose keys were checked (an error means a region shrank: a bug).
    pub(super) fn copy(
        &self,
        sr: usize,
        so: usize,
        dr: usize,
        doff: usize,
        len: usize,
    ) -> Result<()> {
        AtomicWords::copy_words(
            &self.regions[sr].words,
            so,
            &self.regions[dr].words,
            doff,
            len,
        )
    }

    pub(super) fn run_queue(&mut self, ep: usize, path: usize) {
        if self.eps[ep].stalled {
            return;
        }
        while !self.eps[ep].qps[path].queue.is_empty() {
            self.execute(ep, path);
        }
    }

    /// Reorder mode: executes a few ops from randomly chosen runnable queues.
    pub(super) fn deliver_some(&mut self) {
        let rounds = 1 + self.next_rand() % 8;
        for _ in 0..rounds {
            let runnable: Vec<(usize, usize)> = self
                .eps
                .iter()
                .enumerate()
                .filter(|(_, e)| !e.stalled)
                .flat_map(|(i, e)| {
                    e.qps
                        .iter()
                        .enumerate()
                        .filter(|(_, q)| !q.queue.is_empty())
                        .map(move |(p, _)| (i, p))
                })
                .collect();
            if runnable.is_empty() {
                return;
            }
            let (ep, path) = runnable[(self.next_rand() % runnable.len() as u64) as usize];
            let n = 1 + self.next_rand() % 3;
            for _ in 0..n {
                self.execute(ep, path);
            }
        }
    }

    pub(super) fn alloc_region(&mut self, len: usize, ctrl: bool) -> Result<usize> {
        if len > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "memfab region of {len} bytes; at most {} bytes accepted",
                u32::MAX
            )));
        }
        self.regions.push(Region {
            words: AtomicWords::new(len.div_ceil(8)),
            len,
            ctrl,
        });
        Ok(self.regions.len() - 1)
    }

    pub(super) fn region_range(&self, addr: u64, len: usize) -> Result<(usize, usize)> {
        let (r, off) = split_addr(addr);
        match self.regions.get(r) {
            Some(reg) if off.checked_add(len).is_some_and(|e| e <= reg.len) => Ok((r, off)),
            _ => Err(Error::InvalidArgument(format!(
                "memfab address {addr:#x}+{len} bytes is not inside an allocated region"
            ))),
        }
    }
}
