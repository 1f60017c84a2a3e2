//! Two-node smoke test of the `verbs` layer on real (soft-RoCE) devices, for the rxe VM lab.
//!
//! Run in every VM by the lab with `/tmp/lab.env` in the environment (`LAB_NODE`, `LAB_NLINKS`,
//! `LAB_LINK_<i>="lid ifname rxe_dev local_ip peer_ip peer_node role gid_index"`). For each cable,
//! in its own thread, both ends:
//!
//! 1. open the rxe device, check port 1 is ACTIVE, find the RoCE v2 GID of the local address in the
//!    GID table and check it against the lab's index;
//! 2. create PD, CQ, RC QP and a 1 MiB + 4 KiB registered buffer;
//! 3. exchange QPN, GID, MTU, buffer address and rkey over TCP on the cable's addresses
//!    (port 19000 + cable id; role `s` listens, `c` connects);
//! 4. INIT → RTR → RTS with the path MTU = min of both active MTUs.
//!
//! Then the client RDMA-writes 1 MiB with immediate, then 32 bytes inline with immediate; the
//! server checks both receive completions (immediates in order, byte counts), the 1 MiB pattern
//! and the inline bytes, then RDMA-reads 64 KiB back from the client and checks it. Every wait has a
//! deadline. Exit status 0 only if every cable passed.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchless::error::Error;
use switchless::sys::HostBuffer;
use switchless::verbs::{
    Access, Completion, CompletionQueue, Context, GidType, MemoryRegion, Mtu, PortState,
    ProtectionDomain, QpCaps, QueuePair, RemoteAddr, RtrParams, RtsParams, SendFlags, Sge,
    WcOpcode, WcStatus, gid_type_from_sysfs,
};

type R<T> = Result<T, String>;

const PAYLOAD: usize = 1 << 20;
const INLINE_LEN: usize = 32;
const READ_LEN: usize = 64 << 10;
const BUF_LEN: usize = PAYLOAD + 4096;
const DEADLINE: Duration = Duration::from_secs(45);
const PORT: u8 = 1;

struct Link {
    lid: u32,
    dev: String,
    local: Ipv4Addr,
    peer: Ipv4Addr,
    server: bool,
    lab_gid_index: Option<u32>,
}

fn parse_link(s: &str) -> R<Link> {
    let f: Vec<&str> = s.split_whitespace().collect();
    if f.len() < 7 {
        return Err(format!("LAB_LINK {s:?}: expected 8 fields"));
    }
    let ip = |t: &str| t.parse::<Ipv4Addr>().map_err(|e| format!("{t:?}: {e}"));
    Ok(Link {
        lid: f[0].parse().map_err(|e| format!("lid {:?}: {e}", f[0]))?,
        dev: f[2].to_string(),
        local: ip(f[3])?,
        peer: ip(f[4])?,
        server: f[6] == "s",
        lab_gid_index: f.get(7).and_then(|t| t.parse().ok()),
    })
}

/// Pattern byte `i` of cable `lid`.
fn pattern(lid: u32, i: usize) -> u8 {
    (i.wrapping_mul(31) as u8) ^ (lid as u8).wrapping_mul(77) ^ ((i >> 11) as u8)
}

/// What each end tells the other (little-endian, 48 bytes).
#[derive(Debug, Clone, Copy)]
struct Hello {
    qpn: u32,
    psn: u32,
    gid: [u8; 16],
    addr: u64,
    rkey: u32,
    mtu: u32,
}

impl Hello {
    fn encode(&self) -> [u8; 48] {
        let mut b = [0u8; 48];
        b[0..4].copy_from_slice(&self.qpn.to_le_bytes());
        b[4..8].copy_from_slice(&self.psn.to_le_bytes());
        b[8..24].copy_from_slice(&self.gid);
        b[24..32].copy_from_slice(&self.addr.to_le_bytes());
        b[32..36].copy_from_slice(&self.rkey.to_le_bytes());
        b[36..40].copy_from_slice(&self.mtu.to_le_bytes());
        b[40..48].copy_from_slice(b"SLSMOKE1");
        b
    }

    fn decode(b: &[u8; 48]) -> R<Hello> {
        if &b[40..48] != b"SLSMOKE1" {
            return Err("bad hello magic".into());
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..24]);
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[24..32]);
        Ok(Hello {
            qpn: u32_at(0),
            psn: u32_at(4),
            gid,
            addr: u64::from_le_bytes(a),
            rkey: u32_at(32),
            mtu: u32_at(36),
        })
    }
}

fn tcp_pair(link: &Link, start: Instant) -> R<TcpStream> {
    let port = 19000 + link.lid as u16;
    let s = if link.server {
        let l = TcpListener::bind(SocketAddrV4::new(link.local, port))
            .map_err(|e| format!("bind {}:{port}: {e}", link.local))?;
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if start.elapsed() > DEADLINE {
                        return Err(format!(
                            "no client on {}:{port} within {DEADLINE:?}",
                            link.local
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(format!("accept: {e}")),
            }
        }
    } else {
        loop {
            match TcpStream::connect_timeout(
                &SocketAddrV4::new(link.peer, port).into(),
                Duration::from_secs(2),
            ) {
                Ok(s) => break s,
                Err(e) => {
                    if start.elapsed() > DEADLINE {
                        return Err(format!("connect {}:{port}: {e}", link.peer));
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    };
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(DEADLINE))
        .map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    Ok(s)
}

fn wait_for(cq: &CompletionQueue, n: usize, start: Instant, what: &str) -> R<Vec<Completion>> {
    let mut out = Vec::new();
    while out.len() < n {
        let want = n - out.len();
        cq.poll(&mut out, want).map_err(|e| e.to_string())?;
        if start.elapsed() > DEADLINE {
            return Err(format!(
                "{what}: {} of {n} completions within {DEADLINE:?}",
                out.len()
            ));
        }
        if out.len() < n {
            std::thread::yield_now();
        }
    }
    for c in &out {
        c.ok().map_err(|e| format!("{what}: {e}"))?;
    }
    Ok(out)
}

/// The next completion, whatever its status.
fn wait_any(cq: &CompletionQueue, start: Instant, what: &str) -> R<Completion> {
    let mut out = Vec::new();
    while out.is_empty() {
        cq.poll(&mut out, 1).map_err(|e| e.to_string())?;
        if start.elapsed() > DEADLINE {
            return Err(format!("{what}: no completion within {DEADLINE:?}"));
        }
        std::thread::yield_now();
    }
    Ok(out[0])
}

fn byte(s: &mut TcpStream, b: u8) -> R<()> {
    s.write_all(&[b]).map_err(|e| format!("tcp write: {e}"))
}

fn expect_byte(s: &mut TcpStream, want: u8) -> R<()> {
    let mut b = [0u8; 1];
    s.read_exact(&mut b).map_err(|e| format!("tcp read: {e}"))?;
    if b[0] != want {
        return Err(format!(
            "peer sent {:#x}, expected {want:#x} (peer failed?)",
            b[0]
        ));
    }
    Ok(())
}

fn run_link(link: &Link) -> R<String> {
    let start = Instant::now();
    let ctx = Context::open(&link.dev).map_err(|e| e.to_string())?;
    let port = ctx.query_port(PORT).map_err(|e| e.to_string())?;
    if port.state != PortState::Active {
        return Err(format!("{} port {PORT} is {:?}", link.dev, port.state));
    }
    let mtu = port.active_mtu.ok_or("no active MTU")?;
    let t_gid = Instant::now();
    let gid_index = ctx
        .find_roce_v2_gid(PORT, link.local)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no RoCE v2 GID for {} on {}", link.local, link.dev))?;
    let gid_ms = t_gid.elapsed().as_millis();
    if let Some(lab) = link.lab_gid_index {
        if lab != gid_index {
            return Err(format!(
                "GID index {gid_index} differs from the lab's {lab}"
            ));
        }
    }
    let gid = ctx.query_gid(PORT, gid_index).map_err(|e| e.to_string())?;
    // The GID type through _ibv_query_gid_ex and through the sysfs fallback must agree.
    let ty_lib = ctx.gid_type(PORT, gid_index).map_err(|e| e.to_string())?;
    let ty_sysfs = gid_type_from_sysfs(
        Path::new("/sys"),
        &link.dev,
        PORT,
        gid_index,
        port.link_layer,
    )
    .map_err(|e| e.to_string())?;
    if ty_lib != GidType::RoceV2 || ty_sysfs != GidType::RoceV2 {
        return Err(format!(
            "GID type {ty_lib:?} (library) / {ty_sysfs:?} (sysfs), expected RoceV2"
        ));
    }
    // The plugin's discovery reads the whole table in one _ibv_query_gid_table call: it must list
    // what the per-index scan (ibv_query_gid + _ibv_query_gid_ex per slot) finds on this port.
    let t_table = Instant::now();
    let table = ctx
        .query_gid_table()
        .ok_or("libibverbs has no _ibv_query_gid_table")?
        .map_err(|e| e.to_string())?;
    let table_us = t_table.elapsed().as_micros();
    let on_port = table.get(&PORT).map(Vec::as_slice).unwrap_or(&[]);
    let one: Vec<(u32, [u8; 16], Option<GidType>)> = on_port
        .iter()
        .map(|e| (e.index, e.gid, GidType::from_ibv(e.gid_type)))
        .collect();
    let scan: Vec<(u32, [u8; 16], Option<GidType>)> = ctx
        .gid_table(PORT)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|e| (e.index, e.gid.0, e.gid_type))
        .collect();
    if one != scan {
        return Err(format!(
            "_ibv_query_gid_table lists {one:?}, the per-index scan {scan:?}"
        ));
    }
    if !on_port
        .iter()
        .any(|e| e.index == gid_index && e.ndev.is_some())
    {
        return Err(format!(
            "_ibv_query_gid_table names no netdev for GID {gid_index}"
        ));
    }
    let pd = ProtectionDomain::new(&ctx).map_err(|e| e.to_string())?;
    let cq = CompletionQueue::new(&ctx, 64).map_err(|e| e.to_string())?;
    let qp = QueuePair::new_rc(&pd, &cq, &cq, QpCaps::default()).map_err(|e| e.to_string())?;
    let mut buf = HostBuffer::new(BUF_LEN).map_err(|e| e.to_string())?;
    if !link.server {
        let data: Vec<u8> = (0..PAYLOAD).map(|i| pattern(link.lid, i)).collect();
        buf.write(0, &data).map_err(|e| e.to_string())?;
    }
    // SAFETY: `buf` outlives `mr` (declared before it, so dropped after it) and stays allocated.
    let mr = unsafe { MemoryRegion::register(&pd, buf.as_mut_ptr(), BUF_LEN, Access::RDMA) }
        .map_err(|e| e.to_string())?;
    let psn = 0x1000 + link.lid;
    let me = Hello {
        qpn: qp.qp_num(),
        psn,
        gid: gid.0,
        addr: mr.addr(),
        rkey: mr.rkey(),
        mtu: mtu.bytes(),
    };

    let mut s = tcp_pair(link, start)?;
    s.write_all(&me.encode())
        .map_err(|e| format!("tcp write: {e}"))?;
    let mut hb = [0u8; 48];
    s.read_exact(&mut hb)
        .map_err(|e| format!("tcp read: {e}"))?;
    let peer = Hello::decode(&hb)?;
    let path_mtu = mtu.min(Mtu::from_bytes(peer.mtu).ok_or("peer MTU")?);

    qp.to_init(
        PORT,
        Access::REMOTE_WRITE | Access::REMOTE_READ | Access::LOCAL_WRITE,
    )
    .map_err(|e| e.to_string())?;
    let rtr = RtrParams {
        remote_psn: peer.psn,
        ..RtrParams::new(peer.qpn, peer.gid, gid_index as u8, path_mtu)
    };
    qp.to_rtr(&rtr).map_err(|e| e.to_string())?;
    qp.to_rts(&RtsParams {
        psn,
        ..RtsParams::default()
    })
    .map_err(|e| e.to_string())?;
    let remote = RemoteAddr {
        addr: peer.addr,
        rkey: peer.rkey,
    };
    let imm_a = 0xC0DE_0000 | link.lid;
    let imm_b = 0xB0B0_0000 | link.lid;
    let inline: Vec<u8> = (0..INLINE_LEN as u8).map(|i| i ^ 0x5a).collect();

    let summary = if link.server {
        qp.post_recv(1, &[]).map_err(|e| e.to_string())?;
        qp.post_recv(2, &[]).map_err(|e| e.to_string())?;
        byte(&mut s, 0xA1)?; // receives posted
        let t = Instant::now();
        let got = wait_for(&cq, 2, start, "receives")?;
        let (a, b) = (got[0], got[1]);
        if a.opcode != WcOpcode::RecvRdmaWithImm
            || a.imm_data != Some(imm_a)
            || a.byte_len as usize != PAYLOAD
        {
            return Err(format!(
                "first receive {a:?}, expected imm {imm_a:#x} with {PAYLOAD} bytes"
            ));
        }
        if b.imm_data != Some(imm_b) || b.byte_len as usize != INLINE_LEN {
            return Err(format!(
                "second receive {b:?}, expected imm {imm_b:#x} with {INLINE_LEN} bytes"
            ));
        }
        let recv_us = t.elapsed().as_micros();
        let got = buf.read(0, PAYLOAD).map_err(|e| e.to_string())?;
        if let Some(i) = (0..PAYLOAD).find(|&i| got[i] != pattern(link.lid, i)) {
            return Err(format!(
                "payload differs at byte {i}: {:#x} != {:#x}",
                got[i],
                pattern(link.lid, i)
            ));
        }
        let il = buf.read(PAYLOAD, INLINE_LEN).map_err(|e| e.to_string())?;
        if il != inline {
            return Err(format!("inline bytes differ: {il:?}"));
        }
        // RDMA read 64 KiB of the client's buffer into a zeroed part of ours.
        let zero = vec![0u8; READ_LEN];
        buf.write(0, &zero).map_err(|e| e.to_string())?;
        let sge = Sge {
            addr: mr.addr(),
            length: READ_LEN as u32,
            lkey: mr.lkey(),
        };
        let t = Instant::now();
        qp.post_rdma_read(3, &[sge], remote, SendFlags::SIGNALED)
            .map_err(|e| e.to_string())?;
        let c = wait_for(&cq, 1, start, "RDMA read")?;
        if c[0].opcode != WcOpcode::RdmaRead || c[0].wr_id != 3 {
            return Err(format!("read completion {:?}", c[0]));
        }
        let read_us = t.elapsed().as_micros();
        let back = buf.read(0, READ_LEN).map_err(|e| e.to_string())?;
        if let Some(i) = (0..READ_LEN).find(|&i| back[i] != pattern(link.lid, i)) {
            return Err(format!("RDMA read data differs at byte {i}"));
        }
        byte(&mut s, 0xD0)?; // done, all good
        // Keep our QP alive while the client checks error completions against it.
        expect_byte(&mut s, 0xE0)?;
        format!(
            "server: 1 MiB write-with-imm + 32 B inline received and verified ({recv_us} us after posting), \
             64 KiB RDMA read verified in {read_us} us"
        )
    } else {
        expect_byte(&mut s, 0xA1)?;
        let sge = Sge {
            addr: mr.addr(),
            length: PAYLOAD as u32,
            lkey: mr.lkey(),
        };
        let t = Instant::now();
        qp.post_rdma_write(10, &[sge], remote, Some(imm_a), SendFlags::SIGNALED)
            .map_err(|e| e.to_string())?;
        let c = wait_for(&cq, 1, start, "RDMA write")?;
        let us = t.elapsed().as_micros().max(1);
        if c[0].opcode != WcOpcode::RdmaWrite || c[0].wr_id != 10 {
            return Err(format!("write completion {:?}", c[0]));
        }
        let inline_remote = RemoteAddr {
            addr: peer.addr + PAYLOAD as u64,
            rkey: peer.rkey,
        };
        qp.post_rdma_write_inline(11, &inline, inline_remote, Some(imm_b), SendFlags::SIGNALED)
            .map_err(|e| e.to_string())?;
        wait_for(&cq, 1, start, "inline RDMA write")?;
        expect_byte(&mut s, 0xD0)?;
        // Error paths on real hardware: a bad rkey gives a remote access error (mapped to
        // Error::Remote), and the next request is flushed because the QP is now in error.
        let bad = RemoteAddr {
            addr: peer.addr,
            rkey: peer.rkey ^ 0x5a5a_0000,
        };
        qp.post_rdma_write(12, &[sge], bad, None, SendFlags::SIGNALED)
            .map_err(|e| e.to_string())?;
        let c = wait_any(&cq, start, "bad-rkey write")?;
        if c.status != WcStatus::REM_ACCESS_ERR || !matches!(c.ok(), Err(Error::Remote(_))) {
            return Err(format!(
                "bad-rkey write completed with {c:?}, expected a remote access error"
            ));
        }
        let bad_text = c.ok().err().map(|e| e.to_string()).unwrap_or_default();
        qp.post_rdma_write(13, &[sge], remote, None, SendFlags::SIGNALED)
            .map_err(|e| e.to_string())?;
        let f = wait_any(&cq, start, "write after error")?;
        if f.status != WcStatus::WR_FLUSH_ERR || f.wr_id != 13 {
            return Err(format!(
                "write after error completed with {f:?}, expected a flush"
            ));
        }
        byte(&mut s, 0xE0)?;
        println!("SMOKE cable {} error path ok: {bad_text}", link.lid);
        format!(
            "client: 1 MiB RDMA write with imm completed in {us} us ({:.3} Gb/s, functional only), inline write ok",
            (PAYLOAD as f64 * 8.0) / (us as f64 * 1000.0)
        )
    };
    drop(qp);
    drop(mr);
    Ok(format!(
        "{} port {PORT} active_mtu {} bytes path_mtu {} bytes gid[{gid_index}] {gid} RoCE v2 (library and sysfs agree; table scan {gid_ms} ms, \
         one-call table {} entries in {table_us} us) \
         peer QP {:#x}: {summary}",
        link.dev,
        mtu.bytes(),
        path_mtu.bytes(),
        one.len(),
        peer.qpn
    ))
}

fn main() -> ExitCode {
    let n: usize = std::env::var("LAB_NLINKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let node = std::env::var("LAB_NODE").unwrap_or_default();
    if n == 0 {
        eprintln!("verbs_smoke: LAB_NLINKS is unset or 0; run inside the rxe lab");
        return ExitCode::from(2);
    }
    if let Err(e) = switchless::verbs::fork_init() {
        eprintln!("SMOKE FAIL node {node}: {e}");
        return ExitCode::FAILURE;
    }
    println!(
        "SMOKE node {node}: {} links; devices {:?}; {}",
        n,
        switchless::verbs::device_names(),
        switchless::verbs::optional_symbols().describe()
    );
    let mut links = Vec::new();
    for i in 0..n {
        match std::env::var(format!("LAB_LINK_{i}"))
            .map_err(|e| e.to_string())
            .and_then(|v| parse_link(&v))
        {
            Ok(l) => links.push(Arc::new(l)),
            Err(e) => {
                eprintln!("SMOKE node {node}: LAB_LINK_{i}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let handles: Vec<_> = links
        .iter()
        .map(|l| {
            let l = Arc::clone(l);
            std::thread::spawn(move || run_link(&l))
        })
        .collect();
    let mut ok = true;
    for (l, h) in links.iter().zip(handles) {
        match h.join() {
            Ok(Ok(s)) => println!("SMOKE PASS node {node} cable {} {}: {s}", l.lid, l.dev),
            Ok(Err(e)) => {
                ok = false;
                println!("SMOKE FAIL node {node} cable {} {}: {e}", l.lid, l.dev);
            }
            Err(_) => {
                ok = false;
                println!(
                    "SMOKE FAIL node {node} cable {} {}: thread panicked",
                    l.lid, l.dev
                );
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
