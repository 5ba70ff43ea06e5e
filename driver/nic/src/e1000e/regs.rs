//! The 82574's registers in BAR0 (Intel 82574 GbE Controller Family Datasheet, chapter 10,
//! "Programming Interface"; offsets from its register summary). Only what the driver uses.

use bitflags::bitflags;

/// Register offsets in BAR0.
pub mod off {
    /// Device Control (§10.2.2.1).
    pub const CTRL: usize = 0x0000;
    /// Device Status (§10.2.2.2).
    pub const STATUS: usize = 0x0008;
    /// EEPROM/Flash Control (EEC): bit 9 Auto_RD, NVM auto-read done after a reset.
    pub const EEC: usize = 0x0010;
    /// EEPROM Read (EERD): read NVM words through the controller.
    pub const EERD: usize = 0x0014;
    /// Extended Device Control (CTRL_EXT, §10.2.2): interrupt auto-mask bits.
    pub const CTRL_EXT: usize = 0x0018;
    /// MDI Control (MDIC): PHY register access.
    pub const MDIC: usize = 0x0020;
    /// Interrupt Cause Read (ICR), clears on read (§10.2.4).
    pub const ICR: usize = 0x00c0;
    /// Interrupt Throttling Rate (ITR).
    pub const ITR: usize = 0x00c4;
    /// Interrupt Cause Set (ICS): sets causes as if the events happened.
    pub const ICS: usize = 0x00c8;
    /// Interrupt Mask Set/Read (IMS): a 1 enables the cause's interrupt (§10.2.4).
    pub const IMS: usize = 0x00d0;
    /// Interrupt Mask Clear (IMC).
    pub const IMC: usize = 0x00d8;
    /// Extended Interrupt Auto Clear (EIAC): MSI-X causes cleared from ICR when their message
    /// is sent (§10.2.4).
    pub const EIAC: usize = 0x00dc;
    /// Interrupt Acknowledge Auto Mask (IAM): causes masked when their MSI-X message is sent
    /// with CTRL_EXT.EIAME (§10.2.4).
    pub const IAM: usize = 0x00e0;
    /// Interrupt Vector Allocation Registers (IVAR): which MSI-X vector each cause uses
    /// (§10.2.4).
    pub const IVAR: usize = 0x00e4;
    /// Receive Control (RCTL).
    pub const RCTL: usize = 0x0100;
    /// Transmit Control (TCTL).
    pub const TCTL: usize = 0x0400;
    /// Transmit Inter-Packet Gap (TIPG).
    pub const TIPG: usize = 0x0410;
    /// Receive Descriptor Base Address Low, queue 0.
    pub const RDBAL: usize = 0x2800;
    /// Receive Descriptor Base Address High, queue 0.
    pub const RDBAH: usize = 0x2804;
    /// Receive Descriptor Length (bytes, a multiple of 128), queue 0.
    pub const RDLEN: usize = 0x2808;
    /// Receive Descriptor Head, queue 0.
    pub const RDH: usize = 0x2810;
    /// Receive Descriptor Tail, queue 0: one past the last descriptor the device may fill.
    pub const RDT: usize = 0x2818;
    /// Receive Interrupt Delay Timer (RDTR).
    pub const RDTR: usize = 0x2820;
    /// Receive Interrupt Absolute Delay Timer (RADV).
    pub const RADV: usize = 0x282c;
    /// Transmit Descriptor Base Address Low, queue 0.
    pub const TDBAL: usize = 0x3800;
    /// Transmit Descriptor Base Address High, queue 0.
    pub const TDBAH: usize = 0x3804;
    /// Transmit Descriptor Length, queue 0.
    pub const TDLEN: usize = 0x3808;
    /// Transmit Descriptor Head, queue 0.
    pub const TDH: usize = 0x3810;
    /// Transmit Descriptor Tail, queue 0: one past the last descriptor ready to send.
    pub const TDT: usize = 0x3818;
    /// Transmit Descriptor Control, queue 0 (TXDCTL).
    pub const TXDCTL: usize = 0x3828;
    /// Transmit Absolute Interrupt Delay (TADV).
    pub const TADV: usize = 0x382c;
    /// Transmit Arbitration Count, queue 0 (TARC0): bit 10 enables the queue.
    pub const TARC0: usize = 0x3840;
    /// Receive Checksum Control (RXCSUM).
    pub const RXCSUM: usize = 0x5000;
    /// Receive Filter Control (RFCTL): bit 15 EXSTEN selects extended receive descriptors.
    pub const RFCTL: usize = 0x5008;
    /// Multicast Table Array, 128 dwords.
    pub const MTA: usize = 0x5200;
    /// Receive Address Low, entry 0 (entry n at `RAL0 + 8 n`).
    pub const RAL0: usize = 0x5400;
    /// Receive Address High, entry 0: bits 15:0 address, bit 31 Address Valid.
    pub const RAH0: usize = 0x5404;
    /// Multiple Receive Queues Command (MRQC): RSS.
    pub const MRQC: usize = 0x5818;
}

/// Statistics registers (0x4000-0x40FF), all cleared by a read.
pub mod stat {
    /// CRC Error Count.
    pub const CRCERRS: usize = 0x4000;
    /// RX Error Count.
    pub const RXERRC: usize = 0x400c;
    /// Missed Packets Count.
    pub const MPC: usize = 0x4010;
    /// Good Packets Received Count.
    pub const GPRC: usize = 0x4074;
    /// Broadcast Packets Received Count.
    pub const BPRC: usize = 0x4078;
    /// Multicast Packets Received Count.
    pub const MPRC: usize = 0x407c;
    /// Good Packets Transmitted Count.
    pub const GPTC: usize = 0x4080;
    /// Good Octets Received Count, low dword (read before GORCH).
    pub const GORCL: usize = 0x4088;
    /// Good Octets Received Count, high dword (reading it clears the pair).
    pub const GORCH: usize = 0x408c;
    /// Good Octets Transmitted Count, low dword.
    pub const GOTCL: usize = 0x4090;
    /// Good Octets Transmitted Count, high dword.
    pub const GOTCH: usize = 0x4094;
    /// Receive No Buffers Count.
    pub const RNBC: usize = 0x40a0;
    /// Receive Undersize Count.
    pub const RUC: usize = 0x40a4;
    /// Receive Fragment Count.
    pub const RFC: usize = 0x40a8;
    /// Receive Oversize Count.
    pub const ROC: usize = 0x40ac;
    /// Receive Jabber Count.
    pub const RJC: usize = 0x40b0;
    /// Total Octets Received, low dword.
    pub const TORL: usize = 0x40c0;
    /// Total Octets Received, high dword.
    pub const TORH: usize = 0x40c4;
    /// Total Octets Transmitted, low dword.
    pub const TOTL: usize = 0x40c8;
    /// Total Octets Transmitted, high dword.
    pub const TOTH: usize = 0x40cc;
    /// Total Packets Received.
    pub const TPR: usize = 0x40d0;
    /// Total Packets Transmitted.
    pub const TPT: usize = 0x40d4;
    /// Multicast Packets Transmitted Count.
    pub const MPTC: usize = 0x40f0;
    /// Broadcast Packets Transmitted Count.
    pub const BPTC: usize = 0x40f4;
}

bitflags! {
    /// CTRL (§10.2.2.1).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Ctrl: u32 {
        /// Full duplex.
        const FD = 1 << 0;
        /// GIO Master Disable: stop issuing new master (DMA) requests.
        const GIO_MASTER_DISABLE = 1 << 2;
        /// Auto-Speed Detection Enable.
        const ASDE = 1 << 5;
        /// Set Link Up.
        const SLU = 1 << 6;
        /// Force Speed.
        const FRCSPD = 1 << 11;
        /// Force Duplex.
        const FRCDPLX = 1 << 12;
        /// Device Reset (self-clearing): resets everything but PCI configuration space.
        const RST = 1 << 26;
        /// Receive flow control enable.
        const RFCE = 1 << 27;
        /// Transmit flow control enable.
        const TFCE = 1 << 28;
        /// VLAN Mode Enable (strip/insert 802.1Q tags).
        const VME = 1 << 30;
        /// PHY reset.
        const PHY_RST = 1 << 31;
    }
}

bitflags! {
    /// STATUS (§10.2.2.2).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Status: u32 {
        /// Full duplex.
        const FD = 1 << 0;
        /// Link Up.
        const LU = 1 << 1;
        /// Speed, bits 7:6 (00 10 Mb/s, 01 100 Mb/s, 1x 1000 Mb/s).
        const SPEED = 0b11 << 6;
        /// GIO Master Enable Status: cleared once master requests have stopped after
        /// CTRL.GIO_MASTER_DISABLE.
        const GIO_MASTER_EN = 1 << 19;
        const _ = !0;
    }
}

impl Status {
    /// Link speed in Mb/s.
    pub fn speed_mbps(self) -> u32 {
        match (self.bits() >> 6) & 0b11 {
            0 => 10,
            1 => 100,
            _ => 1000,
        }
    }
}

/// EEC bit 9: NVM auto-read done.
pub const EEC_AUTO_RD: u32 = 1 << 9;

bitflags! {
    /// RCTL: receive control.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Rctl: u32 {
        /// Receiver Enable.
        const EN = 1 << 1;
        /// Store Bad Packets.
        const SBP = 1 << 2;
        /// Unicast Promiscuous Enable.
        const UPE = 1 << 3;
        /// Multicast Promiscuous Enable.
        const MPE = 1 << 4;
        /// Long Packet Enable (frames up to 16384 bytes instead of 1522).
        const LPE = 1 << 5;
        /// Loopback mode, bits 7:6 (00: none).
        const LBM = 0b11 << 6;
        /// Receive Descriptor Minimum Threshold Size, bits 9:8 (00: 1/2 of the ring).
        const RDMTS = 0b11 << 8;
        /// Broadcast Accept Mode.
        const BAM = 1 << 15;
        /// Receive Buffer Size, bits 17:16 (00 with BSEX = 0: 2048 bytes).
        const BSIZE = 0b11 << 16;
        /// VLAN Filter Enable.
        const VFE = 1 << 18;
        /// Buffer Size Extension.
        const BSEX = 1 << 25;
        /// Strip Ethernet CRC from incoming packets (lengths then exclude the FCS).
        const SECRC = 1 << 26;
    }
}

bitflags! {
    /// TCTL: transmit control.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Tctl: u32 {
        /// Transmit Enable.
        const EN = 1 << 1;
        /// Pad Short Packets (to 64 bytes with the FCS).
        const PSP = 1 << 3;
        /// Collision Threshold, bits 11:4.
        const CT = 0xff << 4;
        /// Collision Distance, bits 21:12.
        const COLD = 0x3ff << 12;
        /// Re-transmit on Late Collision.
        const RTLC = 1 << 24;
    }
}

impl Tctl {
    /// The value vfpoll runs with: enabled, short packets padded, collision threshold 15 and
    /// full-duplex collision distance 63 (the datasheet's recommended values).
    pub fn enabled() -> Self {
        Tctl::EN | Tctl::PSP | Tctl::RTLC | Tctl::from_bits_retain((0x0f << 4) | (0x3f << 12))
    }
}

/// TIPG recommended for copper: IPGT 8, IPGR1 8, IPGR2 6.
pub const TIPG_COPPER: u32 = 8 | (8 << 10) | (6 << 20);

/// TXDCTL: descriptor granularity (bit 24), write-back threshold 1 (bits 21:16) and bit 22,
/// which the 82571-82574 family needs set (as Linux's e1000e does).
pub const TXDCTL_VALUE: u32 = (1 << 24) | (1 << 16) | (1 << 22);

/// TARC0 bit 10: the transmit queue is enabled (QEMU's e1000e transmits nothing without it).
pub const TARC_ENABLE: u32 = 1 << 10;

/// Interrupt causes (ICR/ICS/IMS/IMC bits, §10.2.4) and their MSI-X routing.
pub mod intr {
    /// Receiver Timer Interrupt: a frame was written back (the cause without MSI-X).
    pub const RXT0: u32 = 1 << 7;
    /// Receive queue 0 (MSI-X mode).
    pub const RXQ0: u32 = 1 << 20;
    /// Transmit queue 0 (MSI-X mode).
    pub const TXQ0: u32 = 1 << 22;
    /// Other causes, link status among them (MSI-X mode).
    pub const OTHER: u32 = 1 << 24;
    /// IVAR: the entry is valid (bit 3 of each 4-bit field).
    pub const IVAR_VALID: u32 = 1 << 3;
    /// IVAR field of RX queue 0 (bits 3:0), TX queue 0 (11:8), other causes (19:16).
    pub const IVAR_RXQ0_SHIFT: u32 = 0;
    /// See [`IVAR_RXQ0_SHIFT`].
    pub const IVAR_TXQ0_SHIFT: u32 = 8;
    /// See [`IVAR_RXQ0_SHIFT`].
    pub const IVAR_OTHER_SHIFT: u32 = 16;
    /// CTRL_EXT.EIAME: an MSI-X message masks (IMS) the causes set in IAM that it carries.
    pub const CTRL_EXT_EIAME: u32 = 1 << 24;
    /// CTRL_EXT.IAME: interrupt acknowledge auto-mask on ICR reads (legacy/MSI; left clear).
    pub const CTRL_EXT_IAME: u32 = 1 << 27;
    /// CTRL_EXT.PBA_support: MSI-X pending bits are cleared through IMS writes.
    pub const CTRL_EXT_PBA_CLR: u32 = 1 << 31;

    /// IVAR routing RX queue 0 to MSI-X `vector` and nothing else (TX queue 0 and the other
    /// causes invalid: they never interrupt).
    pub fn ivar_rx_only(vector: u32) -> u32 {
        (IVAR_VALID | (vector & 0x7)) << IVAR_RXQ0_SHIFT
    }
}

/// MDIC fields: PHY register access (the 82574's PHY is at address 1).
pub mod mdic {
    /// Data, bits 15:0.
    pub const DATA: u32 = 0xffff;
    /// PHY register address, bits 20:16.
    pub const REG_SHIFT: u32 = 16;
    /// PHY address, bits 25:21.
    pub const PHY_SHIFT: u32 = 21;
    /// Opcode write (bits 27:26 = 01).
    pub const OP_WRITE: u32 = 1 << 26;
    /// Opcode read (bits 27:26 = 10).
    pub const OP_READ: u32 = 2 << 26;
    /// Ready: the access completed.
    pub const READY: u32 = 1 << 28;
    /// Error: the PHY did not answer.
    pub const ERROR: u32 = 1 << 30;
    /// The internal PHY's address.
    pub const PHY_ADDR: u32 = 1;
}

/// PHY registers (IEEE 802.3 clause 22).
pub mod phy {
    /// Control register.
    pub const CTRL: u32 = 0;
    /// Control: restart auto-negotiation (self-clearing).
    pub const CTRL_RESTART_AN: u16 = 1 << 9;
    /// Control: auto-negotiation enable.
    pub const CTRL_AN_ENABLE: u16 = 1 << 12;
}

/// EERD fields (read NVM words): start bit 0, done bit 1, address bits 15:2, data bits 31:16.
pub mod eerd {
    /// Start a read.
    pub const START: u32 = 1 << 0;
    /// The read is done.
    pub const DONE: u32 = 1 << 1;
    /// Word address shift.
    pub const ADDR_SHIFT: u32 = 2;
    /// Data shift.
    pub const DATA_SHIFT: u32 = 16;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_values() {
        assert_eq!(Tctl::enabled().bits(), 0x0103_f0fa);
        assert_eq!(TIPG_COPPER, 0x0060_2008);
        assert_eq!(Status::from_bits_retain(0x83).speed_mbps(), 1000);
        assert_eq!(Status::from_bits_retain(0x40).speed_mbps(), 100);
        assert!(Status::from_bits_retain(0x80083).contains(Status::LU | Status::GIO_MASTER_EN));
        // The receive control vfpoll programs: EN | BAM | SECRC, BSIZE 00 (2048 bytes).
        assert_eq!((Rctl::EN | Rctl::BAM | Rctl::SECRC).bits(), 0x0400_8002);
    }

    #[test]
    fn interrupt_routing() {
        // Linux's e1000_configure_msix writes IVAR = 0x8 | vector per field, RxQ0 lowest.
        assert_eq!(intr::ivar_rx_only(0), 0x8);
        assert_eq!(intr::ivar_rx_only(2), 0xa);
        assert_eq!(intr::RXQ0 | intr::TXQ0 | intr::OTHER, 0x0150_0000);
        assert_eq!(intr::CTRL_EXT_EIAME | intr::CTRL_EXT_PBA_CLR, 0x8100_0000);
    }
}
