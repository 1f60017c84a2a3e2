//! The process-wide pool of TCP I/O worker threads shared by every [`super::TcpFabric`].
//!
//! * Each worker runs a readiness loop ([`mio::Poll`], epoll on Linux, edge-triggered) over the
//!   streams assigned to it. A stream is registered by its file descriptor ([`SourceFd`]): the
//!   socket itself stays in the fabric's shared state, where `shutdown` needs it for the close frame
//!   and the final drain, so no descriptor is duplicated (one fd per stream, as before).
//! * Each stream is a small state machine per direction (`super::stream`): sending resumes a
//!   partial frame (header, then payload) when the socket becomes writable, and `WRITABLE` interest
//!   is registered only while something is queued; receiving reads a header (possibly in pieces),
//!   then the payload straight into registered memory in chunks of at most 1 MiB, taking the
//!   registration's lock for each chunk only (deregistration waits for one chunk copy at most).
//! * `post_*` queue frames and, when the stream's sender was idle, hand its id to the worker and
//!   wake it ([`mio::Waker`]); NCCL's thread never blocks in the kernel.
//! * Fairness: a stream gets at most 2 MiB per direction per turn; a stream still ready
//!   after its turn stays on the worker's run list and the next wait does not block.
//! * Lifecycle: workers start when a stream is added and none is idle (up to the pool size); a
//!   stream goes to the worker holding the fewest streams of the same path, then of the same
//!   fabric, then overall, so the streams of one path run on different threads (as far as the
//!   pool has threads). A worker whose last
//!   stream is removed exits and is joined by the remover: once every fabric is shut down, no pool
//!   thread is left (NCCL unloads the plugin after finalize; a thread running inside an unmapped
//!   library would crash the process).
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use super::config::{MAX_IO_THREADS, default_io_threads};
use super::state::{PathShared, Shared};
use super::stream::StreamIo;
use crate::error::{Error, Result};
use crate::sync::lock;
use crate::transport::fabric::WcStatus;

const WAKE: Token = Token(0);
const POOL_LOCK: &str = "TCP I/O pool";
const INBOX: &str = "TCP I/O worker inbox";

/// Pool threads running now, process-wide (started and not yet joined).
pub fn io_threads() -> usize {
    LIVE.load(Ordering::SeqCst)
}

static LIVE: AtomicUsize = AtomicUsize::new(0);

static POOL: Mutex<Pool> = Mutex::new(Pool {
    workers: Vec::new(),
    size: 0,
    next_id: 1,
    next_serial: 0,
});

struct Pool {
    workers: Vec<WorkerSlot>,
    /// Most workers at once; fixed when the first worker starts, until the last one exits.
    size: usize,
    next_id: usize,
    next_serial: u64,
}

struct WorkerSlot {
    link: Arc<WorkerLink>,
    /// Streams assigned.
    load: usize,
    thread: JoinHandle<()>,
}

/// What the rest of the process holds of a worker: its waker and its inbox.
struct WorkerLink {
    serial: u64,
    /// The worker ended after a panic (also `Inbox::dead`, for a check without the lock).
    dead: AtomicBool,
    waker: Waker,
    inbox: Mutex<Inbox>,
}

/// Its critical sections only push and take (nothing in them panics), so it is never found
/// poisoned in practice; if it were, the worker would stop and its link count as dead.
#[derive(Default)]
struct Inbox {
    cmds: Vec<Cmd>,
    /// Streams whose sender was idle and now has frames queued.
    kicks: Vec<usize>,
    /// The worker ended after a panic; nothing is accepted any more.
    dead: bool,
}

enum Cmd {
    Add(Box<StreamIo>),
    Remove(usize, mpsc::Sender<()>),
    Exit,
    /// Unit tests only: the worker panics (the recovery path is tested in a process of its own).
    #[cfg(test)]
    Panic,
}

impl WorkerLink {
    /// Queues `cmd` and wakes the worker; `false` when the worker is dead.
    fn send(&self, cmd: Cmd) -> bool {
        {
            // Poisoned: as dead (see `Inbox`).
            let Ok(mut ib) = lock(&self.inbox, INBOX) else {
                return false;
            };
            if ib.dead {
                return false;
            }
            ib.cmds.push(cmd);
        }
        self.wake();
        true
    }

    fn wake(&self) {
        if let Err(e) = self.waker.wake() {
            tracing::error!("NET/switchless: waking TCP I/O worker {}: {e}", self.serial);
        }
    }
}

/// A fabric's hold on one of its streams in the pool.
pub(super) struct StreamHandle {
    link: Arc<WorkerLink>,
    id: usize,
}

impl StreamHandle {
    /// Tells the worker that frames were queued on a stream whose sender was idle.
    pub(super) fn kick(&self) {
        {
            let Ok(mut ib) = lock(&self.link.inbox, INBOX) else {
                return;
            };
            if ib.dead {
                return;
            }
            ib.kicks.push(self.id);
        }
        self.link.wake();
    }

    /// Serial number of the worker serving the stream.
    pub(super) fn worker(&self) -> u64 {
        self.link.serial
    }
}

/// Adds every stream of `sh` to the pool, appending one handle per stream to `out[path]` (so the
/// caller can remove what was added if this fails part-way). `threads`: the pool size to use if the
/// pool is starting (`None`: [`default_io_threads`]).
pub(super) fn add_streams(
    sh: &Arc<Shared>,
    threads: Option<usize>,
    out: &mut Vec<Vec<StreamHandle>>,
) -> Result<()> {
    let paths = sh.all_paths()?;
    // Streams of this fabric per worker serial (spread a connection's streams too).
    let mut mine: HashMap<u64, usize> = HashMap::new();
    for (p, path) in paths.iter().enumerate() {
        if out.len() <= p {
            out.push(Vec::new());
        }
        add_path(sh, path, threads, &mut mine, &mut out[p])?;
    }
    Ok(())
}

/// Adds the streams of one generation of a path (a rebuilt path's new streams), appending one
/// handle per stream to `out`.
pub(super) fn add_path_streams(
    sh: &Arc<Shared>,
    path: &Arc<PathShared>,
    threads: Option<usize>,
    out: &mut Vec<StreamHandle>,
) -> Result<()> {
    add_path(sh, path, threads, &mut HashMap::new(), out)
}

fn add_path(
    sh: &Arc<Shared>,
    path: &Arc<PathShared>,
    threads: Option<usize>,
    mine: &mut HashMap<u64, usize>,
    out: &mut Vec<StreamHandle>,
) -> Result<()> {
    if path.streams.is_empty() {
        return Ok(());
    }
    let mut pool = lock(&POOL, POOL_LOCK)?;
    if pool.workers.is_empty() {
        pool.size = threads
            .unwrap_or_else(default_io_threads)
            .clamp(1, MAX_IO_THREADS);
    }
    let mut this_path: HashMap<u64, usize> = HashMap::new();
    for s in 0..path.streams.len() {
        let alive = |w: &&WorkerSlot| !w.link.dead.load(Ordering::SeqCst);
        let idle = pool.workers.iter().filter(alive).any(|w| w.load == 0);
        if !idle && pool.workers.len() < pool.size {
            match spawn_worker(pool.next_serial) {
                Ok(w) => {
                    pool.next_serial += 1;
                    pool.workers.push(w);
                }
                Err(e) if pool.workers.is_empty() => return Err(e),
                Err(e) => tracing::warn!(
                    "NET/switchless: {e}; the TCP pool carries on with {} threads",
                    pool.workers.len()
                ),
            }
        }
        let Some(idx) = pool
            .workers
            .iter()
            .enumerate()
            .filter(|(_, w)| alive(w))
            .min_by_key(|(i, w)| {
                let serial = w.link.serial;
                (
                    this_path.get(&serial).copied().unwrap_or(0),
                    mine.get(&serial).copied().unwrap_or(0),
                    w.load,
                    *i,
                )
            })
            .map(|(i, _)| i)
        else {
            return Err(Error::Internal(
                "the TCP I/O pool has no working thread (they panicked or could not start)".into(),
            ));
        };
        let id = pool_next_id(&mut pool);
        let w = &mut pool.workers[idx];
        let io = StreamIo::new(Arc::clone(sh), Arc::clone(path), s, id);
        if !w.link.send(Cmd::Add(Box::new(io))) {
            return Err(Error::Internal(format!(
                "TCP I/O worker {} has stopped after a panic",
                w.link.serial
            )));
        }
        w.load += 1;
        *mine.entry(w.link.serial).or_insert(0) += 1;
        *this_path.entry(w.link.serial).or_insert(0) += 1;
        out.push(StreamHandle {
            link: Arc::clone(&w.link),
            id,
        });
    }
    Ok(())
}

fn pool_next_id(pool: &mut Pool) -> usize {
    let id = pool.next_id;
    pool.next_id = pool.next_id.wrapping_add(1).max(1);
    id
}

fn spawn_worker(serial: u64) -> Result<WorkerSlot> {
    let poll = Poll::new().map_err(|e| Error::io("creating a TCP I/O poller (epoll)", e))?;
    let waker = Waker::new(poll.registry(), WAKE)
        .map_err(|e| Error::io("creating a TCP I/O waker (eventfd)", e))?;
    let link = Arc::new(WorkerLink {
        serial,
        dead: AtomicBool::new(false),
        waker,
        inbox: Mutex::new(Inbox::default()),
    });
    let l2 = Arc::clone(&link);
    let thread = std::thread::Builder::new()
        .name(format!("swl-tcpio{serial}"))
        .spawn(move || worker_main(l2, poll))
        .map_err(|e| Error::io("starting a TCP I/O worker thread", e))?;
    LIVE.fetch_add(1, Ordering::SeqCst);
    Ok(WorkerSlot {
        link,
        load: 0,
        thread,
    })
}

/// Removes streams from their workers and waits until no worker touches them any more; workers left
/// without streams exit and are joined. Returns the number of workers found to have panicked; an
/// error (after the wait) when the pool's lock is poisoned, so that no worker could be joined.
pub(super) fn remove_streams(handles: Vec<StreamHandle>) -> Result<usize> {
    if handles.is_empty() {
        return Ok(0);
    }
    let (tx, rx) = mpsc::channel();
    let mut sent = 0;
    for h in &handles {
        if h.link.send(Cmd::Remove(h.id, tx.clone())) {
            sent += 1;
        }
    }
    drop(tx);
    for _ in 0..sent {
        // An error: every sender is gone (a worker that died dropped its commands), nothing to wait for.
        if rx.recv().is_err() {
            break;
        }
    }
    let idle: Vec<WorkerSlot> = {
        let mut pool = lock(&POOL, POOL_LOCK)?;
        for h in &handles {
            if let Some(w) = pool
                .workers
                .iter_mut()
                .find(|w| Arc::ptr_eq(&w.link, &h.link))
            {
                w.load = w.load.saturating_sub(1);
            }
        }
        let (idle, busy) = std::mem::take(&mut pool.workers)
            .into_iter()
            .partition(|w| w.load == 0);
        pool.workers = busy;
        idle
    };
    let mut panicked = 0;
    for w in idle {
        w.link.send(Cmd::Exit);
        let dead = lock(&w.link.inbox, INBOX).map_or(true, |ib| ib.dead);
        if w.thread.join().is_err() || dead {
            panicked += 1;
        }
        LIVE.fetch_sub(1, Ordering::SeqCst);
    }
    Ok(panicked)
}

// ---------------------------------------------------------------------------------------------------
// The worker
// ---------------------------------------------------------------------------------------------------

struct Worker {
    streams: HashMap<usize, StreamIo>,
    /// Streams with work left (ready and not yet blocked); the next wait does not block.
    run: Vec<usize>,
    /// The earliest window guard due over its streams (`super::window`): the wait ends then.
    guard_at: Option<Instant>,
}

fn worker_main(link: Arc<WorkerLink>, mut poll: Poll) {
    let mut w = Worker {
        streams: HashMap::new(),
        run: Vec::new(),
        guard_at: None,
    };
    let what =
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run(&link, &mut poll))) {
            Ok(Ok(())) => return,
            Ok(Err(e)) => format!("stopped: {e}"),
            Err(_) => "panicked".to_string(),
        };
    tracing::error!(
        "NET/switchless: TCP I/O worker {} {what}; failing its {} streams' paths",
        link.serial,
        w.streams.len()
    );
    // Refuse new commands and drop queued ones (their removal acknowledgements are released).
    link.dead.store(true, Ordering::SeqCst);
    let cmds = match lock(&link.inbox, INBOX) {
        Ok(mut ib) => {
            ib.dead = true;
            std::mem::take(&mut ib.cmds)
        }
        Err(_) => Vec::new(),
    };
    drop(cmds);
    let why = format!("its TCP I/O worker {what}");
    for st in w.streams.values() {
        let path = &*st.path;
        path.fail_rx(&why, true);
        path.fail_tx(WcStatus::GENERAL_ERR, None, &why);
        path.close_streams();
    }
    for st in w.streams.values() {
        let _ = poll.registry().deregister(&mut SourceFd(&st.fd));
    }
}

impl Worker {
    /// The event loop, until [`Cmd::Exit`]; an error when the inbox lock is poisoned.
    fn run(&mut self, link: &WorkerLink, poll: &mut Poll) -> Result<()> {
        let mut events = Events::with_capacity(256);
        loop {
            let timeout = if self.run.is_empty() {
                self.guard_at
                    .map(|t| t.saturating_duration_since(Instant::now()))
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!("NET/switchless: TCP I/O worker {}: poll: {e}", link.serial);
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            for ev in events.iter() {
                if ev.token() == WAKE {
                    continue;
                }
                if let Some(st) = self.streams.get_mut(&ev.token().0) {
                    if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                        st.rx_ready = true;
                    }
                    if ev.is_writable() || ev.is_write_closed() || ev.is_error() {
                        st.tx_ready = true;
                    }
                    if !st.queued_to_run {
                        st.queued_to_run = true;
                        self.run.push(st.id);
                    }
                }
            }
            let (cmds, kicks) = {
                let mut ib = lock(&link.inbox, INBOX)?;
                (std::mem::take(&mut ib.cmds), std::mem::take(&mut ib.kicks))
            };
            for id in kicks {
                if let Some(st) = self.streams.get_mut(&id) {
                    st.tx_ready = true;
                    if !st.queued_to_run {
                        st.queued_to_run = true;
                        self.run.push(id);
                    }
                }
            }
            for cmd in cmds {
                match cmd {
                    Cmd::Add(st) => self.add(*st, poll),
                    Cmd::Remove(id, ack) => {
                        if let Some(st) = self.streams.remove(&id) {
                            let _ = poll.registry().deregister(&mut SourceFd(&st.fd));
                        }
                        let _ = ack.send(());
                    }
                    Cmd::Exit => return Ok(()),
                    #[cfg(test)]
                    Cmd::Panic => panic!("injected by a unit test"),
                }
            }
            for id in std::mem::take(&mut self.run) {
                let Some(st) = self.streams.get_mut(&id) else {
                    continue;
                };
                st.queued_to_run = false;
                st.service(poll);
                if st.rx_ready || st.tx_ready {
                    st.queued_to_run = true;
                    self.run.push(id);
                }
                if let Some(t) = st.next_guard {
                    self.guard_at = Some(self.guard_at.map_or(t, |g| g.min(t)));
                }
            }
            self.guards();
        }
    }

    /// Runs the window guards that are due and finds the next one.
    fn guards(&mut self) {
        let now = Instant::now();
        if self.guard_at.is_none_or(|t| t > now) {
            return;
        }
        self.guard_at = None;
        for st in self.streams.values_mut() {
            if st.next_guard.is_some_and(|t| t <= now) {
                st.guard(now);
            }
            if let Some(t) = st.next_guard {
                self.guard_at = Some(self.guard_at.map_or(t, |g| g.min(t)));
            }
        }
    }

    fn add(&mut self, mut st: StreamIo, poll: &mut Poll) {
        if let Err(e) =
            poll.registry()
                .register(&mut SourceFd(&st.fd), Token(st.id), Interest::READABLE)
        {
            let path = &*st.path;
            let why = format!("stream {}: registering it with the I/O poller: {e}", st.s);
            path.fail_rx(&why, true);
            path.fail_tx(WcStatus::GENERAL_ERR, None, &why);
            path.close_streams();
            st.rx_done = true;
            st.tx_done = true;
        }
        // Bytes may have arrived before the registration: look once.
        st.rx_ready = true;
        st.tx_ready = true;
        st.queued_to_run = true;
        self.run.push(st.id);
        self.streams.insert(st.id, st);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::HostBuffer;
    use crate::transport::fabric::{Fabric, LocalSeg, MemKind, RemoteSeg, WriteWr};
    use crate::transport::tcp::{TcpConfig, loopback_pair};
    use std::time::Instant;

    const CHILD: &str = "SWITCHLESS_POOL_PANIC_CHILD";

    /// Runs [`worker_panic_in_its_own_process`] in a child process: a panicking worker fails every
    /// stream it serves, and other tests of this binary share the pool.
    #[test]
    #[cfg_attr(miri, ignore = "runs the test binary as a child process; Miri cannot")]
    fn a_worker_panic_fails_its_paths_and_leaves_the_process_running() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "transport::tcp::pool::tests::worker_panic_in_its_own_process",
                "--ignored",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "child failed:\n{text}");
        assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
    }

    fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(20) {
            if let Some(v) = f() {
                return v;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("{what}: nothing within 20 s");
    }

    #[test]
    #[ignore = "run by a_worker_panic_fails_its_paths_and_leaves_the_process_running in a child process"]
    fn worker_panic_in_its_own_process() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        assert_eq!(io_threads(), 0);
        let cfg = TcpConfig {
            streams: Some(1),
            io_threads: Some(2),
            ..TcpConfig::default()
        };
        let (mut a, mut b) = loopback_pair(&[10_000], &cfg).unwrap();
        b.post_recv(0, 7).unwrap();
        let victim = Arc::clone(&a.io[0][0].link);
        let serial = victim.serial;
        assert!(victim.send(Cmd::Panic));
        eventually("the worker to be marked dead", || {
            victim.dead.load(Ordering::SeqCst).then_some(())
        });
        // Its stream's path failed on this side: a write fails now or completes in error.
        let buf = HostBuffer::new(4096).unwrap();
        let reg = a
            .register(&buf.lend_range(0, 4096).unwrap(), MemKind::Host)
            .unwrap();
        let wr = WriteWr {
            wr_id: 1,
            local: LocalSeg {
                addr: buf.addr(),
                len: 64,
                lkey: reg.keys[0].lkey,
            },
            remote: RemoteSeg { addr: 0, rkey: 0 },
            imm: Some(1),
            signaled: true,
            inline: false,
        };
        if a.post_write(0, &wr).is_ok() {
            let c = eventually("the write's completion", || {
                let mut out = Vec::new();
                a.poll(0, 1, &mut out).unwrap();
                out.pop()
            });
            assert_ne!(c.status, WcStatus::SUCCESS, "{c:?}");
        }
        // The far side's posted receive fails instead of waiting forever.
        let c = eventually("the peer's receive", || {
            let mut out = Vec::new();
            b.poll(0, 1, &mut out).unwrap();
            out.pop()
        });
        assert_eq!(c.wr_id, 7);
        assert_ne!(c.status, WcStatus::SUCCESS, "{c:?}");
        // New connections never land on the dead worker, and work.
        let (c2, d2) = loopback_pair(&[10_000, 10_000], &cfg).unwrap();
        for f in [&c2, &d2] {
            for p in 0..2 {
                assert!(!f.stream_workers(p).contains(&serial));
            }
        }
        // Closing everything joins every thread, the dead one included.
        drop((a, b, c2, d2));
        assert_eq!(io_threads(), 0);
    }
}
