//! Legacy descriptor formats (82574 datasheet §7.1.4 receive, §7.2 transmit): 16 bytes, the
//! buffer's bus address in the low quadword, length, command and status in the high one.
//! The driver selects them with RFCTL.EXSTEN = 0 and DEXT = 0.

use bitflags::bitflags;

bitflags! {
    /// Receive descriptor status (high quadword bits 39:32).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct RxStatus: u8 {
        /// Descriptor Done: the device has written the frame and this descriptor back.
        const DD = 1 << 0;
        /// End Of Packet: the last descriptor of the frame.
        const EOP = 1 << 1;
        /// Ignore Checksum Indication.
        const IXSM = 1 << 2;
        /// The frame was 802.1Q tagged (and the tag stripped).
        const VP = 1 << 3;
        /// UDP checksum calculated.
        const UDPCS = 1 << 4;
        /// TCP checksum calculated.
        const TCPCS = 1 << 5;
        /// IPv4 checksum calculated.
        const IPCS = 1 << 6;
        /// Passed an inexact filter.
        const PIF = 1 << 7;
    }
}

bitflags! {
    /// Receive descriptor errors (high quadword bits 47:40); with RCTL.SBP clear only
    /// checksum errors can be reported, since bad frames are not stored.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct RxErrors: u8 {
        /// CRC or alignment error.
        const CE = 1 << 0;
        /// Symbol error.
        const SE = 1 << 1;
        /// Sequence error.
        const SEQ = 1 << 2;
        /// Carrier extension error.
        const CXE = 1 << 4;
        /// TCP/UDP checksum error.
        const TCPE = 1 << 5;
        /// IPv4 checksum error.
        const IPE = 1 << 6;
        /// Data error during reception.
        const RXE = 1 << 7;
    }
}

impl RxErrors {
    /// Errors for which the frame is dropped (checksum results are only hints).
    pub const FATAL: RxErrors = RxErrors::CE
        .union(RxErrors::SE)
        .union(RxErrors::SEQ)
        .union(RxErrors::CXE)
        .union(RxErrors::RXE);
}

/// The high quadword of a written-back receive descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxWriteBack(pub u64);

impl RxWriteBack {
    /// Bytes written to the buffer (without the FCS when RCTL.SECRC is set).
    #[inline]
    pub fn length(self) -> u16 {
        self.0 as u16
    }

    /// The status byte.
    #[inline]
    pub fn status(self) -> RxStatus {
        RxStatus::from_bits_retain((self.0 >> 32) as u8)
    }

    /// The errors byte.
    #[inline]
    pub fn errors(self) -> RxErrors {
        RxErrors::from_bits_retain((self.0 >> 40) as u8)
    }

    /// Whether the device is done with the descriptor.
    #[inline]
    pub fn done(self) -> bool {
        self.0 & (1 << 32) != 0
    }

    /// Builds a write-back (device models and tests).
    pub fn new(length: u16, status: RxStatus, errors: RxErrors) -> Self {
        RxWriteBack(length as u64 | (status.bits() as u64) << 32 | (errors.bits() as u64) << 40)
    }
}

bitflags! {
    /// Transmit descriptor command (high quadword bits 31:24).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct TxCmd: u8 {
        /// End Of Packet.
        const EOP = 1 << 0;
        /// Insert FCS.
        const IFCS = 1 << 1;
        /// Insert Checksum.
        const IC = 1 << 2;
        /// Report Status: write DD back when done.
        const RS = 1 << 3;
        /// Descriptor extension (0: legacy).
        const DEXT = 1 << 5;
        /// VLAN Packet Enable.
        const VLE = 1 << 6;
        /// Interrupt Delay Enable.
        const IDE = 1 << 7;
    }
}

/// Transmit status DD (high quadword bit 32).
pub const TX_DD: u64 = 1 << 32;

/// The most bytes one legacy transmit descriptor carries.
pub const TX_MAX_LEN: usize = 16288;

/// The high quadword of a legacy transmit descriptor for one whole frame of `len` bytes: EOP,
/// IFCS (the MAC appends the FCS), and RS (write DD back, which reclaim polls) when `rs`.
#[inline]
pub fn tx_hi(len: u16, rs: bool) -> u64 {
    let mut cmd = TxCmd::EOP | TxCmd::IFCS;
    if rs {
        cmd |= TxCmd::RS;
    }
    len as u64 | (cmd.bits() as u64) << 24
}

/// Fields of a legacy transmit descriptor's high quadword (device models and tests).
pub fn tx_fields(hi: u64) -> (u16, TxCmd, bool) {
    (
        hi as u16,
        TxCmd::from_bits_retain((hi >> 24) as u8),
        hi & TX_DD != 0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        let wb = RxWriteBack(0x0000_0003_0000_003c);
        assert!(wb.done());
        assert_eq!(wb.length(), 60);
        assert_eq!(wb.status(), RxStatus::DD | RxStatus::EOP);
        assert!(wb.errors().is_empty());
        let bad = RxWriteBack::new(64, RxStatus::DD | RxStatus::EOP, RxErrors::CE | RxErrors::TCPE);
        assert!(bad.errors().intersects(RxErrors::FATAL));
        assert!(!RxErrors::TCPE.intersects(RxErrors::FATAL));
        assert_eq!(tx_hi(1514, true), 0x0b00_05ea);
        assert_eq!(tx_hi(1514, false), 0x0300_05ea);
        let (len, cmd, dd) = tx_fields(tx_hi(60, true) | TX_DD);
        assert_eq!((len, cmd, dd), (60, TxCmd::EOP | TxCmd::IFCS | TxCmd::RS, true));
    }
}
