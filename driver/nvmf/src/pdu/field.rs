//! Byte offsets of every header field, from the start of the PDU (NVMe/TCP 1.0c §3.6.2; the
//! same layout as the structs of Linux `include/linux/nvme-tcp.h`). All multi-byte fields are
//! little-endian. These offsets are also the Field Error Information of an Invalid PDU Header
//! Field or Unsupported Parameter error (§3.6.2.4/§3.6.2.5 FEI: the byte offset of the field).

/// Common header (§3.6.2.1, `struct nvme_tcp_hdr`): PDU-Type, 1 byte.
pub const TYPE: usize = 0;
/// FLAGS, 1 byte.
pub const FLAGS: usize = 1;
/// HLEN: header length without the header digest, 1 byte.
pub const HLEN: usize = 2;
/// PDO: PDU data offset from the start of the PDU, 1 byte.
pub const PDO: usize = 3;
/// PLEN: the whole PDU's length (header, digests, padding, data), 4 bytes.
pub const PLEN: usize = 4;

/// ICReq (§3.6.2.2, `struct nvme_tcp_icreq_pdu`): PFV, 2 bytes.
pub const ICREQ_PFV: usize = 8;
/// ICReq HPDA, 1 byte.
pub const ICREQ_HPDA: usize = 10;
/// ICReq DGST, 1 byte.
pub const ICREQ_DGST: usize = 11;
/// ICReq MAXR2T (0's based), 4 bytes; bytes 16..128 are reserved.
pub const ICREQ_MAXR2T: usize = 12;

/// ICResp (§3.6.2.3, `struct nvme_tcp_icresp_pdu`): PFV, 2 bytes.
pub const ICRESP_PFV: usize = 8;
/// ICResp CPDA, 1 byte.
pub const ICRESP_CPDA: usize = 10;
/// ICResp DGST, 1 byte.
pub const ICRESP_DGST: usize = 11;
/// ICResp MAXH2CDATA, 4 bytes (Linux calls it `maxdata`); bytes 16..128 are reserved.
pub const ICRESP_MAXH2CDATA: usize = 12;

/// H2CTermReq/C2HTermReq (§3.6.2.4/§3.6.2.5, `struct nvme_tcp_term_pdu`): FES, 2 bytes.
pub const TERM_FES: usize = 8;
/// FEI, 4 bytes (Linux splits it into `feil` and `feiu`); bytes 14..24 are reserved, and the
/// quoted header of the offending PDU follows at 24.
pub const TERM_FEI: usize = 10;

/// CapsuleCmd (§3.6.2.6, `struct nvme_tcp_cmd_pdu`): the 64-byte SQE.
pub const CMD_SQE: usize = 8;
/// CapsuleResp (§3.6.2.7, `struct nvme_tcp_rsp_pdu`): the 16-byte CQE.
pub const RSP_CQE: usize = 8;

/// H2CData/C2HData (§3.6.2.8/§3.6.2.9, `struct nvme_tcp_data_pdu`): CCCID, the command's CID,
/// 2 bytes.
pub const DATA_CCCID: usize = 8;
/// TTAG, the R2T's transfer tag (H2CData; reserved in C2HData), 2 bytes.
pub const DATA_TTAG: usize = 10;
/// DATAO, offset of this PDU's data in the command's data, 4 bytes.
pub const DATA_DATAO: usize = 12;
/// DATAL, length of this PDU's data, 4 bytes; bytes 20..24 are reserved.
pub const DATA_DATAL: usize = 16;

/// R2T (§3.6.2.10, `struct nvme_tcp_r2t_pdu`): CCCID, 2 bytes.
pub const R2T_CCCID: usize = 8;
/// TTAG, chosen by the controller, 2 bytes.
pub const R2T_TTAG: usize = 10;
/// R2TO, offset of the requested data in the command's data, 4 bytes.
pub const R2T_R2TO: usize = 12;
/// R2TL, length of the requested data, 4 bytes; bytes 20..24 are reserved.
pub const R2T_R2TL: usize = 16;

/// SQE offsets the transport looks at (NVMe Base 2.0 §4.2, Figure 87/88): the opcode (CDW0
/// bits 7:0).
pub const SQE_OPCODE: usize = 0;
/// CDW0 bits 15:8: FUSE and PSDT (bits 7:6 of this byte; 01b or 10b for SGLs).
pub const SQE_FLAGS: usize = 1;
/// CDW0 bits 31:16: the command identifier.
pub const SQE_CID: usize = 2;
/// The first SGL descriptor (DPTR, 16 bytes; NVMe Base 2.0 §4.3.2): address, 8 bytes.
pub const SQE_SGL_ADDR: usize = 24;
/// SGL descriptor length, 4 bytes.
pub const SQE_SGL_LEN: usize = 32;
/// SGL descriptor identifier: type (bits 7:4) and sub type (bits 3:0), 1 byte.
pub const SQE_SGL_TYPE: usize = 39;
/// CQE offset of the command identifier (NVMe Base 2.0 §4.2.1, DW3 bits 15:0).
pub const CQE_CID: usize = 12;
