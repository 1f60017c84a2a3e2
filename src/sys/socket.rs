//! Non-blocking socket I/O on borrowed fds: `recv`/`send` with `MSG_DONTWAIT`, and `MSG_NOSIGNAL` on
//! sends (a closed peer must not raise `SIGPIPE` in the host process, which may not ignore it).
//! Waiting for readiness is [`wait_fd`] (`poll(2)`), so a caller can hold a lock during a copy without
//! ever holding it across a wait.

use std::io;
use std::os::fd::AsRawFd;

/// Flags of every receive: never block.
pub(super) const RECV_FLAGS: libc::c_int = libc::MSG_DONTWAIT;

/// Flags of every send: never block, never `SIGPIPE`; `MSG_MORE` when more bytes of the frame follow.
pub(super) fn send_flags(more: bool) -> libc::c_int {
    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL | if more { libc::MSG_MORE } else { 0 }
}

/// Sends bytes from a Rust slice without blocking and without `SIGPIPE` (`MSG_MORE` when `more`).
pub fn send_slice(sock: &impl AsRawFd, data: &[u8], more: bool) -> io::Result<usize> {
    if data.is_empty() {
        return Ok(0);
    }
    // SAFETY: `data` is a valid slice for reads of its length; the fd is borrowed from a live socket.
    let n = syscall!(send(
        sock.as_raw_fd(),
        data.as_ptr().cast(),
        data.len(),
        send_flags(more)
    ))?;
    Ok(n as usize)
}

/// Receives into a Rust slice without blocking (`Ok(0)`: end of stream).
pub fn recv_slice(sock: &impl AsRawFd, out: &mut [u8]) -> io::Result<usize> {
    if out.is_empty() {
        return Ok(0);
    }
    // SAFETY: `out` is a valid, exclusively borrowed slice for writes of its length; the fd is
    // borrowed from a live socket.
    let n = syscall!(recv(
        sock.as_raw_fd(),
        out.as_mut_ptr().cast(),
        out.len(),
        RECV_FLAGS
    ))?;
    Ok(n as usize)
}

/// How far [`fill`] got with a fixed-size message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// The buffer is whole.
    Whole,
    /// Nothing more to read now (`EAGAIN`): call again once readable.
    Pending,
    /// The peer ended the stream before the buffer was whole.
    Closed,
}

/// Reads into `buf[*got..]` without blocking until it is whole, the socket has nothing more, or
/// the stream ends; `*got` counts the bytes in. `EINTR` is retried; other errors are returned.
pub fn fill(sock: &impl AsRawFd, buf: &mut [u8], got: &mut usize) -> io::Result<Fill> {
    while *got < buf.len() {
        match recv_slice(sock, &mut buf[*got..]) {
            Ok(0) => return Ok(Fill::Closed),
            Ok(n) => *got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Fill::Pending),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Fill::Whole)
}

/// Sends `data[*sent..]` without blocking until all of it is out (`Ok(true)`) or the socket takes
/// no more now (`Ok(false)`); `*sent` counts the bytes out. `EINTR` is retried.
pub fn drain(sock: &impl AsRawFd, data: &[u8], sent: &mut usize) -> io::Result<bool> {
    while *sent < data.len() {
        match send_slice(sock, &data[*sent..], false) {
            Ok(n) => *sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// What [`wait_fd`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// Data to read (or end of stream / error).
    Read,
    /// Room to write (or error).
    Write,
}

/// Waits up to `timeout_ms` milliseconds until `sock` is ready; `Ok(true)` when ready (including
/// hang-up and error conditions, which the next I/O call reports), `Ok(false)` on timeout.
pub fn wait_fd(sock: &impl AsRawFd, what: Ready, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: match what {
            Ready::Read => libc::POLLIN,
            Ready::Write => libc::POLLOUT,
        },
        revents: 0,
    };
    // SAFETY: `pfd` is one valid pollfd on the stack and the count passed is 1.
    match syscall!(poll(&mut pfd, 1, timeout_ms)) {
        Ok(n) => Ok(n > 0),
        // A signal cut the wait short: report "not ready" and let the caller poll again.
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(e),
    }
}

/// What [`peer_state`] saw on a connection this side only listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// Nothing to read: the peer is there (as far as TCP knows).
    Quiet,
    /// The peer sent bytes (left unread).
    Data,
    /// The peer closed its end (end of stream).
    Closed,
}

/// Looks at a connection without taking anything from it and without blocking (`MSG_PEEK`): a
/// reset, a keepalive or user timeout, or any socket error comes back as the error.
pub fn peer_state(sock: &impl AsRawFd) -> io::Result<PeerState> {
    let mut b = [0u8; 1];
    // SAFETY: `b` is a valid, exclusively borrowed 1-byte buffer; the fd is borrowed from a live
    // socket.
    match syscall!(recv(
        sock.as_raw_fd(),
        b.as_mut_ptr().cast(),
        b.len(),
        RECV_FLAGS | libc::MSG_PEEK
    )) {
        Ok(0) => Ok(PeerState::Closed),
        Ok(_) => Ok(PeerState::Data),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(PeerState::Quiet),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(PeerState::Quiet),
        Err(e) => Err(e),
    }
}

/// Bytes handed to the kernel on a TCP socket that the peer has not acknowledged yet (sent or
/// not: `SIOCOUTQ`, the send queue from `snd_una` to `write_seq`). Bytes written minus this is
/// what the peer's kernel holds: what survives the link dying.
pub fn unacked_bytes(sock: &impl AsRawFd) -> io::Result<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one c_int through the pointer, which points at `n`, a
    // live c_int on the stack; the fd is borrowed from a live socket.
    syscall!(ioctl(
        sock.as_raw_fd(),
        libc::TIOCOUTQ,
        &mut n as *mut libc::c_int
    ))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// What [`tcp_info`] reports of a TCP connection's send side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TcpInfo {
    /// Segments sent and not acknowledged yet (`tcpi_unacked`).
    pub unacked: u32,
    /// Bytes queued that the peer's window has not let out yet (`tcpi_notsent_bytes`).
    pub notsent_bytes: u32,
    /// Window probes sent since the peer last answered (`tcpi_probes`: reset by every ACK).
    pub probes: u8,
    /// Milliseconds since the peer's last ACK (`tcpi_last_ack_recv`).
    pub last_ack_recv_ms: u32,
}

/// `TCP_INFO` of a TCP socket (fields an older kernel does not fill read as 0).
pub fn tcp_info(sock: &impl AsRawFd) -> io::Result<TcpInfo> {
    // SAFETY: `tcp_info` is a plain C struct of integers: all-zero is a valid value.
    let mut i: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `i` is a live, writable `tcp_info` on the stack and `len` its size; the kernel
    // writes at most `len` bytes and stores the length it wrote in `len`. The fd is borrowed from
    // a live socket.
    syscall!(getsockopt(
        sock.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_INFO,
        (&mut i as *mut libc::tcp_info).cast(),
        &mut len
    ))?;
    Ok(TcpInfo {
        unacked: i.tcpi_unacked,
        notsent_bytes: i.tcpi_notsent_bytes,
        probes: i.tcpi_probes,
        last_ack_recv_ms: i.tcpi_last_ack_recv,
    })
}

/// Aborts a TCP connection without closing the fd: `connect` to `AF_UNSPEC` dissolves it
/// (`tcp_disconnect`: a reset to the peer, the send and receive queues purged), so nothing this
/// end handed to the kernel is delivered later, even when the link comes back.
pub fn abort(sock: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: an all-zero `sockaddr` is a valid value of the plain C struct; only its family is
    // set.
    let mut addr: libc::sockaddr = unsafe { std::mem::zeroed() };
    addr.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    // SAFETY: `addr` is a live sockaddr on the stack and the length passed is its size; the fd is
    // borrowed from a live socket.
    syscall!(connect(
        sock.as_raw_fd(),
        &addr as *const libc::sockaddr,
        std::mem::size_of::<libc::sockaddr>() as libc::socklen_t
    ))?;
    Ok(())
}

fn set_int(
    sock: &impl AsRawFd,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `v` is a live c_int on the stack and the length passed is its size.
    syscall!(setsockopt(
        sock.as_raw_fd(),
        level,
        opt,
        (&v as *const libc::c_int).cast(),
        std::mem::size_of::<libc::c_int>() as libc::socklen_t
    ))?;
    Ok(())
}

/// `TCP_QUICKACK`: acknowledges what has arrived now instead of after the delayed-ACK timer, and
/// leaves the kernel's interactive (ping-pong) mode. Not sticky: the kernel may delay again later,
/// so a receiver sets it each time it has drained the socket.
pub fn quickack(sock: &impl AsRawFd) -> io::Result<()> {
    set_int(sock, libc::IPPROTO_TCP, libc::TCP_QUICKACK, 1)
}

/// `TCP_USER_TIMEOUT`: the connection fails once sent data has stayed unacknowledged for `ms`
/// milliseconds (0: the kernel's retransmission limit, about 15 minutes). Accepted sockets inherit
/// it from their listener.
pub fn set_user_timeout(sock: &impl AsRawFd, ms: u32) -> io::Result<()> {
    let v = libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX);
    set_int(sock, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, v)
}

/// TCP keepalive on an idle connection: the first probe after `idle_s` seconds without traffic,
/// then every `interval_s`, `count` unanswered probes reset it; `TCP_USER_TIMEOUT` of the same total
/// bounds unacknowledged data too. So a peer host that vanishes (power, cable) shows up as an error
/// within `idle_s + interval_s * count` seconds.
pub fn set_keepalive(
    sock: &impl AsRawFd,
    idle_s: u32,
    interval_s: u32,
    count: u32,
) -> io::Result<()> {
    let int = |v: u32| libc::c_int::try_from(v).unwrap_or(libc::c_int::MAX);
    set_int(sock, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set_int(sock, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, int(idle_s))?;
    set_int(
        sock,
        libc::IPPROTO_TCP,
        libc::TCP_KEEPINTVL,
        int(interval_s),
    )?;
    set_int(sock, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, int(count))?;
    let total_ms = idle_s
        .saturating_add(interval_s.saturating_mul(count))
        .saturating_mul(1000);
    set_int(
        sock,
        libc::IPPROTO_TCP,
        libc::TCP_USER_TIMEOUT,
        int(total_ms),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    #[cfg_attr(miri, ignore = "calls recv(2) and send(2)")]
    fn fill_and_drain_report_whole_pending_and_closed() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut buf = [0u8; 8];
        let mut got = 0;
        assert_eq!(fill(&a, &mut buf, &mut got).unwrap(), Fill::Pending);
        b.write_all(b"abc").unwrap();
        assert_eq!(fill(&a, &mut buf, &mut got).unwrap(), Fill::Pending);
        assert_eq!(got, 3);
        let mut sent = 0;
        assert!(drain(&b, b"defgh", &mut sent).unwrap());
        assert_eq!(sent, 5);
        assert_eq!(fill(&a, &mut buf, &mut got).unwrap(), Fill::Whole);
        assert_eq!(&buf, b"abcdefgh");
        b.write_all(b"x").unwrap();
        drop(b);
        let (mut buf, mut got) = ([0u8; 4], 0);
        assert_eq!(fill(&a, &mut buf, &mut got).unwrap(), Fill::Closed);
        assert_eq!(got, 1);
        // A full socket takes what it can and says so.
        let (c, _d) = UnixStream::pair().unwrap();
        let big = vec![7u8; 8 << 20];
        let mut sent = 0;
        assert!(!drain(&c, &big, &mut sent).unwrap());
        assert!(sent > 0 && sent < big.len(), "{sent}");
    }
}
