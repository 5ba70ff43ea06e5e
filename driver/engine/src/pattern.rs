//! The verify pattern: every logical block says where it belongs and which run wrote it.
//!
//! Block layout (little endian): bytes 0..8 the LBA, 8..16 the run's seed, 16..20 the NSID,
//! 20..24 `"vfpl"`, then a pseudo-random stream seeded by (seed, NSID, LBA). A block written to
//! the wrong LBA (a misdirected write or read) keeps its own LBA in the header, so the checker
//! tells "this block holds LBA 812's data" apart from corruption, stale data of another run and
//! never-written (zero) blocks.

use std::fmt;

use crate::workload::mix64;

const MAGIC: [u8; 4] = *b"vfpl";
const HEADER: usize = 24;

/// What a mismatching block holds instead of its pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Only zeroes: the block was never written (or was deallocated).
    Zeroes,
    /// The pattern of another LBA of this run: data landed in (or was read from) the wrong place.
    OtherLba(u64),
    /// The pattern of another namespace of this run.
    OtherNamespace {
        /// The namespace it belongs to.
        nsid: u32,
        /// The LBA it belongs to.
        lba: u64,
    },
    /// A pattern with another seed: written by another run.
    OtherRun {
        /// That run's seed.
        seed: u64,
    },
    /// The right header, but the data differs from byte `offset` of the block on.
    Corrupt {
        /// First differing byte within the block.
        offset: usize,
    },
    /// Something that is not a vfpoll pattern at all.
    Foreign,
    /// The block's data is right, its separate metadata differs from byte `offset` on.
    Metadata {
        /// First differing metadata byte of the block.
        offset: usize,
    },
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Found::Zeroes => write!(f, "zeroes (never written?)"),
            Found::OtherLba(l) => write!(f, "the data of LBA {l} (misplaced block)"),
            Found::OtherNamespace { nsid, lba } => {
                write!(f, "the data of namespace {nsid} LBA {lba} (wrong namespace)")
            }
            Found::OtherRun { seed } => write!(f, "data of another run (seed {seed})"),
            Found::Corrupt { offset } => write!(f, "corrupt data from byte {offset} of the block"),
            Found::Foreign => write!(f, "data that is no vfpoll pattern"),
            Found::Metadata { offset } => write!(f, "the right data but other metadata from byte {offset}"),
        }
    }
}

/// Fills `buf` (whole blocks of `lba_size` bytes) with the pattern of the blocks from `lba`.
pub fn fill(buf: &mut [u8], lba_size: usize, lba: u64, nsid: u32, seed: u64) {
    debug_assert!(lba_size >= 64 && buf.len().is_multiple_of(lba_size));
    for (i, block) in buf.chunks_exact_mut(lba_size).enumerate() {
        fill_block(block, lba + i as u64, nsid, seed);
    }
}

fn fill_block(block: &mut [u8], lba: u64, nsid: u32, seed: u64) {
    block[0..8].copy_from_slice(&lba.to_le_bytes());
    block[8..16].copy_from_slice(&seed.to_le_bytes());
    block[16..20].copy_from_slice(&nsid.to_le_bytes());
    block[20..24].copy_from_slice(&MAGIC);
    let mut s = stream_seed(lba, nsid, seed);
    for w in block[HEADER..].chunks_mut(8) {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let v = mix64(s).to_le_bytes();
        w.copy_from_slice(&v[..w.len()]);
    }
}

fn stream_seed(lba: u64, nsid: u32, seed: u64) -> u64 {
    mix64(seed ^ mix64(lba ^ ((nsid as u64) << 48)))
}

/// Checks the blocks of `buf` against the pattern from `lba`; calls `bad(lba, found)` for each
/// block that differs and returns how many did. Bytes `skip` of each block are not compared
/// (protection information the controller writes into extended blocks).
pub fn check(
    buf: &[u8],
    lba_size: usize,
    lba: u64,
    nsid: u32,
    seed: u64,
    skip: Option<std::ops::Range<usize>>,
    mut bad: impl FnMut(u64, Found),
) -> u64 {
    let expect = |want: &mut [u8], l| fill_block(want, l, nsid, seed);
    let judge = |block: &[u8], want: &[u8], l| classify(block, want, l, nsid, seed);
    check_blocks(buf, lba_size, lba, skip, expect, judge, &mut bad)
}

/// Fills `buf`, the separate metadata of blocks from `lba` (`ms` bytes each), with their
/// pattern: a stream seeded by (seed, NSID, LBA), other than the data's.
pub fn fill_meta(buf: &mut [u8], ms: usize, lba: u64, nsid: u32, seed: u64) {
    for (i, m) in buf.chunks_exact_mut(ms).enumerate() {
        meta_block(m, lba + i as u64, nsid, seed);
    }
}

fn meta_block(m: &mut [u8], lba: u64, nsid: u32, seed: u64) {
    let mut s = mix64(stream_seed(lba, nsid, seed) ^ 0x6d65_7461);
    for w in m.chunks_mut(8) {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let v = mix64(s).to_le_bytes();
        w.copy_from_slice(&v[..w.len()]);
    }
}

/// Checks separate metadata written by [`fill_meta`], but bytes `skip` of each block's
/// metadata (the controller's protection information); calls `bad` for each block whose
/// metadata differs and returns how many did.
pub fn check_meta(
    buf: &[u8],
    ms: usize,
    lba: u64,
    nsid: u32,
    seed: u64,
    skip: Option<std::ops::Range<usize>>,
    mut bad: impl FnMut(u64, Found),
) -> u64 {
    let expect = |want: &mut [u8], l| meta_block(want, l, nsid, seed);
    let judge = |m: &[u8], want: &[u8], _| Found::Metadata {
        offset: (0..ms).find(|&k| m[k] != want[k]).unwrap_or(0),
    };
    check_blocks(buf, ms, lba, skip, expect, judge, &mut bad)
}

/// Compares each `size`-byte block of `buf`, from `lba` on, with what `expect` writes for its
/// LBA, bytes `skip` of each block aside; calls `bad(lba, judge(block, want, lba))` for each
/// block that differs and returns how many did.
fn check_blocks(
    buf: &[u8],
    size: usize,
    lba: u64,
    skip: Option<std::ops::Range<usize>>,
    expect: impl Fn(&mut [u8], u64),
    judge: impl Fn(&[u8], &[u8], u64) -> Found,
    bad: &mut impl FnMut(u64, Found),
) -> u64 {
    let mut want = vec![0u8; size];
    let mut n = 0;
    for (i, block) in buf.chunks_exact(size).enumerate() {
        let l = lba + i as u64;
        expect(&mut want, l);
        if let Some(r) = &skip {
            want[r.clone()].copy_from_slice(&block[r.clone()]);
        }
        if block != want.as_slice() {
            n += 1;
            bad(l, judge(block, &want, l));
        }
    }
    n
}

fn classify(block: &[u8], want: &[u8], lba: u64, nsid: u32, seed: u64) -> Found {
    if block.iter().all(|&b| b == 0) {
        return Found::Zeroes;
    }
    let u64_at = |o: usize| u64::from_le_bytes(block[o..o + 8].try_into().expect("8 bytes"));
    if block[20..24] != MAGIC {
        return Found::Foreign;
    }
    let (b_lba, b_seed) = (u64_at(0), u64_at(8));
    let b_nsid = u32::from_le_bytes(block[16..20].try_into().expect("4 bytes"));
    if b_seed != seed {
        Found::OtherRun { seed: b_seed }
    } else if b_nsid != nsid {
        Found::OtherNamespace {
            nsid: b_nsid,
            lba: b_lba,
        }
    } else if b_lba != lba {
        Found::OtherLba(b_lba)
    } else {
        let offset = block.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        Found::Corrupt { offset }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_buffer_checks_and_each_fault_is_named() {
        let mut buf = vec![0u8; 4 * 512];
        fill(&mut buf, 512, 100, 1, 7);
        assert_eq!(check(&buf, 512, 100, 1, 7, None, |l, f| panic!("{l}: {f}")), 0);
        // Blocks differ from each other (LBA-tagged).
        assert_ne!(buf[..512], buf[512..1024]);

        let mut found = Vec::new();
        let n = check(&buf, 512, 101, 1, 7, None, |l, f| found.push((l, f)));
        assert_eq!(n, 4);
        assert_eq!(found[0], (101, Found::OtherLba(100)));

        let mut b = buf.clone();
        b[512 + 300] ^= 1;
        b[1024..1536].fill(0);
        let mut found = Vec::new();
        check(&b, 512, 100, 1, 7, None, |l, f| found.push((l, f)));
        assert_eq!(
            found,
            [(101, Found::Corrupt { offset: 300 }), (102, Found::Zeroes)]
        );

        let mut found = Vec::new();
        check(&buf, 512, 100, 1, 8, None, |l, f| found.push((l, f)));
        assert_eq!(found[0], (100, Found::OtherRun { seed: 7 }));
        let mut found = Vec::new();
        check(&buf, 512, 100, 2, 7, None, |l, f| found.push((l, f)));
        assert_eq!(found[0], (100, Found::OtherNamespace { nsid: 1, lba: 100 }));
        assert_eq!(
            Found::OtherLba(5).to_string(),
            "the data of LBA 5 (misplaced block)"
        );
    }

    #[test]
    fn extended_blocks_and_separate_metadata() {
        // 520-byte blocks (data and metadata in one buffer) take the same pattern; bytes the
        // controller owns (its PI) are skipped.
        let mut buf = vec![0u8; 3 * 520];
        fill(&mut buf, 520, 9, 1, 7);
        assert_eq!(check(&buf, 520, 9, 1, 7, None, |l, f| panic!("{l}: {f}")), 0);
        buf[520 + 512] ^= 0xff;
        assert_eq!(
            check(&buf, 520, 9, 1, 7, Some(512..520), |l, f| panic!("{l}: {f}")),
            0
        );
        let mut found = Vec::new();
        check(&buf, 520, 9, 1, 7, None, |l, f| found.push((l, f)));
        assert_eq!(found, [(10, Found::Corrupt { offset: 512 })]);
        // Separate metadata: per block, tagged by LBA.
        let mut m = vec![0u8; 3 * 16];
        fill_meta(&mut m, 16, 9, 1, 7);
        assert_ne!(m[..16], m[16..32]);
        assert_eq!(check_meta(&m, 16, 9, 1, 7, None, |l, f| panic!("{l}: {f}")), 0);
        m[16 + 3] ^= 1;
        assert_eq!(
            check_meta(&m, 16, 9, 1, 7, Some(0..8), |l, f| panic!("{l}: {f}")),
            0
        );
        let mut found = Vec::new();
        assert_eq!(check_meta(&m, 16, 9, 1, 7, None, |l, f| found.push((l, f))), 1);
        assert_eq!(found, [(10, Found::Metadata { offset: 3 })]);
        assert_eq!(check_meta(&m, 16, 10, 1, 7, None, |_, _| {}), 3);
    }
}
