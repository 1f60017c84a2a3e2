//! `switchless bench latency --breakdown`: where a rank's time goes inside the ping-pong loop. Over
//! the timed round trips it counts the plugin calls (`irecv`, `isend`, `test`) and the idle calls
//! between them (the bench's yield and deadline check) with the wall time spent in each, the cost
//! of one clock read, and the thread's scheduler figures (`/proc/thread-self`: CPU time, time
//! waiting for a CPU, context switches, user and system time). Off by default: then no call is
//! timed and nothing is read.
#![forbid(unsafe_code)]

use std::time::Instant;

/// What is timed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call {
    Irecv,
    Isend,
    Test,
    Idle,
}

/// The raw sums of one rank over the timed round trips (per round trip: divide by `round_trips`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Breakdown {
    pub round_trips: u64,
    /// Wall time of the timed round trips, us.
    pub loop_us: f64,
    pub irecv_calls: u64,
    pub irecv_us: f64,
    pub isend_calls: u64,
    pub isend_us: f64,
    pub test_calls: u64,
    pub test_us: f64,
    /// The bench's idle calls between polling passes (wall clock: `sched_yield`).
    pub idle_calls: u64,
    pub idle_us: f64,
    /// One `Instant::now()`, ns (the median of 9 batches of 200): every timed call costs two.
    pub clock_read_ns: f64,
    /// The thread's CPU time over the timed round trips (`CLOCK_THREAD_CPUTIME_ID`), us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_us: Option<f64>,
    /// Time the thread was runnable but waiting for a CPU (schedstat), us.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runqueue_us: Option<f64>,
    /// User and system CPU time (`stat`, 10 ms ticks), ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_ms: Option<f64>,
    /// Voluntary and involuntary context switches (`status`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub voluntary_switches: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub involuntary_switches: Option<u64>,
}

/// The thread's scheduler figures at one moment (each `None` where `/proc` does not say).
#[derive(Debug, Clone, Copy, Default)]
struct Sched {
    cpu_ns: Option<u64>,
    wait_ns: Option<u64>,
    utime: Option<u64>,
    stime: Option<u64>,
    vol: Option<u64>,
    invol: Option<u64>,
}

impl Sched {
    fn now() -> Sched {
        let mut s = Sched::default();
        if let Ok(t) = std::fs::read_to_string("/proc/thread-self/schedstat") {
            let mut f = t.split_whitespace().map(|x| x.parse::<u64>().ok());
            f.next(); // its run time reads 0 on some kernels: the thread clock below instead
            s.wait_ns = f.next().flatten();
        }
        s.cpu_ns = crate::sys::clock::thread_cpu_ns();
        if let Ok(t) = std::fs::read_to_string("/proc/thread-self/stat") {
            // Fields after the command name, which ends at the last ')': state is field 3, utime 14.
            if let Some((_, rest)) = t.rsplit_once(')') {
                let f: Vec<&str> = rest.split_whitespace().collect();
                s.utime = f.get(11).and_then(|x| x.parse().ok());
                s.stime = f.get(12).and_then(|x| x.parse().ok());
            }
        }
        if let Ok(t) = std::fs::read_to_string("/proc/thread-self/status") {
            for line in t.lines() {
                let val = |p: &str| line.strip_prefix(p).and_then(|v| v.trim().parse().ok());
                if let Some(v) = val("voluntary_ctxt_switches:") {
                    s.vol = Some(v);
                }
                if let Some(v) = val("nonvoluntary_ctxt_switches:") {
                    s.invol = Some(v);
                }
            }
        }
        s
    }
}

fn delta(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    b?.checked_sub(a?)
}

/// The cost of one clock read, ns: the median of 9 batches of 200 reads.
fn clock_read_ns() -> f64 {
    let mut v: Vec<f64> = (0..9)
        .map(|_| {
            let t0 = Instant::now();
            let mut last = t0;
            for _ in 0..200 {
                last = std::hint::black_box(Instant::now());
            }
            last.saturating_duration_since(t0).as_secs_f64() * 1e9 / 200.0
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[4]
}

/// The recorder a latency run carries: `None` inside when off (then every method is a no-op).
pub(crate) struct Recorder {
    on: Option<Active>,
}

struct Active {
    b: Breakdown,
    /// Counting: only between [`Recorder::start`] and [`Recorder::finish`].
    counting: bool,
    t0: Option<Instant>,
    s0: Sched,
}

impl Recorder {
    pub(crate) fn new(enabled: bool) -> Recorder {
        Recorder {
            on: enabled.then(|| Active {
                b: Breakdown {
                    clock_read_ns: clock_read_ns(),
                    ..Breakdown::default()
                },
                counting: false,
                t0: None,
                s0: Sched::default(),
            }),
        }
    }

    /// Starts counting (at the first timed round trip).
    pub(crate) fn start(&mut self) {
        if let Some(a) = &mut self.on {
            if a.t0.is_none() {
                a.s0 = Sched::now();
                a.t0 = Some(Instant::now());
                a.counting = true;
            }
        }
    }

    /// Runs `f`, timing it as `call` while counting.
    pub(crate) fn time<T>(&mut self, call: Call, f: impl FnOnce() -> T) -> T {
        let Some(a) = self.on.as_mut().filter(|a| a.counting) else {
            return f();
        };
        let t = Instant::now();
        let r = f();
        let us = t.elapsed().as_secs_f64() * 1e6;
        let b = &mut a.b;
        let (n, sum) = match call {
            Call::Irecv => (&mut b.irecv_calls, &mut b.irecv_us),
            Call::Isend => (&mut b.isend_calls, &mut b.isend_us),
            Call::Test => (&mut b.test_calls, &mut b.test_us),
            Call::Idle => (&mut b.idle_calls, &mut b.idle_us),
        };
        *n += 1;
        *sum += us;
        r
    }

    /// One timed round trip done.
    pub(crate) fn round_trip(&mut self) {
        if let Some(a) = self.on.as_mut().filter(|a| a.counting) {
            a.b.round_trips += 1;
        }
    }

    /// Stops counting; the figures (none when off or never started).
    pub(crate) fn finish(self) -> Option<Breakdown> {
        let a = self.on?;
        let t0 = a.t0?;
        let mut b = a.b;
        b.loop_us = t0.elapsed().as_secs_f64() * 1e6;
        let s1 = Sched::now();
        let us = |d: Option<u64>| d.map(|x| x as f64 / 1e3);
        let ms_ticks = |d: Option<u64>| d.map(|x| x as f64 * 10.0);
        b.cpu_us = us(delta(a.s0.cpu_ns, s1.cpu_ns));
        b.runqueue_us = us(delta(a.s0.wait_ns, s1.wait_ns));
        b.user_ms = ms_ticks(delta(a.s0.utime, s1.utime));
        b.system_ms = ms_ticks(delta(a.s0.stime, s1.stime));
        b.voluntary_switches = delta(a.s0.vol, s1.vol);
        b.involuntary_switches = delta(a.s0.invol, s1.invol);
        Some(b)
    }
}

impl Breakdown {
    /// One line per rank for the text report: per round trip, calls and us in each, and the rest.
    pub fn line(&self, rank: usize, size: usize) -> String {
        let n = self.round_trips.max(1) as f64;
        let calls = self.irecv_us + self.isend_us + self.test_us + self.idle_us;
        let per_test = if self.test_calls > 0 {
            self.test_us / self.test_calls as f64
        } else {
            0.0
        };
        let mut s = format!(
            "# breakdown at {size} B (rank {rank}, per round trip of {n:.0}): {:.2} us; irecv {:.2}x {:.2} us, isend {:.2}x {:.2} us, test {:.2}x {:.2} us ({per_test:.2} us each), idle {:.2}x {:.2} us, rest {:.2} us; clock read {:.0} ns",
            self.loop_us / n,
            self.irecv_calls as f64 / n,
            self.irecv_us / n,
            self.isend_calls as f64 / n,
            self.isend_us / n,
            self.test_calls as f64 / n,
            self.test_us / n,
            self.idle_calls as f64 / n,
            self.idle_us / n,
            (self.loop_us - calls).max(0.0) / n,
            self.clock_read_ns,
        );
        if let (Some(c), Some(w)) = (self.cpu_us, self.runqueue_us) {
            s.push_str(&format!(
                "; on CPU {:.2} us, waiting for a CPU {:.2} us",
                c / n,
                w / n
            ));
        }
        if let (Some(u), Some(k)) = (self.user_ms, self.system_ms) {
            s.push_str(&format!("; user {u:.0} ms, system {k:.0} ms in all"));
        }
        if let (Some(v), Some(i)) = (self.voluntary_switches, self.involuntary_switches) {
            s.push_str(&format!(
                "; switches {:.2} voluntary, {:.2} involuntary",
                v as f64 / n,
                i as f64 / n
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_records_nothing_and_on_counts_only_after_start() {
        let mut off = Recorder::new(false);
        off.start();
        assert_eq!(off.time(Call::Test, || 7), 7);
        off.round_trip();
        assert!(off.finish().is_none());

        let mut on = Recorder::new(true);
        on.time(Call::Test, || ()); // before start: warm-up, not counted
        on.start();
        on.time(Call::Test, || ());
        on.time(Call::Test, || ());
        on.time(Call::Isend, || ());
        on.round_trip();
        let b = on.finish().expect("figures");
        assert_eq!((b.round_trips, b.test_calls, b.isend_calls), (1, 2, 1));
        assert_eq!((b.irecv_calls, b.idle_calls), (0, 0));
        assert!(b.loop_us >= b.test_us + b.isend_us);
        assert!(b.line(0, 8).contains("test 2.00x"), "{}", b.line(0, 8));
    }
}
