//! Reloading `--config` on SIGHUP: the new file is read and checked as a whole, then the
//! differences are applied to the running target one by one: listeners added or removed,
//! subsystems added or removed, allowed hosts and rate limits changed, namespaces added or
//! removed. Hosts get
//! the asynchronous events the changes raise. Target-wide settings (cores, page size, IOMMU
//! mode, spin, completion mode, metrics address) and a subsystem's serial or model need a restart: a reload says so and keeps
//! the running ones.

use std::collections::HashMap;

use vfpoll_nvmf::fabrics::{AnaState, Listener, Subsystem};
use vfpoll_nvmf::server::Server;

use super::devices::Devices;
use super::plan::{Plan, SubsystemPlan};

/// One backend per worker, by NSID.
pub type Backends = HashMap<u32, Vec<Box<dyn vfpoll_nvmf::backend::Backend>>>;

/// What a reload did, line by line, and what it could not do.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Changes applied.
    pub applied: Vec<String>,
    /// Changes refused or failed, with the reason.
    pub failed: Vec<String>,
}

/// Applies `new` to the running target, whose plan is `current`; `current` becomes what now
/// runs (the new plan where every change applied).
pub fn apply(server: &Server, devices: &mut Devices, current: &mut Plan, new: &Plan) -> Outcome {
    let mut out = Outcome::default();
    if new.cores != current.cores
        || new.page_size != current.page_size
        || new.noiommu != current.noiommu
        || new.spin != current.spin
        || new.nvme_irq != current.nvme_irq
        || new.metrics != current.metrics
        || new.state_dir != current.state_dir
    {
        out.failed.push(
            "cores, page_size, noiommu, spin_us, nvme_completion, metrics and state_dir change only with a restart; the running ones stay".into(),
        );
    }
    // Listeners, by port ID: gone or moved ones first (a moved one is removed and re-added).
    let same = |a: &Listener, b: &Listener| a.traddr == b.traddr && a.trsvcid == b.trsvcid;
    for l in current.listeners.clone() {
        if let Some(n) = new.listeners.iter().find(|n| n.portid == l.portid && same(n, &l)) {
            ana_changes(server, current, &l, n, &mut out);
            continue;
        }
        match server.remove_listener(l.portid) {
            Ok(()) => {
                out.applied.push(format!(
                    "listener {} ({}:{}) removed",
                    l.portid, l.traddr, l.trsvcid
                ));
                current.listeners.retain(|x| x.portid != l.portid);
            }
            Err(e) => out.failed.push(format!("removing listener {}: {e}", l.portid)),
        }
    }
    for l in &new.listeners {
        if current.listeners.iter().any(|c| c.portid == l.portid) {
            continue;
        }
        match server.add_listener(l.clone()) {
            Ok(addr) => {
                out.applied.push(format!("listener {} on {addr} added", l.portid));
                current.listeners.push(l.clone());
            }
            Err(e) => out.failed.push(format!("adding listener {}: {e}", l.portid)),
        }
    }
    // Subsystems.
    for s in current.subsystems.clone() {
        if new.subsystems.iter().any(|n| n.nqn == s.nqn) {
            continue;
        }
        match server.remove_subsystem(&s.nqn) {
            Ok(()) => {
                out.applied.push(format!("subsystem {} removed", s.nqn));
                current.subsystems.retain(|x| x.nqn != s.nqn);
            }
            Err(e) => out.failed.push(format!("removing subsystem {}: {e}", s.nqn)),
        }
    }
    let workers = current.cores.len();
    for s in &new.subsystems {
        let Some(i) = current.subsystems.iter().position(|c| c.nqn == s.nqn) else {
            match add_subsystem(server, devices, s, workers) {
                Ok(()) => {
                    out.applied.push(format!(
                        "subsystem {} added with {} namespace(s)",
                        s.nqn,
                        s.namespaces.len()
                    ));
                    current.subsystems.push(s.clone());
                }
                Err(e) => out.failed.push(format!("adding subsystem {}: {e:#}", s.nqn)),
            }
            continue;
        };
        update_subsystem(server, devices, &mut current.subsystems[i], s, workers, &mut out);
    }
    out
}

/// Applies the ANA state changes of a listener that stays.
fn ana_changes(server: &Server, current: &mut Plan, old: &Listener, new: &Listener, out: &mut Outcome) {
    let groups: std::collections::BTreeSet<u32> = old.ana.keys().chain(new.ana.keys()).copied().collect();
    for g in groups {
        let state = |l: &Listener| l.ana.get(&g).copied().unwrap_or(AnaState::Optimized);
        let (was, now) = (state(old), state(new));
        if was == now {
            continue;
        }
        match server.set_ana_state(new.portid, g, now) {
            Ok(()) => {
                out.applied
                    .push(format!("listener {}: ANA group {g} {was} -> {now}", new.portid));
                if let Some(c) = current.listeners.iter_mut().find(|c| c.portid == new.portid) {
                    c.ana.insert(g, now);
                }
            }
            Err(e) => out
                .failed
                .push(format!("listener {}: ANA group {g}: {e}", new.portid)),
        }
    }
}

fn add_subsystem(
    server: &Server,
    devices: &mut Devices,
    s: &SubsystemPlan,
    workers: usize,
) -> anyhow::Result<()> {
    let (sub, backends) = build_subsystem(devices, s, workers)?;
    server.add_subsystem(sub, backends)?;
    Ok(())
}

/// The fabrics subsystem of plan `s` and its namespaces' backends (one per worker).
pub fn build_subsystem(
    devices: &mut Devices,
    s: &SubsystemPlan,
    workers: usize,
) -> anyhow::Result<(Subsystem, Backends)> {
    let mut sub = Subsystem::new(&s.nqn);
    if let Some(serial) = &s.serial {
        sub.serial = serial.clone();
    }
    if let Some(model) = &s.model {
        sub.model = model.clone();
    }
    sub.allowed_hosts = s.allowed_hosts.clone();
    sub.limits = s.limits.clone();
    sub.host_auth = s.host_auth.clone();
    let mut backends = HashMap::new();
    for ns in &s.namespaces {
        let (info, b) = devices.namespace(&s.nqn, ns, workers)?;
        sub.namespaces.push(info);
        backends.insert(ns.nsid, b);
    }
    Ok((sub, backends))
}

fn update_subsystem(
    server: &Server,
    devices: &mut Devices,
    cur: &mut SubsystemPlan,
    new: &SubsystemPlan,
    workers: usize,
    out: &mut Outcome,
) {
    let nqn = &new.nqn;
    if cur.serial != new.serial || cur.model != new.model {
        out.failed.push(format!("subsystem {nqn}: serial and model change only with a restart (hosts keep the identity they read)"));
    }
    if cur.allowed_hosts != new.allowed_hosts {
        match server.set_allowed_hosts(nqn, new.allowed_hosts.clone()) {
            Ok(()) => {
                out.applied.push(match &new.allowed_hosts {
                    Some(h) => format!("subsystem {nqn}: {} allowed host(s)", h.len()),
                    None => format!("subsystem {nqn}: any host allowed"),
                });
                cur.allowed_hosts = new.allowed_hosts.clone();
            }
            Err(e) => out.failed.push(format!("subsystem {nqn}: allowed hosts: {e}")),
        }
    }
    if cur.host_auth != new.host_auth {
        match server.set_host_auth(nqn, new.host_auth.clone()) {
            Ok(()) => {
                out.applied.push(format!(
                    "subsystem {nqn}: {} host(s) must authenticate (new Connects)",
                    new.host_auth.len()
                ));
                cur.host_auth = new.host_auth.clone();
            }
            Err(e) => out.failed.push(format!("subsystem {nqn}: authentication: {e}")),
        }
    }
    if cur.limits != new.limits {
        match server.set_limits(nqn, new.limits.clone()) {
            Ok(()) => {
                out.applied.push(format!(
                    "subsystem {nqn}: rate limits for {} host(s) and {} namespace(s)",
                    new.limits.hosts.values().filter(|l| l.is_limited()).count(),
                    new.limits.namespaces.len()
                ));
                cur.limits = new.limits.clone();
            }
            Err(e) => out.failed.push(format!("subsystem {nqn}: rate limits: {e}")),
        }
    }
    for n in cur.namespaces.clone() {
        if new.namespaces.contains(&n) {
            continue;
        }
        match server.remove_namespace(nqn, n.nsid) {
            Ok(()) => {
                out.applied.push(format!(
                    "subsystem {nqn}: namespace {} ({}) removed",
                    n.nsid, n.source
                ));
                cur.namespaces.retain(|x| x.nsid != n.nsid);
            }
            Err(e) => out
                .failed
                .push(format!("subsystem {nqn}: removing namespace {}: {e}", n.nsid)),
        }
    }
    for n in &new.namespaces {
        if cur.namespaces.iter().any(|c| c.nsid == n.nsid) {
            continue;
        }
        let added = devices
            .namespace(nqn, n, workers)
            .and_then(|(info, b)| server.add_namespace(nqn, info, b).map_err(Into::into));
        match added {
            Ok(()) => {
                out.applied.push(format!(
                    "subsystem {nqn}: namespace {} ({}) added",
                    n.nsid, n.source
                ));
                cur.namespaces.push(n.clone());
            }
            Err(e) => out
                .failed
                .push(format!("subsystem {nqn}: adding namespace {}: {e:#}", n.nsid)),
        }
    }
}
