//! Completion handling under random faults, as a property: random batches of reads and writes
//! (split or not, at random LBAs and dword-aligned buffer offsets) through the real queue pair
//! against the model, each command's completion faulted at random: an odd status (any status
//! code type, code and DNR), a late completion, a duplicated one, a lost one; and, to end some
//! cases, a completion with a bogus command id (outside the tracker table, or for a slot that is
//! never in flight) or with the wrong phase tag.
//!
//! For every case: nothing panics; every accepted request completes exactly once, with the
//! status the controller gave (success, the injected status, Command Abort Requested for a lost
//! completion) or, after an unrecoverable fault (a command stuck even after its abort), with
//! the controller reset ([`NvmeError::Reset`]); its buffers come back, the reset's included;
//! the same queue pair works after the reset; `QpairStats` counts the requests, errors and
//! bogus completions (one per duplicate and per bogus id); reads return what the namespace
//! holds; and what was written successfully reads back through a fresh queue pair at the end.
//!
//! Bounded: each case runs on a fresh model (milliseconds to start) with the queue pair timeout
//! [`T`] of 150 ms. 48 cases without lost completions or killers take tens of milliseconds
//! each; 8 cases with them take up to about a second each (a lost completion costs one
//! timeout, a bogus id or a wrong phase two, as the abort cannot find the command; at most one
//! of each per case), so the two properties take a few seconds whatever the seed.
//! `PROPTEST_CASES` sets the number of cases of both for a longer run.
//!
//! The fault of each command is armed, in submission order, before the doorbell rings (the
//! model applies armed faults to commands in the order it fetches them; a zero delay is the "no
//! fault" placeholder), so it lands on that command.

mod drv;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use drv::*;
use proptest::prelude::*;
use proptest::sample::Index;
use vfpoll_nvme::{NvmeError, QpairOptions, QueuePair, RegionBuf, Sct};
use vfpoll_nvme_model::{Fault, FaultKind, ModelConfig, NamespaceConfig, Status};
use vfpoll_pci::BusAddr;

/// Queue pair timeout: long enough that a command the model completes at once does not time
/// out on a loaded machine (and if one does, the case still holds: see `check_batch`).
const T: Duration = Duration::from_millis(150);
/// Queue entries: 31 command slots. Batches keep at most 16 commands in flight, so the slots
/// are taken from the bottom of the free stack and slot 30 is never used.
const ENTRIES: u16 = 32;
const NEVER_USED_SLOT: u16 = ENTRIES - 2;
/// Namespace 1: 1 MiB of 512-byte blocks; MDTS 32 KiB, so requests of up to 48 KiB are cut in
/// up to two commands.
const BLOCKS: u64 = 2048;
const LBA: usize = 512;
const MAX_BLOCKS: u64 = 96;

/// What happens to one request's command (one part of it, for a split request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Normal,
    /// Completes at once with this status, not executed.
    Status(Status),
    /// Completes late (well within the timeout).
    Late(Duration),
    /// Completes twice.
    Duplicate,
    /// Never completes: the timeout aborts it.
    Lost,
}

/// A fault after which the queue pair cannot go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Killer {
    /// The completion carries this command id, whose slot is outside the table.
    BogusOutside(u16),
    /// The completion carries the id of a slot that is never in flight, of this generation.
    BogusNeverUsed(u8),
    /// The completion is written with the wrong phase tag: the completion queue stalls.
    WrongPhase,
}

#[derive(Debug, Clone)]
struct Op {
    write: bool,
    lba: u64,
    blocks: u64,
    /// Byte offset of the buffer in its region (dword aligned).
    offset: usize,
    fate: Fate,
    /// Which part of a split request gets the fate.
    part: Index,
    seed: u64,
}

#[derive(Debug, Clone)]
struct Case {
    batches: Vec<Vec<Op>>,
    /// A last batch in which request `.1` meets `.2`.
    killer: Option<(Vec<Op>, Index, Killer)>,
}

fn status() -> impl Strategy<Value = Status> {
    (0u8..8, any::<u8>(), any::<bool>())
        .prop_filter("a fault status is an error", |&(sct, sc, _)| sct != 0 || sc != 0)
        .prop_map(|(sct, sc, dnr)| Status { sct, sc, dnr })
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        12 => Just(Fate::Normal),
        4 => status().prop_map(Fate::Status),
        2 => (0u64..30).prop_map(|ms| Fate::Late(Duration::from_millis(ms))),
        2 => Just(Fate::Duplicate),
        1 => Just(Fate::Lost),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    (
        any::<bool>(),
        // Small, any, and surely split (above 64 blocks, 32 KiB, from any offset).
        prop_oneof![1u64..=8, 1u64..=MAX_BLOCKS, 65u64..=MAX_BLOCKS],
        any::<Index>(),
        prop_oneof![Just(0usize), (0usize..1024).prop_map(|d| 4 * d)],
        fate(),
        any::<Index>(),
        any::<u64>(),
    )
        .prop_map(|(write, blocks, lba, offset, fate, part, seed)| Op {
            write,
            lba: lba.index((BLOCKS - blocks + 1) as usize) as u64,
            blocks,
            offset,
            fate,
            part,
            seed,
        })
}

fn killer() -> impl Strategy<Value = Killer> {
    prop_oneof![
        (ENTRIES - 1..0x1000, 0u16..16).prop_map(|(slot, gen)| Killer::BogusOutside(slot | gen << 12)),
        (0u8..16).prop_map(Killer::BogusNeverUsed),
        Just(Killer::WrongPhase),
    ]
}

/// A case; `timeouts`: with lost completions (at most one per case, each costs a timeout) and
/// mostly with a killer; else with neither. No lost or duplicated completion in a batch that
/// ends with a wrong phase (the abort or the copy may sit behind the stall).
fn case(timeouts: bool) -> impl Strategy<Value = Case> {
    let batches = prop::collection::vec(prop::collection::vec(op(), 1..=8), 1..=4);
    let killer = if timeouts {
        let some = (prop::collection::vec(op(), 1..=4), any::<Index>(), killer()).prop_map(Some);
        prop_oneof![1 => Just(None), 3 => some].boxed()
    } else {
        Just(None).boxed()
    };
    (batches, killer).prop_map(move |(mut batches, mut killer)| {
        let mut lost = !timeouts;
        let killer_ops = killer.iter_mut().flat_map(|(ops, _, k)| {
            let wrong_phase = *k == Killer::WrongPhase;
            ops.iter_mut().map(move |o| (o, wrong_phase))
        });
        for (o, wrong_phase) in batches.iter_mut().flatten().map(|o| (o, false)).chain(killer_ops) {
            let again = o.fate == Fate::Lost && std::mem::replace(&mut lost, true);
            if again || wrong_phase && matches!(o.fate, Fate::Lost | Fate::Duplicate) {
                o.fate = Fate::Normal;
            }
        }
        Case { batches, killer }
    })
}

/// The namespace as the host knows it: each block's bytes, or `None` where a failed write may
/// or may not have changed it.
struct Known(Vec<Option<Vec<u8>>>);

impl Known {
    fn wrote(&mut self, lba: u64, data: &[u8]) {
        for (i, b) in data.chunks(LBA).enumerate() {
            self.0[lba as usize + i] = Some(b.to_vec());
        }
    }
    fn lost(&mut self, lba: u64, blocks: u64) {
        for b in &mut self.0[lba as usize..(lba + blocks) as usize] {
            *b = None;
        }
    }
    /// `got` (read from `lba`) agrees with every known block.
    fn check(&self, lba: u64, got: &[u8], what: &str) -> Result<(), TestCaseError> {
        for (i, b) in got.chunks(LBA).enumerate() {
            if let Some(want) = &self.0[lba as usize + i] {
                prop_assert!(
                    want == b,
                    "{}: LBA {} differs from what the namespace holds",
                    what,
                    lba + i as u64
                );
            }
        }
        Ok(())
    }
}

/// The completed requests of a batch, by tag.
type Completions = HashMap<u64, vfpoll_nvme::Done<RegionBuf>>;

/// A request submitted: its op, tag, buffer address and what a write wrote.
struct Sent {
    op: Op,
    tag: u64,
    buf: (BusAddr, usize),
    data: Vec<u8>,
    killer: Option<Killer>,
}

/// Submits `ops` (the killer, if any, on request `victim`), arms each command's fault in
/// submission order, and waits for every request to complete. Returns the requests and their
/// completions by tag.
fn run_batch(
    rig: &Rig,
    qp: &mut QueuePair<RegionBuf>,
    ops: &[Op],
    killer: Option<(usize, Killer)>,
    next_tag: &mut u64,
) -> Result<(Vec<Sent>, Completions), TestCaseError> {
    let qid = qp.qid();
    let mut sent = Vec::new();
    let mut faults = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let len = op.blocks as usize * LBA;
        let data = if op.write {
            pattern(op.seed, len)
        } else {
            vec![0xee; len]
        };
        let buf = region_buf(&rig.ctrl, op.offset, &data);
        let addr = (buf.bus_addr(0), buf.len());
        let tag = *next_tag;
        *next_tag += 1;
        let before = qp.stats().commands;
        let r = if op.write {
            qp.write(1, op.lba, buf, tag)
        } else {
            qp.read(1, op.lba, buf, tag)
        };
        if let Err(r) = r {
            prop_assert!(false, "tag {} refused: {}", tag, r.error);
        }
        let parts = qp.stats().commands - before;
        prop_assert!((1..=2).contains(&parts), "{} commands for {} bytes", parts, len);
        let killer = killer.filter(|&(victim, _)| victim == i).map(|k| k.1);
        let hit = op.part.index(parts as usize);
        for p in 0..parts as usize {
            faults.push(match (p == hit, killer, op.fate) {
                (false, ..) | (true, None, Fate::Normal) => FaultKind::Delay(Duration::ZERO),
                (true, Some(Killer::BogusOutside(cid)), _) => FaultKind::BogusCid(cid),
                (true, Some(Killer::BogusNeverUsed(gen)), _) => {
                    FaultKind::BogusCid(NEVER_USED_SLOT | (gen as u16) << 12)
                }
                (true, Some(Killer::WrongPhase), _) => FaultKind::WrongPhase,
                (true, None, Fate::Status(s)) => FaultKind::Status(s),
                (true, None, Fate::Late(d)) => FaultKind::Delay(d),
                (true, None, Fate::Duplicate) => FaultKind::Duplicate,
                (true, None, Fate::Lost) => FaultKind::Drop,
            });
        }
        sent.push(Sent {
            op: op.clone(),
            tag,
            buf: addr,
            data,
            killer,
        });
    }
    // Nothing is fetched before the doorbell rings in `poll`.
    for f in faults {
        rig.model.inject(Fault::new(f).on_sq(qid));
    }
    let mut done = HashMap::new();
    let start = Instant::now();
    let limit = 4 * T + PROMPT;
    while done.len() < sent.len() {
        let mut twice = None;
        let n = qp.poll(usize::MAX, |d| {
            let tag = d.tag;
            if done.insert(tag, d).is_some() {
                twice = Some(tag);
            }
        });
        prop_assert!(twice.is_none(), "tag {:?} completed twice", twice);
        if n == 0 {
            prop_assert!(
                start.elapsed() < limit,
                "hang: {} of {} requests completed after {:?} ({:?})",
                done.len(),
                sent.len(),
                limit,
                qp.stats()
            );
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    for tag in done.keys() {
        prop_assert!(
            sent.iter().any(|s| s.tag == *tag),
            "completion for tag {} never submitted",
            tag
        );
    }
    Ok((sent, done))
}

/// Checks each completion of a batch against its fate, in submission order (the order the model
/// executed the commands in), and updates what is known of the namespace. `failed`: the
/// controller may have been reset in this batch (a request may end so); `spurious`: commands
/// without a fault may have timed out on a stalled machine and been aborted. Returns the errors
/// seen, and whether a request ended with the reset.
fn check_batch(
    sent: &[Sent],
    done: &mut Completions,
    known: &mut Known,
    failed: bool,
    spurious: bool,
) -> Result<(u64, bool), TestCaseError> {
    let (mut errors, mut dead) = (0, false);
    for s in sent {
        let d = done.remove(&s.tag).expect("completed");
        let what = format!("tag {} ({:?}, killer {:?})", s.tag, s.op, s.killer);
        errors += d.result.is_err() as u64;
        prop_assert!(d.meta.is_none(), "{}: no metadata buffer was given", what);
        if let Err(e @ NvmeError::Reset { .. }) = &d.result {
            prop_assert!(failed || spurious, "{}: a reset nothing called for: {}", what, e);
            let buf = d
                .buf
                .as_ref()
                .expect("the buffer comes back with the reset's error");
            prop_assert_eq!(
                (buf.bus_addr(0), buf.len()),
                s.buf,
                "{}: another buffer came back",
                what
            );
            dead = true;
            if s.op.write {
                known.lost(s.op.lba, s.op.blocks);
            }
            continue;
        }
        prop_assert!(
            s.killer.is_none(),
            "{}: ended {:?}, not with the controller reset",
            what,
            d.result
        );
        let buf = d.buf.as_ref().expect("the buffer comes back");
        prop_assert_eq!(
            (buf.bus_addr(0), buf.len()),
            s.buf,
            "{}: another buffer came back",
            what
        );
        // Command Abort Requested (Generic 07h).
        let abort_requested = |r: &Result<u64, NvmeError>| match r {
            Err(NvmeError::Status { status, .. }) => status.sct() == Sct::Generic && status.sc() == 0x07,
            _ => false,
        };
        match (s.op.fate, &d.result) {
            (_, r) if spurious && abort_requested(r) => {}
            (Fate::Normal | Fate::Late(_) | Fate::Duplicate, r) => {
                prop_assert!(r.is_ok(), "{}: {:?}", what, r)
            }
            (Fate::Status(want), Err(NvmeError::Status { status, .. })) => {
                let want = vfpoll_nvme::Status::new(Sct::from_bits(want.sct), want.sc, want.dnr);
                prop_assert_eq!(status.field(), want.field(), "{}: {}", what, status);
            }
            (Fate::Lost, r) => prop_assert!(abort_requested(r), "{}: {:?}", what, r),
            (_, r) => prop_assert!(false, "{}: {:?}", what, r),
        }
        match (s.op.write, &d.result) {
            (true, Ok(_)) => known.wrote(s.op.lba, &s.data),
            (true, Err(_)) => known.lost(s.op.lba, s.op.blocks),
            (false, Ok(_)) => known.check(s.op.lba, &contents(buf), &what)?,
            // A failed read may have moved some data: nothing to check.
            (false, Err(_)) => {}
        }
    }
    Ok((errors, dead))
}

fn run_case(case: &Case) -> Result<(), TestCaseError> {
    let rig = rig(ModelConfig {
        namespaces: vec![NamespaceConfig::new(1, LBA as u32, BLOCKS)],
        mdts: 3,
        max_io_queue_pairs: 8,
        ..Default::default()
    });
    let start = pattern(7, BLOCKS as usize * LBA);
    rig.model.write_ns(1, 0, &start).unwrap();
    let mut known = Known(start.chunks(LBA).map(|b| Some(b.to_vec())).collect());
    let mut qp = rig
        .ctrl
        .create_qpair::<RegionBuf>(&QpairOptions {
            entries: ENTRIES,
            timeout: T,
            ..Default::default()
        })
        .expect("queue pair");
    let (mut tag, mut requests, mut errors, mut bogus) = (0u64, 0u64, 0u64, 0u64);
    let batches = case.batches.iter().map(|b| (b, None));
    let last = case
        .killer
        .iter()
        .map(|(b, victim, k)| (b, Some((victim.index(b.len()), *k))));
    let mut dead = false;
    for (ops, killer) in batches.chain(last) {
        let before = qp.stats();
        let (sent, mut done) = run_batch(&rig, &mut qp, ops, killer, &mut tag)?;
        requests += sent.len() as u64;
        // The fates that took effect: the victim's is replaced by the killer.
        let count = |f: Fate| {
            let victim = killer.map(|k| k.0);
            ops.iter()
                .enumerate()
                .filter(|&(i, o)| Some(i) != victim && o.fate == f)
                .count() as u64
        };
        let bogus_id = matches!(
            killer,
            Some((_, Killer::BogusOutside(_) | Killer::BogusNeverUsed(_)))
        );
        // A lost completion is aborted once; so is a bogus id's command, then given up on.
        let aborts = count(Fate::Lost) + bogus_id as u64;
        let wrong_phase = matches!(killer, Some((_, Killer::WrongPhase)));
        let spurious = !wrong_phase && qp.stats().aborts - before.aborts > aborts;
        let (e, failed) = check_batch(&sent, &mut done, &mut known, killer.is_some(), spurious)?;
        errors += e;
        // One bogus completion per duplicate and per bogus id; wait for late duplicates.
        bogus += count(Fate::Duplicate) + bogus_id as u64;
        let since = Instant::now();
        while qp.stats().bogus_completions < bogus && since.elapsed() < Duration::from_secs(1) {
            qp.poll(usize::MAX, |d| panic!("tag {} completed again", d.tag));
            std::thread::yield_now();
        }
        let st = qp.stats();
        prop_assert_eq!(st.bogus_completions, bogus, "{:?}", st);
        prop_assert_eq!((st.requests, st.errors), (requests, errors), "{:?}", st);
        prop_assert_eq!(qp.outstanding(), 0);
        // After a killer, or after commands timed out twice on a stalled machine: a reset.
        dead |= failed;
    }
    if dead {
        // Faults armed for commands the reset caught before the controller fetched them would
        // land on the next ones.
        rig.model.clear_faults();
        // The same queue pair goes on after the reset.
        prop_assert_eq!(qp.failed(), None);
        let d = sync(
            &mut qp,
            |q, b| q.read(1, 0, b, u64::MAX),
            region_buf(&rig.ctrl, 0, &[0; LBA]),
        );
        prop_assert!(d.result.is_ok(), "read after the reset: {:?}", d.result);
        prop_assert!(rig.ctrl.resets().0 >= 1);
        known.check(0, &contents(&d.buf.expect("buffer back")), "read after the reset")?;
    }
    drop(qp);
    // What was written successfully reads back, through a fresh queue pair.
    let mut qp = rig
        .ctrl
        .create_qpair::<RegionBuf>(&qopts(8, PROMPT))
        .expect("a fresh queue pair");
    for lba in (0..BLOCKS).step_by(128) {
        let d = sync(
            &mut qp,
            |q, b| q.read(1, lba, b, lba),
            region_buf(&rig.ctrl, 0, &[0; 128 * LBA]),
        );
        prop_assert!(d.result.is_ok(), "read back at {}: {:?}", lba, d.result);
        known.check(lba, &contents(&d.buf.expect("buffer back")), "read back")?;
    }
    Ok(())
}

/// `cases` cases (unless `PROPTEST_CASES` says otherwise); shrinking re-runs whole cases, up to
/// a second each, so it is bounded too.
fn config(cases: u32) -> ProptestConfig {
    let mut c = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    c.max_shrink_iters = 256;
    c.max_shrink_time = 60_000;
    c
}

proptest! {
    #![proptest_config(config(48))]

    /// Odd statuses, late and duplicated completions: 48 cases, tens of milliseconds each.
    #[test]
    fn completions_under_random_faults(case in case(false)) {
        run_case(&case)?;
    }
}

proptest! {
    #![proptest_config(config(8))]

    /// Lost completions, bogus command ids and wrong phase tags: 8 cases, each up to three
    /// timeouts.
    #[test]
    fn lost_and_bogus_completions_and_wrong_phase_tags(case in case(true)) {
        run_case(&case)?;
    }
}
