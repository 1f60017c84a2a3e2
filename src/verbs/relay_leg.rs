//! K's half of a verbs relay leg on real devices: [`VerbsLegs`], the relay service's
//! [`LegFactory`] over [`VerbsFabric`]. For each leg it makes one RC queue pair on the RDMA device
//! of the link to A and one on the link to B (each a one-path `VerbsFabric`, so the forwarder
//! drives them through the same `Fabric` calls as any connection), two staging rings in host
//! memory registered on both, and connects the first to A's end at once and the second to B's
//! once A's peer message names it. Failback never rebuilds a leg's queue pair (a new leg needs
//! the set-up again), so K's failback secret is random and never used.
#![forbid(unsafe_code)]

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::sys::rawmem::HostBuffer;
use crate::transport::fabric::RemoteSeg;
use crate::transport::handshake::auth::ConnSecret;
use crate::transport::relay::forward::Forwarder;
use crate::transport::relay::leg_setup::{Geometry, Offer, Peer, QpEnd, Ready, Window};
use crate::transport::relay::pump::PumpLeg;
use crate::transport::relay::{LegFactory, PendingLeg, RelayLink};

use super::fabric::{LocalEnd, QpTuning, RemoteEnd, VerbsFabric, VerbsPath};

/// The relay service's verbs legs over this host's RDMA devices (module docs).
#[derive(Debug)]
pub struct VerbsLegs {
    /// The device port and GID of each link, by netdev.
    paths: HashMap<String, VerbsPath>,
    tuning: QpTuning,
}

impl VerbsLegs {
    /// `paths`: for each point-to-point link's netdev, its RDMA device port and IPv4 RoCE v2 GID.
    pub fn new(paths: HashMap<String, VerbsPath>, tuning: QpTuning) -> VerbsLegs {
        VerbsLegs { paths, tuning }
    }

    fn path(&self, l: &RelayLink) -> Result<&VerbsPath> {
        self.paths.get(&l.netdev).ok_or_else(|| {
            Error::System(format!(
                "relay link {} ({}) has no RDMA device with an IPv4 RoCE v2 GID",
                l.netdev, l.addr
            ))
        })
    }
}

fn remote(e: &QpEnd) -> RemoteEnd {
    RemoteEnd {
        qpn: e.qpn,
        psn: e.psn,
        gid: e.gid,
        mtu: u32::from(e.mtu),
        mailbox: 0,
        mailbox_rkey: 0,
    }
}

fn local(e: &LocalEnd) -> Result<QpEnd> {
    Ok(QpEnd {
        qpn: e.qpn,
        psn: e.psn,
        gid: e.gid,
        mtu: u16::try_from(e.mtu)
            .map_err(|_| Error::Internal(format!("active MTU of {} bytes", e.mtu)))?,
    })
}

fn window(r: RemoteSeg) -> Window {
    Window {
        addr: r.addr,
        rkey: r.rkey,
    }
}

fn unused_secret() -> Result<ConnSecret> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b)
        .map_err(|e| Error::System(format!("reading random bytes for a relay leg: {e}")))?;
    Ok(ConnSecret::from_bytes(b))
}

struct Pending {
    k: Forwarder<VerbsFabric, HostBuffer>,
    ready: Ready,
    tuning: QpTuning,
    secret: ConnSecret,
}

impl LegFactory for VerbsLegs {
    fn create(
        &self,
        from: &RelayLink,
        to: &RelayLink,
        offer: &Offer,
        ring: Geometry,
    ) -> Result<Box<dyn PendingLeg>> {
        let ka = VerbsFabric::new(std::slice::from_ref(self.path(from)?), false)?;
        let kb = VerbsFabric::new(std::slice::from_ref(self.path(to)?), false)?;
        let secret = unused_secret()?;
        ka.connect(&[remote(&offer.a)], &self.tuning, &secret)?;
        let (end_a, end_b) = (local(&ka.local_ends()[0])?, local(&kb.local_ends()[0])?);
        let bytes = usize::try_from(ring.bytes())
            .map_err(|_| Error::InvalidArgument(format!("a ring of {} bytes", ring.bytes())))?;
        let rings = [HostBuffer::new(bytes)?, HostBuffer::new(bytes)?];
        let credit = RemoteSeg {
            addr: offer.credit.addr,
            rkey: offer.credit.rkey,
        };
        let k = Forwarder::new(
            [ka, kb],
            [0, 0],
            rings,
            ring.slots,
            ring.slot_bytes as usize,
            credit,
        )?;
        let ready = Ready {
            k_a: end_a,
            ring_a: window(k.ring(0)?),
            k_b: end_b,
            ring_b: window(k.ring(1)?),
            ring,
        };
        Ok(Box::new(Pending {
            k,
            ready,
            tuning: self.tuning,
            secret,
        }))
    }
}

impl PendingLeg for Pending {
    fn ready(&self) -> Ready {
        self.ready
    }

    fn finish(self: Box<Self>, peer: &Peer) -> Result<Box<dyn PumpLeg>> {
        let Pending {
            mut k,
            tuning,
            secret,
            ..
        } = *self;
        k.end(1)?.connect(&[remote(&peer.b)], &tuning, &secret)?;
        k.peer(RemoteSeg {
            addr: peer.credit.addr,
            rkey: peer.credit.rkey,
        })?;
        Ok(Box::new(k))
    }
}
