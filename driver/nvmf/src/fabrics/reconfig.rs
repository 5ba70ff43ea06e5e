//! Configuration changes while the target runs: subsystems, listeners, namespaces, allowed
//! hosts, limits, ANA states (NVMe Base 2.0 §8.1.3) and health. Each returns the completions
//! of the held Asynchronous Event Requests the change completes, for the runtime to send.

use std::collections::BTreeMap;
use std::sync::Arc;

use vfpoll_nvme_spec::status::Status;

use super::ana::{self, AnaState};
use super::config::{validate_nqn, ConfigError, Listener, NamespaceInfo, Subsystem};
use super::controller::Event;
use super::io::{Limiters, NsCell, NsTable};
use super::logpage::Health;
use super::qos::Limits;
use super::target::{SubsysState, Target};
use super::types::{AerCompletion, Cntlid, QueueRef, SubsystemId};
use super::wire::cqe;

impl Target {
    /// Adds a subsystem; discovery controllers hear of it (Discovery Log Page Change).
    pub fn add_subsystem(&mut self, s: Subsystem) -> Result<(SubsystemId, Vec<AerCompletion>), ConfigError> {
        s.validate()?;
        if self.subsystem_id(&s.nqn).is_some() {
            return Err(ConfigError::DuplicateSubsystem(s.nqn));
        }
        let mut nsids: Vec<u32> = s.namespaces.iter().map(|n| n.nsid).collect();
        nsids.sort_unstable();
        self.check_capacity(&s.nqn, s.max_nsid(), &nsids)?;
        let id = SubsystemId(self.next_subsystem);
        self.next_subsystem += 1;
        let mut state = SubsysState {
            max_nsid: s.max_nsid(),
            cell: Arc::new(NsCell::new(NsTable::default())),
            cfg: s,
            health: BTreeMap::new(),
            limiters: Limiters::default(),
        };
        state.publish();
        self.subsystems.insert(id, state);
        self.resv_attach(id);
        Ok((id, self.discovery_changed()))
    }

    /// Removes a subsystem: its controllers' queues, for the runtime to close, and the
    /// discovery controllers' events.
    pub fn remove_subsystem(
        &mut self,
        id: SubsystemId,
    ) -> Result<(Vec<QueueRef>, Vec<AerCompletion>), ConfigError> {
        let nsids: Vec<u32> = self
            .subsystems
            .get(&id)
            .map_or_else(Vec::new, |s| s.cfg.namespaces.iter().map(|n| n.nsid).collect());
        for nsid in nsids {
            self.resv_detach(id, nsid);
        }
        if self.subsystems.remove(&id).is_none() {
            return Err(ConfigError::NoSuchSubsystem(format!("with ID {}", id.0)));
        }
        let doomed: Vec<Cntlid> = self
            .controllers
            .values()
            .filter(|c| c.subsystem == Some(id))
            .map(|c| c.cntlid)
            .collect();
        let queues = doomed.into_iter().flat_map(|c| self.drop_controller(c)).collect();
        Ok((queues, self.discovery_changed()))
    }

    /// Refuses more namespaces than MNAN (`ana::mnan`): `nsids` are the namespace IDs the
    /// subsystem would hold, ascending.
    fn check_capacity(&self, nqn: &str, max_nsid: u32, nsids: &[u32]) -> Result<(), ConfigError> {
        let mnan = ana::mnan(self.opts.max_transfer, max_nsid);
        match nsids.get(mnan as usize) {
            None => Ok(()),
            Some(&nsid) => Err(ConfigError::BadNamespace {
                subsystem: nqn.to_owned(),
                nsid,
                why: format!(
                    "a subsystem holds at most {mnan} namespaces (MNAN: the ANA log page of that \
                     many must fit a transfer of max_transfer = {} bytes); raise max_transfer",
                    self.opts.max_transfer
                ),
            }),
        }
    }

    /// Adds a listener; its ANA states ([`Listener::ana`]) apply to the controllers that
    /// connect through it (and to those still connected through an earlier listener with its
    /// port ID, which hear of a change as [`Target::set_ana_state`] tells them).
    pub fn add_listener(&mut self, l: Listener) -> Result<Vec<AerCompletion>, ConfigError> {
        l.validate()?;
        if self.listeners.iter().any(|x| x.portid == l.portid) {
            return Err(ConfigError::BadListener {
                what: format!("port {}", l.portid),
                why: "the port ID is used by another listener",
            });
        }
        let mut events = Vec::new();
        let mut groups = self.ana.non_optimized(l.portid);
        groups.extend(l.ana.keys());
        for g in groups {
            let state = l.ana.get(&g).copied().unwrap_or_default();
            events.extend(self.apply_ana(l.portid, g, state));
        }
        self.listeners.push(l);
        events.extend(self.discovery_changed());
        Ok(events)
    }

    /// The ANA state of `group` as controllers connected through port `portid` see it.
    pub fn ana_state(&self, portid: u16, group: u32) -> AnaState {
        self.ana.state(portid, group)
    }

    /// Sets the ANA state of `group` on port `portid` (NVMe Base 2.0 §8.1.3): controllers
    /// whose admin queue connected through the port report it for the group's namespaces
    /// from now on, and I/O commands to those namespaces through them fail with the state's
    /// Path Related Status when it is Inaccessible, Persistent Loss or Change. Each such
    /// controller whose subsystem has a namespace in the group gets an Asymmetric Namespace
    /// Access Change notice (if it enabled them, AEC bit 11); the returned completions are
    /// those of held Asynchronous Event Requests. Setting the state a group already has
    /// changes nothing.
    ///
    /// `portid` names a listener (or one removed while its connections stay); `group` is 1
    /// to [`ANAGRPMAX`](super::ANAGRPMAX).
    pub fn set_ana_state(
        &mut self,
        portid: u16,
        group: u32,
        state: AnaState,
    ) -> Result<Vec<AerCompletion>, ConfigError> {
        let listener = self.listeners.iter_mut().find(|l| l.portid == portid);
        if listener.is_none() && !self.ana.has_port(portid) {
            return Err(ConfigError::BadListener {
                what: format!("port {portid}"),
                why: "no such listener",
            });
        }
        if !ana::valid_group(group) {
            return Err(ConfigError::BadOption {
                option: "ANA group",
                value: group.into(),
                why: "ANA group IDs run from 1 to 128 (ANAGRPMAX)",
            });
        }
        if let Some(l) = listener {
            l.ana.insert(group, state);
        }
        Ok(self.apply_ana(portid, group, state))
    }

    /// Sets a state and tells the controllers whose view changed.
    fn apply_ana(&mut self, portid: u16, group: u32, state: AnaState) -> Vec<AerCompletion> {
        if !self.ana.set(portid, group, state) {
            return Vec::new();
        }
        log::debug!("port {portid}: ANA group {group} is {state}");
        let Target {
            subsystems,
            controllers,
            ..
        } = self;
        controllers
            .values_mut()
            .filter(|c| {
                c.conn.portid == portid
                    && c.subsystem
                        .and_then(|id| subsystems.get(&id))
                        .is_some_and(|s| s.has_group(group))
            })
            .filter_map(|c| {
                c.raise(Event::AnaChange, 0).map(|(cid, dw0)| AerCompletion {
                    cntlid: c.cntlid,
                    cqe: cqe(cid, Status::SUCCESS, dw0),
                })
            })
            .collect()
    }

    /// Removes the listener with port ID `portid` (its connections stay; the runtime closes
    /// them if it wants).
    pub fn remove_listener(&mut self, portid: u16) -> Result<Vec<AerCompletion>, ConfigError> {
        let before = self.listeners.len();
        self.listeners.retain(|l| l.portid != portid);
        if self.listeners.len() == before {
            return Err(ConfigError::BadListener {
                what: format!("port {portid}"),
                why: "no such listener",
            });
        }
        Ok(self.discovery_changed())
    }

    fn discovery_changed(&mut self) -> Vec<AerCompletion> {
        self.genctr += 1;
        self.raise_all(None, Event::DiscoveryChanged, 0)
    }

    /// Raises `ev` on the controllers of `subsystem` (`None`: discovery controllers).
    fn raise_all(&mut self, subsystem: Option<SubsystemId>, ev: Event, warning: u8) -> Vec<AerCompletion> {
        self.controllers
            .values_mut()
            .filter(|c| c.subsystem == subsystem)
            .filter_map(|c| {
                c.raise(ev, warning).map(|(cid, dw0)| AerCompletion {
                    cntlid: c.cntlid,
                    cqe: cqe(cid, Status::SUCCESS, dw0),
                })
            })
            .collect()
    }

    fn subsys_mut(&mut self, id: SubsystemId) -> Result<&mut SubsysState, ConfigError> {
        self.subsystems
            .get_mut(&id)
            .ok_or_else(|| ConfigError::NoSuchSubsystem(format!("with ID {}", id.0)))
    }

    /// Subsystem `id`, once `ns` is a valid namespace of it (NSID within its NN, block size,
    /// size, ANA group, identifiers).
    fn subsys_for(&mut self, id: SubsystemId, ns: &NamespaceInfo) -> Result<&mut SubsysState, ConfigError> {
        let s = self.subsys_mut(id)?;
        ns.validate(&s.cfg.nqn, s.max_nsid)?;
        Ok(s)
    }

    /// Adds a namespace (NSID up to the subsystem's NN): the subsystem's controllers get a
    /// Namespace Attribute Changed notice.
    pub fn add_namespace(
        &mut self,
        id: SubsystemId,
        ns: NamespaceInfo,
    ) -> Result<Vec<AerCompletion>, ConfigError> {
        let s = self.subsys_for(id, &ns)?;
        if s.namespace(ns.nsid).is_some() {
            return Err(ConfigError::BadNamespace {
                subsystem: s.cfg.nqn.clone(),
                nsid: ns.nsid,
                why: "the namespace ID is in use".into(),
            });
        }
        let mut nsids: Vec<u32> = s.cfg.namespaces.iter().map(|n| n.nsid).chain([ns.nsid]).collect();
        nsids.sort_unstable();
        let (nqn, max_nsid) = (s.cfg.nqn.clone(), s.max_nsid);
        self.check_capacity(&nqn, max_nsid, &nsids)?;
        let s = self.subsys_mut(id)?;
        let (nsid, group) = (ns.nsid, ns.ana_group);
        s.cfg.namespaces.push(ns);
        s.publish();
        self.resv_attach(id);
        Ok(self.namespace_changed(id, nsid, &[group]))
    }

    /// Replaces a namespace's description (e.g. resized), with the notice.
    pub fn update_namespace(
        &mut self,
        id: SubsystemId,
        ns: NamespaceInfo,
    ) -> Result<Vec<AerCompletion>, ConfigError> {
        let s = self.subsys_for(id, &ns)?;
        let nsid = ns.nsid;
        let Some(slot) = s.cfg.namespaces.iter_mut().find(|n| n.nsid == nsid) else {
            return Err(ConfigError::NoSuchNamespace {
                subsystem: s.cfg.nqn.clone(),
                nsid,
            });
        };
        let groups: Vec<u32> = if slot.ana_group == ns.ana_group {
            Vec::new()
        } else {
            vec![slot.ana_group, ns.ana_group]
        };
        *slot = ns;
        s.publish();
        Ok(self.namespace_changed(id, nsid, &groups))
    }

    /// Removes a namespace, with the notice; its commands fail with Invalid Namespace or
    /// Format from then on.
    pub fn remove_namespace(
        &mut self,
        id: SubsystemId,
        nsid: u32,
    ) -> Result<Vec<AerCompletion>, ConfigError> {
        let s = self.subsys_mut(id)?;
        let Some(gone) = s.namespace(nsid).map(|n| n.ana_group) else {
            return Err(ConfigError::NoSuchNamespace {
                subsystem: s.cfg.nqn.clone(),
                nsid,
            });
        };
        self.resv_detach(id, nsid);
        let s = self.subsys_mut(id)?;
        s.cfg.namespaces.retain(|n| n.nsid != nsid);
        s.health.remove(&nsid);
        s.publish();
        Ok(self.namespace_changed(id, nsid, &[gone]))
    }

    /// Namespace `nsid` of subsystem `id` was added, changed or removed: a Namespace
    /// Attribute Changed notice, and an ANA Change notice when `groups` (the ANA groups it
    /// joined or left) is not empty, since the ANA log page lists the NSIDs of each group.
    fn namespace_changed(&mut self, id: SubsystemId, nsid: u32, groups: &[u32]) -> Vec<AerCompletion> {
        for c in self.controllers.values_mut().filter(|c| c.subsystem == Some(id)) {
            c.changed.add(nsid);
        }
        let mut events = self.raise_all(Some(id), Event::NamespaceChanged, 0);
        if !groups.is_empty() {
            self.ana.membership_changed(groups);
            events.extend(self.raise_all(Some(id), Event::AnaChange, 0));
        }
        events
    }

    /// Sets which hosts may connect to subsystem `id` (`None`: any host; NQNs checked).
    /// Controllers already connected stay; the discovery log a host reads may change, so
    /// discovery controllers get a Discovery Log Page Change event.
    pub fn set_allowed_hosts(
        &mut self,
        id: SubsystemId,
        hosts: Option<Vec<String>>,
    ) -> Result<Vec<AerCompletion>, ConfigError> {
        for h in hosts.iter().flatten() {
            validate_nqn(h)?;
        }
        self.subsys_mut(id)?.cfg.allowed_hosts = hosts;
        Ok(self.discovery_changed())
    }

    /// Sets subsystem `id`'s rate limits (per host and per namespace): queues apply them from
    /// their next command on; a limit that stays keeps its buckets' credit.
    pub fn set_limits(&mut self, id: SubsystemId, limits: Limits) -> Result<(), ConfigError> {
        let s = self.subsys_mut(id)?;
        s.cfg.limits = limits;
        s.publish();
        Ok(())
    }

    /// Updates a namespace's health for the SMART / Health log; a newly set critical warning
    /// raises a SMART / Health event on controllers that enabled it.
    pub fn set_health(
        &mut self,
        id: SubsystemId,
        nsid: u32,
        health: Health,
    ) -> Result<Vec<AerCompletion>, ConfigError> {
        let s = self.subsys_mut(id)?;
        if s.namespace(nsid).is_none() {
            return Err(ConfigError::NoSuchNamespace {
                subsystem: s.cfg.nqn.clone(),
                nsid,
            });
        }
        let old = s.health.insert(nsid, health).unwrap_or_default();
        let new = health.critical_warning & !old.critical_warning;
        if new == 0 {
            return Ok(Vec::new());
        }
        // Information: 02h spare below threshold, 01h temperature, 00h reliability.
        let info = if new & 1 != 0 {
            2
        } else if new & 2 != 0 {
            1
        } else {
            0
        };
        Ok(self.raise_all(Some(id), Event::Smart(info), new))
    }
}
