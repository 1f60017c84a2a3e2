//! The production [`PathFactory`]: [`NetFactory`] carries a connection over RoCE (ibverbs RC QPs,
//! through [`VerbsFactory`]) or over TCP ([`TcpConn`] over [`crate::transport::tcp`]), whichever the
//! route chose.
//!
//! * `NCCL_SWITCHLESS_TRANSPORT=rdma`: RDMA devices only (as [`VerbsFactory`]).
//! * `auto` (default): RDMA devices when the host has a usable one; routing tries RoCE first and
//!   falls back to TCP on point-to-point links ([`tcp_data_link`]). A host without RDMA devices
//!   exposes one NCCL device per netdev that has a TCP point-to-point link ([`tcp_host`]).
//! * `tcp`: TCP only, even where RDMA exists.
#![forbid(unsafe_code)]

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::verbs::VerbsFactory;
use crate::config::{Config, TcpStreams, TransportMode};
use crate::error::{Error, Result};
use crate::host::{HostModel, NcclDevice};
use crate::plugin::switchless::{
    ConnOptions, Connectable, HostView, PathFactory, PathPlan, PinnedReader, Switchless,
};
use crate::route::types::{LinkKind, LocalLink};
use crate::sync::lock;
use crate::sys::rawmem::Lent;
use crate::transport::fabric::{
    Completion, CtrlMem, Fabric, MemKind, PathInfo, ReadWr, Registration, WriteWr,
};
use crate::transport::handshake::PathParams;
use crate::transport::handshake::auth::ConnSecret;
use crate::transport::tcp::{
    self, TcpAcceptor, TcpConfig, TcpConnector, TcpFabric, TcpPathSpec, per_path_streams,
};
use crate::verbs::fabric::VerbsFabric;

/// Whether `l` may carry TCP data: its subnet is /30 or /31, so the cable's far end is the only
/// neighbour, or `fallback` (`NCCL_SWITCHLESS_TCP_FALLBACK=1`) allows any subnet. The rule keeps a
/// management NIC or a default-route LAN from becoming a data path.
pub fn tcp_data_link(l: &LocalLink, fallback: bool) -> bool {
    fallback || crate::route::point_to_point(l.addr)
}

/// The netdev MTU as a handshake MTU (256..=65536 bytes; unknown = 1500).
fn wire_mtu(mtu: u32) -> u32 {
    if mtu == 0 {
        1500
    } else {
        mtu.clamp(256, 65536)
    }
}

/// TCP settings of one connection from the configuration.
pub fn tcp_config(config: &Config, npaths: usize) -> TcpConfig {
    TcpConfig {
        streams: match config.tcp_streams {
            TcpStreams::Auto => None,
            TcpStreams::Fixed(n) => Some(per_path_streams(usize::from(n), npaths)),
        },
        connect_timeout: config.connect_timeout,
        io_threads: config.tcp_threads.map(usize::from),
        user_timeout: config.tcp_user_timeout,
        ..TcpConfig::default()
    }
}

/// The TCP links and devices of a host without usable RDMA: every IPv4 address of every netdev but
/// `lo` is a link (all are advertised in listen handles); every netdev with an up point-to-point
/// address is an NCCL device `sl_<netdev>` (host memory only, speed = netdev speed, 10 Gb/s when
/// unknown), and its point-to-point links belong to it.
pub fn tcp_host(model: &HostModel) -> (Vec<LocalLink>, Vec<NcclDevice>) {
    let mut links = Vec::new();
    let mut devices: Vec<NcclDevice> = Vec::new();
    for n in model.netdevs.iter().filter(|n| n.name != "lo") {
        let func = n.pci.as_deref().and_then(|b| model.pci(b));
        let pci_root = func.map(|f| f.root.clone()).unwrap_or_default();
        // NCCL places a device in its topology by this path (as its socket transport does); without
        // it NCCL attaches the device to the first CPU, losing NUMA locality on two-socket hosts.
        let pci_path = func.map(|f| f.path.clone()).unwrap_or_default();
        for a in &n.addrs {
            let mut l = LocalLink {
                id: links.len(),
                kind: LinkKind::Tcp,
                netdev: n.name.clone(),
                rdma_dev: None,
                port: 0,
                addr: a.addr,
                gid_index: None,
                pci_root: pci_root.clone(),
                phys_port_id: u16::MAX,
                nccl_dev: None,
                speed_mbps: n.speed_mbps.unwrap_or(0),
                mtu: n.mtu.unwrap_or(0),
                active_mtu: 0,
                up: n.is_up(),
            };
            if l.up && tcp_data_link(&l, false) {
                let idx = match devices
                    .iter()
                    .position(|d| d.name == format!("sl_{}", n.name))
                {
                    Some(i) => i,
                    None => {
                        let speed = n.speed_mbps.filter(|&s| s > 0).unwrap_or(10_000);
                        devices.push(NcclDevice {
                            index: devices.len(),
                            name: format!("sl_{}", n.name),
                            members: Vec::new(),
                            pci_path: pci_path.clone(),
                            guid: name_guid(&n.name),
                            speed_mbps: speed,
                            port: 1,
                            latency_us: 0.0,
                            max_comms: 65536,
                            max_recvs: 8,
                            ptr_support: crate::host::nccl::PTR_HOST,
                            max_p2p_bytes: 1 << 40,
                            rail_id: -1,
                            plane_id: -1,
                            phys_port_id: u16::try_from(devices.len()).unwrap_or(u16::MAX),
                            peers: Vec::new(),
                        });
                        devices.len() - 1
                    }
                };
                l.nccl_dev = Some(idx);
                let net = a.addr.trunc();
                devices[idx].peers.extend(
                    net.hosts()
                        .filter(|h| *h != a.addr.addr())
                        .chain((a.addr.prefix_len() == 31).then_some(net.network()))
                        .filter(|h| *h != a.addr.addr())
                        .take(2),
                );
            }
            links.push(l);
        }
    }
    (links, devices)
}

/// The INFO line of a host the plugin carries over TCP because no RDMA device opened (`no_rdma`,
/// the RDMA factory's error): what the plugin does, worded so that no one grepping NCCL's log for
/// "system error" or "internal transports" takes it for the plugin failing.
pub fn tcp_carry_note(no_rdma: &Error, devices: &[&str]) -> String {
    let why = match no_rdma {
        Error::System(m) => m.as_str(),
        e => return format!("{e}: using TCP on {}", tcp_devices(devices)),
    };
    let why = why
        .strip_suffix("; NCCL will use its internal transports")
        .unwrap_or(why);
    format!(
        "{why}; using TCP on {} (the plugin carries every connection)",
        tcp_devices(devices)
    )
}

fn tcp_devices(devices: &[&str]) -> String {
    format!(
        "{} point-to-point {} ({})",
        devices.len(),
        if devices.len() == 1 {
            "netdev"
        } else {
            "netdevs"
        },
        devices.join(", ")
    )
}

/// A stable 64-bit id from a netdev name, so NCCL sees distinct ports.
fn name_guid(name: &str) -> u64 {
    crate::host::nccl::stable_guid(name)
}

/// RoCE over verbs, TCP over sockets. See the module docs.
#[derive(Debug)]
pub struct NetFactory {
    verbs: Option<VerbsFactory>,
    config: Config,
}

impl NetFactory {
    /// A TCP-only factory (tests, and hosts without RDMA): the host view is the caller's.
    pub fn tcp_only(config: Config) -> NetFactory {
        NetFactory {
            verbs: None,
            config,
        }
    }
}

impl PathFactory for NetFactory {
    type Fabric = NetConn;

    fn slot() -> &'static crate::plugin::Slot<Switchless<Self>> {
        static SLOT: crate::plugin::Slot<Switchless<NetFactory>> = crate::plugin::Slot::new();
        &SLOT
    }

    fn open() -> Result<(Self, HostView)> {
        let config = Config::from_env()?;
        let mut no_rdma = None;
        if config.transport != TransportMode::Tcp {
            match VerbsFactory::open() {
                Ok((v, view)) => {
                    let config = view.config.clone();
                    return Ok((
                        NetFactory {
                            verbs: Some(v),
                            config,
                        },
                        view,
                    ));
                }
                Err(e) if config.transport == TransportMode::Rdma => return Err(e),
                Err(e) => no_rdma = Some(e),
            }
        }
        let (model, findings) = crate::host::discover(Path::new("/"));
        let (links, devices) = tcp_host(&model);
        if devices.is_empty() {
            let why = "no TCP point-to-point link either (an up IPv4 address on a /30 or /31 \
                       subnet; wider subnets such as a management LAN are never data paths)";
            return Err(match no_rdma {
                Some(Error::System(m)) => Error::System(format!("{m}; {why}")),
                Some(e) => e,
                None => Error::System(format!(
                    "NCCL_SWITCHLESS_TRANSPORT=tcp: {why}; NCCL will use its internal transports"
                )),
            });
        }
        crate::host::log_findings(&findings);
        if let Some(e) = no_rdma {
            let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
            tracing::info!("NET/switchless: {}", tcp_carry_note(&e, &names));
        }
        let routes = model.routes();
        Ok((
            NetFactory {
                verbs: None,
                config: config.clone(),
            },
            HostView {
                config,
                devices,
                links,
                routes,
            },
        ))
    }

    fn create(
        &self,
        paths: &[PathPlan],
        peer: Option<&[PathParams]>,
        opts: &ConnOptions,
    ) -> Result<NetConn> {
        let tcp = paths.iter().filter(|p| p.kind == LinkKind::Tcp).count();
        if tcp == 0 {
            let v = self.verbs.as_ref().ok_or_else(|| {
                Error::InvalidUsage(
                    "a RoCE path was chosen but this process opened no RDMA device".into(),
                )
            })?;
            return Ok(NetConn::Verbs(v.create(paths, peer, opts)?));
        }
        if tcp != paths.len() {
            return Err(Error::Internal(format!(
                "a connection mixes {tcp} TCP and {} RoCE paths; one kind per connection is supported",
                paths.len() - tcp
            )));
        }
        let cfg = tcp_config(&self.config, paths.len());
        Ok(NetConn::Tcp(TcpConn::create(
            paths,
            peer.is_some(),
            &opts.secret,
            &cfg,
        )?))
    }

    /// The verbs devices' figures; TCP paths pin nothing (their buffers are copied by the
    /// kernel), so a TCP-only process reports 0 for every device.
    fn pinned_reader(&self, devices: &[NcclDevice]) -> PinnedReader {
        match &self.verbs {
            Some(v) => v.pinned_reader(devices),
            None => Arc::new(|_| 0),
        }
    }
}

/// How far a [`TcpConn`]'s streams are.
enum Setup {
    /// Acceptor: listening on every path.
    Accepting(Option<TcpAcceptor>),
    /// Connector: waiting for the acceptor's ports ([`Connectable::connect_peer`]).
    AwaitingPeer(Vec<TcpPathSpec>),
    /// Connector: streams opened, waiting for the acknowledgements.
    Connecting(Option<TcpConnector>),
    /// Every stream is up.
    Ready,
    /// The set-up failed (or the endpoint was shut down before it finished).
    Failed,
}

/// One connection over TCP paths: a [`TcpFabric`] whose streams connect after the handshake.
///
/// The acceptor's `create` opens one listener per path on the path's local address (port 0) and
/// sends the ports in its [`PathParams::addr`] and its netdev MTU in `mtu`. The connector, after the
/// reply, opens the streams to those ports; each stream proves the connection's secret from the
/// authenticated handshake ([`ConnOptions::secret`]; `tcp::auth`), which never travels, nor does
/// anything a stranger could open a stream with ([`TcpConnector`]); both sides finish in
/// [`Connectable::poll_ready`], never blocking
/// NCCL's thread on anything but a TCP three-way handshake to a directly attached peer. Memory
/// registered, control memory allocated and receives posted before the streams exist (the protocol
/// does that before the handshake) are carried over ([`TcpFabric::unconnected`]).
pub struct TcpConn {
    /// The endpoint: unconnected until ready; `None` while its set-up holds it.
    fab: Option<TcpFabric>,
    /// The unconnected endpoint's paths (served while `fab` is `None`).
    pre_paths: Vec<PathInfo>,
    setup: Setup,
    cfg: TcpConfig,
    local: Vec<PathParams>,
    /// The connector's peer parameters and connection secret, from [`Connectable::connect_peer`].
    peer: Mutex<Option<(Vec<PathParams>, ConnSecret)>>,
    /// Each path's local netdev, whose carrier tells a link that went down silently.
    netdevs: Vec<String>,
}

/// A TCP path's link state from sysfs (`carrier`, `operstate` of its local netdev).
struct SysfsLinks {
    netdevs: Vec<String>,
    reader: crate::host::Reader,
}

impl tcp::LinkCheck for SysfsLinks {
    fn down(&self, path: usize) -> Option<String> {
        crate::host::links::netdev_link_down(&self.reader, self.netdevs.get(path)?)
    }
}

impl std::fmt::Debug for TcpConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConn")
            .field("paths", &self.pre_paths.len())
            .field("ready", &matches!(self.setup, Setup::Ready))
            .finish()
    }
}

impl TcpConn {
    /// The endpoint of one connection over `paths` (all TCP). `accepting`: open a listener per
    /// path now (the ports go into [`Connectable::local_params`]), whose streams must prove
    /// `secret` (the connection's, from the handshake); a connector gets its secret with
    /// [`Connectable::connect_peer`].
    pub fn create(
        paths: &[PathPlan],
        accepting: bool,
        secret: &ConnSecret,
        cfg: &TcpConfig,
    ) -> Result<TcpConn> {
        let specs: Vec<TcpPathSpec> = paths
            .iter()
            .map(|p| TcpPathSpec {
                local: IpAddr::V4(p.local.addr.addr()),
                remote: SocketAddr::new(IpAddr::V4(p.remote), 0),
                speed_mbps: u64::from(p.local.speed_mbps),
                mtu: p.local.mtu,
                label: p.local.netdev.clone(),
                relay: p.relay.clone(),
            })
            .collect();
        let pre = TcpFabric::unconnected(&specs, cfg)?;
        if !accepting {
            // The connector sends: the peer writes only its control memory (the clear-to-send
            // FIFO), never its data registrations (send buffers).
            pre.refuse_peer_data_writes();
        }
        let pre_paths = pre.paths().to_vec();
        let mut local: Vec<PathParams> = specs
            .iter()
            .map(|s| PathParams {
                qpns: Vec::new(),
                psn: 0,
                gid: [0; 16],
                gid_index: 0,
                mtu: wire_mtu(s.mtu),
                rkey: 0,
                addr: 0,
            })
            .collect();
        let setup = if accepting {
            check_secret(secret)?;
            let listeners = specs
                .iter()
                .map(|s| tcp::listen(s.local, s.speed_mbps, cfg))
                .collect::<Result<Vec<TcpListener>>>()?;
            for (p, l) in local.iter_mut().zip(&listeners) {
                let port = l
                    .local_addr()
                    .map_err(|e| Error::io("reading a TCP listener's port", e))?
                    .port();
                p.addr = u64::from(port);
            }
            Setup::Accepting(Some(TcpAcceptor::new(&listeners, &specs, secret, cfg)?))
        } else {
            Setup::AwaitingPeer(specs)
        };
        Ok(TcpConn {
            fab: Some(pre),
            pre_paths,
            setup,
            cfg: cfg.clone(),
            local,
            peer: Mutex::new(None),
            netdevs: paths.iter().map(|p| p.local.netdev.clone()).collect(),
        })
    }

    /// Whether every stream is up.
    pub fn is_ready(&self) -> bool {
        matches!(self.setup, Setup::Ready)
    }

    /// The connected endpoint (statistics in tests); `None` before ready.
    pub fn tcp(&self) -> Option<&TcpFabric> {
        self.fab.as_ref().filter(|_| self.is_ready())
    }

    fn fab(&self) -> Result<&TcpFabric> {
        self.fab.as_ref().ok_or_else(not_ready)
    }

    fn fab_mut(&mut self) -> Result<&mut TcpFabric> {
        self.fab.as_mut().ok_or_else(not_ready)
    }

    /// The endpoint for sending: only once ready.
    fn data(&mut self) -> Result<&mut TcpFabric> {
        if !self.is_ready() {
            return Err(not_ready());
        }
        self.fab_mut()
    }

    /// The connected endpoint: its paths' links are judged by sysfs from now on.
    fn ready(&mut self, mut f: TcpFabric) {
        f.set_link_check(Arc::new(SysfsLinks {
            netdevs: self.netdevs.clone(),
            reader: crate::host::Reader::new(Path::new("/")),
        }));
        self.fab = Some(f);
        self.setup = Setup::Ready;
    }

    fn take_pre(&mut self) -> Result<TcpFabric> {
        self.fab.take().ok_or_else(not_ready)
    }
}

fn not_ready() -> Error {
    Error::Internal("the TCP streams of this connection are not connected yet".into())
}

/// The streams are keyed by the connection's secret: an unset (all-zero) one would let anyone in.
fn check_secret(secret: &ConnSecret) -> Result<()> {
    if *secret == ConnSecret::default() {
        return Err(Error::Internal(
            "TCP set-up without the connection's secret from the handshake".into(),
        ));
    }
    Ok(())
}

impl Connectable for TcpConn {
    fn local_params(&self) -> Vec<PathParams> {
        self.local.clone()
    }

    /// Every stream sees the peer's process exit (end of stream) or host vanish (TCP retransmit
    /// timeout), so no separate liveness channel is kept.
    fn detects_peer_loss(&self) -> bool {
        true
    }

    fn connect_peer(&self, peer: &[PathParams], opts: &ConnOptions) -> Result<()> {
        if peer.len() != self.local.len() {
            return Err(Error::Remote(format!(
                "the peer sent parameters for {} TCP paths; this connection has {}",
                peer.len(),
                self.local.len()
            )));
        }
        let mut g = lock(&self.peer, "TCP peer")?;
        *g = Some((peer.to_vec(), opts.secret));
        Ok(())
    }

    fn path_mtu(&self, i: usize, peer: &PathParams) -> u32 {
        self.local.get(i).map_or(peer.mtu, |l| l.mtu.min(peer.mtu))
    }

    fn poll_ready(&mut self) -> Result<bool> {
        loop {
            // An error below leaves `Failed`.
            match std::mem::replace(&mut self.setup, Setup::Failed) {
                Setup::Ready => {
                    self.setup = Setup::Ready;
                    return Ok(true);
                }
                Setup::Failed => {
                    return Err(Error::InvalidUsage(
                        "the TCP set-up of this connection failed earlier".into(),
                    ));
                }
                Setup::Accepting(a) => {
                    let mut a = match (a, self.fab.is_some()) {
                        (Some(a), true) => a.adopting(self.take_pre()?),
                        (Some(a), false) => a,
                        (None, _) => return Err(not_ready()),
                    };
                    match a.poll()? {
                        Some(f) => self.ready(f),
                        None => {
                            self.setup = Setup::Accepting(Some(a));
                            return Ok(false);
                        }
                    }
                }
                Setup::AwaitingPeer(mut specs) => {
                    let (peer, secret) = self
                        .peer
                        .get_mut()
                        .map_err(|_| Error::Internal("TCP peer lock poisoned".into()))?
                        .take()
                        .ok_or_else(|| {
                            Error::Internal("TCP set-up polled before the peer's parameters".into())
                        })?;
                    for (i, (s, p)) in specs.iter_mut().zip(&peer).enumerate() {
                        let port = u16::try_from(p.addr).ok().filter(|&x| x != 0).ok_or_else(|| {
                            Error::Remote(format!(
                                "the acceptor sent TCP port {} for path {i}; accepted: 1..=65535",
                                p.addr
                            ))
                        })?;
                        s.remote.set_port(port);
                    }
                    check_secret(&secret)?;
                    let pre = self.take_pre()?;
                    let c = TcpConnector::start(&specs, &secret, &self.cfg)?.adopting(pre);
                    self.setup = Setup::Connecting(Some(c));
                }
                Setup::Connecting(c) => {
                    let Some(mut c) = c else {
                        return Err(not_ready());
                    };
                    match c.poll()? {
                        Some(f) => self.ready(f),
                        None => {
                            self.setup = Setup::Connecting(Some(c));
                            return Ok(false);
                        }
                    }
                }
            }
        }
    }
}

impl Fabric for TcpConn {
    fn paths(&self) -> &[PathInfo] {
        self.fab.as_ref().map_or(&self.pre_paths, |f| f.paths())
    }
    fn pinner(&self) -> Option<std::sync::Arc<dyn crate::transport::fabric::Pinner>> {
        self.fab.as_ref().and_then(|f| f.pinner())
    }
    fn register(&mut self, mem: &Lent, kind: MemKind) -> Result<Registration> {
        self.fab_mut()?.register(mem, kind)
    }
    fn register_dmabuf(
        &mut self,
        mem: &Lent,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<Registration> {
        self.fab_mut()?.register_dmabuf(mem, offset, fd)
    }
    fn deregister(&mut self, reg: &Registration) -> Result<()> {
        self.fab_mut()?.deregister(reg)
    }
    fn alloc_ctrl(&mut self, words: usize) -> Result<CtrlMem> {
        self.fab_mut()?.alloc_ctrl(words)
    }
    fn free_ctrl(&mut self, mem: &CtrlMem) -> Result<()> {
        self.fab_mut()?.free_ctrl(mem)
    }
    fn ctrl_load(&self, addr: u64, order: Ordering) -> Result<u64> {
        self.fab()?.ctrl_load(addr, order)
    }
    fn ctrl_store(&self, addr: u64, value: u64, order: Ordering) -> Result<()> {
        self.fab()?.ctrl_store(addr, value, order)
    }
    fn ctrl_read(&self, addr: u64, out: &mut [u64]) -> Result<()> {
        self.fab()?.ctrl_read(addr, out)
    }
    fn ctrl_write(&self, addr: u64, words: &[u64]) -> Result<()> {
        self.fab()?.ctrl_write(addr, words)
    }
    fn post_write(&mut self, path: usize, wr: &WriteWr) -> Result<()> {
        self.data()?.post_write(path, wr)
    }
    fn post_writes(&mut self, path: usize, wrs: &[WriteWr]) -> Result<()> {
        self.data()?.post_writes(path, wrs)
    }
    fn post_read(&mut self, path: usize, wr: &ReadWr) -> Result<()> {
        self.data()?.post_read(path, wr)
    }
    fn post_recv(&mut self, path: usize, wr_id: u64) -> Result<()> {
        self.fab_mut()?.post_recv(path, wr_id)
    }
    fn poll(&mut self, path: usize, max: usize, out: &mut Vec<Completion>) -> Result<usize> {
        match self.fab.as_mut() {
            Some(f) => f.poll(path, max, out),
            None => Ok(0),
        }
    }
    fn path_note(&self, path: usize) -> Option<String> {
        self.tcp().and_then(|f| f.path_note(path))
    }
    fn path_health(&mut self, path: usize) -> Result<()> {
        match self.fab.as_mut() {
            Some(f) if matches!(self.setup, Setup::Ready) => f.path_health(path),
            _ => Ok(()),
        }
    }
    fn revive_path(&mut self, path: usize) -> Result<crate::transport::fabric::Revive> {
        match self.fab.as_mut() {
            Some(f) if matches!(self.setup, Setup::Ready) => f.revive_path(path),
            _ => Ok(crate::transport::fabric::Revive::Down),
        }
    }
    fn stop_path(&mut self, path: usize) -> Result<()> {
        match self.fab.as_mut() {
            Some(f) if matches!(self.setup, Setup::Ready) => f.stop_path(path),
            _ => Ok(()),
        }
    }
    // Before its streams are connected nothing of the peer's can land.
    fn seal_path(&mut self, path: usize) -> Result<bool> {
        match self.fab.as_mut() {
            Some(f) if matches!(self.setup, Setup::Ready) => f.seal_path(path),
            _ => Ok(true),
        }
    }
    fn shutdown(&mut self) -> Result<()> {
        if !self.is_ready() {
            self.setup = Setup::Failed;
        }
        match self.fab.as_mut() {
            Some(f) => f.shutdown(),
            None => Ok(()),
        }
    }
}

/// A connection over RoCE or TCP paths. One per connection, moved only when built: the size
/// difference of the variants costs nothing, and boxing would add an indirection to every post.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum NetConn {
    /// ibverbs RC QPs.
    Verbs(VerbsFabric),
    /// TCP streams.
    Tcp(TcpConn),
}

macro_rules! each {
    ($self:ident, $f:ident => $e:expr) => {
        match $self {
            NetConn::Verbs($f) => $e,
            NetConn::Tcp($f) => $e,
        }
    };
}

impl Connectable for NetConn {
    fn local_params(&self) -> Vec<PathParams> {
        each!(self, f => f.local_params())
    }
    fn connect_peer(&self, peer: &[PathParams], opts: &ConnOptions) -> Result<()> {
        each!(self, f => f.connect_peer(peer, opts))
    }
    fn path_mtu(&self, i: usize, peer: &PathParams) -> u32 {
        each!(self, f => f.path_mtu(i, peer))
    }
    fn poll_ready(&mut self) -> Result<bool> {
        each!(self, f => f.poll_ready())
    }
    fn detects_peer_loss(&self) -> bool {
        each!(self, f => f.detects_peer_loss())
    }
}

impl Fabric for NetConn {
    fn paths(&self) -> &[PathInfo] {
        each!(self, f => f.paths())
    }
    fn register(&mut self, mem: &Lent, kind: MemKind) -> Result<Registration> {
        each!(self, f => f.register(mem, kind))
    }
    fn register_dmabuf(
        &mut self,
        mem: &Lent,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<Registration> {
        each!(self, f => f.register_dmabuf(mem, offset, fd))
    }
    fn deregister(&mut self, reg: &Registration) -> Result<()> {
        each!(self, f => f.deregister(reg))
    }
    fn pinner(&self) -> Option<std::sync::Arc<dyn crate::transport::fabric::Pinner>> {
        each!(self, f => f.pinner())
    }
    fn defer_paths(&mut self, paths: &[usize]) {
        each!(self, f => f.defer_paths(paths))
    }
    fn activate_path(&mut self, path: usize) -> Result<()> {
        each!(self, f => f.activate_path(path))
    }
    fn keys_on(
        &self,
        reg: &Registration,
        path: usize,
    ) -> Option<crate::transport::fabric::PathKeys> {
        each!(self, f => f.keys_on(reg, path))
    }
    fn alloc_ctrl(&mut self, words: usize) -> Result<CtrlMem> {
        each!(self, f => f.alloc_ctrl(words))
    }
    fn free_ctrl(&mut self, mem: &CtrlMem) -> Result<()> {
        each!(self, f => f.free_ctrl(mem))
    }
    fn ctrl_load(&self, addr: u64, order: Ordering) -> Result<u64> {
        each!(self, f => f.ctrl_load(addr, order))
    }
    fn ctrl_store(&self, addr: u64, value: u64, order: Ordering) -> Result<()> {
        each!(self, f => f.ctrl_store(addr, value, order))
    }
    fn ctrl_read(&self, addr: u64, out: &mut [u64]) -> Result<()> {
        each!(self, f => f.ctrl_read(addr, out))
    }
    fn ctrl_write(&self, addr: u64, words: &[u64]) -> Result<()> {
        each!(self, f => f.ctrl_write(addr, words))
    }
    fn post_write(&mut self, path: usize, wr: &WriteWr) -> Result<()> {
        each!(self, f => f.post_write(path, wr))
    }
    fn post_writes(&mut self, path: usize, wrs: &[WriteWr]) -> Result<()> {
        each!(self, f => f.post_writes(path, wrs))
    }
    fn post_read(&mut self, path: usize, wr: &ReadWr) -> Result<()> {
        each!(self, f => f.post_read(path, wr))
    }
    fn prepare_flush(&mut self) -> Result<()> {
        each!(self, f => f.prepare_flush())
    }
    fn path_device(&self, path: usize) -> usize {
        each!(self, f => f.path_device(path))
    }
    fn post_recv(&mut self, path: usize, wr_id: u64) -> Result<()> {
        each!(self, f => f.post_recv(path, wr_id))
    }
    fn poll(&mut self, path: usize, max: usize, out: &mut Vec<Completion>) -> Result<usize> {
        each!(self, f => f.poll(path, max, out))
    }
    fn shutdown(&mut self) -> Result<()> {
        each!(self, f => f.shutdown())
    }
    fn path_note(&self, path: usize) -> Option<String> {
        each!(self, f => f.path_note(path))
    }
    fn health(&mut self) -> Result<()> {
        each!(self, f => f.health())
    }
    fn path_health(&mut self, path: usize) -> Result<()> {
        each!(self, f => f.path_health(path))
    }
    fn revive_path(&mut self, path: usize) -> Result<crate::transport::fabric::Revive> {
        each!(self, f => f.revive_path(path))
    }
    fn stop_path(&mut self, path: usize) -> Result<()> {
        each!(self, f => f.stop_path(path))
    }
    fn seal_path(&mut self, path: usize) -> Result<bool> {
        each!(self, f => f.seal_path(path))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn tcp_threads_reach_the_tcp_configuration() {
        let config = crate::config::Config::from_vars(|k| {
            (k == "NCCL_SWITCHLESS_TCP_THREADS").then(|| "5".to_string())
        })
        .unwrap();
        assert_eq!(tcp_config(&config, 2).io_threads, Some(5));
        let config = crate::config::Config::default();
        assert_eq!(tcp_config(&config, 2).io_threads, None);
    }
    use std::time::{Duration, Instant};

    fn fixture(name: &str) -> HostModel {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/fabric")
            .join(name);
        crate::host::discover(&root).0
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "reads a fixture under tests/fixtures; Miri isolates the host filesystem"
    )]
    fn point_to_point_links_become_devices_and_the_management_nic_does_not() {
        // b300-2node: 16 RoCE-capable netdevs on /30s plus a management NIC on a /24 with the
        // default route. Seen as TCP only (transport=tcp), every /30 netdev is a device.
        let m = fixture("b300-2node");
        let (links, devices) = tcp_host(&m);
        assert!(!devices.is_empty());
        for d in &devices {
            assert!(d.name.starts_with("sl_"), "{}", d.name);
            assert_eq!(d.ptr_support, crate::host::nccl::PTR_HOST);
            // The netdev's PCI function (review C3: it was empty, so NCCL put it on CPU 0).
            let n = m.netdev(&d.name["sl_".len()..]).unwrap();
            let bdf = n.pci.as_deref().unwrap();
            assert!(
                d.pci_path.starts_with("/sys/devices/pci") && d.pci_path.ends_with(bdf),
                "{}: {}",
                d.name,
                d.pci_path
            );
            assert!(d.speed_mbps > 0);
            assert!(!d.peers.is_empty(), "{} has its far end", d.name);
        }
        for l in &links {
            assert_eq!(l.kind, LinkKind::Tcp);
            assert_ne!(l.netdev, "lo");
            match l.nccl_dev {
                Some(i) => {
                    assert!(l.addr.prefix_len() >= 30, "{l:?}");
                    assert_eq!(devices[i].name, format!("sl_{}", l.netdev));
                }
                None => assert!(l.addr.prefix_len() < 30 || !l.up, "{l:?}"),
            }
        }
        assert!(
            links
                .iter()
                .any(|l| l.addr.prefix_len() == 24 && l.nccl_dev.is_none()),
            "the management /24 is a link (advertised) but no device"
        );
        // A host whose only address is a management /24: no device (init fails with the WARN).
        let (links, devices) = tcp_host(&fixture("broken-no-rdma"));
        assert!(devices.is_empty(), "{devices:?}");
        assert!(links.iter().all(|l| !tcp_data_link(l, false)));
        assert!(links.iter().all(|l| tcp_data_link(l, true)));
    }

    fn plan(local: &str, remote: &str) -> PathPlan {
        PathPlan {
            local: LocalLink {
                id: 0,
                kind: LinkKind::Tcp,
                netdev: "lo".into(),
                rdma_dev: None,
                port: 0,
                addr: local.parse().unwrap(),
                gid_index: None,
                pci_root: String::new(),
                phys_port_id: u16::MAX,
                nccl_dev: Some(0),
                speed_mbps: 10_000,
                mtu: 9000,
                active_mtu: 0,
                up: true,
            },
            remote: remote.parse().unwrap(),
            kind: LinkKind::Tcp,
            relay: None,
        }
    }

    fn short() -> TcpConfig {
        TcpConfig {
            connect_timeout: Some(Duration::from_millis(300)),
            ..TcpConfig::default()
        }
    }

    fn secret() -> ConnSecret {
        ConnSecret::from_bytes([0x5c; 32])
    }

    fn opts() -> ConnOptions {
        ConnOptions {
            secret: secret(),
            ..ConnOptions::default()
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket; Miri isolates the host")]
    fn an_acceptor_whose_connector_never_comes_times_out() {
        let mut c = TcpConn::create(
            &[plan("127.0.0.1/30", "127.0.0.2")],
            true,
            &secret(),
            &short(),
        )
        .unwrap();
        let p = c.local_params();
        assert_eq!(p.len(), 1);
        assert!(
            p[0].addr > 0 && p[0].addr <= 65535,
            "listener port {}",
            p[0].addr
        );
        assert_eq!(p[0].mtu, 9000);
        assert_eq!(
            p[0].gid, [0u8; 16],
            "nothing of the secret goes in the reply"
        );
        // Memory and receives work before the streams exist; sending does not.
        let m = c.alloc_ctrl(4).unwrap();
        c.post_recv(0, 1).unwrap();
        assert!(c.ctrl_load(m.addr, Ordering::Acquire).is_ok());
        let t = Instant::now();
        let e = loop {
            match c.poll_ready() {
                Ok(false) => assert!(t.elapsed() < Duration::from_secs(5), "no timeout"),
                Ok(true) => panic!("ready without a connector"),
                Err(e) => break e,
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(matches!(e, Error::Timeout(_)), "{e}");
        assert!(!c.is_ready());
        assert!(c.poll_ready().is_err(), "a failed set-up stays failed");
    }

    #[test]
    fn a_connector_checks_the_acceptors_ports_and_sends_nothing_before_ready() {
        let mut c = TcpConn::create(
            &[plan("127.0.0.1/30", "127.0.0.2")],
            false,
            &ConnSecret::default(),
            &short(),
        )
        .unwrap();
        assert_eq!(
            c.local_params()[0].addr,
            0,
            "the connector listens on nothing"
        );
        assert!(
            matches!(c.poll_ready(), Err(Error::Internal(_))),
            "before connect_peer"
        );
        let mut c = TcpConn::create(
            &[plan("127.0.0.1/30", "127.0.0.2")],
            false,
            &ConnSecret::default(),
            &short(),
        )
        .unwrap();
        let wr = WriteWr {
            wr_id: 1,
            local: crate::transport::fabric::LocalSeg {
                addr: 0,
                len: 0,
                lkey: 0,
            },
            remote: crate::transport::fabric::RemoteSeg { addr: 0, rkey: 0 },
            imm: None,
            signaled: true,
            inline: false,
        };
        assert!(c.post_write(0, &wr).is_err(), "no send before ready");
        let mut peer = c.local_params();
        assert!(
            c.connect_peer(&[], &ConnOptions::default()).is_err(),
            "path count"
        );
        peer[0].addr = 70_000;
        c.connect_peer(&peer, &opts()).unwrap();
        let e = c.poll_ready().unwrap_err();
        assert!(e.to_string().contains("70000"), "{e}");
        // Without the handshake's secret, no stream is opened.
        let mut c = TcpConn::create(
            &[plan("127.0.0.1/30", "127.0.0.2")],
            false,
            &ConnSecret::default(),
            &short(),
        )
        .unwrap();
        let mut peer = c.local_params();
        peer[0].addr = 1000;
        c.connect_peer(&peer, &ConnOptions::default()).unwrap();
        let e = c.poll_ready().unwrap_err();
        assert!(e.to_string().contains("secret"), "{e}");
        assert!(
            TcpConn::create(
                &[plan("127.0.0.1/30", "127.0.0.2")],
                true,
                &ConnSecret::default(),
                &short()
            )
            .is_err(),
            "an acceptor without the secret"
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket; Miri isolates the host")]
    fn a_tcp_conn_pair_connects_and_keeps_what_was_set_up_before() {
        let cfg = TcpConfig {
            connect_timeout: Some(Duration::from_secs(10)),
            ..TcpConfig::default()
        };
        let mut acc =
            TcpConn::create(&[plan("127.0.0.2/30", "127.0.0.1")], true, &secret(), &cfg).unwrap();
        let mut con = TcpConn::create(
            &[plan("127.0.0.1/30", "127.0.0.2")],
            false,
            &ConnSecret::default(),
            &cfg,
        )
        .unwrap();
        let m = acc.alloc_ctrl(2).unwrap();
        acc.ctrl_store(m.addr, 42, Ordering::Release).unwrap();
        con.connect_peer(&acc.local_params(), &opts()).unwrap();
        let t = Instant::now();
        let (mut a, mut b) = (false, false);
        while !(a && b) {
            assert!(t.elapsed() < Duration::from_secs(10));
            if !b {
                b = con.poll_ready().unwrap();
            }
            if !a {
                a = acc.poll_ready().unwrap();
            }
        }
        assert!(acc.tcp().is_some() && con.tcp().is_some());
        assert_eq!(acc.ctrl_load(m.addr, Ordering::Acquire).unwrap(), 42);
        assert!(acc.paths()[0].label.contains("streams"));
        con.shutdown().unwrap();
        acc.shutdown().unwrap();
    }

    #[test]
    fn the_tcp_carry_line_says_what_the_plugin_does() {
        let e = Error::System(
            "no RDMA device: ibv_get_device_list returned none (errno ENOSYS): the kernel has no RDMA \
             support; NCCL will use its internal transports"
                .into(),
        );
        let line = tcp_carry_note(&e, &["sl_enp5s0"]);
        assert_eq!(
            line,
            "no RDMA device: ibv_get_device_list returned none (errno ENOSYS): the kernel has no RDMA \
             support; using TCP on 1 point-to-point netdev (sl_enp5s0) (the plugin carries every connection)"
        );
        assert!(!line.contains("system error") && !line.contains("internal transports"));
        let two = tcp_carry_note(&e, &["sl_a", "sl_b"]);
        assert!(
            two.contains("2 point-to-point netdevs (sl_a, sl_b)"),
            "{two}"
        );
    }
}
