//! The connections of one rank and the two loops every mode is built from: [`connect_all`]
//! (listen, exchange handles, connect and accept retried until non-NULL, register the buffers) and
//! [`exchange`] (post grouped receives and sends non-blocking, poll them with `test` until done).
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::clock::{Clock, Group};
use crate::error::{Error, Result};
use crate::ffi::loader::net::{
    CommRef, HANDLE_SIZE, Handle, Net, NetAttr, RecvBuf, Region, SharedBuf,
};

/// A connection, its buffer and the buffer's registration.
pub(crate) struct Link<C, M> {
    pub(crate) comm: Option<C>,
    pub(crate) buf: SharedBuf,
    pub(crate) mr: Option<M>,
}

/// Wall time of each step of one rank's connection set-up, seconds.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct SetupTimes {
    /// `listen` for every incoming connection.
    pub listen_s: f64,
    /// The handle exchange over the bootstrap (waits for the slowest rank's listens).
    pub exchange_s: f64,
    /// `connect` and `accept` retried until every connection is up: the plugin's handshake, queue
    /// pair creation and state transitions, and the wait for the peers doing theirs.
    pub connect_s: f64,
    /// `regMr` of every connection's buffer.
    pub register_s: f64,
    /// The barrier after (waits for the slowest rank).
    pub barrier_s: f64,
    /// All of the above.
    pub total_s: f64,
    /// Before all of the above and not in `total_s`: loading the plugin and its `init` (device
    /// discovery), once per process; 0 where the bench did not load a plugin.
    pub init_s: f64,
}

/// The connections of one rank, keyed by (peer, channel).
pub(crate) struct Conns<N: Net> {
    pub(crate) sends: Vec<Link<N::SendComm, N::Mr>>,
    send_key: HashMap<(usize, usize), usize>,
    pub(crate) recvs: Vec<Link<N::RecvComm, N::Mr>>,
    recv_key: HashMap<(usize, usize), usize>,
    /// How long [`connect_all`] took, per step.
    pub(crate) setup: SetupTimes,
    /// Bytes this rank's completed sends and receives moved through the plugin.
    pub(crate) moved: Moved,
}

/// Bytes moved through the plugin by one rank: the sizes of its completed `isend`s and what
/// `test` reported for its completed receives, warm-up, tokens and checks included (what the
/// plugin's own counters must add up to).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Moved {
    pub sent_bytes: u64,
    pub received_bytes: u64,
}

impl<N: Net> Conns<N> {
    pub(crate) fn send(&self, peer: usize, ch: usize) -> Result<usize> {
        self.send_key.get(&(peer, ch)).copied().ok_or_else(|| {
            Error::Internal(format!("no send connection to rank {peer} channel {ch}"))
        })
    }
    pub(crate) fn recv(&self, peer: usize, ch: usize) -> Result<usize> {
        self.recv_key.get(&(peer, ch)).copied().ok_or_else(|| {
            Error::Internal(format!(
                "no receive connection from rank {peer} channel {ch}"
            ))
        })
    }
}

/// Fails past `deadline` (real time: a safety net, also in virtual time), else lets the clock wait.
pub(crate) fn wait_tick(
    clock: &impl Clock,
    progressed: bool,
    deadline: Instant,
    what: impl FnOnce() -> String,
) -> Result<()> {
    if Instant::now() > deadline {
        return Err(Error::Timeout(what()));
    }
    clock.idle(progressed)
}

/// Listens for `ins`, exchanges the handles, connects `outs` and accepts `ins` (both retried until
/// non-NULL, interleaved like NCCL's service thread), then registers the buffers. With a `hint`,
/// `setNetAttr(hint)` goes right before every `connect` and `accept` call, as NCCL's
/// `sendConnect`/`recvConnect` give the connection's connect-time hint before the proxy's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn connect_all<N: Net>(
    net: &N,
    boot: &mut impl Group,
    outs: &[(usize, usize)],
    ins: &[(usize, usize)],
    send_bytes: usize,
    recv_bytes: usize,
    dev: Option<usize>,
    timeout: Duration,
    hint: Option<&NetAttr>,
) -> Result<Conns<N>> {
    let me = boot.rank();
    let t0 = Instant::now();
    let mut setup = SetupTimes::default();
    let mut lap = {
        let mut t = t0;
        move || {
            let now = Instant::now();
            let d = now.duration_since(t).as_secs_f64();
            t = now;
            d
        }
    };
    let ndev = net.devices()?;
    if ndev == 0 {
        return Err(Error::System(format!(
            "plugin {} reports 0 devices",
            net.name()
        )));
    }
    let dev_for = |peer: usize, ch: usize| -> Result<usize> {
        match dev {
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
    setup.listen_s = lap();
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
    setup.exchange_s = lap();
    let deadline = Instant::now() + timeout;
    let mut sends: Vec<Option<N::SendComm>> = outs.iter().map(|_| None).collect();
    let mut recvs: Vec<Option<N::RecvComm>> = ins.iter().map(|_| None).collect();
    loop {
        let mut pending = 0;
        for (i, ((dst, ch), h)) in handles.iter_mut().enumerate() {
            if sends[i].is_none() {
                if let Some(h) = hint {
                    net.set_net_attr(h)?;
                }
                sends[i] = net.connect(dev_for(*dst, *ch)?, h)?;
                pending += usize::from(sends[i].is_none());
            }
        }
        for (i, (_, l)) in listens.iter_mut().enumerate() {
            if recvs[i].is_none() {
                if let Some(lc) = l.as_mut() {
                    if let Some(h) = hint {
                        net.set_net_attr(h)?;
                    }
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
        // Set-up takes no modelled time: wait in real time (the peers' connects need no clock).
        wait_tick(&super::clock::WallClock, false, deadline, || {
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
                timeout.as_secs(),
                o.join(", ")
            )
        })?;
    }
    setup.connect_s = lap();
    let mut c = Conns::<N> {
        sends: Vec::new(),
        moved: Moved::default(),
        send_key: HashMap::new(),
        recvs: Vec::new(),
        recv_key: HashMap::new(),
        setup,
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
    c.setup.register_s = lap();
    boot.barrier()?;
    c.setup.barrier_s = lap();
    c.setup.total_s = t0.elapsed().as_secs_f64();
    Ok(c)
}

pub(crate) fn close_all<N: Net>(net: &N, c: Conns<N>) -> Result<()> {
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

/// One isend: link index, offset and length in its buffer, tag.
pub(crate) struct SendOp {
    pub(crate) link: usize,
    pub(crate) off: usize,
    pub(crate) len: usize,
    pub(crate) tag: i32,
}

/// One grouped irecv.
pub(crate) struct RecvOp {
    pub(crate) link: usize,
    /// (offset, len, tag) of each buffer of one grouped irecv.
    pub(crate) bufs: Vec<(usize, usize, i32)>,
}

/// Posts every receive (grouped), then every send, and polls all of them until done. Returns the
/// received sizes of each receive. A NULL isend/irecv is posted again on the next pass.
pub(crate) fn exchange<N: Net>(
    net: &N,
    clock: &impl Clock,
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
        // whether this pass posted or finished anything (the virtual clock waits only after none)
        let mut progressed = false;
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
                progressed |= rreq[i].is_some();
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
                    c.moved.received_bytes += sz.iter().map(|&n| n as u64).sum::<u64>();
                    rsz[i] = Some(sz);
                    rreq[i] = None;
                    progressed = true;
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
                progressed |= sreq[i].is_some();
            }
            if sreq[i].is_none() {
                // send links are keyed from the top so they never collide with receive links
                blocked.insert(usize::MAX - s.link);
            }
            if let Some(q) = sreq[i].as_mut() {
                if net.test(q)?.is_some() {
                    c.moved.sent_bytes += s.len as u64;
                    sdone[i] = true;
                    sreq[i] = None;
                    progressed = true;
                    continue;
                }
            }
            pending += 1;
        }
        if pending == 0 {
            return Ok(rsz.into_iter().map(|s| s.unwrap_or_default()).collect());
        }
        wait_tick(clock, progressed, deadline, || {
            format!(
                "{pending} of {} transfers still pending",
                sends.len() + recvs.len()
            )
        })?;
    }
}
