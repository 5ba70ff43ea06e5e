//! Binding devices to vfio-pci and back (being written).
