//! The doctor's checks of NCCL's own variables against this host: `NCCL_SOCKET_IFNAME` (NCCL's
//! bootstrap), `NCCL_NET` and `NCCL_NET_PLUGIN` (whether NCCL uses the plugin at all),
//! `NCCL_IB_GID_INDEX` (a fixed GID index every port must agree on), and the NCCL libraries the
//! dynamic loader would put ahead of a program's own (an `LD_PRELOAD` shim).

use super::environ::Environment;
use super::registry::check;
use crate::config::Config;
use crate::findings::{Finding, Severity};
use crate::host::model::{GidAddr, GidType, HostModel};

/// The plugin's network name (what `NCCL_NET` must say for NCCL to use it).
pub const NET_NAME: &str = "switchless";

/// Every check of this module.
pub fn checks(m: &HostModel, env: &Environment, cfg: Option<&Config>) -> Vec<Finding> {
    let mut f = Vec::new();
    f.extend(socket_ifname(m, env));
    f.extend(net(env));
    f.extend(net_plugin(env));
    if let Some(cfg) = cfg {
        f.extend(gid_index(m, cfg));
    }
    f.extend(shims(env));
    f
}

/// NCCL's interface list: `^` excludes, `=` matches names exactly, otherwise by prefix; entries
/// separated by commas (a `:port` suffix is not part of the name).
struct IfList {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfList {
    fn parse(v: &str) -> IfList {
        let mut s = v.trim();
        let exclude = s.starts_with('^');
        s = s.trim_start_matches('^');
        let exact = s.starts_with('=');
        s = s.trim_start_matches('=');
        IfList {
            exclude,
            exact,
            names: s
                .split(',')
                .map(|e| e.split(':').next().unwrap_or("").trim().to_string())
                .filter(|e| !e.is_empty())
                .collect(),
        }
    }

    fn selects(&self, ifname: &str) -> bool {
        let hit = self.names.iter().any(|n| {
            if self.exact {
                ifname == n
            } else {
                ifname.starts_with(n.as_str())
            }
        });
        hit != self.exclude
    }
}

/// The interface of the default route: the network that reaches every node.
fn default_route_netdev(m: &HostModel) -> Option<&str> {
    m.kernel_routes
        .iter()
        .filter(|r| r.dest.prefix_len() == 0)
        .min_by_key(|r| r.metric)
        .map(|r| r.ifname.as_str())
}

/// `NCCL_SOCKET_IFNAME` picks the interface of NCCL's TCP bootstrap, which must reach every node: a
/// name matching nothing fails NCCL's init, and a cable (/30, /31) reaches one peer only.
fn socket_ifname(m: &HostModel, env: &Environment) -> Vec<Finding> {
    let Some(v) = env
        .vars
        .get("NCCL_SOCKET_IFNAME")
        .filter(|v| !v.trim().is_empty())
    else {
        return Vec::new();
    };
    let list = IfList::parse(v);
    let picked: Vec<&crate::host::model::Netdev> = m
        .netdevs
        .iter()
        .filter(|n| n.name != "lo" && list.selects(&n.name) && !n.addrs.is_empty())
        .collect();
    let mgmt = default_route_netdev(m);
    let remedy = match mgmt {
        Some(d) => format!(
            "export NCCL_SOCKET_IFNAME=={d}   # the default route's interface, which reaches every node"
        ),
        None => "export NCCL_SOCKET_IFNAME==IF with IF the management interface every node reaches"
            .to_string(),
    };
    let obj = "NCCL_SOCKET_IFNAME";
    if picked.is_empty() {
        let all: Vec<&str> = m
            .netdevs
            .iter()
            .filter(|n| n.name != "lo" && !n.addrs.is_empty())
            .map(|n| n.name.as_str())
            .collect();
        return vec![Finding::new(
            Severity::Warning,
            check::NCCL_SOCKET_IFNAME,
            obj,
            format!(
                "NCCL_SOCKET_IFNAME={v} matches no netdev with an address on this host (those with one: {}): \
                 NCCL's bootstrap finds no interface and init fails (\"no socket interface found\")",
                if all.is_empty() {
                    "none".to_string()
                } else {
                    all.join(", ")
                }
            ),
            remedy,
        )];
    }
    let cable = |n: &crate::host::model::Netdev| {
        n.addrs.iter().all(|a| crate::route::point_to_point(a.addr))
    };
    let cables: Vec<String> = picked
        .iter()
        .filter(|n| cable(n))
        .map(|n| {
            let a: Vec<String> = n.addrs.iter().map(|a| a.addr.to_string()).collect();
            format!("{} ({})", n.name, a.join(", "))
        })
        .collect();
    if cables.is_empty() {
        return Vec::new();
    }
    let all = cables.len() == picked.len();
    vec![Finding::new(
        Severity::Warning,
        check::NCCL_SOCKET_IFNAME,
        obj,
        format!(
            "NCCL_SOCKET_IFNAME={v} {} {}: a cable's /30 or /31 reaches one peer only, and NCCL's bootstrap \
             must reach every rank: beyond a pair of hosts NCCL's init hangs on the ranks the cable does not \
             reach",
            if all {
                "selects only cables:"
            } else {
                "also selects cables (NCCL takes the first match, in the kernel's order):"
            },
            cables.join(", ")
        ),
        remedy,
    )]
}

/// `NCCL_NET` naming another network: NCCL then never uses the plugin.
fn net(env: &Environment) -> Vec<Finding> {
    let Some(v) = env.vars.get("NCCL_NET").filter(|v| !v.trim().is_empty()) else {
        return Vec::new();
    };
    if v.trim().eq_ignore_ascii_case(NET_NAME) {
        return Vec::new();
    }
    vec![Finding::new(
        Severity::Warning,
        check::NCCL_NET_OTHER,
        "NCCL_NET",
        format!(
            "NCCL_NET={v} makes NCCL use its network named {v:?}, not the plugin's ({NET_NAME}): connections get \
             NCCL's own routing, which does not know the cabling, and a peer no cable of the chosen device \
             faces fails or hangs"
        ),
        format!("export NCCL_NET={NET_NAME}   # or unset NCCL_NET"),
    )]
}

/// `NCCL_NET_PLUGIN`: which library NCCL loads for it, or that it finds none.
fn net_plugin(env: &Environment) -> Vec<Finding> {
    let Some(v) = env
        .vars
        .get("NCCL_NET_PLUGIN")
        .filter(|v| !v.trim().is_empty())
    else {
        return Vec::new();
    };
    let v = v.trim();
    let obj = "NCCL_NET_PLUGIN";
    if v.eq_ignore_ascii_case("none") {
        return vec![Finding::new(
            Severity::Warning,
            check::NCCL_NET_PLUGIN,
            obj,
            "NCCL_NET_PLUGIN=none: NCCL loads no network plugin, so the switchless plugin is not used",
            format!("export NCCL_NET_PLUGIN={NET_NAME}"),
        )];
    }
    match &env.net_plugin {
        Some(path) => vec![Finding::new(
            Severity::Info,
            check::NCCL_NET_PLUGIN,
            obj,
            format!(
                "NCCL_NET_PLUGIN={v} loads {path} (as NCCL looks it up{})",
                if env.source == "captured" {
                    ", on the captured host"
                } else {
                    ", on this machine"
                }
            ),
            "nothing",
        )],
        None => vec![Finding::new(
            Severity::Warning,
            check::NCCL_NET_PLUGIN,
            obj,
            format!(
                "NCCL_NET_PLUGIN={v} names nothing loadable: no libnccl-net-{v}.so or {v} in LD_LIBRARY_PATH, \
                 the loader's cache or the system library directories, so NCCL falls back to its internal \
                 transports (and with NCCL_NET={NET_NAME} fails)"
            ),
            format!(
                "export NCCL_NET_PLUGIN={NET_NAME} with libnccl-net-{NET_NAME}.so installed (make install; \
                 ldconfig), or give its full path: export NCCL_NET_PLUGIN=/PREFIX/lib/libnccl-net-{NET_NAME}.so"
            ),
        )],
    }
}

/// What GID `index` of a port holds, in words.
fn gid_words(p: &crate::host::model::RdmaPort, index: u32) -> String {
    match p.gids.iter().find(|g| g.index == index) {
        None => format!("GID {index} is empty"),
        Some(g) => {
            let what = match (g.addr, g.gid_type) {
                (GidAddr::LinkLocal, _) => {
                    "a link-local fe80:: GID, which NCCL treats as invalid".to_string()
                }
                (GidAddr::Ipv6, _) => format!("the IPv6 address {}", g.gid),
                (GidAddr::Ipv4Mapped(a), GidType::RoceV2) => format!("the RoCE v2 GID of {a}"),
                (GidAddr::Ipv4Mapped(a), t) => format!("the {} GID of {a}", t.as_str()),
            };
            format!("GID {index} is {what}")
        }
    }
}

/// A fixed `NCCL_IB_GID_INDEX` must be each usable RoCE port's IPv4 RoCE v2 GID; unset, the plugin
/// (and NCCL) pick the right one per port, and a difference between ports is only worth knowing.
fn gid_index(m: &HostModel, cfg: &Config) -> Vec<Finding> {
    let ports: Vec<(&str, &crate::host::model::RdmaPort, u32)> = m
        .ports()
        .filter(|(_, p)| p.is_ethernet() && p.is_active())
        .filter_map(|(d, p)| {
            p.ipv4_v2_gids()
                .next()
                .map(|(g, _)| (d.name.as_str(), p, g.index))
        })
        .collect();
    match cfg.ib_gid_index {
        Some(i) => {
            let wrong: Vec<String> = ports
                .iter()
                .filter(|(_, p, _)| {
                    p.gids
                        .iter()
                        .find(|g| g.index == u32::from(i))
                        .and_then(|g| g.ipv4_v2())
                        .is_none()
                })
                .map(|(d, p, good)| {
                    format!(
                        "{d} port {}: {}; its IPv4 RoCE v2 GID is {good}",
                        p.port,
                        gid_words(p, u32::from(i))
                    )
                })
                .collect();
            if wrong.is_empty() {
                return Vec::new();
            }
            vec![Finding::new(
                Severity::Error,
                check::IB_GID_INDEX_WRONG,
                "NCCL_IB_GID_INDEX",
                format!(
                    "NCCL_IB_GID_INDEX={i} is used on every port, but {}: connections from that port carry a GID \
                     the peer cannot reach, and the job hangs or fails there",
                    wrong.join("; ")
                ),
                "unset NCCL_IB_GID_INDEX   # the plugin picks each port's IPv4 RoCE v2 GID per connection",
            )]
        }
        None => {
            let mut idx: Vec<u32> = ports.iter().map(|(_, _, g)| *g).collect();
            idx.sort_unstable();
            idx.dedup();
            if idx.len() < 2 {
                return Vec::new();
            }
            let each: Vec<String> = ports
                .iter()
                .map(|(d, p, g)| format!("{g} on {d} port {}", p.port))
                .collect();
            vec![Finding::new(
                Severity::Info,
                check::GID_INDEX_DIFFERS,
                "host",
                format!(
                    "the IPv4 RoCE v2 GID sits at different indices: {}. Unset, NCCL_IB_GID_INDEX is picked per \
                     port; one global value (as some guides set) would give the other ports a wrong GID",
                    each.join(", ")
                ),
                "leave NCCL_IB_GID_INDEX unset on every node",
            )]
        }
    }
}

/// NCCL libraries the loader puts ahead of a program's own: an `LD_PRELOAD` (or
/// `/etc/ld.so.preload`) entry wins over every program's NCCL (community images bake such shims
/// in; DeepEP then aborts with "Duplicate NCCL runtime found"); a `libnccl.so` in an
/// `LD_LIBRARY_PATH` directory wins over a program that loads NCCL by name without its own path.
fn shims(env: &Environment) -> Vec<Finding> {
    let mut f = Vec::new();
    let (pre, path): (Vec<_>, Vec<_>) = env
        .nccl_libs
        .iter()
        .partition(|l| l.via != "LD_LIBRARY_PATH");
    if !pre.is_empty() {
        let list: Vec<String> = pre
            .iter()
            .map(|l| format!("{} ({})", l.path, l.via))
            .collect();
        let unset = if pre.iter().any(|l| l.via == "LD_PRELOAD") {
            "unset LD_PRELOAD (or drop the libnccl entry from it)"
        } else {
            "remove the libnccl line from /etc/ld.so.preload"
        };
        f.push(Finding::new(
            Severity::Warning,
            check::NCCL_SHIM,
            "LD_PRELOAD",
            format!(
                "the loader preloads {}: every process gets this NCCL, whatever NCCL its framework ships (a \
                 PyTorch wheel's, the one you built), so the NCCL you meant to test is not the one that runs, \
                 and a program that loads its own as well aborts (\"Duplicate NCCL runtime found\")",
                list.join(", ")
            ),
            format!(
                "{unset}; to run a patched NCCL, install it in place of the framework's (a bind mount over \
                 the wheel's libnccl.so.2) instead"
            ),
        ));
    }
    if !path.is_empty() {
        let list: Vec<&str> = path.iter().map(|l| l.path.as_str()).collect();
        f.push(Finding::new(
            Severity::Info,
            check::NCCL_SHIM,
            "LD_LIBRARY_PATH",
            format!(
                "LD_LIBRARY_PATH holds {}: a program that loads NCCL by name (libnccl.so.2) without a path of \
                 its own gets this one; check it is the NCCL you mean (NCCL_DEBUG=INFO prints the version)",
                list.join(", ")
            ),
            "nothing, if it is the NCCL you mean; else drop its directory from LD_LIBRARY_PATH",
        ));
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_lists_as_nccl_reads_them() {
        let l = IfList::parse("^docker,lo");
        assert!(l.selects("eno1") && !l.selects("docker0") && !l.selects("lo"));
        let l = IfList::parse("=eno1");
        assert!(l.selects("eno1") && !l.selects("eno12"));
        let l = IfList::parse("en");
        assert!(l.selects("eno1") && l.selects("enp1s0f0np0") && !l.selects("ib0"));
        let l = IfList::parse("eth0:2345");
        assert!(l.selects("eth0"));
    }
}
