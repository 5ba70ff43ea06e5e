//! What `vfpoll perf` prints: the text report (rates, latencies, histograms, the breakdown) and
//! the same as JSON.

use std::time::Duration;

use serde_json::{json, Value};
use vfpoll_engine::report::{histogram_buckets, OpStats};
use vfpoll_engine::{Breakdown, Histogram, JobSpec, LatencySummary, Limit, Report};

use super::{build, Args, Devices};

pub(super) fn print_text(job: &JobSpec, r: &Report) {
    let secs = r.elapsed.as_secs_f64();
    for (name, op) in [("read", &r.read), ("write", &r.write)] {
        if op.ios == 0 {
            continue;
        }
        let iops = op.ios as f64 / secs.max(f64::MIN_POSITIVE);
        let bw = op.bytes as f64 / secs.max(f64::MIN_POSITIVE);
        println!(
            "{name}: IOPS={} BW={:.1}MiB/s ({:.1}MB/s), {} I/Os in {secs:.2} s",
            thousands(iops),
            bw / (1 << 20) as f64,
            bw / 1e6,
            op.ios
        );
        print_latency(&LatencySummary::of(&op.latency));
    }
    if r.read.ios != 0 && r.write.ios != 0 {
        println!(
            "total: IOPS={} BW={:.1}MiB/s ({:.1}MB/s)",
            thousands(r.iops()),
            r.bw_bytes() / (1 << 20) as f64,
            r.bw_bytes() / 1e6
        );
        print_latency(&LatencySummary::of(&r.latency()));
    }
    for w in &r.workers {
        let core = w.core.map_or("-".into(), |c| c.to_string());
        println!(
            "worker {} (core {core}): {} IOPS",
            w.worker,
            thousands((w.read.ios + w.write.ios) as f64 / w.elapsed.as_secs_f64().max(f64::MIN_POSITIVE))
        );
        for q in &w.queues {
            let s = q.stats;
            println!(
                "  {} queue {} (ns {:?}): {} I/Os, {} commands, SQ doorbells {}, CQ doorbells {}, shadow-only updates {}",
                q.device, q.qid, q.nsids, q.ios, s.commands, s.sq_doorbells, s.cq_doorbells, s.shadow_only
            );
            let busy = q.polls - q.empty_polls;
            println!(
                "    polls {} ({:.1}% empty), {:.2} completions per non-empty poll",
                q.polls,
                100.0 * q.empty_polls as f64 / q.polls.max(1) as f64,
                s.completions as f64 / busy.max(1) as f64
            );
            for z in &q.zoned {
                let written = match z.at_once {
                    0 => "read only".to_string(),
                    n => format!(
                        "{n} written at once (one write in flight each), {} reset, {} finished",
                        z.resets, z.finishes
                    ),
                };
                println!(
                    "    zoned ns {}: {} zones of {} I/Os each, {written}",
                    z.nsid, z.zones, z.ios_per_zone
                );
            }
        }
    }
    if r.errors != 0 {
        println!("errors: {} I/Os failed", r.errors);
        for e in &r.error_samples {
            println!("  {e}");
        }
    }
    if let Some(v) = &r.verify {
        if v.mismatches == 0 && r.errors == 0 {
            println!(
                "verify: OK: {} blocks written, {} read back and checked (seed {})",
                v.blocks_written, v.blocks_checked, job.seed
            );
        } else {
            println!(
                "verify: FAILED: {} of {} blocks checked differ, {} I/O errors (seed {})",
                v.mismatches, v.blocks_checked, r.errors, job.seed
            );
            for m in &v.samples {
                println!("  {} ns {} LBA {}: holds {}", m.device, m.nsid, m.lba, m.found);
            }
        }
    }
}

fn print_latency(l: &LatencySummary) {
    let us = |ns: u64| ns as f64 / 1000.0;
    println!(
        "  lat (us): min={:.2} max={:.2} mean={:.2} stdev={:.2}",
        us(l.min),
        us(l.max),
        l.mean / 1000.0,
        l.stddev / 1000.0
    );
    println!(
        "  lat percentiles (us): p50={:.2} p90={:.2} p99={:.2} p99.9={:.2} p99.99={:.2}",
        us(l.p50),
        us(l.p90),
        us(l.p99),
        us(l.p999),
        us(l.p9999)
    );
}

pub(super) fn print_histogram(name: &str, h: &Histogram<u64>, per_octave: u32) {
    println!(
        "{name} latency histogram ({} ranges per power of two, {} I/Os):",
        per_octave,
        h.len()
    );
    println!(
        "  {:>25}  {:>12}  {:>8}  {:>10}",
        "range (us)", "I/Os", "%", "cumulative"
    );
    let us = |ns: u64| ns as f64 / 1000.0;
    for b in histogram_buckets(h, per_octave) {
        println!(
            "  {:>11.3} - {:>11.3}  {:>12}  {:>7.3}%  {:>9.4}%",
            us(b.lo_ns),
            us(b.hi_ns),
            b.count,
            b.percent,
            b.cumulative_percent
        );
    }
}

/// Segment names as printed, in the order of [`Breakdown::segments`].
const SEGMENTS: [&str; 4] = [
    "submit -> doorbell written",
    "doorbell -> completion seen",
    "completion seen -> callback",
    "callback -> next submit",
];

pub(super) fn print_breakdown(b: &Breakdown) {
    let n = b.submit_to_doorbell.len();
    println!(
        "latency breakdown at queue depth 1 ({} stamps, {} I/Os):",
        b.clock,
        thousands(n as f64)
    );
    println!(
        "  {:<30} {:>10} {:>10} {:>10}",
        "segment (us)", "mean", "p50", "p99"
    );
    let us = |ns: f64| ns / 1000.0;
    let mut cycle = 0.0;
    for (label, (_, h)) in SEGMENTS.iter().zip(b.segments()) {
        let l = LatencySummary::of(h);
        cycle += l.mean;
        println!(
            "  {label:<30} {:>10.3} {:>10.3} {:>10.3}",
            us(l.mean),
            us(l.p50 as f64),
            us(l.p99 as f64)
        );
    }
    println!("  {:<30} {:>10.3}", "sum: one I/O's cycle", us(cycle));
}

fn breakdown_json(b: &Breakdown) -> Value {
    let segments: serde_json::Map<String, Value> = b
        .segments()
        .iter()
        .map(|(name, h)| (name.to_string(), lat_json(&LatencySummary::of(h))))
        .collect();
    json!({
        "clock": b.clock,
        "ios": b.submit_to_doorbell.len(),
        "segments_ns": segments,
    })
}

fn histogram_json(h: &Histogram<u64>, per_octave: u32) -> Value {
    histogram_buckets(h, per_octave)
        .iter()
        .map(|b| {
            json!({
                "lo_ns": b.lo_ns, "hi_ns": b.hi_ns, "count": b.count,
                "percent": b.percent, "cumulative_percent": b.cumulative_percent,
            })
        })
        .collect()
}

fn lat_json(l: &LatencySummary) -> Value {
    json!({
        "min": l.min, "max": l.max, "mean": l.mean, "stddev": l.stddev,
        "p50": l.p50, "p90": l.p90, "p99": l.p99, "p999": l.p999, "p9999": l.p9999,
        "percentile": {
            "50.000000": l.p50, "90.000000": l.p90, "99.000000": l.p99,
            "99.900000": l.p999, "99.990000": l.p9999,
        },
    })
}

fn op_json(op: &OpStats, elapsed: Duration) -> Value {
    let secs = elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
    json!({
        "io_bytes": op.bytes,
        "total_ios": op.ios,
        "iops": op.ios as f64 / secs,
        "bw_bytes": op.bytes as f64 / secs,
        "lat_ns": lat_json(&LatencySummary::of(&op.latency)),
    })
}

pub(super) fn to_json(a: &Args, job: &JobSpec, cores: &[usize], devices: &Devices, r: &Report) -> Value {
    let workers: Vec<Value> = r
        .workers
        .iter()
        .map(|w| {
            let queues: Vec<Value> = w
                .queues
                .iter()
                .map(|q| {
                    let s = q.stats;
                    json!({
                        "device": q.device, "qid": q.qid, "nsids": q.nsids, "ios": q.ios,
                        "polls": q.polls, "empty_polls": q.empty_polls,
                        "requests": s.requests, "commands": s.commands, "completions": s.completions,
                        "errors": s.errors, "sq_doorbells": s.sq_doorbells, "cq_doorbells": s.cq_doorbells,
                        "shadow_only": s.shadow_only, "bogus_completions": s.bogus_completions,
                        "aborts": s.aborts,
                        "zoned": q.zoned.iter().map(|z| json!({
                            "nsid": z.nsid, "zones": z.zones, "ios_per_zone": z.ios_per_zone,
                            "at_once": z.at_once, "resets": z.resets, "finishes": z.finishes,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "worker": w.worker, "core": w.core, "runtime_ns": w.elapsed.as_nanos() as u64,
                "ios": w.read.ios + w.write.ios, "errors": w.errors,
                "read": op_json(&w.read, w.elapsed), "write": op_json(&w.write, w.elapsed),
                "queues": queues,
            })
        })
        .collect();
    let verify = r.verify.as_ref().map(|v| {
        json!({
            "passed": r.passed(),
            "blocks_written": v.blocks_written,
            "blocks_checked": v.blocks_checked,
            "mismatches": v.mismatches,
            "samples": v.samples.iter().map(|m| json!({
                "device": m.device, "nsid": m.nsid, "lba": m.lba, "found": m.found.to_string(),
            })).collect::<Vec<_>>(),
        })
    });
    let (profile, exe, warning) = build();
    json!({
        "vfpoll_version": env!("CARGO_PKG_VERSION"),
        "build": { "profile": profile, "binary": exe, "warning": warning },
        "job": {
            "workload": job.workload.name(),
            "rwmix_read": job.workload.read_percent(job.rwmix_read),
            "io_size": job.io_size,
            "queue_depth": job.queue_depth,
            "time_s": match job.limit { Limit::Time(t) if !job.verify => Some(t.as_secs_f64()), _ => None },
            "ios": match job.limit { Limit::Ios(n) if !job.verify => Some(n), _ => None },
            "warmup_s": job.warmup.as_secs_f64(),
            "verify": job.verify,
            "seed": job.seed,
            "cores": cores,
            "devices": devices.ctrls.iter().map(|(_, d)| d.as_str()).collect::<Vec<_>>(),
            "nsid": a.nsid,
            "iommu": if a.model { "model" } else if a.noiommu { "noiommu" } else { "iommu" },
            "shadow_doorbells": devices.ctrls.iter().map(|(c, _)| c.shadow_doorbells()).collect::<Vec<_>>(),
            "sgl": a.sgl,
            "cmb_sq": a.cmb_sq,
            "breakdown": a.breakdown,
        },
        "runtime_ns": r.elapsed.as_nanos() as u64,
        "total_ios": r.ios(),
        "iops": r.iops(),
        "bw_bytes": r.bw_bytes(),
        "lat_ns": lat_json(&LatencySummary::of(&r.latency())),
        "read": op_json(&r.read, r.elapsed),
        "write": op_json(&r.write, r.elapsed),
        "errors": r.errors,
        "error_samples": r.error_samples,
        "verify": verify,
        "latency_histogram": a.latency_histogram.map(|per| json!({
            "ranges_per_power_of_two": per,
            "read": histogram_json(&r.read.latency, per),
            "write": histogram_json(&r.write.latency, per),
        })),
        "latency_breakdown": r.breakdown.as_ref().map(breakdown_json),
        "workers": workers,
    })
}

pub(super) fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 20 && n.is_multiple_of(1 << 20) => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n.is_multiple_of(1 << 10) => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// `1234567.8` → `1,234,568`.
pub(super) fn thousands(v: f64) -> String {
    let s = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
