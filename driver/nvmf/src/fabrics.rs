//! The NVMe-oF controller (filled in by the fabrics work).
