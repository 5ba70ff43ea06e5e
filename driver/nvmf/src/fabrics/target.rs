//! The target's state: its subsystems, listeners and controllers ([`Target`]), and what it
//! answers about them. The work is done above this file, each part in its own `impl Target`:
//! Connect, I/O queues, keep-alive and teardown in `connect`, configuration changes (which
//! raise asynchronous events, ANA states among them, NVMe Base 2.0 §8.1.3) in `reconfig`,
//! admin commands in `admin`, authentication in `auth::target`, reservations in
//! `resv::target`; I/O decoding is in `io`.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::ana::AnaPorts;
use super::auth::AuthState;
use super::config::{ConfigError, Listener, NamespaceInfo, Subsystem, TargetOptions};
use super::controller::Controller;
use super::io::{Limiters, NsCell, NsTable};
use super::logpage::Health;
use super::resv::TargetResv;
use super::types::{Cntlid, ControllerInfo, SubsystemId};

#[derive(Debug)]
pub(super) struct SubsysState {
    pub cfg: Subsystem,
    pub max_nsid: u32,
    pub cell: Arc<NsCell>,
    pub health: BTreeMap<u32, Health>,
    /// The limiters of `cfg.limits`, kept across changes so that a reload keeps their credit.
    pub limiters: Limiters,
}

impl SubsysState {
    pub fn namespace(&self, nsid: u32) -> Option<&NamespaceInfo> {
        self.cfg.namespaces.iter().find(|n| n.nsid == nsid)
    }

    pub(super) fn has_group(&self, group: u32) -> bool {
        self.cfg.namespaces.iter().any(|n| n.ana_group == group)
    }

    pub(super) fn publish(&mut self) {
        self.cfg.namespaces.sort_by_key(|n| n.nsid);
        self.limiters.update(&self.cfg.limits);
        self.cell
            .replace(NsTable::new(&self.cfg.namespaces).with_limits(&self.limiters));
    }
}

/// An NVMe over Fabrics target: its subsystems and listeners, the discovery subsystem, and
/// the controllers hosts have connected. Pure logic: the runtime feeds it the commands it
/// receives and sends what it answers.
///
/// Per connection, the runtime calls [`Target::connect`] with the first capsule, then
/// [`Target::admin`] for each admin command (or [`IoQueue::decode`](super::IoQueue::decode) for each I/O command),
/// [`Target::disconnect`] when the connection ends, and [`Target::tick`] every few hundred
/// milliseconds, dropping what it reports with [`Target::drop_controller`].
#[derive(Debug)]
pub struct Target {
    pub(super) opts: TargetOptions,
    pub(super) listeners: Vec<Listener>,
    pub(super) subsystems: BTreeMap<SubsystemId, SubsysState>,
    pub(super) next_subsystem: u32,
    pub(super) controllers: BTreeMap<Cntlid, Controller>,
    pub(super) next_cntlid: u16,
    pub(super) genctr: u64,
    pub(super) ana: AnaPorts,
    /// Connects refused per subsystem.
    pub(super) refused_connects: BTreeMap<SubsystemId, u64>,
    /// Reservations' state file and pending events (`resv`).
    pub(super) resv: TargetResv,
    /// In-band authentication (`auth`).
    pub(super) auth: AuthState,
}

impl Target {
    /// A target serving `subsystems` on `listeners`.
    pub fn new(
        opts: TargetOptions,
        listeners: Vec<Listener>,
        subsystems: Vec<Subsystem>,
    ) -> Result<Self, ConfigError> {
        opts.validate()?;
        let mut t = Target {
            opts,
            listeners: Vec::new(),
            subsystems: BTreeMap::new(),
            next_subsystem: 0,
            controllers: BTreeMap::new(),
            next_cntlid: 1,
            genctr: 0,
            ana: AnaPorts::default(),
            refused_connects: BTreeMap::new(),
            resv: Default::default(),
            auth: Default::default(),
        };
        for l in listeners {
            t.add_listener(l)?;
        }
        for s in subsystems {
            t.add_subsystem(s)?;
        }
        t.genctr = 0;
        Ok(t)
    }

    /// The limits controllers report.
    pub fn options(&self) -> &TargetOptions {
        &self.opts
    }

    /// The listeners.
    pub fn listeners(&self) -> &[Listener] {
        &self.listeners
    }

    /// The subsystem named `nqn`.
    pub fn subsystem_id(&self, nqn: &str) -> Option<SubsystemId> {
        self.subsystems
            .iter()
            .find(|(_, s)| s.cfg.nqn == nqn)
            .map(|(&id, _)| id)
    }

    /// A subsystem's configuration.
    pub fn subsystem(&self, id: SubsystemId) -> Option<&Subsystem> {
        self.subsystems.get(&id).map(|s| &s.cfg)
    }

    /// The subsystems, by ID.
    pub fn subsystems(&self) -> impl Iterator<Item = (SubsystemId, &Subsystem)> {
        self.subsystems.iter().map(|(&id, s)| (id, &s.cfg))
    }

    /// The discovery log's generation counter.
    pub fn discovery_generation(&self) -> u64 {
        self.genctr
    }

    /// The controllers.
    pub fn controllers(&self) -> Vec<ControllerInfo> {
        self.controllers
            .values()
            .map(|c| ControllerInfo {
                cntlid: c.cntlid,
                subsystem: c.subsystem,
                hostnqn: c.hostnqn.clone(),
                hostid: c.hostid,
                kato_ms: c.kato_ms,
                io_queues: c.io_queues.iter().copied().collect(),
                ready: c.enabled(),
            })
            .collect()
    }

    /// The subsystem of controller `cntlid` (`None`: a discovery controller, or none such).
    pub fn controller_subsystem(&self, cntlid: Cntlid) -> Option<SubsystemId> {
        self.controllers.get(&cntlid).and_then(|c| c.subsystem)
    }
}
