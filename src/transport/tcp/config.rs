//! Sizing policy and options of the TCP fabric: streams per path, socket buffers, frame size and
//! the I/O pool's size. A leaf: host discovery and the doctor (`host::tcp`, `tools::doctor::tcp`)
//! use it without the fabric.
#![forbid(unsafe_code)]

use std::time::Duration;

use socket2::Socket;

use crate::error::{Error, Result};

/// Streams per path: at least this many (one stream stayed under 2.2 Gb/s on a back-to-back
/// 10GBase-T link).
pub const MIN_STREAMS: usize = 2;
/// Streams per path: at most this many.
pub const MAX_STREAMS: usize = 16;
/// Link speed one stream is expected to carry, in Mb/s.
pub const MBPS_PER_STREAM: u64 = 2500;
/// Frame payloads are at least this large (unless the write is smaller).
pub const MIN_FRAME_BYTES: usize = 64 * 1024;
/// Largest frame payload a receiver accepts, bytes.
pub const MAX_FRAME_BYTES: usize = 16 << 20;
/// Largest frame payload on a relayed path: one slot of the relay host's staging memory, which
/// holds a whole frame before forwarding it (store and forward, `transport::relay`); a relay
/// refuses a larger frame.
pub const RELAY_FRAME_BYTES: usize = 512 << 10;
/// Largest pool size accepted (`NCCL_SWITCHLESS_TCP_THREADS`).
pub const MAX_IO_THREADS: usize = 64;
/// Default pool size at most this many threads.
pub const DEFAULT_MAX_IO_THREADS: usize = 8;

/// Number of TCP streams for a path of `speed_mbps` Mb/s: one per [`MBPS_PER_STREAM`], clamped to
/// [`MIN_STREAMS`]..=[`MAX_STREAMS`]; an unknown speed (0) gets 4 (a 10 Gb/s link).
pub fn streams_for_speed(speed_mbps: u64) -> usize {
    if speed_mbps == 0 {
        return 4;
    }
    (speed_mbps.div_ceil(MBPS_PER_STREAM) as usize).clamp(MIN_STREAMS, MAX_STREAMS)
}

/// Streams per path for a per-connection total (`NCCL_SWITCHLESS_TCP_STREAMS=n`, which the config
/// layer defines per connection and spreads over the paths): ⌈total / paths⌉, clamped to
/// 1..=[`MAX_STREAMS`]. Put the result in [`TcpConfig::streams`].
pub fn per_path_streams(total: usize, npaths: usize) -> usize {
    total.div_ceil(npaths.max(1)).clamp(1, MAX_STREAMS)
}

/// Socket buffer size, in bytes, that keeps one stream of a path busy: twice the stream's share of
/// the bandwidth-delay product, `2 × (speed_mbps × 10⁶ / 8 B/s) × (rtt_us × 10⁻⁶ s) / streams`
/// = `speed_mbps × rtt_us / (4 × streams)` bytes, at least 256 KiB, rounded up to 4 KiB. (Twice: the
/// kernel counts its bookkeeping in the buffer, and a window must cover the ACK delay too.)
pub fn socket_buffer_bytes(speed_mbps: u64, rtt_us: u64, streams: usize) -> usize {
    let streams = streams.max(1) as u64;
    let bytes = (speed_mbps.saturating_mul(rtt_us) / (4 * streams)).max(256 * 1024);
    (bytes.div_ceil(4096) * 4096).min(1 << 30) as usize
}

/// What to do with `SO_SNDBUF` / `SO_RCVBUF`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferPolicy {
    /// Compute [`socket_buffer_bytes`]; leave the kernel's autotuning on when its maximum
    /// (`net.ipv4.tcp_rmem`/`tcp_wmem`, third field) already covers that size, otherwise set both
    /// buffers explicitly (the kernel then caps them at `net.core.rmem_max`/`wmem_max`; a warning
    /// names the sysctl to raise).
    Auto,
    /// Set both buffers to this many bytes (turns autotuning off for these sockets).
    Fixed(usize),
}

/// Options of the TCP fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// Streams per path. `None`: [`streams_for_speed`] (the connector decides; the acceptor takes the
    /// count from the connector). The config layer maps `NCCL_SWITCHLESS_TCP_STREAMS` here.
    pub streams: Option<usize>,
    /// Round-trip time assumed for buffer sizing, µs (default 100 µs: a back-to-back cable plus the
    /// hosts' interrupt and scheduling delay).
    pub rtt_us: u64,
    /// Socket buffer policy.
    pub buffers: BufferPolicy,
    /// Largest frame payload in bytes (default 512 KiB; 64 KiB..=16 MiB).
    pub frame_bytes: usize,
    /// Deadline for connecting and accepting every stream; `None`: none (the plugin's default, as
    /// NCCL has none; a connect to an address that does not answer still fails when the kernel
    /// gives up on it).
    pub connect_timeout: Option<Duration>,
    /// I/O worker threads of the process-wide pool (1..=[`MAX_IO_THREADS`]); `None`:
    /// [`default_io_threads`]. Used when the pool starts (its first stream); the config layer maps
    /// `NCCL_SWITCHLESS_TCP_THREADS` here.
    pub io_threads: Option<usize>,
    /// A stream whose sent data stays unacknowledged this long fails (`TCP_USER_TIMEOUT`), so its
    /// path fails over; `None`: the kernel's limit (about 15 minutes of retransmissions). Catches a
    /// peer host that froze or a link that drops frames while its carrier stays up. A peer that
    /// stopped reading but answers its window probes keeps its streams (`super::window`). The
    /// config layer maps `NCCL_SWITCHLESS_TCP_USER_TIMEOUT` here.
    pub user_timeout: Option<Duration>,
}

/// Default [`TcpConfig::user_timeout`]: about what an RC queue pair retries with NCCL's defaults
/// (`NCCL_IB_TIMEOUT=20`, `NCCL_IB_RETRY_CNT=7`: 8 tries of 4.3 s).
pub const DEFAULT_USER_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            streams: None,
            rtt_us: 100,
            buffers: BufferPolicy::Auto,
            frame_bytes: 512 * 1024,
            connect_timeout: Some(Duration::from_secs(10)),
            io_threads: None,
            user_timeout: Some(DEFAULT_USER_TIMEOUT),
        }
    }
}

impl TcpConfig {
    /// Checks every option against its accepted range.
    pub(super) fn check(&self) -> Result<()> {
        if let Some(s) = self.streams
            && !(1..=MAX_STREAMS).contains(&s)
        {
            return Err(Error::InvalidUsage(format!(
                "{s} TCP streams per path; accepted: 1..={MAX_STREAMS}"
            )));
        }
        if !(MIN_FRAME_BYTES..=MAX_FRAME_BYTES).contains(&self.frame_bytes) {
            return Err(Error::InvalidUsage(format!(
                "TCP frame size {} bytes; accepted: {MIN_FRAME_BYTES}..={MAX_FRAME_BYTES} bytes",
                self.frame_bytes
            )));
        }
        if let Some(t) = self.io_threads
            && !(1..=MAX_IO_THREADS).contains(&t)
        {
            return Err(Error::InvalidUsage(format!(
                "{t} TCP I/O threads; accepted: 1..={MAX_IO_THREADS}"
            )));
        }
        if let BufferPolicy::Fixed(b) = self.buffers
            && !(4096..=1 << 30).contains(&b)
        {
            return Err(Error::InvalidUsage(format!(
                "TCP socket buffer of {b} bytes; accepted: 4096..=1073741824 bytes"
            )));
        }
        Ok(())
    }
}

/// Default pool size: one worker per CPU this process may run on
/// ([`std::thread::available_parallelism`], which honours affinity and cgroup quotas), at most
/// [`DEFAULT_MAX_IO_THREADS`]. A worker is busy only while it copies between a socket and memory, so
/// more workers than CPUs would only add context switches; eight keep the ≤ 200 Gb/s of TCP links a
/// host drives (about 10–25 Gb/s of copies per core) while leaving cores to NCCL's own threads.
pub fn default_io_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, DEFAULT_MAX_IO_THREADS)
}

fn sysctl_max(path: &str) -> Option<usize> {
    let s = std::fs::read_to_string(path).ok()?;
    s.split_whitespace().last()?.parse().ok()
}

/// Sets `SO_SNDBUF`/`SO_RCVBUF` of `sock` (a stream of a path with `streams` streams) as
/// [`TcpConfig::buffers`] says; before `connect`/`listen`, so that the window scale covers them.
fn apply_buffers(sock: &Socket, speed_mbps: u64, streams: usize, cfg: &TcpConfig) -> Result<()> {
    let want = match cfg.buffers {
        BufferPolicy::Fixed(b) => b,
        BufferPolicy::Auto => {
            let want = socket_buffer_bytes(speed_mbps, cfg.rtt_us, streams);
            let auto_r = sysctl_max("/proc/sys/net/ipv4/tcp_rmem").unwrap_or(0);
            let auto_w = sysctl_max("/proc/sys/net/ipv4/tcp_wmem").unwrap_or(0);
            if auto_r >= want && auto_w >= want {
                return Ok(());
            }
            let cap = sysctl_max("/proc/sys/net/core/rmem_max").unwrap_or(0);
            if cap < want {
                tracing::warn!(
                    "NET/switchless: TCP socket buffers of {want} bytes wanted (bandwidth-delay product), \
                     but net.core.rmem_max is {cap} bytes; raise net.core.rmem_max/wmem_max"
                );
            }
            want
        }
    };
    sock.set_send_buffer_size(want)
        .map_err(|e| Error::io(format!("SO_SNDBUF {want} bytes"), e))?;
    sock.set_recv_buffer_size(want)
        .map_err(|e| Error::io(format!("SO_RCVBUF {want} bytes"), e))?;
    Ok(())
}

/// Sets the stream options of `sock` (a stream, or the listener its streams are accepted from):
/// socket buffers (`apply_buffers`) and [`TcpConfig::user_timeout`].
pub fn apply_options(
    sock: &Socket,
    speed_mbps: u64,
    streams: usize,
    cfg: &TcpConfig,
) -> Result<()> {
    apply_buffers(sock, speed_mbps, streams, cfg)?;
    let ms = cfg
        .user_timeout
        .map_or(0, |d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX));
    crate::sys::socket::set_user_timeout(sock, ms)
        .map_err(|e| Error::io(format!("TCP_USER_TIMEOUT {ms} ms"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_count_follows_link_speed() {
        assert_eq!(streams_for_speed(1_000), 2);
        assert_eq!(streams_for_speed(10_000), 4);
        assert_eq!(streams_for_speed(25_000), 10);
        assert_eq!(streams_for_speed(100_000), 16);
        assert_eq!(streams_for_speed(0), 4);
    }

    #[test]
    fn per_connection_totals_become_per_path_counts() {
        assert_eq!(per_path_streams(8, 2), 4);
        assert_eq!(per_path_streams(5, 2), 3);
        assert_eq!(per_path_streams(1, 4), 1);
        assert_eq!(per_path_streams(64, 1), 16);
        assert_eq!(per_path_streams(3, 0), 3);
    }

    #[test]
    fn buffer_follows_bandwidth_delay_product() {
        // 10 Gb/s, 100 µs, 4 streams: BDP 125 000 bytes, per stream 31 250, doubled 62 500 → floor.
        assert_eq!(socket_buffer_bytes(10_000, 100, 4), 256 * 1024);
        // 100 Gb/s, 1 ms, 2 streams: 100e9/8 × 1e-3 / 2 × 2 = 12.5 MB → rounded to 4 KiB.
        assert_eq!(
            socket_buffer_bytes(100_000, 1000, 2),
            12_500_000usize.div_ceil(4096) * 4096
        );
    }

    #[test]
    fn config_is_checked() {
        let mut c = TcpConfig {
            streams: Some(0),
            ..TcpConfig::default()
        };
        assert!(c.check().unwrap_err().to_string().contains("1..=16"));
        c.streams = Some(17);
        assert!(c.check().is_err());
        c.streams = Some(16);
        assert!(c.check().is_ok());
        c.frame_bytes = 1;
        assert!(c.check().unwrap_err().to_string().contains("frame size"));
        let mut c = TcpConfig {
            io_threads: Some(0),
            ..TcpConfig::default()
        };
        assert!(c.check().unwrap_err().to_string().contains("1..=64"));
        c.io_threads = Some(65);
        assert!(c.check().is_err());
        c.io_threads = Some(64);
        assert!(c.check().is_ok());
    }

    #[test]
    fn pool_size_follows_the_configuration() {
        assert_eq!(MAX_IO_THREADS, usize::from(crate::config::MAX_TCP_THREADS));
        let n = default_io_threads();
        assert!((1..=DEFAULT_MAX_IO_THREADS).contains(&n));
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(n, cpus.min(DEFAULT_MAX_IO_THREADS));
    }
}
