//! A connection's endpoint with its handshake socket kept as the liveness channel ([`Live`]): a
//! verbs (or in-memory) connection with nothing in flight otherwise never learns that its peer
//! died (RC retries only run for posted work, and NCCL has no deadline). Depends on
//! `transport::handshake::Liveness`; the bounds are in docs/security.md.
#![forbid(unsafe_code)]

use super::{ConnOptions, Connectable};
use crate::error::Result;
use crate::transport::fabric::{Completion, Fabric, PathInfo, PathRole, forward_fabric};
use crate::transport::handshake::{Liveness, PathParams};

/// An endpoint and, once the handshake is done, its liveness channel: a poll that finds nothing and
/// every health check also look at the channel, and fail once the peer is gone.
#[derive(Debug)]
pub struct Live<F> {
    inner: F,
    live: Option<Liveness>,
    /// The path polled last: a comm polls its paths in ascending order, so a poll of a path at or
    /// below it starts the next sweep.
    last_polled: usize,
    /// An empty poll of this sweep looked at the channel already.
    looked: bool,
}

impl<F: Connectable> Live<F> {
    /// An endpoint without a liveness channel yet.
    pub fn new(inner: F) -> Live<F> {
        Live {
            inner,
            live: None,
            last_polled: 0,
            looked: false,
        }
    }

    /// Keeps `live` as the channel, unless the endpoint notices a dead peer by itself (TCP paths
    /// see their streams close): then the socket is closed here.
    pub fn watch(&mut self, live: Liveness) {
        if !self.inner.detects_peer_loss() {
            self.live = Some(live);
        }
    }

    /// Whether a liveness channel is kept.
    pub fn watching(&self) -> bool {
        self.live.is_some()
    }

    /// The endpoint.
    pub fn inner(&self) -> &F {
        &self.inner
    }

    /// The channel's verdict; an error names the connection's data paths, so that the side with
    /// nothing in flight says which cable's peer it lost, as the side whose work failed does.
    fn check(&mut self) -> Result<()> {
        let Some(l) = &mut self.live else {
            return Ok(());
        };
        let Err(e) = l.check() else {
            return Ok(());
        };
        let data: Vec<&PathInfo> = self
            .inner
            .paths()
            .iter()
            .filter(|p| p.role == PathRole::Data)
            .collect();
        let paths: Vec<String> = data
            .iter()
            .enumerate()
            .map(|(i, p)| format!("[{i}] {}", p.label))
            .collect();
        if l.unreachable() && data.len() > 1 {
            // Keepalive gave up on the socket's own cable, which failover may have left: with
            // other paths the connection goes on, and a dead peer is still seen by the RC retries
            // of work in flight and by the request timeout.
            tracing::warn!(
                "NET/switchless: the liveness channel of the connection over path(s) {} is unreachable ({e}); the connection goes on without it",
                paths.join(", ")
            );
            self.live = None;
            return Ok(());
        }
        Err(e.context(format_args!("connection over path(s) {}", paths.join(", "))))
    }
}

impl<F: Connectable> Connectable for Live<F> {
    fn local_params(&self) -> Vec<PathParams> {
        self.inner.local_params()
    }
    fn connect_peer(&self, peer: &[PathParams], opts: &ConnOptions) -> Result<()> {
        self.inner.connect_peer(peer, opts)
    }
    fn path_mtu(&self, i: usize, peer: &PathParams) -> u32 {
        self.inner.path_mtu(i, peer)
    }
    fn poll_ready(&mut self) -> Result<bool> {
        self.inner.poll_ready()
    }
    fn detects_peer_loss(&self) -> bool {
        self.inner.detects_peer_loss() || self.live.is_some()
    }
}

impl<F: Connectable> Fabric for Live<F> {
    forward_fabric!(inner: paths, register, register_dmabuf, deregister, pinner, defer_paths,
        activate_path, keys_on, alloc_ctrl, free_ctrl, ctrl_load, ctrl_store, ctrl_read, ctrl_write,
        post_write, post_writes, post_read, prepare_flush, path_device, post_recv,
        path_note, path_health, stop_path, seal_path, revive_path);
    fn poll(&mut self, path: usize, max: usize, out: &mut Vec<Completion>) -> Result<usize> {
        let n = self.inner.poll(path, max, out)?;
        if path <= self.last_polled {
            self.looked = false;
        }
        self.last_polled = path;
        // Only when nothing completed: what the peer finished before it went counts. Once per
        // sweep over the paths: each look reads the clock, and the socket itself is asked at most
        // every `LIVENESS_CHECK_EVERY` (100 ms); the looks skipped on the other paths delay that
        // by at most one sweep.
        if n == 0 && !self.looked {
            self.looked = true;
            self.check()?;
        }
        Ok(n)
    }

    fn shutdown(&mut self) -> Result<()> {
        // The peer sees this side's end of the channel close with the comm.
        self.live = None;
        self.inner.shutdown()
    }

    fn health(&mut self) -> Result<()> {
        self.inner.health()?;
        self.check()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::error::Error;
    use crate::sys::rawmem::Lent;
    use crate::transport::fabric::{
        CtrlMem, MemKind, PathInfo, PathRole, ReadWr, Registration, WriteWr,
    };
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::Ordering;

    /// An endpoint with `n` data paths that does nothing (only `Live::check` is under test).
    struct Stub(Vec<PathInfo>);

    fn nope<T>() -> Result<T> {
        Err(Error::Internal("stub".into()))
    }

    impl Connectable for Stub {
        fn local_params(&self) -> Vec<PathParams> {
            Vec::new()
        }
        fn connect_peer(&self, _: &[PathParams], _: &ConnOptions) -> Result<()> {
            Ok(())
        }
        fn path_mtu(&self, _: usize, p: &PathParams) -> u32 {
            p.mtu
        }
    }

    impl Fabric for Stub {
        fn paths(&self) -> &[PathInfo] {
            &self.0
        }
        fn register(&mut self, _: &Lent, _: MemKind) -> Result<Registration> {
            nope()
        }
        fn deregister(&mut self, _: &Registration) -> Result<()> {
            nope()
        }
        fn alloc_ctrl(&mut self, _: usize) -> Result<CtrlMem> {
            nope()
        }
        fn free_ctrl(&mut self, _: &CtrlMem) -> Result<()> {
            nope()
        }
        fn ctrl_load(&self, _: u64, _: Ordering) -> Result<u64> {
            nope()
        }
        fn ctrl_store(&self, _: u64, _: u64, _: Ordering) -> Result<()> {
            nope()
        }
        fn post_write(&mut self, _: usize, _: &WriteWr) -> Result<()> {
            nope()
        }
        fn post_read(&mut self, _: usize, _: &ReadWr) -> Result<()> {
            nope()
        }
        fn post_recv(&mut self, _: usize, _: u64) -> Result<()> {
            nope()
        }
        fn poll(&mut self, _: usize, _: usize, _: &mut Vec<Completion>) -> Result<usize> {
            Ok(0)
        }
        fn shutdown(&mut self) -> Result<()> {
            Ok(())
        }
        fn stop_path(&mut self, _: usize) -> Result<()> {
            nope()
        }
        fn seal_path(&mut self, _: usize) -> Result<bool> {
            nope()
        }
    }

    fn live(paths: usize, fail: std::io::ErrorKind) -> (Live<Stub>, TcpListener) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let infos = (0..paths)
            .map(|i| PathInfo {
                label: format!("cable{i}"),
                speed_mbps: 100_000,
                role: PathRole::Data,
            })
            .collect();
        let mut c = Live::new(Stub(infos));
        c.watch(Liveness::failing(s, fail));
        assert!(c.watching());
        (c, l)
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket; Miri isolates the host")]
    fn a_keepalive_timeout_with_other_paths_drops_the_channel_not_the_connection() {
        let (mut c, _l) = live(2, std::io::ErrorKind::TimedOut);
        c.health().unwrap();
        assert!(!c.watching(), "the unreachable channel is dropped");
        // And stays dropped: nothing fails later.
        c.health().unwrap();
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket; Miri isolates the host")]
    fn a_keepalive_timeout_on_the_only_path_fails_the_connection() {
        let (mut c, _l) = live(1, std::io::ErrorKind::TimedOut);
        let e = c.health().unwrap_err().to_string();
        assert!(e.contains("is gone") && e.contains("[0] cable0"), "{e}");
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket; Miri isolates the host")]
    fn a_reset_fails_the_connection_whatever_its_paths() {
        let (mut c, _l) = live(2, std::io::ErrorKind::ConnectionReset);
        let e = c.health().unwrap_err().to_string();
        assert!(e.contains("is gone") && e.contains("[1] cable1"), "{e}");
        assert!(c.watching());
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket; Miri isolates the host")]
    fn empty_polls_look_at_the_channel_once_per_sweep_over_the_paths() {
        let (mut c, l) = live(2, std::io::ErrorKind::ConnectionReset);
        let mut out = Vec::new();
        assert!(
            c.poll(0, 4, &mut out).is_err(),
            "the sweep's first empty poll looks"
        );
        // A fresh channel whose next look fails: the same sweep does not look again...
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        c.watch(Liveness::failing(s, std::io::ErrorKind::ConnectionReset));
        c.poll(1, 4, &mut out).unwrap();
        // ... the next one does.
        assert!(c.poll(0, 4, &mut out).is_err(), "the next sweep looks");
    }
}
