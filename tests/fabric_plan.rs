//! The B300 fixtures agree with the plan `switchless plan` builds from the same cables: the same
//! interfaces (cable port → card → np0/np1 map of nccl-net-abi.md §5.2), up, with the planned MTU. The
//! fixtures use the sionic 10.1ab.k.x addresses and the plan its own sequential /30s, so the only
//! differences `plan::check_host` may report are the addresses themselves: one `plan-addressing-differs`
//! headline, naming each planned interface's planned and present address, in place of a missing planned
//! address and an extra address per planned interface.
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
        .filter(|f| f.check != "plan-addressing-differs")
        .map(|f| format!("{} {}: {}", f.check, f.object, f.message))
        .collect()
}

fn count(f: &[switchless::findings::Finding], check: &str) -> usize {
    f.iter().filter(|f| f.check == check).count()
}

#[test]
fn b300_two_node_fixture_matches_the_plan() {
    let text: String = (1..=8).map(|k| format!("1-{k} > 2-{k}\n")).collect();
    let p = plan_of(&text);
    let f = check_host(&p, 1, &live("b300-2node"));
    assert!(problems(&f).is_empty(), "{:#?}", problems(&f));
    assert_eq!(count(&f, "plan-addressing-differs"), 1);
    assert_eq!(count(&f, "plan-address-missing"), 0);
    assert_eq!(count(&f, "plan-extra-address"), 0);
    let headline = f
        .iter()
        .find(|f| f.check == "plan-addressing-differs")
        .unwrap();
    assert_eq!(
        headline.message.matches(", has 10.11").count(),
        16,
        "{}",
        headline.message
    );
}

#[test]
fn b300_four_node_fixture_matches_the_plan() {
    let text = "1-1 > 2-1, 1-2 > 2-2\n1-3 > 3-3, 1-4 > 3-4\n1-5 > 4-5, 1-6 > 4-6\n2-3 > 3-1, 2-4 > 3-2\n2-5 > 4-3, 2-6 > 4-4\n3-5 > 4-1, 3-6 > 4-2\n";
    let p = plan_of(text);
    let f = check_host(&p, 1, &live("b300-4node"));
    assert!(problems(&f).is_empty(), "{:#?}", problems(&f));
    assert_eq!(count(&f, "plan-addressing-differs"), 1);
    assert_eq!(count(&f, "plan-address-missing"), 0);
    assert_eq!(count(&f, "plan-extra-address"), 0);
    let headline = f
        .iter()
        .find(|f| f.check == "plan-addressing-differs")
        .unwrap();
    assert_eq!(
        headline.message.matches(", has 10.11").count(),
        12,
        "{}",
        headline.message
    );
    // A plan that uses cable port 7 (down and unaddressed in this fixture) must not pass.
    let text2 = "1-7 > 2-1\n";
    let p2 = plan_of(text2);
    let f = check_host(&p2, 1, &live("b300-4node"));
    assert!(
        !problems(&f).is_empty(),
        "cable port 7 is down in the fixture"
    );
}
