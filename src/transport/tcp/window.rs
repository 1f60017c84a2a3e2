//! A slow peer is not a dead peer: the window guard of a stream's send side.
//!
//! Streams set `TCP_USER_TIMEOUT` ([`super::TcpConfig::user_timeout`], 30 s by default) so that a
//! peer host that froze, or a link that drops frames while its carrier stays up, fails the path
//! instead of retransmitting for 15 minutes. But Linux (since 5.11, commit 9d9b1ee0b2d1 "tcp: fix
//! TCP_USER_TIMEOUT with zero window") applies the same timeout to a peer whose receive window
//! stays closed, even while it answers every window probe: a healthy peer that stops reading for
//! that long (a busy or descheduled receiver) had its streams killed with `ETIMEDOUT`. So while the
//! peer has acknowledged everything sent and only its closed window holds data back, the stream's
//! user timeout is suspended, and put back as soon as data is in flight again (the kernel's own
//! timeout then judges unacknowledged data, as before). A peer that answers no window probe is
//! still called dead here: two probes unanswered and nothing heard for the user timeout.

use std::time::Duration;

use crate::sys::socket::TcpInfo;

/// Window probes unanswered in a row (with nothing heard for the user timeout) that make a peer
/// whose window is closed dead. A live peer answers each within a round trip, so at most one is
/// ever outstanding.
pub const DEAD_PROBES: u8 = 2;

/// What the guard does with a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    Nothing,
    /// The peer's window is closed and everything sent is acknowledged: suspend the user timeout.
    Suspend,
    /// Data is in flight again, or nothing is queued: put the user timeout back.
    Restore,
    /// The peer answers no window probe: fail the stream with this reason.
    Dead(String),
}

/// The guard's decision for a stream whose `TCP_INFO` is `info`, whose user timeout is `timeout`
/// and is suspended now (`suspended`).
pub(super) fn verdict(info: &TcpInfo, suspended: bool, timeout: Duration) -> Verdict {
    let window_closed = info.unacked == 0 && info.notsent_bytes > 0;
    if !window_closed {
        return if suspended {
            Verdict::Restore
        } else {
            Verdict::Nothing
        };
    }
    if !suspended {
        return Verdict::Suspend;
    }
    let silent = Duration::from_millis(u64::from(info.last_ack_recv_ms));
    if info.probes >= DEAD_PROBES && silent >= timeout {
        return Verdict::Dead(format!(
            "the peer's receive window stayed closed and it answered none of the last {} window \
             probes: nothing heard from it for {} ms (its host is gone)",
            info.probes,
            silent.as_millis()
        ));
    }
    Verdict::Nothing
}

/// How often a stream with bytes the peer has not acknowledged is looked at: a quarter of the
/// user timeout (the kernel gives up at the user timeout after its first window probe), between
/// 10 ms and 1 s.
pub(super) fn guard_every(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// The user timeout as `TCP_USER_TIMEOUT` takes it (milliseconds; 0: the kernel's default).
pub(super) fn timeout_ms(timeout: Option<Duration>) -> u32 {
    timeout.map_or(0, |d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(unacked: u32, notsent: u32, probes: u8, quiet_ms: u32) -> TcpInfo {
        TcpInfo {
            unacked,
            notsent_bytes: notsent,
            probes,
            last_ack_recv_ms: quiet_ms,
        }
    }

    #[test]
    fn a_closed_window_suspends_the_timeout_and_data_in_flight_restores_it() {
        let t = Duration::from_secs(30);
        // Sending, or idle: nothing to do.
        assert_eq!(verdict(&info(5, 1000, 0, 0), false, t), Verdict::Nothing);
        assert_eq!(verdict(&info(0, 0, 0, 90_000), false, t), Verdict::Nothing);
        // Everything sent is acknowledged, data waits for the window: suspend.
        assert_eq!(verdict(&info(0, 1000, 0, 100), false, t), Verdict::Suspend);
        // Suspended, the peer answers its probes (long gaps between probes are backoff): keep.
        assert_eq!(
            verdict(&info(0, 1000, 0, 110_000), true, t),
            Verdict::Nothing
        );
        assert_eq!(
            verdict(&info(0, 1000, 1, 110_000), true, t),
            Verdict::Nothing
        );
        assert_eq!(
            verdict(&info(0, 1000, 2, 29_000), true, t),
            Verdict::Nothing
        );
        // Two probes unanswered and silent for the timeout: dead.
        assert!(matches!(
            verdict(&info(0, 1000, 2, 31_000), true, t),
            Verdict::Dead(w) if w.contains("window probes")
        ));
        // The window opened (data in flight), or everything went: restore.
        assert_eq!(verdict(&info(3, 1000, 0, 0), true, t), Verdict::Restore);
        assert_eq!(verdict(&info(0, 0, 0, 0), true, t), Verdict::Restore);
    }

    #[test]
    fn the_guard_looks_four_times_per_timeout_within_bounds() {
        assert_eq!(guard_every(Duration::from_secs(30)), Duration::from_secs(1));
        assert_eq!(
            guard_every(Duration::from_secs(1)),
            Duration::from_millis(250)
        );
        assert_eq!(
            guard_every(Duration::from_millis(8)),
            Duration::from_millis(10)
        );
        assert_eq!(timeout_ms(Some(Duration::from_secs(30))), 30_000);
        assert_eq!(timeout_ms(None), 0);
    }
}
