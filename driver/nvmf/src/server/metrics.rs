//! Counters for operators: per subsystem, namespace and host, kept by each worker for its own
//! connections and summed when read ([`super::Server::metrics`]), rendered as Prometheus text
//! ([`Metrics::to_prometheus`]).
//!
//! The I/O path adds no lock and no contended atomic: a worker's counters are written by that
//! worker's thread only, each with a relaxed load and store (a plain move on x86, no locked
//! instruction), and read by whoever scrapes them. A connection finds its counters for a
//! namespace once, in its worker's registry (a mutex taken at that first use and by a
//! scrape), and keeps them.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::fabrics::SubsystemId;

/// Upper bounds of the latency histogram's buckets in microseconds (a last bucket takes the
/// rest): from a fast RAM namespace on loopback (tens of µs) to a stalled device.
pub const LATENCY_BUCKETS_US: [u64; 14] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 500_000, 2_000_000,
];
const BUCKETS: usize = LATENCY_BUCKETS_US.len() + 1;

/// A counter written by one thread only and read by any: a relaxed load and store, so that
/// the writer's hot path has no locked instruction.
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn add(&self, n: u64) {
        // One writer: no update can be lost between the load and the store.
        self.0
            .store(self.0.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    #[inline]
    pub fn sub(&self, n: u64) {
        self.0
            .store(self.0.load(Ordering::Relaxed).wrapping_sub(n), Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Counters of one worker's connections (of the whole target, or of one subsystem), written
/// by that worker only; [`Server::stats`](super::Server::stats) sums the workers'.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    accepted: Counter,
    active: Counter,
    commands: Counter,
    io_commands: Counter,
    read_bytes: Counter,
    written_bytes: Counter,
    protocol_errors: Counter,
    io_errors: Counter,
}

impl Stats {
    pub(crate) fn connected(&self) {
        self.active.add(1);
        self.accepted.add(1);
    }

    pub(crate) fn disconnected(&self) {
        self.active.sub(1);
    }

    pub(crate) fn add_command(&self) {
        self.commands.add(1);
    }

    pub(crate) fn add_io_command(&self) {
        self.io_commands.add(1);
    }

    pub(crate) fn add_read(&self, n: u64) {
        self.read_bytes.add(n);
    }

    pub(crate) fn add_written(&self, n: u64) {
        self.written_bytes.add(n);
    }

    pub(crate) fn add_protocol_error(&self) {
        self.protocol_errors.add(1);
    }

    pub(crate) fn add_io_error(&self) {
        self.io_errors.add(1);
    }

    /// Adds these counters to `s`.
    pub(super) fn add_to(&self, s: &mut StatsSnapshot) {
        s.accepted += self.accepted.get();
        s.active = s.active.wrapping_add(self.active.get());
        s.commands += self.commands.get();
        s.io_commands += self.io_commands.get();
        s.read_bytes += self.read_bytes.get();
        s.written_bytes += self.written_bytes.get();
        s.protocol_errors += self.protocol_errors.get();
        s.io_errors += self.io_errors.get();
    }
}

/// Connections of the whole target: counted by the listener thread when it hands one to a
/// worker, and by the worker when it ends (per connection, not per command; several threads
/// write them, so these are plain atomics).
#[derive(Debug, Default)]
pub(crate) struct ConnTotals {
    pub accepted: AtomicU64,
    pub active: AtomicU64,
}

/// The counters at one moment: of the whole target ([`Server::stats`](super::Server::stats)),
/// or of one subsystem ([`Server::subsystem_stats`](super::Server::subsystem_stats), where
/// connections are those bound to the subsystem by their Connect, and commands those on them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    /// Connections accepted (of a subsystem: queues connected).
    pub accepted: u64,
    /// Connections open now.
    pub active: u64,
    /// Command capsules received.
    pub commands: u64,
    /// Of those, commands on I/O queues.
    pub io_commands: u64,
    /// Bytes sent to hosts as read data (I/O reads).
    pub read_bytes: u64,
    /// Bytes received from hosts after R2T.
    pub written_bytes: u64,
    /// Connections ended by a protocol error.
    pub protocol_errors: u64,
    /// I/O commands completed with an error status.
    pub io_errors: u64,
}

/// What kind of I/O command, for its counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IoKind {
    Read,
    Write,
    /// Flush, Write Zeroes, Dataset Management.
    Other,
}

/// One worker's counters of one (subsystem, namespace, host).
#[derive(Debug, Default)]
pub(crate) struct IoCounters {
    reads: Counter,
    writes: Counter,
    others: Counter,
    read_bytes: Counter,
    written_bytes: Counter,
    errors: Counter,
    reservation_conflicts: Counter,
    throttled: Counter,
    latency: [Counter; BUCKETS],
    latency_sum_ns: Counter,
}

impl IoCounters {
    /// A command completed after `latency` with `bytes` of data; `failed`: an error status.
    #[inline]
    pub fn complete(&self, kind: IoKind, bytes: u64, failed: bool, latency: Duration) {
        match kind {
            IoKind::Read => {
                self.reads.add(1);
                if !failed {
                    self.read_bytes.add(bytes);
                }
            }
            IoKind::Write => {
                self.writes.add(1);
                if !failed {
                    self.written_bytes.add(bytes);
                }
            }
            IoKind::Other => self.others.add(1),
        }
        if failed {
            self.errors.add(1);
        }
        let us = latency.as_micros().min(u64::MAX as u128) as u64;
        let b = LATENCY_BUCKETS_US.partition_point(|&le| le < us);
        self.latency[b].add(1);
        self.latency_sum_ns
            .add(latency.as_nanos().min(u64::MAX as u128) as u64);
    }

    /// A command was refused with Reservation Conflict.
    pub fn reservation_conflict(&self) {
        self.reservation_conflicts.add(1);
    }

    /// A command waited for a rate limit.
    pub fn throttled(&self) {
        self.throttled.add(1);
    }

    fn add_to(&self, s: &mut IoStats) {
        s.reads += self.reads.get();
        s.writes += self.writes.get();
        s.others += self.others.get();
        s.read_bytes += self.read_bytes.get();
        s.written_bytes += self.written_bytes.get();
        s.errors += self.errors.get();
        s.reservation_conflicts += self.reservation_conflicts.get();
        s.throttled += self.throttled.get();
        for (a, c) in s.latency.iter_mut().zip(&self.latency) {
            *a += c.get();
        }
        s.latency_sum_ns += self.latency_sum_ns.get();
    }
}

/// One worker's connection counters of one (subsystem, host).
#[derive(Debug, Default)]
pub(crate) struct ConnCounters {
    opened: Counter,
    closed: Counter,
}

impl ConnCounters {
    pub fn opened(&self) {
        self.opened.add(1);
    }

    pub fn closed(&self) {
        self.closed.add(1);
    }
}

/// (subsystem, NSID, host label).
type IoKey = (SubsystemId, u32, String);
/// (subsystem, host label).
type HostKey = (SubsystemId, String);

/// The counters of one worker, by key; the worker registers, anyone reads.
#[derive(Debug, Default)]
pub(crate) struct WorkerMetrics {
    io: Mutex<HashMap<IoKey, Arc<IoCounters>>>,
    conns: Mutex<HashMap<HostKey, Arc<ConnCounters>>>,
}

impl WorkerMetrics {
    /// The counters of `host`'s I/O to namespace `nsid` of `sub` (made at first use).
    pub fn io(&self, sub: SubsystemId, nsid: u32, host: &str) -> Arc<IoCounters> {
        let mut m = self.io.lock().unwrap_or_else(PoisonError::into_inner);
        m.entry((sub, nsid, host.to_owned())).or_default().clone()
    }

    /// The connection counters of `host` on `sub` (made at first use).
    pub fn conns(&self, sub: SubsystemId, host: &str) -> Arc<ConnCounters> {
        let mut m = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        m.entry((sub, host.to_owned())).or_default().clone()
    }

    fn add_to(&self, io: &mut BTreeMap<IoKey, IoStats>, hosts: &mut BTreeMap<HostKey, HostStats>) {
        for (k, c) in self.io.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            c.add_to(io.entry(k.clone()).or_default());
        }
        for (k, c) in self.conns.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            let h = hosts.entry(k.clone()).or_default();
            h.connections_total += c.opened.get();
            h.connections += c.opened.get().saturating_sub(c.closed.get());
        }
    }
}

/// I/O counters of one namespace and host, summed over the workers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Read commands completed (successfully or not).
    pub reads: u64,
    /// Write commands completed.
    pub writes: u64,
    /// Other I/O commands completed (Flush, Write Zeroes, Dataset Management).
    pub others: u64,
    /// Bytes read successfully.
    pub read_bytes: u64,
    /// Bytes written successfully.
    pub written_bytes: u64,
    /// Commands completed with an error status.
    pub errors: u64,
    /// Commands refused with Reservation Conflict.
    pub reservation_conflicts: u64,
    /// Commands that waited for a rate limit (per-host or per-namespace IOPS or bytes/s).
    pub throttled: u64,
    /// Completed commands by latency bucket ([`LATENCY_BUCKETS_US`], then the rest), from
    /// the capsule's arrival to its completion being queued for sending.
    pub latency: [u64; BUCKETS],
    /// Sum of the latencies in nanoseconds.
    pub latency_sum_ns: u64,
}

/// Connections of one host to one subsystem, summed over the workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Queues (connections) connected now.
    pub connections: u64,
    /// Queues connected since the start.
    pub connections_total: u64,
}

/// Counters of one subsystem.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubsystemMetrics {
    /// The subsystem's NQN.
    pub nqn: String,
    /// Connects that named the subsystem and were refused (host not allowed, bad fields).
    pub connect_refusals: u64,
    /// Failed in-band authentications (DH-HMAC-CHAP transactions that ended in failure).
    pub authentication_failures: u64,
    /// Per host label: connections.
    pub hosts: BTreeMap<String, HostStats>,
    /// Per (NSID, host label): I/O.
    pub io: BTreeMap<(u32, String), IoStats>,
}

/// Everything an operator scrapes, at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Per subsystem, by NQN.
    pub subsystems: BTreeMap<String, SubsystemMetrics>,
    /// Connections open now on the whole target (discovery ones too).
    pub connections: u64,
    /// Connections ended by a protocol error.
    pub protocol_errors: u64,
}

/// Sums the workers' counters; `names` gives each subsystem's NQN and refused Connects
/// (counters of subsystems removed since are dropped).
pub(crate) fn collect(
    workers: &[Arc<WorkerMetrics>],
    names: &BTreeMap<SubsystemId, (String, u64)>,
    connections: u64,
    protocol_errors: u64,
) -> Metrics {
    let mut io = BTreeMap::new();
    let mut hosts = BTreeMap::new();
    for w in workers {
        w.add_to(&mut io, &mut hosts);
    }
    let mut subsystems: BTreeMap<String, SubsystemMetrics> = names
        .values()
        .map(|(nqn, refused)| {
            (
                nqn.clone(),
                SubsystemMetrics {
                    nqn: nqn.clone(),
                    connect_refusals: *refused,
                    ..SubsystemMetrics::default()
                },
            )
        })
        .collect();
    for ((sub, host), h) in hosts {
        if let Some(s) = names.get(&sub).and_then(|(n, _)| subsystems.get_mut(n)) {
            s.hosts.insert(host, h);
        }
    }
    for ((sub, nsid, host), st) in io {
        if let Some(s) = names.get(&sub).and_then(|(n, _)| subsystems.get_mut(n)) {
            s.io.insert((nsid, host), st);
        }
    }
    Metrics {
        subsystems,
        connections,
        protocol_errors,
    }
}

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Metrics {
    /// The Prometheus text exposition format (version 0.0.4): every family with its HELP and
    /// TYPE, labels `subsystem`, `nsid` and `host` (a host that connected without a host NQN
    /// is `hostid:<uuid>`).
    pub fn to_prometheus(&self) -> String {
        let mut o = String::new();
        let subs = &self.subsystems;
        io_family(
            &mut o,
            subs,
            "vfpoll_nvmf_io_commands_total counter I/O commands completed, by operation (read, write, other: flush, write zeroes, dataset management).",
            |o, l, st| {
                for (op, n) in [("read", st.reads), ("write", st.writes), ("other", st.others)] {
                    let _ = writeln!(o, "vfpoll_nvmf_io_commands_total{{{l},op=\"{op}\"}} {n}");
                }
            },
        );
        io_family(
            &mut o,
            subs,
            "vfpoll_nvmf_io_bytes_total counter Bytes moved by successful reads and writes.",
            |o, l, st| {
                for (dir, n) in [("read", st.read_bytes), ("write", st.written_bytes)] {
                    let _ = writeln!(o, "vfpoll_nvmf_io_bytes_total{{{l},direction=\"{dir}\"}} {n}");
                }
            },
        );
        io_family(
            &mut o,
            subs,
            "vfpoll_nvmf_io_errors_total counter I/O commands completed with an error status.",
            |o, l, st| {
                let _ = writeln!(o, "vfpoll_nvmf_io_errors_total{{{l}}} {}", st.errors);
            },
        );
        io_family(
            &mut o,
            subs,
            "vfpoll_nvmf_reservation_conflicts_total counter I/O commands refused with Reservation Conflict (fenced off by another host's reservation, or a reservation command with a key that does not match).",
            |o, l, st| {
                let _ = writeln!(
                    o,
                    "vfpoll_nvmf_reservation_conflicts_total{{{l}}} {}",
                    st.reservation_conflicts
                );
            },
        );
        io_family(
            &mut o,
            subs,
            "vfpoll_nvmf_io_throttled_total counter I/O commands that waited for a per-host or per-namespace rate limit.",
            |o, l, st| {
                let _ = writeln!(o, "vfpoll_nvmf_io_throttled_total{{{l}}} {}", st.throttled);
            },
        );
        io_family(
            &mut o,
            subs,
            "vfpoll_nvmf_io_latency_seconds histogram I/O command latency in the target, from the capsule's arrival to its completion.",
            |o, l, st| {
                let mut cum = 0;
                for (i, n) in st.latency.iter().enumerate() {
                    cum += n;
                    let le = match LATENCY_BUCKETS_US.get(i) {
                        Some(us) => format!("{}", *us as f64 / 1e6),
                        None => "+Inf".into(),
                    };
                    let _ = writeln!(o, "vfpoll_nvmf_io_latency_seconds_bucket{{{l},le=\"{le}\"}} {cum}");
                }
                let _ = writeln!(
                    o,
                    "vfpoll_nvmf_io_latency_seconds_sum{{{l}}} {}\nvfpoll_nvmf_io_latency_seconds_count{{{l}}} {cum}",
                    st.latency_sum_ns as f64 / 1e9
                );
            },
        );
        header(
            &mut o,
            "vfpoll_nvmf_connections gauge Queues (TCP connections) of a host connected to a subsystem now.",
        );
        for s in subs.values() {
            for (host, h) in &s.hosts {
                let _ = writeln!(
                    o,
                    "vfpoll_nvmf_connections{{subsystem=\"{}\",host=\"{}\"}} {}",
                    label(&s.nqn),
                    label(host),
                    h.connections
                );
            }
        }
        header(
            &mut o,
            "vfpoll_nvmf_connections_total counter Queues (TCP connections) a host connected to a subsystem since the start.",
        );
        for s in subs.values() {
            for (host, h) in &s.hosts {
                let _ = writeln!(
                    o,
                    "vfpoll_nvmf_connections_total{{subsystem=\"{}\",host=\"{}\"}} {}",
                    label(&s.nqn),
                    label(host),
                    h.connections_total
                );
            }
        }
        header(
            &mut o,
            "vfpoll_nvmf_connect_refusals_total counter Connect commands naming the subsystem that were refused (host not allowed, invalid fields).",
        );
        for s in subs.values() {
            let _ = writeln!(
                o,
                "vfpoll_nvmf_connect_refusals_total{{subsystem=\"{}\"}} {}",
                label(&s.nqn),
                s.connect_refusals
            );
        }
        header(
            &mut o,
            "vfpoll_nvmf_authentication_failures_total counter Failed in-band (DH-HMAC-CHAP) authentications.",
        );
        for s in subs.values() {
            let _ = writeln!(
                o,
                "vfpoll_nvmf_authentication_failures_total{{subsystem=\"{}\"}} {}",
                label(&s.nqn),
                s.authentication_failures
            );
        }
        header(
            &mut o,
            "vfpoll_nvmf_target_connections gauge TCP connections open now on the whole target, discovery ones included.",
        );
        let _ = writeln!(o, "vfpoll_nvmf_target_connections {}", self.connections);
        header(
            &mut o,
            "vfpoll_nvmf_protocol_errors_total counter Connections ended by an NVMe/TCP protocol error.",
        );
        let _ = writeln!(o, "vfpoll_nvmf_protocol_errors_total {}", self.protocol_errors);
        o
    }
}

/// HELP and TYPE lines from "name type help text".
fn header(o: &mut String, spec: &str) {
    let mut it = spec.splitn(3, ' ');
    let (name, ty, help) = (
        it.next().unwrap_or(""),
        it.next().unwrap_or(""),
        it.next().unwrap_or(""),
    );
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {ty}");
}

/// A family with one set of rows per (subsystem, namespace, host): `row` writes them with
/// the labels it is given.
fn io_family(
    o: &mut String,
    subs: &BTreeMap<String, SubsystemMetrics>,
    spec: &str,
    row: impl Fn(&mut String, &str, &IoStats),
) {
    header(o, spec);
    for s in subs.values() {
        for ((nsid, host), st) in &s.io {
            let l = format!(
                "subsystem=\"{}\",nsid=\"{nsid}\",host=\"{}\"",
                label(&s.nqn),
                label(host)
            );
            row(o, &l, st);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_sum_over_workers_into_prometheus_text() {
        let w = [
            Arc::new(WorkerMetrics::default()),
            Arc::new(WorkerMetrics::default()),
        ];
        let sub = SubsystemId(3);
        let a = w[0].io(sub, 1, "nqn.2014-08.org.nvmexpress:uuid:a\"b");
        let b = w[1].io(sub, 1, "nqn.2014-08.org.nvmexpress:uuid:a\"b");
        a.complete(IoKind::Read, 4096, false, Duration::from_micros(30));
        b.complete(IoKind::Read, 4096, false, Duration::from_micros(3000));
        b.complete(IoKind::Write, 512, true, Duration::from_secs(10));
        a.throttled();
        a.reservation_conflict();
        b.reservation_conflict();
        w[0].conns(sub, "h").opened();
        w[1].conns(sub, "h").opened();
        w[1].conns(sub, "h").closed();
        // Counters of a subsystem no longer named are dropped.
        w[0].io(SubsystemId(9), 1, "h")
            .complete(IoKind::Other, 0, false, Duration::ZERO);
        let names = BTreeMap::from([(sub, ("nqn.2024-01.io.vfpoll:m".to_owned(), 4))]);
        let m = collect(&w, &names, 5, 1);
        let s = &m.subsystems["nqn.2024-01.io.vfpoll:m"];
        assert_eq!(s.connect_refusals, 4);
        assert_eq!(
            s.hosts["h"],
            HostStats {
                connections: 1,
                connections_total: 2
            }
        );
        let st = &s.io[&(1, "nqn.2014-08.org.nvmexpress:uuid:a\"b".to_owned())];
        assert_eq!(
            (st.reads, st.writes, st.read_bytes, st.written_bytes, st.errors),
            (2, 1, 8192, 0, 1)
        );
        assert_eq!(st.latency[2], 1, "30 us: in the 50 us bucket");
        assert_eq!(st.latency[8], 1, "3 ms: in the 5 ms bucket");
        assert_eq!(st.latency[BUCKETS - 1], 1, "10 s: past the last bound");
        let text = m.to_prometheus();
        let l = r#"subsystem="nqn.2024-01.io.vfpoll:m",nsid="1",host="nqn.2014-08.org.nvmexpress:uuid:a\"b""#;
        for line in [
            format!("vfpoll_nvmf_io_commands_total{{{l},op=\"read\"}} 2"),
            format!("vfpoll_nvmf_io_bytes_total{{{l},direction=\"read\"}} 8192"),
            format!("vfpoll_nvmf_io_errors_total{{{l}}} 1"),
            format!("vfpoll_nvmf_io_throttled_total{{{l}}} 1"),
            format!("vfpoll_nvmf_reservation_conflicts_total{{{l}}} 2"),
            format!("vfpoll_nvmf_io_latency_seconds_bucket{{{l},le=\"0.00005\"}} 1"),
            format!("vfpoll_nvmf_io_latency_seconds_bucket{{{l},le=\"0.005\"}} 2"),
            format!("vfpoll_nvmf_io_latency_seconds_bucket{{{l},le=\"+Inf\"}} 3"),
            format!("vfpoll_nvmf_io_latency_seconds_count{{{l}}} 3"),
            "vfpoll_nvmf_connections{subsystem=\"nqn.2024-01.io.vfpoll:m\",host=\"h\"} 1".into(),
            "vfpoll_nvmf_connect_refusals_total{subsystem=\"nqn.2024-01.io.vfpoll:m\"} 4".into(),
            "vfpoll_nvmf_authentication_failures_total{subsystem=\"nqn.2024-01.io.vfpoll:m\"} 0".into(),
            "vfpoll_nvmf_target_connections 5".into(),
            "# TYPE vfpoll_nvmf_io_latency_seconds histogram".into(),
        ] {
            assert!(text.lines().any(|x| x == line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("uuid:9"));
        // Every sample line is a name, optional labels and a number.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let v = line.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "{line}");
        }
    }
}
