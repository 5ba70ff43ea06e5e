//! One queue's DH-HMAC-CHAP transaction on the controller's side (NVMe Base 2.0 §8.13.4.1,
//! Figure 447 "DH-HMAC-CHAP protocol operations"), as a state machine fed with what
//! Authentication Send carries and asked for what Authentication Receive returns:
//!
//! ```text
//! host                                controller
//! Send    AUTH_Negotiate          →   picks a hash and a DH group it allows
//! Receive DH-HMAC-CHAP_Challenge  ←   C1, S1, its DH value g^x
//! Send    DH-HMAC-CHAP_Reply      →   checks R1 (and takes C2, S2 for bidirectional)
//! Receive DH-HMAC-CHAP_Success1   ←   R2 when the host asked for it
//! Send    DH-HMAC-CHAP_Success2   →   (bidirectional only) the host accepted R2
//! ```
//!
//! A message that fails turns the transaction into AUTH_Failure1, which the host's next
//! Authentication Receive gets; AUTH_Failure2 is the host refusing the controller. An
//! AUTH_Negotiate starts a new transaction at any point (re-authentication).
//!
//! Pure logic: randomness (C1, S1, the DH private exponent) comes from the caller.

use std::sync::Arc;

use super::dh::{DhGroup, KeyPair};
use super::hash::{augmented, HashId, Transcript};
use super::msg::{self, explanation, HostMessage};
use super::secret::Secret;

/// What a host must prove, and what the controller allows it to negotiate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAuth {
    /// The host's secret (`--dhchap-secret` on the host).
    pub host: Secret,
    /// The controller's secret (`--dhchap-ctrl-secret` on the host), for bidirectional
    /// authentication; without it a host that asks for that is refused.
    pub controller: Option<Secret>,
    /// Hashes allowed, in the controller's order of preference.
    pub hashes: Vec<HashId>,
    /// DH groups allowed, in the controller's order of preference.
    pub groups: Vec<DhGroup>,
}

impl HostAuth {
    /// The hashes allowed by default: SHA-256, SHA-384, SHA-512 (what Linux's target picks
    /// first; the hash does not change the strength of a 32-byte secret).
    pub const DEFAULT_HASHES: [HashId; 3] = HashId::ALL;

    /// The DH groups allowed by default, preferred in this order: ffdhe2048 (the augmented
    /// challenge keeps a passive observer from testing guesses of the secret offline), the
    /// larger groups, then null for hosts that offer nothing else.
    pub const DEFAULT_GROUPS: [DhGroup; 6] = [
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
        DhGroup::Null,
    ];

    /// A host secret and maybe a controller secret, with the default hashes and groups.
    pub fn new(host: Secret, controller: Option<Secret>) -> Self {
        HostAuth {
            host,
            controller,
            hashes: Self::DEFAULT_HASHES.to_vec(),
            groups: Self::DEFAULT_GROUPS.to_vec(),
        }
    }
}

/// The end of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The host proved its secret (and the host accepted the controller's, if it asked).
    Authenticated {
        /// The hash used.
        hash: HashId,
        /// The DH group used.
        group: DhGroup,
        /// The controller was authenticated too.
        bidirectional: bool,
    },
    /// The transaction failed: why, for the log.
    Failed(String),
}

/// An Authentication Receive that has nothing to receive: the host broke the order of the
/// protocol (Command Sequence Error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfSequence;

#[derive(Debug)]
enum Step {
    /// Waiting for AUTH_Negotiate.
    Negotiate,
    /// Negotiated: the Challenge is next.
    Challenge { t_id: u16, hash: HashId, group: DhGroup },
    /// Challenge sent: waiting for the Reply.
    Reply(Challenged),
    /// Reply accepted: Success1 is next (with R2 when asked).
    Success1 {
        t_id: u16,
        hash: HashId,
        group: DhGroup,
        r2: Option<Vec<u8>>,
    },
    /// Success1 with R2 sent: waiting for Success2 (or Failure2).
    Success2 { t_id: u16, hash: HashId, group: DhGroup },
    /// Failed: AUTH_Failure1 is next.
    Failure1 { t_id: u16, explanation: u8 },
    /// Over (authenticated or failed and told); only a new AUTH_Negotiate goes on.
    Done,
}

/// What a Challenge sent, for checking the Reply: the transaction, the negotiated hash and
/// group, C1, S1 (SEQNUM) and the controller's DH key pair (none with the null group).
#[derive(Debug)]
struct Challenged {
    t_id: u16,
    hash: HashId,
    group: DhGroup,
    c1: Vec<u8>,
    s1: u32,
    keys: Option<KeyPair>,
}

/// One queue's authentication transaction.
#[derive(Debug)]
pub struct Exchange {
    auth: Arc<HostAuth>,
    hostnqn: String,
    subnqn: String,
    step: Step,
}

impl Exchange {
    /// A transaction for `hostnqn` connecting to `subnqn`, waiting for AUTH_Negotiate.
    pub fn new(auth: Arc<HostAuth>, hostnqn: &str, subnqn: &str) -> Self {
        Exchange {
            auth,
            hostnqn: hostnqn.to_owned(),
            subnqn: subnqn.to_owned(),
            step: Step::Negotiate,
        }
    }

    /// True while the controller waits for the host's next Authentication Send.
    pub fn awaits_send(&self) -> bool {
        matches!(
            self.step,
            Step::Negotiate | Step::Reply(_) | Step::Success2 { .. } | Step::Done
        )
    }

    /// Takes what an Authentication Send carried. Returns the end of the transaction when this
    /// message ends it (a failure is reported here, when it is found; the host learns of it
    /// with its next Authentication Receive).
    pub fn send(&mut self, data: &[u8]) -> Option<Event> {
        let m = match msg::parse(data) {
            Ok(m) => m,
            Err(e) => {
                let t_id = self.t_id();
                return self.fail(t_id, e.explanation, e.why.to_owned());
            }
        };
        if let HostMessage::Negotiate(n) = m {
            return self.negotiate(n);
        }
        let step = std::mem::replace(&mut self.step, Step::Done);
        match (step, m) {
            (Step::Reply(ch), HostMessage::Reply(r)) if r.t_id == ch.t_id => self.reply(ch, r),
            (Step::Success2 { t_id, hash, group }, HostMessage::Success2 { t_id: t }) if t == t_id => {
                Some(Event::Authenticated {
                    hash,
                    group,
                    bidirectional: true,
                })
            }
            (_, HostMessage::Failure2 { explanation, .. }) => Some(Event::Failed(format!(
                "the host ended the authentication with AUTH_Failure2 (explanation {explanation:#04x}){}",
                if explanation == msg::explanation::FAILED {
                    ": it refused the controller's response; does the controller secret it was given match the one configured here?"
                } else {
                    ""
                }
            ))),
            (step, m) => {
                let t_id = step_t_id(&step).unwrap_or_else(|| m.t_id());
                let why = format!("{} out of order or with another transaction ID", name(&m));
                self.fail(t_id, explanation::INCORRECT_MESSAGE, why)
            }
        }
    }

    /// What the next Authentication Receive returns, and the end of the transaction when
    /// that message ends it. `random` fills C1, S1 and the DH private exponent.
    pub fn receive(
        &mut self,
        random: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(Vec<u8>, Option<Event>), OutOfSequence> {
        match std::mem::replace(&mut self.step, Step::Done) {
            Step::Challenge { t_id, hash, group } => {
                let mut c1 = vec![0u8; hash.len()];
                random(&mut c1);
                let mut s = [0u8; 4];
                random(&mut s);
                // SEQNUM 0 is reserved (it says "no controller authentication" in a Reply).
                let s1 = u32::from_le_bytes(s).max(1);
                let keys = KeyPair::generate(group, random);
                let m = msg::challenge(
                    t_id,
                    hash,
                    s1,
                    &c1,
                    group,
                    keys.as_ref().map_or(&[], |k| k.public()),
                );
                self.step = Step::Reply(Challenged {
                    t_id,
                    hash,
                    group,
                    c1,
                    s1,
                    keys,
                });
                Ok((m, None))
            }
            Step::Success1 {
                t_id,
                hash,
                group,
                r2,
            } => {
                let m = msg::success1(t_id, hash, r2.as_deref());
                if r2.is_some() {
                    self.step = Step::Success2 { t_id, hash, group };
                    Ok((m, None))
                } else {
                    Ok((
                        m,
                        Some(Event::Authenticated {
                            hash,
                            group,
                            bidirectional: false,
                        }),
                    ))
                }
            }
            Step::Failure1 { t_id, explanation } => Ok((msg::failure1(t_id, explanation), None)),
            other => {
                self.step = other;
                Err(OutOfSequence)
            }
        }
    }

    /// Ends the transaction with AUTH_Failure1 (explanation "authentication failed") for a
    /// reason outside the messages, e.g. a host that must wait after failures.
    pub fn refuse(&mut self, t_id: u16, why: String) -> Event {
        self.step = Step::Failure1 {
            t_id,
            explanation: explanation::FAILED,
        };
        Event::Failed(why)
    }

    fn t_id(&self) -> u16 {
        step_t_id(&self.step).unwrap_or(0)
    }

    fn fail(&mut self, t_id: u16, explanation: u8, why: String) -> Option<Event> {
        self.step = Step::Failure1 { t_id, explanation };
        Some(Event::Failed(why))
    }

    fn negotiate(&mut self, n: msg::Negotiate) -> Option<Event> {
        if n.sc_c != 0 {
            return self.fail(
                n.t_id,
                explanation::CONCAT_MISMATCH,
                format!("the host asks for secure channel concatenation (SC_C {:#04x}), which needs TLS, not built", n.sc_c),
            );
        }
        let Some(hash) = preferred(&self.auth.hashes, &n.hashes, HashId::id) else {
            return self.fail(
                n.t_id,
                explanation::HASH_UNUSABLE,
                format!(
                    "the host offers hashes {:?}, none of those allowed here",
                    n.hashes
                ),
            );
        };
        let Some(group) = preferred(&self.auth.groups, &n.groups, DhGroup::id) else {
            return self.fail(
                n.t_id,
                explanation::DHGROUP_UNUSABLE,
                format!(
                    "the host offers DH groups {:?}, none of those allowed here",
                    n.groups
                ),
            );
        };
        self.step = Step::Challenge {
            t_id: n.t_id,
            hash,
            group,
        };
        None
    }

    fn reply(&mut self, ch: Challenged, r: msg::Reply) -> Option<Event> {
        let (t_id, hash, group, s1) = (ch.t_id, ch.hash, ch.group, ch.s1);
        let (c1, keys) = (&ch.c1[..], ch.keys.as_ref());
        if r.response.len() != hash.len() {
            return self.fail(
                t_id,
                explanation::INCORRECT_PAYLOAD,
                "HL is not the negotiated hash's length".into(),
            );
        }
        let session = match keys {
            None if r.dh_value.is_empty() => None,
            None => {
                return self.fail(
                    t_id,
                    explanation::INCORRECT_PAYLOAD,
                    "a DH value with the null DH group".into(),
                )
            }
            Some(k) => match k.shared(&r.dh_value) {
                Ok(s) => Some(s),
                Err(why) => return self.fail(t_id, explanation::DHGROUP_UNUSABLE, why.into()),
            },
        };
        let c1a = augmented(hash, session.as_deref(), c1);
        let expect = Transcript {
            hash,
            challenge: &c1a,
            seqnum: s1,
            t_id,
            hostnqn: &self.hostnqn,
            subnqn: &self.subnqn,
        }
        .host_response(&self.auth.host.transformed(&self.hostnqn));
        if !constant_time_eq(&expect, &r.response) {
            return self.fail(
                t_id,
                explanation::FAILED,
                "the host's response does not match the secret configured for it".into(),
            );
        }
        // C2 with SEQNUM 0 asks for no controller authentication (NVMe Base 2.0 §8.13.4.5:
        // it only seeds a secure channel's PSK, which this target does not build).
        let r2 = match (r.challenge, r.seqnum) {
            (Some(c2), s2) if s2 != 0 => {
                let Some(ctrl) = &self.auth.controller else {
                    return self.fail(
                        t_id,
                        explanation::FAILED,
                        "the host asks to authenticate the controller (--dhchap-ctrl-secret), and no controller secret is configured for it".into(),
                    );
                };
                let c2a = augmented(hash, session.as_deref(), &c2);
                Some(
                    Transcript {
                        hash,
                        challenge: &c2a,
                        seqnum: s2,
                        t_id,
                        hostnqn: &self.hostnqn,
                        subnqn: &self.subnqn,
                    }
                    .controller_response(&ctrl.transformed(&self.subnqn)),
                )
            }
            _ => None,
        };
        self.step = Step::Success1 {
            t_id,
            hash,
            group,
            r2,
        };
        None
    }
}

fn step_t_id(s: &Step) -> Option<u16> {
    match s {
        Step::Challenge { t_id, .. }
        | Step::Reply(Challenged { t_id, .. })
        | Step::Success1 { t_id, .. }
        | Step::Success2 { t_id, .. }
        | Step::Failure1 { t_id, .. } => Some(*t_id),
        Step::Negotiate | Step::Done => None,
    }
}

fn name(m: &HostMessage) -> &'static str {
    match m {
        HostMessage::Negotiate(_) => "AUTH_Negotiate",
        HostMessage::Reply(_) => "DH-HMAC-CHAP_Reply",
        HostMessage::Success2 { .. } => "DH-HMAC-CHAP_Success2",
        HostMessage::Failure2 { .. } => "AUTH_Failure2",
    }
}

/// Equality that takes as long whichever byte differs (a response check must not tell an
/// attacker how many leading bytes it got right).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The first of `allowed` (in this target's order of preference) whose ID the host offers.
fn preferred<T: Copy>(allowed: &[T], offered: &[u8], id: fn(T) -> u8) -> Option<T> {
    allowed.iter().copied().find(|&a| offered.contains(&id(a)))
}

#[cfg(test)]
impl Exchange {
    pub(super) fn auth_for_test(&self) -> Arc<HostAuth> {
        self.auth.clone()
    }
}
