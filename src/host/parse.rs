//! Pure parsers of the kernel's text formats (GIDs, GUIDs, port state and rate, PCI paths).

use std::net::Ipv6Addr;

use super::model::GidAddr;

/// The PCI function a device path sits on: the path itself, or its nearest PCI ancestor (virtio
/// netdevs link to `…/0000:00:03.0/virtio2`). Returns (function path, bdf).
pub(super) fn pci_of_path(path: &str) -> Option<(String, String)> {
    let comps: Vec<&str> = path.split('/').collect();
    let i = comps.iter().rposition(|c| is_bdf(c))?;
    Some((comps[..=i].join("/"), comps[i].to_string()))
}

pub(super) fn is_bdf(s: &str) -> bool {
    // dddd:bb:dd.f
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

pub(super) fn parse_guid(s: &str) -> Option<u64> {
    let h: String = s.trim().chars().filter(|c| *c != ':').collect();
    if h.len() != 16 {
        return None;
    }
    u64::from_str_radix(&h, 16).ok()
}

/// "4: ACTIVE" → (4, "ACTIVE").
pub(super) fn parse_state(s: &str) -> Option<(u8, String)> {
    let (n, name) = s.split_once(':')?;
    Some((n.trim().parse().ok()?, name.trim().to_string()))
}

/// "200 Gb/sec (4X HDR)" → 200000 Mb/s; "2.5 Gb/sec (1X SDR)" → 2500.
pub(super) fn parse_rate_mbps(s: &str) -> Option<u32> {
    let mut it = s.split_whitespace();
    let v: f64 = it.next()?.parse().ok()?;
    let unit = it.next()?;
    let mult = match unit {
        "Gb/sec" => 1000.0,
        "Mb/sec" => 1.0,
        _ => return None,
    };
    Some((v * mult).round() as u32)
}

/// Parses a sysfs GID ("fe80:0000:…", eight groups of four hex digits).
pub fn parse_gid(s: &str) -> Option<Ipv6Addr> {
    let groups: Vec<&str> = s.trim().split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut seg = [0u16; 8];
    for (i, g) in groups.iter().enumerate() {
        if g.is_empty() || g.len() > 4 {
            return None;
        }
        seg[i] = u16::from_str_radix(g, 16).ok()?;
    }
    Some(Ipv6Addr::from(seg))
}

pub fn classify_gid(g: Ipv6Addr) -> GidAddr {
    GidAddr::of(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_formats() {
        assert_eq!(parse_rate_mbps("200 Gb/sec (4X HDR)"), Some(200_000));
        assert_eq!(parse_rate_mbps("2.5 Gb/sec (1X SDR)"), Some(2_500));
        assert_eq!(parse_rate_mbps("fast"), None);
        assert_eq!(parse_state("4: ACTIVE"), Some((4, "ACTIVE".into())));
        assert_eq!(parse_state("ACTIVE"), None);
        assert_eq!(
            parse_guid("4cbb:4703:00a1:b2c0"),
            Some(0x4cbb_4703_00a1_b2c0)
        );
        assert_eq!(parse_guid("4cbb:4703"), None);
        let g = parse_gid("0000:0000:0000:0000:0000:ffff:c0a8:640a").unwrap();
        assert_eq!(
            classify_gid(g),
            GidAddr::Ipv4Mapped(std::net::Ipv4Addr::new(192, 168, 100, 10))
        );
        let g = parse_gid("fe80:0000:0000:0000:4ebb:47ff:fe00:0001").unwrap();
        assert_eq!(classify_gid(g), GidAddr::LinkLocal);
        assert!(
            parse_gid("0000:0000:0000:0000:0000:0000:0000:0000")
                .unwrap()
                .is_unspecified()
        );
        assert!(parse_gid("zz").is_none());
        assert!(is_bdf("0002:01:00.1"));
        assert!(!is_bdf("pci0000:00"));
    }
}
