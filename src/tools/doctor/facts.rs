//! Facts beyond the host model that the trap checks need, read through the same [`Reader`] as
//! discovery (so `--capture` copies them and `--root` reads them back):
//!
//! * per-netdev ARP settings: `/proc/sys/net/ipv4/conf/{all,IF}/arp_ignore`, `arp_announce`;
//! * IPv6 addresses and privacy setting: `/proc/net/if_inet6`, `/proc/sys/net/ipv6/conf/IF/use_tempaddr`;
//! * each Mellanox function's `lspci -vv` text (its captured Slot Power Limit; root only) and the
//!   kernel log's warnings (`dmesg --level=err,warn`: "insufficient power on the PCIe slot"), kept as
//!   tool outputs at `/lspci-vv/BDF` and `/dmesg`;
//! * NetworkManager's view of each device (`nmcli -t device`, at `/nmcli-device`);
//! * the NVIDIA kernel module (`/proc/driver/nvidia/version`: open or proprietary), its GPUs' models
//!   (`/proc/driver/nvidia/gpus/*/information`) and the kernel release.
//!
//! A fact whose file or tool is missing (an older capture, another kernel, no root) is unknown, and
//! the check that needs it says nothing.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::host::{HostModel, Reader};

/// `arp_ignore` and `arp_announce` of one conf directory; `None` when unreadable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ArpConf {
    pub ignore: Option<u8>,
    pub announce: Option<u8>,
}

/// One IPv6 address of `/proc/net/if_inet6`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Inet6 {
    pub netdev: String,
    pub addr: std::net::Ipv6Addr,
    /// IFA_F_TEMPORARY (0x01): a privacy address, replaced as it expires.
    pub temporary: bool,
}

/// One device row of `nmcli -t -f DEVICE,TYPE,STATE,CONNECTION device`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NmDevice {
    pub device: String,
    pub state: String,
    pub connection: String,
}

/// What the trap checks read.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Facts {
    /// ARP settings of `all` and of every physical netdev.
    pub arp: BTreeMap<String, ArpConf>,
    /// IPv6 addresses of the physical netdevs.
    pub inet6: Vec<Inet6>,
    /// `use_tempaddr` by netdev.
    pub use_tempaddr: BTreeMap<String, i8>,
    /// The captured Slot Power Limit (watts) by Mellanox PCI function, from `lspci -vv`.
    pub slot_power_w: BTreeMap<String, f32>,
    /// Kernel log lines about insufficient slot power, with the PCI function they name.
    pub power_warnings: Vec<(String, String)>,
    /// NetworkManager's devices; `None` when nmcli could not run (no NetworkManager).
    pub nm: Option<Vec<NmDevice>>,
    /// `/proc/driver/nvidia/version`'s first line.
    pub nvidia_version: Option<String>,
    /// The GPUs' model names (`/proc/driver/nvidia/gpus/*/information`).
    pub gpu_models: Vec<String>,
    /// `/proc/sys/kernel/osrelease`.
    pub kernel: Option<String>,
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
        let physical: Vec<&str> = m
            .netdevs
            .iter()
            .filter(|n| n.pci.is_some() || !n.rdma.is_empty())
            .map(|n| n.name.as_str())
            .collect();
        let inet6 = rd
            .read("/proc/net/if_inet6")
            .map(|t| parse_if_inet6(&t))
            .unwrap_or_default()
            .into_iter()
            .filter(|a| physical.contains(&a.netdev.as_str()))
            .collect();
        let use_tempaddr = physical
            .iter()
            .filter_map(|n| {
                let v = rd
                    .read(&format!("/proc/sys/net/ipv6/conf/{n}/use_tempaddr"))
                    .ok()?;
                Some((n.to_string(), v.trim().parse().ok()?))
            })
            .collect();
        // Mellanox functions: their captured slot power (lspci needs root to show it).
        let mut bdfs: Vec<&str> = m
            .pci_functions
            .iter()
            .filter(|f| f.vendor == Some(crate::host::model::MELLANOX_VENDOR))
            .map(|f| f.bdf.as_str())
            .collect();
        bdfs.sort_unstable();
        let slot_power_w = bdfs
            .iter()
            .filter_map(|b| {
                let t = rd
                    .tool_output(&format!("/lspci-vv/{b}"), &["lspci", "-vv", "-s", b])
                    .ok()?;
                Some((b.to_string(), slot_power_limit(&t)?))
            })
            .collect();
        let power_warnings = if bdfs.is_empty() {
            Vec::new()
        } else {
            rd.tool_output("/dmesg", &["dmesg", "--level=err,warn"])
                .map(|t| insufficient_power(&t, &bdfs))
                .unwrap_or_default()
        };
        let nm = rd
            .tool_output(
                "/nmcli-device",
                &[
                    "nmcli",
                    "-t",
                    "-f",
                    "DEVICE,TYPE,STATE,CONNECTION",
                    "device",
                ],
            )
            .ok()
            .map(|t| parse_nmcli(&t));
        let nvidia_version = rd
            .read("/proc/driver/nvidia/version")
            .ok()
            .and_then(|t| t.lines().next().map(str::to_string));
        let gpu_models = rd
            .list("/proc/driver/nvidia/gpus")
            .unwrap_or_default()
            .iter()
            .filter_map(|g| {
                let t = rd
                    .read(&format!("/proc/driver/nvidia/gpus/{g}/information"))
                    .ok()?;
                t.lines()
                    .find_map(|l| l.strip_prefix("Model:").map(|m| m.trim().to_string()))
            })
            .collect();
        let kernel = rd
            .read("/proc/sys/kernel/osrelease")
            .ok()
            .map(|s| s.trim().to_string());
        Facts {
            arp,
            inet6,
            use_tempaddr,
            slot_power_w,
            power_warnings,
            nm,
            nvidia_version,
            gpu_models,
            kernel,
        }
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

/// `/proc/net/if_inet6`: `ADDR(32 hex) IFINDEX PREFIX SCOPE FLAGS NAME` per line.
pub fn parse_if_inet6(text: &str) -> Vec<Inet6> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 6 || f[0].len() != 32 {
                return None;
            }
            let bits = u128::from_str_radix(f[0], 16).ok()?;
            let flags = u32::from_str_radix(f[4], 16).ok()?;
            Some(Inet6 {
                netdev: f[5].to_string(),
                addr: std::net::Ipv6Addr::from(bits),
                temporary: flags & 0x01 != 0,
            })
        })
        .collect()
}

/// The captured Slot Power Limit of `lspci -vv`'s DevCap line (`SlotPowerLimit 75W`,
/// `SlotPowerLimit 0.000W`), in watts.
pub fn slot_power_limit(text: &str) -> Option<f32> {
    let i = text.find("SlotPowerLimit")?;
    let rest = text[i + "SlotPowerLimit".len()..].trim_start();
    let num: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    rest[num.len()..]
        .starts_with('W')
        .then(|| num.parse().ok())
        .flatten()
}

/// Kernel log lines saying a PCI function lacks slot power (mlx5_core: "Detected insufficient power
/// on the PCIe slot"), with the function of `bdfs` each names.
pub fn insufficient_power(text: &str, bdfs: &[&str]) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| l.contains("insufficient power"))
        .filter_map(|l| {
            let b = bdfs.iter().find(|b| l.contains(**b))?;
            Some((b.to_string(), l.trim().to_string()))
        })
        .collect()
}

/// `nmcli -t -f DEVICE,TYPE,STATE,CONNECTION device`: `:`-separated, `\:` inside a value.
pub fn parse_nmcli(text: &str) -> Vec<NmDevice> {
    text.lines()
        .filter_map(|l| {
            let mut fields = Vec::new();
            let mut cur = String::new();
            let mut esc = false;
            for c in l.chars() {
                match (esc, c) {
                    (true, c) => {
                        cur.push(c);
                        esc = false;
                    }
                    (false, '\\') => esc = true,
                    (false, ':') => fields.push(std::mem::take(&mut cur)),
                    (false, c) => cur.push(c),
                }
            }
            fields.push(cur);
            (fields.len() >= 4).then(|| NmDevice {
                device: fields[0].clone(),
                state: fields[2].clone(),
                connection: fields[3].clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers() {
        let a = parse_if_inet6(
            "fe800000000000004ebb47fffea1b2c2 05 40 20 80 enP2p1s0f0np0\n\
             20010db8000000000000000000000abc 05 40 00 01 enP2p1s0f0np0\n",
        );
        assert_eq!(a.len(), 2);
        assert!(!a[0].temporary && a[1].temporary);
        assert_eq!(a[1].addr.to_string(), "2001:db8::abc");
        assert_eq!(
            slot_power_limit(
                "DevCap:\tMaxPayload 512 bytes, PhantFunc 0\n\t\tExtTag+ SlotPowerLimit 0W\n"
            ),
            Some(0.0)
        );
        assert_eq!(slot_power_limit("SlotPowerLimit 75.000W"), Some(75.0));
        assert_eq!(slot_power_limit("Capabilities: <access denied>"), None);
        let w = insufficient_power(
            "[ 5.1] mlx5_core 0000:01:00.0: mlx5_pcie_event:301:(pid 0): Detected insufficient power on the PCIe slot (27W).\n[ 6.0] other\n",
            &["0000:01:00.0", "0000:01:00.1"],
        );
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].0, "0000:01:00.0");
        let nm = parse_nmcli(
            "enp1s0f0np0:ethernet:connecting (getting IP configuration):Wired connection 1\n\
             enP7s7:ethernet:connected:netplan-enP7s7\nlo:loopback:unmanaged:\nx:ethernet:connected:a\\:b\n",
        );
        assert_eq!(nm.len(), 4);
        assert_eq!(nm[0].state, "connecting (getting IP configuration)");
        assert_eq!(nm[3].connection, "a:b");
    }
}
