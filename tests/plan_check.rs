//! `check_host`: a live host compared with its part of a plan; one test per finding.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ipnet::Ipv4Net;
use switchless::findings::{Finding, Severity};
use switchless::tools::plan::{self, LiveIface, Options, Plan, PortMap, cables, check_host};

const TWO_NODE: &str = "1-1 > 2-1\n1-2 > 2-2\n";
const FOUR_NODE: &str = "1-1 > 2-1, 1-2 > 2-2\n1-3 > 3-3, 1-4 > 3-4\n1-5 > 4-5, 1-6 > 4-6\n2-3 > 3-1, 2-4 > 3-2\n2-5 > 4-3, 2-6 > 4-4\n3-5 > 4-1, 3-6 > 4-2\n";

/// The plan, read back from its JSON as `doctor --plan` will.
fn plan_of(text: &str, servers: Option<u32>) -> Plan {
    let map = PortMap::b300();
    let c = cables::parse("cables.txt", text, &map, servers).unwrap();
    let p = plan::build(&c, &map, &Options::default()).unwrap().plan;
    Plan::from_json(&p.to_json().unwrap()).unwrap()
}

/// A host that follows the plan exactly, plus a management interface.
fn healthy(p: &Plan, server: u32) -> Vec<LiveIface> {
    let mut v: Vec<LiveIface> = p
        .links_of(server)
        .map(|l| {
            let (me, _) = l.side(server).unwrap();
            LiveIface {
                name: me.interface.clone(),
                addrs: vec![me.address],
                mtu: p.mtu,
                up: true,
                rdma: true,
            }
        })
        .collect();
    v.push(LiveIface {
        name: "eno1".into(),
        addrs: vec![net("192.168.1.10/24")],
        mtu: 1500,
        up: true,
        rdma: false,
    });
    v
}

fn net(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

fn iface<'a>(live: &'a mut [LiveIface], name: &str) -> &'a mut LiveIface {
    live.iter_mut().find(|i| i.name == name).unwrap()
}

/// The findings other than the all-clear, as (check, object, severity).
fn checks(f: &[Finding]) -> Vec<(String, String, Severity)> {
    f.iter()
        .map(|f| (f.check.clone(), f.object.clone(), f.severity))
        .collect()
}

fn only(f: &[Finding], check: &str, object: &str, sev: Severity) -> Finding {
    assert_eq!(
        checks(f),
        vec![(check.to_string(), object.to_string(), sev)],
        "{f:#?}"
    );
    f[0].clone()
}

#[test]
fn healthy_host_matches() {
    let p = plan_of(TWO_NODE, None);
    for s in 1..=2 {
        let f = check_host(&p, s, &healthy(&p, s));
        let one = only(&f, "plan-host-matches", "plan", Severity::Info);
        assert!(
            one.message.contains("all 4 planned interfaces of server"),
            "{}",
            one.message
        );
    }
}

#[test]
fn unknown_server() {
    let p = plan_of(TWO_NODE, None);
    let f = check_host(&p, 3, &[]);
    only(&f, "plan-server-unknown", "plan", Severity::Error);
}

#[test]
fn server_without_links() {
    let p = plan_of(TWO_NODE, Some(3));
    let f = check_host(&p, 3, &healthy(&p, 3));
    only(&f, "plan-no-links", "plan", Severity::Warning);
}

#[test]
fn missing_interface() {
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 1);
    live.retain(|i| i.name != "eno7np0");
    let f = check_host(&p, 1, &live);
    let one = only(
        &f,
        "plan-interface-missing",
        "netdev eno7np0",
        Severity::Error,
    );
    assert!(one.message.contains("port 2"), "{}", one.message);
}

#[test]
fn link_down() {
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 2);
    iface(&mut live, "enp237s0f1np1").up = false;
    let f = check_host(&p, 2, &live);
    let one = only(
        &f,
        "plan-link-down",
        "netdev enp237s0f1np1",
        Severity::Error,
    );
    assert!(one.remedy.contains("server 1 port 1"), "{}", one.remedy);
}

#[test]
fn wrong_mtu() {
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 1);
    iface(&mut live, "eno6np0").mtu = 1500;
    let f = check_host(&p, 1, &live);
    let one = only(&f, "plan-mtu-mismatch", "netdev eno6np0", Severity::Error);
    assert!(
        one.message
            .contains("MTU 1500 bytes; the plan says 9000 bytes"),
        "{}",
        one.message
    );
    assert!(
        one.message.contains("RoCE runs at active_mtu 1024 bytes"),
        "{}",
        one.message
    );
    let mut live = healthy(&p, 1);
    iface(&mut live, "eno6np0").mtu = 9216;
    let f = check_host(&p, 1, &live);
    only(&f, "plan-mtu-mismatch", "netdev eno6np0", Severity::Warning);
}

#[test]
fn wrong_mtu_on_a_tcp_link_speaks_of_tcp() {
    // A netdev without RDMA: TCP takes the smaller MTU per connection; nothing about RoCE or drops.
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 1);
    let i = iface(&mut live, "eno6np0");
    i.mtu = 1500;
    i.rdma = false;
    let f = check_host(&p, 1, &live);
    let one = only(&f, "plan-mtu-mismatch", "netdev eno6np0", Severity::Error);
    assert!(one.message.contains("no jumbo frames"), "{}", one.message);
    assert!(!one.message.contains("RoCE"), "{}", one.message);
    assert!(!one.message.contains("are dropped"), "{}", one.message);
}

#[test]
fn missing_address() {
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 1);
    iface(&mut live, "eno7np0").addrs.clear();
    let f = check_host(&p, 1, &live);
    let one = only(
        &f,
        "plan-address-missing",
        "netdev eno7np0",
        Severity::Error,
    );
    assert!(
        one.remedy.contains("ip addr add 10.100.0.9/30 dev eno7np0"),
        "{}",
        one.remedy
    );
}

#[test]
fn wrong_prefix() {
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 1);
    iface(&mut live, "eno6np0").addrs = vec![net("10.100.0.1/16")];
    let f = check_host(&p, 1, &live);
    only(
        &f,
        "plan-prefix-mismatch",
        "netdev eno6np0",
        Severity::Error,
    );
}

#[test]
fn addresses_swapped_between_interfaces_to_the_same_peer() {
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 1);
    iface(&mut live, "eno6np0").addrs = vec![net("10.100.0.5/30")];
    iface(&mut live, "enp237s0f1np1").addrs = vec![net("10.100.0.1/30")];
    let f = check_host(&p, 1, &live);
    assert_eq!(
        checks(&f),
        vec![
            (
                "plan-address-on-wrong-interface".into(),
                "netdev enp237s0f1np1".into(),
                Severity::Error
            ),
            (
                "plan-address-on-wrong-interface".into(),
                "netdev eno6np0".into(),
                Severity::Error
            ),
        ],
        "{f:#?}"
    );
    assert!(
        f[0].message
            .contains("holds 10.100.0.1/30, planned for eno6np0"),
        "{}",
        f[0].message
    );
}

#[test]
fn address_on_an_interface_facing_another_peer() {
    // Server 1 of the full mesh: eno6np0 (port 1) faces server 2, eno8np0 (port 3) faces server 3.
    let p = plan_of(FOUR_NODE, None);
    let mut live = healthy(&p, 1);
    iface(&mut live, "eno6np0").addrs = vec![net("10.100.0.17/30")];
    iface(&mut live, "eno8np0").addrs = vec![net("10.100.0.1/30")];
    let f = check_host(&p, 1, &live);
    assert_eq!(
        checks(&f),
        vec![
            (
                "plan-cable-wrong-peer".into(),
                "netdev eno8np0".into(),
                Severity::Error
            ),
            (
                "plan-cable-wrong-peer".into(),
                "netdev eno6np0".into(),
                Severity::Error
            ),
        ],
        "{f:#?}"
    );
    assert!(f[0].message.contains("to server 3"), "{}", f[0].message);
    assert!(
        f[0].remedy
            .contains("cable server 1 port 1 to server 2 port 1"),
        "{}",
        f[0].remedy
    );
}

#[test]
fn address_of_another_server() {
    let p = plan_of(TWO_NODE, None);
    // Server 2's configuration applied on server 1.
    let live = healthy(&p, 2);
    let f = check_host(&p, 1, &live);
    assert!(!f.is_empty());
    assert!(
        f.iter().all(|f| f.check == "plan-address-missing" || f.check == "plan-address-of-other-server"),
        "{f:#?}"
    );
    assert_eq!(
        f.iter()
            .filter(|f| f.check == "plan-address-of-other-server")
            .count(),
        4
    );
    let o = f
        .iter()
        .find(|f| f.check == "plan-address-of-other-server")
        .unwrap();
    assert!(
        o.message.contains("which the plan gives to server 2"),
        "{}",
        o.message
    );
}

#[test]
fn stray_address_in_a_link_subnet() {
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 1);
    iface(&mut live, "eno6np0").addrs.push(net("10.100.0.3/30"));
    let f = check_host(&p, 1, &live);
    only(&f, "plan-address-stray", "netdev eno6np0", Severity::Error);
}

#[test]
fn unplanned_address_in_the_range() {
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 1);
    // Port 7 (eno12np0) has no cable in the plan; an old address lingers on it.
    live.push(LiveIface {
        name: "eno12np0".into(),
        addrs: vec![net("10.100.9.1/30")],
        mtu: 9000,
        up: true,
        rdma: false,
    });
    let f = check_host(&p, 1, &live);
    only(
        &f,
        "plan-address-unplanned",
        "netdev eno12np0",
        Severity::Warning,
    );
}

#[test]
fn extra_address_on_a_mesh_port() {
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 1);
    iface(&mut live, "eno7np0")
        .addrs
        .push(net("169.254.3.4/16"));
    let f = check_host(&p, 1, &live);
    only(
        &f,
        "plan-extra-address",
        "netdev eno7np0",
        Severity::Warning,
    );
}

#[test]
fn planned_address_on_two_interfaces() {
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 1);
    live.push(LiveIface {
        name: "eno12np0".into(),
        addrs: vec![net("10.100.0.1/30")],
        mtu: 9000,
        up: true,
        rdma: false,
    });
    let f = check_host(&p, 1, &live);
    let one = only(
        &f,
        "plan-address-on-wrong-interface",
        "netdev eno12np0",
        Severity::Error,
    );
    assert!(
        one.message.contains("also holds 10.100.0.1/30"),
        "{}",
        one.message
    );
}

#[test]
fn missing_interface_whose_address_moved() {
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 1);
    live.retain(|i| i.name != "eno6np0");
    live.push(LiveIface {
        name: "eth9".into(),
        addrs: vec![net("10.100.0.1/30")],
        mtu: 9000,
        up: true,
        rdma: false,
    });
    let f = check_host(&p, 1, &live);
    assert_eq!(
        checks(&f),
        vec![
            (
                "plan-interface-missing".into(),
                "netdev eno6np0".into(),
                Severity::Error
            ),
            (
                "plan-address-on-wrong-interface".into(),
                "netdev eth9".into(),
                Severity::Error
            ),
        ],
        "{f:#?}"
    );
}

#[test]
fn check_ids_are_kebab_case_and_findings_have_remedies() {
    let p = plan_of(FOUR_NODE, None);
    let mut live = healthy(&p, 2);
    live[0].up = false;
    live[1].mtu = 1500;
    live[2].addrs = vec![net("10.100.0.3/30"), net("172.16.0.1/24")];
    for f in check_host(&p, 2, &live) {
        assert!(f.check.starts_with("plan-"));
        assert!(
            f.check.chars().all(|c| c.is_ascii_lowercase() || c == '-'),
            "{}",
            f.check
        );
        assert!(!f.remedy.is_empty());
        assert!(!f.message.is_empty());
    }
}

#[test]
fn server_auto_picks_the_server_whose_addresses_the_host_holds() {
    let p = plan_of(FOUR_NODE, None);
    for s in 1..=4 {
        assert_eq!(plan::check::pick_server(&p, &healthy(&p, s), None), Ok(s));
    }
    // Before the plan is applied the host holds none: auto says what to do instead.
    let e = plan::check::pick_server(&p, &[], Some("b300-001")).unwrap_err();
    assert!(e.contains("give --server N"), "{e}");
}

#[test]
fn another_addressing_plan_is_one_headline() {
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 1);
    for i in live.iter_mut().filter(|i| i.name != "eno1") {
        let other = net(&format!("10.112.{}.1/30", i.addrs[0].addr().octets()[3]));
        i.addrs = vec![other];
    }
    let f = check_host(&p, 1, &live);
    let one = only(&f, "plan-addressing-differs", "plan", Severity::Error);
    assert!(
        one.message.contains("none of the 4 addresses"),
        "{}",
        one.message
    );
    // One planned address in place: the details, not the headline.
    let mut live = healthy(&p, 1);
    iface(&mut live, "eno7np0").addrs = vec![net("10.112.9.1/30")];
    let f = check_host(&p, 1, &live);
    assert!(
        f.iter().all(|f| f.check != "plan-addressing-differs"),
        "{f:#?}"
    );
}

#[test]
fn another_model_is_one_headline() {
    let p = plan_of(TWO_NODE, None);
    let live = vec![LiveIface {
        name: "enp1s0f0np0".into(),
        addrs: vec![],
        mtu: 9000,
        up: true,
        rdma: false,
    }];
    let f = check_host(&p, 1, &live);
    let one = only(&f, "plan-model-mismatch", "plan", Severity::Error);
    assert!(
        one.message.contains("looks like model gb10"),
        "{}",
        one.message
    );
    // A GB10 applied as server 1 of a plan made without --model gb10: its addresses are the plan's
    // (both slot formulas agree on server 1), on interfaces the B300 plan does not name. That is
    // the model, not four addresses on wrong interfaces: the headline stands alone.
    let live: Vec<LiveIface> = ["enp1s0f0np0", "enP2p1s0f0np0"]
        .iter()
        .zip(["10.100.0.1/30", "10.100.0.5/30"])
        .map(|(n, a)| LiveIface {
            name: n.to_string(),
            addrs: vec![net(a)],
            mtu: 9000,
            up: true,
            rdma: true,
        })
        .collect();
    let f = check_host(&p, 1, &live);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].check, "plan-model-mismatch");
}

// ---------- reading a host: `ip -j addr show`, captured from network namespaces set up by the plan's ip commands ----------

fn captured(name: &str) -> Vec<LiveIface> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/plan")
        .join(name);
    plan::live_from_ip_json(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn reads_ip_json() {
    let live = captured("ip-addr-server1-bad.json");
    assert_eq!(live.len(), 17);
    let lo = &live[0];
    assert_eq!((lo.name.as_str(), lo.up, lo.mtu), ("lo", true, 65536));
    assert_eq!(lo.addrs, vec![net("127.0.0.1/8")]);
    let e = live.iter().find(|i| i.name == "eno9np0").unwrap();
    assert_eq!(e.addrs, vec![net("10.100.0.25/30"), net("169.254.7.7/16")]);
    assert!(!live.iter().find(|i| i.name == "eno8np0").unwrap().up);
    assert_eq!(live.iter().find(|i| i.name == "eno7np0").unwrap().mtu, 1500);
    let e = plan::live_from_ip_json("{").unwrap_err().to_string();
    assert!(e.contains("`ip -j addr show` output"), "{e}");
}

#[test]
fn captured_host_after_the_ip_commands_matches() {
    let p = plan_of(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/plan/b300-2node.cables"),
        )
        .unwrap(),
        None,
    );
    let f = check_host(&p, 1, &captured("ip-addr-server1-ok.json"));
    only(&f, "plan-host-matches", "plan", Severity::Info);
}

#[test]
fn captured_host_with_faults() {
    let p = plan_of(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/plan/b300-2node.cables"),
        )
        .unwrap(),
        None,
    );
    let f = check_host(&p, 1, &captured("ip-addr-server1-bad.json"));
    assert_eq!(
        checks(&f),
        vec![
            (
                "plan-mtu-mismatch".into(),
                "netdev eno7np0".into(),
                Severity::Error
            ),
            (
                "plan-link-down".into(),
                "netdev eno8np0".into(),
                Severity::Error
            ),
            (
                "plan-address-missing".into(),
                "netdev eno11np0".into(),
                Severity::Error
            ),
            (
                "plan-extra-address".into(),
                "netdev eno9np0".into(),
                Severity::Warning
            ),
        ],
        "{f:#?}"
    );
}

// ---------- properties ----------

use proptest::prelude::*;

/// A random valid B300 cable set: (servers, cables file text).
fn cable_set() -> impl Strategy<Value = (u32, String)> {
    (2u32..=6).prop_flat_map(|n| {
        prop::collection::vec((1..=n, 1u32..=8, 1..=n, 1u32..=8), 1..30).prop_map(move |cands| {
            let mut used = std::collections::BTreeSet::new();
            let mut lines = Vec::new();
            for (s1, p1, s2, p2) in cands {
                if s1 == s2 || used.contains(&(s1, p1)) || used.contains(&(s2, p2)) {
                    continue;
                }
                used.insert((s1, p1));
                used.insert((s2, p2));
                lines.push(format!("{s1}-{p1} > {s2}-{p2}"));
            }
            if lines.is_empty() {
                lines.push("1-1 > 2-1".into());
            }
            (n, lines.join("\n"))
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// A host configured exactly as planned is clean; swapping the addresses of two of its interfaces never is.
    #[test]
    fn healthy_is_clean_and_swaps_are_caught((n, text) in cable_set(), pick in any::<(u32, usize, usize)>()) {
        let p = plan_of(&text, Some(n));
        let server = pick.0 % n + 1;
        let live = healthy(&p, server);
        let f = check_host(&p, server, &live);
        let want = if p.links_of(server).count() == 0 { "plan-no-links" } else { "plan-host-matches" };
        prop_assert_eq!(f.len(), 1, "{:#?}", f);
        prop_assert_eq!(f[0].check.as_str(), want);
        let planned = live.len() - 1; // without the management interface
        if planned >= 2 {
            let (i, j) = (pick.1 % planned, pick.2 % planned);
            if i != j {
                let mut swapped = live.clone();
                let a = swapped[i].addrs.clone();
                swapped[i].addrs = swapped[j].addrs.clone();
                swapped[j].addrs = a;
                let f = check_host(&p, server, &swapped);
                prop_assert_eq!(f.iter().filter(|f| f.severity == Severity::Error).count(), 2, "{:#?}", f);
                prop_assert!(f.iter().all(|f| f.check == "plan-address-on-wrong-interface" || f.check == "plan-cable-wrong-peer"));
            }
        }
    }

    #[test]
    fn ip_json_reader_never_panics(text in "\\PC{0,300}") {
        let _ = plan::live_from_ip_json(&text);
    }
}

#[test]
fn a_wrong_address_in_place_of_the_planned_one_is_one_finding() {
    // eno6np0 holds server 2's address instead of its own: one finding, whose remedy swaps them.
    let p = plan_of(TWO_NODE, None);
    let mut live = healthy(&p, 1);
    iface(&mut live, "eno6np0").addrs = vec![net("10.100.0.2/29")];
    let f = check_host(&p, 1, &live);
    let on: Vec<&str> = f
        .iter()
        .filter(|x| x.object == "netdev eno6np0")
        .map(|x| x.check.as_str())
        .collect();
    assert_eq!(on, ["plan-address-of-other-server"], "{f:#?}");
    let one = only(
        &f,
        "plan-address-of-other-server",
        "netdev eno6np0",
        Severity::Error,
    );
    assert!(
        one.message
            .contains("its planned address 10.100.0.1/30 is missing"),
        "{}",
        one.message
    );
    assert_eq!(
        one.remedy,
        "ip addr del 10.100.0.2/29 dev eno6np0 && ip addr add 10.100.0.1/30 dev eno6np0   # the plan's address"
    );
}
