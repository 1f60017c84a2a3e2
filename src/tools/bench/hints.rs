//! The `setNetAttr` hints `switchless bench` gives the plugin right before each `connect` and
//! `accept`, as NCCL 2.30 does (`populateCommNetAttrs` in `src/transport/net.cc`, called by
//! `sendConnect`/`recvConnect` before the proxy's `connect`/`accept`): the connect-time hint of
//! the connection's kind. The plugin's mesh relay policy reads it (docs/guide/relay.md).
#![forbid(unsafe_code)]

use crate::ffi::loader::net::{CommAttr, NetAttr};

/// `--net-attr`: whether the bench calls `setNetAttr` before each connect and accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NetAttrMode {
    /// NCCL's connect-time hint of each connection's kind (collective or p2p).
    #[default]
    Nccl,
    /// Never call `setNetAttr` (as a pre-v11 NCCL, or this bench before it gave hints).
    None,
}

/// What NCCL would call a connection: one of a collective's rings/trees (its `connIndex` 0
/// connectors) or a p2p one (`p2pOnly`: send/recv, alltoall, scatter, gather).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnKind {
    /// A collective's connection; `channels` is NCCL's `nChannels` (its flows per peer).
    Collective { channels: usize },
    /// A p2p connection; `channels` is NCCL's `p2pnChannels`, `per_peer` its
    /// `p2pnChannelsPerPeer`.
    P2p { channels: usize, per_peer: usize },
}

/// `NCCL_MAX_TREE_ARITY` (NCCL's `src/include/device.h`): a tree node talks to at most
/// 2 × (arity − 1) peers, the concurrent peers of a collective connection's hint.
pub const NCCL_MAX_TREE_ARITY: usize = 3;
/// `NCCL_MAX_DEV_WORK_P2P_PER_BATCH`: p2p operations per channel in one batch, the concurrent
/// peers per p2p channel of a p2p connection's hint.
pub const NCCL_MAX_DEV_WORK_P2P_PER_BATCH: usize = 8;
/// `ncclNetAttr.op` of a p2p connection: `BIT(ncclFuncSend) | BIT(ncclFuncRecv) |
/// BIT(ncclFuncAlltoAll) | BIT(ncclFuncScatter) | BIT(ncclFuncGather)` (NCCL 2.30's `ncclFunc_t`:
/// Send 6, Recv 7, AlltoAll 8, Scatter 9, Gather 10).
pub const OP_P2P_CONNECT: u32 = (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10);

fn clamp(v: usize) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// NCCL's connect-time hint of a connection of `kind` in a communicator of `nranks` ranks: min
/// peers and min flows 1 both ways; a collective connection leaves `op`, `algo` and `proto`
/// undefined and names min(2 × (arity − 1), ranks) peers and `channels` flows; a p2p connection
/// names the p2p op bits, min(p2p channels × 8, ranks) peers and its channels per peer as flows.
pub fn connect_hint(kind: ConnKind, nranks: usize) -> NetAttr {
    let (peers, flows, op) = match kind {
        ConnKind::Collective { channels } => {
            (((NCCL_MAX_TREE_ARITY - 1) * 2).min(nranks), channels, None)
        }
        ConnKind::P2p { channels, per_peer } => (
            channels
                .saturating_mul(NCCL_MAX_DEV_WORK_P2P_PER_BATCH)
                .min(nranks),
            per_peer,
            Some(OP_P2P_CONNECT),
        ),
    };
    let a = CommAttr {
        max_concurrent_peers: Some(clamp(peers)),
        min_concurrent_peers: Some(1),
        max_flows_per_peer: Some(clamp(flows)),
        min_flows_per_peer: Some(1),
    };
    NetAttr {
        send: a,
        recv: a,
        op,
        algo: None,
        proto: None,
    }
}

/// The hint the bench gives before each connect and accept of its connections under `mode`
/// (`None`: no `setNetAttr` call).
pub fn bench_hint(mode: NetAttrMode, kind: ConnKind, nranks: usize) -> Option<NetAttr> {
    match mode {
        NetAttrMode::Nccl => Some(connect_hint(kind, nranks)),
        NetAttrMode::None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RelayMode;
    use crate::plugin::switchless::relay::mesh_relay;

    #[test]
    fn a_collective_connection_names_few_peers_its_channels_and_nothing_else() {
        for (nranks, peers) in [(2, 2), (3, 3), (4, 4), (8, 4), (64, 4)] {
            let h = connect_hint(ConnKind::Collective { channels: 16 }, nranks);
            for a in [h.send, h.recv] {
                assert_eq!(a.max_concurrent_peers, Some(peers), "{nranks} ranks");
                assert_eq!(a.min_concurrent_peers, Some(1));
                assert_eq!(a.max_flows_per_peer, Some(16));
                assert_eq!(a.min_flows_per_peer, Some(1));
            }
            assert_eq!((h.op, h.algo, h.proto), (None, None, None));
            // The plugin's mesh policy adds relay paths to such a connection.
            assert!(mesh_relay(RelayMode::Auto, Some(&h)), "{nranks} ranks");
            assert!(!mesh_relay(RelayMode::Off, Some(&h)));
        }
    }

    #[test]
    fn a_p2p_connection_names_the_p2p_ops_and_its_fan_out() {
        for (channels, nranks, peers) in
            [(1, 2, 2), (1, 4, 4), (1, 16, 8), (4, 16, 16), (4, 64, 32)]
        {
            let h = connect_hint(
                ConnKind::P2p {
                    channels,
                    per_peer: 1,
                },
                nranks,
            );
            for a in [h.send, h.recv] {
                assert_eq!(
                    a.max_concurrent_peers,
                    Some(peers),
                    "{channels} ch {nranks} ranks"
                );
                assert_eq!(a.min_concurrent_peers, Some(1));
                assert_eq!(a.max_flows_per_peer, Some(1));
                assert_eq!(a.min_flows_per_peer, Some(1));
            }
            // send, recv, alltoall, scatter, gather; no collective bit; algo, proto undefined
            assert_eq!(h.op, Some(0x7c0));
            assert_eq!(h.op.unwrap_or(0) & 0x1f, 0);
            assert_eq!((h.algo, h.proto), (None, None));
            // Never relay paths, whatever NCCL_SWITCHLESS_RELAY says.
            for m in [RelayMode::Auto, RelayMode::Always, RelayMode::Off] {
                assert!(
                    !mesh_relay(m, Some(&h)),
                    "{m:?} {channels} ch {nranks} ranks"
                );
            }
        }
    }

    #[test]
    fn none_gives_no_hint() {
        let k = ConnKind::Collective { channels: 2 };
        assert_eq!(bench_hint(NetAttrMode::None, k, 4), None);
        assert_eq!(
            bench_hint(NetAttrMode::Nccl, k, 4),
            Some(connect_hint(k, 4))
        );
    }
}
