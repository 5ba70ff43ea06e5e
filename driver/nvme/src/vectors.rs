//! A controller's interrupt vectors (MSI-X or MSI through VFIO, or eventfds a caller supplies):
//! one eventfd each, and which are taken. Interrupt-mode queue pairs take one each
//! (`qpair/wait.rs`); the controller keeps the set.

use std::sync::Mutex;

use vfpoll_pci::vfio::{EventFd, Irqs};

use crate::error::{NvmeError, Result};

/// The controller's interrupt vectors: one eventfd each, and which are taken.
#[derive(Debug)]
pub(crate) struct Vectors {
    /// Eventfd of each vector (index = vector).
    pub(crate) fds: Vec<EventFd>,
    /// Taken vectors; vector 0 (the admin queue's) is always taken.
    used: Mutex<Vec<bool>>,
    /// What delivers them, for messages: "MSI-X", "MSI", "supplied".
    pub(crate) kind: &'static str,
    /// The VFIO interrupts (disabled when the controller goes; hybrid mode unbinds and binds
    /// MSI-X vectors through them); `None` when supplied.
    pub(crate) irqs: Option<Irqs>,
}

impl Vectors {
    pub(crate) fn new(fds: Vec<EventFd>, kind: &'static str, irqs: Option<Irqs>) -> Self {
        let mut used = vec![false; fds.len()];
        used[0] = true;
        Vectors {
            fds,
            used: Mutex::new(used),
            kind,
            irqs,
        }
    }

    pub(crate) fn take(&self) -> Result<u16> {
        let mut u = self.used.lock().unwrap_or_else(|e| e.into_inner());
        match u.iter().position(|t| !t) {
            Some(v) => {
                u[v] = true;
                Ok(v as u16)
            }
            None => Err(NvmeError::InvalidOption(format!(
                "all {} {} interrupt vectors are in use ({} by interrupt-mode queue pairs, vector 0 by the admin queue): \
                 drop an interrupt-mode queue pair or create this one with CompletionMode::Poll",
                u.len(),
                self.kind,
                u.len() - 1
            ))),
        }
    }

    pub(crate) fn give_back(&self, v: u16) {
        let mut u = self.used.lock().unwrap_or_else(|e| e.into_inner());
        if v != 0 {
            if let Some(t) = u.get_mut(v as usize) {
                *t = false;
            }
        }
    }
}
