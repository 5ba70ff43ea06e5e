//! Whole transactions against known answers: the host side here is bytes computed apart from
//! this crate (Python's hmac, hashlib and pow over the RFC 7919 prime, from the formulas of
//! NVMe Base 2.0 §8.13.4.4), so the controller is checked against the specification, not
//! against itself.

use std::sync::Arc;

use super::msg::{self, explanation, id};
use super::*;

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";
const SUBNQN: &str = "nqn.2024-01.io.vfpoll:auth";
const HOST_KEY: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
const CTRL_KEY: &str = "DHHC-1:00:QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl9YjiZe:";

/// The host's DH value g^y mod p (y = C4 44 44 ... 44, 64 bytes) in ffdhe2048.
const Y: &str = "e1a5706fcdad18312c5065555656edcc313b156febc830833b56f2770a6fe45ce03ca03b605a1ae9f249ec110c79d4060b09c762d98e21f2a14a6e522bb41f00b20013307cf3a2abd1abbce91e7e38a8738eb3a239cab1e4ecc62b68f4462852d43a85182f88a4b4b6b204baf215ff33dd47abd5efffafa021686f0f27787c3d062f5d5117723e1494f6cc684a42afbe5938f4cdc9366265c999de8e2490ac79296c0859de1ab5a8a176978b462bb1fdb23c48e57799f2ab88837d574e0669d44911a5ba280750fa95dc162b30a689a012ab7157b4f88d2166ff2ec9d4c5e99924a9e22b70ec30c2616ffa9ffdced71ea80e75a552a38267ae07d34c78487a27";
/// SHA-256 of the controller's DH value g^x (x = 83 03 03 ... 03).
const X_SHA256: &str = "08343965b7707b910230c23930ace760e90024d91413a67f4a8bb16ef93dd430";
/// R1 for T_ID 7, C1 = 01 × 32, S1 = 02020202h, ffdhe2048, SHA-256, the host key
/// transformed with SHA-256 and the host NQN.
const R1: &str = "59673d00cb3aa1a845f2c135d3e4aa670a047bcc7039940ac6f002b5057745ce";
/// R2 for C2 = 55 × 32, S2 = 9, the controller key untransformed.
const R2: &str = "d2fc402767b9bd8174dc59e40e6a4bf2f9d447c8225dd3b9524dcc6f26011895";
/// R1 with the null group and SHA-384, C1 = 01 × 48, the host key untransformed.
const R1_NULL_SHA384: &str =
    "e32fb4a14d7b3f52308b2b4f5d4d927f92d27b3398d4be31624f986e6a27452b64e25104a36080f0c1d6c66c2810be7b";

/// Bytes from hexadecimal digits: the form the known answers here and in the modules' own
/// tests are written in.
pub(super) fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Fills each buffer with one byte: 1 for the first call (C1), 2 for the next (S1), 3 for
/// the third (the private exponent), ...
fn counter() -> impl FnMut(&mut [u8]) {
    let mut n = 0u8;
    move |b: &mut [u8]| {
        n += 1;
        b.fill(n);
    }
}

fn auth(ctrl: bool) -> Arc<HostAuth> {
    Arc::new(HostAuth::new(
        Secret::parse(HOST_KEY).unwrap(),
        ctrl.then(|| Secret::parse(CTRL_KEY).unwrap()),
    ))
}

/// Linux's host offers SHA-256, SHA-384, SHA-512 and null, ffdhe2048 ... ffdhe8192.
fn linux_negotiate(t_id: u16) -> Vec<u8> {
    msg::negotiate(t_id, &[1, 2, 3], &[0, 1, 2, 3, 4, 5])
}

fn reply(response: &str, c2: Option<u8>, seqnum: u32, dh: &[u8]) -> Vec<u8> {
    let response = hex(response);
    msg::reply(&msg::Reply {
        t_id: 7,
        challenge: c2.map(|b| vec![b; response.len()]),
        response,
        seqnum,
        dh_value: dh.to_vec(),
    })
}

/// Up to the Challenge: checks it and returns the exchange.
fn challenged(ctrl: bool) -> Exchange {
    let mut x = Exchange::new(auth(ctrl), HOSTNQN, SUBNQN);
    let mut rng = counter();
    assert_eq!(
        x.receive(&mut rng),
        Err(OutOfSequence),
        "nothing to receive before Negotiate"
    );
    assert_eq!(x.send(&linux_negotiate(7)), None);
    let (c, ev) = x.receive(&mut rng).unwrap();
    assert_eq!(ev, None);
    assert_eq!((c[0], c[1]), (msg::TYPE_DHCHAP, id::CHALLENGE));
    assert_eq!(u16::from_le_bytes([c[4], c[5]]), 7, "T_ID");
    assert_eq!((c[6], c[8], c[9]), (32, 1, 1), "HL 32, SHA-256, ffdhe2048");
    assert_eq!(u16::from_le_bytes([c[10], c[11]]), 256, "DHVLEN");
    assert_eq!(&c[12..16], &[2; 4], "S1");
    assert_eq!(&c[16..48], &[1; 32], "C1");
    assert_eq!(HashId::Sha256.digest(&c[48..]), hex(X_SHA256), "g^x");
    assert_eq!(c.len(), 16 + 32 + 256);
    x
}

#[test]
fn host_authentication_with_ffdhe2048_accepts_the_specified_response() {
    let mut x = challenged(false);
    assert_eq!(x.send(&reply(R1, None, 0, &hex(Y))), None);
    let (s, ev) = x.receive(&mut counter()).unwrap();
    assert_eq!(
        (s[0], s[1], s[6], s[8]),
        (msg::TYPE_DHCHAP, id::SUCCESS1, 32, 0),
        "Success1, RVALID 0"
    );
    assert_eq!(
        ev,
        Some(Event::Authenticated {
            hash: HashId::Sha256,
            group: DhGroup::Ffdhe2048,
            bidirectional: false
        })
    );
}

#[test]
fn bidirectional_authentication_returns_the_specified_controller_response() {
    let mut x = challenged(true);
    assert_eq!(x.send(&reply(R1, Some(0x55), 9, &hex(Y))), None);
    let (s, ev) = x.receive(&mut counter()).unwrap();
    assert_eq!(ev, None, "not over before Success2");
    assert_eq!(s[8], 1, "RVALID");
    assert_eq!(&s[16..], &hex(R2)[..], "R2");
    assert_eq!(
        x.send(&msg::success2(7)),
        Some(Event::Authenticated {
            hash: HashId::Sha256,
            group: DhGroup::Ffdhe2048,
            bidirectional: true
        })
    );
}

#[test]
fn null_group_and_sha384_as_configured() {
    let mut a = (*auth(false)).clone();
    a.host = Secret::new(None, &(0..32).collect::<Vec<u8>>()).unwrap();
    a.hashes = vec![HashId::Sha384];
    a.groups = vec![DhGroup::Null];
    let mut x = Exchange::new(Arc::new(a), HOSTNQN, SUBNQN);
    let mut rng = counter();
    assert_eq!(x.send(&linux_negotiate(7)), None);
    let (c, _) = x.receive(&mut rng).unwrap();
    assert_eq!(
        (c[6], c[8], c[9], c.len()),
        (48, 2, 0, 16 + 48),
        "SHA-384, null group, no DH value"
    );
    // A DH value with the null group is refused.
    let mut y = Exchange::new(x.auth_for_test(), HOSTNQN, SUBNQN);
    y.send(&linux_negotiate(7));
    y.receive(&mut counter()).unwrap();
    assert!(matches!(
        y.send(&reply(R1_NULL_SHA384, None, 0, &[1; 256])),
        Some(Event::Failed(_))
    ));
    assert_eq!(x.send(&reply(R1_NULL_SHA384, None, 0, &[])), None);
    assert!(matches!(
        x.receive(&mut rng),
        Ok((_, Some(Event::Authenticated { .. })))
    ));
}

fn failure1(x: &mut Exchange) -> u8 {
    let (f, ev) = x.receive(&mut counter()).unwrap();
    assert_eq!(ev, None, "the failure was reported when found");
    assert_eq!(
        (f[0], f[1], f[6]),
        (msg::TYPE_COMMON, id::FAILURE1, msg::REASON_FAILED)
    );
    f[7]
}

#[test]
fn a_wrong_host_secret_fails_with_failure1() {
    let mut x = challenged(false);
    let mut wrong = hex(R1);
    wrong[31] ^= 1;
    let wrong: String = wrong.iter().map(|b| format!("{b:02x}")).collect();
    assert!(
        matches!(x.send(&reply(&wrong, None, 0, &hex(Y))), Some(Event::Failed(w)) if w.contains("does not match"))
    );
    assert_eq!(failure1(&mut x), explanation::FAILED);
    assert_eq!(x.receive(&mut counter()), Err(OutOfSequence));
}

#[test]
fn bidirectional_without_a_controller_secret_fails() {
    let mut x = challenged(false);
    assert!(
        matches!(x.send(&reply(R1, Some(0x55), 9, &hex(Y))), Some(Event::Failed(w)) if w.contains("controller secret"))
    );
    assert_eq!(failure1(&mut x), explanation::FAILED);
}

#[test]
fn the_host_refusing_the_controller_is_a_failure() {
    let mut x = challenged(true);
    x.send(&reply(R1, Some(0x55), 9, &hex(Y)));
    x.receive(&mut counter()).unwrap();
    assert!(matches!(
        x.send(&msg::failure2(7, explanation::FAILED)),
        Some(Event::Failed(_))
    ));
}

#[test]
fn out_of_order_and_malformed_messages_fail_with_the_right_explanation() {
    // A Reply before Negotiate.
    let mut x = Exchange::new(auth(false), HOSTNQN, SUBNQN);
    assert!(matches!(x.send(&reply(R1, None, 0, &[])), Some(Event::Failed(_))));
    assert_eq!(failure1(&mut x), explanation::INCORRECT_MESSAGE);
    // Another transaction ID.
    let mut x = challenged(false);
    let mut r = reply(R1, None, 0, &hex(Y));
    r[4] = 8;
    assert!(matches!(x.send(&r), Some(Event::Failed(_))));
    assert_eq!(failure1(&mut x), explanation::INCORRECT_MESSAGE);
    // A DH value of the wrong length, and one out of range.
    for dh in [vec![7u8; 255], vec![0u8; 256]] {
        let mut x = challenged(false);
        assert!(matches!(x.send(&reply(R1, None, 0, &dh)), Some(Event::Failed(_))));
        assert_eq!(failure1(&mut x), explanation::DHGROUP_UNUSABLE);
    }
    // Truncated.
    let mut x = challenged(false);
    let r = reply(R1, None, 0, &hex(Y));
    assert!(matches!(x.send(&r[..r.len() - 1]), Some(Event::Failed(_))));
    assert_eq!(failure1(&mut x), explanation::INCORRECT_PAYLOAD);
    // No usable hash or group, secure channel concatenation.
    let mut x = Exchange::new(auth(false), HOSTNQN, SUBNQN);
    assert!(x.send(&msg::negotiate(1, &[9], &[1])).is_some());
    assert_eq!(failure1(&mut x), explanation::HASH_UNUSABLE);
    assert!(
        x.send(&msg::negotiate(1, &[1], &[9])).is_some(),
        "Negotiate restarts"
    );
    assert_eq!(failure1(&mut x), explanation::DHGROUP_UNUSABLE);
    let mut n = linux_negotiate(1);
    n[6] = 1;
    assert!(x.send(&n).is_some());
    assert_eq!(failure1(&mut x), explanation::CONCAT_MISMATCH);
}

#[test]
fn a_new_negotiate_restarts_a_finished_transaction() {
    let mut x = challenged(false);
    x.send(&reply(R1, None, 0, &hex(Y)));
    x.receive(&mut counter()).unwrap();
    assert_eq!(x.send(&linux_negotiate(7)), None);
    assert!(x.receive(&mut counter()).is_ok(), "a new Challenge");
}

#[test]
fn command_fields_are_checked() {
    let mut sqe = crate::fabrics::Sqe::default();
    sqe.dw[10] = 0xe901_0100;
    sqe.dw[11] = 36;
    assert_eq!(command_len(&sqe), Ok(36));
    for dw10 in [0xe801_0100, 0xe901_0000, 0xe900_0100] {
        sqe.dw[10] = dw10;
        assert!(command_len(&sqe).is_err());
    }
    sqe.dw[10] = 0xe901_0100;
    sqe.dw[11] = 0;
    assert!(command_len(&sqe).is_err());
}
