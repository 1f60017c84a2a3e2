//! Per-version conversions of argument shapes: properties structs, comm configs, net attributes, and the
//! integer type of sizes. Everything else is shared by all versions.

use std::ffi::c_int;

use super::abi;
use crate::error::{Error, Result};
use crate::plugin::{CommAttr, NetAttr, NetDeviceType, Properties};

/// A properties struct of one ABI version.
pub trait PropsOut: Default {
    /// Longest fused-device list this version can carry (0 = no `vProps`).
    const MAX_VDEVS: usize;
    /// Writes `p` (device `dev`) in this version's layout.
    fn fill(&mut self, dev: c_int, p: &Properties) -> Result<()>;
}

fn int(v: u32, what: &str) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| Error::Internal(format!("{what} {v} does not fit a C int")))
}

fn device_type(t: NetDeviceType) -> abi::ncclNetDeviceType {
    match t {
        NetDeviceType::Host => abi::ncclNetDeviceType::NCCL_NET_DEVICE_HOST,
        NetDeviceType::Unpack => abi::ncclNetDeviceType::NCCL_NET_DEVICE_UNPACK,
    }
}

/// `{ndevs, devs}`: a physical device is `{1, {dev}}`.
fn vdevs<const N: usize>(dev: c_int, p: &Properties) -> Result<(c_int, [c_int; N])> {
    let mut out = [0; N];
    if p.vdevs.is_empty() {
        out[0] = dev;
        return Ok((1, out));
    }
    if p.vdevs.len() > N {
        return Err(Error::Internal(format!(
            "device {dev} fuses {} devices; this ABI version carries at most {N}",
            p.vdevs.len()
        )));
    }
    out[..p.vdevs.len()].copy_from_slice(&p.vdevs);
    Ok((p.vdevs.len() as c_int, out))
}

macro_rules! v6_fields {
    ($o:ident, $p:ident) => {
        $o.name = $p.name.as_ptr().cast_mut();
        $o.pciPath = $p
            .pci_path
            .map_or(std::ptr::null_mut(), |s| s.as_ptr().cast_mut());
        $o.guid = $p.guid;
        $o.ptrSupport = int($p.ptr_support.0, "ptr_support")?;
        $o.speed = $p.speed_mbps;
        $o.port = $p.port;
        $o.latency = $p.latency_us;
        $o.maxComms = $p.max_comms;
        $o.maxRecvs = $p.max_recvs;
    };
}
macro_rules! v7_fields {
    ($o:ident, $p:ident) => {
        $o.netDeviceType = device_type($p.net_device_type);
        $o.netDeviceVersion = $p.net_device_version;
    };
}
macro_rules! v9_fields {
    ($o:ident, $p:ident, $dev:ident, $n:expr) => {
        $o.regIsGlobal = c_int::from($p.reg_is_global);
        $o.forceFlush = c_int::from($p.force_flush);
        let (ndevs, devs) = vdevs::<{ $n }>($dev, $p)?;
        $o.vProps.ndevs = ndevs;
        $o.vProps.devs = devs;
        $o.maxP2pBytes = $p.max_p2p_bytes;
        $o.maxCollBytes = $p.max_coll_bytes;
    };
}

impl PropsOut for abi::ncclNetProperties_v6_t {
    const MAX_VDEVS: usize = 0;
    fn fill(&mut self, _dev: c_int, p: &Properties) -> Result<()> {
        let mut o = Self::default();
        v6_fields!(o, p);
        *self = o;
        Ok(())
    }
}

impl PropsOut for abi::ncclNetProperties_v7_t {
    const MAX_VDEVS: usize = 0;
    fn fill(&mut self, _dev: c_int, p: &Properties) -> Result<()> {
        let mut o = Self::default();
        v6_fields!(o, p);
        v7_fields!(o, p);
        *self = o;
        Ok(())
    }
}

impl PropsOut for abi::ncclNetProperties_v8_t {
    const MAX_VDEVS: usize = 0;
    fn fill(&mut self, _dev: c_int, p: &Properties) -> Result<()> {
        let mut o = Self::default();
        v6_fields!(o, p);
        v7_fields!(o, p);
        o.regIsGlobal = c_int::from(p.reg_is_global);
        *self = o;
        Ok(())
    }
}

macro_rules! props_v9_plus {
    ($t:ty, $n:expr, |$o:ident, $p:ident| $extra:block) => {
        impl PropsOut for $t {
            const MAX_VDEVS: usize = $n;
            fn fill(&mut self, dev: c_int, $p: &Properties) -> Result<()> {
                let mut $o = Self::default();
                v6_fields!($o, $p);
                v7_fields!($o, $p);
                v9_fields!($o, $p, dev, $n);
                $extra * self = $o;
                Ok(())
            }
        }
    };
}
const V11_DEVS: usize = abi::NCCL_NET_MAX_DEVS_PER_NIC_V11 as usize;
const V12_DEVS: usize = abi::NCCL_NET_MAX_DEVS_PER_NIC_V12 as usize;
props_v9_plus!(abi::ncclNetProperties_v9_t, V11_DEVS, |o, p| {});
props_v9_plus!(abi::ncclNetProperties_v10_t, V11_DEVS, |o, p| {});
props_v9_plus!(abi::ncclNetProperties_v11_t, V11_DEVS, |o, p| {
    o.maxMultiRequestSize = p.max_multi_request_size;
});
props_v9_plus!(abi::ncclNetProperties_v12_t, V12_DEVS, |o, p| {
    o.maxMultiRequestSize = p.max_multi_request_size;
    o.railId = p.rail_id.unwrap_or(abi::NCCL_NET_ID_UNDEF as i16);
    o.planeId = p.plane_id.unwrap_or(abi::NCCL_NET_ID_UNDEF as i16);
});

/// `ncclNetCommConfig_vN_t` (v10 connect, v11+ init).
pub trait ConfigIn {
    /// The traffic class, `None` when undefined.
    fn traffic_class(&self) -> Option<i32>;
}

macro_rules! config_in {
    ($($t:ty),*) => {$(
        impl ConfigIn for $t {
            fn traffic_class(&self) -> Option<i32> {
                (self.trafficClass != abi::NCCL_NET_TRAFFIC_CLASS_UNDEF).then_some(self.trafficClass)
            }
        }
    )*};
}
config_in!(
    abi::ncclNetCommConfig_v10_t,
    abi::ncclNetCommConfig_v11_t,
    abi::ncclNetCommConfig_v12_t
);

/// `ncclNetAttr_vN_t` (v11+ setNetAttr).
pub trait AttrIn {
    /// The hints, with `NCCL_NET_ATTR_UNDEF` as `None`.
    fn attr(&self) -> NetAttr;
}

fn opt_i(v: i32) -> Option<i32> {
    (v != abi::NCCL_NET_ATTR_UNDEF).then_some(v)
}
fn opt_u(v: u32) -> Option<u32> {
    (v != abi::NCCL_NET_ATTR_UNDEF as u32).then_some(v)
}

macro_rules! attr_in {
    ($($t:ty),*) => {$(
        impl AttrIn for $t {
            fn attr(&self) -> NetAttr {
                NetAttr {
                    send: comm_attr(&self.sendCommAttr),
                    recv: comm_attr(&self.recvCommAttr),
                    op: opt_u(self.op),
                    algo: opt_u(self.algo),
                    proto: opt_u(self.proto),
                }
            }
        }
    )*};
}

trait CommAttrIn {
    fn get(&self) -> [i32; 4];
}
macro_rules! comm_attr_in {
    ($($t:ty),*) => {$(
        impl CommAttrIn for $t {
            fn get(&self) -> [i32; 4] {
                [self.maxConcurrentPeers, self.minConcurrentPeers, self.maxFlowsPerPeer, self.minFlowsPerPeer]
            }
        }
    )*};
}
comm_attr_in!(abi::ncclNetCommAttr_v11_t, abi::ncclNetCommAttr_v12_t);

fn comm_attr(a: &impl CommAttrIn) -> CommAttr {
    let [max_p, min_p, max_f, min_f] = a.get();
    CommAttr {
        max_concurrent_peers: opt_i(max_p),
        min_concurrent_peers: opt_i(min_p),
        max_flows_per_peer: opt_i(max_f),
        min_flows_per_peer: opt_i(min_f),
    }
}
attr_in!(abi::ncclNetAttr_v11_t, abi::ncclNetAttr_v12_t);

/// The v12 struct of `attr`, `None` as `NCCL_NET_ATTR_UNDEF`: what a host (`switchless bench`)
/// passes to a plugin's `setNetAttr`; [`AttrIn::attr`] reads it back unchanged.
pub fn attr_out_v12(attr: &NetAttr) -> abi::ncclNetAttr_v12_t {
    let i = |v: Option<i32>| v.unwrap_or(abi::NCCL_NET_ATTR_UNDEF);
    let u = |v: Option<u32>| v.unwrap_or(abi::NCCL_NET_ATTR_UNDEF as u32);
    let c = |a: &CommAttr| abi::ncclNetCommAttr_v12_t {
        maxConcurrentPeers: i(a.max_concurrent_peers),
        minConcurrentPeers: i(a.min_concurrent_peers),
        maxFlowsPerPeer: i(a.max_flows_per_peer),
        minFlowsPerPeer: i(a.min_flows_per_peer),
    };
    abi::ncclNetAttr_v12_t {
        sendCommAttr: c(&attr.send),
        recvCommAttr: c(&attr.recv),
        op: u(attr.op),
        algo: u(attr.algo),
        proto: u(attr.proto),
    }
}

/// The integer type of a size argument: `int` (older versions) or `size_t`.
pub trait CSize: Copy {
    /// Bytes, or an error for a negative `int`.
    fn bytes(self) -> Result<usize>;
}

impl CSize for c_int {
    fn bytes(self) -> Result<usize> {
        usize::try_from(self).map_err(|_| {
            Error::InvalidArgument(format!("size {self} bytes is negative; sizes must be >= 0"))
        })
    }
}

impl CSize for usize {
    fn bytes(self) -> Result<usize> {
        Ok(self)
    }
}

#[cfg(test)]
mod attr_tests {
    use super::*;

    #[test]
    fn a_hint_written_for_a_plugin_reads_back_unchanged_with_undef_as_none() {
        let a = NetAttr {
            send: CommAttr {
                max_concurrent_peers: Some(4),
                min_concurrent_peers: Some(1),
                max_flows_per_peer: Some(2),
                min_flows_per_peer: Some(1),
            },
            recv: CommAttr {
                max_concurrent_peers: Some(3),
                ..CommAttr::default()
            },
            op: Some(0x7c0),
            algo: None,
            proto: Some(4),
        };
        let raw = attr_out_v12(&a);
        assert_eq!(raw.recvCommAttr.minFlowsPerPeer, -1);
        assert_eq!(raw.algo, u32::MAX);
        assert_eq!(raw.op, 0x7c0);
        assert_eq!(raw.attr(), a);
        assert_eq!(attr_out_v12(&NetAttr::default()).attr(), NetAttr::default());
    }
}
