//! vfpoll nvme layer (being written).
