//! An in-process [`Net`] for tests: ranks are threads, a [`LoopbackFabric`] is the wire. It keeps
//! NCCL's contract where the modes could get it wrong: a send completes only once a matching
//! receive took it (so a mode that waits for its sends before posting receives deadlocks, as it
//! would on a real transport); `connect` returns NULL a few times and keeps its retry state in the
//! handle (so the handle must be the same copy on every retry); `isend` sometimes returns NULL;
//! buffers must be registered; a grouped receive matches by tag. It can corrupt one delivered
//! message, to prove that verification catches it.
#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::bootstrap::Bootstrap;
use super::modes::{Options, Report, run};
use crate::error::{Error, Result};
use crate::ffi::loader::net::{
    CommRef, HANDLE_SIZE, Handle, Net, NetAttr, PTR_HOST, Properties, RecvBuf, Region, SharedBuf,
};
use crate::sync::lock;

const MAGIC: &[u8; 8] = b"LOOPBACK";

/// How the loopback fabric behaves.
#[derive(Debug, Clone)]
pub struct LoopbackConfig {
    /// Devices each rank sees.
    pub devices: usize,
    /// `connect` returns NULL this many times before it connects.
    pub connect_nulls: u8,
    /// Every n-th `isend` call returns NULL (0: never).
    pub isend_null_every: u64,
    /// Flip one byte of the n-th delivered message (1-based, counted over the whole fabric).
    pub corrupt_message: Option<u64>,
    /// `maxRecvs` reported by `getProperties`.
    pub max_recvs: i32,
    /// A message is delivered no sooner than this after its `isend`: a slow wire that still moves.
    pub latency: Duration,
}

impl Default for LoopbackConfig {
    fn default() -> Self {
        LoopbackConfig {
            devices: 2,
            connect_nulls: 2,
            isend_null_every: 5,
            corrupt_message: None,
            max_recvs: 8,
            latency: Duration::ZERO,
        }
    }
}

struct FabricState {
    next_id: u64,
    listeners: HashMap<u64, Sender<Arc<Wire>>>,
    /// Nets made on this fabric so far (each net's id in [`LoopbackFabric::setup_calls`]).
    nets: u64,
    /// Every `setNetAttr`, `connect` and `accept` call, in order, by net.
    calls: Vec<(u64, SetupCall)>,
}

/// A set-up call a [`LoopbackNet`] took, for tests of what the bench calls and in which order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupCall {
    NetAttr(NetAttr),
    Connect,
    Accept,
}

/// The shared wire of all loopback ranks in a process.
pub struct LoopbackFabric {
    cfg: LoopbackConfig,
    state: Mutex<FabricState>,
    delivered: AtomicU64,
}

impl LoopbackFabric {
    pub fn new(cfg: LoopbackConfig) -> Arc<Self> {
        Arc::new(LoopbackFabric {
            cfg,
            state: Mutex::new(FabricState {
                next_id: 1,
                listeners: HashMap::new(),
                nets: 0,
                calls: Vec::new(),
            }),
            delivered: AtomicU64::new(0),
        })
    }

    /// Every `setNetAttr`, `connect` and `accept` call so far, in order, each with the id of the
    /// net (rank) that took it (0, 1, ... in the order the nets were made).
    pub fn setup_calls(&self) -> Vec<(u64, SetupCall)> {
        lock(&self.state, "loopback fabric").map_or_else(|_| Vec::new(), |s| s.calls.clone())
    }

    fn record(&self, net: u64, call: SetupCall) -> Result<()> {
        lock(&self.state, "loopback fabric")?
            .calls
            .push((net, call));
        Ok(())
    }

    /// Messages delivered so far.
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }
}

struct Msg {
    tag: i32,
    data: Vec<u8>,
    done: Arc<AtomicBool>,
    sent: Instant,
}

struct RecvState {
    bufs: Vec<(Region, i32, Option<usize>)>,
}

#[derive(Default)]
struct WireState {
    msgs: VecDeque<Msg>,
    recvs: VecDeque<Arc<Mutex<RecvState>>>,
    closed: bool,
}

struct Wire {
    st: Mutex<WireState>,
}

impl Wire {
    fn progress(&self, fabric: &LoopbackFabric) -> Result<()> {
        let mut st = lock(&self.st, "loopback wire")?;
        loop {
            let Some(rs) = st.recvs.front().cloned() else {
                return Ok(());
            };
            let Some(msg) = st.msgs.front() else {
                return Ok(());
            };
            if msg.sent.elapsed() < fabric.cfg.latency {
                return Ok(());
            }
            let mut rs = lock(&rs, "loopback receive")?;
            let Some(slot) = rs
                .bufs
                .iter_mut()
                .find(|(_, tag, filled)| *tag == msg.tag && filled.is_none())
            else {
                let tags: Vec<i32> = rs.bufs.iter().map(|b| b.1).collect();
                return Err(Error::Remote(format!(
                    "loopback: send with tag {} matches no buffer of the first pending receive (tags {tags:?})",
                    msg.tag
                )));
            };
            if msg.data.len() > slot.0.len {
                return Err(Error::Remote(format!(
                    "loopback: a {} B send into a {} B receive buffer",
                    msg.data.len(),
                    slot.0.len
                )));
            }
            {
                let mut b = slot.0.buf.lock()?;
                let dst = &mut b[slot.0.offset..slot.0.offset + msg.data.len()];
                dst.copy_from_slice(&msg.data);
                let n = fabric.delivered.fetch_add(1, Ordering::Relaxed) + 1;
                if fabric.cfg.corrupt_message == Some(n) && !dst.is_empty() {
                    let k = dst.len() / 2;
                    dst[k] ^= 0x40;
                }
            }
            slot.2 = Some(msg.data.len());
            msg.done.store(true, Ordering::Release);
            st.msgs.pop_front();
            if rs.bufs.iter().all(|b| b.2.is_some()) {
                drop(rs);
                st.recvs.pop_front();
            }
        }
    }
}

/// One rank's view of a [`LoopbackFabric`].
pub struct LoopbackNet {
    fabric: Arc<LoopbackFabric>,
    inited: bool,
    isends: AtomicU64,
    id: u64,
}

impl LoopbackNet {
    pub fn new(fabric: Arc<LoopbackFabric>) -> Self {
        let id = lock(&fabric.state, "loopback fabric").map_or(u64::MAX, |mut s| {
            s.nets += 1;
            s.nets - 1
        });
        LoopbackNet {
            fabric,
            inited: false,
            isends: AtomicU64::new(0),
            id,
        }
    }

    fn check_dev(&self, dev: usize) -> Result<()> {
        if !self.inited {
            return Err(Error::InvalidArgument(
                "loopback: called before init".into(),
            ));
        }
        if dev >= self.fabric.cfg.devices {
            return Err(Error::InvalidArgument(format!(
                "loopback: device {dev} (accepted: 0..{})",
                self.fabric.cfg.devices
            )));
        }
        Ok(())
    }
}

pub struct LoopListen {
    rx: Receiver<Arc<Wire>>,
}
pub struct LoopSend {
    wire: Arc<Wire>,
}
pub struct LoopRecv {
    wire: Arc<Wire>,
}
pub struct LoopMr {
    buf: SharedBuf,
}
/// A loopback request (opaque).
pub struct LoopRequest(Req);
enum Req {
    Send {
        wire: Arc<Wire>,
        done: Arc<AtomicBool>,
        size: usize,
    },
    Recv {
        wire: Arc<Wire>,
        st: Arc<Mutex<RecvState>>,
    },
    Finished,
}

impl Net for LoopbackNet {
    type ListenComm = LoopListen;
    type SendComm = LoopSend;
    type RecvComm = LoopRecv;
    type Mr = LoopMr;
    type Request = LoopRequest;

    fn name(&self) -> String {
        "loopback".into()
    }

    fn init(&mut self, _comm_id: u64) -> Result<()> {
        self.inited = true;
        Ok(())
    }

    fn devices(&self) -> Result<usize> {
        Ok(self.fabric.cfg.devices)
    }

    fn get_properties(&self, dev: usize) -> Result<Properties> {
        self.check_dev(dev)?;
        Ok(Properties {
            name: format!("loop{dev}"),
            pci_path: String::new(),
            guid: dev as u64,
            ptr_support: PTR_HOST,
            speed_mbps: 100_000,
            port: 1,
            latency_us: 0.0,
            max_comms: 1024,
            max_recvs: self.fabric.cfg.max_recvs,
            max_p2p_bytes: 1 << 30,
        })
    }

    fn listen(&self, dev: usize) -> Result<(Handle, LoopListen)> {
        self.check_dev(dev)?;
        let (tx, rx) = channel();
        let mut st = lock(&self.fabric.state, "loopback fabric")?;
        let id = st.next_id;
        st.next_id += 1;
        st.listeners.insert(id, tx);
        let mut h = [0u8; HANDLE_SIZE];
        h[..8].copy_from_slice(MAGIC);
        h[8..16].copy_from_slice(&id.to_le_bytes());
        Ok((h, LoopListen { rx }))
    }

    fn set_net_attr(&self, attr: &NetAttr) -> Result<bool> {
        self.fabric.record(self.id, SetupCall::NetAttr(*attr))?;
        Ok(true)
    }

    fn connect(&self, dev: usize, handle: &mut Handle) -> Result<Option<LoopSend>> {
        self.check_dev(dev)?;
        self.fabric.record(self.id, SetupCall::Connect)?;
        if &handle[..8] != MAGIC {
            return Err(Error::Remote(
                "loopback: connect handle has no LOOPBACK magic (not from a loopback listen)"
                    .into(),
            ));
        }
        // retry state lives in the handle, like NCCL IB's handle->stage
        if handle[16] < self.fabric.cfg.connect_nulls {
            handle[16] += 1;
            return Ok(None);
        }
        let mut idb = [0u8; 8];
        idb.copy_from_slice(&handle[8..16]);
        let id = u64::from_le_bytes(idb);
        let tx = lock(&self.fabric.state, "loopback fabric")?
            .listeners
            .remove(&id)
            .ok_or_else(|| {
                Error::Remote(format!(
                    "loopback: listen {id} is gone or already connected"
                ))
            })?;
        let wire = Arc::new(Wire {
            st: Mutex::new(WireState::default()),
        });
        tx.send(wire.clone())
            .map_err(|_| Error::Remote(format!("loopback: listen {id} was closed")))?;
        Ok(Some(LoopSend { wire }))
    }

    fn accept(&self, listen: &mut LoopListen) -> Result<Option<LoopRecv>> {
        self.fabric.record(self.id, SetupCall::Accept)?;
        Ok(listen.rx.try_recv().ok().map(|wire| LoopRecv { wire }))
    }

    fn reg_mr(&self, _comm: CommRef<'_, Self>, buf: &SharedBuf) -> Result<LoopMr> {
        Ok(LoopMr { buf: buf.clone() })
    }

    fn dereg_mr(&self, _comm: CommRef<'_, Self>, _mr: LoopMr) -> Result<()> {
        Ok(())
    }

    fn isend(
        &self,
        comm: &mut LoopSend,
        data: &Region,
        tag: i32,
        mr: &LoopMr,
    ) -> Result<Option<LoopRequest>> {
        if !mr.buf.same(&data.buf) {
            return Err(Error::InvalidArgument(
                "loopback: isend with the mhandle of another buffer".into(),
            ));
        }
        let n = self.isends.fetch_add(1, Ordering::Relaxed) + 1;
        let every = self.fabric.cfg.isend_null_every;
        if every > 0 && n % every == 0 {
            return Ok(None);
        }
        let bytes = data.buf.lock()?[data.offset..data.offset + data.len].to_vec();
        let done = Arc::new(AtomicBool::new(false));
        let mut st = lock(&comm.wire.st, "loopback wire")?;
        if st.closed {
            return Err(Error::Remote(
                "loopback: isend on a closed connection".into(),
            ));
        }
        st.msgs.push_back(Msg {
            tag,
            data: bytes,
            done: done.clone(),
            sent: Instant::now(),
        });
        Ok(Some(LoopRequest(Req::Send {
            wire: comm.wire.clone(),
            done,
            size: data.len,
        })))
    }

    fn irecv(
        &self,
        comm: &mut LoopRecv,
        bufs: &[RecvBuf<'_, Self>],
    ) -> Result<Option<LoopRequest>> {
        if bufs.is_empty() || bufs.len() > self.fabric.cfg.max_recvs as usize {
            return Err(Error::InvalidArgument(format!(
                "loopback: irecv of {} buffers (accepted: 1..{})",
                bufs.len(),
                self.fabric.cfg.max_recvs
            )));
        }
        for b in bufs {
            if !b.mr.buf.same(&b.region.buf) {
                return Err(Error::InvalidArgument(
                    "loopback: irecv with the mhandle of another buffer".into(),
                ));
            }
        }
        let st = Arc::new(Mutex::new(RecvState {
            bufs: bufs
                .iter()
                .map(|b| (b.region.clone(), b.tag, None))
                .collect(),
        }));
        let mut w = lock(&comm.wire.st, "loopback wire")?;
        if w.closed {
            return Err(Error::Remote(
                "loopback: irecv on a closed connection".into(),
            ));
        }
        w.recvs.push_back(st.clone());
        Ok(Some(LoopRequest(Req::Recv {
            wire: comm.wire.clone(),
            st,
        })))
    }

    fn test(&self, req: &mut LoopRequest) -> Result<Option<Vec<usize>>> {
        let out = match &mut req.0 {
            Req::Send { wire, done, size } => {
                wire.progress(&self.fabric)?;
                done.load(Ordering::Acquire).then(|| vec![*size])
            }
            Req::Recv { wire, st } => {
                wire.progress(&self.fabric)?;
                let s = lock(st, "loopback receive")?;
                if s.bufs.iter().all(|b| b.2.is_some()) {
                    Some(s.bufs.iter().map(|b| b.2.unwrap_or(0)).collect())
                } else {
                    None
                }
            }
            Req::Finished => {
                return Err(Error::InvalidArgument(
                    "loopback: test on a request that already completed".into(),
                ));
            }
        };
        if out.is_some() {
            req.0 = Req::Finished;
        }
        Ok(out)
    }

    fn close_send(&self, comm: LoopSend) -> Result<()> {
        lock(&comm.wire.st, "loopback wire")?.closed = true;
        Ok(())
    }

    fn close_recv(&self, comm: LoopRecv) -> Result<()> {
        lock(&comm.wire.st, "loopback wire")?.closed = true;
        Ok(())
    }

    fn close_listen(&self, _listen: LoopListen) -> Result<()> {
        Ok(())
    }

    fn finalize(&mut self) -> Result<()> {
        self.inited = false;
        Ok(())
    }
}

/// Runs `nranks` ranks as threads over one loopback fabric (bootstrap on 127.0.0.1) and returns
/// rank 0's report; the first error of any rank is returned instead.
pub fn run_ranks(o: &Options, nranks: usize, cfg: LoopbackConfig) -> Result<Report> {
    run_ranks_on(o, nranks, LoopbackFabric::new(cfg))
}

/// [`run_ranks`] on a given fabric (read its [`LoopbackFabric::setup_calls`] after).
pub fn run_ranks_on(o: &Options, nranks: usize, fabric: Arc<LoopbackFabric>) -> Result<Report> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::io("bootstrap bind 127.0.0.1:0", e))?;
    let addr = l
        .local_addr()
        .map_err(|e| Error::io("bootstrap address", e))?
        .to_string();
    let handles: Vec<_> = (1..nranks)
        .map(|r| {
            let (f, o, addr) = (fabric.clone(), o.clone(), addr.clone());
            std::thread::spawn(move || -> Result<Report> {
                let mut boot = Bootstrap::join(&addr, r, nranks, o.timeout)?;
                let mut net = LoopbackNet::new(f);
                Net::init(&mut net, 1)?;
                let rep = run(&net, &mut boot, &o)?;
                Net::finalize(&mut net)?;
                Ok(rep)
            })
        })
        .collect();
    let root = (|| {
        let mut boot = Bootstrap::root(l, nranks, o.timeout)?;
        let mut net = LoopbackNet::new(fabric.clone());
        Net::init(&mut net, 1)?;
        let rep = run(&net, &mut boot, o)?;
        Net::finalize(&mut net)?;
        Ok::<_, Error>(rep)
    })();
    for h in handles {
        match h.join() {
            Ok(r) => {
                r?;
            }
            Err(_) => return Err(Error::Internal("a loopback rank thread panicked".into())),
        }
    }
    root
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(cfg: LoopbackConfig) -> (LoopbackNet, LoopSend, LoopRecv) {
        let f = LoopbackFabric::new(cfg);
        let mut a = LoopbackNet::new(f.clone());
        a.init(1).unwrap();
        let (mut h, mut l) = a.listen(0).unwrap();
        let mut tries = 0;
        let s = loop {
            tries += 1;
            if let Some(s) = a.connect(1, &mut h).unwrap() {
                break s;
            }
        };
        assert_eq!(
            tries, 3,
            "two NULLs, then the connection (state kept in the handle)"
        );
        let r = a.accept(&mut l).unwrap().unwrap();
        (a, s, r)
    }

    #[test]
    fn a_send_completes_only_when_a_receive_takes_it() {
        let (n, mut s, mut r) = pair(LoopbackConfig {
            isend_null_every: 0,
            ..LoopbackConfig::default()
        });
        let sb = SharedBuf::new(16);
        let rb = SharedBuf::new(16);
        sb.lock().unwrap().copy_from_slice(&[7u8; 16]);
        let smr = n.reg_mr(CommRef::Send(&s), &sb).unwrap();
        let rmr = n.reg_mr(CommRef::Recv(&r), &rb).unwrap();
        let mut sq = n
            .isend(&mut s, &Region::new(&sb, 0, 16).unwrap(), 3, &smr)
            .unwrap()
            .unwrap();
        assert_eq!(n.test(&mut sq).unwrap(), None);
        let bufs = [RecvBuf {
            region: Region::new(&rb, 0, 16).unwrap(),
            tag: 3,
            mr: &rmr,
        }];
        let mut rq = n.irecv(&mut r, &bufs).unwrap().unwrap();
        assert_eq!(n.test(&mut sq).unwrap(), Some(vec![16]));
        assert_eq!(n.test(&mut rq).unwrap(), Some(vec![16]));
        assert_eq!(&rb.lock().unwrap()[..], &[7u8; 16]);
        assert!(
            n.test(&mut rq).is_err(),
            "testing a finished request is a misuse"
        );
    }

    #[test]
    fn unregistered_buffers_wrong_tags_and_short_receives_are_errors() {
        let (n, mut s, mut r) = pair(LoopbackConfig {
            isend_null_every: 0,
            ..LoopbackConfig::default()
        });
        let sb = SharedBuf::new(16);
        let other = SharedBuf::new(16);
        let mr_other = n.reg_mr(CommRef::Send(&s), &other).unwrap();
        assert!(
            n.isend(&mut s, &Region::new(&sb, 0, 16).unwrap(), 0, &mr_other)
                .is_err()
        );
        let smr = n.reg_mr(CommRef::Send(&s), &sb).unwrap();
        let rb = SharedBuf::new(8);
        let rmr = n.reg_mr(CommRef::Recv(&r), &rb).unwrap();
        let _sq = n
            .isend(&mut s, &Region::new(&sb, 0, 16).unwrap(), 1, &smr)
            .unwrap()
            .unwrap();
        let bufs = [RecvBuf {
            region: Region::new(&rb, 0, 8).unwrap(),
            tag: 2,
            mr: &rmr,
        }];
        let mut rq = n.irecv(&mut r, &bufs).unwrap().unwrap();
        assert!(n.test(&mut rq).unwrap_err().to_string().contains("tag 1"));
        assert!(Region::new(&rb, 4, 8).is_err());
        // a receive smaller than the send
        let (n, mut s, mut r) = pair(LoopbackConfig {
            isend_null_every: 0,
            ..LoopbackConfig::default()
        });
        let smr = n.reg_mr(CommRef::Send(&s), &sb).unwrap();
        let rmr = n.reg_mr(CommRef::Recv(&r), &rb).unwrap();
        let _sq = n
            .isend(&mut s, &Region::new(&sb, 0, 16).unwrap(), 1, &smr)
            .unwrap()
            .unwrap();
        let bufs = [RecvBuf {
            region: Region::new(&rb, 0, 8).unwrap(),
            tag: 1,
            mr: &rmr,
        }];
        let mut rq = n.irecv(&mut r, &bufs).unwrap().unwrap();
        let e = n.test(&mut rq).unwrap_err().to_string();
        assert!(e.contains("16 B send into a 8 B receive"), "{e}");
    }
}
