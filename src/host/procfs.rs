//! Readers of procfs tables: IPv4 routes, ARP neighbours, local addresses (`fib_trie`) and
//! RLIMIT_MEMLOCK.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::ctx::Ctx;
use super::model::*;
use crate::route::types::KernelRoute;

/// `/proc/net/route`: Iface Destination Gateway Flags RefCnt Use Metric Mask … (hex in the host's byte
/// order; every supported host — x86-64, AArch64 — is little-endian, which is what the files hold).
pub(super) fn read_routes(cx: &mut Ctx<'_>) -> Vec<KernelRoute> {
    let path = "/proc/net/route";
    let Some(s) = cx.req(path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, line) in s.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        let parsed = (|| {
            if f.len() < 8 {
                return None;
            }
            let h = |x: &str| {
                u32::from_str_radix(x, 16)
                    .ok()
                    .map(|v| Ipv4Addr::from(v.to_le_bytes()))
            };
            let dest = h(f[1])?;
            let gw = h(f[2])?;
            let flags = u32::from_str_radix(f[3], 16).ok()?;
            let metric: u32 = f[6].parse().ok()?;
            let mask = h(f[7])?;
            let prefix = u32::from(mask).leading_ones() as u8;
            Some((dest, gw, flags, metric, prefix))
        })();
        match parsed {
            Some((dest, gw, flags, metric, prefix)) => {
                if flags & 0x1 == 0 {
                    continue; // RTF_UP not set
                }
                let Ok(net) = Ipv4Net::new(dest, prefix) else { continue };
                out.push(KernelRoute {
                    dest: net,
                    gateway: (flags & 0x2 != 0).then_some(gw),
                    ifname: f[0].to_string(),
                    metric,
                });
            }
            None => cx.warn_file(
                path,
                format!("{path} line {}: {line:?} is not Iface Destination Gateway Flags RefCnt Use Metric Mask …", i + 1),
            ),
        }
    }
    out
}

/// `/proc/net/arp`: IP address, HW type, Flags, HW address, Mask, Device.
pub(super) fn read_arp(cx: &mut Ctx<'_>) -> Vec<Neighbour> {
    let path = "/proc/net/arp";
    let Some(s) = cx.opt(path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in s.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 {
            continue;
        }
        let (Ok(addr), Ok(flags)) = (
            f[0].parse::<Ipv4Addr>(),
            u32::from_str_radix(f[2].trim_start_matches("0x"), 16),
        ) else {
            cx.warn_file(
                path,
                format!("{path}: line {line:?} is not IP HWtype Flags HWaddress Mask Device"),
            );
            continue;
        };
        out.push(Neighbour {
            addr,
            mac: f[3].to_string(),
            complete: flags & 0x2 != 0,
            ifname: f[5].to_string(),
        });
    }
    out
}

/// Local IPv4 addresses from `/proc/net/fib_trie` (leaves followed by "/32 host LOCAL"), loopback excluded.
/// The file does not name interfaces; callers assign each address to the netdev whose connected route
/// holds it.
pub(super) fn read_fib_trie_locals(cx: &mut Ctx<'_>) -> Vec<Ipv4Addr> {
    let Some(s) = cx.opt("/proc/net/fib_trie") else {
        return Vec::new();
    };
    let mut out = BTreeSet::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in s.lines() {
        let t = line.trim_start_matches([' ', '|', '+', '-']).trim();
        if let Ok(a) = t.parse::<Ipv4Addr>() {
            last = Some(a);
        } else if t.starts_with("/32 host LOCAL") {
            if let Some(a) = last.filter(|a| !a.is_loopback()) {
                out.insert(a);
            }
        }
    }
    out.into_iter().collect()
}

/// "Max locked memory  8388608  8388608  bytes" from `/proc/self/limits`.
pub(super) fn read_memlock(cx: &mut Ctx<'_>) -> Option<Memlock> {
    let path = "/proc/self/limits";
    let s = cx.req(path)?;
    let line = s.lines().find(|l| l.starts_with("Max locked memory"));
    let Some(line) = line else {
        cx.warn_file(path, format!("{path} has no \"Max locked memory\" line"));
        return None;
    };
    let f: Vec<&str> = line["Max locked memory".len()..]
        .split_whitespace()
        .collect();
    let val = |x: &str| -> Result<Option<u64>, ()> {
        if x == "unlimited" {
            Ok(None)
        } else {
            x.parse::<u64>().map(Some).map_err(|_| ())
        }
    };
    match (f.first().map(|x| val(x)), f.get(1).map(|x| val(x))) {
        (Some(Ok(soft)), Some(Ok(hard))) => Some(Memlock { soft, hard }),
        _ => {
            cx.warn_file(
                path,
                format!("{path}: {line:?} is not \"Max locked memory <soft> <hard> bytes\""),
            );
            None
        }
    }
}
