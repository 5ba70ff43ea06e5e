//! Keeping the namespace table true: Format NVM, re-reading the table, and the Namespace
//! Attribute Changed event (NVMe Base 2.0 §5.2, §5.23); what each namespace is, is
//! [`crate::namespace`]'s.

use super::Controller;
use crate::admin::DataDir;
use crate::cmd::{cns, log_page, Command};
use crate::error::{NvmeError, Result};
use crate::identify::parse_ns_list;
use crate::namespace::{read_namespace, FormatOptions};
use std::sync::atomic::Ordering;

impl Controller {
    /// Format NVM: erases every block of `nsid` and selects LBA format `lbaf`, keeping no
    /// metadata settings (metadata, if the format has any, in a separate buffer, no PI).
    /// Destroys data, so it runs only with `confirm` set. See [`Controller::format_with`].
    pub fn format(&self, nsid: u32, lbaf: u8, confirm: bool) -> Result<()> {
        self.format_with(
            nsid,
            FormatOptions {
                lbaf,
                ..Default::default()
            },
            confirm,
        )
    }

    /// Format NVM with metadata placement and protection information (NVMe Base 2.0 §5.23):
    /// erases every block of `nsid` and selects `opts`'s format. Destroys data, so it runs only
    /// with `confirm` set.
    ///
    /// I/O racing a format could move data sized for the old format into buffers sized for
    /// the new one, so a format runs only while the controller has no I/O queue pair, and no
    /// queue pair can be created until it is done. Afterwards the namespace's new geometry is
    /// read, and queue pairs created from then on use it.
    pub fn format_with(&self, nsid: u32, opts: FormatOptions, confirm: bool) -> Result<()> {
        if !confirm {
            return Err(NvmeError::Unconfirmed("Format NVM"));
        }
        let ns = self.namespace(nsid)?;
        if opts.lbaf as usize >= ns.identify.lba_formats.len() {
            return Err(NvmeError::InvalidOption(format!(
                "namespace {nsid} has LBA formats 0..{}; there is no format {} (`vfpoll identify` lists them)",
                ns.identify.lba_formats.len(),
                opts.lbaf
            )));
        }
        let sh = &self.shared;
        {
            let q = sh.qids.lock().unwrap_or_else(|e| e.into_inner());
            let live = q.iter().skip(1).filter(|&&u| u).count();
            if live != 0 {
                return Err(NvmeError::InvalidOption(format!(
                    "the controller has {live} I/O queue pair(s): drop them before formatting namespace {nsid} (I/O racing a format could move data sized for the old format)"
                )));
            }
            sh.formatting.store(true, Ordering::SeqCst);
        }
        let r = sh.admin_exec("Format NVM", opts.command(nsid), DataDir::None, &[]);
        let refreshed = self.refresh_namespaces();
        sh.formatting.store(false, Ordering::SeqCst);
        r?;
        refreshed
    }

    /// Reads every active namespace again and publishes the new table: queue pairs pick it up
    /// at their next submission.
    pub fn refresh_namespaces(&self) -> Result<()> {
        let sh = &self.shared;
        let list = sh
            .admin_exec(
                "Identify Active Namespaces",
                Command::identify(cns::ACTIVE_NS_LIST, 0),
                DataDir::FromDevice(4096),
                &[],
            )?
            .1;
        let mut exec = |op: &'static str, cmd: Command| -> Result<Vec<u8>> {
            Ok(sh.admin_exec(op, cmd, DataDir::FromDevice(4096), &[])?.1)
        };
        let mut namespaces = Vec::new();
        for nsid in parse_ns_list(&list) {
            if let Some(ns) = read_namespace(&mut exec, nsid, &sh.identify, sh.io_command_sets, sh.zasl)? {
                namespaces.push(ns);
            }
        }
        *sh.namespaces.write().unwrap_or_else(|e| e.into_inner()) = namespaces.into();
        sh.ns_gen.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Handles what the controller reported asynchronously: completed Asynchronous Event
    /// Requests (a Namespace Attribute Changed notice reads the Changed Namespace List and
    /// refreshes the namespace table), re-arming each. Never waits for the admin queue: when
    /// another thread holds it, returns 0 at once. Returns how many events were handled.
    /// Queue pairs call it during their periodic health checks; a program whose queue pairs
    /// are idle can call it from time to time.
    pub fn process_events(&self) -> Result<usize> {
        let sh = &self.shared;
        let events = {
            let Ok(mut guard) = sh.admin.try_lock() else {
                return Ok(0);
            };
            let Some(q) = guard.as_mut() else { return Ok(0) };
            q.poll_events()
        };
        let mut n = 0;
        for e in events {
            n += 1;
            let ty = e.dw0 & 7;
            let info = (e.dw0 >> 8) & 0xff;
            let log = (e.dw0 >> 16) & 0xff;
            log::info!("asynchronous event: type {ty}, info {info:#x}, log page {log:#x}");
            if ty == 2 && info == 0 {
                // Notice: Namespace Attribute Changed. Reading the log clears the event.
                let _ = self.log_page(log_page::CHANGED_NS_LIST, 0xffff_ffff, 4096)?;
                self.refresh_namespaces()?;
            } else if log != 0 {
                // Other events are cleared by reading their log page too (§5.2).
                let _ = self.log_page(log as u8, 0xffff_ffff, 512);
            }
            sh.arm_event()?;
        }
        Ok(n)
    }
}
