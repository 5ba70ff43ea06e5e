//! Counters: per queue (kept by the driver, free to read) and per port (the NIC's statistics
//! registers, accumulated because reading them clears them).

use std::fmt;

/// Counters of one receive queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxQueueStats {
    /// Packets delivered by `rx_burst`.
    pub packets: u64,
    /// Bytes of those packets (frame length without FCS).
    pub bytes: u64,
    /// `rx_burst` calls.
    pub bursts: u64,
    /// Tail register writes (at most one per burst, none when nothing was received).
    pub doorbells: u64,
    /// Times a received packet stayed in the ring because no free buffer could replace it (the
    /// pool was empty): the device drops frames while this lasts.
    pub no_buffer: u64,
    /// Frames dropped by the driver: receive errors, or frames spanning several descriptors.
    pub errors: u64,
}

/// Counters of one transmit queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxQueueStats {
    /// Packets placed on the ring by `tx_burst`.
    pub packets: u64,
    /// Bytes of those packets.
    pub bytes: u64,
    /// `tx_burst` calls.
    pub bursts: u64,
    /// Tail register writes (at most one per burst).
    pub doorbells: u64,
    /// Packets whose transmission completed and whose buffers went back to their pool.
    pub reclaimed: u64,
    /// Reclaim batches (one pool lock each).
    pub reclaim_batches: u64,
    /// `tx_burst` calls that could not place every packet (ring full): the rest stayed with
    /// the caller.
    pub ring_full: u64,
    /// Packets refused because they were empty (dropped, not sent).
    pub dropped_empty: u64,
}

/// A port's hardware counters since it was opened (82574 datasheet §10.2, statistics registers 0x4000-0x40FF; the
/// registers clear when read, so the driver adds them up).
///
/// Byte counts are the NIC's: from the destination address through the FCS, 4 bytes per frame
/// more than the packet lengths the queues count (QEMU 7.2's e1000e leaves the FCS out of the
/// transmit byte count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Good packets received (GPRC).
    pub rx_packets: u64,
    /// Good octets received (GORC).
    pub rx_bytes: u64,
    /// Broadcast packets received (BPRC).
    pub rx_broadcast: u64,
    /// Multicast packets received (MPRC).
    pub rx_multicast: u64,
    /// Packets missed for lack of room in the receive FIFO (MPC).
    pub rx_missed: u64,
    /// Times no receive descriptor was available (RNBC): the driver did not refill fast enough.
    pub rx_no_buffer: u64,
    /// CRC errors (CRCERRS).
    pub rx_crc_errors: u64,
    /// Other receive errors (RXERRC).
    pub rx_errors: u64,
    /// Undersize, oversize, fragment and jabber frames (RUC + ROC + RFC + RJC).
    pub rx_length_errors: u64,
    /// Good packets transmitted (GPTC).
    pub tx_packets: u64,
    /// Good octets transmitted (GOTC).
    pub tx_bytes: u64,
    /// Broadcast packets transmitted (BPTC).
    pub tx_broadcast: u64,
    /// Multicast packets transmitted (MPTC).
    pub tx_multicast: u64,
}

impl fmt::Display for PortStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rx {} pkts {} bytes ({} bcast, {} mcast; missed {}, no-buffer {}, crc {}, errors {}, length {}); tx {} pkts {} bytes ({} bcast, {} mcast)",
            self.rx_packets,
            self.rx_bytes,
            self.rx_broadcast,
            self.rx_multicast,
            self.rx_missed,
            self.rx_no_buffer,
            self.rx_crc_errors,
            self.rx_errors,
            self.rx_length_errors,
            self.tx_packets,
            self.tx_bytes,
            self.tx_broadcast,
            self.tx_multicast
        )
    }
}
