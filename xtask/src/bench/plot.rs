//! `cargo xtask bench --plot`: two SVG figures drawn from the JSON files a bench run leaves in
//! `target/testbed/run/bench-iommu/out` (plotters, SVG backend only).
//!
//! - `latency-qd1.svg`: the latency distribution of each engine at 4 KiB randread QD1, as a
//!   percentile curve (latency against the percentile on a "nines" axis: 50, 90, 99, 99.9,
//!   99.99), from the repetition with the median IOPS (one real run, not a mix of runs). vfpoll
//!   perf's JSON has those five percentiles; fio's (`lat_percentiles=1`) has its default list,
//!   every point of which is drawn.
//! - `iops-qd.svg`: median IOPS over the repetitions against the queue depth, for every engine,
//!   from the 4 KiB randread cases that ran (`--cases 4k-randread-qd1,...,4k-randread-qd32`).
//!
//! The figures come from an emulated CPU (QEMU TCG): they compare engines measured side by side
//! in one boot, never device speeds. Both captions say so.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::results::{load_json, median};
use super::{Case, Engine};
use crate::json::Value;
use crate::util::{err, Result};

/// The file names written into the plot directory.
pub const LATENCY_SVG: &str = "latency-qd1.svg";
/// See [`LATENCY_SVG`].
pub const IOPS_SVG: &str = "iops-qd.svg";

/// One engine's latency percentiles: (percentile, microseconds), ascending.
fn percentiles(v: &Value, e: Engine) -> Option<Vec<(f64, f64)>> {
    let lat = match e.vfpoll_flags() {
        Some(_) => v.get("lat_ns")?,
        None => v.get("jobs")?.as_array()?.first()?.get("read")?.get("lat_ns")?,
    };
    let Value::Obj(m) = lat.get("percentile")? else {
        return None;
    };
    let mut pts: Vec<(f64, f64)> = m
        .iter()
        .filter_map(|(k, v)| match v {
            Value::Num(ns) => Some((k.parse::<f64>().ok()?, ns / 1000.0)),
            _ => None,
        })
        // The nines axis starts at the median and cannot show 100.
        .filter(|&(p, _)| (50.0..100.0).contains(&p))
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    (!pts.is_empty()).then_some(pts)
}

/// The nines of a percentile: 50 -> 0.30, 90 -> 1, 99 -> 2, 99.9 -> 3.
fn nines(p: f64) -> f64 {
    (100.0 / (100.0 - p)).log10()
}

/// The percentiles the latency figure marks on its axis.
const MARKED: [f64; 5] = [50.0, 90.0, 99.0, 99.9, 99.99];

/// The axis label of a position on the nines axis.
fn nines_label(x: f64) -> String {
    let p = 100.0 - 100.0 / 10f64.powf(x);
    let s = format!("{p:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("p{s}")
}

/// The label of a tick: the marked percentile it falls on (within half a tick step), or none.
fn tick_label(x: f64) -> String {
    MARKED
        .iter()
        .find(|&&p| (nines(p) - x).abs() < 0.026)
        .map(|&p| nines_label(nines(p)))
        .unwrap_or_default()
}

fn iops_of(v: &Value, e: Engine) -> Option<f64> {
    let n = match e.vfpoll_flags() {
        Some(_) => v.get("iops")?,
        None => v.get("jobs")?.as_array()?.first()?.get("read")?.get("iops")?,
    };
    match n {
        Value::Num(x) => Some(*x),
        _ => None,
    }
}

/// The repetition of `e` in `case` whose IOPS is the median (the lower middle one for an even
/// count), with its JSON.
fn median_run(dir: &Path, e: Engine, case: &Case, repeat: u32) -> Option<Value> {
    let mut runs: Vec<(f64, Value)> = (1..=repeat)
        .filter_map(|r| load_json(&dir.join(format!("{}-{}-r{r}.json", e.name(), case.id))))
        .filter_map(|v| Some((iops_of(&v, e)?, v)))
        .collect();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = runs.len();
    (n > 0).then(|| runs.swap_remove((n - 1) / 2).1)
}

/// A colour per engine, the same in both figures.
fn colour(e: Engine) -> RGBColor {
    match e {
        Engine::Vfpoll => RGBColor(0xd6, 0x27, 0x28),
        Engine::VfpollMmioDb => RGBColor(0xff, 0x7f, 0x0e),
        Engine::VfpollCmbSq => RGBColor(0x8c, 0x56, 0x4b),
        Engine::FioVfpoll => RGBColor(0xe3, 0x77, 0xc2),
        Engine::IoUring => RGBColor(0x1f, 0x77, 0xb4),
        Engine::IoUringHipri => RGBColor(0x2c, 0xa0, 0x2c),
        Engine::Libaio => RGBColor(0x94, 0x67, 0xbd),
    }
}

fn plot_err(what: &str, e: impl std::fmt::Display) -> crate::util::Error {
    err!("bench --plot: {what}: {e}")
}

/// Draws the figures that the results in `dir` allow into `out_dir`; returns the files written.
/// `title` names the run (kernel, time per run, repetitions) under each caption.
pub fn draw(
    dir: &Path,
    cases: &[&'static Case],
    engines: &[Engine],
    repeat: u32,
    out_dir: &Path,
    title: &str,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out_dir).map_err(|e| plot_err(&out_dir.display().to_string(), e))?;
    let mut written = Vec::new();
    let qd1 = cases
        .iter()
        .find(|c| c.rw == "randread" && c.bs == "4k" && c.qd == 1);
    if let Some(c) = qd1 {
        let curves: Vec<(Engine, Vec<(f64, f64)>)> = engines
            .iter()
            .filter_map(|&e| Some((e, percentiles(&median_run(dir, e, c, repeat)?, e)?)))
            .collect();
        if !curves.is_empty() {
            let path = out_dir.join(LATENCY_SVG);
            latency_figure(&path, &curves, title)?;
            written.push(path);
        }
    }
    let depths: Vec<&Case> = cases
        .iter()
        .copied()
        .filter(|c| c.rw == "randread" && c.bs == "4k")
        .collect();
    let lines: Vec<(Engine, Vec<(f64, f64)>)> = engines
        .iter()
        .map(|&e| {
            let pts = depths
                .iter()
                .filter_map(|c| {
                    let iops: Vec<f64> = (1..=repeat)
                        .filter_map(|r| load_json(&dir.join(format!("{}-{}-r{r}.json", e.name(), c.id))))
                        .filter_map(|v| iops_of(&v, e))
                        .collect();
                    (!iops.is_empty()).then(|| (c.qd as f64, median(iops)))
                })
                .collect::<Vec<_>>();
            let mut pts = pts;
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (e, pts)
        })
        .filter(|(_, pts)| !pts.is_empty())
        .collect();
    if lines.iter().any(|(_, pts)| pts.len() > 1) {
        let path = out_dir.join(IOPS_SVG);
        iops_figure(&path, &lines, title)?;
        written.push(path);
    }
    Ok(written)
}

fn latency_figure(path: &Path, curves: &[(Engine, Vec<(f64, f64)>)], title: &str) -> Result<()> {
    let all = curves.iter().flat_map(|(_, c)| c.iter());
    let (lo, hi) = all.fold((f64::MAX, 0f64), |(l, h), &(_, us)| (l.min(us), h.max(us)));
    let x_max = curves
        .iter()
        .flat_map(|(_, c)| c.iter().map(|&(p, _)| nines(p)))
        .fold(0f64, f64::max)
        .max(2.0)
        + 0.2;
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    let e = |x| plot_err(&path.display().to_string(), x);
    root.fill(&WHITE).map_err(e)?;
    let area = root
        .titled(
            "4 KiB randread QD1: latency by percentile (lower is better)",
            ("sans-serif", 18),
        )
        .map_err(e)?;
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 13))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.2f64..x_max, (lo * 0.8..hi * 1.25).log_scale())
        .map_err(e)?;
    // Ticks every 0.05 nines, labelled only at the marked percentiles, which get a grid line.
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("percentile (log scale of 1 / (1 - p): each step right is one more nine)")
        .y_desc("latency (us, log scale)")
        .x_labels(((x_max - 0.2) / 0.05) as usize)
        .x_label_formatter(&|x| tick_label(*x))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(e)?;
    let grid = RGBColor(0xc8, 0xc8, 0xc8);
    for p in MARKED {
        let x = nines(p);
        chart
            .draw_series(LineSeries::new(
                [(x, lo * 0.8), (x, hi * 1.25)],
                grid.stroke_width(1),
            ))
            .map_err(e)?;
    }
    for (engine, pts) in curves {
        let c = colour(*engine);
        let xy: Vec<(f64, f64)> = pts.iter().map(|&(p, us)| (nines(p), us)).collect();
        chart
            .draw_series(LineSeries::new(xy.clone(), c.stroke_width(2)))
            .map_err(e)?
            .label(engine.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(xy.into_iter().map(|p| Circle::new(p, 3, c.filled())))
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

fn iops_figure(path: &Path, lines: &[(Engine, Vec<(f64, f64)>)], title: &str) -> Result<()> {
    let (q_max, i_max) = lines
        .iter()
        .flat_map(|(_, l)| l.iter())
        .fold((1f64, 0f64), |(q, i), &(d, x)| (q.max(d), i.max(x)));
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    let e = |x| plot_err(&path.display().to_string(), x);
    root.fill(&WHITE).map_err(e)?;
    let area = root
        .titled(
            "4 KiB randread: IOPS against queue depth (higher is better)",
            ("sans-serif", 18),
        )
        .map_err(e)?;
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 13))
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(72)
        .build_cartesian_2d(-0.2f64..q_max.log2() + 0.2, 0f64..i_max * 1.1)
        .map_err(e)?;
    // The x axis is log2 of the queue depth, labelled with the depth at whole powers of two.
    chart
        .configure_mesh()
        .x_desc("queue depth (log scale)")
        .y_desc("IOPS (median of the repetitions)")
        .x_labels(q_max.log2() as usize + 2)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 && *x >= 0.0 {
                format!("{:.0}", 2f64.powf(x.round()))
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
        .draw()
        .map_err(e)?;
    for (engine, pts) in lines {
        let c = colour(*engine);
        let pts: Vec<(f64, f64)> = pts.iter().map(|&(q, iops)| (q.log2(), iops)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(e)?
            .label(engine.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::CASES;
    use super::*;

    #[test]
    fn nines_axis() {
        assert_eq!(tick_label(nines(99.9) + 0.01), "p99.9");
        assert_eq!(tick_label(2.5), "");
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.9) - 3.0).abs() < 1e-9);
        assert_eq!(nines_label(nines(99.0)), "p99");
        assert_eq!(nines_label(nines(99.99)), "p99.99");
        assert_eq!(nines_label(nines(50.0)), "p50");
    }

    #[test]
    fn figures_are_drawn_from_both_json_shapes() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ours = |iops: u32| {
            format!(
                r#"{{"iops":{iops},"lat_ns":{{"p50":1000,"percentile":{{"50.000000":14000,"90.000000":15000,"99.000000":30000,"99.900000":90000,"99.990000":400000}}}}}}"#
            )
        };
        let fio = |iops: u32| {
            format!(
                r#"{{"jobs":[{{"read":{{"iops":{iops},"lat_ns":{{"percentile":{{"1.000000":150000,"50.000000":200000,"99.000000":900000,"99.990000":2000000}}}}}}}}]}}"#
            )
        };
        let depth = ["4k-randread-qd1", "4k-randread-qd4", "4k-randread-qd32"];
        for id in depth {
            for r in 1..=3 {
                std::fs::write(dir.join(format!("vfpoll-{id}-r{r}.json")), ours(70_000 + r * 10)).unwrap();
                std::fs::write(dir.join(format!("io_uring-{id}-r{r}.json")), fio(5_000 + r)).unwrap();
            }
        }
        let cases: Vec<&Case> = CASES.iter().filter(|c| depth.contains(&c.id)).collect();
        let v = median_run(&dir, Engine::Vfpoll, cases[0], 3).unwrap();
        assert_eq!(iops_of(&v, Engine::Vfpoll), Some(70_020.0));
        let p = percentiles(
            &load_json(&dir.join("io_uring-4k-randread-qd1-r1.json")).unwrap(),
            Engine::IoUring,
        )
        .unwrap();
        assert_eq!(p, [(50.0, 200.0), (99.0, 900.0), (99.99, 2000.0)]);
        let out = dir.join("plots");
        let files = draw(
            &dir,
            &cases,
            &[Engine::Vfpoll, Engine::IoUring, Engine::Libaio],
            3,
            &out,
            "test",
        )
        .unwrap();
        assert_eq!(files, [out.join(LATENCY_SVG), out.join(IOPS_SVG)]);
        for f in &files {
            let svg = std::fs::read_to_string(f).unwrap();
            assert!(
                svg.starts_with("<svg") && svg.contains("vfpoll") && svg.contains("io_uring"),
                "{svg}"
            );
            assert!(!svg.contains("libaio"), "an engine with no results has no line");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
