//! What a modelled path costs: rates, latencies, the bytes RoCE v2 puts on the wire per RDMA write,
//! and the `RATE[/LATENCY][@ROOT]` spec syntax of `switchless bench --model`. Pure arithmetic in
//! integers (bits per second, picoseconds), so every machine computes the same times.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// Picoseconds per second.
pub const PS_PER_S: u128 = 1_000_000_000_000;
/// Latency of a path whose spec gives none: 1 µs (a back-to-back cable plus both NICs).
pub const DEFAULT_LATENCY_PS: u64 = 1_000_000;
/// RoCE MTU when none is given: 4096 B (the largest IB MTU; needs a 4200+ B Ethernet MTU).
pub const DEFAULT_MTU: u32 = 4096;

/// Bytes each RoCE v2 packet carries besides its payload, over IPv4 without VLAN tag: Ethernet
/// header 14 + IPv4 20 + UDP 8 + BTH 12 + ICRC 4 + FCS 4, plus preamble/SFD 8 and the minimum
/// inter-frame gap 12 that the link also spends (IEEE 802.3; IBTA RoCE v2 annex A17).
pub const ROCE_PACKET_OVERHEAD: u32 = 14 + 20 + 8 + 12 + 4 + 4 + 8 + 12;
/// The RDMA Extended Transport Header (remote address, rkey, length) on the first packet of a write.
pub const RETH_BYTES: u32 = 16;
/// The immediate data header on the last packet of a write with immediate.
pub const IMMDT_BYTES: u32 = 4;

/// How the wire frames a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// RoCE v2 over IPv4: per packet of at most `mtu` payload bytes, [`ROCE_PACKET_OVERHEAD`]; RETH
    /// on the first packet, ImmDt on the last of a write with immediate; payload padded to 4 bytes.
    RoceV2 { mtu: u32 },
    /// Payload only (the rate is a goodput already, e.g. a perftest figure).
    Ideal,
}

impl Default for Framing {
    fn default() -> Self {
        Framing::RoceV2 { mtu: DEFAULT_MTU }
    }
}

impl Framing {
    /// Bytes on the wire for one RDMA write of `len` payload bytes.
    pub fn wire_bytes(self, len: u64, imm: bool) -> u64 {
        match self {
            Framing::Ideal => len,
            Framing::RoceV2 { mtu } => {
                let mtu = u64::from(mtu.max(1));
                let packets = len.div_ceil(mtu).max(1);
                let pad = (4 - len % 4) % 4;
                len + pad
                    + packets * u64::from(ROCE_PACKET_OVERHEAD)
                    + u64::from(RETH_BYTES)
                    + if imm { u64::from(IMMDT_BYTES) } else { 0 }
            }
        }
    }

    /// Packets of one RDMA write of `len` payload bytes (at least one: a zero-length write is a
    /// packet too); payload-only framing counts a packet per 4096 bytes.
    pub fn packets(self, len: u64) -> u64 {
        let mtu = match self {
            Framing::Ideal => u64::from(DEFAULT_MTU),
            Framing::RoceV2 { mtu } => u64::from(mtu.max(1)),
        };
        len.div_ceil(mtu).max(1)
    }

    /// The accepted `--mtu` values: the IB MTUs, or 0 for [`Framing::Ideal`].
    pub fn from_mtu(mtu: u32) -> Result<Framing> {
        match mtu {
            0 => Ok(Framing::Ideal),
            256 | 512 | 1024 | 2048 | 4096 => Ok(Framing::RoceV2 { mtu }),
            _ => Err(Error::InvalidUsage(format!(
                "MTU {mtu}; accepted: 256, 512, 1024, 2048, 4096 (RoCE v2 framing) or 0 (payload only)"
            ))),
        }
    }
}

/// Time in picoseconds to move `bytes` at `rate_bps` bits per second, rounded up.
pub fn serialize_ps(bytes: u64, rate_bps: u64) -> u64 {
    let r = u128::from(rate_bps.max(1));
    let t = (u128::from(bytes) * 8 * PS_PER_S).div_ceil(r);
    u64::try_from(t).unwrap_or(u64::MAX)
}

/// One path of a modelled connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathModel {
    /// Line rate in bits per second.
    pub rate_bps: u64,
    /// One-way latency in picoseconds (first bit out to first bit in, NICs included).
    pub latency_ps: u64,
    /// PCIe root this path's NIC hangs off (both ends); paths on one root share its cap.
    pub root: Option<String>,
}

/// The paths of one connection plus the PCIe caps of the roots they name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topology {
    /// The paths, in data-path order.
    pub paths: Vec<PathModel>,
    /// Cap per root name, in bits per second of payload, per direction (DMA reads for sending and
    /// DMA writes for receiving are counted separately, as PCIe links are full duplex).
    pub caps: BTreeMap<String, u64>,
    /// Framing on every path.
    pub framing: Framing,
}

impl Topology {
    /// Parses `--model SPEC` and `--pcie CAPS` (may be empty). Every root named in SPEC needs a cap and
    /// every cap a path.
    pub fn parse(spec: &str, caps: &str, framing: Framing) -> Result<Topology> {
        let paths = parse_paths(spec)?;
        let caps = parse_caps(caps)?;
        for p in &paths {
            if let Some(r) = &p.root {
                if !caps.contains_key(r) {
                    return Err(Error::InvalidUsage(format!(
                        "--model names PCIe root @{r} but --pcie gives no cap for it (accepted: --pcie {r}=RATE, e.g. {r}=256G)"
                    )));
                }
            }
        }
        if let Some(r) = caps
            .keys()
            .find(|r| !paths.iter().any(|p| p.root.as_ref() == Some(r)))
        {
            return Err(Error::InvalidUsage(format!(
                "--pcie gives a cap for root {r} but no path of --model is tagged @{r}"
            )));
        }
        Ok(Topology {
            paths,
            caps,
            framing,
        })
    }

    /// Sum of the path rates, bits per second.
    pub fn sum_rate_bps(&self) -> u64 {
        self.paths.iter().map(|p| p.rate_bps).sum()
    }

    /// The one-way time of one RDMA write of `len` bytes with immediate on `path` alone: latency plus
    /// serialization of its wire bytes (what `ib_write_lat` would report as half its round trip).
    pub fn write_ps(&self, path: usize, len: u64) -> u64 {
        let Some(p) = self.paths.get(path) else {
            return 0;
        };
        p.latency_ps + serialize_ps(self.framing.wire_bytes(len, true), p.rate_bps)
    }

    /// The fastest single-write one-way time over all paths.
    pub fn best_write_ps(&self, len: u64) -> u64 {
        (0..self.paths.len())
            .map(|i| self.write_ps(i, len))
            .min()
            .unwrap_or(0)
    }
}

const SPEC_HELP: &str = "accepted: comma-separated RATE[/LATENCY][@ROOT] items, 1 to 8 of them, \
RATE like 400G, 92.57G, 800M (bits per second), LATENCY like 1us, 1.2us, 800ns, ROOT a name like r0 \
(e.g. 92.57G/1.2us,97.28G/1.2us or 200G/1us@r0,200G/1us@r0)";

/// Parses `RATE[/LATENCY][@ROOT],...`.
pub fn parse_paths(spec: &str) -> Result<Vec<PathModel>> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(Error::InvalidUsage(format!(
            "empty --model spec; {SPEC_HELP}"
        )));
    }
    let mut out = Vec::new();
    for item in spec.split(',') {
        let item = item.trim();
        let bad =
            |why: &str| Error::InvalidUsage(format!("--model item {item:?}: {why}; {SPEC_HELP}"));
        let (rest, root) = match item.split_once('@') {
            Some((a, r)) => {
                let r = r.trim();
                let ok = !r.is_empty()
                    && r.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if !ok {
                    return Err(bad("the root name is empty or not [A-Za-z0-9_-]"));
                }
                (a, Some(r.to_string()))
            }
            None => (item, None),
        };
        let (rate, lat) = match rest.split_once('/') {
            Some((r, l)) => (r, Some(l)),
            None => (rest, None),
        };
        let rate_bps = parse_rate(rate).map_err(|e| bad(&e))?;
        let latency_ps = match lat {
            Some(l) => parse_duration_ps(l).map_err(|e| bad(&e))?,
            None => DEFAULT_LATENCY_PS,
        };
        out.push(PathModel {
            rate_bps,
            latency_ps,
            root,
        });
    }
    if out.len() > crate::transport::stripe::MAX_PATHS {
        return Err(Error::InvalidUsage(format!(
            "--model lists {} paths; {SPEC_HELP}",
            out.len()
        )));
    }
    Ok(out)
}

/// Parses `ROOT=RATE,...` (empty: no caps).
pub fn parse_caps(caps: &str) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for item in caps.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = |why: &str| {
            Error::InvalidUsage(format!(
                "--pcie item {item:?}: {why}; accepted: comma-separated ROOT=RATE items, e.g. r0=256G"
            ))
        };
        let Some((root, rate)) = item.split_once('=') else {
            return Err(bad("no '='"));
        };
        let rate = parse_rate(rate).map_err(|e| bad(&e))?;
        if out.insert(root.trim().to_string(), rate).is_some() {
            return Err(bad("root given twice"));
        }
    }
    Ok(out)
}

/// Splits a decimal number with an optional suffix into (integer scaled by 10^9, suffix): exact for
/// up to 9 decimals.
fn decimal_nano(s: &str) -> std::result::Result<(u128, &str), String> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(end);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.len() > 9 || frac.contains('.') {
        return Err(format!(
            "{s:?} is not a decimal number (at most 9 decimals)"
        ));
    }
    let int: u128 = if int.is_empty() {
        0
    } else {
        int.parse()
            .map_err(|_| format!("{s:?}: number too large"))?
    };
    let mut f: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| format!("{s:?} is not a number"))?
    };
    for _ in frac.len()..9 {
        f *= 10;
    }
    let v = int
        .checked_mul(1_000_000_000)
        .and_then(|x| x.checked_add(f))
        .ok_or_else(|| format!("{s:?}: number too large"))?;
    Ok((v, suffix))
}

/// Parses a rate like `400G`, `92.57G`, `800M`, `1T` (bits per second; `b/s`, `bps` may follow).
pub fn parse_rate(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (v, suffix) = decimal_nano(s)?;
    let unit = suffix
        .trim_end_matches("b/s")
        .trim_end_matches("bps")
        .trim_end_matches("bit/s");
    let mul: u128 = match unit {
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "rate {s:?} has unit {suffix:?} (accepted: K, M, G, T)"
            ));
        }
    };
    let bps = v * mul / 1_000_000_000;
    if bps == 0 || bps > u128::from(u64::MAX) {
        return Err(format!("rate {s:?} is zero or too large"));
    }
    Ok(bps as u64)
}

/// Parses a duration like `1us`, `1.2us`, `800ns`, `0.5ms`, `2500ps` into picoseconds.
pub fn parse_duration_ps(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (v, unit) = decimal_nano(s)?;
    let mul: u128 = match unit {
        "ps" => 1,
        "ns" => 1_000,
        "us" | "µs" => 1_000_000,
        "ms" => 1_000_000_000,
        _ => {
            return Err(format!(
                "latency {s:?} has unit {unit:?} (accepted: ps, ns, us, ms)"
            ));
        }
    };
    let ps = v * mul / 1_000_000_000;
    u64::try_from(ps).map_err(|_| format!("latency {s:?} is too large"))
}

/// A rate for people: `92.57 Gb/s`.
pub fn rate_text(bps: u64) -> String {
    let g = bps as f64 / 1e9;
    format!("{} Gb/s", trim_float(g))
}

/// A duration for people: `1.2 us`.
pub fn ps_text(ps: u64) -> String {
    format!("{} us", trim_float(ps as f64 / 1e6))
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_durations_parse_exactly() {
        assert_eq!(parse_rate("92.57G").unwrap(), 92_570_000_000);
        assert_eq!(parse_rate("400G").unwrap(), 400_000_000_000);
        assert_eq!(parse_rate("800Mb/s").unwrap(), 800_000_000);
        assert_eq!(parse_duration_ps("1.2us").unwrap(), 1_200_000);
        assert_eq!(parse_duration_ps("800ns").unwrap(), 800_000);
        assert!(parse_rate("0G").is_err());
        assert!(parse_rate("4x0G").is_err());
        assert!(parse_duration_ps("1.2s").unwrap_err().contains("accepted"));
    }

    #[test]
    fn specs_parse_and_bad_ones_say_what_is_accepted() {
        let t = Topology::parse("200G/1us@r0,200G@r0", "r0=256G", Framing::Ideal).unwrap();
        assert_eq!(t.paths.len(), 2);
        assert_eq!(t.paths[1].latency_ps, DEFAULT_LATENCY_PS);
        assert_eq!(t.caps["r0"], 256_000_000_000);
        for bad in [
            "",
            "fast",
            "400G/1parsec",
            "400G@",
            "1G,1G,1G,1G,1G,1G,1G,1G,1G",
        ] {
            let e = Topology::parse(bad, "", Framing::Ideal)
                .unwrap_err()
                .to_string();
            assert!(e.contains("accepted"), "{bad}: {e}");
        }
        let e = Topology::parse("1G@r0", "", Framing::Ideal)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--pcie r0=RATE"), "{e}");
        assert!(Topology::parse("1G", "r1=2G", Framing::Ideal).is_err());
        assert!(
            Framing::from_mtu(1500)
                .unwrap_err()
                .to_string()
                .contains("4096")
        );
    }

    #[test]
    fn roce_framing_counts_headers_per_packet() {
        let f = Framing::RoceV2 { mtu: 4096 };
        // One 8 B write with immediate: one packet.
        assert_eq!(f.wire_bytes(8, true), 8 + 82 + 16 + 4);
        // 1 MiB: 256 packets.
        assert_eq!(f.wire_bytes(1 << 20, false), (1 << 20) + 256 * 82 + 16);
        assert_eq!(f.wire_bytes(0, true), 82 + 16 + 4);
        assert_eq!(Framing::Ideal.wire_bytes(5, true), 5);
        // 1 byte pads to 4.
        assert_eq!(f.wire_bytes(1, false), 4 + 82 + 16);
    }

    #[test]
    fn serialization_rounds_up_in_picoseconds() {
        // 100 bytes at 100 Gb/s: 8 ns.
        assert_eq!(serialize_ps(100, 100_000_000_000), 8_000);
        assert_eq!(serialize_ps(1, 3), 2_666_666_666_667);
    }
}
