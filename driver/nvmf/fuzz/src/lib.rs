//! # vfpoll-nvmf-fuzz: fuzz targets for the NVMe/TCP target's wire-facing code
//!
//! Three targets, each a function that takes any bytes and panics when a property breaks:
//!
//! - [`pdu::check`] (binary `fuzz_pdu`): a stream of NVMe/TCP PDUs read by
//!   [`vfpoll_nvmf::pdu`] as a controller (ICReq, CapsuleCmd, H2CData, H2CTermReq) or as a host
//!   (ICResp, CapsuleResp, C2HData, R2T, C2HTermReq), with or without digests, before or after
//!   the ICReq/ICResp exchange, which it runs through `negotiate`/`host_accept_ic_resp`;
//! - [`fabrics::check`] (binary `fuzz_fabrics`): a sequence of capsules given to a
//!   [`vfpoll_nvmf::fabrics::Target`]: Connect (admin and I/O queues), admin and Fabrics
//!   commands, I/O commands through [`IoQueue::decode`](vfpoll_nvmf::fabrics::IoQueue::decode)
//!   with their in-capsule data;
//! - [`resv::check`] (binary `fuzz_resv`): the reservation state file a target reads at start
//!   ([`vfpoll_nvmf::fabrics::resv::canonical_state`]);
//! - [`auth::check`] (binary `fuzz_auth`): DH-HMAC-CHAP messages, one queue's transaction and
//!   `DHHC-1` secrets through [`vfpoll_nvmf::auth`].
//!
//! Built with the `libfuzzer` feature and coverage instrumentation (`cargo xtask fuzz`, which
//! `cargo xtask test` runs for a bounded time), the binaries are libFuzzer targets on stable
//! Rust. Without the feature they replay inputs: `cargo run -p vfpoll-nvmf-fuzz --bin fuzz_pdu
//! -- <file or directory>...` reruns a crash libFuzzer saved, with an ordinary panic and
//! backtrace. The unit tests replay the seeds and run a short coverage-less mutation loop.
//!
//! Seeds are built by code ([`seeds`]) from the crate's own builders, never stored: a libFuzzer
//! binary writes them into the directory `VFPOLL_FUZZ_SEEDS` names (its corpus) before it reads
//! its corpus.
//!
//! `VFPOLL_FUZZ_PLANT=1` plants a crash ([`PLANTED_CDW14`]) that only a fuzzer that works finds;
//! `cargo xtask fuzz` checks that it does, so the fuzz step is known to be able to fail.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod auth;
pub mod fabrics;
pub mod pdu;
pub mod resv;
pub mod seeds;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The environment variable that plants a crash when set to `1`.
pub const PLANT_ENV: &str = "VFPOLL_FUZZ_PLANT";

/// The environment variable naming the directory a libFuzzer binary writes its seeds to.
pub const SEEDS_ENV: &str = "VFPOLL_FUZZ_SEEDS";

/// With a crash planted, [`pdu::check`] panics on an accepted CapsuleCmd whose SQE has this
/// CDW14 (SQE bytes 56-59, little-endian). No seed has it, but each command of the PDU seeds has
/// a CDW14 of its own ([`seeds::TAG`] | CID): libFuzzer's comparison tracing sees that value
/// compared with this one (it learns from 4- and 8-byte compares only) and puts this one in its
/// place, which takes it about a second.
pub const PLANTED_CDW14: u32 = 0xf00d_cafe;

/// The panic message of the planted crash.
pub const PLANTED_MESSAGE: &str = "planted crash (VFPOLL_FUZZ_PLANT=1)";

/// True when `VFPOLL_FUZZ_PLANT=1` (read once).
pub fn planted() -> bool {
    static PLANTED: OnceLock<bool> = OnceLock::new();
    *PLANTED.get_or_init(|| std::env::var_os(PLANT_ENV).is_some_and(|v| v == "1"))
}

/// A fuzz target: its name (the binary is `fuzz_<name>`), its check and its seeds.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// `pdu`, `fabrics`, `auth` or `resv`.
    pub name: &'static str,
    /// The check: panics when a property breaks.
    pub check: fn(&[u8]),
    /// The seed inputs.
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// The PDU target.
pub const PDU: Target = Target {
    name: "pdu",
    check: pdu::check,
    seeds: seeds::pdu,
};

/// The fabrics target.
pub const FABRICS: Target = Target {
    name: "fabrics",
    check: fabrics::check,
    seeds: seeds::fabrics,
};

/// The DH-HMAC-CHAP target.
pub const AUTH: Target = Target {
    name: "auth",
    check: auth::check,
    seeds: auth::seeds,
};

/// The reservation state file target.
pub const RESV: Target = Target {
    name: "resv",
    check: resv::check,
    seeds: resv::seeds,
};

/// Writes `target`'s seeds into the directory `VFPOLL_FUZZ_SEEDS` names, if it names one (a
/// libFuzzer binary does this before it reads its corpus). A failure panics: the run would
/// start without seeds and find little.
pub fn write_seeds_from_env(target: &Target) {
    if let Some(dir) = std::env::var_os(SEEDS_ENV) {
        if let Err(e) = write_seeds(target, Path::new(&dir)) {
            panic!("cannot write the {} seeds to {SEEDS_ENV}: {e}", target.name);
        }
    }
}

/// Writes `target`'s seeds into `dir` (created if missing) as `seed-<n>`; returns how many.
pub fn write_seeds(target: &Target, dir: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let seeds = (target.seeds)();
    for (i, s) in seeds.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i:03}")), s)?;
    }
    Ok(seeds.len())
}

/// The files `paths` name: files themselves, and the files directly in directories, sorted.
pub fn input_files(paths: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut in_dir = Vec::new();
            for e in std::fs::read_dir(p)? {
                let path = e?.path();
                if path.is_file() {
                    in_dir.push(path);
                }
            }
            in_dir.sort();
            files.extend(in_dir);
        } else {
            files.push(p.clone());
        }
    }
    Ok(files)
}

/// What a binary built without the `libfuzzer` feature does with its arguments: `--seeds DIR`
/// writes the seeds into DIR; paths replay the files they name (directories: the files in
/// them), calling `each` before each one; no argument replays the seeds. A failing input
/// panics. Returns a line that says what was done.
pub fn replay(target: &Target, args: &[PathBuf], mut each: impl FnMut(&Path)) -> Result<String, String> {
    match args {
        [flag, dir] if flag.as_os_str() == "--seeds" => {
            let n =
                write_seeds(target, dir).map_err(|e| format!("cannot write to {}: {e}", dir.display()))?;
            Ok(format!("{n} seeds written to {}", dir.display()))
        }
        [flag, ..] if flag.as_os_str() == "--seeds" => Err("usage: --seeds DIR".into()),
        [] => {
            let seeds = (target.seeds)();
            for s in &seeds {
                (target.check)(s);
            }
            Ok(format!("{} seeds passed", seeds.len()))
        }
        paths => {
            let files = input_files(paths).map_err(|e| format!("cannot list the inputs: {e}"))?;
            for f in &files {
                each(f);
                let data = std::fs::read(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
                (target.check)(&data);
            }
            Ok(format!("{} inputs passed", files.len()))
        }
    }
}

/// A tiny deterministic generator (xorshift64*) for the coverage-less mutation loop of the
/// unit tests; not for anything that needs real randomness.
#[cfg(test)]
pub(crate) struct Rng(u64);

#[cfg(test)]
impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// A mutation of `input` as libFuzzer might make it: bit flips, byte sets, interesting
    /// little-endian values, truncation, duplication of a piece, insertion.
    pub(crate) fn mutate(&mut self, input: &[u8]) -> Vec<u8> {
        let mut v = input.to_vec();
        for _ in 0..1 + self.below(4) {
            let len = v.len();
            match self.below(7) {
                0 if len > 0 => {
                    let i = self.below(len);
                    v[i] ^= 1 << self.below(8);
                }
                1 if len > 0 => {
                    let i = self.below(len);
                    v[i] = self.next() as u8;
                }
                2 if len >= 4 => {
                    const SPECIAL: [u32; 8] = [0, 1, 4, 0x7f, 0x80, 0xff, 0xffff, u32::MAX];
                    let i = self.below(len - 3);
                    let x = SPECIAL[self.below(SPECIAL.len())].wrapping_add(self.below(3) as u32);
                    v[i..i + 4].copy_from_slice(&x.to_le_bytes());
                }
                3 => v.truncate(self.below(len + 1)),
                4 if len > 0 => {
                    let a = self.below(len);
                    let b = a + self.below(len - a) + 1;
                    let piece = v[a..b].to_vec();
                    let at = self.below(len + 1);
                    v.splice(at..at, piece);
                }
                5 => {
                    let at = self.below(len + 1);
                    v.insert(at, self.next() as u8);
                }
                _ if len > 0 => {
                    let i = self.below(len);
                    v[i] = v[i].wrapping_add(1 + self.below(4) as u8);
                }
                _ => v.push(0),
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_written_and_read_back() {
        let dir = std::env::temp_dir().join(format!("vfpoll-nvmf-fuzz-seeds-{}", std::process::id()));
        let n = write_seeds(&PDU, &dir).unwrap();
        let files = input_files(std::slice::from_ref(&dir)).unwrap();
        assert_eq!(files.len(), n);
        for f in &files {
            (PDU.check)(&std::fs::read(f).unwrap());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
