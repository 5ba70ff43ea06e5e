//! How a queue learns that the device finished work: [`CompletionMode`], shared by the NVMe
//! driver (a queue pair's completion queue) and the NIC driver (a port's receive queue), which
//! both build on this crate's VFIO interrupts ([`crate::vfio::Irqs`]). Pure data: no `unsafe`,
//! no I/O.

use std::fmt;
use std::time::Duration;

/// How a queue learns that the device completed work.
///
/// For an NVMe queue pair (`vfpoll_nvme::QueuePair`) this is about its completion queue; for a
/// NIC (`vfpoll_nic::RxQueue`) about its receive queue. Each driver's docs say what its `wait`
/// does in each mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompletionMode {
    /// The caller polls (`QueuePair::poll`, `RxQueue::rx_burst`); the queue's interrupts stay
    /// off (masked).
    #[default]
    Poll,
    /// The queue interrupts; its `wait` sleeps on the queue's eventfd until work completes.
    Irq,
    /// `wait` spins for `spin` first, then sleeps as in `Irq` (the NVMe driver's queue pair may
    /// spin up to 20 times as long with commands in flight during a stream of completions
    /// caught spinning: see its `qpair::wait` docs, "Hybrid").
    Hybrid {
        /// How long to spin before sleeping.
        spin: Duration,
    },
}

impl CompletionMode {
    /// The names [`CompletionMode::from_name`] takes, for command-line choices.
    pub const NAMES: [&'static str; 3] = ["poll", "irq", "hybrid"];

    /// Whether the queue is created with interrupts enabled (gets an interrupt vector).
    pub fn interrupts(self) -> bool {
        self != CompletionMode::Poll
    }

    /// The mode called `name` (one of [`CompletionMode::NAMES`]); `hybrid_spin` is the spin of
    /// `hybrid` and unused otherwise. The one parser of a mode's name (the CLI's `--completion`).
    pub fn from_name(name: &str, hybrid_spin: Duration) -> Result<Self, UnknownCompletionMode> {
        match name {
            "poll" => Ok(CompletionMode::Poll),
            "irq" => Ok(CompletionMode::Irq),
            "hybrid" => Ok(CompletionMode::Hybrid { spin: hybrid_spin }),
            _ => Err(UnknownCompletionMode(name.to_owned())),
        }
    }
}

impl fmt::Display for CompletionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompletionMode::Poll => f.write_str("poll"),
            CompletionMode::Irq => f.write_str("irq"),
            CompletionMode::Hybrid { spin } => write!(f, "hybrid (spin {spin:?})"),
        }
    }
}

/// A completion mode name that is none of [`CompletionMode::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown completion mode {0:?}: use poll, irq or hybrid")]
pub struct UnknownCompletionMode(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_to_their_modes_and_back() {
        let spin = Duration::from_micros(50);
        assert_eq!(CompletionMode::from_name("poll", spin), Ok(CompletionMode::Poll));
        assert_eq!(CompletionMode::from_name("irq", spin), Ok(CompletionMode::Irq));
        assert_eq!(
            CompletionMode::from_name("hybrid", spin),
            Ok(CompletionMode::Hybrid { spin })
        );
        for name in CompletionMode::NAMES {
            let mode = CompletionMode::from_name(name, spin).unwrap();
            assert!(mode.to_string().starts_with(name), "{mode} for {name}");
            assert_eq!(mode.interrupts(), name != "poll");
        }
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_choices() {
        let e = CompletionMode::from_name("Irq", Duration::ZERO).unwrap_err();
        assert_eq!(e, UnknownCompletionMode("Irq".into()));
        assert!(e.to_string().contains("use poll, irq or hybrid"), "{e}");
    }
}
