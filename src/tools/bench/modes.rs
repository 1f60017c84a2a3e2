//! The bench modes, written against [`Net`] and driven like NCCL's proxy drives a plugin: listen
//! handles cross through the bootstrap, connect/accept are retried until non-NULL, every buffer
//! is registered on its comm, sends and receives are posted non-blocking (NULL = post again) and
//! polled with `test`. Every received byte is checked.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::bootstrap::Bootstrap;
use super::pattern;
use crate::error::{Error, Result};
use crate::ffi::loader::net::{
    CommRef, HANDLE_SIZE, Handle, Net, Properties, RecvBuf, Region, SharedBuf,
};

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Ping-pong between rank pairs (0-1, 2-3, ...), per size; time = half the round trip.
    Latency,
    /// Stream from each even rank to the next odd one, `window` messages in flight.
    Bandwidth,
    /// Every rank sends a chunk to every other rank (nccl-tests' alltoall sizes).
    Alltoall,
    /// Ring all-reduce (sum of f32) on host memory: reduce-scatter then all-gather, over channels.
    Allreduce,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Latency => "latency",
            Mode::Bandwidth => "bandwidth",
            Mode::Alltoall => "alltoall",
            Mode::Allreduce => "allreduce",
        }
    }
}

/// Bench parameters (the CLI flags).
#[derive(Debug, Clone)]
pub struct Options {
    pub mode: Mode,
    pub min_bytes: usize,
    pub max_bytes: usize,
    /// Sizes grow by this factor (≥2).
    pub step_factor: usize,
    pub iters: usize,
    pub warmup: usize,
    /// Bandwidth: messages in flight.
    pub window: usize,
    /// Allreduce: ring channels (one connection each way per channel).
    pub channels: usize,
    /// Allreduce: largest message; each ring step's chunk is cut into slices of at most this.
    pub chunk_bytes: usize,
    /// Device for every connection; `None`: channel/peer round-robin (a locality hint to the plugin).
    pub dev: Option<usize>,
    /// Limit for connection setup and for each size.
    pub timeout: Duration,
    /// Print a progress line (stderr, rank 0) on runs longer than 2 s.
    pub progress: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: Mode::Latency,
            min_bytes: 8,
            max_bytes: 1 << 20,
            step_factor: 4,
            iters: 20,
            warmup: 2,
            window: 8,
            channels: 2,
            chunk_bytes: 128 << 10,
            dev: None,
            timeout: Duration::from_secs(60),
            progress: true,
        }
    }
}

/// One line of the result table.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    pub size_bytes: usize,
    /// Elements (f32 for allreduce, bytes otherwise).
    pub count: usize,
    pub iters: usize,
    /// Per operation, microseconds (latency: one way).
    pub time_us: f64,
    pub algbw_gbytes_s: f64,
    pub busbw_gbytes_s: f64,
    pub algbw_gbits_s: f64,
    pub busbw_gbits_s: f64,
    /// Failed data checks over all ranks.
    pub errors: u64,
}

/// The result of a run (rank 0 holds the merged rows; other ranks their own view of them).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub mode: Mode,
    pub plugin: String,
    pub nranks: usize,
    pub rank: usize,
    pub channels: usize,
    pub devices: Vec<Properties>,
    pub rows: Vec<Row>,
    /// First data-check failure seen by any rank, if any.
    pub first_error: Option<String>,
}

impl Report {
    /// Failed checks over all sizes and ranks.
    pub fn errors(&self) -> u64 {
        self.rows.iter().map(|r| r.errors).sum()
    }
}

/// The sizes a run covers.
pub fn sizes(o: &Options) -> Result<Vec<usize>> {
    if o.min_bytes == 0 || o.min_bytes > o.max_bytes {
        return Err(Error::InvalidUsage(format!(
            "sizes {} B..{} B (accepted: 1 <= min <= max)",
            o.min_bytes, o.max_bytes
        )));
    }
    if o.step_factor < 2 {
        return Err(Error::InvalidUsage(format!(
            "step factor {} (accepted: 2 or more)",
            o.step_factor
        )));
    }
    let mut v = vec![];
    let mut s = o.min_bytes;
    while s <= o.max_bytes {
        v.push(s);
        match s.checked_mul(o.step_factor) {
            Some(n) => s = n,
            None => break,
        }
    }
    Ok(v)
}

struct Link<C, M> {
    comm: Option<C>,
    buf: SharedBuf,
    mr: Option<M>,
}

/// The connections of one rank, keyed by (peer, channel).
struct Conns<N: Net> {
    sends: Vec<Link<N::SendComm, N::Mr>>,
    send_key: HashMap<(usize, usize), usize>,
    recvs: Vec<Link<N::RecvComm, N::Mr>>,
    recv_key: HashMap<(usize, usize), usize>,
}

impl<N: Net> Conns<N> {
    fn send(&self, peer: usize, ch: usize) -> Result<usize> {
        self.send_key.get(&(peer, ch)).copied().ok_or_else(|| {
            Error::Internal(format!("no send connection to rank {peer} channel {ch}"))
        })
    }
    fn recv(&self, peer: usize, ch: usize) -> Result<usize> {
        self.recv_key.get(&(peer, ch)).copied().ok_or_else(|| {
            Error::Internal(format!(
                "no receive connection from rank {peer} channel {ch}"
            ))
        })
    }
}

fn wait_tick(deadline: Instant, what: impl FnOnce() -> String) -> Result<()> {
    if Instant::now() > deadline {
        return Err(Error::Timeout(what()));
    }
    std::thread::yield_now();
    Ok(())
}

/// Listens for `ins`, exchanges the handles, connects `outs` and accepts `ins` (both retried until
/// non-NULL, interleaved like NCCL's service thread), then registers the buffers.
fn connect_all<N: Net>(
    net: &N,
    boot: &mut Bootstrap,
    outs: &[(usize, usize)],
    ins: &[(usize, usize)],
    send_bytes: usize,
    recv_bytes: usize,
    o: &Options,
) -> Result<Conns<N>> {
    let me = boot.rank();
    let ndev = net.devices()?;
    if ndev == 0 {
        return Err(Error::System(format!(
            "plugin {} reports 0 devices",
            net.name()
        )));
    }
    let dev_for = |peer: usize, ch: usize| -> Result<usize> {
        match o.dev {
            Some(d) if d < ndev => Ok(d),
            Some(d) => Err(Error::InvalidUsage(format!(
                "--dev {d} but the plugin has {ndev} devices (accepted: 0..{})",
                ndev - 1
            ))),
            None => Ok((peer + ch) % ndev),
        }
    };
    // listen for every incoming connection; blob = (src u32, ch u32, handle)*
    let mut listens = Vec::new();
    let mut blob = Vec::new();
    for &(src, ch) in ins {
        let (h, l) = net.listen(dev_for(src, ch)?)?;
        blob.extend_from_slice(&(src as u32).to_le_bytes());
        blob.extend_from_slice(&(ch as u32).to_le_bytes());
        blob.extend_from_slice(&h);
        listens.push(((src, ch), Some(l)));
    }
    let all = boot.allgather(&blob)?;
    let mut handles: Vec<((usize, usize), Handle)> = Vec::new();
    for &(dst, ch) in outs {
        let b = all
            .get(dst)
            .ok_or_else(|| Error::Internal(format!("no blob from rank {dst}")))?;
        let rec = 8 + HANDLE_SIZE;
        if b.len() % rec != 0 {
            return Err(Error::Remote(format!(
                "rank {dst} sent a {} B handle table (accepted: a multiple of {rec} B)",
                b.len()
            )));
        }
        let h = b
            .chunks(rec)
            .find(|r| {
                u32::from_le_bytes([r[0], r[1], r[2], r[3]]) as usize == me
                    && u32::from_le_bytes([r[4], r[5], r[6], r[7]]) as usize == ch
            })
            .ok_or_else(|| {
                Error::Remote(format!(
                    "rank {dst} published no handle for rank {me} channel {ch}"
                ))
            })?;
        let mut hh = [0u8; HANDLE_SIZE];
        hh.copy_from_slice(&h[8..]);
        handles.push(((dst, ch), hh));
    }
    let deadline = Instant::now() + o.timeout;
    let mut sends: Vec<Option<N::SendComm>> = outs.iter().map(|_| None).collect();
    let mut recvs: Vec<Option<N::RecvComm>> = ins.iter().map(|_| None).collect();
    loop {
        let mut pending = 0;
        for (i, ((dst, ch), h)) in handles.iter_mut().enumerate() {
            if sends[i].is_none() {
                sends[i] = net.connect(dev_for(*dst, *ch)?, h)?;
                pending += usize::from(sends[i].is_none());
            }
        }
        for (i, (_, l)) in listens.iter_mut().enumerate() {
            if recvs[i].is_none() {
                if let Some(lc) = l.as_mut() {
                    recvs[i] = net.accept(lc)?;
                }
                match recvs[i].is_some() {
                    // NCCL closes the listen comm right after a successful accept
                    true => {
                        if let Some(lc) = l.take() {
                            net.close_listen(lc)?;
                        }
                    }
                    false => pending += 1,
                }
            }
        }
        if pending == 0 {
            break;
        }
        wait_tick(deadline, || {
            let o: Vec<String> = handles
                .iter()
                .zip(&sends)
                .filter(|(_, s)| s.is_none())
                .map(|(((d, c), _), _)| format!("to rank {d} ch {c}"))
                .chain(
                    listens
                        .iter()
                        .zip(&recvs)
                        .filter(|(_, r)| r.is_none())
                        .map(|(((s, c), _), _)| format!("from rank {s} ch {c}")),
                )
                .collect();
            format!(
                "rank {me}: connections not up within {} s: {}",
                o.len(),
                o.join(", ")
            )
        })?;
    }
    let mut c = Conns::<N> {
        sends: Vec::new(),
        send_key: HashMap::new(),
        recvs: Vec::new(),
        recv_key: HashMap::new(),
    };
    for (((dst, ch), _), s) in handles.iter().zip(sends) {
        let comm = s.ok_or_else(|| Error::Internal("connect loop ended early".into()))?;
        let buf = SharedBuf::new(send_bytes);
        let mr = net.reg_mr(CommRef::Send(&comm), &buf)?;
        c.send_key.insert((*dst, *ch), c.sends.len());
        c.sends.push(Link {
            comm: Some(comm),
            buf,
            mr: Some(mr),
        });
    }
    for ((key, _), r) in listens.iter().zip(recvs) {
        let comm = r.ok_or_else(|| Error::Internal("accept loop ended early".into()))?;
        let buf = SharedBuf::new(recv_bytes);
        let mr = net.reg_mr(CommRef::Recv(&comm), &buf)?;
        c.recv_key.insert(*key, c.recvs.len());
        c.recvs.push(Link {
            comm: Some(comm),
            buf,
            mr: Some(mr),
        });
    }
    boot.barrier()?;
    Ok(c)
}

fn close_all<N: Net>(net: &N, c: Conns<N>) -> Result<()> {
    let mut first: Result<()> = Ok(());
    let mut keep = |r: Result<()>| {
        if first.is_ok() {
            first = r;
        }
    };
    for l in c.sends {
        if let Some(comm) = l.comm {
            if let Some(mr) = l.mr {
                keep(net.dereg_mr(CommRef::Send(&comm), mr));
            }
            keep(net.close_send(comm));
        }
    }
    for l in c.recvs {
        if let Some(comm) = l.comm {
            if let Some(mr) = l.mr {
                keep(net.dereg_mr(CommRef::Recv(&comm), mr));
            }
            keep(net.close_recv(comm));
        }
    }
    first
}

struct SendOp {
    link: usize,
    off: usize,
    len: usize,
    tag: i32,
}

struct RecvOp {
    link: usize,
    /// (offset, len, tag) of each buffer of one grouped irecv.
    bufs: Vec<(usize, usize, i32)>,
}

/// Posts every receive (grouped), then every send, and polls all of them until done. Returns the
/// received sizes of each receive. A NULL isend/irecv is posted again on the next pass.
fn exchange<N: Net>(
    net: &N,
    c: &mut Conns<N>,
    sends: &[SendOp],
    recvs: &[RecvOp],
    deadline: Instant,
) -> Result<Vec<Vec<usize>>> {
    let gone = || Error::Internal("connection used after close".into());
    let mut rreq: Vec<Option<N::Request>> = recvs.iter().map(|_| None).collect();
    let mut rsz: Vec<Option<Vec<usize>>> = recvs.iter().map(|_| None).collect();
    let mut sreq: Vec<Option<N::Request>> = sends.iter().map(|_| None).collect();
    let mut sdone = vec![false; sends.len()];
    loop {
        let mut pending = 0usize;
        // posts on one connection stay in order: after a NULL, later ops on that comm wait a pass
        let mut blocked = std::collections::HashSet::new();
        for (i, r) in recvs.iter().enumerate() {
            if rsz[i].is_some() {
                continue;
            }
            let link = &mut c.recvs[r.link];
            if rreq[i].is_none() && !blocked.contains(&r.link) {
                let mr = link.mr.as_ref().ok_or_else(gone)?;
                let bufs = r
                    .bufs
                    .iter()
                    .map(|&(off, len, tag)| {
                        Ok(RecvBuf {
                            region: Region::new(&link.buf, off, len)?,
                            tag,
                            mr,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                rreq[i] = net.irecv(link.comm.as_mut().ok_or_else(gone)?, &bufs)?;
            }
            if rreq[i].is_none() {
                blocked.insert(r.link);
            }
            if let Some(q) = rreq[i].as_mut() {
                if let Some(sz) = net.test(q)? {
                    if sz.len() != r.bufs.len() {
                        return Err(Error::Remote(format!(
                            "test reported {} sizes for a grouped receive of {}",
                            sz.len(),
                            r.bufs.len()
                        )));
                    }
                    rsz[i] = Some(sz);
                    rreq[i] = None;
                    continue;
                }
            }
            pending += 1;
        }
        for (i, s) in sends.iter().enumerate() {
            if sdone[i] {
                continue;
            }
            let link = &mut c.sends[s.link];
            if sreq[i].is_none() && !blocked.contains(&(usize::MAX - s.link)) {
                let mr = link.mr.as_ref().ok_or_else(gone)?;
                let region = Region::new(&link.buf, s.off, s.len)?;
                sreq[i] = net.isend(link.comm.as_mut().ok_or_else(gone)?, &region, s.tag, mr)?;
            }
            if sreq[i].is_none() {
                // send links are keyed from the top so they never collide with receive links
                blocked.insert(usize::MAX - s.link);
            }
            if let Some(q) = sreq[i].as_mut() {
                if net.test(q)?.is_some() {
                    sdone[i] = true;
                    sreq[i] = None;
                    continue;
                }
            }
            pending += 1;
        }
        if pending == 0 {
            return Ok(rsz.into_iter().map(|s| s.unwrap_or_default()).collect());
        }
        wait_tick(deadline, || {
            format!(
                "{pending} of {} transfers still pending",
                sends.len() + recvs.len()
            )
        })?;
    }
}

/// Per-size results of one rank: (time per operation in us or 0 if this rank does not time,
/// failed checks, first failure).
struct Local {
    time_us: f64,
    errors: u64,
    first: Option<String>,
}

impl Local {
    fn check(&mut self, r: Result<()>) {
        if let Err(e) = r {
            self.errors += 1;
            if self.first.is_none() {
                tracing::warn!("{e}");
                self.first = Some(e.to_string());
            }
        }
    }
}

fn fill_region(buf: &SharedBuf, off: usize, len: usize, seed: u64) -> Result<()> {
    pattern::fill(&mut buf.lock()?[off..off + len], seed);
    Ok(())
}

/// Counts a mismatch in `l`; a buffer that cannot be read (poisoned lock) ends the run instead.
fn verify_region(
    l: &mut Local,
    buf: &SharedBuf,
    off: usize,
    len: usize,
    seed: u64,
    what: &str,
) -> Result<()> {
    l.check(pattern::verify(&buf.lock()?[off..off + len], seed, what));
    Ok(())
}

fn scramble(buf: &SharedBuf, off: usize, len: usize) -> Result<()> {
    buf.lock()?[off..off + len].fill(0xa5);
    Ok(())
}

fn check_size(got: usize, want: usize, what: &str) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::Remote(format!(
            "{what}: test reported {got} B received, {want} B were sent"
        )))
    }
}

fn partner(rank: usize, nranks: usize) -> Option<usize> {
    let p = rank ^ 1;
    (p < nranks).then_some(p)
}

/// Runs the mode of `o` on this rank. Every rank must call it with the same options.
pub fn run<N: Net>(net: &N, boot: &mut Bootstrap, o: &Options) -> Result<Report> {
    let me = boot.rank();
    let n = boot.nranks();
    if n < 2 {
        return Err(Error::InvalidUsage(format!(
            "{} needs at least 2 ranks (got --nranks {n})",
            o.mode.name()
        )));
    }
    if o.iters == 0 || o.window == 0 || o.channels == 0 || o.chunk_bytes == 0 {
        return Err(Error::InvalidUsage(
            "--iters, --window, --channels and --chunk-bytes must be at least 1".into(),
        ));
    }
    let sizes = sizes(o)?;
    let max = *sizes.last().unwrap_or(&o.min_bytes);
    let ndev = net.devices()?;
    let devices = (0..ndev)
        .map(|d| net.get_properties(d))
        .collect::<Result<Vec<_>>>()?;
    let mut outs = vec![];
    let mut ins = vec![];
    let (send_bytes, recv_bytes);
    match o.mode {
        Mode::Latency | Mode::Bandwidth => {
            if let Some(p) = partner(me, n) {
                outs.push((p, 0));
                ins.push((p, 0));
            }
            let w = if o.mode == Mode::Bandwidth {
                o.window
            } else {
                1
            };
            // bandwidth: one more byte for the ready token after the window's messages
            let extra = usize::from(o.mode == Mode::Bandwidth);
            send_bytes = max * w + extra;
            recv_bytes = max * w + extra;
        }
        Mode::Alltoall => {
            for p in (0..n).filter(|&p| p != me) {
                outs.push((p, 0));
                ins.push((p, 0));
            }
            send_bytes = max / n + 1;
            recv_bytes = max / n + 1;
        }
        Mode::Allreduce => {
            for ch in 0..o.channels {
                outs.push(((me + 1) % n, ch));
                ins.push(((me + n - 1) % n, ch));
            }
            let per = max.div_ceil(4).div_ceil(n * o.channels) * 4;
            send_bytes = per;
            recv_bytes = per;
        }
    }
    let mut c = connect_all(net, boot, &outs, &ins, send_bytes, recv_bytes, o)?;
    let start = Instant::now();
    let mut rows = vec![];
    let mut first_error = None;
    for (k, &size) in sizes.iter().enumerate() {
        let deadline = Instant::now() + o.timeout;
        let mut l = Local {
            time_us: 0.0,
            errors: 0,
            first: None,
        };
        let (count, eff) = match o.mode {
            Mode::Latency => (
                size,
                run_latency(net, &mut c, me, n, size, o, deadline, &mut l)?,
            ),
            Mode::Bandwidth => (
                size,
                run_bandwidth(net, &mut c, me, n, size, o, deadline, &mut l)?,
            ),
            Mode::Alltoall => {
                let chunk = (size / n).max(1);
                run_alltoall(net, &mut c, me, n, chunk, o, deadline, &mut l)?;
                (chunk * n, chunk * n)
            }
            Mode::Allreduce => {
                let count = (size / 4).max(1);
                run_allreduce(net, &mut c, me, n, count, o, deadline, &mut l)?;
                (count, count * 4)
            }
        };
        // merge: slowest rank's time, every rank's failures
        let mut blob = l.time_us.to_le_bytes().to_vec();
        blob.extend_from_slice(&l.errors.to_le_bytes());
        blob.extend_from_slice(l.first.as_deref().unwrap_or("").as_bytes());
        let all = boot.allgather(&blob)?;
        let mut t: f64 = 0.0;
        let mut errors = 0u64;
        for (r, b) in all.iter().enumerate() {
            if b.len() < 16 {
                return Err(Error::Remote(format!(
                    "rank {r} sent a {} B result (expected at least 16 B)",
                    b.len()
                )));
            }
            let mut tb = [0u8; 8];
            tb.copy_from_slice(&b[..8]);
            let mut eb = [0u8; 8];
            eb.copy_from_slice(&b[8..16]);
            t = t.max(f64::from_le_bytes(tb));
            let e = u64::from_le_bytes(eb);
            errors += e;
            if e > 0 && first_error.is_none() {
                first_error = Some(format!("rank {r}: {}", String::from_utf8_lossy(&b[16..])));
            }
        }
        let algbw = if t > 0.0 { eff as f64 / (t * 1e3) } else { 0.0 };
        let factor = match o.mode {
            Mode::Latency | Mode::Bandwidth => 1.0,
            Mode::Alltoall => (n - 1) as f64 / n as f64,
            Mode::Allreduce => 2.0 * (n - 1) as f64 / n as f64,
        };
        rows.push(Row {
            size_bytes: eff,
            count,
            iters: o.iters,
            time_us: t,
            algbw_gbytes_s: algbw,
            busbw_gbytes_s: algbw * factor,
            algbw_gbits_s: algbw * 8.0,
            busbw_gbits_s: algbw * factor * 8.0,
            errors,
        });
        if o.progress && me == 0 && start.elapsed() > Duration::from_secs(2) {
            eprintln!(
                "progress: {} {eff} B done ({}/{}), {:.1} s elapsed",
                o.mode.name(),
                k + 1,
                sizes.len(),
                start.elapsed().as_secs_f64()
            );
        }
    }
    boot.barrier()?;
    close_all(net, c)?;
    Ok(Report {
        mode: o.mode,
        plugin: net.name(),
        nranks: n,
        rank: me,
        channels: if o.mode == Mode::Allreduce {
            o.channels
        } else {
            1
        },
        devices,
        rows,
        first_error,
    })
}

#[allow(clippy::too_many_arguments)]
fn run_latency<N: Net>(
    net: &N,
    c: &mut Conns<N>,
    me: usize,
    n: usize,
    size: usize,
    o: &Options,
    deadline: Instant,
    l: &mut Local,
) -> Result<usize> {
    let Some(p) = partner(me, n) else {
        return Ok(size);
    };
    let (s, r) = (c.send(p, 0)?, c.recv(p, 0)?);
    let mut total = Duration::ZERO;
    for it in 0..o.warmup + o.iters {
        let ping = pattern::seed(&[
            1,
            me.min(p) as u64,
            me.max(p) as u64,
            size as u64,
            it as u64,
        ]);
        let pong = pattern::seed(&[
            2,
            me.max(p) as u64,
            me.min(p) as u64,
            size as u64,
            it as u64,
        ]);
        let (my_seed, peer_seed) = if me < p { (ping, pong) } else { (pong, ping) };
        fill_region(&c.sends[s].buf, 0, size, my_seed)?;
        scramble(&c.recvs[r].buf, 0, size)?;
        let send = [SendOp {
            link: s,
            off: 0,
            len: size,
            tag: me as i32,
        }];
        let recv = [RecvOp {
            link: r,
            bufs: vec![(0, size, p as i32)],
        }];
        let t0 = Instant::now();
        let got = if me < p {
            exchange(net, c, &send, &recv, deadline)?
        } else {
            let g = exchange(net, c, &[], &recv, deadline)?;
            exchange(net, c, &send, &[], deadline)?;
            g
        };
        if it >= o.warmup {
            total += t0.elapsed();
        }
        l.check(check_size(got[0][0], size, "latency"));
        verify_region(
            l,
            &c.recvs[r].buf,
            0,
            size,
            peer_seed,
            &format!("latency {size} B from rank {p} iter {it}"),
        )?;
    }
    if me < p {
        l.time_us = total.as_secs_f64() * 1e6 / o.iters as f64 / 2.0;
    }
    Ok(size)
}

/// Bandwidth: each window of up to `window` messages is timed on the receiver from posting its
/// receives to the last one tested done; pattern fill, scrambling and verification run outside
/// those intervals. Before each window the sender sends a 1 B "ready" token (after filling the
/// window, before posting the window's sends), so the receiver starts its clock only when the
/// sender has the data ready; the token lands past the data slots and is checked too.
#[allow(clippy::too_many_arguments)]
fn run_bandwidth<N: Net>(
    net: &N,
    c: &mut Conns<N>,
    me: usize,
    n: usize,
    size: usize,
    o: &Options,
    deadline: Instant,
    l: &mut Local,
) -> Result<usize> {
    let Some(p) = partner(me, n) else {
        return Ok(size);
    };
    let sender = me < p;
    let (s, r) = (c.send(p, 0)?, c.recv(p, 0)?);
    // the token slot: one byte after the largest window (see `run`'s buffer sizes)
    let tok = c.sends[s].buf.len().saturating_sub(1);
    let total_msgs = o.warmup + o.iters;
    let mut timed = Duration::ZERO;
    let mut m = 0;
    while m < total_msgs {
        // a batch of up to `window` messages, not crossing the warmup boundary
        let end = if m < o.warmup { o.warmup } else { total_msgs };
        let batch = o.window.min(end - m);
        let seed = |i: usize| {
            pattern::seed(&[3, me.min(p) as u64, me.max(p) as u64, size as u64, i as u64])
        };
        let token_seed =
            pattern::seed(&[6, me.min(p) as u64, me.max(p) as u64, size as u64, m as u64]);
        if sender {
            // untimed: fill every message of the window and the token
            for j in 0..batch {
                fill_region(&c.sends[s].buf, j * size, size, seed(m + j))?;
            }
            fill_region(&c.sends[s].buf, tok, 1, token_seed)?;
            let mut ops = vec![SendOp {
                link: s,
                off: tok,
                len: 1,
                tag: me as i32,
            }];
            ops.extend((0..batch).map(|j| SendOp {
                link: s,
                off: j * size,
                len: size,
                tag: me as i32,
            }));
            exchange(net, c, &ops, &[], deadline)?;
        } else {
            // untimed: scramble the window, wait for the sender's token and check it
            scramble(&c.recvs[r].buf, 0, batch * size)?;
            scramble(&c.recvs[r].buf, tok, 1)?;
            let got = exchange(
                net,
                c,
                &[],
                &[RecvOp {
                    link: r,
                    bufs: vec![(tok, 1, p as i32)],
                }],
                deadline,
            )?;
            l.check(check_size(got[0][0], 1, "bandwidth ready token"));
            verify_region(
                l,
                &c.recvs[r].buf,
                tok,
                1,
                token_seed,
                &format!("bandwidth {size} B ready token before message {m} from rank {p}"),
            )?;
            // timed: post the window's receives .. all tested done
            let ops: Vec<RecvOp> = (0..batch)
                .map(|j| RecvOp {
                    link: r,
                    bufs: vec![(j * size, size, p as i32)],
                })
                .collect();
            let t0 = Instant::now();
            let got = exchange(net, c, &[], &ops, deadline)?;
            if m >= o.warmup {
                timed += t0.elapsed();
            }
            // untimed: check every message
            for (j, g) in got.iter().enumerate() {
                l.check(check_size(g[0], size, "bandwidth"));
                verify_region(
                    l,
                    &c.recvs[r].buf,
                    j * size,
                    size,
                    seed(m + j),
                    &format!("bandwidth {size} B message {} from rank {p}", m + j),
                )?;
            }
        }
        m += batch;
    }
    if !sender {
        l.time_us = timed.as_secs_f64() * 1e6 / o.iters as f64;
    }
    // the receiver's ack ends the size on both sides (untimed): the sender does not start the
    // next size before every message of this one has landed
    let ack = pattern::seed(&[4, p as u64, size as u64]);
    if sender {
        scramble(&c.recvs[r].buf, 0, 1)?;
        let got = exchange(
            net,
            c,
            &[],
            &[RecvOp {
                link: r,
                bufs: vec![(0, 1, p as i32)],
            }],
            deadline,
        )?;
        l.check(check_size(got[0][0], 1, "bandwidth ack"));
        verify_region(
            l,
            &c.recvs[r].buf,
            0,
            1,
            pattern::seed(&[4, me as u64, size as u64]),
            "bandwidth ack",
        )?;
    } else {
        fill_region(&c.sends[s].buf, 0, 1, ack)?;
        exchange(
            net,
            c,
            &[SendOp {
                link: s,
                off: 0,
                len: 1,
                tag: me as i32,
            }],
            &[],
            deadline,
        )?;
    }
    Ok(size)
}

#[allow(clippy::too_many_arguments)]
fn run_alltoall<N: Net>(
    net: &N,
    c: &mut Conns<N>,
    me: usize,
    n: usize,
    chunk: usize,
    o: &Options,
    deadline: Instant,
    l: &mut Local,
) -> Result<()> {
    let peers: Vec<usize> = (0..n).filter(|&p| p != me).collect();
    let mut total = Duration::ZERO;
    for it in 0..o.warmup + o.iters {
        let seed = |src: usize, dst: usize| {
            pattern::seed(&[5, src as u64, dst as u64, chunk as u64, it as u64])
        };
        let mut sends = vec![];
        let mut recvs = vec![];
        for &p in &peers {
            let s = c.send(p, 0)?;
            let r = c.recv(p, 0)?;
            fill_region(&c.sends[s].buf, 0, chunk, seed(me, p))?;
            scramble(&c.recvs[r].buf, 0, chunk)?;
            sends.push(SendOp {
                link: s,
                off: 0,
                len: chunk,
                tag: me as i32,
            });
            recvs.push(RecvOp {
                link: r,
                bufs: vec![(0, chunk, p as i32)],
            });
        }
        let t0 = Instant::now();
        let got = exchange(net, c, &sends, &recvs, deadline)?;
        if it >= o.warmup {
            total += t0.elapsed();
        }
        for (k, &p) in peers.iter().enumerate() {
            let r = c.recv(p, 0)?;
            l.check(check_size(got[k][0], chunk, "alltoall"));
            verify_region(
                l,
                &c.recvs[r].buf,
                0,
                chunk,
                seed(p, me),
                &format!("alltoall {chunk} B chunk from rank {p} iter {it}"),
            )?;
        }
    }
    l.time_us = total.as_secs_f64() * 1e6 / o.iters as f64;
    Ok(())
}

/// Element range [lo, hi) of part `i` of `parts` equal parts of `count`.
fn part(count: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = count / parts;
    let rem = count % parts;
    let lo = i * base + i.min(rem);
    (lo, lo + base + usize::from(i < rem))
}

#[allow(clippy::too_many_arguments)]
fn run_allreduce<N: Net>(
    net: &N,
    c: &mut Conns<N>,
    me: usize,
    n: usize,
    count: usize,
    o: &Options,
    deadline: Instant,
    l: &mut Local,
) -> Result<()> {
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let chans = o.channels;
    let slice_elems = (o.chunk_bytes / 4).max(1);
    let maxg = 8usize; // buffers per grouped irecv (NCCL IB reports maxRecvs 8)
    let mut data = vec![0f32; count];
    let mut total = Duration::ZERO;
    for it in 0..o.warmup + o.iters {
        for (i, v) in data.iter_mut().enumerate() {
            *v = pattern::reduce_input(me, i);
        }
        let t0 = Instant::now();
        // 2(n-1) ring steps: reduce-scatter (reduce into data) then all-gather (copy into data)
        for step in 0..2 * (n - 1) {
            let (send_chunk, recv_chunk) = if step < n - 1 {
                ((me + n - step) % n, (me + n - step - 1) % n)
            } else {
                let s = step - (n - 1);
                ((me + 1 + n - s) % n, (me + n - s) % n)
            };
            let mut sends = vec![];
            let mut recvs = vec![];
            let mut layout = vec![]; // (channel, recv link, [(elem lo, elem hi, buf off)])
            for ch in 0..chans {
                let (clo, chi) = part(count, chans, ch);
                let (slo, shi) = part(chi - clo, n, send_chunk);
                let (rlo, rhi) = part(chi - clo, n, recv_chunk);
                let sl = c.send(next, ch)?;
                let rl = c.recv(prev, ch)?;
                {
                    let mut b = c.sends[sl].buf.lock()?;
                    pattern::put_f32s(
                        &mut b[..(shi - slo) * 4],
                        data[clo + slo..clo + shi].iter().copied(),
                    );
                }
                let mut off = 0;
                let mut tag = 0;
                while off < shi - slo {
                    let len = slice_elems.min(shi - slo - off);
                    sends.push(SendOp {
                        link: sl,
                        off: off * 4,
                        len: len * 4,
                        tag,
                    });
                    off += len;
                    tag += 1;
                }
                let mut pieces = vec![];
                let mut off = 0;
                while off < rhi - rlo {
                    let len = slice_elems.min(rhi - rlo - off);
                    pieces.push((off * 4, len * 4, pieces.len() as i32));
                    off += len;
                }
                for g in pieces.chunks(maxg) {
                    // tags restart per group, as the sender's do per group of maxg slices
                    let base = g.first().map(|p| p.2).unwrap_or(0);
                    recvs.push(RecvOp {
                        link: rl,
                        bufs: g.iter().map(|&(o, len, t)| (o, len, t - base)).collect(),
                    });
                }
                layout.push((rl, clo + rlo, rhi - rlo));
            }
            // sender tags restart per group of maxg slices too
            let mut per_link: HashMap<usize, i32> = HashMap::new();
            for s in &mut sends {
                let k = per_link.entry(s.link).or_insert(0);
                s.tag = *k % maxg as i32;
                *k += 1;
            }
            let got = exchange(net, c, &sends, &recvs, deadline)?;
            let mut gi = 0;
            for (rl, lo, len) in layout {
                let mut want = len * 4;
                let groups = len.div_ceil(slice_elems).div_ceil(maxg);
                for _ in 0..groups {
                    for sz in &got[gi] {
                        want = want.saturating_sub(*sz);
                    }
                    gi += 1;
                }
                l.check(check_size(len * 4 - want, len * 4, "allreduce step"));
                let b = c.recvs[rl].buf.lock()?;
                for i in 0..len {
                    let v = pattern::get_f32(&b, i);
                    if step < n - 1 {
                        data[lo + i] += v;
                    } else {
                        data[lo + i] = v;
                    }
                }
            }
        }
        if it >= o.warmup {
            total += t0.elapsed();
        }
        let bad = data
            .iter()
            .enumerate()
            .find(|(i, v)| **v != pattern::reduce_expected(n, *i));
        if let Some((i, v)) = bad {
            l.check(Err(Error::Remote(format!(
                "allreduce of {count} f32 iter {it}: element {i} is {v}, expected {}",
                pattern::reduce_expected(n, i)
            ))));
        }
    }
    l.time_us = total.as_secs_f64() * 1e6 / o.iters as f64;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_exactly() {
        for count in [0usize, 1, 5, 17, 1000] {
            for parts in 1..6 {
                let mut next = 0;
                for i in 0..parts {
                    let (lo, hi) = part(count, parts, i);
                    assert_eq!(lo, next);
                    next = hi;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn sizes_grow_and_reject_bad_input() {
        let o = Options {
            min_bytes: 8,
            max_bytes: 100,
            step_factor: 2,
            ..Options::default()
        };
        assert_eq!(sizes(&o).unwrap(), vec![8, 16, 32, 64]);
        assert!(
            sizes(&Options {
                min_bytes: 0,
                ..o.clone()
            })
            .is_err()
        );
        assert!(
            sizes(&Options {
                step_factor: 1,
                ..o
            })
            .is_err()
        );
    }
}
