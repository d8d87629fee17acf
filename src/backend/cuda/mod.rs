//! STUB (replaced by the cuda branch).
use crate::{Error, Result};
pub struct DeviceInfo;
pub fn probe() -> Result<Vec<DeviceInfo>> { Err(Error::unsupported("no CUDA support in this build")) }
