//! VFIO (being written).
