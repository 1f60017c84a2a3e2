//! `switchless plan`: expected plans for the seed's cases, golden outputs, JSON round trips, every input error,
//! properties of random cable sets, and the CLI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ipnet::Ipv4Net;
use proptest::prelude::*;
use switchless::tools::plan::render::{self, Format};
use switchless::tools::plan::{self, Options, Plan, PortMap, cables};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/plan")
        .join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).unwrap()
}

fn plan_with(cables_text: &str, map: &PortMap, opts: &Options) -> Plan {
    let c = cables::parse("cables.txt", cables_text, map, None).unwrap();
    plan::build(&c, map, opts).unwrap().plan
}

fn b300(cables_text: &str) -> Plan {
    plan_with(cables_text, &PortMap::b300(), &Options::default())
}

/// (interface, address, peer interface, peer address) of `server`'s end of the link on `port`, function `f`.
fn end_of(p: &Plan, server: u32, port: u32, f: u32) -> (String, String, u32, String, String) {
    let l = p
        .links
        .iter()
        .find(|l| {
            l.function == f
                && l.side(server)
                    .map(|(me, _)| me.port == port)
                    .unwrap_or(false)
        })
        .unwrap_or_else(|| panic!("no link on server {server} port {port} function {f}"));
    let (me, peer) = l.side(server).unwrap();
    (
        me.interface.clone(),
        me.address.to_string(),
        peer.server,
        peer.interface.clone(),
        peer.address.to_string(),
    )
}

#[test]
fn seed_002_two_nodes_eight_cables() {
    let p = b300(&read("b300-2node.cables"));
    assert_eq!(p.servers, 2);
    assert_eq!(p.links.len(), 16, "8 cables × np0 and np1");
    // Port 1 → card 7 → eno6np0 / enp237s0f1np1 (the B300 port map).
    assert_eq!(
        end_of(&p, 1, 1, 0),
        (
            "eno6np0".into(),
            "10.100.0.1/30".into(),
            2,
            "eno6np0".into(),
            "10.100.0.2/30".into()
        )
    );
    assert_eq!(
        end_of(&p, 1, 1, 1),
        (
            "enp237s0f1np1".into(),
            "10.100.0.5/30".into(),
            2,
            "enp237s0f1np1".into(),
            "10.100.0.6/30".into()
        )
    );
    // Port 2 → card 4 → eno7np0.
    assert_eq!(end_of(&p, 2, 2, 0).0, "eno7np0");
    assert_eq!(end_of(&p, 2, 2, 0).1, "10.100.0.10/30");
    // Port 8 → card 2 → enp95s0f1np1, slot 15.
    assert_eq!(
        end_of(&p, 2, 8, 1),
        (
            "enp95s0f1np1".into(),
            "10.100.0.62/30".into(),
            1,
            "enp95s0f1np1".into(),
            "10.100.0.61/30".into()
        )
    );
}

#[test]
fn four_nodes_twelve_cables_full_mesh() {
    let p = b300(&read("b300-4node.cables"));
    assert_eq!(p.servers, 4);
    assert_eq!(p.links.len(), 24);
    for s in 1..=4 {
        assert_eq!(p.links_of(s).count(), 12, "server {s}: 6 cables × 2");
        let peers: BTreeSet<u32> = p.links_of(s).map(|l| l.side(s).unwrap().1.server).collect();
        assert_eq!(peers.len(), 3, "server {s} reaches the 3 others");
    }
    // srv2↔srv3: `2-3 > 3-1`: server 2's eno8np0 (port 3) to server 3's eno6np0 (port 1); slot (1·8+2)·2 = 20.
    assert_eq!(
        end_of(&p, 2, 3, 0),
        (
            "eno8np0".into(),
            "10.100.0.81/30".into(),
            3,
            "eno6np0".into(),
            "10.100.0.82/30".into()
        )
    );
    // srv3↔srv4 second cable, np1: `3-6 > 4-2`: slot (2·8+5)·2+1 = 43 → 10.100.0.172/30.
    assert_eq!(
        end_of(&p, 4, 2, 1),
        (
            "enp151s0f1np1".into(),
            "10.100.0.174/30".into(),
            3,
            "enp112s0f1np1".into(),
            "10.100.0.173/30".into()
        )
    );
    // srv1↔srv4: `1-6 > 4-6`, np0: slot 10.
    assert_eq!(end_of(&p, 1, 6, 0).1, "10.100.0.41/30");
    assert_eq!(end_of(&p, 4, 6, 0).1, "10.100.0.42/30");
}

#[test]
fn gb10_pairs_both_multi_host_functions() {
    let map = PortMap::gb10();
    let p = plan_with(&read("gb10-3ring.cables"), &map, &Options::default());
    assert_eq!(p.links.len(), 6);
    assert_eq!(
        end_of(&p, 1, 1, 0),
        (
            "enp1s0f0np0".into(),
            "10.100.0.1/30".into(),
            2,
            "enp1s0f1np1".into(),
            "10.100.0.2/30".into()
        )
    );
    assert_eq!(
        end_of(&p, 1, 1, 1),
        (
            "enP2p1s0f0np0".into(),
            "10.100.0.5/30".into(),
            2,
            "enP2p1s0f1np1".into(),
            "10.100.0.6/30".into()
        )
    );
    // `3-1 > 1-2`: the lower end is server 1 port 2: slot 2.
    assert_eq!(end_of(&p, 3, 1, 0).1, "10.100.0.10/30");
}

#[test]
fn prefix_31_and_other_base() {
    let opts = Options {
        base: "192.168.64.0/20".parse().unwrap(),
        prefix: 31,
        mtu: 9000,
    };
    let p = plan_with(&read("b300-2node.cables"), &PortMap::b300(), &opts);
    assert_eq!(end_of(&p, 1, 1, 0).1, "192.168.64.0/31");
    assert_eq!(end_of(&p, 2, 1, 0).1, "192.168.64.1/31");
    assert_eq!(end_of(&p, 1, 8, 1).1, "192.168.64.30/31");
    assert_eq!(end_of(&p, 2, 8, 1).1, "192.168.64.31/31");
}

#[test]
fn appending_or_reordering_cables_renumbers_nothing() {
    let text = read("b300-4node.cables");
    let mut fewer: Vec<&str> = text.lines().collect();
    fewer.pop();
    let before = b300(&fewer.join("\n"));
    let after = b300(&text);
    for l in &before.links {
        let same = after.links.iter().find(|m| m.id == l.id).unwrap();
        assert_eq!(same, l);
    }
    let mut reversed: Vec<&str> = text.lines().collect();
    reversed.reverse();
    let rev = b300(&reversed.join("\n"));
    for (a, b) in rev.links.iter().zip(&after.links) {
        assert_eq!((a.id, &a.subnet, &a.ends), (b.id, &b.subnet, &b.ends));
    }
}

#[test]
fn range_too_small_is_an_error_naming_the_need() {
    let map = PortMap::b300();
    let c = cables::parse("cables.txt", &read("b300-4node.cables"), &map, None).unwrap();
    let opts = Options {
        base: "10.9.0.0/25".parse().unwrap(),
        ..Options::default()
    };
    let e = plan::build(&c, &map, &opts).unwrap_err().to_string();
    assert!(e.contains("--base 10.9.0.0/25 holds 128 addresses"), "{e}");
    assert!(e.contains("24 links need 96 addresses"), "{e}");
    assert!(e.contains("give --base a /24 or larger range"), "{e}");
    let opts = Options {
        base: "10.9.0.0/24".parse().unwrap(),
        ..Options::default()
    };
    assert!(plan::build(&c, &map, &opts).is_ok());
}

#[test]
fn bad_options_are_errors() {
    let map = PortMap::b300();
    let c = cables::parse("cables.txt", "1-1 > 2-1", &map, None).unwrap();
    for (opts, want) in [
        (
            Options {
                mtu: 100,
                ..Options::default()
            },
            "--mtu 100: accepted are 1280..=9978 bytes",
        ),
        (
            Options {
                base: "10.1.2.3/16".parse().unwrap(),
                ..Options::default()
            },
            "has host bits set; give the network address, e.g. 10.1.0.0/16",
        ),
        (
            Options {
                prefix: 29,
                ..Options::default()
            },
            "--prefix 29",
        ),
    ] {
        let e = plan::build(&c, &map, &opts).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn warnings_for_idle_servers_and_low_mtu() {
    let map = PortMap::b300();
    let c = cables::parse("cables.txt", "1-1 > 2-1", &map, Some(3)).unwrap();
    let b = plan::build(
        &c,
        &map,
        &Options {
            mtu: 1500,
            ..Options::default()
        },
    )
    .unwrap();
    assert!(b.warnings.iter().any(|w| w == "server 3 has no cable"));
    assert!(b.warnings.iter().any(|w| w.contains("--mtu 1500 bytes")));
}

// ---------- input errors: each names the file and the line ----------

#[test]
fn every_cables_error_names_file_and_line() {
    let map = PortMap::b300();
    let cases: &[(&str, Option<u32>, &str)] = &[
        (
            "1-1 2-1",
            None,
            "cables.txt:1: `1-1 2-1` has no `>`; expected `SERVER-PORT > SERVER-PORT`",
        ),
        (
            "\n1-1 > 2-1 > 3-1",
            None,
            "cables.txt:2: `1-1 > 2-1 > 3-1` has more than one `>`",
        ),
        (
            "1-1 > 2",
            None,
            "cables.txt:1: `2` in `1-1 > 2` is not `SERVER-PORT`",
        ),
        // A server is a number or a host name; mixing numbers with undeclared names is refused.
        (
            "a!-1 > 2-1",
            None,
            "cables.txt:1: `a!` in `a!-1 > 2-1` is not a server number or host name",
        ),
        (
            "a-1 > 2-1",
            None,
            "cables.txt:1: the file names servers by number here and by host name elsewhere (a, line 1)",
        ),
        (
            "1-1 > 2-one",
            None,
            "cables.txt:1: `one` in `1-1 > 2-one` is not a port number",
        ),
        (
            "1-0 > 2-1",
            None,
            "cables.txt:1: port 0 in `1-0 > 2-1`: ports are numbered from 1",
        ),
        (
            "#\n1-1 > 0-1",
            None,
            "cables.txt:2: server 0 in `1-1 > 0-1`: servers are numbered from 1",
        ),
        (
            "1-1 > 3-1",
            Some(2),
            "--servers 2 allows servers 1..=2, but the cables file names server 3:\n  cables.txt:1: `1-1 > 3-1` names server 3",
        ),
        (
            "1-9 > 2-1",
            None,
            "cables.txt:1: port 9 (server 1) in `1-9 > 2-1` is not in the built-in map b300 (ports 1-8)",
        ),
        (
            "1-1 > 1-2",
            None,
            "cables.txt:1: `1-1 > 1-2` joins server 1 to itself",
        ),
        (
            "1-1 > 2-1\n1-1 > 3-1",
            None,
            "cables.txt:2: port 1 of server 1 is used twice: the cable at line 1 already uses it",
        ),
        (
            "1-1 > 2-1\n\n2-1 > 1-1",
            None,
            "cables.txt:3: `2-1 > 1-1` repeats the cable at line 1",
        ),
        ("# nothing\n", None, "cables.txt: names no cable"),
    ];
    for (text, servers, want) in cases {
        let e = cables::parse("cables.txt", text, &map, *servers)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "input {text:?}: got {e}");
    }
}

#[test]
fn cables_errors_are_all_collected() {
    let map = PortMap::b300();
    let e = cables::parse(
        "cables.txt",
        "1-1 > 2-1\n1-1 > 3-1\n1-x > 2-2\n2-2 > 2-3\n",
        &map,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("invalid configuration: cables.txt: 3 errors in the cables file:"),
        "{e}"
    );
    // In line order, whether the error is one of syntax (line 3) or of meaning (lines 2 and 4).
    let at = |l: &str| {
        e.find(&format!("cables.txt{l}"))
            .unwrap_or_else(|| panic!("{l} missing: {e}"))
    };
    assert!(at(":2:") < at(":3:") && at(":3:") < at(":4:"), "{e}");
}

#[test]
fn map_file_lacking_a_port_is_named() {
    let map_path = fixture("custom.map");
    let map = PortMap::load(map_path.to_str().unwrap()).unwrap();
    assert_eq!(map.name, "lab-box");
    let e = cables::parse("cables.txt", "1-1 > 2-1\n1-4 > 2-4\n", &map, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "cables.txt:2: port 4 (server 1) in `1-4 > 2-4` is not in the port map {} (ports 1-3)",
            map_path.display()
        )),
        "{e}"
    );
}

#[test]
fn every_map_file_error_names_file_and_line() {
    let cases: &[(&str, &str)] = &[
        ("1 = a\nbogus\n", "map.txt:2: `bogus` has no `=`"),
        ("zero = a\n", "map.txt:1: `zero` is not a port number"),
        ("0 = a\n", "map.txt:1: `0` is not a port number"),
        ("1 =\n", "map.txt:1: port 1 lists no interface"),
        (
            "1 = a\n1 = b\n",
            "map.txt:2: port 1 is already defined at line 1",
        ),
        (
            "1 = a\n2 = a\n",
            "map.txt:2: interface a is already listed at line 1",
        ),
        (
            "1 = a/b\n",
            "map.txt:1: `a/b` is not an accepted interface name",
        ),
        (
            "1 = a;reboot\n",
            "map.txt:1: `a;reboot` is not an accepted interface name",
        ),
        (
            "name = x\nname = y\n1 = a\n",
            "map.txt:2: `name` is given twice",
        ),
        (
            "name = two words\n1 = a\n",
            "map.txt:1: `name =` needs one word",
        ),
        ("# empty\n", "map.txt: defines no port"),
    ];
    for (text, want) in cases {
        let e = PortMap::parse("map.txt", text).unwrap_err().to_string();
        assert!(e.contains(want), "input {text:?}: got {e}");
    }
}

#[test]
fn unknown_model_is_an_error() {
    let e = PortMap::load("/nonexistent/model.map")
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a built-in model (b300, gb10)"), "{e}");
}

// ---------- JSON ----------

#[test]
fn json_round_trips() {
    for (cables_file, map) in [
        ("b300-2node.cables", PortMap::b300()),
        ("b300-4node.cables", PortMap::b300()),
        ("gb10-3ring.cables", PortMap::gb10()),
        (
            "custom.cables",
            PortMap::load(fixture("custom.map").to_str().unwrap()).unwrap(),
        ),
    ] {
        let p = plan_with(&read(cables_file), &map, &Options::default());
        let json = p.to_json().unwrap();
        let back = Plan::from_json(&json).unwrap();
        assert_eq!(back, p, "{cables_file}");
        assert_eq!(back.to_json().unwrap(), json, "{cables_file}");
    }
}

#[test]
fn json_schema_fields() {
    let p = b300(&read("b300-2node.cables"));
    let v: serde_json::Value = serde_json::from_str(&p.to_json().unwrap()).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["addressing"]["base"], "10.100.0.0/16");
    assert_eq!(v["addressing"]["prefix"], 30);
    assert_eq!(v["server_count"], 2);
    assert_eq!(v["mtu"], 9000);
    assert_eq!(v["servers"][0]["server"], 1);
    let i0 = &v["servers"][0]["interfaces"][0];
    assert_eq!(i0["interface"], "eno6np0");
    assert_eq!(i0["address"], "10.100.0.1/30");
    assert_eq!(i0["subnet"], "10.100.0.0/30");
    assert_eq!(i0["peer"]["server"], 2);
    assert_eq!(i0["peer"]["address"], "10.100.0.2");
    assert_eq!(v["links"][0]["ends"][1]["address"], "10.100.0.2/30");
    assert_eq!(v["verified"]["distinct_subnets"], 16);
    assert_eq!(v["verified"]["distinct_addresses"], 32);
}

#[test]
fn json_rejects_bad_plans() {
    let p = b300(&read("b300-2node.cables"));
    let json = p.to_json().unwrap();
    let cases: Vec<(String, &str)> = vec![
        (
            json.replace("\"schema_version\": 1", "\"schema_version\": 2"),
            "schema_version 2 is not supported",
        ),
        (
            json.replace("\"schema_version\": 1,", ""),
            "no numeric `schema_version`",
        ),
        ("{".into(), "plan JSON:"),
        (
            // Two links in one subnet.
            json.replace(
                "\"subnet\": \"10.100.0.4/30\"",
                "\"subnet\": \"10.100.0.0/30\"",
            ),
            "plan JSON:",
        ),
        (
            // Address moved into another link's subnet.
            json.replacen(
                "\"address\": \"10.100.0.6/30\"",
                "\"address\": \"10.100.0.2/30\"",
                1,
            ),
            "plan JSON:",
        ),
        (
            json.replace("\"distinct_addresses\": 32", "\"distinct_addresses\": 31"),
            "`verified` says",
        ),
    ];
    for (text, want) in cases {
        let e = Plan::from_json(&text).unwrap_err().to_string();
        assert!(e.contains(want), "want {want}: got {e}");
    }
}

// ---------- golden outputs ----------

fn golden(name: &str, got: &str) {
    let path = fixture(&format!("golden/{name}"));
    let got = got.replace(
        &format!("switchless {}", switchless::VERSION),
        "switchless VERSION",
    );
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        // Rewritten files compare nothing: golden_outputs writes them all, then fails, so a run
        // with UPDATE_GOLDEN never passes.
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create)",
            path.display()
        )
    });
    assert_eq!(
        got,
        want,
        "{} differs (UPDATE_GOLDEN=1 rewrites it)",
        path.display()
    );
}

#[test]
fn golden_outputs() {
    let cases = [
        ("b300-2node", PortMap::b300()),
        ("b300-4node", PortMap::b300()),
        ("gb10-3ring", PortMap::gb10()),
    ];
    let formats = [
        (Format::Table, "table.txt"),
        (Format::Json, "json"),
        (Format::Ip, "ip.sh"),
        (Format::Netplan, "netplan.yaml"),
        (Format::Networkd, "networkd.txt"),
        (Format::Sysctl, "sysctl.conf"),
    ];
    for (name, map) in cases {
        let p = plan_with(&read(&format!("{name}.cables")), &map, &Options::default());
        for (format, ext) in formats {
            let files = render::render(&p, format, None).unwrap();
            golden(&format!("{name}.{ext}"), &render::to_stdout(&files));
        }
        let files = render::render(&p, Format::Ip, Some(2)).unwrap();
        golden(&format!("{name}.server2.ip.sh"), &render::to_stdout(&files));
    }
    assert!(
        std::env::var_os("UPDATE_GOLDEN").is_none(),
        "UPDATE_GOLDEN: the golden files were rewritten, not compared; review `git diff`, then \
         rerun without UPDATE_GOLDEN"
    );
}

/// The golden tables have a check of their own: each row of `*.table.txt`, read back as text,
/// equals the same interface of the golden JSON (the JSON and the ip/netplan/networkd files are
/// checked for real by `.ci/steps/40-plan.sh`, with netplan and network namespaces). A table that
/// showed another address, peer or subnet than the plan fails here, whoever rewrote the golden file.
#[test]
fn golden_tables_agree_with_the_golden_json() {
    for name in ["b300-2node", "b300-4node", "gb10-3ring"] {
        let table = read(&format!("golden/{name}.table.txt"));
        let json: serde_json::Value =
            serde_json::from_str(&read(&format!("golden/{name}.json"))).unwrap();
        let mut want = Vec::new();
        for srv in json["servers"].as_array().unwrap() {
            let s = srv["server"].as_u64().unwrap();
            for i in srv["interfaces"].as_array().unwrap() {
                let link = i["link"].as_u64().unwrap();
                let line = json["links"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|l| l["id"].as_u64() == Some(link))
                    .unwrap()["line"]
                    .as_u64()
                    .unwrap();
                let peer = &i["peer"];
                want.push(format!(
                    "{s} {} {} {} server {} port {} {} {} {} (link {link}, line {line})",
                    i["port"],
                    i["interface"].as_str().unwrap(),
                    i["address"].as_str().unwrap(),
                    peer["server"],
                    peer["port"],
                    peer["interface"].as_str().unwrap(),
                    peer["address"].as_str().unwrap(),
                    i["subnet"].as_str().unwrap(),
                ));
            }
        }
        let mut got = Vec::new();
        let mut server = 0;
        for l in table.lines() {
            if let Some(rest) = l.strip_prefix("server ") {
                server = rest.split(':').next().unwrap().parse().unwrap();
            } else if l.starts_with("  ") && !l.trim_start().starts_with("port ") {
                let w: Vec<&str> = l.split_whitespace().collect();
                got.push(format!("{server} {}", w.join(" ")));
            }
        }
        assert!(!want.is_empty());
        assert_eq!(got, want, "{name}: table rows vs JSON interfaces");
    }
}

#[test]
fn server_filter() {
    let p = b300(&read("b300-4node.cables"));
    let files = render::render(&p, Format::Netplan, Some(3)).unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].path, "server3.yaml");
    let files = render::render(&p, Format::Networkd, Some(3)).unwrap();
    assert_eq!(files.len(), 12);
    assert!(files.iter().all(|f| f.path.starts_with("server3/")));
    let table = &render::render(&p, Format::Table, Some(3)).unwrap()[0].text;
    assert!(table.contains("server 3: 12 links"));
    assert!(!table.contains("server 1: "));
    let json = &render::render(&p, Format::Json, Some(3)).unwrap()[0].text;
    let back = Plan::from_json(json).unwrap();
    assert_eq!(back.links.len(), 12);
    assert!(back.links.iter().all(|l| l.side(3).is_some()));
    let e = render::render(&p, Format::Table, Some(5))
        .unwrap_err()
        .to_string();
    assert!(e.contains("--server 5: the plan has servers 1..=4"), "{e}");
}

/// Every netplan file is YAML netplan can read: version 2, one entry per planned interface, its address and MTU.
#[test]
fn netplan_yaml_parses() {
    use yaml_rust2::YamlLoader;
    for (name, map) in [
        ("b300-4node", PortMap::b300()),
        ("gb10-3ring", PortMap::gb10()),
    ] {
        let p = plan_with(&read(&format!("{name}.cables")), &map, &Options::default());
        let files = render::render(&p, Format::Netplan, None).unwrap();
        assert_eq!(files.len() as u32, p.servers);
        for (i, f) in files.iter().enumerate() {
            let s = i as u32 + 1;
            let docs = YamlLoader::load_from_str(&f.text).unwrap();
            assert_eq!(docs.len(), 1, "{}", f.path);
            let net = &docs[0]["network"];
            assert_eq!(net["version"].as_i64(), Some(2));
            // No global renderer: the host's own (NetworkManager on a desktop image) stays.
            assert!(net["renderer"].is_badvalue(), "{}", f.text);
            let eth = net["ethernets"].as_hash().unwrap();
            assert_eq!(eth.len(), p.links_of(s).count(), "{}", f.path);
            for l in p.links_of(s) {
                let (me, _) = l.side(s).unwrap();
                let e = &net["ethernets"][me.interface.as_str()];
                assert_eq!(e["mtu"].as_i64(), Some(9000));
                assert_eq!(e["renderer"].as_str(), Some("networkd"));
                assert_eq!(e["dhcp4"].as_bool(), Some(false));
                assert_eq!(e["optional"].as_bool(), Some(true));
                let addrs = e["addresses"].as_vec().unwrap();
                assert_eq!(addrs.len(), 1);
                assert_eq!(addrs[0].as_str(), Some(me.address.to_string().as_str()));
            }
        }
    }
}

#[test]
fn netplan_quotes_names_yaml_would_misread() {
    use yaml_rust2::YamlLoader;
    let map = PortMap::parse("odd.map", "1 = true 0x10\n2 = 1e3 eth-2\n").unwrap();
    let p = plan_with("1-1 > 2-2\n", &map, &Options::default());
    let files = render::render(&p, Format::Netplan, Some(1)).unwrap();
    let docs = YamlLoader::load_from_str(&files[0].text).unwrap();
    let eth = docs[0]["network"]["ethernets"].as_hash().unwrap();
    let keys: Vec<&str> = eth.keys().map(|k| k.as_str().unwrap()).collect();
    assert_eq!(keys, ["true", "0x10"]);
    let files = render::render(&p, Format::Netplan, Some(2)).unwrap();
    let docs = YamlLoader::load_from_str(&files[0].text).unwrap();
    let eth = docs[0]["network"]["ethernets"].as_hash().unwrap();
    let keys: Vec<&str> = eth.keys().map(|k| k.as_str().unwrap()).collect();
    assert_eq!(keys, ["1e3", "eth-2"]);
}

#[test]
fn networkd_files_carry_address_and_mtu() {
    let p = b300(&read("b300-2node.cables"));
    let files = render::render(&p, Format::Networkd, Some(1)).unwrap();
    assert_eq!(files.len(), 16);
    let f = files
        .iter()
        .find(|f| f.path == "server1/05-switchless-eno6np0.network")
        .unwrap();
    assert!(f.text.contains("[Match]\nName=eno6np0\n"));
    assert!(f.text.contains("MTUBytes=9000"));
    assert!(f.text.contains("Address=10.100.0.1/30"));
}

// ---------- properties ----------

/// A random valid cable set on B300 servers: (servers, cables file text, number of cables).
fn cable_set() -> impl Strategy<Value = (u32, String, usize)> {
    (2u32..=8).prop_flat_map(|n| {
        prop::collection::vec((1..=n, 1u32..=8, 1..=n, 1u32..=8), 0..40).prop_map(move |cands| {
            let mut used = BTreeSet::new();
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
            let count = lines.len();
            (n, lines.join("\n"), count)
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_plans_keep_their_guarantees((n, text, count) in cable_set(), prefix in 30u8..=31) {
        let map = PortMap::b300();
        let c = cables::parse("cables.txt", &text, &map, Some(n)).unwrap();
        let opts = Options { prefix, ..Options::default() };
        let p = plan::build(&c, &map, &opts).unwrap().plan;
        prop_assert_eq!(p.links.len(), count * 2);
        let mut subnets = BTreeSet::new();
        let mut addrs = BTreeSet::new();
        for l in &p.links {
            prop_assert!(subnets.insert(l.subnet), "subnet {} shared", l.subnet);
            prop_assert!(p.base.contains(&l.subnet));
            for e in &l.ends {
                prop_assert!(addrs.insert(e.address.addr()), "address {} reused", e.address);
                prop_assert_eq!(e.address.trunc(), l.subnet, "both ends share the link's subnet");
                prop_assert_eq!(e.address.prefix_len(), prefix);
            }
            prop_assert!(l.ends[0].server < l.ends[1].server);
            prop_assert!(l.ends[0].address.addr() < l.ends[1].address.addr());
        }
        // No two subnets overlap (they are aligned blocks of one size, so distinct means disjoint; check anyway).
        let nets: Vec<Ipv4Net> = subnets.into_iter().collect();
        for w in nets.windows(2) {
            prop_assert!(w[0].broadcast() < w[1].network());
        }
        // The JSON round trip is exact.
        prop_assert_eq!(Plan::from_json(&p.to_json().unwrap()).unwrap(), p.clone());
        // Dropping the last cable changes no other link.
        let lines: Vec<&str> = text.lines().collect();
        if lines.len() > 1 {
            let shorter = lines[..lines.len() - 1].join("\n");
            let c2 = cables::parse("cables.txt", &shorter, &map, Some(n)).unwrap();
            let p2 = plan::build(&c2, &map, &opts).unwrap().plan;
            for l in &p2.links {
                prop_assert!(p.links.contains(l));
            }
        }
    }

    #[test]
    fn parsers_never_panic(text in "[0-9 >,#\\-a\n]{0,200}") {
        let map = PortMap::b300();
        let _ = cables::parse("cables.txt", &text, &map, None);
        let _ = cables::parse("cables.txt", &text, &map, Some(3));
        let _ = PortMap::parse("map.txt", &text.replace('>', "="));
    }

    #[test]
    fn from_json_never_panics(text in "\\PC{0,300}") {
        let _ = Plan::from_json(&text);
    }
}

// ---------- the command line ----------

fn switchless(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_switchless"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn cli_prints_plan_and_writes_files() {
    let cables_path = fixture("b300-4node.cables");
    let cables_arg = cables_path.to_str().unwrap();
    let out = switchless(&["plan", cables_arg]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains("verified: 24 links in 24 distinct /30 subnets, 48 distinct addresses")
    );

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = switchless(&["plan", cables_arg, "--format", "netplan", "--out", d]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for s in 1..=4 {
        let f = dir.path().join(format!("server{s}.yaml"));
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(text.contains("mtu: 9000"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    let out = switchless(&[
        "plan", cables_arg, "--format", "networkd", "--out", d, "--server", "2",
    ]);
    assert!(out.status.success());
    assert!(
        dir.path()
            .join("server2/05-switchless-eno8np0.network")
            .exists()
    );

    let out = switchless(&[
        "plan",
        cables_arg,
        "--format",
        "json",
        "--mtu",
        "4200",
        "--prefix",
        "31",
        "--base",
        "10.7.0.0/24",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = Plan::from_json(&String::from_utf8(out.stdout).unwrap()).unwrap();
    assert_eq!((p.mtu, p.prefix), (4200, 31));
    assert_eq!(p.base.to_string(), "10.7.0.0/24");
}

#[test]
fn cli_reports_errors_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "1-1 > 2-1\n1-1 > 3-1\n1-2 2-2\n").unwrap();
    let out = switchless(&["plan", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains(&format!(
            "{}:2: port 1 of server 1 is used twice",
            bad.display()
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!("{}:3: `1-2 2-2` has no `>`", bad.display())),
        "{err}"
    );

    let out = switchless(&[
        "plan",
        fixture("gb10-3ring.cables").to_str().unwrap(),
        "--model",
        "gb10",
        "--base",
        "10.0.0.0/29",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("6 links need 24 addresses"), "{err}");

    let out = switchless(&[
        "plan",
        fixture("b300-2node.cables").to_str().unwrap(),
        "--servers",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("--servers 1: a mesh needs at least 2 servers"),
        "{err}"
    );

    let out = switchless(&[
        "plan",
        fixture("b300-2node.cables").to_str().unwrap(),
        "--base",
        "10.100.0.0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("expected NETWORK/PREFIX, e.g. 10.100.0.0/16"),
        "{err}"
    );

    let out = switchless(&["plan", "/nonexistent/cables.txt"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("cannot read the cables file /nonexistent/cables.txt"),
        "{err}"
    );
}

#[test]
fn cli_custom_map_and_stdin() {
    use std::io::Write;
    let map = fixture("custom.map");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_switchless"))
        .args([
            "plan",
            "-",
            "--model",
            map.to_str().unwrap(),
            "--format",
            "ip",
            "--server",
            "3",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(read("custom.cables").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    // `1-3 > 3-1`: port 3 has one interface, so one link: slot ((1-1)*3 + 2)*2 = 4 → 10.100.0.16/30.
    assert!(
        stdout.contains("only_address ens1f0np0 10.100.0.18/30"),
        "{stdout}"
    );
    assert!(!stdout.contains("dev ens1f1np1"), "{stdout}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains(
            "warning: line 3: server 1 port 3 has 1 interface(s) but server 3 port 1 has 2"
        ),
        "{stderr}"
    );
}

// ---------- host names, apply and check scripts ----------

#[test]
fn host_names_give_the_same_plan_and_name_the_outputs() {
    let named = b300(&read("b300-4node-named.cables"));
    let numbered = b300(&read("b300-4node.cables"));
    // The names change no address: the declarations give the same numbers.
    assert_eq!(named.links.len(), numbered.links.len());
    for (a, b) in named.links.iter().zip(&numbered.links) {
        assert_eq!((a.id, a.subnet, &a.ends), (b.id, b.subnet, &b.ends));
    }
    assert_eq!(named.name_of(3), Some("b300-003"));
    assert_eq!(named.server_by_name("b300-004"), Some(4));
    let back = Plan::from_json(&named.to_json().unwrap()).unwrap();
    assert_eq!(back.names, named.names);
    // Files are named by host.
    let files = render::render(&named, Format::Ip, Some(2)).unwrap();
    let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["b300-002.sh", "b300-002-check.sh"]);
    assert!(files[0].text.contains("\"$(hostname -s)\" != b300-002"));
    let files = render::render(&named, Format::Netplan, Some(2)).unwrap();
    assert_eq!(files[0].path, "b300-002.yaml");
    let files = render::render(&named, Format::Networkd, Some(2)).unwrap();
    assert!(
        files
            .iter()
            .all(|f| f.path.starts_with("b300-002/05-switchless-"))
    );
    let table = &render::render(&named, Format::Table, None).unwrap()[0].text;
    assert!(
        table.contains("servers: 1 = b300-001, 2 = b300-002"),
        "{table}"
    );
    assert!(table.contains("server 1 (b300-001): 12 links"), "{table}");
    golden("b300-4node-named.table.txt", table);
}

#[test]
fn ip_output_is_an_apply_script_and_a_check_script() {
    let p = b300(&read("b300-2node.cables"));
    let files = render::render(&p, Format::Ip, Some(1)).unwrap();
    let (apply, check) = (&files[0], &files[1]);
    assert_eq!(
        (apply.path.as_str(), check.path.as_str()),
        ("server1.sh", "server1-check.sh")
    );
    assert!(apply.text.starts_with("#!/usr/bin/env bash\n"));
    assert!(apply.text.contains("\nset -euo pipefail\n"));
    assert!(
        !apply.text.contains("ping "),
        "the apply script pings nothing"
    );
    assert!(apply.text.contains("only_address eno6np0 10.100.0.1/30"));
    assert!(check.text.starts_with("#!/usr/bin/env bash\n"));
    assert!(
        check
            .text
            .contains("check ping -I eno6np0 -c \"$count\" -W 1 -M \"do\" -s 8972 10.100.0.2")
    );
    assert!(
        !check.text.contains("ip addr"),
        "the check script changes nothing"
    );
    // --out writes them executable.
    let dir = tempfile::tempdir().unwrap();
    let out = switchless(&[
        "plan",
        fixture("b300-4node-named.cables").to_str().unwrap(),
        "--format",
        "ip",
        "--server",
        "b300-003",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    use std::os::unix::fs::PermissionsExt;
    for f in ["b300-003.sh", "b300-003-check.sh"] {
        let m = std::fs::metadata(dir.path().join(f)).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o755, "{f}");
    }
    let out = switchless(&[
        "plan",
        fixture("b300-4node-named.cables").to_str().unwrap(),
        "--server",
        "b300-009",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("names: b300-001, b300-002"));
}

/// `plan` without `--model`: the cables file's `model =` line, else what its ports and host names
/// leave (a port above 2: B300; hosts named spark-*: GB10, said on stderr); otherwise it asks.
#[test]
fn cli_model_comes_from_the_file_or_is_asked_for() {
    let d = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = d.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let json = |out: &std::process::Output| -> serde_json::Value {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // Three Sparks by host name: GB10, and a note says why.
    let mesh3 = write(
        "mesh3.txt",
        "spark-a-1 > spark-b-1\nspark-b-2 > spark-c-1\nspark-c-2 > spark-a-2\n",
    );
    let out = switchless(&["plan", &mesh3, "--format", "json"]);
    assert_eq!(json(&out)["model"]["name"], "gb10");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("model gb10 (DGX Spark)") && err.contains("spark-a"),
        "{err}"
    );
    // Port 8: only the B300 has it.
    let b = write("b.txt", "1-8 > 2-8\n");
    assert_eq!(
        json(&switchless(&["plan", &b, "--format", "json"]))["model"]["name"],
        "b300"
    );
    // Ports 1-2 and no hint: both models fit, so it asks (exit 2), naming the ways to answer.
    let two = write("two.txt", "1-1 > 2-1\n");
    let out = switchless(&["plan", &two]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "--model gb10",
        "--model b300",
        "model = gb10",
        "both built-in models",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
    // A `model =` line answers for the file; --model still wins.
    let named = write("named.txt", "model = gb10\n1-1 > 2-1\n");
    assert_eq!(
        json(&switchless(&["plan", &named, "--format", "json"]))["model"]["name"],
        "gb10"
    );
    let out = switchless(&["plan", &named, "--model", "b300", "--format", "json"]);
    assert_eq!(json(&out)["model"]["name"], "b300");
    let bad = write("bad.txt", "model = nope\n1-1 > 2-1\n");
    let out = switchless(&["plan", &bad]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.txt:1: model = nope"));
}

/// Every planned interface gets arp_ignore=1 and arp_announce=2 (and no IPv6 temporary addresses):
/// the sysctl.d output persists them, the apply script sets them, netplan and networkd point to it.
#[test]
fn arp_settings_for_every_planned_interface() {
    let p = plan_with(
        &read("gb10-3ring.cables"),
        &PortMap::gb10(),
        &Options::default(),
    );
    let conf = render::to_stdout(&render::render(&p, Format::Sysctl, Some(1)).unwrap());
    let ip = render::to_stdout(&render::render(&p, Format::Ip, Some(1)).unwrap());
    for (me, _) in p.links_of(1).filter_map(|l| l.side(1)) {
        let i = &me.interface;
        assert!(
            conf.contains(&format!("net.ipv4.conf.{i}.arp_ignore = 1\n")),
            "{conf}"
        );
        assert!(
            conf.contains(&format!("net.ipv4.conf.{i}.arp_announce = 2\n")),
            "{conf}"
        );
        assert!(
            conf.contains(&format!("net.ipv6.conf.{i}.use_tempaddr = 0\n")),
            "{conf}"
        );
        assert!(
            ip.contains(&format!(
                "sysctl -qw net.ipv4.conf.{i}.arp_ignore=1 net.ipv4.conf.{i}.arp_announce=2 net.ipv6.conf.{i}.use_tempaddr=0\n"
            )),
            "{ip}"
        );
    }
    for f in [Format::Netplan, Format::Networkd] {
        let text = render::to_stdout(&render::render(&p, f, Some(1)).unwrap());
        assert!(text.contains("--format sysctl"), "{text}");
    }
}

/// The plans the plan-built fixture fleets come from (`tests/fixtures/plan/*.plan.json`, read by
/// gen.py) are what `switchless plan` makes of their cables files today.
#[test]
fn committed_fixture_plans_are_current() {
    let dir = fixture("");
    for name in ["gb10-mesh3", "b300-pair", "ws-pair"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchless"))
            .args(["plan", &format!("{name}.cables"), "--format", "json"])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let fresh = Plan::from_json(&String::from_utf8(out.stdout).unwrap()).unwrap();
        let committed = Plan::from_json(
            &std::fs::read_to_string(dir.join(format!("{name}.plan.json"))).unwrap(),
        )
        .unwrap();
        assert!(
            fresh == committed,
            "tests/fixtures/plan/{name}.plan.json is stale: rerun `switchless plan {name}.cables --format json` \
             there, then python3 tests/fixtures/fabric/gen.py"
        );
    }
}

/// One of a thing is singular everywhere (walkthrough 2, A8), and `--servers` below the file's
/// highest server blames the option, quoting the file's own text.
#[test]
fn singulars_and_the_servers_option() {
    let dir = fixture("");
    let out = switchless(&[
        "plan",
        dir.join("ws-pair.cables").to_str().unwrap(),
        "--format",
        "ip",
        "--server",
        "1",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("model ws10g (1 port, up to 1 interface each), 2 servers, 1 cable, 1 link"),
        "{text}"
    );
    assert!(
        text.contains("verified: 1 link in 1 distinct /30 subnet, 2 distinct addresses;"),
        "{text}"
    );
    assert!(text.contains("ws-a.sh: 1 interface configured;"), "{text}");
    let p =
        Plan::from_json(&std::fs::read_to_string(dir.join("ws-pair.plan.json")).unwrap()).unwrap();
    let live = vec![plan::LiveIface {
        name: "enp5s0".into(),
        addrs: vec!["10.100.0.1/30".parse().unwrap()],
        mtu: 9000,
        up: true,
        rdma: false,
    }];
    let f = plan::check_host(&p, 1, &live);
    assert_eq!(
        f[0].message,
        "the one planned interface of server 1 is up with MTU 9000 bytes and its planned /30 address"
    );
    let out = switchless(&[
        "plan",
        dir.join("gb10-mesh3.cables").to_str().unwrap(),
        "--servers",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("--servers 2 allows servers 1..=2, but the cables file names server 3:"),
        "{err}"
    );
    assert!(
        err.contains("`spark-b-2 > spark-c-1` names server 3 (spark-c)"),
        "{err}"
    );
    assert!(
        !err.contains("invalid configuration") && !err.contains("errors in the cables file"),
        "{err}"
    );
}

/// A map line for one server (`server 2 port 1 = enp6s0`): two workstations whose NICs have
/// different names (walkthrough 2, A4).
#[test]
fn one_server_names_its_ports_differently() {
    let map = PortMap::parse(
        "ws.map",
        "name = ws10g\n1 = enp5s0\nserver 2 port 1 = enp6s0\n",
    )
    .unwrap();
    assert_eq!(map.port_of(1, 1).unwrap(), ["enp5s0"]);
    assert_eq!(map.port_of(2, 1).unwrap(), ["enp6s0"]);
    assert_eq!(map.port_number_of(2, "enp6s0"), Some(1));
    assert_eq!(map.port_number_of(2, "enp5s0"), None);
    let p = plan_with("1-1 > 2-1\n", &map, &Options::default());
    assert_eq!(p.links[0].ends[0].interface, "enp5s0");
    assert_eq!(p.links[0].ends[1].interface, "enp6s0");
    // The plan's JSON keeps the server's line, and reads back equal.
    let back = Plan::from_json(&p.to_json().unwrap()).unwrap();
    assert_eq!(back, p);
    // Mistakes name the line and what is accepted.
    let e = PortMap::parse("m.map", "1 = a\nserver x port 1 = b\nserver 2 port 1 =\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("m.map:2: `server x port 1` is not `server N port P`"),
        "{e}"
    );
    assert!(
        e.contains("m.map:3: server 2 port 1 lists no interface"),
        "{e}"
    );
    let e = PortMap::parse("m.map", "1 = a\n2 = b\nserver 2 port 1 = b\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("server 2 would use interface b for two ports"),
        "{e}"
    );
}
