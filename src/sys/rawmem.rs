//! Raw process memory for transports: the [`Lent`] capability that lets a fabric read and write a
//! range, and the copies between a socket and that memory for transports that emulate RDMA in
//! software (the TCP fabric), with the registration's bounds checked on every access.
//!
//! The contract is the one `ibv_reg_mr` has: whoever lends `[addr, addr+len)` (NCCL's `regMr`, through
//! the `unsafe` [`Lent::from_raw`]) guarantees that the memory stays allocated and writable until the
//! registration is released, and does not read a receive buffer before the transport reports the
//! receive complete; safe code lends only memory that is provably alive ([`HostBuffer::lend`],
//! [`Lent::from_static`]). The transport keeps the other half: it never touches memory outside a live
//! registration (every function here checks the range against the [`RawRegion`] first), keeps the
//! `Lent` with the registration, and stops using a region before deregistering it.
//!
//! Socket I/O goes straight into / out of registered memory (no intermediate copy), with the flags of
//! [`super::socket`].

use std::any::Any;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use super::socket::{RECV_FLAGS, send_flags};
use crate::error::{Error, Result};

/// The system's page size in bytes (`sysconf(_SC_PAGESIZE)`: 4 KiB on x86, 4 or 64 KiB on
/// AArch64 kernels), read once; 4096 if the system cannot say.
pub fn page_size() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf reads a constant of the running system; no pointer is passed.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(n)
            .ok()
            .filter(|p| p.is_power_of_two() && *p >= 4096)
            .unwrap_or(4096)
    })
}

/// A byte range `[addr, addr+len)` of some address space: the one range check every fabric uses
/// (registrations, control memory, memory handles). Pure arithmetic, nothing is dereferenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// First byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Span {
    /// `[addr, addr+len)`.
    pub const fn new(addr: u64, len: u64) -> Span {
        Span { addr, len }
    }

    /// Whether `[addr, addr+len)` lies inside this span. An empty range must still start inside or
    /// at the end; a range or span whose end does not fit in a `u64` contains nothing and is in none.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        match (self.addr.checked_add(self.len), addr.checked_add(len)) {
            (Some(end), Some(e)) => addr >= self.addr && e <= end,
            _ => false,
        }
    }
}

/// Memory lent to a transport: the capability to register `[addr, addr+len)` with a fabric, which
/// may then read and write it (the TCP fabric's I/O threads) or let a NIC do so, until the
/// registration is released. A value proves what a bare address cannot: that the range is memory
/// of this process that stays allocated and writable while any registration made from it lives.
///
/// Made only where that is known:
/// * [`Lent::from_raw`] (`unsafe`): an address someone vouches for, NCCL's `regMr` pointer in
///   `src/ffi` (host or GPU memory);
/// * [`Lent::from_static`]: leaked memory, alive for the rest of the process;
/// * [`HostBuffer::lend`]: an owned buffer the value keeps alive (a clone of it holds the
///   allocation, so dropping the buffer while registered frees nothing);
/// * [`Lent::simulated`]: an address of a software fabric that owns its memory (memfab, modelfab),
///   which lends nothing of the process: the fabrics that touch process memory refuse it.
///
/// A bare address does not make one in safe code:
///
/// ```compile_fail,E0133
/// let lent = switchless::sys::Lent::from_raw(8 as *mut u8, 8).unwrap();
/// ```
///
/// and nothing registers or copies through a bare address:
///
/// ```compile_fail,E0061
/// let r = switchless::sys::RawRegion::new(8, 8).unwrap();
/// ```
///
/// ```compile_fail,E0308
/// use switchless::transport::fabric::{Fabric, MemKind};
/// fn register(f: &mut dyn Fabric) {
///     let _ = f.register(8, MemKind::Host);
/// }
/// ```
#[derive(Clone)]
pub struct Lent {
    /// The first byte, with the provenance of the allocation (null for a simulated address): the
    /// copies of [`RawRegion`] derive their pointers from it, never from an integer.
    ptr: *mut u8,
    addr: u64,
    len: usize,
    space: Space,
}

// SAFETY: a `Lent` is a pointer, a range and an owner that is `Send + Sync`; the pointer is only
// dereferenced by `RawRegion`'s bounds-checked copies, under the `Lent` contract, which does not
// depend on the thread (NCCL's service thread registers, its progress thread and the TCP workers
// copy).
unsafe impl Send for Lent {}
// SAFETY: `&Lent` gives only the address and clones; see `Send`.
unsafe impl Sync for Lent {}

#[derive(Clone)]
enum Space {
    /// This process's memory; the owner (if any) keeps it allocated while a clone lives.
    Process {
        _owner: Option<Arc<dyn Any + Send + Sync>>,
    },
    /// An address in a software fabric's own address space.
    Simulated,
}

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lent")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("process", &self.is_process())
            .finish()
    }
}

impl Lent {
    /// Lends `[addr, addr+len)` of this process (host memory, or GPU memory a NIC reaches by
    /// peer memory / DMA-BUF). Checks that the range is not null (unless empty) and does not wrap.
    ///
    /// # Safety
    /// The contract of `ibv_reg_mr` (and NCCL's `regMr`): the range is memory of this process that
    /// stays allocated and writable until every registration made from this value or a clone of it
    /// is released. While registered it is accessed only as the transport's completion protocol
    /// allows: no Rust reference to those bytes, no read of a receive buffer before its receive
    /// completes, no write of a send buffer before its send completes. Host memory for
    /// [`crate::transport::fabric::MemKind::Host`] registrations: the TCP fabric copies through the
    /// CPU.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Result<Lent> {
        let addr = ptr as usize as u64;
        check_range(addr, len)?;
        Ok(Lent {
            ptr,
            addr,
            len,
            space: Space::Process { _owner: None },
        })
    }

    /// Lends leaked memory (e.g. `Box::leak`): alive and unaliased for the rest of the process.
    pub fn from_static(mem: &'static mut [u8]) -> Lent {
        // One pointer, taken once: a second `as_mut_ptr` would reborrow `mem` and invalidate the
        // first (Stacked Borrows).
        let ptr = mem.as_mut_ptr();
        Lent {
            ptr,
            addr: ptr as usize as u64,
            len: mem.len(),
            space: Space::Process { _owner: None },
        }
    }

    /// An address of a software fabric that owns its memory (memfab, modelfab and the bench's
    /// in-process fabrics): lends no process memory; `RawRegion` and the verbs fabric refuse it.
    pub fn simulated(addr: u64, len: usize) -> Lent {
        Lent {
            ptr: std::ptr::null_mut(),
            addr,
            len,
            space: Space::Simulated,
        }
    }

    /// `[off, off+len)` of this range (same owner): what a registration of part of a buffer needs.
    pub fn range(&self, off: usize, len: usize) -> Result<Lent> {
        let addr = u64::try_from(off)
            .ok()
            .and_then(|o| self.addr.checked_add(o))
            .filter(|&a| Span::new(self.addr, self.len as u64).contains(a, len as u64))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "range {off}+{len} bytes is outside the lent {} bytes at {:#x}",
                    self.len, self.addr
                ))
            })?;
        Ok(Lent {
            // In bounds of the same allocation (checked above); null stays null for simulated.
            ptr: if self.ptr.is_null() {
                self.ptr
            } else {
                self.ptr.wrapping_add(off)
            },
            addr,
            len,
            space: self.space.clone(),
        })
    }

    /// First byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this lends process memory (else a simulated fabric's address).
    pub fn is_process(&self) -> bool {
        matches!(self.space, Space::Process { .. })
    }

    /// Fails unless this lends process memory: what a fabric that touches it (`what`) checks.
    pub fn require_process(&self, what: &str) -> Result<()> {
        if self.is_process() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{what}: {:#x}+{} bytes is an address of a simulated fabric, not memory of this \
                 process; accepted: memory lent by NCCL's regMr or a host buffer",
                self.addr, self.len
            )))
        }
    }
}

/// Checks a process range: not null unless empty, no wrap, at most `isize::MAX` bytes.
fn check_range(addr: u64, len: usize) -> Result<()> {
    if len > 0 && addr == 0 {
        return Err(Error::InvalidArgument(format!(
            "registration of {len} bytes at address 0; a non-null address is required"
        )));
    }
    let end = addr.checked_add(len as u64);
    if end.is_none() || usize::try_from(addr).is_err() || len > isize::MAX as usize {
        return Err(Error::InvalidArgument(format!(
            "registration {addr:#x}+{len} bytes wraps the address space"
        )));
    }
    Ok(())
}

/// One registered range of process memory, holding the [`Lent`] it came from (so the memory stays
/// allocated while a copy holds the region). Cloning it does not copy the memory.
#[derive(Debug, Clone)]
pub struct RawRegion {
    mem: Lent,
}

impl RawRegion {
    /// The region of `mem`, which must lend process memory (see [`Lent::require_process`]).
    pub fn new(mem: &Lent) -> Result<RawRegion> {
        mem.require_process("a CPU-copied registration")?;
        Ok(RawRegion::of(mem.clone()))
    }

    fn of(mem: Lent) -> RawRegion {
        RawRegion { mem }
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.mem.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.mem.len == 0
    }

    /// Whether `[addr, addr+len)` lies inside the region (an empty range must still start inside or
    /// at its end).
    pub fn contains(&self, addr: u64, len: usize) -> bool {
        Span::new(self.mem.addr, self.mem.len as u64).contains(addr, len as u64)
    }

    fn check(&self, addr: u64, len: usize) -> io::Result<*mut u8> {
        if self.contains(addr, len) {
            // Offset from the lent pointer (keeping its provenance); `contains` bounds it.
            Ok(self.mem.ptr.wrapping_add((addr - self.mem.addr) as usize))
        } else {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range {addr:#x}+{len} bytes is outside the registration {:#x}+{} bytes",
                    self.mem.addr, self.mem.len
                ),
            ))
        }
    }

    /// Copies `out.len()` bytes from `addr` (inside the region) into `out`.
    pub fn read(&self, addr: u64, out: &mut [u8]) -> io::Result<()> {
        let p = self.check(addr, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: `check` proved [addr, addr+len) lies inside the registration, which the registration
        // contract keeps allocated; `out` is a distinct Rust-owned buffer, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(p.cast_const(), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` to `addr` (inside the region).
    pub fn write(&self, addr: u64, data: &[u8]) -> io::Result<()> {
        let p = self.check(addr, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `check` proved the destination lies inside the live, writable registration; `data` is
        // a Rust slice and cannot overlap memory the registration owner handed to the transport.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    /// Receives at most `len` bytes from `sock` into `addr` (inside the region) without blocking:
    /// `Ok(0)` is end of stream, `ErrorKind::WouldBlock` means no data now.
    pub fn recv_into(&self, sock: &impl AsRawFd, addr: u64, len: usize) -> io::Result<usize> {
        let p = self.check(addr, len)?;
        if len == 0 {
            return Ok(0);
        }
        // SAFETY: the destination range is inside the live registration (checked above) and the kernel
        // writes at most `len` bytes to it; the fd is borrowed from a live socket.
        let n = syscall!(recv(
            sock.as_raw_fd(),
            p.cast::<libc::c_void>(),
            len,
            RECV_FLAGS
        ))?;
        Ok(n as usize)
    }

    /// Sends at most `len` bytes at `addr` (inside the region) on `sock` without blocking; `more`
    /// adds `MSG_MORE` (more data of the same frame follows). `ErrorKind::WouldBlock` means the
    /// socket buffer is full.
    pub fn send_from(
        &self,
        sock: &impl AsRawFd,
        addr: u64,
        len: usize,
        more: bool,
    ) -> io::Result<usize> {
        let p = self.check(addr, len)?;
        if len == 0 {
            return Ok(0);
        }
        // SAFETY: the source range is inside the live registration (checked above); the kernel only
        // reads `len` bytes from it; the fd is borrowed from a live socket.
        let n = syscall!(send(
            sock.as_raw_fd(),
            p.cast_const().cast(),
            len,
            send_flags(more)
        ))?;
        Ok(n as usize)
    }
}

/// An owned, zeroed, page-aligned (4096 bytes) block of host memory that is accessed only through raw
/// copies, as NCCL's buffers are: for tests, examples and benchmarks, whose buffers are written by a
/// NIC or by a software fabric's I/O threads while the owner holds no Rust reference to its bytes.
/// [`HostBuffer::lend`] lends it to a fabric; the [`Lent`] keeps the allocation alive, so dropping
/// the buffer while it is registered frees nothing.
///
/// Writing needs the buffer mutably, so a buffer shared between threads is only read:
///
/// ```compile_fail
/// let b = switchless::sys::HostBuffer::new(8).unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| b.write(0, &[1]));
///     s.spawn(|| b.write(0, &[2]));
/// });
/// ```
#[derive(Debug)]
pub struct HostBuffer {
    block: Arc<Block>,
}

/// The allocation of a [`HostBuffer`], shared with the [`Lent`]s made from it.
#[derive(Debug)]
struct Block {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the block is plain memory owned by this value and freed once, by whichever thread drops
// the last reference; all access to its bytes goes through raw copies whose synchronisation is the
// transport's completion protocol (the same rule as for NCCL's own buffers).
unsafe impl Send for Block {}
// SAFETY: `&Block` gives only the address; the bytes are never reached through a Rust reference.
// Safe writes go through `&mut HostBuffer` (one writer), a fabric's through a registration under
// the `Lent` contract.
unsafe impl Sync for Block {}

const HOST_BUFFER_ALIGN: usize = 4096;

impl Drop for Block {
    fn drop(&mut self) {
        if let Ok(layout) = std::alloc::Layout::from_size_align(self.len.max(1), HOST_BUFFER_ALIGN)
        {
            // SAFETY: `ptr` came from `alloc_zeroed` with this same layout and is freed once.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

impl HostBuffer {
    /// Allocates `len` zeroed bytes (at least one byte is allocated, so the address is never null).
    pub fn new(len: usize) -> Result<HostBuffer> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), HOST_BUFFER_ALIGN)
            .map_err(|e| Error::InvalidArgument(format!("host buffer of {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(p).ok_or_else(|| {
            Error::System(format!("allocation of a {len}-byte host buffer failed"))
        })?;
        Ok(HostBuffer {
            block: Arc::new(Block { ptr, len }),
        })
    }

    /// Address of byte 0.
    pub fn addr(&self) -> u64 {
        self.block.ptr.as_ptr() as usize as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.block.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.block.len == 0
    }

    /// The whole buffer, lent to a transport: the value keeps the allocation alive. Bytes a fabric
    /// writes are read back with [`HostBuffer::read`] after the transfer completes.
    pub fn lend(&self) -> Lent {
        let owner: Arc<dyn Any + Send + Sync> = self.block.clone();
        Lent {
            ptr: self.block.ptr.as_ptr(),
            addr: self.addr(),
            len: self.len(),
            space: Space::Process {
                _owner: Some(owner),
            },
        }
    }

    /// `[off, off+len)` of the buffer, lent (see [`HostBuffer::lend`]).
    pub fn lend_range(&self, off: usize, len: usize) -> Result<Lent> {
        self.lend().range(off, len)
    }

    fn region(&self) -> RawRegion {
        RawRegion::of(self.lend())
    }

    /// Start address, for registration with a NIC.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.block.ptr.as_ptr()
    }

    /// Copies `len` bytes from offset `off` out, after an acquire fence so that bytes a NIC or a helper
    /// thread wrote before a completion this thread observed are seen.
    pub fn read(&self, off: usize, len: usize) -> Result<Vec<u8>> {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let mut v = vec![0u8; len];
        self.region()
            .read(self.at(off, len)?, &mut v)
            .map_err(|e| Error::InvalidArgument(format!("host buffer read: {e}")))?;
        Ok(v)
    }

    /// Copies `data` in at offset `off`. Takes `&mut self`: the buffer is `Sync`, and a write through a
    /// shared reference would let two threads write the same bytes at once.
    pub fn write(&mut self, off: usize, data: &[u8]) -> Result<()> {
        self.region()
            .write(self.at(off, data.len())?, data)
            .map_err(|e| Error::InvalidArgument(format!("host buffer write: {e}")))
    }

    /// The address of offset `off`, for an access of `len` bytes; an offset past the address space is
    /// an error (the region then checks the range against the buffer).
    fn at(&self, off: usize, len: usize) -> Result<u64> {
        u64::try_from(off)
            .ok()
            .and_then(|o| self.addr().checked_add(o))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "range {off}+{len} bytes is outside the {}-byte host buffer",
                    self.len()
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::socket::{Ready, recv_slice, wait_fd};
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn host_buffer_is_page_aligned_zeroed_and_bounded() {
        let mut b = HostBuffer::new(10_000).unwrap();
        assert_eq!(b.addr() % 4096, 0);
        assert_eq!(b.as_mut_ptr() as usize as u64, b.addr());
        assert_eq!(b.len(), 10_000);
        assert_eq!(b.read(9_996, 4).unwrap(), [0; 4]);
        b.write(9_996, &[1, 2, 3, 4]).unwrap();
        assert_eq!(b.read(9_996, 4).unwrap(), [1, 2, 3, 4]);
        assert!(b.write(9_997, &[0; 4]).is_err());
        assert!(
            b.read(usize::MAX, 4).is_err(),
            "offset past the address space"
        );
        assert!(b.write(usize::MAX - 1, &[0; 4]).is_err());
        // A zero-length buffer still has an address (one byte is allocated) and no readable bytes.
        let z = HostBuffer::new(0).unwrap();
        assert!(z.is_empty() && z.addr() != 0);
        assert!(z.read(0, 1).is_err());
        assert_eq!(z.read(0, 0).unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn a_lent_buffer_outlives_its_owner() {
        let mut b = HostBuffer::new(16).unwrap();
        b.write(0, &[9; 16]).unwrap();
        let whole = b.lend();
        let part = whole.range(4, 8).unwrap();
        assert_eq!((part.addr(), part.len()), (b.addr() + 4, 8));
        assert!(whole.range(9, 8).is_err() && whole.range(16, 0).is_ok());
        drop(b);
        // The lent range still holds the allocation: copies through it touch live memory.
        let r = RawRegion::new(&part).unwrap();
        r.write(part.addr(), &[1, 2]).unwrap();
        let mut out = [0u8; 4];
        r.read(part.addr(), &mut out).unwrap();
        assert_eq!(out, [1, 2, 9, 9]);
        assert!(
            r.read(part.addr() + 6, &mut out).is_err(),
            "bounded by the part"
        );
        drop(whole);
        drop(r);
        // Kept reachable from a static (Miri's leak check): leaked memory stays lent for good.
        static LEAKED: std::sync::OnceLock<Lent> = std::sync::OnceLock::new();
        let leaked =
            LEAKED.get_or_init(|| Lent::from_static(Box::leak(vec![0u8; 4].into_boxed_slice())));
        assert!(leaked.is_process() && leaked.len() == 4);
        RawRegion::new(leaked)
            .unwrap()
            .write(leaked.addr() + 3, &[1])
            .unwrap();
    }

    #[test]
    fn a_span_contains_ranges_inside_it_with_checked_ends() {
        let s = Span { addr: 100, len: 16 };
        assert!(s.contains(100, 16) && s.contains(108, 8) && s.contains(116, 0));
        assert!(!s.contains(99, 1) && !s.contains(101, 16) && !s.contains(117, 0));
        assert!(!s.contains(u64::MAX, 2), "a wrapping range");
        let top = Span {
            addr: u64::MAX - 4,
            len: 8,
        };
        assert!(!top.contains(u64::MAX - 4, 1), "a span whose end wraps");
        let empty = Span { addr: 0, len: 0 };
        assert!(empty.contains(0, 0) && !empty.contains(0, 1));
    }

    #[test]
    fn bounds_are_checked_on_every_access() {
        let b = HostBuffer::new(64).unwrap();
        let r = RawRegion::new(&b.lend_range(8, 16).unwrap()).unwrap();
        assert!(r.contains(b.addr() + 8, 16));
        assert!(r.contains(b.addr() + 24, 0));
        assert!(!r.contains(b.addr() + 7, 2));
        assert!(!r.contains(b.addr() + 9, 16));
        assert!(!r.contains(u64::MAX - 1, 4));
        r.write(b.addr() + 10, &[1, 2, 3]).unwrap();
        assert!(r.write(b.addr() + 22, &[0; 3]).is_err());
        let mut out = [0u8; 3];
        r.read(b.addr() + 10, &mut out).unwrap();
        assert_eq!(out, [1, 2, 3]);
        assert!(r.read(b.addr(), &mut out).is_err());
        assert_eq!(b.read(10, 3).unwrap(), vec![1, 2, 3]);
        assert!(b.read(62, 3).is_err());
        assert!(b.lend_range(60, 5).is_err() && b.lend_range(usize::MAX, 1).is_err());
        assert!(RawRegion::new(&Lent::simulated(b.addr(), 8)).is_err());
        // SAFETY: nothing is registered from these; the constructor only checks the range.
        unsafe {
            assert!(Lent::from_raw(std::ptr::null_mut(), 4).is_err());
            let top = std::ptr::without_provenance_mut(usize::MAX);
            assert!(Lent::from_raw(top, 2).is_err());
            assert!(Lent::from_raw(std::ptr::null_mut(), 0).is_ok());
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "opens a TCP socket; Miri isolates the host")]
    fn socket_copies_go_straight_to_registered_memory() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        a.write_all(b"hello world").unwrap();
        let buf = HostBuffer::new(32).unwrap();
        let r = RawRegion::new(&buf.lend()).unwrap();
        assert!(r.recv_into(&b, buf.addr() + 30, 11).is_err());
        let mut got = 0;
        while got < 11 {
            assert!(wait_fd(&b, Ready::Read, 1000).unwrap());
            got += r.recv_into(&b, buf.addr() + got as u64, 11 - got).unwrap();
        }
        assert_eq!(buf.read(0, 11).unwrap(), b"hello world");
        // Back the other way from registered memory.
        assert!(wait_fd(&b, Ready::Write, 1000).unwrap());
        assert_eq!(r.send_from(&b, buf.addr(), 5, false).unwrap(), 5);
        let mut out = [0u8; 5];
        let mut n = 0;
        while n < 5 {
            assert!(wait_fd(&a, Ready::Read, 1000).unwrap());
            n += recv_slice(&a, &mut out[n..]).unwrap();
        }
        assert_eq!(&out, b"hello");
        // Nothing more: would block, and the wait times out.
        assert_eq!(
            recv_slice(&a, &mut out).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        assert!(!wait_fd(&a, Ready::Read, 10).unwrap());
        drop(b);
        assert!(wait_fd(&a, Ready::Read, 1000).unwrap());
        assert_eq!(recv_slice(&a, &mut out).unwrap(), 0);
    }
}
