//! NCCL's own communication patterns at the network level, one rank per host, as a list of network
//! steps per rank ([`Plan`]) that `super::pipeline` runs over a [`Net`](super::Net). Ported from
//! NVIDIA/nccl v2.30.7-1 (master `5067397`; paths relative to that repository):
//!
//! * **Ring all-reduce**: every channel's ring runs the hosts in rank order, node n sending to
//!   node n+1 (`src/graph/connect.cc:95-113`, `connectRings`); each channel's share is cut into
//!   loops of `nranks` chunks of `ALLREDUCE_CHUNKSTEPS` = 4 steps (`src/include/collectives.h:20`,
//!   `src/enqueue.cc:2221-2225`), a loop being send, n-2 receive-reduce-send, receive-reduce-copy-
//!   send, n-2 receive-copy-send, receive (`src/device/all_reduce.h:14-83`, `runRing`).
//! * **Tree all-reduce**: NCCL's double binary tree over the hosts (`src/graph/trees.cc:32-112`,
//!   [`btree`], [`dtree`]); the first half of the channels use tree 0, their duplicates tree 1
//!   (`src/graph/connect.cc:69-73`, `138-176`); chunks of one step, reduced up and broadcast down
//!   at once (`src/device/all_reduce.h:145-225`, `runTreeSplit`, the SIMPLE kernel at `236-245`).
//! * **Alltoall**: the peers in `ncclP2pSchedule` order (`src/init.cc:888-953`; with one rank per
//!   host the groups are single ranks and the deltas run the quadratic sequence), every peer at once
//!   (NCCL fits all peers of these sizes in one round: `src/graph/paths.cc:993-1001`), each
//!   peer's bytes over its p2p channels in chunks of `NCCL_P2P_NET_CHUNKSIZE` (128 KiB, doubled on
//!   Arm hosts with compute capability 10+ such as GB10: `src/init.cc:818`, `829-834`).
//!
//! Every connection keeps `NCCL_STEPS` = 8 steps in flight (`src/include/device.h:26`), a step of
//! SIMPLE being the 4 MiB buffer / 8 = 512 KiB (`src/init.cc:813`).
#![forbid(unsafe_code)]

/// Steps in flight per connection.
pub const NCCL_STEPS: usize = 8;
/// A SIMPLE step: `DEFAULT_BUFFSIZE` (4 MiB) / `NCCL_STEPS`.
pub const STEP_BYTES: usize = 512 << 10;
/// A ring all-reduce chunk in steps (`ALLREDUCE_CHUNKSTEPS`).
pub const RING_CHUNK_STEPS: usize = NCCL_STEPS / 2;
/// `NCCL_P2P_NET_CHUNKSIZE` on x86 hosts (B300); GB10 uses twice this.
pub const P2P_NET_CHUNK_BYTES: usize = 128 << 10;

/// A rank's place in one binary tree: parent and children (`None`: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeNode {
    pub up: Option<usize>,
    pub down: [Option<usize>; 2],
}

impl TreeNode {
    /// The children that exist.
    pub fn children(&self) -> impl Iterator<Item = usize> + '_ {
        self.down.iter().flatten().copied()
    }
}

fn opt(x: i64) -> Option<usize> {
    usize::try_from(x).ok()
}

/// NCCL's binary tree over `n` ranks (`ncclGetBtree`, `src/graph/trees.cc:32-67`), including its
/// loop that recomputes the second child once before halving.
pub fn btree(n: usize, rank: usize) -> TreeNode {
    let (n, rank) = (n as i64, rank as i64);
    let mut bit: i64 = 1;
    while bit < n {
        if bit & rank != 0 {
            break;
        }
        bit <<= 1;
    }
    if rank == 0 {
        return TreeNode {
            up: None,
            down: [None, if n > 1 { opt(bit >> 1) } else { None }],
        };
    }
    let mut up = (rank ^ bit) | (bit << 1);
    if up >= n {
        up = rank ^ bit;
    }
    let mut lowbit = bit >> 1;
    let down0 = if lowbit == 0 { -1 } else { rank - lowbit };
    let mut down1 = if lowbit == 0 { -1 } else { rank + lowbit };
    while down1 >= n {
        down1 = if lowbit == 0 { -1 } else { rank + lowbit };
        lowbit >>= 1;
    }
    TreeNode {
        up: opt(up),
        down: [opt(down0), opt(down1)],
    }
}

/// NCCL's double binary tree (`ncclGetDtree`, `src/graph/trees.cc:90-112`): tree 0 the binary
/// tree, tree 1 its mirror (even `n`) or the binary tree shifted by one rank (odd `n`).
pub fn dtree(n: usize, rank: usize) -> [TreeNode; 2] {
    let t0 = btree(n, rank);
    let t1 = if n % 2 == 1 {
        let b = btree(n, (rank + n - 1) % n);
        let f = |x: Option<usize>| x.map(|v| (v + 1) % n);
        TreeNode {
            up: f(b.up),
            down: [f(b.down[0]), f(b.down[1])],
        }
    } else {
        let b = btree(n, n - 1 - rank);
        let f = |x: Option<usize>| x.map(|v| n - 1 - v);
        TreeNode {
            up: f(b.up),
            down: [f(b.down[0]), f(b.down[1])],
        }
    };
    [t0, t1]
}

/// `ncclP2pSchedule` with one rank per host (`src/init.cc:888-953`): per round, the peer to send
/// to and the peer to receive from; the first round is the rank itself.
pub fn p2p_schedule(n: usize, rank: usize) -> Vec<(usize, usize)> {
    let pow2 = n.next_power_of_two();
    let mut out = Vec::with_capacity(n);
    let (mut round, mut delta) = (0usize, 0usize);
    loop {
        if delta < n {
            out.push(((rank + delta) % n, (rank + n - delta) % n));
        }
        round += 1;
        delta = (delta + round) & (pow2 - 1);
        if round == pow2 {
            break;
        }
    }
    out
}

/// What a step does with the rank's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// f32 elements from `lo`: a send copies them out; a receive adds into them (`add`) or
    /// stores them.
    Elems { lo: usize, add: bool },
    /// Bytes of the pattern of (src, dst, index) (and the iteration): a send fills, a receive
    /// checks.
    Pattern { src: usize, dst: usize, index: u64 },
}

/// One network step: a send or a receive of `bytes` on one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub send: bool,
    /// Index into [`Plan::sends`] or [`Plan::recvs`].
    pub link: usize,
    pub bytes: usize,
    /// Receive steps whose data a send needs first.
    pub deps: Vec<usize>,
    pub data: Data,
}

/// One rank's connections and steps for one operation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// (peer, channel) of each send connection, in posting order.
    pub sends: Vec<(usize, usize)>,
    pub recvs: Vec<(usize, usize)>,
    /// In order per connection.
    pub steps: Vec<Step>,
    /// f32 elements of the rank's array (0 for byte patterns).
    pub count: usize,
}

impl Plan {
    fn link(list: &mut Vec<(usize, usize)>, key: (usize, usize)) -> usize {
        match list.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                list.push(key);
                list.len() - 1
            }
        }
    }

    fn recv(&mut self, key: (usize, usize), lo: usize, elems: usize, add: bool) -> usize {
        let link = Plan::link(&mut self.recvs, key);
        self.steps.push(Step {
            send: false,
            link,
            bytes: elems * 4,
            deps: vec![],
            data: Data::Elems { lo, add },
        });
        self.steps.len() - 1
    }

    fn send(&mut self, key: (usize, usize), lo: usize, elems: usize, deps: Vec<usize>) {
        let link = Plan::link(&mut self.sends, key);
        self.steps.push(Step {
            send: true,
            link,
            bytes: elems * 4,
            deps,
            data: Data::Elems { lo, add: false },
        });
    }
}

/// Element range `[lo, hi)` of part `i` of `parts` near-equal parts of `count`.
fn part(count: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = count / parts;
    let rem = count % parts;
    let lo = i * base + i.min(rem);
    (lo, lo + base + usize::from(i < rem))
}

/// `[lo, hi)` cut into pieces of at most `max` elements.
fn pieces(lo: usize, hi: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    (lo..hi)
        .step_by(max.max(1))
        .map(move |a| (a, (a + max.max(1)).min(hi)))
}

/// The ring all-reduce of `count` f32 over `channels` channels, as rank `me` of `n` runs it.
pub fn ring_allreduce(me: usize, n: usize, channels: usize, count: usize) -> Plan {
    let mut p = Plan {
        count,
        ..Plan::default()
    };
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    for ch in 0..channels {
        // both connections exist even for a channel without data
        Plan::link(&mut p.sends, (next, ch));
        Plan::link(&mut p.recvs, (prev, ch));
    }
    let step_elems = STEP_BYTES / 4;
    let chunk_elems = RING_CHUNK_STEPS * step_elems;
    for ch in 0..channels {
        let (clo, chi) = part(count, channels, ch);
        let ccount = chi - clo;
        let loop_elems = n * chunk_elems;
        let mut off = 0;
        while off < ccount {
            let rem = ccount - off;
            // the last loop's chunks: rem / n rounded up to 16 B (all_reduce.h:37)
            let chunk = if rem < loop_elems {
                rem.div_ceil(n).div_ceil(4) * 4
            } else {
                chunk_elems
            };
            let range = |c: usize| {
                let a = (c * chunk).min(rem);
                let b = (a + chunk).min(rem);
                (clo + off + a, clo + off + b)
            };
            // (chunk index, receive kind, send after) per ring step, all_reduce.h:34-83
            let mut plan: Vec<(usize, Option<bool>, bool)> = vec![((me + n - 1) % n, None, true)];
            for j in 2..n {
                plan.push(((me + n - j) % n, Some(true), true));
            }
            plan.push((me, Some(true), true));
            for j in 1..n - 1 {
                plan.push(((me + n - j) % n, Some(false), true));
            }
            plan.push(((me + 1) % n, Some(false), false));
            for (c, recv, send) in plan {
                let (a, b) = range(c);
                for (x, y) in pieces(a, b, step_elems) {
                    let dep = recv.map(|add| p.recv((prev, ch), x, y - x, add));
                    if send {
                        p.send((next, ch), x, y - x, dep.into_iter().collect());
                    }
                }
            }
            off += n * chunk;
        }
    }
    p
}

/// The tree all-reduce of `count` f32 over `channels` channels (the first half on tree 0, the
/// rest on tree 1), as rank `me` of `n` runs it.
pub fn tree_allreduce(me: usize, n: usize, channels: usize, count: usize) -> Plan {
    let mut p = Plan {
        count,
        ..Plan::default()
    };
    let trees = dtree(n, me);
    let step_elems = STEP_BYTES / 4;
    for ch in 0..channels {
        let t = trees[usize::from(ch >= channels.div_ceil(2))];
        for k in t.up.into_iter().chain(t.children()) {
            Plan::link(&mut p.sends, (k, ch));
            Plan::link(&mut p.recvs, (k, ch));
        }
    }
    for ch in 0..channels {
        let t = trees[usize::from(ch >= channels.div_ceil(2))];
        let (clo, chi) = part(count, channels, ch);
        for (x, y) in pieces(clo, chi, step_elems) {
            let e = y - x;
            // reduce up: the children's partial sums into ours, then ours to the parent
            let from_children: Vec<usize> =
                t.children().map(|c| p.recv((c, ch), x, e, true)).collect();
            match t.up {
                Some(parent) => {
                    p.send((parent, ch), x, e, from_children);
                    // broadcast down: the parent's result, then on to the children
                    let got = p.recv((parent, ch), x, e, false);
                    for c in t.children() {
                        p.send((c, ch), x, e, vec![got]);
                    }
                }
                None => {
                    for c in t.children() {
                        p.send((c, ch), x, e, from_children.clone());
                    }
                }
            }
        }
    }
    p
}

/// Alltoall of `bytes` per peer, over `channels` connections per peer in chunks of `chunk`
/// bytes, peers in `ncclP2pSchedule` order, as rank `me` of `n` runs it.
pub fn alltoall(me: usize, n: usize, channels: usize, bytes: usize, chunk: usize) -> Plan {
    let mut p = Plan::default();
    let sched = p2p_schedule(n, me);
    for &(to, from) in &sched {
        for ch in 0..channels {
            if to != me {
                Plan::link(&mut p.sends, (to, ch));
            }
            if from != me {
                Plan::link(&mut p.recvs, (from, ch));
            }
        }
    }
    for &(to, from) in &sched {
        for ch in 0..channels {
            let (lo, hi) = part(bytes, channels, ch);
            for (i, (a, b)) in pieces(lo, hi, chunk).enumerate() {
                let index = (ch as u64) << 32 | i as u64;
                if to != me {
                    let link = Plan::link(&mut p.sends, (to, ch));
                    p.steps.push(Step {
                        send: true,
                        link,
                        bytes: b - a,
                        deps: vec![],
                        data: Data::Pattern {
                            src: me,
                            dst: to,
                            index,
                        },
                    });
                }
                if from != me {
                    let link = Plan::link(&mut p.recvs, (from, ch));
                    p.steps.push(Step {
                        send: false,
                        link,
                        bytes: b - a,
                        deps: vec![],
                        data: Data::Pattern {
                            src: from,
                            dst: me,
                            index,
                        },
                    });
                }
            }
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Host pairs a double binary tree uses, with the number of trees using each.
    fn tree_pairs(n: usize) -> BTreeMap<(usize, usize), usize> {
        let mut m = BTreeMap::new();
        for r in 0..n {
            for t in dtree(n, r) {
                if let Some(u) = t.up {
                    *m.entry((r.min(u), r.max(u))).or_insert(0) += 1;
                }
            }
        }
        m
    }

    #[test]
    fn double_binary_trees_use_the_pairs_mesh_collectives_md_lists() {
        // review §1.2: N=3 {0,2}x2 {1,2} {0,1}; N=4 {1,2}x2 {0,2} {2,3} {1,3} {0,1}, not {0,3}
        let m3: Vec<_> = tree_pairs(3).into_iter().collect();
        assert_eq!(m3, vec![((0, 1), 1), ((0, 2), 2), ((1, 2), 1)]);
        let m4: Vec<_> = tree_pairs(4).into_iter().collect();
        assert_eq!(
            m4,
            vec![
                ((0, 1), 1),
                ((0, 2), 1),
                ((1, 2), 2),
                ((1, 3), 1),
                ((2, 3), 1)
            ]
        );
        // N=8: 12 of 28 pairs, {1,2} and {5,6} in both trees
        let m8 = tree_pairs(8);
        assert_eq!(m8.len(), 12);
        assert_eq!(m8[&(1, 2)], 2);
        assert_eq!(m8[&(5, 6)], 2);
        // every tree: one root, every other rank one parent whose children include it
        for n in 2..=9 {
            for t in 0..2 {
                let nodes: Vec<TreeNode> = (0..n).map(|r| dtree(n, r)[t]).collect();
                assert_eq!(nodes.iter().filter(|x| x.up.is_none()).count(), 1, "n={n}");
                for (r, x) in nodes.iter().enumerate() {
                    if let Some(u) = x.up {
                        assert!(nodes[u].children().any(|c| c == r), "n={n} t={t} r={r}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_p2p_schedule_is_nccls_quadratic_sequence() {
        // init.cc's comment: the sequence for 16 ranks
        let d: Vec<usize> = p2p_schedule(16, 0).iter().map(|x| x.0).collect();
        assert_eq!(
            d,
            vec![0, 1, 3, 6, 10, 15, 5, 12, 4, 13, 7, 2, 14, 11, 9, 8]
        );
        for n in 2..=9 {
            for r in 0..n {
                let s = p2p_schedule(n, r);
                assert_eq!(s.len(), n);
                assert_eq!(s[0], (r, r));
                let mut to: Vec<usize> = s.iter().map(|x| x.0).collect();
                to.sort_unstable();
                assert_eq!(to, (0..n).collect::<Vec<_>>());
                // round k: I send to the rank that receives from me in its round k
                for (k, &(t, _)) in s.iter().enumerate() {
                    assert_eq!(p2p_schedule(n, t)[k].1, r);
                }
            }
        }
    }

    /// Sends of `me`'s plan must match the next rank's receives one for one (bytes, in order).
    fn matched(plans: &[Plan]) {
        let n = plans.len();
        for (me, p) in plans.iter().enumerate() {
            for (li, &(peer, ch)) in p.sends.iter().enumerate() {
                let out: Vec<usize> = p
                    .steps
                    .iter()
                    .filter(|s| s.send && s.link == li)
                    .map(|s| s.bytes)
                    .collect();
                let q = &plans[peer];
                let ri = q.recvs.iter().position(|k| *k == (me, ch)).unwrap();
                let inn: Vec<usize> = q
                    .steps
                    .iter()
                    .filter(|s| !s.send && s.link == ri)
                    .map(|s| s.bytes)
                    .collect();
                assert_eq!(out, inn, "{me} -> {peer} ch {ch} of {n}");
            }
        }
    }

    #[test]
    fn every_send_has_its_receive() {
        for n in [2, 3, 4, 5, 8] {
            for count in [1usize, 7, 1000, 3 << 20] {
                matched(
                    &(0..n)
                        .map(|r| ring_allreduce(r, n, 2, count))
                        .collect::<Vec<_>>(),
                );
                matched(
                    &(0..n)
                        .map(|r| tree_allreduce(r, n, 4, count))
                        .collect::<Vec<_>>(),
                );
            }
            matched(
                &(0..n)
                    .map(|r| alltoall(r, n, 2, 1 << 20, 128 << 10))
                    .collect::<Vec<_>>(),
            );
        }
    }

    #[test]
    fn a_ring_sends_twice_the_data_over_n_minus_one_of_n_and_a_tree_once_per_direction() {
        let count = 4 << 20;
        for n in [3, 4, 8] {
            let p = ring_allreduce(0, n, 2, count);
            let sent: usize = p.steps.iter().filter(|s| s.send).map(|s| s.bytes).sum();
            let want = 2 * (n - 1) * count * 4 / n;
            assert!(sent.abs_diff(want) <= 2 * n * 16, "n={n}: {sent} vs {want}");
            assert!(p.steps.iter().all(|s| s.bytes <= STEP_BYTES));
            // tree: every rank but the root sends each element of its tree's channels up once
            // and receives it down once: 2(n-1) times the data over all ranks
            let sent: usize = (0..n)
                .flat_map(|r| tree_allreduce(r, n, 2, count).steps)
                .filter(|s| s.send)
                .map(|s| s.bytes)
                .sum();
            assert_eq!(sent, 2 * (n - 1) * count * 4, "n={n}");
        }
    }
}
