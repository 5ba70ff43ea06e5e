//! Authentication on the [`Target`]: AUTHREQ in Connect responses, the gate before a queue's
//! commands, and each queue's DH-HMAC-CHAP transaction (the rules: `fabrics::auth`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use vfpoll_nvme_spec::status::Status;

use super::{is_auth_command, CtrlAuth, QueueAuth, AUTHENTICATION_REQUIRED, AUTHREQ_ATR};
use crate::auth::{self, msg, Event, Exchange, HostAuth};
use crate::fabrics::admin::AdminOutcome;
use crate::fabrics::config::{validate_nqn, ConfigError};
use crate::fabrics::connect::ConnectOutcome;
use crate::fabrics::target::Target;
use crate::fabrics::types::{QueueRef, SubsystemId};
use crate::fabrics::wire::{cqe, fctype, fctype_of, status, Sqe};

impl Target {
    /// After a Connect was accepted: when the host must authenticate, sets AUTHREQ and keeps
    /// the I/O queue's decoder until it has.
    pub(crate) fn auth_connected(&mut self, out: &mut ConnectOutcome) {
        let QueueRef { cntlid, qid } = out.queue;
        if qid == 0 {
            let Some(c) = self.controllers.get(&cntlid) else {
                return;
            };
            let Some(sid) = c.subsystem else {
                return;
            };
            let s = &self.subsystems[&sid].cfg;
            let Some(a) = s.host_auth.get(&c.hostnqn) else {
                return;
            };
            let ca = CtrlAuth {
                subsystem: sid,
                auth: a.clone(),
                hostnqn: c.hostnqn.clone(),
                subnqn: s.nqn.clone(),
                peer: c.conn.peer.clone(),
                queues: BTreeMap::new(),
            };
            self.auth.controllers.insert(cntlid, ca);
        }
        let Some(ca) = self.auth.controllers.get_mut(&cntlid) else {
            return;
        };
        let exchange = Exchange::new(ca.auth.clone(), &ca.hostnqn, &ca.subnqn);
        ca.queues.insert(
            qid,
            QueueAuth {
                exchange,
                authenticated: false,
            },
        );
        out.cqe.dw0 |= AUTHREQ_ATR;
        out.io = None;
    }

    /// Whether `queue` may carry commands other than authentication: it authenticated, or
    /// its host needs not.
    pub fn queue_authenticated(&self, queue: QueueRef) -> bool {
        self.auth
            .controllers
            .get(&queue.cntlid)
            .and_then(|c| c.queues.get(&queue.qid))
            .is_none_or(|q| q.authenticated)
    }

    /// Failed authentications of subsystem `id` since the start.
    pub fn auth_failures(&self, id: SubsystemId) -> u64 {
        self.auth.failures.get(&id).copied().unwrap_or(0)
    }

    /// Forgets a queue's authentication (it disconnected); QID 0 forgets the controller's.
    pub(crate) fn auth_forget(&mut self, queue: QueueRef) {
        if queue.qid == 0 {
            self.auth.controllers.remove(&queue.cntlid);
        } else if let Some(c) = self.auth.controllers.get_mut(&queue.cntlid) {
            c.queues.remove(&queue.qid);
        }
    }

    /// For [`Target::admin`]: Authentication Send and Receive on an admin queue that must
    /// authenticate, and the refusal of anything else before it has. `None`: the command
    /// goes on as usual.
    pub(crate) fn auth_gate(&mut self, queue: QueueRef, sqe: &Sqe, in_data: &[u8]) -> Option<AdminOutcome> {
        if !self.auth.controllers.contains_key(&queue.cntlid) {
            return None;
        }
        if is_auth_command(sqe) || !self.queue_authenticated(queue) {
            return Some(self.authenticate(queue, sqe, in_data));
        }
        None
    }

    /// A command on `queue` that must authenticate or has not yet: Authentication Send
    /// (`in_data`: its TL bytes) or Receive run the queue's DH-HMAC-CHAP transaction; any
    /// other command before the queue authenticated is refused with Authentication Required.
    /// Authentication commands of a host that needs none are Invalid Opcode.
    pub fn authenticate(&mut self, queue: QueueRef, sqe: &Sqe, in_data: &[u8]) -> AdminOutcome {
        let cid = sqe.cid();
        let done = |st: Status, dw0: u32, data: Vec<u8>| AdminOutcome::Complete {
            cqe: cqe(cid, st, dw0),
            data,
            effect: None,
        };
        let Some(ca) = self.auth.controllers.get_mut(&queue.cntlid) else {
            return done(Status::INVALID_OPCODE, 0, Vec::new());
        };
        let Some(q) = ca.queues.get_mut(&queue.qid) else {
            return done(status::COMMAND_SEQUENCE_ERROR, 0, Vec::new());
        };
        if !is_auth_command(sqe) {
            return done(AUTHENTICATION_REQUIRED, 0, Vec::new());
        }
        if let Some(c) = self.controllers.get(&queue.cntlid) {
            c.shared.touch();
        }
        let len = match auth::command_len(sqe) {
            Ok(l) => l as usize,
            Err(st) => return done(st, 0, Vec::new()),
        };
        let now = Instant::now();
        let (data, event) = if fctype_of(sqe) == fctype::AUTHENTICATION_SEND {
            if in_data.len() != len {
                return done(status::DATA_SGL_LENGTH_INVALID, 0, Vec::new());
            }
            let throttle = self
                .auth
                .throttles
                .entry((ca.subsystem, ca.hostnqn.clone()))
                .or_default();
            let event = match (msg::parse(in_data), throttle.check(now)) {
                (Ok(msg::HostMessage::Negotiate(n)), Err(wait)) => Some(q.exchange.refuse(
                    n.t_id,
                    format!(
                        "it failed {} times in a row and must wait {:.1} s more before it tries again",
                        throttle.failures_in_a_row(),
                        wait.as_secs_f64()
                    ),
                )),
                _ => q.exchange.send(in_data),
            };
            (Vec::new(), event)
        } else {
            match q.exchange.receive(&mut auth::os_random) {
                Ok((mut m, event)) => {
                    if m.len() > len {
                        return done(Status::INVALID_FIELD, 0, Vec::new());
                    }
                    // The host reads AL bytes (Linux's target zero-fills them too).
                    m.resize(len, 0);
                    (m, event)
                }
                Err(auth::OutOfSequence) => return done(status::COMMAND_SEQUENCE_ERROR, 0, Vec::new()),
            }
        };
        let throttle = self
            .auth
            .throttles
            .entry((ca.subsystem, ca.hostnqn.clone()))
            .or_default();
        match event {
            None => {}
            Some(Event::Authenticated {
                hash,
                group,
                bidirectional,
            }) => {
                q.authenticated = true;
                throttle.succeeded();
                let what = format!(
                    "{}: {} authenticated to {} on queue {} of controller {} ({}, {}{})",
                    ca.peer,
                    ca.hostnqn,
                    ca.subnqn,
                    queue.qid,
                    queue.cntlid.0,
                    hash.name(),
                    group.name(),
                    if bidirectional {
                        ", controller authenticated too"
                    } else {
                        ""
                    }
                );
                if queue.qid == 0 {
                    log::info!("{what}");
                } else {
                    log::debug!("{what}");
                }
            }
            Some(Event::Failed(why)) => {
                q.authenticated = false;
                *self.auth.failures.entry(ca.subsystem).or_insert(0) += 1;
                let what = format!(
                    "{}: authentication of {} to {} on queue {} of controller {} failed: {why}",
                    ca.peer, ca.hostnqn, ca.subnqn, queue.qid, queue.cntlid.0
                );
                match throttle.failed(now) {
                    Some(0) => log::warn!("{what}"),
                    Some(n) => log::warn!("{what} ({n} more failures of this host were not logged)"),
                    None => log::debug!("{what}"),
                }
            }
        }
        done(Status::SUCCESS, 0, data)
    }
}

impl Target {
    /// Sets which hosts of subsystem `id` must authenticate, with their secrets. Controllers
    /// connected already keep the secrets they were connected with; Connects from now on use
    /// these.
    pub fn set_host_auth(
        &mut self,
        id: SubsystemId,
        hosts: BTreeMap<String, Arc<HostAuth>>,
    ) -> Result<(), ConfigError> {
        for h in hosts.keys() {
            validate_nqn(h)?;
        }
        self.subsystems
            .get_mut(&id)
            .ok_or_else(|| ConfigError::NoSuchSubsystem(format!("with ID {}", id.0)))?
            .cfg
            .host_auth = hosts;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{augmented, DhGroup, HashId, KeyPair, Secret, Transcript};
    use crate::fabrics::tests::*;
    use crate::fabrics::{prop, Cntlid, Subsystem, TargetOptions, SGL_IN_CAPSULE};

    const KEY: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    const CTRL: &str = "DHHC-1:00:QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl9YjiZe:";

    fn secret(s: &str) -> Secret {
        Secret::parse(s).unwrap()
    }

    /// `SUB` with `HOST` holding KEY (and CTRL as the controller's secret); `HOST2` needs none.
    fn target(ctrl: bool) -> Target {
        let mut s: Subsystem = subsystem(SUB);
        s.host_auth.insert(
            HOST.to_owned(),
            Arc::new(HostAuth::new(secret(KEY), ctrl.then(|| secret(CTRL)))),
        );
        Target::new(TargetOptions::default(), listeners(), vec![s]).unwrap()
    }

    fn run(t: &mut Target, q: QueueRef, sqe: &Sqe, data: &[u8]) -> (Status, Vec<u8>) {
        let (cqe, data) = complete(if q.qid == 0 {
            t.admin(q.cntlid, sqe, data)
        } else {
            t.authenticate(q, sqe, data)
        });
        (cqe.status(), data)
    }

    /// An Authentication Send of `len` in-capsule bytes with CDW10 `dw10` (SECP, SPSP) and
    /// transfer length `tl`.
    fn send_sqe(len: usize, dw10: u32, tl: u32) -> Sqe {
        let mut s = sgl(
            fabrics_sqe(fctype::AUTHENTICATION_SEND),
            SGL_IN_CAPSULE,
            len as u32,
        );
        s.dw[10] = dw10;
        s.dw[11] = tl;
        s
    }

    fn send(t: &mut Target, q: QueueRef, m: &[u8]) -> Status {
        run(t, q, &send_sqe(m.len(), 0xe901_0100, m.len() as u32), m).0
    }

    fn receive(t: &mut Target, q: QueueRef) -> Vec<u8> {
        let mut s = fabrics_sqe(fctype::AUTHENTICATION_RECEIVE);
        s.dw[8] = 4096;
        s.dw[10] = 0xe901_0100;
        s.dw[11] = 4096;
        let (st, d) = run(t, q, &s, &[]);
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(d.len(), 4096, "AL bytes");
        d
    }

    /// Linux's host side of a transaction with `key` (and `ctrl` for bidirectional): Ok, or
    /// the AUTH_Failure1 explanation, or `0xff` when the controller's response was wrong.
    fn host(t: &mut Target, q: QueueRef, key: &str, ctrl: Option<&str>) -> Result<(), u8> {
        assert_eq!(
            send(t, q, &msg::negotiate(3, &[1, 2, 3], &[0, 1, 2, 3, 4, 5])),
            Status::SUCCESS
        );
        let c = receive(t, q);
        if c[1] == msg::id::FAILURE1 {
            return Err(c[7]);
        }
        let hash = HashId::from_id(c[8]).unwrap();
        let group = DhGroup::from_id(c[9]).unwrap();
        let hl = c[6] as usize;
        let dhvlen = u16::from_le_bytes([c[10], c[11]]) as usize;
        let s1 = u32::from_le_bytes([c[12], c[13], c[14], c[15]]);
        let (c1, x) = (&c[16..16 + hl], &c[16 + hl..16 + hl + dhvlen]);
        let mut n = 0x40u8;
        let kp = KeyPair::generate(group, &mut |b: &mut [u8]| {
            n += 1;
            b.fill(n)
        });
        let session = kp.as_ref().map(|k| k.shared(x).unwrap());
        fn tr(hash: HashId, challenge: &[u8], seqnum: u32) -> Transcript<'_> {
            Transcript {
                hash,
                challenge,
                seqnum,
                t_id: 3,
                hostnqn: HOST,
                subnqn: SUB,
            }
        }
        let c1a = augmented(hash, session.as_deref(), c1);
        let r1 = tr(hash, &c1a, s1).host_response(&secret(key).transformed(HOST));
        let r = msg::Reply {
            t_id: 3,
            response: r1,
            challenge: ctrl.map(|_| vec![0x5a; hl]),
            seqnum: ctrl.map_or(0, |_| 77),
            dh_value: kp.as_ref().map_or(Vec::new(), |k| k.public().to_vec()),
        };
        assert_eq!(send(t, q, &msg::reply(&r)), Status::SUCCESS);
        let s = receive(t, q);
        if s[1] == msg::id::FAILURE1 {
            return Err(s[7]);
        }
        assert_eq!(s[1], msg::id::SUCCESS1);
        if let Some(ck) = ctrl {
            let c2a = augmented(hash, session.as_deref(), &[0x5a; 64][..hl]);
            let r2 = tr(hash, &c2a, 77).controller_response(&secret(ck).transformed(SUB));
            if s[8] != 1 || s[16..16 + hl] != r2[..] {
                assert_eq!(send(t, q, &msg::failure2(3, 1)), Status::SUCCESS);
                return Err(0xff);
            }
            assert_eq!(send(t, q, &msg::success2(3)), Status::SUCCESS);
        }
        Ok(())
    }

    fn admin_q(c: Cntlid) -> QueueRef {
        QueueRef { cntlid: c, qid: 0 }
    }

    fn connect(t: &mut Target, hostnqn: &str) -> (Cntlid, u32) {
        let o = t
            .connect(
                &connect_sqe(0, 31, 15_000),
                &connect_data(SUB, hostnqn, 0xffff, HOSTID),
                conn(1),
            )
            .unwrap();
        (Cntlid(o.cqe.dw0 as u16), o.cqe.dw0 & AUTHREQ_ATR)
    }

    #[test]
    fn a_host_with_a_secret_authenticates_each_queue_before_anything_else() {
        let mut t = target(false);
        let (c, atr) = connect(&mut t, HOST);
        assert_eq!(atr, AUTHREQ_ATR, "AUTHREQ.ATR");
        assert_eq!(prop_get(&mut t, c, prop::CAP, true), Err(AUTHENTICATION_REQUIRED));
        host(&mut t, admin_q(c), KEY, None).unwrap();
        assert!(prop_get(&mut t, c, prop::CAP, true).is_ok());
        enable(&mut t, c);
        // The I/O queue: AUTHREQ again, no decoder until it authenticates.
        let o = t
            .connect(
                &connect_sqe(1, 127, 0),
                &connect_data(SUB, HOST, c.0, HOSTID),
                conn(1),
            )
            .unwrap();
        assert_eq!(o.cqe.dw0 & AUTHREQ_ATR, AUTHREQ_ATR);
        assert!(o.io.is_none());
        let q1 = QueueRef { cntlid: c, qid: 1 };
        assert!(t.io_queue(q1).is_none());
        let (st, _) = run(&mut t, q1, &sqe(0x02, 1), &[]);
        assert_eq!(st, AUTHENTICATION_REQUIRED);
        host(&mut t, q1, KEY, None).unwrap();
        assert!(t.io_queue(q1).is_some());
        assert_eq!(t.auth_failures(SubsystemId(0)), 0);
    }

    #[test]
    fn bidirectional_authentication_proves_the_controller() {
        let mut t = target(true);
        let (c, _) = connect(&mut t, HOST);
        host(&mut t, admin_q(c), KEY, Some(CTRL)).unwrap();
        assert!(prop_get(&mut t, c, prop::CAP, true).is_ok());
        // The host holding another controller secret refuses the controller.
        let mut t = target(true);
        let (c, _) = connect(&mut t, HOST);
        assert_eq!(host(&mut t, admin_q(c), KEY, Some(KEY)), Err(0xff));
        assert_eq!(prop_get(&mut t, c, prop::CAP, true), Err(AUTHENTICATION_REQUIRED));
        assert_eq!(t.auth_failures(SubsystemId(0)), 1);
        // A controller without a controller secret cannot be authenticated.
        let mut t = target(false);
        let (c, _) = connect(&mut t, HOST);
        assert_eq!(
            host(&mut t, admin_q(c), KEY, Some(CTRL)),
            Err(msg::explanation::FAILED)
        );
    }

    #[test]
    fn a_wrong_secret_fails_is_counted_and_the_host_must_wait() {
        let mut t = target(false);
        let (c, _) = connect(&mut t, HOST);
        assert_eq!(
            host(&mut t, admin_q(c), CTRL, None),
            Err(msg::explanation::FAILED)
        );
        assert_eq!(t.auth_failures(SubsystemId(0)), 1);
        assert_eq!(prop_get(&mut t, c, prop::CAP, true), Err(AUTHENTICATION_REQUIRED));
        // At once again, even with the right secret: refused until the back-off passes.
        let (c2, _) = connect(&mut t, HOST);
        assert_eq!(
            host(&mut t, admin_q(c2), KEY, None),
            Err(msg::explanation::FAILED)
        );
        assert_eq!(t.auth_failures(SubsystemId(0)), 2);
        assert!(t.io_command(c2, &sqe(0x02, 1)).is_err());
    }

    #[test]
    fn hosts_without_a_secret_and_malformed_commands() {
        let mut t = target(false);
        let (c, atr) = connect(&mut t, HOST2);
        assert_eq!(atr, 0, "no AUTHREQ for a host without a secret");
        assert!(prop_get(&mut t, c, prop::CAP, true).is_ok());
        assert_eq!(
            send(&mut t, admin_q(c), &msg::negotiate(1, &[1], &[0])),
            Status::INVALID_OPCODE
        );
        // SECP other than E9h, and TL not matching the data.
        let (c, _) = connect(&mut t, HOST);
        let m = msg::negotiate(1, &[1], &[0]);
        let wrong_secp = send_sqe(m.len(), 0xea01_0100, m.len() as u32);
        assert_eq!(run(&mut t, admin_q(c), &wrong_secp, &m).0, Status::INVALID_FIELD);
        let wrong_tl = send_sqe(m.len(), 0xe901_0100, 8);
        assert_eq!(
            run(&mut t, admin_q(c), &wrong_tl, &m).0,
            status::DATA_SGL_LENGTH_INVALID
        );
        // Receive before anything was sent.
        let mut r = fabrics_sqe(fctype::AUTHENTICATION_RECEIVE);
        r.dw[10] = 0xe901_0100;
        r.dw[11] = 64;
        assert_eq!(run(&mut t, admin_q(c), &r, &[]).0, status::COMMAND_SEQUENCE_ERROR);
        // The controller's going forgets its authentication.
        t.disconnect(admin_q(c));
        assert!(t.auth.controllers.is_empty());
    }
}
