//! MMIO accessor (being written).
