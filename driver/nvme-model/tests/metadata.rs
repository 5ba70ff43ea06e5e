//! LBA formats with metadata (NVM Command Set 1.0 §4.1.5.1, §5.2): what Identify Namespace
//! reports, where metadata travels (extended LBAs in the data buffer, or a separate buffer at
//! MPTR with PSDT 00b, 01b and 10b), how many bytes move, and MDTS. Each test checks the bytes
//! the host sees against the namespace's data and metadata (the oracle).

mod common;

use common::*;
use vfpoll_nvme_model::{
    admin_opcode as adm, io_opcode as io, LbaFormat, MetadataCaps, ModelConfig, NamespaceConfig, PiType,
    Protection, Status,
};
use vfpoll_pci::BusAddr;

const DS: usize = 512;
const MS: usize = 8;

fn host(ns: NamespaceConfig) -> Host {
    let mut h = Host::started(ModelConfig {
        namespaces: vec![ns],
        ..Default::default()
    });
    h.create_qp(1, 16);
    h
}

fn identify_ns(h: &mut Host, nsid: u32) -> Vec<u8> {
    let buf = h.mem.alloc(PAGE);
    h.admin(Sqe::new(adm::IDENTIFY).nsid(nsid).prp(buf.get(), 0)).ok();
    h.mem.read_vec(buf, PAGE)
}

fn le(b: &[u8], off: usize, len: usize) -> u64 {
    let mut v = [0u8; 8];
    v[..len].copy_from_slice(&b[off..off + len]);
    u64::from_le_bytes(v)
}

/// A buffer of `len` bytes that ends exactly where its mapping ends (the next byte is in the
/// guard page), so a controller moving more than `len` bytes faults instead of passing.
fn tight(h: &Host, len: usize) -> BusAddr {
    let pages = len.div_ceil(PAGE);
    h.mem.alloc(pages * PAGE).add((pages * PAGE - len) as u64)
}

/// Data and metadata interleaved as an extended-LBA buffer holds them.
fn interleave(data: &[u8], meta: &[u8], ds: usize, ms: usize) -> Vec<u8> {
    data.chunks(ds)
        .zip(meta.chunks(ms))
        .flat_map(|(d, m)| d.iter().chain(m).copied())
        .collect()
}

#[test]
fn identify_reports_formats_placement_and_protection() {
    let formats = vec![
        LbaFormat::new(512, 0),
        LbaFormat::new(512, 8),
        LbaFormat::new(512, 16),
        LbaFormat::new(4096, 0),
        LbaFormat::new(4096, 8),
        LbaFormat::new(4096, 64),
    ];
    let ns = NamespaceConfig::new(1, 4096, 64)
        .with_formats(formats)
        .with_metadata(8, true)
        .with_protection(Protection::first(PiType::Type2));
    let mut h = host(ns);
    let id = identify_ns(&mut h, 1);
    assert_eq!(le(&id, 0, 8), 64, "NSZE");
    assert_eq!(id[25], 5, "NLBAF: six formats, 0's based");
    assert_eq!(id[26], 0x14, "FLBAS: format 4, extended (MSET)");
    assert_eq!(id[27], 0x3, "MC: extended and separate");
    assert_eq!(id[28], 0x1f, "DPC: types 1-3, first and last");
    assert_eq!(id[29], 0x2 | 0x8, "DPS: Type 2, first eight bytes");
    let lbaf = |i: usize| le(&id, 128 + 4 * i, 4);
    assert_eq!(lbaf(1), 8 | 9 << 16, "LBAF1: MS 8, LBADS 9");
    assert_eq!(lbaf(5), 64 | 12 << 16, "LBAF5: MS 64, LBADS 12");
    assert_eq!(lbaf(6), 0, "no LBAF6");

    // More than 16 formats: the index's upper bits are FLBAS bits 6:5.
    let many: Vec<LbaFormat> = (0..20).map(|i| LbaFormat::new(512, i * 8)).collect();
    let ns = NamespaceConfig {
        metadata_caps: MetadataCaps {
            extended: false,
            separate: true,
        },
        ..NamespaceConfig::new(1, 512, 64)
            .with_formats(many)
            .with_metadata(17 * 8, false)
    };
    let mut h = host(ns);
    let id = identify_ns(&mut h, 1);
    assert_eq!(
        (id[25], id[26], id[27]),
        (19, 0x1 | 0x1 << 5, 0x2),
        "NLBAF, FLBAS 17, MC"
    );
    assert_eq!(le(&id, 128 + 4 * 19, 4), 152 | 9 << 16);
    assert_eq!(id[29], 0, "no protection");
}

#[test]
fn extended_lbas_move_data_and_metadata_through_the_data_pointer() {
    let mut h = host(NamespaceConfig::new(1, 512, 1024).with_metadata(MS as u16, true));
    let (data, meta) = (pattern(6 * DS, 1), pattern(6 * MS, 2));
    let host_buf = interleave(&data, &meta, DS, MS);
    // 6 × 520 = 3120 bytes, ending where the mapping ends.
    let src = tight(&h, host_buf.len());
    h.mem.write(src, &host_buf);
    h.cmd(1, Sqe::rw(io::WRITE, 1, 10, 6).prp(src.get(), 0)).ok();
    assert_eq!(h.model.read_ns(1, 10, 6).unwrap(), data);
    assert_eq!(h.model.read_ns_meta(1, 10, 6).unwrap(), meta);
    let dst = tight(&h, host_buf.len());
    h.cmd(1, Sqe::rw(io::READ, 1, 10, 6).prp(dst.get(), 0)).ok();
    assert_eq!(h.mem.read_vec(dst, host_buf.len()), host_buf);

    // Across pages and PRP lists: 20 blocks = 10400 bytes over three pages.
    let (data, meta) = (pattern(20 * DS, 3), pattern(20 * MS, 4));
    h.model.write_ns(1, 100, &data).unwrap();
    h.model.write_ns_meta(1, 100, &meta).unwrap();
    let buf = h.mem.alloc_scattered(3 * PAGE);
    let list = h.buffer_with(
        &[
            (buf.get() + PAGE as u64).to_le_bytes(),
            (buf.get() + 2 * PAGE as u64).to_le_bytes(),
        ]
        .concat(),
    );
    h.cmd(1, Sqe::rw(io::READ, 1, 100, 20).prp(buf.get(), list.get()))
        .ok();
    assert_eq!(
        h.mem.read_vec(buf, 20 * (DS + MS)),
        interleave(&data, &meta, DS, MS)
    );

    // An SGL must describe exactly NLB × (LBA + MS) bytes.
    let sgl = h.mem.alloc(2 * PAGE);
    let c = h.cmd(
        1,
        Sqe::rw(io::READ, 1, 0, 4).sgl(sgl_desc(sgl.get(), 4 * DS as u32, SGL_DATA)),
    );
    assert_eq!(
        c.status,
        Status::DATA_SGL_LENGTH_INVALID,
        "the data alone is too short"
    );
    h.cmd(
        1,
        Sqe::rw(io::READ, 1, 0, 4).sgl(sgl_desc(sgl.get(), 4 * (DS + MS) as u32, SGL_DATA)),
    )
    .ok();
}

#[test]
fn separate_metadata_moves_through_mptr() {
    let mut h = host(NamespaceConfig::new(1, 512, 1024).with_metadata(MS as u16, false));
    let (data, meta) = (pattern(8 * DS, 5), pattern(8 * MS, 6));
    let (src, msrc) = (h.buffer_with(&data), tight(&h, meta.len()));
    h.mem.write(msrc, &meta);
    let write = Sqe::rw(io::WRITE, 1, 3, 8)
        .prp(src.get(), 0)
        .cdw(4, msrc.get() as u32)
        .cdw(5, (msrc.get() >> 32) as u32);
    h.cmd(1, write).ok();
    assert_eq!(h.model.read_ns(1, 3, 8).unwrap(), data);
    assert_eq!(h.model.read_ns_meta(1, 3, 8).unwrap(), meta);

    let (dst, mdst) = (tight(&h, data.len()), tight(&h, meta.len()));
    let mptr = |sqe: Sqe, at: u64| sqe.cdw(4, at as u32).cdw(5, (at >> 32) as u32);
    h.cmd(1, mptr(Sqe::rw(io::READ, 1, 3, 8).prp(dst.get(), 0), mdst.get()))
        .ok();
    assert_eq!(
        h.mem.read_vec(dst, data.len()),
        data,
        "exactly NLB × LBA data bytes"
    );
    assert_eq!(
        h.mem.read_vec(mdst, meta.len()),
        meta,
        "exactly NLB × MS metadata bytes"
    );

    // PSDT 00b: MPTR is dword aligned.
    let c = h.cmd(
        1,
        mptr(Sqe::rw(io::READ, 1, 3, 8).prp(dst.get(), 0), mdst.get() + 2),
    );
    assert_eq!(c.status, Status::INVALID_FIELD);
    // An MPTR that does not translate (0, as a driver that forgets it sends) is a DMA fault.
    let c = h.cmd(1, Sqe::rw(io::WRITE, 1, 3, 1).prp(src.get(), 0));
    assert_eq!(c.status, Status::DATA_TRANSFER_ERROR, "MPTR 0");
    h.expect_dma_faults(&[0]);
    assert_eq!(h.model.read_ns(1, 3, 8).unwrap(), data, "nothing written");

    // PSDT 01b: SGL data, MPTR a contiguous buffer at any byte.
    let sdst = h.mem.alloc(2 * PAGE);
    let m1 = h.mem.alloc(PAGE).add(3);
    h.cmd(
        1,
        mptr(
            Sqe::rw(io::READ, 1, 3, 8).sgl(sgl_desc(sdst.get(), data.len() as u32, SGL_DATA)),
            m1.get(),
        ),
    )
    .ok();
    assert_eq!(h.mem.read_vec(m1, meta.len()), meta);

    // PSDT 10b: MPTR points to an SGL descriptor, here a segment of two data blocks.
    let (m_a, m_b, seg, md) = (
        h.mem.alloc(PAGE),
        h.mem.alloc(PAGE),
        h.mem.alloc(PAGE),
        h.mem.alloc(PAGE),
    );
    h.mem.write(
        seg,
        &[
            sgl_desc(m_a.get(), 24, SGL_DATA),
            sgl_desc(m_b.get(), 40, SGL_DATA),
        ]
        .concat(),
    );
    h.mem.write(md, &sgl_desc(seg.get(), 32, SGL_LAST_SEGMENT));
    let psdt10 = |sqe: Sqe| {
        let mut s = sqe;
        s.dw[0] = (s.dw[0] & !(3 << 14)) | 2 << 14;
        s
    };
    let read10 = psdt10(mptr(
        Sqe::rw(io::READ, 1, 3, 8).sgl(sgl_desc(sdst.get(), data.len() as u32, SGL_DATA)),
        md.get(),
    ));
    h.cmd(1, read10).ok();
    assert_eq!([h.mem.read_vec(m_a, 24), h.mem.read_vec(m_b, 40)].concat(), meta);
    h.mem.write(md, &sgl_desc(m_a.get(), 60, SGL_DATA));
    assert_eq!(h.cmd(1, read10).status, Status::METADATA_SGL_LENGTH_INVALID);
    let mut psdt11 = read10;
    psdt11.dw[0] |= 3 << 14;
    assert_eq!(
        h.cmd(1, psdt11).status,
        Status::INVALID_FIELD,
        "PSDT 11b is reserved"
    );
}

#[test]
fn mdts_counts_interleaved_metadata_only() {
    // MDTS 5: 128 KiB. 256 blocks of 512 + 8 are 130 KiB interleaved, 128 KiB separately.
    let mut h = host(NamespaceConfig::new(1, 512, 1024).with_metadata(MS as u16, true));
    let buf = h.mem.alloc(256 * (DS + MS));
    let c = h.cmd(
        1,
        Sqe::rw(io::READ, 1, 0, 256).sgl(sgl_desc(buf.get(), 256 * (DS + MS) as u32, SGL_DATA)),
    );
    assert_eq!(c.status, Status::INVALID_FIELD, "over MDTS with the metadata");
    h.cmd(
        1,
        Sqe::rw(io::READ, 1, 0, 252).sgl(sgl_desc(buf.get(), 252 * (DS + MS) as u32, SGL_DATA)),
    )
    .ok();

    let mut h = host(NamespaceConfig::new(1, 512, 1024).with_metadata(MS as u16, false));
    let (buf, mbuf) = (h.mem.alloc(256 * DS), h.mem.alloc(256 * MS));
    let c = h.cmd(
        1,
        Sqe::rw(io::READ, 1, 0, 256)
            .sgl(sgl_desc(buf.get(), 256 * DS as u32, SGL_DATA))
            .cdw(4, mbuf.get() as u32)
            .cdw(5, (mbuf.get() >> 32) as u32),
    );
    c.ok();
}

#[test]
fn write_zeroes_deallocate_and_compare_cover_metadata() {
    let mut h = host(NamespaceConfig::new(1, 512, 1024).with_metadata(16, true));
    h.model.write_ns(1, 0, &pattern(16 * DS, 7)).unwrap();
    h.model.write_ns_meta(1, 0, &pattern(16 * 16, 8)).unwrap();
    h.cmd(1, Sqe::rw(io::WRITE_ZEROES, 1, 2, 3)).ok();
    let meta = h.model.read_ns_meta(1, 0, 16).unwrap();
    assert!(
        meta[2 * 16..5 * 16].iter().all(|&b| b == 0),
        "metadata zeroed too"
    );
    assert_eq!(meta[5 * 16..], pattern(16 * 16, 8)[5 * 16..]);
    let range = [
        0u32.to_le_bytes().as_slice(),
        &1u32.to_le_bytes(),
        &9u64.to_le_bytes(),
    ]
    .concat();
    let ranges = h.buffer_with(&range);
    h.cmd(
        1,
        Sqe::new(io::DATASET_MANAGEMENT)
            .nsid(1)
            .prp(ranges.get(), 0)
            .cdw(11, 1 << 2),
    )
    .ok();
    assert_eq!(h.model.read_ns_meta(1, 9, 1).unwrap(), vec![0; 16]);
    assert_eq!(h.model.read_ns(1, 9, 1).unwrap(), vec![0; DS]);

    // Compare: data and metadata both count.
    let (data, meta) = (
        h.model.read_ns(1, 10, 2).unwrap(),
        h.model.read_ns_meta(1, 10, 2).unwrap(),
    );
    let same = h.buffer_with(&interleave(&data, &meta, DS, 16));
    h.cmd(1, Sqe::rw(io::COMPARE, 1, 10, 2).prp(same.get(), 0)).ok();
    let mut other_meta = meta.clone();
    other_meta[20] ^= 1;
    let diff = h.buffer_with(&interleave(&data, &other_meta, DS, 16));
    assert_eq!(
        h.cmd(1, Sqe::rw(io::COMPARE, 1, 10, 2).prp(diff.get(), 0)).status,
        Status::COMPARE_FAILURE
    );
}

#[test]
fn handle_accessors_check_their_arguments() {
    let h = host(NamespaceConfig::new(1, 512, 16).with_metadata(MS as u16, false));
    assert!(h
        .model
        .write_ns_meta(1, 0, &[0; 12])
        .unwrap_err()
        .to_string()
        .contains("12 bytes"));
    assert!(h.model.read_ns_meta(1, 15, 2).is_err(), "past the end");
    let h = host(NamespaceConfig::new(1, 512, 16));
    assert!(h
        .model
        .read_ns_meta(1, 0, 1)
        .unwrap_err()
        .to_string()
        .contains("without metadata"));
    let info = h.model.namespace_info(1).unwrap();
    assert_eq!(
        (info.blocks, info.lba_format, info.format.index),
        (16, LbaFormat::new(512, 0), 0)
    );
}
