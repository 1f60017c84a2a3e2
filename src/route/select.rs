//! Path selection: which (local link, peer address) pairs carry a connection to one peer.
//!
//! Pure: inputs are the host model's links and kernel routes and the peer's advertised links (from its
//! listen handle). The rules (also in docs/guide/routing.md):
//!
//! 1. A pair (local link `L`, peer address `R`) is usable when `R` lies in `L`'s connected subnet,
//!    `R` is not `L`'s own address, `L` is up, the kinds pass the [`KindFilter`], and the kernel's route
//!    for `R` leaves through `L`'s netdev as a connected route (no gateway). The kernel route is the
//!    longest-prefix match over [`KernelRoute`], then the lowest metric; routes tied on both are all
//!    winners (two netdevs with addresses in one subnet: RoCE binds the GID's netdev, so each can carry
//!    its own path — `doctor` warns about ARP in that set-up).
//! 2. If NCCL's device (`nccl_dev`) has usable pairs, only its links are used; otherwise every usable
//!    link is, and [`Selection::dev_override`] says so and why (log it at INFO).
//! 3. One path per local link: most constrained links choose first, each takes a peer address no other
//!    path uses if it can (same prefix length preferred), else shares one.
//! 4. Paths are interleaved so consecutive paths alternate local PCIe roots (and, inside one root,
//!    the peer's PCIe roots), then capped at `max_paths` (default [`DEFAULT_MAX_PATHS`] = 8, NCCL v12's
//!    vNIC size: more paths add QPs and CQ polling without adding bandwidth on a 2-port node).
//! 5. No usable pair: an immediate error naming the peer's addresses, the local subnets and why each
//!    candidate was skipped — never a timeout later.
//! 6. The peer is this host: no pair of rule 1 and every address the peer advertises is one of this
//!    host's (two ranks of one host that NCCL connects over the network: `NCCL_P2P_DISABLE=1
//!    NCCL_SHM_DISABLE=1`, containers with different host hashes, `NCCL_HOSTID`). Each up link the
//!    peer advertises then carries a loopback path to its own address ([`Selection::same_host`]):
//!    RoCE to the port's own GID (HCA loopback), TCP to the link's own address; rules 2–4 apply as
//!    usual. The handle carries no host id: the handshake's per-listener nonce is what refuses a
//!    connection that reached another listener (a host with duplicate addresses).
//! 7. [`Reach::Routed`] (what `NCCL_SWITCHLESS_TCP_FALLBACK=1` uses when nothing on-link reaches the peer)
//!    also accepts a peer address outside every local subnet when the kernel's route for it leaves through
//!    `L`'s netdev — through a gateway (a neighbour that forwards, or the default route) whose address is in
//!    `L`'s subnet, or as a device route. Such a path is TCP only (RoCE needs a cable), its
//!    [`PathChoice::via`] names the gateway, and a link prefers an on-link peer address to a routed one.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::route::types::{KernelRoute, LinkKind, LocalLink, RemoteLink};

/// Paths used per connection unless the caller asks otherwise.
pub const DEFAULT_MAX_PATHS: usize = 8;

/// Which kinds of pairs a transport can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KindFilter {
    /// RoCE on both ends (the verbs transport).
    Roce,
    /// Any IPv4 pair, carried as TCP (RoCE netdevs carry TCP too).
    Tcp,
    /// Every pair; its kind is RoCE when both ends are RoCE, TCP otherwise.
    #[default]
    Any,
}

/// How far a path may reach (rule 7 of the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reach {
    /// The peer address lies in the local link's connected subnet and the kernel routes it on-link.
    #[default]
    OnLink,
    /// Also addresses the kernel routes through a gateway or a device route (TCP only).
    Routed,
}

/// Options of [`select`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteOptions {
    /// The device NCCL passed to `connect` / the listener's `dev`: a locality hint.
    pub nccl_dev: Option<usize>,
    pub kinds: KindFilter,
    /// At most this many paths (at least 1).
    pub max_paths: usize,
    /// On-link pairs only (the default), or routed ones too.
    pub reach: Reach,
}

impl Default for RouteOptions {
    fn default() -> Self {
        RouteOptions {
            nccl_dev: None,
            kinds: KindFilter::Any,
            max_paths: DEFAULT_MAX_PATHS,
            reach: Reach::OnLink,
        }
    }
}

/// One path of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PathChoice {
    pub local: LocalLink,
    pub remote: RemoteLink,
    /// What the path carries (after the [`KindFilter`]).
    pub kind: LinkKind,
    /// Why this pair qualifies (subnet and kernel route), for logs and `switchless route`.
    pub reason: String,
    /// The gateway the kernel sends this path's traffic to, for a routed path ([`Reach::Routed`]);
    /// `None` on-link.
    #[serde(default)]
    pub via: Option<Ipv4Addr>,
}

/// One line for logs: local netdev and address, RDMA device, port, GID index, NCCL device, PCIe root,
/// active MTU, peer address and kind (the per-connection INFO line adds the peer and the QPs).
impl std::fmt::Display for PathChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = &self.local;
        write!(f, "{} {} (", l.netdev, l.addr)?;
        match (&l.rdma_dev, l.gid_index) {
            (Some(d), Some(g)) => write!(f, "{d} port {} GID {g}, ", l.port)?,
            (Some(d), None) => write!(f, "{d} port {}, ", l.port)?,
            _ => {}
        }
        if let Some(d) = l.nccl_dev {
            write!(f, "NCCL dev {d}, ")?;
        }
        write!(
            f,
            "PCIe root {}, MTU {} B) -> {}",
            l.pci_root,
            l.active_mtu,
            self.remote.addr.addr(),
        )?;
        if let Some(gw) = self.via {
            write!(f, " via {gw}")?;
        }
        write!(f, " ({:?})", self.kind)
    }
}

/// NCCL's device could not reach the peer, so other links are used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DevOverride {
    pub requested: usize,
    /// NCCL devices of the links used instead (`None` entries are links outside NCCL's list).
    pub used: Vec<Option<usize>>,
    pub reason: String,
}

/// A candidate pair or link not used, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// `netdev addr/prefix` of the local link.
    pub local: String,
    /// The peer address concerned, if any.
    pub remote: Option<Ipv4Addr>,
    pub reason: String,
}

/// The result of [`select`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Selection {
    /// In striping order, non-empty.
    pub paths: Vec<PathChoice>,
    pub dev_override: Option<DevOverride>,
    pub skipped: Vec<Skipped>,
    /// The peer is this host: every path is a loopback to the local link's own address (rule 6).
    #[serde(default)]
    pub same_host: bool,
}

/// The winning kernel routes for `dst`: longest prefix, then lowest metric; all ties are returned.
pub fn kernel_route(routes: &[KernelRoute], dst: Ipv4Addr) -> Vec<&KernelRoute> {
    let matching = routes.iter().filter(|r| r.dest.contains(&dst));
    let best = matching
        .clone()
        .map(|r| (r.dest.prefix_len(), std::cmp::Reverse(r.metric)))
        .max();
    match best {
        None => Vec::new(),
        Some((len, std::cmp::Reverse(metric))) => matching
            .filter(|r| r.dest.prefix_len() == len && r.metric == metric)
            .collect(),
    }
}

fn describe_route(r: &KernelRoute) -> String {
    match r.gateway {
        None => format!("{} dev {} metric {}", r.dest, r.ifname, r.metric),
        Some(gw) => format!("{} via {gw} dev {} metric {}", r.dest, r.ifname, r.metric),
    }
}

fn link_name(l: &LocalLink) -> String {
    format!("{} {}", l.netdev, l.addr)
}

/// Checks the kernel sends traffic for `dst` out of `link` on a connected route.
/// Returns the reason on success (for logs) and on failure.
fn check_route(
    link: &LocalLink,
    routes: &[KernelRoute],
    dst: Ipv4Addr,
) -> std::result::Result<String, String> {
    let winners = kernel_route(routes, dst);
    if winners.is_empty() {
        return Err(format!("the kernel has no route to {dst}"));
    }
    match winners
        .iter()
        .find(|r| r.ifname == link.netdev && r.gateway.is_none())
    {
        Some(r) => Ok(format!(
            "{dst} is in {} and the kernel routes it on-link: {}",
            link.addr.trunc(),
            describe_route(r)
        )),
        None => Err(format!(
            "the kernel routes {dst} {} instead of on-link through {}",
            winners
                .iter()
                .map(|r| describe_route(r))
                .collect::<Vec<_>>()
                .join(" or "),
            link.netdev
        )),
    }
}

/// The link whose address the kernel would use as the source for `dst` over route `r`: on `r`'s netdev,
/// the link whose subnet holds the gateway (or, for a device route, `dst`), else the netdev's first link.
fn route_source<'a>(
    local: &'a [LocalLink],
    r: &KernelRoute,
    dst: Ipv4Addr,
) -> Option<&'a LocalLink> {
    let on_dev = || local.iter().filter(|l| l.netdev == r.ifname);
    let hop = r.gateway.unwrap_or(dst);
    on_dev()
        .find(|l| l.addr.contains(&hop))
        .or_else(|| on_dev().next())
}

/// Rule 7: the kernel's winning route for `dst` (outside `link`'s subnet) leaves through `link`.
/// Returns the route.
fn routed_via<'a>(
    link: &LocalLink,
    local: &[LocalLink],
    routes: &'a [KernelRoute],
    dst: Ipv4Addr,
) -> Option<&'a KernelRoute> {
    kernel_route(routes, dst).into_iter().find(|r| {
        r.ifname == link.netdev
            && route_source(local, r, dst).is_some_and(|s| std::ptr::eq(s, link))
    })
}

/// A usable pair: (local index, remote index, kind, reason, gateway).
#[derive(Debug, PartialEq, Eq)]
struct Usable(usize, usize, LinkKind, String, Option<Ipv4Addr>);

/// Chooses the paths of a connection to the peer advertising `remote`. See the module docs for the rules.
pub fn select(
    local: &[LocalLink],
    routes: &[KernelRoute],
    remote: &[RemoteLink],
    opts: &RouteOptions,
) -> Result<Selection> {
    let mut skipped = Vec::new();
    // Pairs skipped because the peer advertises the link's own address: only worth reporting when
    // the peer is not this host (rule 6).
    let mut own = Vec::new();
    let mut usable: Vec<Usable> = Vec::new();
    for (li, l) in local.iter().enumerate() {
        for (ri, r) in remote.iter().enumerate() {
            let ra = r.addr.addr();
            let on_link = l.addr.contains(&ra);
            let routed = match (on_link, opts.reach) {
                (true, _) => None,
                (false, Reach::OnLink) => continue,
                (false, Reach::Routed) => match routed_via(l, local, routes, ra) {
                    Some(route) => Some(route),
                    None => continue,
                },
            };
            let skip = |reason: String| Skipped {
                local: link_name(l),
                remote: Some(ra),
                reason,
            };
            if ra == l.addr.addr() {
                own.push(skip(format!(
                    "the peer advertises {ra}, which is this link's own address (same node, or a duplicate address)"
                )));
                continue;
            }
            let both_roce = l.kind == LinkKind::Roce && r.kind == LinkKind::Roce;
            let kind = match opts.kinds {
                KindFilter::Roce if routed.is_some() => {
                    skipped.push(skip(format!(
                        "RoCE paths only, but {ra} is not on this link's subnet (the kernel routes it {}); RoCE needs a cable",
                        routed.map(describe_route).unwrap_or_default()
                    )));
                    continue;
                }
                KindFilter::Roce if !both_roce => {
                    skipped.push(skip(format!(
                        "RoCE paths only, but this is {:?} to a {:?} address",
                        l.kind, r.kind
                    )));
                    continue;
                }
                KindFilter::Roce => LinkKind::Roce,
                KindFilter::Tcp => LinkKind::Tcp,
                KindFilter::Any if both_roce && routed.is_none() => LinkKind::Roce,
                KindFilter::Any => LinkKind::Tcp,
            };
            if !l.up {
                skipped.push(skip("link is down (no carrier)".into()));
                continue;
            }
            match routed {
                Some(route) => usable.push(Usable(
                    li,
                    ri,
                    kind,
                    format!(
                        "{ra} is outside {} and the kernel routes it {} (a routed TCP path)",
                        l.addr.trunc(),
                        describe_route(route)
                    ),
                    route.gateway,
                )),
                None => match check_route(l, routes, ra) {
                    Ok(reason) => usable.push(Usable(li, ri, kind, reason, None)),
                    Err(reason) => skipped.push(skip(reason)),
                },
            }
        }
    }
    let same_host = usable.is_empty() && is_this_host(local, remote);
    if same_host {
        loopback_pairs(local, remote, opts.kinds, &mut usable, &mut skipped);
        if usable.is_empty() {
            return Err(Error::InvalidUsage(format!(
                "the peer is this host (every address it advertises, {}, is one of this host's), but no \
                 link can carry a loopback path to it: {}",
                addr_list(remote),
                skipped
                    .iter()
                    .map(|s| format!("{}: {}", s.local, s.reason))
                    .collect::<Vec<_>>()
                    .join("; ")
            )));
        }
    } else {
        skipped.append(&mut own);
    }
    if usable.is_empty() && opts.reach == Reach::Routed {
        for r in remote {
            let ra = r.addr.addr();
            if local.iter().any(|l| l.addr.contains(&ra)) {
                continue; // explained above
            }
            let winners = kernel_route(routes, ra);
            let reason = if winners.is_empty() {
                format!("the kernel has no route to {ra}")
            } else {
                format!(
                    "the kernel routes {ra} {}, through no usable local link",
                    winners
                        .iter()
                        .map(|w| describe_route(w))
                        .collect::<Vec<_>>()
                        .join(" or ")
                )
            };
            skipped.push(Skipped {
                local: "routed".into(),
                remote: Some(ra),
                reason,
            });
        }
    }

    if usable.is_empty() {
        return Err(no_path_error(local, remote, &skipped));
    }

    // NCCL's device first.
    let mut dev_override = None;
    if let Some(dev) = opts.nccl_dev {
        if usable.iter().any(|u| local[u.0].nccl_dev == Some(dev)) {
            for u in usable.iter().filter(|u| local[u.0].nccl_dev != Some(dev)) {
                skipped.push(Skipped {
                    local: link_name(&local[u.0]),
                    remote: Some(remote[u.1].addr.addr()),
                    reason: format!(
                        "usable, but NCCL's device {dev} reaches the peer and is preferred"
                    ),
                });
            }
            usable.retain(|u| local[u.0].nccl_dev == Some(dev));
        } else {
            let mut used: Vec<Option<usize>> = usable.iter().map(|u| local[u.0].nccl_dev).collect();
            used.sort();
            used.dedup();
            let dev_links: Vec<String> = local
                .iter()
                .filter(|l| l.nccl_dev == Some(dev))
                .map(link_name)
                .collect();
            let others: Vec<String> = {
                let mut v: Vec<String> = usable.iter().map(|u| link_name(&local[u.0])).collect();
                v.dedup();
                v
            };
            dev_override = Some(DevOverride {
                requested: dev,
                used,
                reason: format!(
                    "NCCL chose device {dev} ({}), which shares no usable subnet with the peer ({}); using {} instead",
                    if dev_links.is_empty() {
                        "no links".to_string()
                    } else {
                        dev_links.join(", ")
                    },
                    remote
                        .iter()
                        .map(|r| r.addr.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    others.join(", ")
                ),
            });
        }
    }

    // One path per local link; most constrained links choose first.
    let mut by_local: Vec<(usize, Vec<&Usable>)> = Vec::new();
    for u in &usable {
        match by_local.iter_mut().find(|(li, _)| *li == u.0) {
            Some((_, v)) => v.push(u),
            None => by_local.push((u.0, vec![u])),
        }
    }
    let mut order: Vec<usize> = (0..by_local.len()).collect();
    order.sort_by_key(|&i| by_local[i].1.len()); // stable: ties keep link order
    let mut used_remote: Vec<usize> = Vec::new();
    let mut chosen: Vec<(usize, &Usable)> = Vec::new(); // (position in link order, pair)
    for i in order {
        let (li, opts_for_link) = &by_local[i];
        let l = &local[*li];
        // Fresh peer address first, then on-link before routed, then the link's own prefix length.
        let pick = opts_for_link.iter().min_by_key(|u| {
            (
                used_remote.contains(&u.1),
                u.4.is_some(),
                remote[u.1].addr.prefix_len() != l.addr.prefix_len(),
            )
        });
        if let Some(p) = pick {
            used_remote.push(p.1);
            chosen.push((i, p));
        }
        for u in opts_for_link.iter() {
            if Some(u) != pick {
                skipped.push(Skipped {
                    local: link_name(l),
                    remote: Some(remote[u.1].addr.addr()),
                    reason: "this link already carries a path to another of the peer's addresses"
                        .into(),
                });
            }
        }
    }
    chosen.sort_by_key(|c| c.0);

    let paths: Vec<PathChoice> = chosen
        .into_iter()
        .map(|(_, u)| PathChoice {
            local: local[u.0].clone(),
            remote: remote[u.1],
            kind: u.2,
            reason: u.3.clone(),
            via: u.4,
        })
        .collect();

    // Interleave: inside each local root by the peer's root, then across local roots.
    let mut groups: Vec<(String, Vec<PathChoice>)> = Vec::new();
    for p in paths {
        match groups
            .iter_mut()
            .find(|(root, _)| *root == p.local.pci_root)
        {
            Some((_, v)) => v.push(p),
            None => groups.push((p.local.pci_root.clone(), vec![p])),
        }
    }
    let groups: Vec<Vec<PathChoice>> = groups
        .into_iter()
        .map(|(_, v)| interleave_by(v, |p| p.remote.pci_root_id))
        .collect();
    let mut paths = round_robin(groups);

    let max = opts.max_paths.max(1);
    if paths.len() > max {
        for p in paths.drain(max..) {
            skipped.push(Skipped {
                local: link_name(&p.local),
                remote: Some(p.remote.addr.addr()),
                reason: format!("usable, but the connection is capped at {max} paths"),
            });
        }
    }
    Ok(Selection {
        paths,
        dev_override,
        skipped,
        same_host,
    })
}

/// Rule 6: the peer advertises addresses and every one of them is an address of this host.
fn is_this_host(local: &[LocalLink], remote: &[RemoteLink]) -> bool {
    !remote.is_empty()
        && remote
            .iter()
            .all(|r| local.iter().any(|l| l.addr.addr() == r.addr.addr()))
}

fn addr_list(remote: &[RemoteLink]) -> String {
    remote
        .iter()
        .map(|r| r.addr.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rule 6's pairs: each up link whose address the peer advertises, to that same address, of the
/// kind the filter allows (RoCE only when both ends say RoCE: the port's own GID).
fn loopback_pairs(
    local: &[LocalLink],
    remote: &[RemoteLink],
    kinds: KindFilter,
    usable: &mut Vec<Usable>,
    skipped: &mut Vec<Skipped>,
) {
    for (li, l) in local.iter().enumerate() {
        let Some(ri) = remote.iter().position(|r| r.addr.addr() == l.addr.addr()) else {
            continue;
        };
        let ra = l.addr.addr();
        let skip = |reason: String| Skipped {
            local: link_name(l),
            remote: Some(ra),
            reason,
        };
        let both_roce = l.kind == LinkKind::Roce && remote[ri].kind == LinkKind::Roce;
        let kind = match kinds {
            KindFilter::Roce if !both_roce => {
                skipped.push(skip(format!(
                    "RoCE paths only, but this loopback is {:?} to a {:?} address",
                    l.kind, remote[ri].kind
                )));
                continue;
            }
            KindFilter::Roce => LinkKind::Roce,
            KindFilter::Tcp => LinkKind::Tcp,
            KindFilter::Any if both_roce => LinkKind::Roce,
            KindFilter::Any => LinkKind::Tcp,
        };
        if !l.up {
            skipped.push(skip("link is down (no carrier)".into()));
            continue;
        }
        let how = match kind {
            LinkKind::Roce => "RoCE to this port's own GID",
            LinkKind::Tcp => "TCP to this link's own address",
        };
        usable.push(Usable(
            li,
            ri,
            kind,
            format!(
                "the peer is this host (it advertises only this host's addresses): loopback on {} ({how})",
                link_name(l)
            ),
            None,
        ));
    }
}

/// How close two PCIe functions are, in the classes NCCL's GPU-direct rule (`NCCL_NET_GDR_LEVEL`)
/// tells apart, judged from their PCIe roots (`pci0000:00/0000:00:01.0`: host bridge / root port) and
/// NUMA nodes. Ordered from closest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Closeness {
    /// Under one PCIe root port: traffic between them stays below the CPU (NCCL's `PIX`/`PXB`).
    SameRootPort,
    /// Under one CPU: the same NUMA node, or the same host bridge when the NUMA node is unknown
    /// (NCCL's `PHB`).
    SameNuma,
    /// Across the CPUs' interconnect, or unknown (NCCL's `SYS`).
    Farther,
}

/// [`Closeness`] of functions `a` and `b` (empty root = unknown; NUMA `None` or negative = unknown).
pub fn closeness(
    a_root: &str,
    a_numa: Option<i32>,
    b_root: &str,
    b_numa: Option<i32>,
) -> Closeness {
    if !a_root.is_empty() && a_root == b_root {
        return Closeness::SameRootPort;
    }
    let known = |n: Option<i32>| n.filter(|n| *n >= 0);
    match (known(a_numa), known(b_numa)) {
        (Some(x), Some(y)) if x == y => Closeness::SameNuma,
        (Some(_), Some(_)) => Closeness::Farther,
        _ => {
            let bridge = |r: &str| r.split('/').next().unwrap_or_default().to_string();
            if !a_root.is_empty() && bridge(a_root) == bridge(b_root) {
                Closeness::SameNuma
            } else {
                Closeness::Farther
            }
        }
    }
}

/// Reorders `items` so consecutive items alternate values of `key` (round-robin over key groups in
/// order of first appearance).
fn interleave_by<T, K: PartialEq>(items: Vec<T>, key: impl Fn(&T) -> K) -> Vec<T> {
    let mut groups: Vec<(K, Vec<T>)> = Vec::new();
    for it in items {
        let k = key(&it);
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, v)) => v.push(it),
            None => groups.push((k, vec![it])),
        }
    }
    round_robin(groups.into_iter().map(|(_, v)| v).collect())
}

fn round_robin<T>(groups: Vec<Vec<T>>) -> Vec<T> {
    let total = groups.iter().map(Vec::len).sum();
    let mut iters: Vec<std::vec::IntoIter<T>> = groups.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        for it in iters.iter_mut() {
            if let Some(x) = it.next() {
                out.push(x);
            }
        }
    }
    out
}

fn no_path_error(local: &[LocalLink], remote: &[RemoteLink], skipped: &[Skipped]) -> Error {
    let mut msg = String::from("no local link reaches the peer: it advertises ");
    if remote.is_empty() {
        msg.push_str("no link addresses");
    } else {
        msg.push_str(
            &remote
                .iter()
                .map(|r| format!("{} ({:?})", r.addr, r.kind))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    msg.push_str("; local subnets: ");
    if local.is_empty() {
        msg.push_str("none (no links found)");
    } else {
        msg.push_str(
            &local
                .iter()
                .map(|l| {
                    format!(
                        "{} on {} ({:?}, {})",
                        l.addr.trunc(),
                        l.netdev,
                        l.kind,
                        if l.up { "up" } else { "down" }
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    if !skipped.is_empty() {
        msg.push_str("; skipped: ");
        for (i, s) in skipped.iter().enumerate() {
            let sep = if i == 0 { "" } else { "; " };
            let _ = match s.remote {
                Some(r) => write!(msg, "{sep}{} -> {r}: {}", s.local, s.reason),
                None => write!(msg, "{sep}{}: {}", s.local, s.reason),
            };
        }
    }
    msg.push_str(". Each cable needs a shared subnet on both ends (see `switchless doctor` and `switchless route`)");
    Error::InvalidUsage(msg)
}

/// The acceptor's check of one path a connector asked for: `my_addr` must be one of this node's links,
/// up, and the kernel's route back to `peer_addr` must leave through that link on-link. With
/// [`Reach::Routed`] (the acceptor's `NCCL_SWITCHLESS_TCP_FALLBACK=1`), a TCP path from a connector
/// outside the link's subnet is accepted when the kernel has any route back to it (TCP does not need the
/// reply to leave through the same netdev). Either way the connector's address must be one a peer can
/// have (`check_connector_addr`: not unspecified, multicast, broadcast, the subnet's network or
/// broadcast address, loopback or this node's own, except between two ranks of one host on `lo`).
/// Returns the link; the error text goes back to the (authenticated) connector.
pub fn check_incoming<'a>(
    local: &'a [LocalLink],
    routes: &[KernelRoute],
    my_addr: Ipv4Addr,
    peer_addr: Ipv4Addr,
    kind: LinkKind,
    reach: Reach,
) -> std::result::Result<&'a LocalLink, String> {
    let Some(l) = local.iter().find(|l| l.addr.addr() == my_addr) else {
        return Err(format!(
            "{my_addr} is not an address of the acceptor's links ({})",
            local.iter().map(link_name).collect::<Vec<_>>().join(", ")
        ));
    };
    if !l.up {
        return Err(format!("the acceptor's link {} is down", link_name(l)));
    }
    check_connector_addr(l, peer_addr)?;
    if l.addr.contains(&peer_addr) {
        return check_route(l, routes, peer_addr)
            .map(|_| l)
            .map_err(|e| format!("on the acceptor, {e}"));
    }
    let outside = format!(
        "connector address {peer_addr} is outside the acceptor's subnet {} on {}",
        l.addr.trunc(),
        l.netdev
    );
    match (reach, kind) {
        (Reach::OnLink, _) => Err(format!(
            "{outside} (a routed TCP path needs NCCL_SWITCHLESS_TCP_FALLBACK=1 on the acceptor too)"
        )),
        (Reach::Routed, LinkKind::Roce) => Err(format!(
            "{outside}, and RoCE paths must be on-link (only TCP paths may be routed)"
        )),
        (Reach::Routed, LinkKind::Tcp) => {
            if kernel_route(routes, peer_addr).is_empty() {
                Err(format!(
                    "{outside}, and the acceptor's kernel has no route back to {peer_addr}"
                ))
            } else {
                Ok(l)
            }
        }
    }
}

/// Addresses no connector may claim: unspecified (`0.x.x.x`), multicast, broadcast, the network and
/// broadcast addresses of the acceptor link's subnet (prefixes up to /30), and, unless the acceptor's
/// link is itself a loopback address (two ranks of one host over `lo`), loopback addresses. An
/// address of the acceptor's own links is allowed: it is a rank of this host (NCCL connects ranks of
/// one host over the network when P2P and SHM are off), and the handshake binds the claim to the TCP
/// source address, which no other host can use.
fn check_connector_addr(l: &LocalLink, peer_addr: Ipv4Addr) -> std::result::Result<(), String> {
    let refuse = |why: &str| {
        Err(format!(
            "connector address {peer_addr} is {why}; accepted: a unicast address of the connector's own link"
        ))
    };
    if peer_addr.octets()[0] == 0 {
        return refuse("unspecified (0.x.x.x)");
    }
    if peer_addr.is_multicast() || peer_addr.is_broadcast() {
        return refuse("multicast or broadcast");
    }
    if l.addr.prefix_len() <= 30 && l.addr.contains(&peer_addr) {
        if peer_addr == l.addr.network() {
            return refuse(&format!("the network address of {}", l.addr.trunc()));
        }
        if peer_addr == l.addr.broadcast() {
            return refuse(&format!("the broadcast address of {}", l.addr.trunc()));
        }
    }
    if !l.addr.addr().is_loopback() && peer_addr.is_loopback() {
        return refuse("a loopback address");
    }
    Ok(())
}

/// Human-readable account of a selection (for `switchless route` and debug logs).
pub fn render_text(sel: &Selection, peer: &[RemoteLink]) -> String {
    let mut out = String::new();
    let peer_addrs: Vec<String> = peer.iter().map(|r| r.addr.to_string()).collect();
    let _ = writeln!(
        out,
        "{} path{} to the peer ({}):",
        sel.paths.len(),
        if sel.paths.len() == 1 { "" } else { "s" },
        peer_addrs.join(", ")
    );
    for (i, p) in sel.paths.iter().enumerate() {
        let _ = writeln!(out, "  path {i}: {p}\n          {}", p.reason);
    }
    if sel.same_host {
        let _ = writeln!(
            out,
            "the peer is this host: every path is a loopback to the link's own address"
        );
    }
    if let Some(o) = &sel.dev_override {
        let _ = writeln!(out, "NCCL device {} overridden: {}", o.requested, o.reason);
    }
    if !sel.skipped.is_empty() {
        let _ = writeln!(out, "not used:");
        for s in &sel.skipped {
            let _ = match s.remote {
                Some(r) => writeln!(out, "  {} -> {r}: {}", s.local, s.reason),
                None => writeln!(out, "  {}: {}", s.local, s.reason),
            };
        }
    }
    out
}
