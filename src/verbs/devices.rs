//! RDMA device probe with classic verbs (`ibv_get_device_list` / `ibv_free_device_list`).
//!
//! A NULL list is "0 devices", never a failure: the kernel without RDMA support answers NULL with errno
//! `ENOSYS`; a host without devices (or without a provider library for them) answers an empty list.

use std::ffi::CStr;
use std::path::Path;

/// One RDMA device as libibverbs lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbedDevice {
    /// Kernel device name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// Node GUID in host byte order.
    pub guid: u64,
    /// Canonical `/sys/devices/...` path of the device's parent (its PCI function), if sysfs has one.
    pub pci_path: Option<String>,
}

/// Why the list was empty, from what `ibv_get_device_list` reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoDevices {
    /// libibverbs itself could not be loaded (rdma-core is not installed).
    LibraryMissing,
    /// NULL list with errno `ENOSYS`: the kernel has no RDMA (uverbs) support.
    KernelSupportMissing,
    /// NULL list with another errno.
    ListFailed(i32),
    /// An empty list: no RDMA devices, or no provider library (ibverbs-providers) for them.
    NoneListed,
}

/// Result of [`probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The devices, in libibverbs order.
    pub devices: Vec<ProbedDevice>,
    /// Set when `devices` is empty.
    pub none: Option<NoDevices>,
}

impl Probe {
    /// One sentence saying why no device was found (empty when devices were found).
    pub fn why_none(&self) -> String {
        match self.none {
            None => String::new(),
            Some(NoDevices::LibraryMissing) => format!(
                "libibverbs.so.1 cannot be loaded: {}",
                super::sym::PACKAGE_HINT
            ),
            Some(NoDevices::KernelSupportMissing) => "ibv_get_device_list returned none (errno ENOSYS): \
                 the kernel has no RDMA support (load ib_uverbs and a driver such as mlx5_ib or rdma_rxe)"
                .to_owned(),
            Some(NoDevices::ListFailed(errno)) => format!(
                "ibv_get_device_list failed: {}",
                std::io::Error::from_raw_os_error(errno)
            ),
            Some(NoDevices::NoneListed) => "ibv_get_device_list returned none: no RDMA devices \
                 (check /sys/class/infiniband) or no provider library for them (install ibverbs-providers)"
                .to_owned(),
        }
    }
}

/// Lists the RDMA devices. Never fails: a missing list is reported in [`Probe::none`].
pub fn probe() -> Probe {
    let Ok(v) = super::sym::verbs() else {
        return Probe {
            devices: Vec::new(),
            none: Some(NoDevices::LibraryMissing),
        };
    };
    let mut num: libc::c_int = 0;
    // SAFETY: `num` is a valid out-pointer; the returned list (or NULL) is only read below and freed once.
    let list = unsafe { (v.get_device_list)(&mut num) };
    if list.is_null() {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let none = if errno == libc::ENOSYS {
            NoDevices::KernelSupportMissing
        } else if errno == 0 {
            NoDevices::NoneListed
        } else {
            NoDevices::ListFailed(errno)
        };
        return Probe {
            devices: Vec::new(),
            none: Some(none),
        };
    }
    let mut devices = Vec::new();
    for i in 0..usize::try_from(num).unwrap_or(0) {
        // SAFETY: the list holds `num` non-NULL device pointers followed by NULL; `i < num`.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a device of the live list; the name is a NUL-terminated string inside it.
        let name_ptr = unsafe { (v.get_device_name)(dev) };
        if name_ptr.is_null() {
            continue;
        }
        // SAFETY: non-NULL, NUL-terminated, valid until the list is freed (copied before that).
        let name = unsafe { CStr::from_ptr(name_ptr) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: `dev` is a device of the live list.
        let guid = u64::from_be(unsafe { (v.get_device_guid)(dev) });
        let pci_path = std::fs::canonicalize(
            Path::new("/sys/class/infiniband")
                .join(&name)
                .join("device"),
        )
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
        devices.push(ProbedDevice {
            name,
            guid,
            pci_path,
        });
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed exactly once; no pointer into it is kept.
    unsafe { (v.free_device_list)(list) };
    let none = devices.is_empty().then_some(NoDevices::NoneListed);
    Probe { devices, none }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "loads libibverbs with dlopen; Miri cannot call C")]
    fn probe_agrees_with_sysfs() {
        let p = probe();
        let sysfs = std::fs::read_dir("/sys/class/infiniband")
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(
            p.devices.len(),
            sysfs,
            "probe {p:?} vs /sys/class/infiniband"
        );
        assert_eq!(p.none.is_some(), p.devices.is_empty());
        if p.devices.is_empty() {
            assert!(
                p.why_none().contains("ibv_get_device_list"),
                "{}",
                p.why_none()
            );
        } else {
            // Counted by the soft-RoCE lab's CI step: this branch ran where verbs exist.
            println!("RDMA-BRANCH verbs::devices::probe_agrees_with_sysfs");
        }
    }

    #[test]
    fn reasons_are_specific() {
        let mk = |n| Probe {
            devices: vec![],
            none: Some(n),
        };
        assert!(
            mk(NoDevices::KernelSupportMissing)
                .why_none()
                .contains("ENOSYS")
        );
        assert!(
            mk(NoDevices::NoneListed)
                .why_none()
                .contains("ibverbs-providers")
        );
        assert!(
            mk(NoDevices::ListFailed(libc::EACCES))
                .why_none()
                .contains("ermission")
        );
    }
}
