//! Facts beyond the host model that some doctor checks need, read through the same [`Reader`] as
//! discovery (so `--capture` copies them and `--root` reads them back): per-netdev ARP settings
//! (`/proc/sys/net/ipv4/conf/{all,IF}/arp_ignore`, `arp_announce`). A fact whose file is missing
//! (an older capture, another kernel) is unknown, and the check that needs it says nothing.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::host::{HostModel, Reader};

/// `arp_ignore` and `arp_announce` of one conf directory; `None` when unreadable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ArpConf {
    pub ignore: Option<u8>,
    pub announce: Option<u8>,
}

/// What the facts checks read, by netdev.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Facts {
    /// ARP settings of `all` and of every physical netdev.
    pub arp: BTreeMap<String, ArpConf>,
}

fn num(rd: &Reader, path: &str) -> Option<u8> {
    rd.read(path).ok()?.trim().parse().ok()
}

impl Facts {
    /// Reads the facts of `m`'s netdevs under `rd`'s root.
    pub fn read(rd: &Reader, m: &HostModel) -> Facts {
        let mut arp = BTreeMap::new();
        let names = std::iter::once("all").chain(
            m.netdevs
                .iter()
                .filter(|n| n.pci.is_some() || !n.rdma.is_empty())
                .map(|n| n.name.as_str()),
        );
        for n in names {
            let conf = ArpConf {
                ignore: num(rd, &format!("/proc/sys/net/ipv4/conf/{n}/arp_ignore")),
                announce: num(rd, &format!("/proc/sys/net/ipv4/conf/{n}/arp_announce")),
            };
            if conf != ArpConf::default() {
                arp.insert(n.to_string(), conf);
            }
        }
        Facts { arp }
    }

    /// The ARP settings the kernel applies on `netdev`: for both, the larger of `all` and its own.
    /// `None` when neither is known.
    pub fn effective_arp(&self, netdev: &str) -> Option<(u8, u8)> {
        let all = self.arp.get("all");
        let own = self.arp.get(netdev);
        if all.is_none() && own.is_none() {
            return None;
        }
        let pick = |f: fn(&ArpConf) -> Option<u8>| {
            all.and_then(f)
                .unwrap_or(0)
                .max(own.and_then(f).unwrap_or(0))
        };
        Some((pick(|c| c.ignore), pick(|c| c.announce)))
    }
}
