//! How the tools write counts and units, so that doctor, fleet, plan, route and watch say the same
//! thing the same way: `1 cable`, `2 cables`; Gb/s (10^9 bit/s) with one rule for decimals; byte
//! sizes in powers of 1024.
#![forbid(unsafe_code)]

/// `1 path`, `2 paths`, `0 paths` (regular plurals: the word plus `s`).
pub fn count(n: usize, what: &str) -> String {
    format!("{n} {}", plural(n, what))
}

/// `what` for one, `whats` otherwise.
pub fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        what.to_string()
    } else if what.ends_with('s') || what.ends_with("sh") {
        format!("{what}es")
    } else {
        format!("{what}s")
    }
}

/// A rate in Gb/s from Mb/s, without the unit: whole numbers from 10 Gb/s up (126 030 Mb/s is
/// `126`), one decimal below (2 500 Mb/s is `2.5`), so a column never mixes `126.0` and `200`.
pub fn gbps_number(mbps: u64) -> String {
    let g = mbps as f64 / 1000.0;
    if g >= 10.0 || g.fract() == 0.0 {
        format!("{}", g.round() as u64)
    } else {
        format!("{g:.1}")
    }
}

/// [`gbps_number`] with its unit: `126 Gb/s`.
pub fn gbps(mbps: u64) -> String {
    format!("{} Gb/s", gbps_number(mbps))
}

/// A byte count in the largest power-of-1024 unit that keeps it whole or near: `8 MiB`,
/// `1.5 GiB`, `512 bytes`.
pub fn bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, size) in UNITS {
        if n >= size {
            let v = n as f64 / size as f64;
            return if v.fract() == 0.0 {
                format!("{} {name}", n / size)
            } else {
                format!("{v:.1} {name}")
            };
        }
    }
    count(n as usize, "byte")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plurals() {
        assert_eq!(count(1, "port"), "1 port");
        assert_eq!(count(2, "interface"), "2 interfaces");
        assert_eq!(count(0, "link"), "0 links");
        assert_eq!(count(2, "address"), "2 addresses");
    }

    #[test]
    fn rates_use_one_rule() {
        assert_eq!(gbps_number(126_030), "126");
        assert_eq!(gbps_number(200_000), "200");
        assert_eq!(gbps_number(2_500), "2.5");
        assert_eq!(gbps_number(1_000), "1");
        assert_eq!(gbps(252_060), "252 Gb/s");
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(bytes(8 << 20), "8 MiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
        assert_eq!(bytes(512), "512 bytes");
        assert_eq!(bytes(1), "1 byte");
    }
}
