//! The addressing scheme: where each logical link's subnet lies in the base range.
//!
//! A *logical link* is one interface pair of one cable: function `f` of the lower server's port with function `f`
//! of the higher server's port (np0↔np0, np1↔np1 on a B300; root-0↔root-0, root-2↔root-2 on a GB10).
//!
//! Every link gets a *slot* from its lower end alone:
//!
//! ```text
//! slot   = ((lower_server − 1) × P + (lower_port − 1)) × F + f
//! subnet = base_network + slot × B        (B = 4 addresses for /30, 2 for /31)
//! lower server: first usable address (.1 of a /30, .0 of a /31); higher server: the next one
//! ```
//!
//! where `P` is the model's highest port number and `F` the most interfaces a port has. A port is used by one
//! cable only, so the lower end names the cable and no two links share a slot. The address depends only on the
//! cable itself, never on the order of the file or on the other cables: adding, removing or reordering lines
//! never renumbers the others, and an address reads back as server/port/function.
#![forbid(unsafe_code)]

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::error::{Error, Result};

/// The scheme's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheme {
    /// The range links are taken from; its network address (no host bits).
    pub base: Ipv4Net,
    /// 30 or 31.
    pub prefix: u8,
    /// `P`: the model's highest port number.
    pub ports: u32,
    /// `F`: the most interfaces a port has.
    pub functions: u32,
}

impl Scheme {
    /// Checks the parameters: prefix 30 or 31, base a network address no longer than the link prefix.
    pub fn new(base: Ipv4Net, prefix: u8, ports: u32, functions: u32) -> Result<Scheme> {
        if prefix != 30 && prefix != 31 {
            return Err(Error::InvalidUsage(format!(
                "--prefix {prefix}: accepted are 30 (4 addresses per link) and 31 (2 addresses per link, RFC 3021)"
            )));
        }
        if base.addr() != base.network() {
            return Err(Error::InvalidUsage(format!(
                "--base {base} has host bits set; give the network address, e.g. {}",
                base.trunc()
            )));
        }
        if base.prefix_len() > prefix {
            return Err(Error::InvalidUsage(format!(
                "--base {base} is smaller than one /{prefix} link; give a range of /{prefix} or larger, e.g. /16"
            )));
        }
        if ports == 0 || functions == 0 {
            return Err(Error::InvalidUsage(
                "the port map has no port or no interface".into(),
            ));
        }
        Ok(Scheme {
            base,
            prefix,
            ports,
            functions,
        })
    }

    /// Addresses per link: 4 for /30, 2 for /31.
    pub fn block(&self) -> u64 {
        1u64 << (32 - self.prefix)
    }

    /// Addresses in the base range.
    pub fn capacity(&self) -> u64 {
        1u64 << (32 - self.base.prefix_len())
    }

    /// The slot of function `function` of the cable whose lower end is `server`/`port` (both 1-based).
    pub fn slot(&self, server: u32, port: u32, function: u32) -> u64 {
        ((u64::from(server) - 1) * u64::from(self.ports) + (u64::from(port) - 1))
            * u64::from(self.functions)
            + u64::from(function)
    }

    /// The subnet of a slot, or `None` when it lies beyond the base range.
    pub fn subnet(&self, slot: u64) -> Option<Ipv4Net> {
        let offset = slot.checked_mul(self.block())?;
        if offset + self.block() > self.capacity() {
            return None;
        }
        let addr = u64::from(u32::from(self.base.network())) + offset;
        let addr = Ipv4Addr::from(u32::try_from(addr).ok()?);
        Ipv4Net::new(addr, self.prefix).ok()
    }

    /// The two host addresses of a link subnet: (lower server, higher server).
    pub fn hosts(&self, subnet: Ipv4Net) -> (Ipv4Net, Ipv4Net) {
        let net = u32::from(subnet.network());
        let first = if self.prefix == 31 { net } else { net + 1 };
        // Both fit: `subnet` is aligned to its block of 2 or 4 addresses.
        let lo = Ipv4Net::new(Ipv4Addr::from(first), self.prefix).unwrap_or(subnet);
        let hi = Ipv4Net::new(Ipv4Addr::from(first + 1), self.prefix).unwrap_or(subnet);
        (lo, hi)
    }

    /// The shortest base prefix whose range holds `slots_end` slots (`None` when even /0 is too small).
    pub fn prefix_needed(&self, slots_end: u64) -> Option<u8> {
        let need = slots_end.checked_mul(self.block())?;
        (0..=self.prefix)
            .rev()
            .find(|&p| (1u64 << (32 - p)) >= need)
    }

    /// The rule in words, with this plan's numbers.
    pub fn rule(&self) -> String {
        format!(
            "slot = ((lower server - 1) * {} + (lower port - 1)) * {} + function; subnet = {} + slot * {}; lower server takes the first usable address, higher server the next",
            self.ports,
            self.functions,
            self.base.network(),
            self.block()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn slots_and_subnets() {
        let s = Scheme::new(net("10.100.0.0/16"), 30, 8, 2).unwrap();
        assert_eq!(s.slot(1, 1, 0), 0);
        assert_eq!(s.slot(1, 1, 1), 1);
        assert_eq!(s.slot(1, 2, 0), 2);
        assert_eq!(s.slot(2, 1, 0), 16);
        assert_eq!(s.subnet(0), Some(net("10.100.0.0/30")));
        assert_eq!(s.subnet(16), Some(net("10.100.0.64/30")));
        assert_eq!(s.subnet(16384), None);
        assert_eq!(
            s.hosts(net("10.100.0.64/30")),
            (net("10.100.0.65/30"), net("10.100.0.66/30"))
        );
        let s31 = Scheme::new(net("10.100.0.0/16"), 31, 8, 2).unwrap();
        assert_eq!(s31.subnet(3), Some(net("10.100.0.6/31")));
        assert_eq!(
            s31.hosts(net("10.100.0.6/31")),
            (net("10.100.0.6/31"), net("10.100.0.7/31"))
        );
    }

    #[test]
    fn rejects_bad_parameters() {
        let e = |b: &str, p| Scheme::new(net(b), p, 8, 2).unwrap_err().to_string();
        assert!(e("10.0.0.0/16", 29).contains("--prefix 29"));
        assert!(e("10.0.0.1/16", 30).contains("host bits"));
        assert!(e("10.0.0.0/31", 30).contains("smaller than one /30"));
    }

    #[test]
    fn prefix_needed() {
        let s = Scheme::new(net("10.0.0.0/28"), 30, 8, 2).unwrap();
        assert_eq!(s.prefix_needed(4), Some(28));
        assert_eq!(s.prefix_needed(5), Some(27));
        assert_eq!(s.prefix_needed(64), Some(24));
    }
}
