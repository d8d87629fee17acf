//! Finding CUDA devices without ever panicking, and turning driver failures into
//! [`Error`]s. cudarc panics when a library or a symbol cannot be loaded, so every
//! first contact with the driver checks the library is present and runs under
//! `catch_unwind` (see `guarded`).

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::{result, sys, DriverError};

use crate::error::{Error, Result};

/// One CUDA device as the driver reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal (`CUDA_VISIBLE_DEVICES` numbering).
    pub ordinal: usize,
    /// Marketing name, e.g. "NVIDIA H200".
    pub name: String,
    /// Total device memory in bytes.
    pub total_mem: usize,
    /// Compute capability, e.g. 9.0 for Hopper.
    pub cc_major: i32,
    pub cc_minor: i32,
    /// Driver API version as the driver encodes it: 1000 * major + 10 * minor (13000 = CUDA 13.0).
    pub driver_version: i32,
}

impl DeviceInfo {
    /// `cc_major * 10 + cc_minor`, the number in `sm_XX`.
    pub fn sm(&self) -> u32 {
        (self.cc_major * 10 + self.cc_minor).max(0) as u32
    }
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cuda:{} {} (sm_{}, {:.1} GiB, driver CUDA {}.{})",
            self.ordinal,
            self.name,
            self.sm(),
            self.total_mem as f64 / (1u64 << 30) as f64,
            self.driver_version / 1000,
            self.driver_version % 1000 / 10
        )
    }
}

/// Lists the CUDA devices. Never panics: no driver library gives `LLMRT_UNSUPPORTED`
/// ("no CUDA driver (libcuda.so not found)"), as does a driver that sees no device;
/// any other driver failure, or a panic inside cudarc, gives `LLMRT_DEVICE` with the
/// driver's words.
pub fn probe() -> Result<Vec<DeviceInfo>> {
    // SAFETY: is_culib_present only tries to dlopen the driver's library names and
    // drops what it opened; it calls no CUDA function.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::unsupported("no CUDA driver (libcuda.so not found)"));
    }
    guarded("probing CUDA devices", || {
        result::init().map_err(|e| match e.0 {
            sys::CUresult::CUDA_ERROR_NO_DEVICE => {
                Error::unsupported(format!("no CUDA device ({})", driver_msg("cuInit", e)))
            }
            _ => driver_err("cuInit", e),
        })?;
        let driver_version = driver_version()?;
        let count = result::device::get_count().map_err(|e| driver_err("cuDeviceGetCount", e))?;
        if count <= 0 {
            return Err(Error::unsupported("no CUDA device (the driver reports 0 devices)"));
        }
        (0..count).map(|i| device_info(i as usize, driver_version)).collect()
    })
}

/// The driver's CUDA version (1000 * major + 10 * minor). Call after `cuInit`.
pub(crate) fn driver_version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: cuDriverGetVersion writes one int through the valid pointer it is given.
    unsafe { sys::cuDriverGetVersion(&mut v) }.result().map_err(|e| driver_err("cuDriverGetVersion", e))?;
    Ok(v)
}

/// What the driver says about device `ordinal`. Call after `cuInit`.
pub(crate) fn device_info(ordinal: usize, driver_version: i32) -> Result<DeviceInfo> {
    let dev = result::device::get(ordinal as i32).map_err(|e| driver_err("cuDeviceGet", e))?;
    let name = result::device::get_name(dev).map_err(|e| driver_err("cuDeviceGetName", e))?;
    // SAFETY: dev is a device handle the driver just returned.
    let total_mem = unsafe { result::device::total_mem(dev) }.map_err(|e| driver_err("cuDeviceTotalMem", e))?;
    let attr = |a: sys::CUdevice_attribute| {
        // SAFETY: dev is a valid device handle; the attribute is a plain enum value.
        unsafe { result::device::get_attribute(dev, a) }.map_err(|e| driver_err("cuDeviceGetAttribute", e))
    };
    let cc_major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let cc_minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    Ok(DeviceInfo { ordinal, name, total_mem, cc_major, cc_minor, driver_version })
}

/// Runs `f`, turning a panic (cudarc's answer to a missing library or symbol) into an
/// `LLMRT_DEVICE` error naming `what` and the panic message.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            Err(Error::device(format!("{what}: the CUDA library failed: {msg}")))
        }
    }
}

/// "call: CUDA_ERROR_NAME (driver's description)".
pub(crate) fn driver_msg(call: &str, e: DriverError) -> String {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(s) => format!("{call}: {name} ({})", s.to_string_lossy()),
        Err(_) => format!("{call}: {name}"),
    }
}

/// A driver failure as an `LLMRT_DEVICE` error.
pub(crate) fn driver_err(call: &str, e: DriverError) -> Error {
    Error::device(driver_msg(call, e))
}
