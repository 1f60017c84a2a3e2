//! Runs the transport protocol over one TCP path between two processes (two network namespaces in
//! `tests/netns/mesh.sh`): `serve` receives, `connect` sends, both verify the bytes and print the
//! throughput. Until the plugin core is wired, this is the payload of the namespace tests.
//!
//! ```text
//! tcp_pair serve   --local 10.200.1.1 --port 5400 [--peer 10.200.1.2]
//! tcp_pair connect --local 10.200.1.2 --remote 10.200.1.1 --port 5400 [--streams N] [--bytes B] [--iters N]
//! ```
//!
//! The connector chooses the message size, count and stream count and tells the server over a small
//! control connection (port), which also carries the nonce and the control-memory info of both
//! comms; the fabric's streams use port + 1. Exit status 0 only if every message arrived intact.
//! `TCP_PAIR_POLL_US` sets the pause between unsuccessful polls (default 50 µs; 0 spins).
#![allow(clippy::print_stdout)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use switchless::error::{Error, Result};
use switchless::sys::HostBuffer;
use switchless::transport::comm::{ProtocolConfig, RecvBuf, RecvComm, SendComm};
use switchless::transport::fabric::MemKind;
use switchless::transport::tcp::{TcpConfig, TcpFabric, TcpPathSpec, listen_at};
use switchless::transport::wire::CtrlInfo;

#[derive(Parser)]
#[command(about = "switchless transport protocol over one TCP path")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Receive (listens on LOCAL:PORT for control, LOCAL:PORT+1 for the streams).
    Serve {
        #[arg(long)]
        local: IpAddr,
        #[arg(long, default_value_t = 5400)]
        port: u16,
        /// Accept streams only from this address.
        #[arg(long)]
        peer: Option<IpAddr>,
        /// Link speed in Mb/s (stripe weight, buffer sizing).
        #[arg(long, default_value_t = 10_000)]
        speed: u64,
        /// Seconds to wait for the connector.
        #[arg(long, default_value_t = 20)]
        timeout: u64,
    },
    /// Only connect the TCP fabric (nonce 0) and report the outcome: the set-up error path.
    Probe {
        #[arg(long)]
        local: IpAddr,
        #[arg(long)]
        remote: IpAddr,
        #[arg(long, default_value_t = 5400)]
        port: u16,
        #[arg(long, default_value_t = 5)]
        timeout: u64,
    },
    /// Send.
    Connect {
        #[arg(long)]
        local: IpAddr,
        #[arg(long)]
        remote: IpAddr,
        #[arg(long, default_value_t = 5400)]
        port: u16,
        /// TCP streams on the path (default: from the link speed).
        #[arg(long)]
        streams: Option<usize>,
        #[arg(long, default_value_t = 10_000)]
        speed: u64,
        /// Bytes per message.
        #[arg(long, default_value_t = 1 << 20)]
        bytes: usize,
        /// Messages.
        #[arg(long, default_value_t = 64)]
        iters: u32,
        /// Messages in flight.
        #[arg(long, default_value_t = 8)]
        depth: usize,
        /// Check every message (default: the first and the last).
        #[arg(long)]
        verify_all: bool,
        #[arg(long, default_value_t = 20)]
        timeout: u64,
    },
}

fn pattern_into(buf: &mut [u8], msg: u32) {
    let mut x = 0x9e37_79b9_u32 ^ msg.wrapping_mul(0x85eb_ca6b);
    for chunk in buf.chunks_mut(4) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

fn io_err(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(what, e)
}

fn send_blob(s: &mut TcpStream, b: &[u8]) -> Result<()> {
    s.write_all(&(b.len() as u32).to_le_bytes())
        .and_then(|_| s.write_all(b))
        .map_err(io_err("control connection write"))
}

fn recv_blob(s: &mut TcpStream) -> Result<Vec<u8>> {
    let mut l = [0u8; 4];
    s.read_exact(&mut l)
        .map_err(io_err("control connection read"))?;
    let n = u32::from_le_bytes(l) as usize;
    if n > 1 << 16 {
        return Err(Error::Remote(format!("control blob of {n} bytes")));
    }
    let mut v = vec![0u8; n];
    s.read_exact(&mut v)
        .map_err(io_err("control connection read"))?;
    Ok(v)
}

fn gbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 * 8.0 / t.as_secs_f64() / 1e9
}

fn deadline_loop<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let t = Instant::now();
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if t.elapsed() > timeout {
            return Err(Error::Timeout(format!(
                "{what}: nothing after {} s",
                timeout.as_secs()
            )));
        }
        match poll_sleep() {
            Duration::ZERO => std::thread::yield_now(),
            d => std::thread::sleep(d),
        }
    }
}

/// Pause between polls that found nothing: `TCP_PAIR_POLL_US` µs (default 50; 0 spins like NCCL's
/// progress thread, which on a real host has a core of its own; on a 2-core test VM a spinning
/// poller steals the TCP I/O workers' CPU).
fn poll_sleep() -> Duration {
    static US: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    Duration::from_micros(*US.get_or_init(|| {
        std::env::var("TCP_PAIR_POLL_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(50)
    }))
}

fn serve(local: IpAddr, port: u16, peer: Option<IpAddr>, speed: u64, timeout: u64) -> Result<()> {
    let timeout = Duration::from_secs(timeout);
    let ctl_l = TcpListener::bind(SocketAddr::new(local, port))
        .map_err(io_err("binding the control listener"))?;
    let cfg = TcpConfig {
        connect_timeout: Some(timeout),
        ..TcpConfig::default()
    };
    let fab_l = listen_at(SocketAddr::new(local, port + 1), speed, &cfg)?;
    println!("tcp_pair: serving on {local}:{port}");
    ctl_l
        .set_nonblocking(true)
        .map_err(io_err("control listener"))?;
    let (mut ctl, from) = deadline_loop("waiting for the connector", timeout, || {
        match ctl_l.accept() {
            Ok(c) => Ok(Some(c)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
                Ok(None)
            }
            Err(e) => Err(Error::io("accepting control", e)),
        }
    })?;
    ctl.set_nonblocking(false)
        .map_err(io_err("control connection"))?;
    ctl.set_read_timeout(Some(timeout))
        .map_err(io_err("control connection"))?;
    // A lab tool: the secret goes over its own control connection in clear (the plugin's secret
    // comes from the authenticated handshake and never travels).
    let secret = switchless::transport::tcp::auth::random_secret()?;
    send_blob(&mut ctl, secret.bytes())?;
    let params = recv_blob(&mut ctl)?;
    if params.len() != 20 {
        return Err(Error::Remote("bad parameter blob".into()));
    }
    let word = |i: usize| u64::from_le_bytes(params[i..i + 8].try_into().unwrap_or([0; 8]));
    let (bytes, iters) = (word(0) as usize, word(8) as u32);
    let depth =
        (u32::from_le_bytes(params[16..20].try_into().unwrap_or([0; 4])) & 0x7fff_ffff) as usize;
    let spec = TcpPathSpec {
        local,
        remote: SocketAddr::new(peer.unwrap_or(from.ip()), 0),
        speed_mbps: speed,
        mtu: 0,
        label: String::new(),
        relay: None,
    };
    let fab = TcpFabric::accept(&[fab_l], &[spec], &secret, &cfg)?;
    let streams = fab.streams(0);
    let mut r = RecvComm::new(fab, ProtocolConfig::default())?;
    send_blob(&mut ctl, &r.local_info().to_bytes())?;
    r.connect(CtrlInfo::from_bytes(&recv_blob(&mut ctl)?)?)?;

    let depth = depth.clamp(1, 32);
    let bufs: Vec<HostBuffer> = (0..depth)
        .map(|_| HostBuffer::new(bytes.max(1)))
        .collect::<Result<_>>()?;
    let mhs = bufs
        .iter()
        .map(|b| r.reg_mr(&b.lend(), MemKind::Host))
        .collect::<Result<Vec<_>>>()?;
    let mut want = vec![0u8; bytes];
    let mut inflight = std::collections::VecDeque::new();
    let (mut posted, mut done, mut checked) = (0u32, 0u32, 0u32);
    let t0 = Instant::now();
    while done < iters {
        while posted < iters && inflight.len() < depth {
            let k = posted as usize % depth;
            let req = deadline_loop("irecv", timeout, || {
                r.irecv(
                    Instant::now(),
                    &[RecvBuf {
                        addr: bufs[k].addr(),
                        size: bytes as u64,
                        tag: 0,
                        mh: &mhs[k],
                    }],
                )
            })?;
            inflight.push_back((req, k, posted));
            posted += 1;
        }
        let Some(&(req, k, msg)) = inflight.front() else {
            break;
        };
        let sizes = deadline_loop("receive", timeout, || r.test(Instant::now(), req))?;
        inflight.pop_front();
        if sizes.as_slice() != [bytes as u64] {
            return Err(Error::Remote(format!(
                "message {msg}: sizes {:?}, expected [{bytes}]",
                sizes.as_slice()
            )));
        }
        let verify = params_verify_all(&params) || msg == 0 || msg + 1 == iters;
        if verify {
            pattern_into(&mut want, msg);
            if bufs[k].read(0, bytes)? != want {
                return Err(Error::Remote(format!(
                    "message {msg}: received bytes differ from the pattern"
                )));
            }
            checked += 1;
        }
        done += 1;
    }
    let t = t0.elapsed();
    send_blob(&mut ctl, b"done")?;
    println!(
        "tcp_pair: OK: received {iters} messages of {bytes} bytes ({checked} verified) over {streams} streams in {:.3} s: {:.2} Gb/s",
        t.as_secs_f64(),
        gbps(bytes as u64 * u64::from(iters), t)
    );
    for mh in mhs {
        r.dereg_mr(mh)?;
    }
    r.close()
}

fn params_verify_all(p: &[u8]) -> bool {
    // The connector decides; it sends `depth | verify_all << 31` in the last word.
    u32::from_le_bytes(p[16..20].try_into().unwrap_or([0; 4])) >> 31 == 1
}

#[allow(clippy::too_many_arguments)]
fn connect(
    local: IpAddr,
    remote: IpAddr,
    port: u16,
    streams: Option<usize>,
    speed: u64,
    bytes: usize,
    iters: u32,
    depth: usize,
    verify_all: bool,
    timeout: u64,
) -> Result<()> {
    let timeout = Duration::from_secs(timeout);
    let depth = depth.clamp(1, 32);
    let cfg = TcpConfig {
        streams,
        connect_timeout: Some(timeout),
        ..TcpConfig::default()
    };
    // The data path first: it gives the clear error when the peer is not reachable over this link.
    let spec = TcpPathSpec {
        local,
        remote: SocketAddr::new(remote, port + 1),
        speed_mbps: speed,
        mtu: 0,
        label: String::new(),
        relay: None,
    };
    let ctl_sock = socket2::Socket::new(
        socket2::Domain::for_address(spec.remote),
        socket2::Type::STREAM,
        None,
    )
    .map_err(io_err("control socket"))?;
    ctl_sock
        .bind(&SocketAddr::new(local, 0).into())
        .map_err(io_err(
            "binding the control socket to the local link address",
        ))?;
    ctl_sock
        .connect_timeout(&SocketAddr::new(remote, port).into(), timeout)
        .map_err(|e| {
            Error::System(format!(
                "connecting from {local} to {remote}:{port} failed: {e}{}",
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENETUNREACH) | Some(libc::EHOSTUNREACH)
                ) {
                    " (no route: the peer is not on this link's subnet)"
                } else {
                    ""
                }
            ))
        })?;
    let mut ctl: TcpStream = ctl_sock.into();
    ctl.set_read_timeout(Some(timeout))
        .map_err(io_err("control connection"))?;
    let secret_b = recv_blob(&mut ctl)?;
    let secret = switchless::transport::handshake::auth::ConnSecret::from_bytes(
        secret_b
            .as_slice()
            .try_into()
            .map_err(|_| Error::Remote("bad secret".into()))?,
    );
    let mut params = Vec::new();
    params.extend_from_slice(&(bytes as u64).to_le_bytes());
    params.extend_from_slice(&u64::from(iters).to_le_bytes());
    params.extend_from_slice(&((depth as u32) | (u32::from(verify_all) << 31)).to_le_bytes());
    send_blob(&mut ctl, &params)?;
    let fab = TcpFabric::connect(&[spec], &secret, &cfg)?;
    let nstreams = fab.streams(0);
    let mut s = SendComm::new(fab, ProtocolConfig::default())?;
    s.connect(CtrlInfo::from_bytes(&recv_blob(&mut ctl)?)?)?;
    send_blob(&mut ctl, &s.local_info().to_bytes())?;

    let mut bufs: Vec<HostBuffer> = (0..depth)
        .map(|_| HostBuffer::new(bytes.max(1)))
        .collect::<Result<_>>()?;
    let mhs = bufs
        .iter()
        .map(|b| s.reg_mr(&b.lend(), MemKind::Host))
        .collect::<Result<Vec<_>>>()?;
    let mut pat = vec![0u8; bytes];
    let mut inflight = std::collections::VecDeque::new();
    let (mut posted, mut done) = (0u32, 0u32);
    let t0 = Instant::now();
    while done < iters {
        while posted < iters && inflight.len() < depth {
            let k = posted as usize % depth;
            if verify_all || posted == 0 || posted + 1 == iters {
                pattern_into(&mut pat, posted);
                bufs[k].write(0, &pat)?;
            }
            let req = deadline_loop("isend (clear-to-send)", timeout, || {
                s.isend(Instant::now(), bufs[k].addr(), bytes as u64, 0, &mhs[k])
            })?;
            inflight.push_back(req);
            posted += 1;
        }
        let Some(&req) = inflight.front() else { break };
        deadline_loop("send", timeout, || s.test(Instant::now(), req))?;
        inflight.pop_front();
        done += 1;
    }
    let t = t0.elapsed();
    let fin = recv_blob(&mut ctl)?;
    if fin != b"done" {
        return Err(Error::Remote("receiver did not confirm".into()));
    }
    println!(
        "tcp_pair: OK: sent {iters} messages of {bytes} bytes over {nstreams} streams in {:.3} s: {:.2} Gb/s",
        t.as_secs_f64(),
        gbps(bytes as u64 * u64::from(iters), t)
    );
    for mh in mhs {
        s.dereg_mr(mh)?;
    }
    s.close()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let probe = matches!(cli.cmd, Cmd::Probe { .. });
    let r = match cli.cmd {
        Cmd::Probe {
            local,
            remote,
            port,
            timeout,
        } => {
            let cfg = TcpConfig {
                connect_timeout: Some(Duration::from_secs(timeout)),
                ..TcpConfig::default()
            };
            let spec = TcpPathSpec {
                local,
                remote: SocketAddr::new(remote, port),
                speed_mbps: 10_000,
                mtu: 0,
                label: String::new(),
                relay: None,
            };
            switchless::transport::tcp::auth::random_secret()
                .and_then(|secret| TcpFabric::connect(&[spec], &secret, &cfg))
                .map(|_| println!("tcp_pair: probe: connected"))
        }
        Cmd::Serve {
            local,
            port,
            peer,
            speed,
            timeout,
        } => serve(local, port, peer, speed, timeout),
        Cmd::Connect {
            local,
            remote,
            port,
            streams,
            speed,
            bytes,
            iters,
            depth,
            verify_all,
            timeout,
        } => connect(
            local, remote, port, streams, speed, bytes, iters, depth, verify_all, timeout,
        ),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if probe => {
            eprintln!("tcp_pair: probe: TcpFabric::connect failed: {e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("tcp_pair: error: {e}");
            ExitCode::FAILURE
        }
    }
}
