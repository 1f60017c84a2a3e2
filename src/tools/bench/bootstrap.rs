//! Rank bootstrap over TCP: rank 0 listens, every other rank connects to it; blobs (the plugin's
//! 128-byte listen handles, per-size results) are all-gathered through rank 0.
//!
//! Wire format (all integers little-endian u32): hello = magic "SWLB", version 1, rank, nranks;
//! the root answers with the same four words. A blob is a length followed by its bytes; the root
//! answers an all-gather with the count followed by each rank's blob in rank order.
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

const MAGIC: u32 = u32::from_le_bytes(*b"SWLB");
const VERSION: u32 = 1;
/// Largest blob a rank may contribute to one all-gather.
pub const MAX_BLOB: usize = 1 << 20;

/// A joined group of ranks.
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
    /// Root: one stream per rank 1..n (index rank-1). Others: the stream to the root.
    peers: Vec<TcpStream>,
}

fn io(what: &str, e: std::io::Error) -> Error {
    Error::System(format!("bootstrap: {what}: {e}"))
}

fn put_u32(s: &mut TcpStream, v: u32) -> Result<()> {
    s.write_all(&v.to_le_bytes()).map_err(|e| io("write", e))
}

fn get_u32(s: &mut TcpStream) -> Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)
        .map_err(|e| io("read (peer gone or timed out)", e))?;
    Ok(u32::from_le_bytes(b))
}

fn put_blob(s: &mut TcpStream, b: &[u8]) -> Result<()> {
    put_u32(s, b.len() as u32)?;
    s.write_all(b).map_err(|e| io("write", e))
}

fn get_blob(s: &mut TcpStream) -> Result<Vec<u8>> {
    let n = get_u32(s)? as usize;
    if n > MAX_BLOB {
        return Err(Error::Remote(format!(
            "bootstrap: peer sent a {n} B blob (accepted: up to {MAX_BLOB} B)"
        )));
    }
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).map_err(|e| io("read", e))?;
    Ok(b)
}

fn hello(s: &mut TcpStream, rank: usize, nranks: usize) -> Result<()> {
    for v in [MAGIC, VERSION, rank as u32, nranks as u32] {
        put_u32(s, v)?;
    }
    Ok(())
}

fn read_hello(s: &mut TcpStream) -> Result<(usize, usize)> {
    let magic = get_u32(s)?;
    let version = get_u32(s)?;
    if magic != MAGIC || version != VERSION {
        return Err(Error::Remote(format!(
            "bootstrap: bad hello (magic {magic:#x}, version {version}; accepted: magic {MAGIC:#x} version {VERSION}): not a switchless bench peer"
        )));
    }
    Ok((get_u32(s)? as usize, get_u32(s)? as usize))
}

impl Bootstrap {
    /// Rank 0: accepts the other `nranks - 1` ranks on `listener` within `timeout`.
    pub fn root(listener: TcpListener, nranks: usize, timeout: Duration) -> Result<Self> {
        if nranks == 0 {
            return Err(Error::InvalidUsage(
                "--nranks 0 (accepted: 1 or more)".into(),
            ));
        }
        let deadline = Instant::now() + timeout;
        listener
            .set_nonblocking(true)
            .map_err(|e| io("listener", e))?;
        let mut slots: Vec<Option<TcpStream>> = (1..nranks).map(|_| None).collect();
        let mut have = 0;
        while have + 1 < nranks {
            match listener.accept() {
                Ok((mut s, from)) => {
                    s.set_nonblocking(false).map_err(|e| io("accept", e))?;
                    s.set_read_timeout(Some(timeout))
                        .map_err(|e| io("accept", e))?;
                    s.set_nodelay(true).ok();
                    let (r, n) = read_hello(&mut s)?;
                    if n != nranks || r == 0 || r >= nranks {
                        return Err(Error::InvalidUsage(format!(
                            "bootstrap: {from} says rank {r} of {n}; this root runs {nranks} ranks (accepted ranks: 1..{})",
                            nranks - 1
                        )));
                    }
                    if slots[r - 1].is_some() {
                        return Err(Error::InvalidUsage(format!(
                            "bootstrap: rank {r} joined twice (second from {from})"
                        )));
                    }
                    hello(&mut s, r, nranks)?;
                    slots[r - 1] = Some(s);
                    have += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        let missing: Vec<String> = slots
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| s.is_none())
                            .map(|(i, _)| (i + 1).to_string())
                            .collect();
                        return Err(Error::Timeout(format!(
                            "bootstrap: ranks {} did not join within {} s",
                            missing.join(","),
                            timeout.as_secs()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(io("accept", e)),
            }
        }
        Ok(Bootstrap {
            rank: 0,
            nranks,
            peers: slots.into_iter().flatten().collect(),
        })
    }

    /// Rank 0 given an address to bind.
    pub fn listen(addr: &str, nranks: usize, timeout: Duration) -> Result<Self> {
        let l = TcpListener::bind(addr)
            .map_err(|e| io(&format!("bind {addr} (rank 0 listens there)"), e))?;
        Self::root(l, nranks, timeout)
    }

    /// Rank `rank` (≥1): connects to the root at `addr`, retrying until `timeout` (the root may
    /// start later).
    pub fn join(addr: &str, rank: usize, nranks: usize, timeout: Duration) -> Result<Self> {
        if rank == 0 || rank >= nranks {
            return Err(Error::InvalidUsage(format!(
                "--rank {rank} with --nranks {nranks} (accepted: 0..{})",
                nranks.saturating_sub(1)
            )));
        }
        let deadline = Instant::now() + timeout;
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| {
                Error::InvalidUsage(format!(
                    "bootstrap address '{addr}': {e} (accepted: HOST:PORT)"
                ))
            })?
            .collect();
        let first = addrs.first().copied().ok_or_else(|| {
            Error::InvalidUsage(format!("bootstrap address '{addr}' resolves to nothing"))
        })?;
        let mut s = loop {
            match TcpStream::connect_timeout(&first, Duration::from_secs(2)) {
                Ok(s) => break s,
                Err(e) => {
                    if Instant::now() > deadline {
                        return Err(Error::Timeout(format!(
                            "bootstrap: rank 0 at {addr} not reachable within {} s: {e}",
                            timeout.as_secs()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        };
        s.set_read_timeout(Some(timeout))
            .map_err(|e| io("connect", e))?;
        s.set_nodelay(true).ok();
        hello(&mut s, rank, nranks)?;
        let (r, n) = read_hello(&mut s)?;
        if r != rank || n != nranks {
            return Err(Error::Remote(format!(
                "bootstrap: root acknowledged rank {r} of {n}, expected {rank} of {nranks}"
            )));
        }
        Ok(Bootstrap {
            rank,
            nranks,
            peers: vec![s],
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Every rank's `mine`, in rank order.
    pub fn allgather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        if mine.len() > MAX_BLOB {
            return Err(Error::Internal(format!(
                "bootstrap blob of {} B exceeds {MAX_BLOB} B",
                mine.len()
            )));
        }
        if self.rank == 0 {
            let mut all = vec![mine.to_vec()];
            for s in &mut self.peers {
                all.push(get_blob(s)?);
            }
            for s in &mut self.peers {
                put_u32(s, all.len() as u32)?;
                for b in &all {
                    put_blob(s, b)?;
                }
            }
            Ok(all)
        } else {
            let s = &mut self.peers[0];
            put_blob(s, mine)?;
            let n = get_u32(s)? as usize;
            if n != self.nranks {
                return Err(Error::Remote(format!(
                    "bootstrap: root sent {n} blobs for {} ranks",
                    self.nranks
                )));
            }
            (0..n).map(|_| get_blob(s)).collect()
        }
    }

    /// Waits for every rank.
    pub fn barrier(&mut self) -> Result<()> {
        self.allgather(&[]).map(|_| ())
    }

    /// The job's communicator id, the same on every rank: rank 0's `given` id (`--comm-id`), else a
    /// random one rank 0 draws, so that each job is its own communicator as NCCL's commHash is
    /// (the plugin derives its relay port from it: jobs sharing an id share relay services). A
    /// rank given an id that differs from rank 0's fails, and so does every other rank, each
    /// naming the rank: all of them see every rank's blob.
    pub fn agree_comm_id(&mut self, given: Option<u64>) -> Result<u64> {
        let mine = match (self.rank, given) {
            (_, Some(id)) => id,
            (0, None) => random_comm_id()?,
            (_, None) => 0, // not read: rank 0's id counts
        };
        let mut blob = [0u8; 9];
        blob[0] = u8::from(given.is_some());
        blob[1..].copy_from_slice(&mine.to_le_bytes());
        let all = self.allgather(&blob)?;
        let mut ids = Vec::with_capacity(all.len());
        for (r, b) in all.iter().enumerate() {
            let (flag, id) = match b.split_first() {
                Some((&f, id)) if f <= 1 && id.len() == 8 => {
                    (f == 1, u64::from_le_bytes(id.try_into().unwrap_or([0; 8])))
                }
                _ => {
                    return Err(Error::Remote(format!(
                        "bootstrap: rank {r} sent a {} B communicator id blob (accepted: 9 B, a flag 0 or 1 and the id)",
                        b.len()
                    )));
                }
            };
            ids.push((flag, id));
        }
        let root = match ids.first() {
            Some(&(_, id)) if id != 0 => id,
            _ => {
                return Err(Error::Remote(
                    "bootstrap: rank 0 sent communicator id 0 (accepted: 1 or more)".into(),
                ));
            }
        };
        for (r, &(flag, id)) in ids.iter().enumerate() {
            if flag && id != root {
                let root_has = if ids.first().is_some_and(|&(f, _)| f) {
                    format!("was given --comm-id {root:#x}")
                } else {
                    format!("has no --comm-id (it drew {root:#x})")
                };
                return Err(Error::InvalidUsage(format!(
                    "rank {r} was given --comm-id {id:#x} but rank 0 {root_has}: give every rank of a job the same --comm-id, or none"
                )));
            }
        }
        Ok(root)
    }
}

/// A random communicator id, never 0.
fn random_comm_id() -> Result<u64> {
    loop {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b)
            .map_err(|e| Error::System(format!("drawing the job's communicator id: {e}")))?;
        let id = u64::from_le_bytes(b);
        if id != 0 {
            return Ok(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket; Miri isolates the host")]
    fn three_ranks_allgather() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = Duration::from_secs(10);
        let hs: Vec<_> = (1..3)
            .map(|r| {
                let a = addr.clone();
                std::thread::spawn(move || {
                    let mut b = Bootstrap::join(&a, r, 3, t).unwrap();
                    b.allgather(&[r as u8; 3]).unwrap()
                })
            })
            .collect();
        let mut root = Bootstrap::root(l, 3, t).unwrap();
        let all = root.allgather(b"x").unwrap();
        assert_eq!(all, vec![b"x".to_vec(), vec![1; 3], vec![2; 3]]);
        for h in hs {
            assert_eq!(h.join().unwrap(), all);
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket; Miri isolates the host")]
    fn bad_rank_and_missing_ranks_are_errors() {
        assert!(Bootstrap::join("127.0.0.1:1", 0, 2, Duration::from_millis(10)).is_err());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = Bootstrap::root(l, 2, Duration::from_millis(200))
            .err()
            .unwrap();
        assert!(e.to_string().contains("ranks 1 did not join"), "{e}");
    }

    /// Runs `agree_comm_id` on `n` ranks over 127.0.0.1, rank r given `given[r]`.
    fn agree(given: &[Option<u64>]) -> Vec<Result<u64>> {
        let n = given.len();
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t = Duration::from_secs(10);
        let hs: Vec<_> = (1..n)
            .map(|r| {
                let (a, g) = (addr.clone(), given[r]);
                std::thread::spawn(move || Bootstrap::join(&a, r, n, t).unwrap().agree_comm_id(g))
            })
            .collect();
        let mut out = vec![Bootstrap::root(l, n, t).unwrap().agree_comm_id(given[0])];
        out.extend(hs.into_iter().map(|h| h.join().unwrap()));
        out
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket; Miri isolates the host")]
    fn every_rank_gets_the_same_comm_id_and_each_job_its_own() {
        let a: Vec<u64> = agree(&[None, None, None])
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert!(a[0] != 0 && a.iter().all(|&x| x == a[0]), "{a:x?}");
        let b: Vec<u64> = agree(&[None, None, None])
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_ne!(a[0], b[0], "two jobs drew the same id");
        // Given on every rank, or on rank 0 alone: that id everywhere.
        for given in [
            [Some(0x77), Some(0x77), Some(0x77)],
            [Some(0x77), None, None],
        ] {
            let ids: Vec<u64> = agree(&given).into_iter().map(Result::unwrap).collect();
            assert_eq!(ids, vec![0x77; 3]);
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket; Miri isolates the host")]
    fn a_rank_with_another_comm_id_fails_every_rank_naming_it() {
        for given in [[Some(0x77), None, Some(0x78)], [None, None, Some(0x78)]] {
            for r in agree(&given) {
                let e = r.unwrap_err().to_string();
                assert!(
                    e.contains("rank 2 was given --comm-id 0x78 but rank 0"),
                    "{e}"
                );
                assert!(e.contains("same --comm-id, or none"), "{e}");
            }
        }
    }
}
