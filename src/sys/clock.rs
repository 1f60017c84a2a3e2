//! This thread's CPU time, for the bench's CPU-per-byte figures.

/// This thread's CPU time in ns (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`), if the clock exists.
/// Not `/proc/thread-self/schedstat`: its run time moves only at scheduler events (a tick, a
/// switch), so a short measurement on a tickless kernel read no CPU at all (a CI host: 0 s for a
/// 1.7 ms run); this clock adds the running slice.
pub fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant libc defines.
    syscall!(clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts)).ok()?;
    let s = u64::try_from(ts.tv_sec).ok()?;
    let ns = u64::try_from(ts.tv_nsec).ok()?;
    s.checked_mul(1_000_000_000)?.checked_add(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        miri,
        ignore = "a thread's CPU clock is host state Miri does not model"
    )]
    fn the_thread_clock_counts_this_threads_work() {
        let a = thread_cpu_ns().expect("CLOCK_THREAD_CPUTIME_ID");
        let mut x = 0u64;
        while thread_cpu_ns().unwrap() < a + 5_000_000 {
            x = std::hint::black_box(x.wrapping_add(1)); // 5 ms of CPU, however long it takes
        }
        assert!(x > 0);
        // Another thread's work is not counted: a sleeping thread's clock barely moves.
        let b = thread_cpu_ns().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(thread_cpu_ns().unwrap() - b < 20_000_000);
    }
}
