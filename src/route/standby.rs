//! Standby paths: the paths to a peer that NCCL's device hint leaves out of a connection (rule 2 of
//! [`super::select()`]), set up beside the carrying paths so that one can take over when a carrying
//! path fails. Pure, like the rest of `route`; the comm protocol decides when a standby path
//! carries (`transport/comm/paths.rs`).
#![forbid(unsafe_code)]

use crate::route::select::{PathChoice, RouteOptions, Selection, select};
use crate::route::types::{KernelRoute, LocalLink, RemoteLink};

/// The paths to the peer advertising `remote` over links of `local` that `carrying` (the
/// connection's selection with the same inputs) does not use: what the selection would be without
/// NCCL's device hint, less the carrying links, in its striping order. Empty when the hint did not
/// restrict anything (no hint, or NCCL's device does not reach the peer: every usable link already
/// carries) or the peer is this host.
pub fn standby(
    local: &[LocalLink],
    routes: &[KernelRoute],
    remote: &[RemoteLink],
    opts: &RouteOptions,
    carrying: &Selection,
) -> Vec<PathChoice> {
    if opts.nccl_dev.is_none() || carrying.dev_override.is_some() || carrying.same_host {
        return Vec::new();
    }
    let all = RouteOptions {
        nccl_dev: None,
        ..*opts
    };
    let Ok(sel) = select(local, routes, remote, &all) else {
        return Vec::new();
    };
    sel.paths
        .into_iter()
        .filter(|p| !carrying.paths.iter().any(|c| c.local.id == p.local.id))
        .collect()
}
