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
