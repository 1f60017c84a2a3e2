//! The part of `doctor --fleet` about NCCL's collectives: the rank order of hosts that puts NCCL's ring
//! on the fattest cables ([`crate::tuner::order`]), and what the tuner in the plugin infers on each host
//! (it sees only its own cables, so hosts cabled differently may decide differently).

use std::fmt::Write as _;

use super::fleet::{FleetReport, HostInput};
use crate::tuner::fabric::{Class, LocalView, Relay, classify};
use crate::tuner::order::{RingOrder, best_ring};

/// The best ring order of the fleet's hosts (by name) and how it compares.
#[derive(Debug, Clone)]
pub struct FleetOrder {
    /// Host names in rank order.
    pub names: Vec<String>,
    /// The search's result (capacities in Gb/s).
    pub ring: RingOrder,
}

/// The ring order over the usable cables of the fleet's matrix, hosts in report order.
pub fn order(r: &FleetReport) -> FleetOrder {
    let names: Vec<String> = r.hosts.iter().map(|h| h.name.clone()).collect();
    let n = names.len();
    let mut cap = vec![vec![0.0; n]; n];
    for c in r.matrix.iter().filter(|c| c.usable_paths > 0) {
        let (Some(a), Some(b)) = (
            names.iter().position(|x| *x == c.a),
            names.iter().position(|x| *x == c.b),
        ) else {
            continue;
        };
        let g = c.speed_mbps as f64 / 1000.0;
        cap[a][b] = g;
        cap[b][a] = g;
    }
    let ring = best_ring(&cap);
    FleetOrder {
        names: ring.order.iter().map(|&i| names[i].clone()).collect(),
        ring,
    }
}

fn class_text(c: &Class) -> String {
    match c {
        Class::Untouched(why) => format!("changes nothing ({why})"),
        Class::NonNeighbours { inputs, .. } => format!(
            "{} cable(s): some hosts are not neighbours, Ring only",
            inputs.cables
        ),
        Class::Mesh {
            inputs, per_peer, ..
        } => format!(
            "{} cable(s): full mesh assumed, {per_peer} per peer; the model picks Ring or Tree for all-reduce",
            inputs.cables
        ),
    }
}

/// The text section: the order, and the tuner's inference per host.
pub fn render(r: &FleetReport, hosts: &[HostInput]) -> String {
    let mut out = String::new();
    let o = order(r);
    let _ = writeln!(
        out,
        "\nRank order for NCCL's ring (NCCL numbers hosts by their first rank and sends host n's bytes to \
         host n+1, so the thinnest cable bundle between consecutive hosts is the ring's busbw):"
    );
    if o.ring.bottleneck <= 0.0 {
        let _ = writeln!(
            out,
            "  no order visits every host over cables: NCCL's ring needs a relay or \
             NCCL_SWITCHLESS_TCP_FALLBACK=1 between some neighbours"
        );
    } else if o.ring.all_equal() {
        let _ = writeln!(
            out,
            "  every order gives the ring the same {:.0} Gb/s: keep any (given: {})",
            o.ring.bottleneck,
            o.names.join(",")
        );
    } else {
        let given = if o.ring.given > 0.0 {
            format!("{:.0} Gb/s", o.ring.given)
        } else {
            "a step with no cable".to_owned()
        };
        let _ = writeln!(
            out,
            "  {}: thinnest step {:.0} Gb/s (the order given here: {given}{}){}",
            o.names.join(","),
            o.ring.bottleneck,
            if o.ring.given > 0.0 {
                format!(", ×{:.2}", o.ring.gain())
            } else {
                String::new()
            },
            if o.ring.exhaustive {
                ""
            } else {
                " (local search: the fleet is too large to try every order)"
            }
        );
        let _ = writeln!(
            out,
            "  launch the ranks host by host in this order (nccl-tests launchers: --order auto)"
        );
    }

    let n = hosts.len();
    let classes: Vec<(String, String)> = hosts
        .iter()
        .map(|h| {
            let devices = h.model.nccl_devices(&|_, _| true, &|_| false);
            let links = h.model.local_links(&devices);
            let view = LocalView::from_host(&devices, &links);
            (
                h.name.clone(),
                class_text(&classify(n, n, &view, Relay::Unavailable)),
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "\nThe plugin's tuner on each host ({n} hosts; it sees only that host's cables):"
    );
    if classes.windows(2).all(|w| w[0].1 == w[1].1) {
        if let Some((_, c)) = classes.first() {
            let _ = writeln!(out, "  every host: {c}");
        }
    } else {
        for (name, c) in &classes {
            let _ = writeln!(out, "  {name}: {c}");
        }
        let _ = writeln!(
            out,
            "  WARNING: the hosts infer different fabrics, so their tuners may pick different algorithms \
             for one collective, which hangs NCCL: make the cabling uniform, or set NCCL_SWITCHLESS_TUNER=0 \
             on every host"
        );
    }
    let mesh = classes.iter().any(|(_, c)| c.contains("full mesh assumed"));
    if mesh && !r.non_neighbours.is_empty() {
        let pairs: Vec<String> = r
            .non_neighbours
            .iter()
            .map(|(a, b)| format!("{a}–{b}"))
            .collect();
        let _ = writeln!(
            out,
            "  WARNING: a tuner assumes a full mesh but {} share no cable: its Tree would connect them; \
             set NCCL_SWITCHLESS_TUNER=0 (or cable a full mesh)",
            pairs.join(", ")
        );
    }
    out
}
