//! The B300 fixtures agree with the plan `switchless plan` builds from the same cables: the same
//! interfaces (cable port → card → np0/np1 map), up, with the planned MTU. The fixtures use the
//! sionic 10.1ab.k.x addresses and the plan its own sequential /30s, so `plan::check_host` reports
//! exactly one `plan-addressing-differs` headline naming each planned interface of server 1 (in place of
//! a missing planned address and an extra address per interface); with the plan's addresses replaced by
//! the fixture's (each link's subnet taken from server 1's address, the peer the other host of that /30),
//! it must report nothing at all.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use switchless::findings::Severity;
use switchless::host;
use switchless::tools::plan::{self, Options, Plan, PortMap, cables, check_host};

fn plan_of(text: &str) -> Plan {
    let map = PortMap::b300();
    let c = cables::parse("cables.txt", text, &map, None).unwrap();
    plan::build(&c, &map, &Options::default()).unwrap().plan
}

fn live(name: &str) -> Vec<plan::LiveIface> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fabric")
        .join(name);
    let (m, _) = host::discover(&root);
    switchless::tools::plan::LiveIface::from_model(&m)
}

fn problems(f: &[switchless::findings::Finding]) -> Vec<String> {
    f.iter()
        .filter(|f| f.severity > Severity::Info)
        .map(|f| format!("{} {}: {}", f.check, f.object, f.message))
        .collect()
}

/// Findings of `check`, as (object, message) pairs.
fn of(f: &[switchless::findings::Finding], check: &str) -> Vec<(String, String)> {
    f.iter()
        .filter(|f| f.check == check)
        .map(|f| (f.object.clone(), f.message.clone()))
        .collect()
}

/// Checks server 1 of `p` against fixture `name`: with the plan's own addresses, one
/// `plan-addressing-differs` headline names every planned interface (with the address it has) and
/// nothing else is reported; with the fixture's addresses put into the plan, the host matches it exactly.
fn matches_up_to_addresses(mut p: Plan, name: &str) {
    let live = live(name);
    let mine: Vec<String> = p
        .links
        .iter()
        .filter_map(|l| l.side(1).map(|(me, _)| me.interface.clone()))
        .collect();
    assert!(!mine.is_empty());
    let f = check_host(&p, 1, &live);
    let rest: Vec<String> = problems(&f)
        .into_iter()
        .filter(|s| !s.starts_with("plan-addressing-differs "))
        .collect();
    assert!(rest.is_empty(), "{rest:#?}");
    for check in ["plan-address-missing", "plan-extra-address"] {
        assert!(of(&f, check).is_empty(), "{check}: {:#?}", of(&f, check));
    }
    let headline = of(&f, "plan-addressing-differs");
    assert_eq!(headline.len(), 1, "{headline:#?}");
    let msg = &headline[0].1;
    assert_eq!(msg.matches(", has 10.11").count(), mine.len(), "{msg}");
    for i in &mine {
        assert!(msg.contains(i.as_str()), "nothing about {i}: {msg}");
    }
    // The fixture's addresses in the plan: nothing is left to report.
    for l in &mut p.links {
        let Some(k) = l.ends.iter().position(|e| e.server == 1) else {
            continue;
        };
        let iface = &l.ends[k].interface;
        let got = live
            .iter()
            .find(|x| &x.name == iface)
            .and_then(|x| x.addrs.first().copied())
            .unwrap_or_else(|| panic!("{name}: no address on {iface}"));
        assert_eq!(got.prefix_len(), 30, "{name}: {iface} {got}");
        let net = u32::from(got.network());
        let peer = if u32::from(got.addr()) == net + 1 {
            net + 2
        } else {
            net + 1
        };
        let peer: std::net::Ipv4Addr = peer.into();
        l.subnet = got.trunc();
        l.ends[k].address = got;
        l.ends[1 - k].address = format!("{peer}/30").parse().unwrap();
    }
    let f = check_host(&p, 1, &live);
    assert!(problems(&f).is_empty(), "{:#?}", problems(&f));
    assert_eq!(of(&f, "plan-host-matches").len(), 1, "{f:#?}");
}

#[test]
fn b300_two_node_fixture_matches_the_plan() {
    let text: String = (1..=8).map(|k| format!("1-{k} > 2-{k}\n")).collect();
    matches_up_to_addresses(plan_of(&text), "b300-2node");
}

#[test]
fn b300_four_node_fixture_matches_the_plan() {
    let text = "1-1 > 2-1, 1-2 > 2-2\n1-3 > 3-3, 1-4 > 3-4\n1-5 > 4-5, 1-6 > 4-6\n2-3 > 3-1, 2-4 > 3-2\n2-5 > 4-3, 2-6 > 4-4\n3-5 > 4-1, 3-6 > 4-2\n";
    matches_up_to_addresses(plan_of(text), "b300-4node");
    // A plan that uses cable port 7 (down and unaddressed in this fixture) must not pass.
    let text2 = "1-7 > 2-1\n";
    let p2 = plan_of(text2);
    let f = check_host(&p2, 1, &live("b300-4node"));
    let down = of(&f, "plan-link-down");
    assert!(
        !down.is_empty(),
        "cable port 7 is down in the fixture: {f:#?}"
    );
}
