//! The `fuzz_auth` target: DH-HMAC-CHAP as a controller meets it from a host
//! ([`vfpoll_nvmf::auth`]): the message parser, one queue's transaction, and the `DHHC-1`
//! secret parser.
//!
//! # Input
//!
//! Byte 0 configures the controller: bit 0 allows ffdhe2048 before the null group (else null
//! only), bit 1 gives it a controller secret (bidirectional authentication). Then records
//! back to back, each `[op][len: u16 LE][data: len bytes]` (a short last record ends the
//! input); `op % 3` says what `data` is:
//!
//! - 0: what an Authentication Send carries, for [`msg::parse`] and [`Exchange::send`];
//! - 1: an Authentication Receive ([`Exchange::receive`]; `data` unused);
//! - 2: the text of a secret, for [`Secret::parse`].
//!
//! # Properties
//!
//! - no panic, whatever the bytes;
//! - a parsed Negotiate (SC_C 0) or Reply built again by the host-side builders parses to
//!   the same message;
//! - what the controller returns is a whole Challenge, Success1 or Failure1 whose T_ID is
//!   the transaction's, and HL the negotiated hash's length;
//! - **no authentication without the secret**: the transaction ends authenticated only after
//!   a Reply carrying exactly the R1 the host's secret gives for the last Challenge (computed
//!   here from the specification's formula), and, for bidirectional authentication, a
//!   Success2 after a Success1 carrying R2;
//! - a parsed secret written back as text parses to the same secret.

use std::sync::Arc;

use vfpoll_nvmf::auth::{
    augmented, msg, DhGroup, Event, Exchange, HashId, HostAuth, KeyPair, Secret, Transcript,
};

/// The host NQN of the transaction.
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
/// The subsystem NQN of the transaction.
pub const SUBNQN: &str = "nqn.2024-01.io.vfpoll:fuzz";
/// The host's secret.
pub const HOST_KEY: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
/// The controller's secret.
pub const CTRL_KEY: &str = "DHHC-1:00:QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl9YjiZe:";

/// Record kinds.
pub mod op {
    /// Authentication Send.
    pub const SEND: u8 = 0;
    /// Authentication Receive.
    pub const RECEIVE: u8 = 1;
    /// A secret's text.
    pub const SECRET: u8 = 2;
}

/// Bytes before a record's data.
pub const RECORD_HEADER: usize = 3;

/// The last Challenge the controller sent, as the host keeps it.
struct Challenge {
    t_id: u16,
    hash: HashId,
    seqnum: u32,
    c1: Vec<u8>,
    dh: Vec<u8>,
}

/// The host's DH key pair: fixed, so that a seed can carry its public value and R1.
fn host_keys(group: DhGroup) -> Option<KeyPair> {
    KeyPair::generate(group, &mut |b: &mut [u8]| b.fill(0x44))
}

/// R1 for `ch` as the host with [`HOST_KEY`] computes it, given its DH value `y` (empty for
/// the null group).
fn expected_r1(ch: &Challenge, group: DhGroup, y: &[u8]) -> Option<Vec<u8>> {
    let session = match group {
        DhGroup::Null => None,
        g => {
            let k = host_keys(g)?;
            if k.public() != y {
                // Another DH value than the host's: the session key is not one this check
                // can compute, and the controller must not be fooled either way.
                return None;
            }
            Some(k.shared(&ch.dh).ok()?)
        }
    };
    let c1a = augmented(ch.hash, session.as_deref(), &ch.c1);
    let key = Secret::parse(HOST_KEY)
        .expect("a valid secret")
        .transformed(HOSTNQN);
    Some(
        Transcript {
            hash: ch.hash,
            challenge: &c1a,
            seqnum: ch.seqnum,
            t_id: ch.t_id,
            hostnqn: HOSTNQN,
            subnqn: SUBNQN,
        }
        .host_response(&key),
    )
}

/// Counter-filled randomness: each call fills its buffer with the next byte value.
fn counter() -> impl FnMut(&mut [u8]) {
    let mut n = 0u8;
    move |b: &mut [u8]| {
        n = n.wrapping_add(1);
        b.fill(n);
    }
}

/// The controller's side of one queue's transaction, configured by an input's first byte:
/// bit 0 allows ffdhe2048 besides the null group, bit 1 makes the authentication
/// bidirectional (a controller secret).
fn exchange(cfg: u8) -> Exchange {
    let mut a = HostAuth::new(
        Secret::parse(HOST_KEY).expect("a valid secret"),
        (cfg & 2 != 0).then(|| Secret::parse(CTRL_KEY).expect("a valid secret")),
    );
    a.groups = if cfg & 1 != 0 {
        vec![DhGroup::Ffdhe2048, DhGroup::Null]
    } else {
        vec![DhGroup::Null]
    };
    Exchange::new(Arc::new(a), HOSTNQN, SUBNQN)
}

/// The target's check.
pub fn check(data: &[u8]) {
    let Some((&cfg, mut rest)) = data.split_first() else {
        return;
    };
    let mut x = exchange(cfg);
    let mut random = counter();
    let mut challenge: Option<(Challenge, DhGroup)> = None;
    // The last Reply's R1 was right for the last Challenge.
    let mut proven = false;
    let mut asked_r2 = false;
    let mut t_id: Option<u16> = None;
    while let Some((head, tail)) = rest.split_at_checked(RECORD_HEADER) {
        let len = u16::from_le_bytes([head[1], head[2]]) as usize;
        let Some((payload, tail)) = tail.split_at_checked(len) else {
            return;
        };
        rest = tail;
        match head[0] % 3 {
            op::SEND => {
                let parsed = msg::parse(payload);
                match &parsed {
                    Ok(msg::HostMessage::Negotiate(n)) => {
                        if n.sc_c == 0 && n.hashes.len() <= 30 && n.groups.len() <= 30 {
                            let again = msg::parse(&msg::negotiate(n.t_id, &n.hashes, &n.groups));
                            assert_eq!(again.as_ref(), Ok(&msg::HostMessage::Negotiate(n.clone())));
                        }
                        t_id = Some(n.t_id);
                        challenge = None;
                        proven = false;
                        asked_r2 = false;
                    }
                    Ok(msg::HostMessage::Reply(r)) => {
                        let again = msg::parse(&msg::reply(r));
                        assert_eq!(again.as_ref(), Ok(&msg::HostMessage::Reply(r.clone())));
                        proven = challenge.as_ref().is_some_and(|(ch, g)| {
                            r.t_id == ch.t_id
                                && expected_r1(ch, *g, &r.dh_value).as_ref() == Some(&r.response)
                        });
                        asked_r2 = r.challenge.is_some() && r.seqnum != 0;
                    }
                    _ => {}
                }
                if let Some(Event::Authenticated { bidirectional, .. }) = x.send(payload) {
                    assert!(bidirectional, "host-only authentication ends at Success1");
                    assert!(proven && asked_r2, "authenticated without the host's secret");
                    assert!(
                        matches!(parsed, Ok(msg::HostMessage::Success2 { .. })),
                        "only Success2 ends a bidirectional authentication"
                    );
                }
            }
            op::RECEIVE => {
                let Ok((m, event)) = x.receive(&mut random) else {
                    continue;
                };
                assert!(m.len() >= msg::FAILURE);
                let tid = u16::from_le_bytes([m[4], m[5]]);
                match (m[0], m[1]) {
                    (msg::TYPE_DHCHAP, msg::id::CHALLENGE) => {
                        let hl = m[6] as usize;
                        let hash = HashId::from_id(m[8]).expect("a defined hash");
                        assert_eq!(hl, hash.len());
                        let group = DhGroup::from_id(m[9]).expect("a defined group");
                        let dhvlen = u16::from_le_bytes([m[10], m[11]]) as usize;
                        assert_eq!(dhvlen, group.value_len());
                        assert_eq!(m.len(), msg::HEADER + hl + dhvlen);
                        assert_eq!(Some(tid), t_id, "the Challenge's T_ID is the Negotiate's");
                        challenge = Some((
                            Challenge {
                                t_id: tid,
                                hash,
                                seqnum: u32::from_le_bytes([m[12], m[13], m[14], m[15]]),
                                c1: m[msg::HEADER..msg::HEADER + hl].to_vec(),
                                dh: m[msg::HEADER + hl..].to_vec(),
                            },
                            group,
                        ));
                        proven = false;
                        assert_eq!(event, None);
                    }
                    (msg::TYPE_DHCHAP, msg::id::SUCCESS1) => {
                        let (ch, _) = challenge.as_ref().expect("Success1 follows a Challenge");
                        assert!(proven, "Success1 without the host's secret");
                        assert_eq!(tid, ch.t_id);
                        assert_eq!(m.len(), msg::HEADER + ch.hash.len());
                        assert_eq!(m[8] != 0, asked_r2, "R2 exactly when the host asked");
                        match event {
                            Some(Event::Authenticated { bidirectional, .. }) => assert!(!bidirectional),
                            None => assert!(asked_r2),
                            Some(Event::Failed(_)) => panic!("Success1 is no failure"),
                        }
                    }
                    (msg::TYPE_COMMON, msg::id::FAILURE1) => {
                        assert_eq!(m.len(), msg::FAILURE);
                        assert_eq!(m[6], msg::REASON_FAILED);
                        assert_eq!(event, None, "a failure is reported when found");
                        proven = false;
                    }
                    other => panic!("the controller sent {other:?}"),
                }
            }
            _ => {
                if let Ok(s) = Secret::parse(&String::from_utf8_lossy(payload)) {
                    assert_eq!(Secret::parse(&s.to_text()), Ok(s));
                }
            }
        }
    }
}

fn record(out: &mut Vec<u8>, op: u8, data: &[u8]) {
    out.push(op);
    out.extend_from_slice(&(data.len() as u16).to_le_bytes());
    out.extend_from_slice(data);
}

/// Seeds: whole transactions as Linux's host runs them (the null group, host-only and
/// bidirectional, with the right and a wrong secret; ffdhe2048 with the right secret, fewer:
/// its exponentiations make each run about 100 times slower), secrets, and failures.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for (cfg, right) in [
        (0u8, true),
        (0, false),
        (2, true),
        (2, false),
        (1, true),
        (3, true),
    ] {
        {
            // Replays the controller's side to learn the Challenge the seed's Reply answers.
            let mut x = exchange(cfg);
            let mut random = counter();
            let mut s = vec![cfg];
            let n = msg::negotiate(1, &[1, 2, 3], &[0, 1, 2, 3, 4, 5]);
            record(&mut s, op::SEND, &n);
            x.send(&n);
            record(&mut s, op::RECEIVE, &[]);
            let (c, _) = x.receive(&mut random).expect("a Challenge");
            let hl = c[6] as usize;
            let group = DhGroup::from_id(c[9]).expect("defined");
            let ch = Challenge {
                t_id: 1,
                hash: HashId::from_id(c[8]).expect("defined"),
                seqnum: u32::from_le_bytes([c[12], c[13], c[14], c[15]]),
                c1: c[16..16 + hl].to_vec(),
                dh: c[16 + hl..].to_vec(),
            };
            let y = host_keys(group).map_or(Vec::new(), |k| k.public().to_vec());
            let mut r1 = expected_r1(&ch, group, &y).expect("computable");
            if !right {
                r1[0] ^= 1;
            }
            let reply = msg::reply(&msg::Reply {
                t_id: 1,
                response: r1,
                challenge: (cfg & 2 != 0).then(|| vec![0x5a; hl]),
                seqnum: if cfg & 2 != 0 { 9 } else { 0 },
                dh_value: y,
            });
            record(&mut s, op::SEND, &reply);
            record(&mut s, op::RECEIVE, &[]);
            if cfg & 2 != 0 {
                record(&mut s, op::SEND, &msg::success2(1));
            }
            record(&mut s, op::SEND, &msg::failure2(1, 1));
            record(&mut s, op::SECRET, HOST_KEY.as_bytes());
            record(&mut s, op::SECRET, CTRL_KEY.as_bytes());
            seeds.push(s);
        }
    }
    seeds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;

    /// The right-secret seeds authenticate (the property is reachable), the wrong ones do not.
    #[test]
    fn the_seeds_authenticate_with_the_right_secret_only() {
        for (i, s) in seeds().iter().enumerate() {
            check(s);
            let mut x = exchange(s[0]);
            let mut random = counter();
            let mut rest = &s[1..];
            let mut authenticated = false;
            while let Some((head, tail)) = rest.split_at_checked(RECORD_HEADER) {
                let len = u16::from_le_bytes([head[1], head[2]]) as usize;
                let (payload, tail) = tail.split_at(len);
                rest = tail;
                let ev = match head[0] {
                    op::SEND => x.send(payload),
                    op::RECEIVE => x.receive(&mut random).ok().and_then(|(_, e)| e),
                    _ => None,
                };
                authenticated |= matches!(ev, Some(Event::Authenticated { .. }));
            }
            assert_eq!(authenticated, ![1, 3].contains(&i), "seed {i}");
        }
    }

    #[test]
    fn mutated_seeds_keep_the_properties() {
        let seeds = seeds();
        let mut rng = Rng::new(0xa17);
        for _ in 0..2000 {
            let s = &seeds[rng.below(seeds.len())];
            check(&rng.mutate(s));
        }
    }
}
