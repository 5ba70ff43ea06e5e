//! The results of `cargo xtask bench`: each run's JSON from the guest, medians over repeats,
//! and the table with the ratios between engines.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use super::{Case, Engine, CPU};
use crate::json::{self, Value};

/// IOPS and latency percentiles (µs) of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Result3 {
    pub(super) iops: f64,
    pub(super) p50_us: f64,
    pub(super) p99_us: f64,
}

pub(super) fn num(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Num(n) => Some(*n),
        _ => None,
    }
}

/// Parses a JSON file that may have lines of text before the document (fio's notes).
pub(super) fn load_json(path: &Path) -> Option<Value> {
    let text = fs::read_to_string(path).ok()?;
    let start = text.find('{')?;
    json::parse(text[start..].trim_end()).ok()
}

/// vfpoll perf's JSON: `iops`, `lat_ns.p50`, `lat_ns.p99`.
pub(super) fn vfpoll_result(v: &Value) -> Option<Result3> {
    let lat = v.get("lat_ns")?;
    Some(Result3 {
        iops: num(v.get("iops"))?,
        p50_us: num(lat.get("p50"))? / 1000.0,
        p99_us: num(lat.get("p99"))? / 1000.0,
    })
}

/// fio's JSON: `jobs[0].read.iops` and `lat_ns.percentile` (with `lat_percentiles=1`).
pub(super) fn fio_result(v: &Value) -> Option<Result3> {
    let read = v.get("jobs")?.as_array()?.first()?.get("read")?;
    let pct = read.get("lat_ns")?.get("percentile")?;
    Some(Result3 {
        iops: num(read.get("iops"))?,
        p50_us: num(pct.get("50.000000"))? / 1000.0,
        p99_us: num(pct.get("99.000000"))? / 1000.0,
    })
}

fn result_of(dir: &Path, e: Engine, case: &Case, rep: u32) -> Option<Result3> {
    let v = load_json(&dir.join(format!("{}-{}-r{rep}.json", e.name(), case.id)))?;
    match e.vfpoll_flags() {
        Some(_) => vfpoll_result(&v),
        None => fio_result(&v),
    }
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The smallest and the largest of `v` (positive figures: 0 is the floor of the largest).
fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::MAX, 0f64), |(l, h), &x| (l.min(x), h.max(x)))
}

/// Medians over the repetitions that produced a result, and the IOPS range.
fn summary(dir: &Path, e: Engine, case: &Case, repeat: u32) -> Option<(Result3, f64, f64, usize)> {
    let rs: Vec<Result3> = (1..=repeat).filter_map(|r| result_of(dir, e, case, r)).collect();
    if rs.is_empty() {
        return None;
    }
    let col = |f: fn(&Result3) -> f64| rs.iter().map(f).collect::<Vec<_>>();
    let iops = col(|r| r.iops);
    let (lo, hi) = min_max(&iops);
    Some((
        Result3 {
            iops: median(iops),
            p50_us: median(col(|r| r.p50_us)),
            p99_us: median(col(|r| r.p99_us)),
        },
        lo,
        hi,
        rs.len(),
    ))
}

/// One table row's cells: IOPS, IOPS range, p50, p99 (or dashes when no run produced a result).
fn cells(r: &Option<(Result3, f64, f64, usize)>, repeat: u32) -> (String, String, String, String) {
    match r {
        Some((m, lo, hi, n)) => (
            format!("{:.0}", m.iops),
            if *n == repeat as usize {
                format!("{lo:.0}-{hi:.0} x{:.2}", hi / lo.max(f64::MIN_POSITIVE))
            } else {
                format!("{lo:.0}-{hi:.0} ({n} runs)")
            },
            format!("{:.1}", m.p50_us),
            format!("{:.1}", m.p99_us),
        ),
        None => ("-".into(), String::new(), "-".into(), "-".into()),
    }
}

/// `a / b` as a ratio cell, or empty when either is missing.
fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}x", a / b.max(f64::MIN_POSITIVE)),
        _ => String::new(),
    }
}

/// Which way a block's ratio columns divide.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ratio {
    /// vfpoll's defaults over the row (vfpoll against a kernel engine).
    DefaultOverRow,
    /// The row over vfpoll's defaults (one of vfpoll's options against the defaults).
    RowOverDefault,
}

/// One block of rows per case: vfpoll's defaults, then `others` (those that ran), each with its
/// two ratios against the defaults.
fn blocks(s: &mut String, dir: &Path, cases: &[&Case], repeat: u32, others: &[Engine], dir_of_ratio: Ratio) {
    for &c in cases {
        let def = summary(dir, Engine::Vfpoll, c, repeat).map(|x| x.0);
        let mut label = c.label;
        for &e in std::iter::once(&Engine::Vfpoll).chain(others) {
            let r = summary(dir, e, c, repeat);
            let (iops, range, p50, p99) = cells(&r, repeat);
            let (ri, rp) = if e == Engine::Vfpoll {
                (String::new(), String::new())
            } else {
                let (num, den) = match dir_of_ratio {
                    Ratio::DefaultOverRow => (def, r.map(|x| x.0)),
                    Ratio::RowOverDefault => (r.map(|x| x.0), def),
                };
                (
                    ratio(num.map(|x| x.iops), den.map(|x| x.iops)),
                    ratio(num.map(|x| x.p99_us), den.map(|x| x.p99_us)),
                )
            };
            let _ = writeln!(
                s,
                "{label:<20} {:<15} {iops:>8} {range:>21} {p50:>9} {p99:>9} {ri:>13} {rp:>12}",
                e.name()
            );
            label = "";
        }
    }
}

/// The tables: vfpoll (defaults) against each kernel engine, one block per case; then, when
/// they ran, vfpoll's options against its defaults.
pub(super) fn table(dir: &Path, cases: &[&Case], engines: &[Engine], repeat: u32) -> String {
    let header = |a: &str, b: &str| {
        format!(
            "{:<20} {:<15} {:>8} {:>21} {:>9} {:>9} {a:>13} {b:>12}\n",
            "case", "engine", "IOPS", "IOPS range", "p50 us", "p99 us"
        )
    };
    let kernel: Vec<Engine> = Engine::ALL
        .into_iter()
        .filter(|e| e.is_kernel() && engines.contains(e))
        .collect();
    let options: Vec<Engine> = [Engine::VfpollMmioDb, Engine::VfpollCmbSq, Engine::FioVfpoll]
        .into_iter()
        .filter(|e| engines.contains(e))
        .collect();
    let mut s = header("IOPS vfpoll/k", "p99 vfpoll/k");
    blocks(&mut s, dir, cases, repeat, &kernel, Ratio::DefaultOverRow);
    s.push_str(
        "\nMedians over the repetitions. IOPS vfpoll/k: vfpoll's IOPS over the kernel engine's \
         (higher is better); p99 vfpoll/k: vfpoll's p99 over the kernel's (below 1 is better).\n",
    );
    if !options.is_empty() {
        s.push_str("\nvfpoll's options, same boot: vfpoll-mmio-db = perf --no-shadow-doorbell, vfpoll-cmb-sq = perf --cmb-sq, fio-vfpoll = fio with vfpoll's engine\n");
        s.push_str(&header("IOPS opt/def", "p99 opt/def"));
        blocks(&mut s, dir, cases, repeat, &options, Ratio::RowOverDefault);
        s.push_str(
            "\nIOPS opt/def: the option's IOPS over the defaults' (shadow doorbells on, SQ in host \
             memory); p99 opt/def likewise (below 1 is better).\n",
        );
    }
    s
}

/// What the test bed's noise was: the control computation's times (one before each half of
/// every repetition), their median, range and max/min.
pub(super) fn control_line(dir: &Path, repeat: u32) -> String {
    let secs: Vec<f64> = (1..=repeat)
        .flat_map(|r| [format!("k-r{r}"), format!("v-r{r}")])
        .filter_map(|l| fs::read_to_string(dir.join(format!("control-{l}.txt"))).ok())
        .filter_map(|t| t.trim().parse().ok())
        .filter(|&x: &f64| x > 0.0)
        .collect();
    if secs.is_empty() {
        return "test-bed control: no result (python3 missing in the guest?)".into();
    }
    let (lo, hi) = min_max(&secs);
    format!(
        "test-bed control (3 x SHA-256 of 32 MiB on CPU {CPU} before each half-repetition, {} runs): \
         median {:.3} s, {lo:.3}-{hi:.3} s, max/min {:.2}: how much the guest CPU's own speed varied",
        secs.len(),
        median(secs.clone()),
        hi / lo
    )
}
