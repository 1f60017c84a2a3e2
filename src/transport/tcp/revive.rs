//! Failover and failback of one TCP path: [`TcpFabric`]'s `path_health`, `stop_path`,
//! `seal_path` and `revive_path`.
//!
//! * **Health.** A path is unusable when its streams failed, when its local link is down
//!   ([`LinkCheck`]: carrier or operstate, read by the plugin from sysfs; a link that went down
//!   silently is seen at once, where TCP would retransmit for minutes), or, on the accepting side,
//!   when the peer opened a complete set of new streams for it (the peer rebuilds it). Reporting
//!   it changes nothing: the comm then stops the path (nothing more sent) and, once the peer has
//!   stopped it too, seals it (the streams drain what arrived, then abort), so that nothing the
//!   peer counted delivered is lost and nothing lands after the comm settled the path's work.
//! * **Rebuild.** The side that opened the connection's streams (the connector) opens the path's
//!   streams again to the acceptor's listener, which the acceptor keeps for the connection's
//!   lifetime. Each new stream is authenticated as at set-up (`super::auth`: it must come from the
//!   path's peer address and answer a fresh challenge with a hello tagged by the connection
//!   secret) and names a generation above the path's current one, which the tag covers: a
//!   generation is the peer's to choose, and the path's only goes up. Stale, unauthenticated or
//!   foreign streams are closed and change nothing; a working path is cut only once a complete,
//!   authenticated set of new streams is there. The connector counts a generation per attempt, so
//!   an attempt that failed half-way never collides with the next. The new streams get a fresh
//!   [`PathShared`] (sequence numbers from 0, nothing pending, an empty completion queue), so no
//!   frame of the old streams is ever applied.
//! * **Agreement.** The hello and its acknowledgement are the exchange. Each end returns
//!   [`Revive::Rebuilt`] when the new streams are installed but not yet served (the comm then posts
//!   its receives), and [`Revive::Ready`] at the next call, when the streams join the I/O pool.
//!   The acceptor acknowledges only then, and the connector sends nothing before the
//!   acknowledgement: so every write with an immediate finds the peer's receives posted (what the
//!   peer sent early waits in the socket until its end serves the streams).
#![forbid(unsafe_code)]

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::TcpFabric;
use super::auth::StreamKey;
use super::config::TcpConfig;
use super::dial::{
    MAX_PENDING_STREAMS, OutStream, PendingHello, TcpPathSpec, drop_warn, make_room, start_stream,
};
use super::frame::{ACK_LEN, HelloRepr, NONCE_LEN, TAG_LEN};
use super::pool;
use super::state::PathShared;
use crate::error::{Error, Result};
use crate::transport::fabric::{Completion, Revive, WcOpcode, WcStatus};

/// What a path's local link reports, asked by `path_health` and before each rebuild. The plugin
/// reads the netdev's `carrier` and `operstate` (`src/plugin/factory/net.rs`); tests inject one.
pub trait LinkCheck: Send + Sync {
    /// `Some(why)` while data path `path`'s local link is down (e.g. "to2: carrier 0").
    fn down(&self, path: usize) -> Option<String>;
}

/// How often a path's link state is read at most (`path_health` is called while the comm waits).
const LINK_CHECK_EVERY: Duration = Duration::from_millis(10);
/// How long a connector waits for the acknowledgements of a rebuilt path's streams before it
/// gives up this attempt (the comm's next probe starts another, one generation up).
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// The least time between two rebuilds of a connection's paths (either end): a peer that rebuilds
/// a path again and again (each a failover, a traffic stall and log lines here) gets one per gap.
/// The gap doubles with every rebuild that comes within 60 s of the one before, up to
/// [`MAX_REBUILD_GAP`] (below the connector's 10 s dial timeout, so a real peer's rebuild held back
/// still lands).
pub const MIN_REBUILD_GAP: Duration = Duration::from_secs(1);
/// The longest gap between two rebuilds of a connection's paths.
pub const MAX_REBUILD_GAP: Duration = Duration::from_secs(8);
/// A rebuild this long after the one before starts the gap at [`MIN_REBUILD_GAP`] again.
const REBUILD_QUIET: Duration = Duration::from_secs(60);

/// When a connection's paths may be rebuilt next ([`MIN_REBUILD_GAP`]).
#[derive(Debug, Default)]
struct RebuildRate {
    /// The last rebuild, and the gap that follows it.
    last: Option<(Instant, Duration)>,
}

impl RebuildRate {
    fn allowed(&self, now: Instant) -> bool {
        self.last.is_none_or(|(t, gap)| now >= t + gap)
    }

    fn rebuilt(&mut self, now: Instant) {
        let gap = match self.last {
            Some((t, gap)) if now.saturating_duration_since(t) < gap + REBUILD_QUIET => gap
                .saturating_mul(2)
                .clamp(MIN_REBUILD_GAP, MAX_REBUILD_GAP),
            _ => MIN_REBUILD_GAP,
        };
        self.last = Some((now, gap));
    }
}

/// What a connected [`TcpFabric`] keeps to rebuild its paths.
pub(super) struct Redial {
    key: StreamKey,
    cfg: TcpConfig,
    specs: Vec<TcpPathSpec>,
    /// Acceptor: the set-up's listeners, kept for the connection's lifetime. Connector: `None`.
    listening: Option<Listening>,
    paths: Vec<PathRedial>,
    link: Option<Arc<dyn LinkCheck>>,
    /// Rebuilds of this connection's paths, rate-limited ([`MIN_REBUILD_GAP`]).
    rebuilds: RebuildRate,
}

struct Listening {
    listeners: Vec<TcpListener>,
    /// When `path_health` last looked at the listeners (at most every [`LINK_CHECK_EVERY`]).
    looked: Option<Instant>,
    /// Accepted connections whose hello is still arriving (at most [`MAX_PENDING_STREAMS`]).
    pending: Vec<PendingHello>,
}

/// A stream of a newer generation that was authenticated, with the acknowledgement it gets once
/// its path serves it.
type Arrived = (TcpStream, [u8; ACK_LEN]);

#[derive(Default)]
struct PathRedial {
    /// Generation of the path's current streams (0: those of the set-up).
    generation: u32,
    /// Connector: the last generation dialed (every attempt takes a new one).
    dialed: u32,
    step: Step,
    /// Acceptor: the streams of a newer generation that have arrived, by stream index.
    arriving: Option<(u32, Vec<Option<Arrived>>)>,
    /// Acceptor: the acknowledgements of the installed streams, sent when they are served.
    acks: Vec<[u8; ACK_LEN]>,
    /// The last link reading and when it was taken.
    link: Option<(Instant, Option<String>)>,
}

#[derive(Default)]
enum Step {
    /// Nothing under way.
    #[default]
    Idle,
    /// Connector: new streams of `generation` are connecting, waiting for their acknowledgements.
    Dialing {
        generation: u32,
        socks: Vec<OutStream>,
        since: Instant,
    },
    /// The new streams are the path's (the comm posts its receives); they join the I/O pool at
    /// the next call.
    Installed,
}

impl Redial {
    /// For a connector (`listeners` empty) or an acceptor (one listener per path).
    pub(super) fn new(
        key: StreamKey,
        cfg: &TcpConfig,
        specs: &[TcpPathSpec],
        listeners: Vec<TcpListener>,
    ) -> Redial {
        let listening = (!listeners.is_empty()).then(|| Listening {
            listeners,
            looked: None,
            pending: Vec::new(),
        });
        Redial {
            key,
            cfg: cfg.clone(),
            specs: specs.to_vec(),
            listening,
            paths: specs.iter().map(|_| PathRedial::default()).collect(),
            link: None,
            rebuilds: RebuildRate::default(),
        }
    }

    /// Path `p`'s link: `Some(why)` while down (read at most every [`LINK_CHECK_EVERY`]).
    fn link_down(&mut self, p: usize) -> Option<String> {
        let check = self.link.as_ref()?;
        let st = self.paths.get_mut(p)?;
        let now = Instant::now();
        match &st.link {
            Some((at, v)) if now.duration_since(*at) < LINK_CHECK_EVERY => v.clone(),
            _ => {
                let v = check.down(p);
                st.link = Some((now, v.clone()));
                v
            }
        }
    }

    /// Acceptor: takes what arrived on the listeners and files complete hellos of a generation
    /// above each path's current one. Anything else is closed and logged (rate-limited).
    fn accept(&mut self) {
        let Some(l) = self.listening.as_mut() else {
            return;
        };
        let now = Instant::now();
        for (i, listener) in l.listeners.iter().enumerate() {
            // Bounded per call: at most the pending cap, then the next call.
            for _ in 0..MAX_PENDING_STREAMS {
                let (sock, from) = match listener.accept() {
                    Ok(x) => x,
                    Err(_) => break,
                };
                let want = self.specs[i].remote.ip();
                let refused = if from.ip() != want {
                    Some(format!("the path's peer is {want}"))
                } else {
                    match make_room(&mut l.pending) {
                        Ok(None) => None,
                        Ok(Some(old)) => {
                            drop_warn(now, old.from.ip(), || {
                                format!(
                                    "TCP path {}: dropped the oldest of {MAX_PENDING_STREAMS} reconnects that sent no whole hello, for a newer one",
                                    old.path
                                )
                            });
                            None
                        }
                        Err(()) => Some(format!(
                            "{MAX_PENDING_STREAMS} reconnects wait with their hello to check"
                        )),
                    }
                };
                if let Some(why) = refused {
                    drop_warn(now, from.ip(), || {
                        format!("TCP path {i}: reconnect from {from} refused: {why}")
                    });
                    continue;
                }
                match PendingHello::challenge(sock, from, i, now) {
                    Ok(ph) => l.pending.push(ph),
                    Err(e) => {
                        drop_warn(now, from.ip(), || {
                            format!("TCP path {i}: reconnect from {from} dropped: {e}")
                        });
                    }
                }
            }
        }
        let mut k = 0;
        while k < l.pending.len() {
            let Some(verdict) = l.pending[k].read() else {
                k += 1;
                continue;
            };
            let ph = l.pending.swap_remove(k);
            let (i, from) = (ph.path, ph.from);
            let checked = verdict
                .and_then(|()| ph.check(&self.key, self.specs.len()))
                .and_then(|(h, ack)| file(&mut self.paths[i], h).map(|()| (h, ack)));
            match checked {
                Ok((h, ack)) => {
                    if let Some((_, slots)) = self.paths[i].arriving.as_mut()
                        && let Some(slot) = slots.get_mut(usize::from(h.stream))
                    {
                        *slot = Some((ph.sock, ack));
                    }
                }
                Err(e) => {
                    drop_warn(now, from.ip(), || {
                        format!("TCP path {i}: reconnect from {from} rejected: {e}")
                    });
                }
            }
        }
    }

    /// Acceptor: the generation and streams (with their acknowledgements) of path `p` once all
    /// have arrived.
    fn arrived(&mut self, p: usize) -> Option<(u32, Vec<Arrived>)> {
        let st = self.paths.get_mut(p)?;
        let complete = st
            .arriving
            .as_ref()
            .is_some_and(|(_, s)| s.iter().all(Option::is_some));
        if !complete {
            return None;
        }
        let (g, slots) = st.arriving.take()?;
        Some((g, slots.into_iter().flatten().collect()))
    }
}

/// Checks an authenticated reconnect hello against path `st` and makes room for its stream: its
/// generation must be above the path's current one; a newer generation than the one arriving
/// replaces it (the peer gave that attempt up: only the peer can tag a hello).
fn file(st: &mut PathRedial, h: HelloRepr) -> Result<()> {
    let (g, n, s) = (h.generation, usize::from(h.nstreams), usize::from(h.stream));
    if g <= st.generation {
        return Err(Error::Remote(format!(
            "stream generation {g}; the path is at generation {} (a stale or replayed stream)",
            st.generation
        )));
    }
    match &st.arriving {
        Some((cur, _)) if *cur > g => {
            return Err(Error::Remote(format!(
                "stream generation {g}; generation {cur} is arriving"
            )));
        }
        Some((cur, slots)) if *cur == g => {
            if slots.len() != n || slots[s].is_some() {
                return Err(Error::Remote(format!(
                    "stream {s} of {n} conflicts with the streams of generation {g} already accepted"
                )));
            }
        }
        _ => st.arriving = Some((g, (0..n).map(|_| None).collect())),
    }
    Ok(())
}

impl TcpFabric {
    /// Sets what tells whether a path's local link is down (see [`LinkCheck`]). Without one, a
    /// path is judged by its streams only.
    pub fn set_link_check(&mut self, check: Arc<dyn LinkCheck>) {
        if let Some(r) = self.redial.as_mut() {
            r.link = Some(check);
        }
    }

    /// Closes data path `path`'s streams as a cut cable would, without telling the peer (tests:
    /// a stream error, then failover). Unknown paths are ignored.
    pub fn break_path(&self, path: usize) {
        if let Ok(p) = self.sh.path(path) {
            p.close_streams();
        }
    }

    /// Tests: the acknowledgements of data path `path` are lost. Its work requests outstanding
    /// fail (the first with a retry error, the rest flushed), although their frames, queued or
    /// with the kernel, still go out and land at the peer; what is posted later fails. Unknown
    /// paths are ignored.
    pub fn lose_completions(&self, path: usize) {
        let Ok(p) = self.sh.path(path) else {
            return;
        };
        let Ok(mut tx) = p.tx() else {
            return;
        };
        tx.error = true;
        let mut status = WcStatus::RETRY_EXC_ERR;
        while let Some(w) = tx.wrs.pop_front() {
            tx.first_wr += 1;
            p.complete(Completion::without_data(
                w.wr_id,
                status,
                WcOpcode::RdmaWrite,
            ));
            status = WcStatus::WR_FLUSH_ERR;
        }
    }

    /// Tests: while `held`, nothing of data path `path` is read (what the peer sends waits in the
    /// kernel's buffers, acknowledged by it, as on a slow receiver); released, it is read again.
    pub fn hold_receiving(&self, path: usize, held: bool) {
        if let Ok(p) = self.sh.path(path) {
            p.rx_held.store(held, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// The ports of the listeners an accepting endpoint keeps for rebuilds, per path (empty for a
    /// connector, or before the streams are connected).
    pub fn rebuild_ports(&self) -> Vec<u16> {
        self.redial
            .as_ref()
            .and_then(|r| r.listening.as_ref())
            .map_or_else(Vec::new, |l| {
                l.listeners
                    .iter()
                    .map(|x| x.local_addr().map_or(0, |a| a.port()))
                    .collect()
            })
    }

    /// Generation of data path `path`'s streams: 0 as set up, one more with every rebuild.
    pub fn path_generation(&self, path: usize) -> u32 {
        self.redial
            .as_ref()
            .and_then(|r| r.paths.get(path))
            .map_or(0, |p| p.generation)
    }

    /// `Fabric::stop_path`: see [`PathShared::stop`].
    pub(super) fn stop(&mut self, path: usize) -> Result<()> {
        self.check_path(path)?.stop("failed over");
        Ok(())
    }

    /// `Fabric::seal_path`: see [`PathShared::cut`].
    pub(super) fn seal(&mut self, path: usize) -> Result<bool> {
        let p = self.check_path(path)?;
        p.stop("failed over");
        cut(&p, "sealed after failover");
        Ok(p.sealed())
    }

    /// `Fabric::path_health`: see the module docs.
    pub(super) fn health_of(&mut self, path: usize) -> Result<()> {
        let p = self.check_path(path)?;
        let why = match self.redial.as_mut() {
            None => None,
            Some(r) => match r.link_down(path) {
                Some(why) => Some(format!("its link is down ({why})")),
                None => {
                    // Cheap when called often: the listeners are looked at every 10 ms at most.
                    let now = Instant::now();
                    if let Some(l) = r.listening.as_mut()
                        && l.looked
                            .is_none_or(|t| now.duration_since(t) >= LINK_CHECK_EVERY)
                    {
                        l.looked = Some(now);
                        r.accept();
                    }
                    // A complete, authenticated set of new streams replaces a working path, at the
                    // connection's rebuild rate (until then the set waits).
                    r.paths[path]
                        .arriving
                        .as_ref()
                        .filter(|(_, s)| s.iter().all(Option::is_some))
                        .filter(|_| r.rebuilds.allowed(now))
                        .map(|(g, _)| format!("the peer rebuilt it (stream generation {g})"))
                }
            },
        };
        let why = why.or_else(|| {
            let tx = p.tx().map_or(true, |t| t.error);
            let rx = p.rx().map_or(true, |r| r.error);
            (tx || rx).then(|| "its streams failed".to_string())
        });
        // Reported only: the comm stops the path (`stop_path`), and seals it once the peer has
        // stopped it too (`seal_path`), so what the peer counts delivered is applied here.
        match why {
            None => Ok(()),
            Some(why) => Err(Error::Remote(format!("TCP path {}: {why}", p.label))),
        }
    }

    /// `Fabric::revive_path`: see the module docs.
    pub(super) fn revive(&mut self, path: usize) -> Result<Revive> {
        self.check_path(path)?;
        // The rebuilt path gets as many streams as it had.
        let n = self.streams(path).max(1);
        let Some(r) = self.redial.as_mut() else {
            return Ok(Revive::Down);
        };
        if matches!(r.paths[path].step, Step::Installed) {
            r.paths[path].step = Step::Idle;
            return self.serve(path).map(|()| Revive::Ready);
        }
        if let Some(why) = r.link_down(path) {
            if !matches!(r.paths[path].step, Step::Idle) {
                tracing::debug!("NET/switchless: TCP path {path}: rebuild stopped: {why}");
            }
            r.paths[path].step = Step::Idle;
            r.paths[path].arriving = None;
            return Ok(Revive::Down);
        }
        if !r.rebuilds.allowed(Instant::now()) {
            // The connection's rebuild rate: an acceptor keeps what arrived, a connector dials
            // at a later probe.
            if r.listening.is_some() {
                r.accept();
                return Ok(Revive::Pending);
            }
            if matches!(r.paths[path].step, Step::Idle) {
                tracing::debug!(
                    "NET/switchless: TCP path {path}: rebuild held back (at most one per {} s after the last)",
                    MIN_REBUILD_GAP.as_secs()
                );
                return Ok(Revive::Down);
            }
        }
        if r.listening.is_some() {
            r.accept();
            return match r.arrived(path) {
                Some((g, arrived)) => {
                    let (socks, acks) = arrived.into_iter().unzip();
                    r.paths[path].acks = acks;
                    self.install(path, g, socks).map(|()| Revive::Rebuilt)
                }
                // The connector dials when its link is up: look again soon.
                None => Ok(Revive::Pending),
            };
        }
        let st = &mut r.paths[path];
        if matches!(st.step, Step::Idle) {
            // A new generation per attempt: streams of an attempt that failed half-way (some
            // acknowledged, some not) never collide with the next one's at the acceptor.
            let generation = st.generation.max(st.dialed).checked_add(1).ok_or_else(|| {
                Error::Internal(format!("TCP path {path}: stream generations exhausted"))
            })?;
            st.dialed = generation;
            let spec = &r.specs[path];
            let mut socks = Vec::with_capacity(n);
            for s in 0..n {
                let hello = HelloRepr {
                    npaths: byte(r.specs.len())?,
                    path: byte(path)?,
                    nstreams: byte(n)?,
                    stream: byte(s)?,
                    generation,
                    conn: 0,
                    nonce: [0; NONCE_LEN],
                    tag: [0; TAG_LEN],
                };
                match start_stream(spec, &hello, &r.key, &r.cfg) {
                    Ok(o) => socks.push(o),
                    Err(e) => {
                        tracing::debug!("NET/switchless: TCP path {path}: rebuild: {e}");
                        return Ok(Revive::Down);
                    }
                }
            }
            r.paths[path].step = Step::Dialing {
                generation,
                socks,
                since: Instant::now(),
            };
        }
        let Step::Dialing {
            generation,
            socks,
            since,
        } = &mut r.paths[path].step
        else {
            return Ok(Revive::Pending);
        };
        let mut done = true;
        for o in socks.iter_mut() {
            match o.poll() {
                Ok(d) => done &= d,
                Err(e) => {
                    tracing::debug!("NET/switchless: TCP path {path}: rebuild: {e}");
                    r.paths[path].step = Step::Idle;
                    return Ok(Revive::Down);
                }
            }
        }
        if !done {
            if since.elapsed() > DIAL_TIMEOUT {
                tracing::debug!(
                    "NET/switchless: TCP path {path}: the peer did not acknowledge the rebuilt \
                     streams within {} s; trying again at the next probe",
                    DIAL_TIMEOUT.as_secs()
                );
                r.paths[path].step = Step::Idle;
                return Ok(Revive::Down);
            }
            return Ok(Revive::Pending);
        }
        let g = *generation;
        let Step::Dialing { socks, .. } = std::mem::take(&mut r.paths[path].step) else {
            return Ok(Revive::Pending);
        };
        let socks = socks
            .into_iter()
            .filter_map(OutStream::into_stream)
            .collect();
        self.install(path, g, socks).map(|()| Revive::Rebuilt)
    }

    /// Makes `socks` path `path`'s streams (generation `g`), with fresh state; the old streams
    /// leave the I/O pool and close. The new ones are not served yet ([`TcpFabric::serve`]).
    fn install(&mut self, path: usize, g: u32, socks: Vec<TcpStream>) -> Result<()> {
        if let Some(handles) = self.io.get_mut(path) {
            pool::remove_streams(std::mem::take(handles))?;
        }
        let old = self.sh.path(path)?;
        retire(&old, "rebuilt");
        let n = socks.len();
        let fresh = Arc::new(PathShared::new(old.label.clone(), socks, old.relayed));
        self.sh.replace_path(path, fresh)?;
        if let Some(r) = self.redial.as_mut() {
            r.paths[path].generation = g;
            r.paths[path].step = Step::Installed;
            r.rebuilds.rebuilt(Instant::now());
        }
        tracing::info!(
            "NET/switchless: TCP path {}: new streams connected ({n} streams, generation {g})",
            old.label
        );
        Ok(())
    }

    /// Serves path `path`'s installed streams: the acceptor acknowledges them (the connector sends
    /// from now on), and they join the I/O pool.
    fn serve(&mut self, path: usize) -> Result<()> {
        let p = self.sh.path(path)?;
        if let Some(r) = self.redial.as_mut()
            && r.listening.is_some()
        {
            let acks = std::mem::take(&mut r.paths[path].acks);
            for (s, st) in p.streams.iter().enumerate() {
                let Some(ack) = acks.get(s) else {
                    cut(&p, &format!("stream {s} has no acknowledgement"));
                    continue;
                };
                // 24 bytes into a socket buffer that holds at most the 24-byte challenge: never
                // blocks.
                let sent = st
                    .sock
                    .set_nodelay(true)
                    .and_then(|()| (&st.sock).write_all(ack));
                if let Err(e) = sent {
                    cut(&p, &format!("acknowledging stream {s}: {e}"));
                }
            }
        }
        while self.io.len() <= path {
            self.io.push(Vec::new());
        }
        let threads = self.redial.as_ref().and_then(|r| r.cfg.io_threads);
        pool::add_path_streams(&self.sh, &p, threads, &mut self.io[path])
    }
}

/// Takes path generation `p` out of service (see [`PathShared::cut`]).
fn cut(p: &PathShared, why: &str) {
    p.cut(why);
}

/// Ends path generation `p` for good once it left the I/O pool: every socket aborted (nothing
/// of ours delivered later), outstanding work and posted receives flushed.
fn retire(p: &PathShared, why: &str) {
    p.cut(why);
    for s in &p.streams {
        let _ = crate::sys::socket::abort(&s.sock);
    }
    p.close_streams();
    p.fail_tx(WcStatus::WR_FLUSH_ERR, None, why);
    p.fail_rx(why, false);
}

fn byte(v: usize) -> Result<u8> {
    u8::try_from(v)
        .map_err(|_| Error::Internal(format!("TCP stream hello: {v} does not fit a byte")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::HostBuffer;
    use crate::transport::fabric::{Fabric, LocalSeg, MemKind, RemoteSeg, WriteWr};
    use crate::transport::tcp::loopback_pair;

    /// Polls `f` until it gives a completion (20 s at most).
    fn completion(f: &mut TcpFabric, what: &str) -> Completion {
        let t = Instant::now();
        loop {
            let mut out = Vec::new();
            f.poll(0, 1, &mut out).unwrap();
            if let Some(c) = out.pop() {
                return c;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "{what}: nothing within 20 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The rebuilt streams' first frames are queued while the streams are not served yet (their
    /// senders never idled, so no worker is woken for them): joining the pool must send them, and
    /// a later write on the served path wakes its idle senders. (A suspected lost wake-up behind
    /// the CI step 66 timeouts, which were a slow run instead: see `docs/failover.md`.)
    #[test]
    #[cfg_attr(miri, ignore = "opens TCP sockets; Miri isolates the host")]
    fn writes_queued_on_a_rebuilt_path_go_out_when_it_joins_the_pool() {
        const LEN: usize = 256 << 10;
        let cfg = TcpConfig {
            streams: Some(2),
            ..TcpConfig::default()
        };
        // `a` opened the streams (it rebuilds), `b` accepted them.
        let (mut a, mut b) = loopback_pair(&[10_000], &cfg).unwrap();
        a.break_path(0);
        let (mut a_state, mut b_state) = (Revive::Down, Revive::Down);
        let t = Instant::now();
        while !matches!(a_state, Revive::Rebuilt) || !matches!(b_state, Revive::Ready) {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "no rebuild within 20 s"
            );
            if !matches!(b_state, Revive::Ready) {
                b_state = b.revive_path(0).unwrap();
            }
            if !matches!(a_state, Revive::Rebuilt) {
                a_state = a.revive_path(0).unwrap();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(a.path_generation(0), b.path_generation(0));
        assert!(a.path_generation(0) >= 1);

        let src = HostBuffer::new(2 * LEN).unwrap();
        let dst = HostBuffer::new(2 * LEN).unwrap();
        let sreg = a
            .register(&src.lend_range(0, 2 * LEN).unwrap(), MemKind::Host)
            .unwrap();
        let dreg = b
            .register(&dst.lend_range(0, 2 * LEN).unwrap(), MemKind::Host)
            .unwrap();
        let mut src = src;
        let bytes: Vec<u8> = (0..2 * LEN).map(|i| (i * 7 + i / 4096) as u8).collect();
        src.write(0, &bytes).unwrap();
        let write = |k: usize| WriteWr {
            wr_id: 10 + k as u64,
            local: LocalSeg {
                addr: src.addr() + (k * LEN) as u64,
                len: LEN as u32,
                lkey: sreg.keys[0].lkey,
            },
            remote: RemoteSeg {
                addr: dst.addr() + (k * LEN) as u64,
                rkey: dreg.keys[0].rkey,
            },
            imm: Some(k as u32),
            signaled: true,
            inline: false,
        };
        b.post_recv(0, 20).unwrap();
        b.post_recv(0, 21).unwrap();
        // Rebuilt, not served: the frames wait in the streams' queues.
        a.post_write(0, &write(0)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let mut out = Vec::new();
        b.poll(0, 1, &mut out).unwrap();
        assert!(
            out.is_empty(),
            "{out:?}: a frame left before its streams were served"
        );
        assert!(matches!(a.revive_path(0).unwrap(), Revive::Ready));
        for k in 0..2 {
            if k == 1 {
                // The senders have idled since: this write must wake them.
                a.post_write(0, &write(1)).unwrap();
            }
            let c = completion(&mut b, "the receive");
            assert_eq!(
                (c.wr_id, c.status, c.imm),
                (20 + k as u64, WcStatus::SUCCESS, Some(k as u32))
            );
            let c = completion(&mut a, "the write");
            assert_eq!((c.wr_id, c.status), (10 + k as u64, WcStatus::SUCCESS));
            assert!(dst.read(k * LEN, LEN).unwrap() == bytes[k * LEN..(k + 1) * LEN]);
        }
        assert!(
            a.stream_bytes(0).iter().all(|&n| n > 0),
            "{:?}",
            a.stream_bytes(0)
        );
    }

    fn hello(generation: u32, stream: u8, nstreams: u8) -> HelloRepr {
        HelloRepr {
            npaths: 1,
            path: 0,
            nstreams,
            stream,
            generation,
            conn: 9,
            nonce: [0; NONCE_LEN],
            tag: [0; TAG_LEN],
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket; Miri isolates the host")]
    fn a_reconnect_needs_a_newer_generation_and_a_free_slot() {
        let mut st = PathRedial {
            generation: 2,
            ..PathRedial::default()
        };
        // Stale (the current generation, or older): refused.
        for g in [0, 1, 2] {
            let e = file(&mut st, hello(g, 0, 2)).unwrap_err().to_string();
            assert!(e.contains("stale or replayed"), "{e}");
        }
        file(&mut st, hello(3, 1, 2)).unwrap();
        // What `accept` does with a filed stream.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        if let Some((_, slots)) = st.arriving.as_mut() {
            slots[1] = Some((sock, [0; ACK_LEN]));
        }
        // The same stream twice, or another count: refused.
        assert!(file(&mut st, hello(3, 1, 2)).is_err());
        assert!(file(&mut st, hello(3, 0, 4)).is_err());
        // An older one than what is arriving: refused; a newer one replaces it.
        st.arriving = Some((4, vec![None, None]));
        assert!(file(&mut st, hello(3, 0, 2)).is_err());
        file(&mut st, hello(5, 0, 1)).unwrap();
        assert_eq!(
            st.arriving.as_ref().map(|(g, s)| (*g, s.len())),
            Some((5, 1))
        );
    }
}
