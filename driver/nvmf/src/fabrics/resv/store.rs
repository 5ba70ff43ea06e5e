//! The reservation state file: the state of every namespace whose reservation persists
//! through power loss (PTPL, NVMe Base 2.0 §8.19.10), kept across target restarts.
//!
//! Format (version 1), UTF-8 text, one record per line, fields separated by one space:
//!
//! ```text
//! vfpoll-reservations 1
//! ns <subsystem NQN, hex of its UTF-8 bytes> <NSID> <NGUID, 32 hex> <generation> <RTYPE 0-6> <holder HOSTID, 32 hex, or ->
//! reg <HOSTID, 32 hex> <key, 16 hex>
//! end <CRC32C, 8 hex>
//! ```
//!
//! Each `ns` line is followed by its registrants (`reg`), in registration order. The CRC32C
//! (Castagnoli) covers every byte of the file before the `end` line; nothing may follow
//! that line's newline. RTYPE 0 means no reservation, and the holder is then `-`. Only
//! namespaces with PTPL set are written (PTPL is implied). The NGUID names the namespace's
//! identity: a record whose NGUID differs from the served namespace's is dropped with a
//! warning (the NSID now names other data).
//!
//! A write goes to `<file>.tmp`, which is fsynced and renamed over the file, and the
//! directory is fsynced: a crash leaves the old file or the new one, never a mix. A file
//! that does not parse, or whose checksum does not match, is refused at start with the
//! line at fault; the target does not start over it (it would drop registrations).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use super::{Held, NsResv, Registrant, ResvType};

/// The state file's name in the state directory.
pub const STATE_FILE: &str = "reservations.state";

const MAGIC: &str = "vfpoll-reservations 1";

/// A namespace's record: its identity and its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub nguid: [u8; 16],
    pub state: NsResv,
}

/// What went wrong with the state file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// It could not be read or written.
    #[error("reservation state {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// It does not parse or its checksum does not match.
    #[error(
        "reservation state {}: line {line}: {why}; the file is damaged: restore it from a \
         backup, or move it away to start with no reservations (hosts must register again)",
        path.display()
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The line at fault (1-based).
        line: usize,
        /// What is wrong.
        why: String,
    },
}

/// The state file of a target, and the records it holds for namespaces not (yet) served.
#[derive(Debug)]
pub struct ResvStore {
    path: PathBuf,
    /// Records read at open, by (subsystem NQN, NSID), until a namespace takes its own.
    pending: BTreeMap<(String, u32), Record>,
}

impl ResvStore {
    /// Opens the state in directory `dir` (made if missing): its file's records, or none when
    /// there is no file yet.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let path = dir.join(STATE_FILE);
        fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let meta = fs::metadata(dir).map_err(|source| StoreError::Io {
            path: dir.to_owned(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(StoreError::Io {
                path: dir.to_owned(),
                source: io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
            });
        }
        let pending = match fs::read(&path) {
            Ok(bytes) => parse(&bytes).map_err(|(line, why)| StoreError::Corrupt {
                path: path.clone(),
                line,
                why,
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => return Err(StoreError::Io { path, source }),
        };
        Ok(ResvStore { path, pending })
    }

    /// The state file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Namespaces the file names, by (subsystem NQN, NSID), that no served namespace has
    /// taken.
    pub fn pending(&self) -> impl Iterator<Item = &(String, u32)> {
        self.pending.keys()
    }

    /// Takes the record of namespace `nsid` of subsystem `nqn`, if its NGUID is `nguid`
    /// (else it is dropped, with a warning).
    pub(crate) fn take(&mut self, nqn: &str, nsid: u32, nguid: &[u8; 16]) -> Option<NsResv> {
        let r = self.pending.remove(&(nqn.to_owned(), nsid))?;
        if r.nguid != *nguid {
            log::warn!(
                "{}: the reservations of namespace {nsid} of {nqn} are dropped: they were \
                 made on NGUID {}, and the namespace served now has NGUID {}",
                self.path.display(),
                hex(&r.nguid),
                hex(nguid)
            );
            return None;
        }
        Some(r.state)
    }

    /// Keeps the record of a namespace no longer served (removed by a reload), to be written
    /// with the others and taken back if it returns.
    pub(crate) fn keep(&mut self, nqn: &str, nsid: u32, record: Record) {
        self.pending.insert((nqn.to_owned(), nsid), record);
    }

    /// Writes `served` (the states of served namespaces with PTPL) and the records still
    /// pending, atomically: temporary file, fsync, rename, fsync of the directory.
    pub(crate) fn save(&self, served: &BTreeMap<(String, u32), Record>) -> Result<(), StoreError> {
        let mut all = self.pending.clone();
        all.extend(served.iter().map(|(k, v)| (k.clone(), v.clone())));
        let text = render(&all);
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| StoreError::Io { path, source }
        };
        let tmp = self.path.with_extension("state.tmp");
        {
            let mut f = fs::File::create(&tmp).map_err(io(&tmp))?;
            f.write_all(text.as_bytes()).map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
        }
        fs::rename(&tmp, &self.path).map_err(io(&self.path))?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
        Ok(())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::with_capacity(b.len() * 2), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let v = unhex_vec(s)?;
    v.try_into().ok()
}

fn unhex_vec(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// Reads a state file's bytes as [`ResvStore::open`] does and writes what it holds back in the
/// format: the canonical text, or the line at fault (1-based) and why. For fuzzing and tools:
/// the canonical text reads back to itself.
pub fn canonical_state(bytes: &[u8]) -> Result<String, (usize, String)> {
    parse(bytes).map(|r| render(&r))
}

/// A decimal field: digits only (no sign), as the writer writes it.
fn dec<T: std::str::FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A hexadecimal field of exactly `digits` digits.
fn hex_exact(s: &str, digits: usize) -> Option<u64> {
    if s.len() != digits || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// The file's text for `records`.
pub(crate) fn render(records: &BTreeMap<(String, u32), Record>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{MAGIC}");
    for ((nqn, nsid), r) in records {
        let st = &r.state;
        let (rtype, holder) = match st.held {
            Some(h) => (h.rtype as u8, hex(&h.holder)),
            None => (0, "-".to_owned()),
        };
        let _ = writeln!(
            s,
            "ns {} {nsid} {} {} {rtype} {holder}",
            hex(nqn.as_bytes()),
            hex(&r.nguid),
            st.generation
        );
        for reg in &st.registrants {
            let _ = writeln!(s, "reg {} {:016x}", hex(&reg.host), reg.key);
        }
    }
    let crc = crc32c::crc32c(s.as_bytes());
    let _ = writeln!(s, "end {crc:08x}");
    s
}

/// Parses a state file: its records, or the line (1-based) at fault and why.
pub(crate) fn parse(bytes: &[u8]) -> Result<BTreeMap<(String, u32), Record>, (usize, String)> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| (1 + count_lines(&bytes[..e.valid_up_to()]), "not UTF-8".into()))?;
    let mut out: BTreeMap<(String, u32), Record> = BTreeMap::new();
    let mut current: Option<(String, u32)> = None;
    let mut offset = 0;
    let mut ended = false;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let n = i + 1;
        let err = |why: &str| Err((n, why.to_owned()));
        if ended {
            return err("text after the end line");
        }
        let Some(body) = line.strip_suffix('\n') else {
            return err("the line does not end with a newline (the file was cut short)");
        };
        let f: Vec<&str> = body.split(' ').collect();
        match f.as_slice() {
            _ if n == 1 => {
                if body != MAGIC {
                    return err(&format!("the file does not start with {MAGIC:?}"));
                }
            }
            ["ns", nqn, nsid, nguid, generation, rtype, holder] => {
                let nqn = unhex_vec(nqn)
                    .and_then(|v| String::from_utf8(v).ok())
                    .filter(|s| !s.is_empty());
                let Some(nqn) = nqn else {
                    return err("the subsystem NQN is not hexadecimal UTF-8");
                };
                let Some(nsid) = dec::<u32>(nsid) else {
                    return err("the NSID is not a number");
                };
                if nsid == 0 || nsid == u32::MAX {
                    return err("NSID 0 and FFFFFFFFh name no namespace");
                }
                let Some(nguid) = unhex::<16>(nguid) else {
                    return err("the NGUID is not 32 hexadecimal digits");
                };
                let Some(generation) = dec::<u32>(generation) else {
                    return err("the generation is not a 32-bit number");
                };
                let held = match (dec::<u8>(rtype), *holder) {
                    (Some(0), "-") => None,
                    (Some(t), h) => {
                        let (Some(rtype), Some(holder)) = (ResvType::from_rtype(t), unhex::<16>(h)) else {
                            return err("RTYPE must be 0 to 6, with a 32-digit holder HOSTID unless 0");
                        };
                        Some(Held { rtype, holder })
                    }
                    _ => return err("RTYPE is not a number"),
                };
                let key = (nqn, nsid);
                if out.contains_key(&key) {
                    return err("a second record for the same namespace");
                }
                out.insert(
                    key.clone(),
                    Record {
                        nguid,
                        state: NsResv {
                            generation,
                            registrants: Vec::new(),
                            held,
                            ptpl: true,
                        },
                    },
                );
                current = Some(key);
            }
            ["reg", host, key] => {
                let Some(cur) = current.as_ref().and_then(|k| out.get_mut(k)) else {
                    return err("a registrant before any namespace");
                };
                let (Some(host), Some(key)) = (unhex::<16>(host), hex_exact(key, 16)) else {
                    return err("a registrant is a 32-digit HOSTID and a 16-digit key");
                };
                if cur.state.registrants.iter().any(|r| r.host == host) {
                    return err("a host registered twice");
                }
                cur.state.registrants.push(Registrant { host, key });
            }
            ["end", crc] => {
                let Some(want) = hex_exact(crc, 8).map(|v| v as u32) else {
                    return err("the checksum is not 8 hexadecimal digits");
                };
                let got = crc32c::crc32c(&bytes[..offset]);
                if got != want {
                    return err(&format!(
                        "checksum mismatch: the file says {want:08x}, its contents give {got:08x}"
                    ));
                }
                ended = true;
            }
            _ => return err("not a record this version knows (ns, reg, end)"),
        }
        offset += line.len();
    }
    if !ended {
        return Err((
            count_lines(bytes) + 1,
            "no end line (the file was cut short)".into(),
        ));
    }
    // A holder must be a registrant (of a single-holder type) and the state consistent.
    for ((nqn, nsid), r) in &out {
        if let Some(h) = r.state.held {
            if !r.state.registrants.iter().any(|x| x.host == h.holder) {
                return Err((
                    count_lines(bytes),
                    format!("namespace {nsid} of {nqn}: the reservation holder is not a registrant"),
                ));
            }
        }
    }
    Ok(out)
}

fn count_lines(b: &[u8]) -> usize {
    b.iter().filter(|&&c| c == b'\n').count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BTreeMap<(String, u32), Record> {
        let a = [0xaa; 16];
        let b = [0xbb; 16];
        let mut m = BTreeMap::new();
        m.insert(
            ("nqn.2024-01.io.vfpoll:x y".to_owned(), 1),
            Record {
                nguid: [7; 16],
                state: NsResv {
                    generation: 5,
                    registrants: vec![Registrant { host: a, key: 0xa }, Registrant { host: b, key: 0xb }],
                    held: Some(Held {
                        rtype: ResvType::WriteExclusive,
                        holder: a,
                    }),
                    ptpl: true,
                },
            },
        );
        m.insert(
            ("nqn.2024-01.io.vfpoll:z".to_owned(), 3),
            Record {
                nguid: [9; 16],
                state: NsResv {
                    generation: u32::MAX,
                    registrants: vec![Registrant {
                        host: b,
                        key: u64::MAX,
                    }],
                    held: None,
                    ptpl: true,
                },
            },
        );
        m
    }

    #[test]
    fn renders_and_parses_back() {
        let m = sample();
        let text = render(&m);
        assert_eq!(parse(text.as_bytes()).unwrap(), m);
        assert_eq!(
            parse(render(&BTreeMap::new()).as_bytes()).unwrap(),
            BTreeMap::new()
        );
    }

    /// The reader against a file written by hand, as the format above specifies it.
    #[test]
    fn reads_a_file_written_by_hand() {
        let nqn_hex: String = "nqn.2024-01.io.vfpoll:h"
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect();
        let body = format!(
            "vfpoll-reservations 1\nns {nqn_hex} 2 000102030405060708090a0b0c0d0e0f 9 3 {h}\nreg {h} 00000000000000ff\n",
            h = "11".repeat(16)
        );
        let file = format!("{body}end {:08x}\n", crc32c::crc32c(body.as_bytes()));
        let m = parse(file.as_bytes()).unwrap();
        let r = &m[&("nqn.2024-01.io.vfpoll:h".to_owned(), 2)];
        assert_eq!(r.nguid[15], 15);
        assert_eq!(r.state.generation, 9);
        assert_eq!(
            r.state.held,
            Some(Held {
                rtype: ResvType::WriteExclusiveRegistrantsOnly,
                holder: [0x11; 16]
            })
        );
        assert_eq!(
            r.state.registrants,
            vec![Registrant {
                host: [0x11; 16],
                key: 255
            }]
        );
        assert!(r.state.ptpl);
    }

    #[test]
    fn damage_is_refused_with_its_line() {
        let text = render(&sample());
        // Every single-byte change is caught (by the parser or the checksum).
        for i in 0..text.len() {
            let mut b = text.clone().into_bytes();
            b[i] ^= 0x01;
            assert!(parse(&b).is_err(), "byte {i} flipped and accepted");
        }
        // Every cut is caught.
        for cut in 0..text.len() {
            assert!(parse(&text.as_bytes()[..cut]).is_err(), "cut at {cut} accepted");
        }
        let (line, why) = parse(b"garbage\n").unwrap_err();
        assert_eq!(line, 1, "{why}");
        let mut extra = text.clone();
        extra.push_str("ns\n");
        assert!(parse(extra.as_bytes()).unwrap_err().1.contains("after the end"));
    }

    proptest::proptest! {
        /// Any bytes, and any valid file with one byte changed, parse or are refused: never a
        /// panic, and a changed byte is never accepted as the same records.
        #[test]
        fn any_bytes_parse_or_are_refused(b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            let _ = parse(&b);
        }

        #[test]
        fn a_changed_byte_is_caught(i in 0usize..10_000, x in 1u8..=255) {
            let mut t = render(&sample()).into_bytes();
            let n = t.len();
            t[i % n] ^= x;
            proptest::prop_assert!(parse(&t).is_err());
        }
    }

    #[test]
    fn saves_atomically_and_opens_back() {
        let dir = std::env::temp_dir().join(format!("vfpoll-resv-store-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let s = ResvStore::open(&dir).unwrap();
        assert_eq!(s.pending().count(), 0);
        s.save(&sample()).unwrap();
        assert!(!dir.join("reservations.state.tmp").exists());
        let mut s = ResvStore::open(&dir).unwrap();
        assert_eq!(s.pending().count(), 2);
        // The wrong NGUID drops the record; the right one takes it.
        assert_eq!(s.take("nqn.2024-01.io.vfpoll:z", 3, &[0; 16]), None);
        let st = s.take("nqn.2024-01.io.vfpoll:x y", 1, &[7; 16]).unwrap();
        assert_eq!(st.generation, 5);
        assert_eq!(s.pending().count(), 0);
        // A damaged file stops the open, naming the line.
        let mut b = fs::read(dir.join(STATE_FILE)).unwrap();
        let at = b.len() - 3;
        b[at] ^= 1;
        fs::write(dir.join(STATE_FILE), &b).unwrap();
        let e = ResvStore::open(&dir).unwrap_err().to_string();
        assert!(e.contains("checksum") || e.contains("line"), "{e}");
        assert!(
            ResvStore::open(&dir.join(STATE_FILE)).is_err(),
            "a file, not a directory"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
