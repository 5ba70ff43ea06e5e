//! vfpoll hugepages layer (being written).
