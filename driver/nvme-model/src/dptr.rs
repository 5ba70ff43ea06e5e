//! Data pointers turned into host memory segments: PRPs (NVMe Base 2.0 §4.1.1) and SGLs
//! (§4.1.2). Every rule the host can break gives the status the specification names for it;
//! an address that does not translate gives Data Transfer Error.

use crate::dma::{DmaFault, Guest, Seg};
use crate::Status;
// SGL descriptor types (§4.1.2.1, Figure 89).
use vfpoll_nvme_spec::cmd::sgl::{
    BIT_BUCKET as SGL_BIT_BUCKET, DATA_BLOCK as SGL_DATA_BLOCK, LAST_SEGMENT as SGL_LAST_SEGMENT,
    SEGMENT as SGL_SEGMENT,
};

/// Which way the data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    /// Controller to host (Read, Identify, Get Log Page).
    ToHost,
    /// Host to controller (Write, Compare, Dataset Management).
    FromHost,
}

/// Caps on walking an SGL, so a looping or absurd list cannot hold the controller thread.
const MAX_SGL_SEGMENTS: usize = 256;
const MAX_SGL_DESCRIPTORS: usize = 4096;

fn transfer_error(e: DmaFault) -> Status {
    log::debug!("data pointer: {e}");
    Status::DATA_TRANSFER_ERROR
}

/// Fills `out` with the segments of a `len`-byte transfer described by PRP1/PRP2, for memory
/// pages of `page` bytes (CC.MPS).
///
/// PRP1 may have a dword-aligned offset; it covers up to the end of its page. If the rest fits in
/// one page, PRP2 is its page-aligned address; otherwise PRP2 points (qword aligned, possibly with
/// an offset) to a PRP list of page-aligned entries running to the end of the list's page, whose
/// last entry points to the next list page when more than one page is still to be described.
pub(crate) fn prp(
    mem: &Guest,
    prp1: u64,
    prp2: u64,
    len: u64,
    page: u64,
    out: &mut Vec<Seg>,
) -> Result<(), Status> {
    out.clear();
    if len == 0 {
        return Ok(());
    }
    let mask = page - 1;
    if prp1 & 0x3 != 0 {
        return Err(Status::PRP_OFFSET_INVALID);
    }
    let first = len.min(page - (prp1 & mask));
    mem.map(prp1, first as usize, out).map_err(transfer_error)?;
    let mut left = len - first;
    if left == 0 {
        return Ok(());
    }
    if left <= page {
        if prp2 & mask != 0 {
            return Err(Status::PRP_OFFSET_INVALID);
        }
        return mem.map(prp2, left as usize, out).map_err(transfer_error);
    }
    if prp2 & 0x7 != 0 {
        return Err(Status::PRP_OFFSET_INVALID);
    }
    let mut list = prp2;
    'pages: loop {
        let slots = ((page - (list & mask)) / 8) as usize;
        let read = slots.min(left.div_ceil(page) as usize);
        let entries = mem.seg(list, read * 8).map_err(transfer_error)?;
        for i in 0..read {
            let entry = entries.load_u64(i * 8);
            if entry & mask != 0 {
                return Err(Status::PRP_OFFSET_INVALID);
            }
            if i == slots - 1 && left > page {
                // The last slot of a list page, with more than one page to go: a list pointer.
                list = entry;
                continue 'pages;
            }
            let n = left.min(page);
            mem.map(entry, n as usize, out).map_err(transfer_error)?;
            left -= n;
            if left == 0 {
                return Ok(());
            }
        }
        unreachable!("a PRP list page either ends the transfer or chains to the next");
    }
}

/// An SGL descriptor (§4.1.2.1, Figure 88): address, length, type and sub type.
#[derive(Debug, Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    kind: u8,
    subtype: u8,
}

impl Desc {
    fn parse(b: &[u8; 16]) -> Desc {
        Desc {
            addr: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            len: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            kind: b[15] >> 4,
            subtype: b[15] & 0xf,
        }
    }
}

/// Fills `out` with the segments of a `len`-byte transfer described by the SGL whose first
/// descriptor is `sgl1` (the command's SGL1, PSDT 01b).
///
/// Supported: Data Block and Bit Bucket descriptors (a bit bucket only when data moves to the
/// host), Segment and Last Segment descriptors (each must be the last descriptor of its segment,
/// and a Last Segment's segment may hold none), all with the Address sub type. The descriptors
/// must describe exactly `len` bytes.
pub(crate) fn sgl(
    mem: &Guest,
    sgl1: &[u8; 16],
    len: u64,
    dir: Dir,
    out: &mut Vec<Seg>,
) -> Result<(), Status> {
    out.clear();
    let mut total = 0;
    let first = Desc::parse(sgl1);
    let mut next = match first.kind {
        SGL_SEGMENT | SGL_LAST_SEGMENT => Some(first),
        _ => {
            data(mem, first, dir, len, &mut total, out)?;
            None
        }
    };
    let (mut segments, mut descriptors) = (0, 0);
    while let Some(seg) = next.take() {
        segments += 1;
        if segments > MAX_SGL_SEGMENTS {
            return Err(Status::INVALID_SGL_COUNT);
        }
        if seg.subtype != 0 {
            return Err(Status::SGL_TYPE_INVALID);
        }
        if seg.len == 0 {
            return Err(Status::INVALID_SGL_COUNT);
        }
        if seg.len % 16 != 0 {
            return Err(Status::INVALID_SGL_SEGMENT);
        }
        let n = (seg.len / 16) as usize;
        let last = seg.kind == SGL_LAST_SEGMENT;
        let mut raw = [0u8; 16];
        for i in 0..n {
            descriptors += 1;
            if descriptors > MAX_SGL_DESCRIPTORS {
                return Err(Status::INVALID_SGL_COUNT);
            }
            mem.read(seg.addr.wrapping_add(16 * i as u64), &mut raw)
                .map_err(transfer_error)?;
            let d = Desc::parse(&raw);
            match d.kind {
                SGL_SEGMENT | SGL_LAST_SEGMENT if last || i != n - 1 => {
                    return Err(Status::INVALID_SGL_SEGMENT)
                }
                SGL_SEGMENT | SGL_LAST_SEGMENT => next = Some(d),
                _ => data(mem, d, dir, len, &mut total, out)?,
            }
        }
    }
    if total != len {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    Ok(())
}

/// One Data Block or Bit Bucket descriptor.
fn data(mem: &Guest, d: Desc, dir: Dir, len: u64, total: &mut u64, out: &mut Vec<Seg>) -> Result<(), Status> {
    if d.subtype != 0 {
        return Err(Status::SGL_TYPE_INVALID);
    }
    let n = d.len as u64;
    if *total + n > len {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    match d.kind {
        SGL_DATA_BLOCK => mem.map(d.addr, n as usize, out).map_err(transfer_error)?,
        SGL_BIT_BUCKET if dir == Dir::ToHost => out.push(Seg::bucket(n as usize)),
        _ => return Err(Status::SGL_TYPE_INVALID),
    }
    *total += n;
    Ok(())
}

/// Reads the 16-byte SGL descriptor that MPTR points to when PSDT is 10b (NVMe Base 2.0 §4.1.2:
/// "MPTR contains the address of an SGL segment containing exactly one SGL descriptor"), and
/// fills `out` with the segments of the `len`-byte metadata transfer it describes. A length
/// mismatch is Metadata SGL Length Invalid.
pub(crate) fn metadata_sgl(
    mem: &Guest,
    mptr: u64,
    len: u64,
    dir: Dir,
    out: &mut Vec<Seg>,
) -> Result<(), Status> {
    let mut desc = [0u8; 16];
    mem.read(mptr, &mut desc).map_err(transfer_error)?;
    sgl(mem, &desc, len, dir, out).map_err(|s| match s {
        Status::DATA_SGL_LENGTH_INVALID => Status::METADATA_SGL_LENGTH_INVALID,
        s => s,
    })
}

/// Host memory described by segments, read or written as one stream from its start (an
/// extended-LBA buffer alternates block data and block metadata).
pub(crate) struct Cursor<'a> {
    segs: &'a [Seg],
    seg: usize,
    off: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(segs: &'a [Seg]) -> Self {
        Cursor { segs, seg: 0, off: 0 }
    }

    /// Calls `f(segment, offset, bytes)` for the next `n` bytes of the stream, piece by piece.
    ///
    /// # Panics
    /// If the segments end first (the caller sized the transfer wrongly: a model bug).
    fn walk(&mut self, mut n: usize, mut f: impl FnMut(&Seg, usize, usize)) {
        while n > 0 {
            let s = &self.segs[self.seg];
            let now = (s.len() - self.off).min(n);
            f(s, self.off, now);
            n -= now;
            self.off += now;
            if self.off == s.len() {
                self.seg += 1;
                self.off = 0;
            }
        }
    }

    /// Copies the next `dst.len()` bytes from the host.
    pub(crate) fn load(&mut self, dst: &mut [u8]) {
        let mut done = 0;
        self.walk(dst.len(), |s, off, n| {
            s.load(off, &mut dst[done..done + n]);
            done += n;
        });
    }

    /// Copies `src` to the next `src.len()` bytes of the host.
    pub(crate) fn store(&mut self, src: &[u8]) {
        let mut done = 0;
        self.walk(src.len(), |s, off, n| {
            s.store(off, &src[done..done + n]);
            done += n;
        });
    }
}

/// Copies `src` to the host through `segs` (which cover exactly `src.len()` bytes).
pub(crate) fn copy_to_host(segs: &[Seg], mut src: &[u8]) {
    for s in segs {
        let (now, rest) = src.split_at(s.len());
        s.store(0, now);
        src = rest;
    }
}

/// Copies host memory described by `segs` into `dst` (of exactly their total length).
pub(crate) fn copy_from_host(segs: &[Seg], mut dst: &mut [u8]) {
    for s in segs {
        let (now, rest) = dst.split_at_mut(s.len());
        s.load(0, now);
        dst = rest;
    }
}

/// Whether host memory described by `segs` equals `data`, compared through `scratch`.
pub(crate) fn equals_host(segs: &[Seg], mut data: &[u8], scratch: &mut [u8]) -> bool {
    for s in segs {
        let mut off = 0;
        while off < s.len() {
            let n = (s.len() - off).min(scratch.len());
            s.load(off, &mut scratch[..n]);
            if scratch[..n] != data[off..off + n] {
                return false;
            }
            off += n;
        }
        data = &data[s.len()..];
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::HeapDma;
    use std::sync::Arc;

    const P: u64 = 4096;

    fn setup() -> (Arc<HeapDma>, Guest) {
        let h = Arc::new(HeapDma::new());
        let g = Guest::new(h.clone());
        (h, g)
    }

    fn lens(segs: &[Seg]) -> Vec<usize> {
        segs.iter().map(Seg::len).collect()
    }

    #[test]
    fn prp1_and_prp2() {
        let (h, g) = setup();
        let a = h.alloc(2 * P as usize).get();
        let b = h.alloc(P as usize).get();
        let mut out = Vec::new();
        prp(&g, a + 0x100, 0, 0x200, P, &mut out).unwrap();
        assert_eq!(lens(&out), [0x200]);
        prp(&g, a + 0x100, b, P, P, &mut out).unwrap();
        assert_eq!(lens(&out), [0xf00, 0x100]);
        assert_eq!(
            prp(&g, a + 0x102, b, 8, P, &mut out),
            Err(Status::PRP_OFFSET_INVALID)
        );
        assert_eq!(
            prp(&g, a, b + 8, 2 * P, P, &mut out),
            Err(Status::PRP_OFFSET_INVALID)
        );
        assert_eq!(
            prp(&g, a + P, 0, 2 * P, P, &mut out),
            Err(Status::DATA_TRANSFER_ERROR),
            "PRP2 0 is unmapped"
        );
    }

    #[test]
    fn prp_list_chains_and_checks_entries() {
        let (h, g) = setup();
        let data = h.alloc_scattered(1000 * P as usize).get();
        let lists = h.alloc(2 * P as usize).get();
        // 1 + 999 pages: the first list page holds 511 data entries and a chain pointer.
        let mut entries: Vec<u64> = (1..1000).map(|i| data + i * P).collect();
        entries.insert(511, lists + P);
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        h.write(vfpoll_pci::BusAddr(lists), &bytes);
        let mut out = Vec::new();
        prp(&g, data, lists, 1000 * P, P, &mut out).unwrap();
        assert_eq!(out.len(), 1000);
        // A list starting at an offset holds fewer slots: 2 entries fit before the page end.
        let mut small = [0u8; 24];
        small[0..8].copy_from_slice(&(data + P).to_le_bytes());
        small[8..16].copy_from_slice(&(data + 2 * P).to_le_bytes());
        h.write(vfpoll_pci::BusAddr(lists + P - 16), &small[..16]);
        prp(&g, data, lists + P - 16, 3 * P, P, &mut out).unwrap();
        assert_eq!(lens(&out), [4096; 3]);
        // A misaligned entry in the list.
        h.write(
            vfpoll_pci::BusAddr(lists + P - 8),
            &(data + 2 * P + 4).to_le_bytes(),
        );
        assert_eq!(
            prp(&g, data, lists + P - 16, 3 * P, P, &mut out),
            Err(Status::PRP_OFFSET_INVALID)
        );
        assert_eq!(
            prp(&g, data, lists + 4, 3 * P, P, &mut out),
            Err(Status::PRP_OFFSET_INVALID)
        );
    }

    fn desc(addr: u64, len: u32, kind: u8) -> [u8; 16] {
        let mut d = [0; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[15] = kind << 4;
        d
    }

    #[test]
    fn cursor_crosses_segments() {
        let (h, g) = setup();
        let a = h.alloc_scattered(3 * P as usize).get();
        let mut out = Vec::new();
        g.map(a + 100, 2 * P as usize, &mut out).unwrap();
        assert_eq!(out.len(), 3, "scattered pages: one segment each");
        let data: Vec<u8> = (0..2 * P as usize).map(|i| (i % 251) as u8).collect();
        let mut c = Cursor::new(&out);
        for chunk in data.chunks(520) {
            c.store(chunk);
        }
        assert_eq!(h.read_vec(vfpoll_pci::BusAddr(a + 100), data.len()), data);
        let mut back = vec![0u8; data.len()];
        let mut c = Cursor::new(&out);
        for chunk in back.chunks_mut(8) {
            c.load(chunk);
        }
        assert_eq!(back, data);
    }

    #[test]
    fn sgl_segments_buckets_and_errors() {
        let (h, g) = setup();
        let buf = h.alloc(4 * P as usize).get();
        let seg1 = h.alloc(P as usize).get();
        let seg2 = h.alloc(P as usize).get();
        let mut out = Vec::new();
        sgl(&g, &desc(buf, 512, SGL_DATA_BLOCK), 512, Dir::ToHost, &mut out).unwrap();
        assert_eq!(lens(&out), [512]);
        assert_eq!(
            sgl(&g, &desc(buf, 512, SGL_DATA_BLOCK), 1024, Dir::ToHost, &mut out),
            Err(Status::DATA_SGL_LENGTH_INVALID)
        );
        // Segment 1: data, bucket, then a Last Segment pointer; segment 2: one data block.
        let s1 = [
            desc(buf, 100, SGL_DATA_BLOCK),
            desc(0, 28, SGL_BIT_BUCKET),
            desc(seg2, 16, SGL_LAST_SEGMENT),
        ];
        h.write(vfpoll_pci::BusAddr(seg1), &s1.concat());
        h.write(vfpoll_pci::BusAddr(seg2), &desc(buf + P, 384, SGL_DATA_BLOCK));
        sgl(&g, &desc(seg1, 48, SGL_SEGMENT), 512, Dir::ToHost, &mut out).unwrap();
        assert_eq!(lens(&out), [100, 28, 384]);
        assert_eq!(
            sgl(&g, &desc(seg1, 48, SGL_SEGMENT), 512, Dir::FromHost, &mut out),
            Err(Status::SGL_TYPE_INVALID),
            "bit bucket on a write"
        );
        assert_eq!(
            sgl(&g, &desc(seg1, 48, SGL_LAST_SEGMENT), 512, Dir::ToHost, &mut out),
            Err(Status::INVALID_SGL_SEGMENT),
            "segment pointer in the last segment"
        );
        assert_eq!(
            sgl(&g, &desc(seg1, 40, SGL_SEGMENT), 512, Dir::ToHost, &mut out),
            Err(Status::INVALID_SGL_SEGMENT)
        );
        assert_eq!(
            sgl(&g, &desc(seg1, 0, SGL_SEGMENT), 512, Dir::ToHost, &mut out),
            Err(Status::INVALID_SGL_COUNT)
        );
        assert_eq!(
            sgl(&g, &desc(buf, 512, 0x4), 512, Dir::ToHost, &mut out),
            Err(Status::SGL_TYPE_INVALID),
            "keyed data block"
        );
        // A segment pointing at itself is cut off.
        h.write(vfpoll_pci::BusAddr(seg2), &desc(seg2, 16, SGL_SEGMENT));
        assert_eq!(
            sgl(&g, &desc(seg2, 16, SGL_SEGMENT), 512, Dir::ToHost, &mut out),
            Err(Status::INVALID_SGL_COUNT)
        );
        // Unmapped data.
        assert_eq!(
            sgl(
                &g,
                &desc(buf + 4 * P, 512, SGL_DATA_BLOCK),
                512,
                Dir::ToHost,
                &mut out
            ),
            Err(Status::DATA_TRANSFER_ERROR)
        );
    }
}
