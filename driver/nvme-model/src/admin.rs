//! Admin commands (NVMe Base 2.0 §5).

use crate::ctrl::{Controller, DbBuf, Outcome};
use crate::dptr::{self, copy_to_host};
use crate::nsconfig::{NamespaceFormat, PiType, Protection};
use crate::queue::{Command, Cq, Sq, CQE_SIZE, SQE_SIZE};
use crate::Status;
use vfpoll_nvme_spec::cmd::{admin_op as opcode, feature};
use vfpoll_nvme_spec::regs::off;

impl Controller {
    /// Executes an admin command.
    pub(crate) fn admin(&mut self, cmd: &Command) -> Outcome {
        // §4.1: fused operations are not supported (FUSES = 0); over PCIe, admin commands use
        // PRPs only (NVMe over PCIe 1.0 §2.1.2).
        if cmd.fuse() != 0 || cmd.psdt() != 0 {
            return Status::INVALID_FIELD.into();
        }
        match cmd.opcode() {
            opcode::DELETE_IO_SQ => self.delete_sq(cmd).into(),
            opcode::CREATE_IO_SQ => self.create_sq(cmd).into(),
            opcode::GET_LOG_PAGE => self.get_log_page(cmd).into(),
            opcode::DELETE_IO_CQ => self.delete_cq(cmd).into(),
            opcode::CREATE_IO_CQ => self.create_cq(cmd).into(),
            opcode::IDENTIFY => self.identify(cmd).into(),
            opcode::ABORT => self.abort(cmd),
            opcode::SET_FEATURES => self.set_features(cmd),
            opcode::GET_FEATURES => self.get_features(cmd),
            opcode::ASYNC_EVENT_REQUEST => self.async_event_request(cmd),
            opcode::DOORBELL_BUFFER_CONFIG if self.cfg.doorbell_buffer_config => {
                self.doorbell_buffer_config(cmd).into()
            }
            opcode::FORMAT_NVM => self.format(cmd).into(),
            _ => Status::INVALID_OPCODE.into(),
        }
    }

    /// Copies `self.buf[..len]` to the host through the command's PRPs.
    pub(crate) fn send(&mut self, cmd: &Command, len: usize) -> Status {
        if self.cfg.max_transfer().is_some_and(|m| len as u64 > m) {
            return Status::INVALID_FIELD;
        }
        if let Err(s) = dptr::prp(
            &self.mem,
            cmd.prp1(),
            cmd.prp2(),
            len as u64,
            self.page,
            &mut self.segs,
        ) {
            return s;
        }
        copy_to_host(&self.segs, &self.buf[..len]);
        Status::SUCCESS
    }

    /// Create I/O Completion Queue (§5.4): CDW10 QID and QSIZE (0's based), CDW11 PC, IEN, IV;
    /// PRP1 the page-aligned base. With IEN set, each entry posted signals the eventfd of vector
    /// IV ([`crate::NvmeModel::msix`]; Invalid Interrupt Vector when IV has none). The model also checks that the whole queue translates (Data Transfer Error if not),
    /// which a real controller would find only on first use.
    fn create_cq(&mut self, cmd: &Command) -> Status {
        let (qid, size) = (cmd.cdw(10) as u16, (cmd.cdw(10) >> 16) + 1);
        if qid == 0 || qid > self.nq.1 || self.cqs[qid as usize].is_some() {
            return Status::INVALID_QID;
        }
        if size < 2 || size > self.cfg.max_queue_entries {
            return Status::INVALID_QUEUE_SIZE;
        }
        if cmd.cdw(11) & 1 == 0 || !cmd.prp1().is_multiple_of(self.page) {
            // CAP.CQR = 1: queues must be physically contiguous and page aligned.
            return Status::INVALID_FIELD;
        }
        if let Err(e) = self.mem.check(cmd.prp1(), (size as u64 * CQE_SIZE) as usize) {
            log::debug!("Create I/O CQ {qid}: {e}");
            return Status::DATA_TRANSFER_ERROR;
        }
        let mut cq = Cq::new(cmd.prp1(), size);
        if cmd.cdw(11) & 0b10 != 0 {
            let iv = (cmd.cdw(11) >> 16) as usize;
            let table = self.shared.msix.lock().unwrap_or_else(|e| e.into_inner());
            match table.get(iv) {
                Some(e) => cq.irq = Some(std::sync::Arc::clone(e)),
                None => return Status::INVALID_INTERRUPT_VECTOR,
            }
        }
        self.cqs[qid as usize] = Some(cq);
        self.clear_doorbell(qid, true);
        insert_sorted(&mut self.active_cqs, qid);
        self.init_shadow(qid, true);
        Status::SUCCESS
    }

    /// Create I/O Submission Queue (§5.5): CDW10 QID and QSIZE, CDW11 PC, QPRIO (ignored:
    /// round robin only) and CQID.
    fn create_sq(&mut self, cmd: &Command) -> Status {
        let (qid, size) = (cmd.cdw(10) as u16, (cmd.cdw(10) >> 16) + 1);
        let cqid = (cmd.cdw(11) >> 16) as u16;
        if qid == 0 || qid > self.nq.0 || self.sqs[qid as usize].is_some() {
            return Status::INVALID_QID;
        }
        if size < 2 || size > self.cfg.max_queue_entries {
            return Status::INVALID_QUEUE_SIZE;
        }
        if cqid == 0 || self.cqs.get(cqid as usize).is_none_or(Option::is_none) {
            return Status::CQ_INVALID;
        }
        if cmd.cdw(11) & 1 == 0 || !cmd.prp1().is_multiple_of(self.page) {
            return Status::INVALID_FIELD;
        }
        if let Err(e) = self.mem.check(cmd.prp1(), (size as u64 * SQE_SIZE) as usize) {
            log::debug!("Create I/O SQ {qid}: {e}");
            return Status::DATA_TRANSFER_ERROR;
        }
        self.sqs[qid as usize] = Some(Sq::new(cmd.prp1(), size, cqid));
        self.reserve_in_flight(size as usize);
        self.clear_doorbell(qid, false);
        if let Some(cq) = self.cqs[cqid as usize].as_mut() {
            cq.sqs += 1;
        }
        insert_sorted(&mut self.active_sqs, qid);
        self.init_shadow(qid, false);
        Status::SUCCESS
    }

    /// Delete I/O Submission Queue (§5.6). Commands of the queue still outstanding in the model
    /// (delayed or dropped by a fault) complete first with Command Aborted due to SQ Deletion.
    fn delete_sq(&mut self, cmd: &Command) -> Status {
        let qid = cmd.cdw(10) as u16;
        if qid == 0 || self.sqs.get(qid as usize).is_none_or(Option::is_none) {
            return Status::INVALID_QID;
        }
        self.complete_outstanding(Status::ABORTED_SQ_DELETION, |c| c.sqid == qid);
        let sq = self.sqs[qid as usize].take().expect("checked above");
        if let Some(cq) = self.cqs[sq.cqid as usize].as_mut() {
            cq.sqs -= 1;
        }
        self.active_sqs.retain(|&q| q != qid);
        Status::SUCCESS
    }

    /// Delete I/O Completion Queue (§5.7): refused while submission queues use it.
    fn delete_cq(&mut self, cmd: &Command) -> Status {
        let qid = cmd.cdw(10) as u16;
        let Some(cq) = self
            .cqs
            .get(qid as usize)
            .and_then(Option::as_ref)
            .filter(|_| qid != 0)
        else {
            return Status::INVALID_QID;
        };
        if cq.sqs > 0 {
            return Status::INVALID_QUEUE_DELETION;
        }
        if !cq.backlog.is_empty() {
            log::debug!(
                "CQ {qid} deleted with {} completions never posted",
                cq.backlog.len()
            );
        }
        self.cqs[qid as usize] = None;
        self.active_cqs.retain(|&q| q != qid);
        Status::SUCCESS
    }

    /// Abort (§5.1): CDW10 SQID and CID. A command the model still holds (delayed, or dropped
    /// by a fault) completes with Command Abort Requested and Abort returns dword 0 bit 0 = 0;
    /// anything else (already completed, or never seen) gives bit 0 = 1, "not aborted".
    fn abort(&mut self, cmd: &Command) -> Outcome {
        let (sqid, cid) = (cmd.cdw(10) as u16, (cmd.cdw(10) >> 16) as u16);
        let n = self.complete_outstanding(Status::ABORT_REQUESTED, |c| c.sqid == sqid && c.orig_cid == cid);
        Outcome::Done(Status::SUCCESS, (n == 0) as u64)
    }

    /// Set Features (§5.27). Nothing is saveable (SV = 1 fails).
    fn set_features(&mut self, cmd: &Command) -> Outcome {
        let (fid, v) = (cmd.cdw(10) as u8, cmd.cdw(11));
        if cmd.cdw(10) >> 31 != 0 {
            return Status::FEATURE_NOT_SAVEABLE.into();
        }
        match fid {
            feature::NUMBER_OF_QUEUES => {
                let (nsqr, ncqr) = (v & 0xffff, v >> 16);
                if nsqr == 0xffff || ncqr == 0xffff {
                    return Status::INVALID_FIELD.into();
                }
                // §5.27.1.7: only before any I/O queue exists.
                if self.active_sqs.len() > 1 || self.active_cqs.len() > 1 {
                    return Status::COMMAND_SEQUENCE_ERROR.into();
                }
                let max = self.cfg.max_io_queue_pairs as u32;
                self.nq = ((nsqr + 1).min(max) as u16, (ncqr + 1).min(max) as u16);
                Outcome::Done(Status::SUCCESS, self.nq_dw0() as u64)
            }
            feature::VOLATILE_WRITE_CACHE if !self.cfg.volatile_write_cache => Status::INVALID_FIELD.into(),
            feature::VOLATILE_WRITE_CACHE => {
                self.features[fid as usize] = v & 1;
                Status::SUCCESS.into()
            }
            // One combination of command sets: index 0 (QEMU rejects any other the same way).
            feature::IO_COMMAND_SET_PROFILE if v & 0x1ff != 0 => Status::IOCS_COMBINATION_REJECTED.into(),
            feature::IO_COMMAND_SET_PROFILE => Status::SUCCESS.into(),
            // Only power state 0 exists (NPSS = 0).
            feature::POWER_MANAGEMENT if v & 0x1f != 0 => Status::INVALID_FIELD.into(),
            feature::ARBITRATION
            | feature::POWER_MANAGEMENT
            | feature::TEMPERATURE_THRESHOLD
            | feature::ERROR_RECOVERY
            | feature::INTERRUPT_COALESCING
            | feature::INTERRUPT_VECTOR_CONFIG
            | feature::WRITE_ATOMICITY
            | feature::ASYNC_EVENT_CONFIG => {
                self.features[fid as usize] = v;
                Status::SUCCESS.into()
            }
            _ => Status::INVALID_FIELD.into(),
        }
    }

    /// Number of Queues as dword 0 reports it: NSQA and NCQA, 0's based.
    fn nq_dw0(&self) -> u32 {
        (self.nq.0 as u32 - 1) | (self.nq.1 as u32 - 1) << 16
    }

    /// Get Features (§5.15): SEL 0 current, 1 default, 2 saved (= default), 3 capabilities
    /// (changeable, neither saveable nor namespace specific).
    fn get_features(&mut self, cmd: &Command) -> Outcome {
        let (fid, sel) = (cmd.cdw(10) as u8, (cmd.cdw(10) >> 8) & 0x7);
        let known = matches!(fid, 0x01 | 0x02 | 0x04..=0x0b | feature::IO_COMMAND_SET_PROFILE)
            && (fid != 0x06 || self.cfg.volatile_write_cache);
        if !known || sel > 3 {
            return Status::INVALID_FIELD.into();
        }
        let current = match fid {
            feature::NUMBER_OF_QUEUES => self.nq_dw0(),
            feature::IO_COMMAND_SET_PROFILE => 0,
            _ => self.features[fid as usize],
        };
        let dw0 = match sel {
            0 => current,
            3 => 1 << 2,
            _ if fid == feature::NUMBER_OF_QUEUES => {
                let max = self.cfg.max_io_queue_pairs as u32 - 1;
                max | max << 16
            }
            _ if fid == feature::IO_COMMAND_SET_PROFILE => 0,
            _ => self.cfg.feature_defaults()[fid as usize],
        };
        Outcome::Done(Status::SUCCESS, dw0 as u64)
    }

    /// Asynchronous Event Request (§5.2): up to AERL + 1 are held, each completed by one event
    /// (see the `events` module), or forgotten at a controller reset.
    fn async_event_request(&mut self, cmd: &Command) -> Outcome {
        if !self.events.hold(cmd.cid()) {
            return Status::AER_LIMIT_EXCEEDED.into();
        }
        self.deliver_events();
        Outcome::Pending
    }

    /// Doorbell Buffer Config (§5.8): PRP1 the Shadow Doorbell buffer, PRP2 the EventIdx buffer,
    /// each one page-aligned memory page. The entries of existing I/O queues are initialised with
    /// the current tail and head.
    fn doorbell_buffer_config(&mut self, cmd: &Command) -> Status {
        let (shadow, eventidx) = (cmd.prp1(), cmd.prp2());
        let page = self.page as usize;
        if shadow % self.page != 0 || eventidx % self.page != 0 {
            return Status::INVALID_FIELD;
        }
        if self.mem.check(shadow, page).is_err() || self.mem.check(eventidx, page).is_err() {
            return Status::INVALID_FIELD;
        }
        self.dbbuf = Some(DbBuf { shadow, eventidx });
        for i in 0..self.active_sqs.len() {
            self.init_shadow(self.active_sqs[i], false);
        }
        for i in 0..self.active_cqs.len() {
            self.init_shadow(self.active_cqs[i], true);
        }
        Status::SUCCESS
    }

    /// Zeroes the MMIO doorbell of a queue being created. The doorbell word of this model is
    /// memory and keeps the last value written, which may be a deleted queue's; a new queue's
    /// tail and head start at 0 (the host rings it only after the create command completes).
    fn clear_doorbell(&mut self, qid: u16, cq: bool) {
        self.bar
            .write32(off::DOORBELLS + self.db_index(qid, cq) as usize, 0);
    }

    /// Writes a queue's current tail (SQ) or head (CQ) into its shadow doorbell entry and the
    /// matching EventIdx, once Doorbell Buffer Config is in use (I/O queues only).
    fn init_shadow(&mut self, qid: u16, cq: bool) {
        let Some(db) = self.dbbuf.filter(|_| qid != 0) else {
            return;
        };
        let (value, size) = match cq {
            false => self.sqs[qid as usize].as_mut().map(|q| {
                q.shadow_db = q.tail;
                (q.tail, q.size)
            }),
            true => self.cqs[qid as usize].as_mut().map(|q| {
                q.shadow_db = q.head;
                (q.head, q.size)
            }),
        }
        .expect("queue exists");
        if let Err(e) = self.mem.write_u32(db.shadow + self.db_index(qid, cq), value) {
            self.fail(format_args!("shadow doorbell buffer: {e}"));
        }
        self.write_eventidx(qid, cq, value, size);
    }

    /// Format NVM (§5.14): CDW10 LBAF (bits 3:0, upper bits 13:12), MSET (bit 4), PI (bits
    /// 7:5), PIL (bit 8), SES (bits 11:9; 0-2 accepted, all erase alike). Formats one namespace,
    /// or all with NSID FFFFFFFFh (each must accept the format, or none changes). A format the
    /// namespace does not list, or one outside its MC and DPC capabilities, is Invalid Format,
    /// as is any format of a zoned namespace (as QEMU 7.2's `nvme_format_check`); a PI value
    /// over 3 is Invalid Field. A namespace whose format changed is reported with Namespace
    /// Attribute Changed.
    fn format(&mut self, cmd: &Command) -> Status {
        let dw10 = cmd.cdw(10);
        let index = (dw10 & 0xf) | ((dw10 >> 12) & 0x3) << 4;
        let (mset, pi, pil, ses) = (
            dw10 >> 4 & 1 != 0,
            (dw10 >> 5) & 0x7,
            dw10 >> 8 & 1 != 0,
            (dw10 >> 9) & 0x7,
        );
        if ses > 2 {
            return Status::INVALID_FIELD;
        }
        let targets: Vec<usize> = match cmd.nsid() {
            u32::MAX => (0..self.ns.len()).collect(),
            nsid => match self.ns_index(nsid) {
                Some(i) => vec![i],
                None => return Status::INVALID_NAMESPACE,
            },
        };
        let protection = PiType::from_code(pi as u8).map(|pi_type| Protection { pi_type, first: pil });
        let f = NamespaceFormat {
            index: index as u8,
            extended: mset,
            protection,
        };
        for &i in &targets {
            let ns = &self.ns[i];
            let lbaf = ns.formats.get(index as usize);
            if ns.cfg.zoned.is_some() || lbaf.is_none() {
                return Status::INVALID_FORMAT;
            }
            if pi != 0 && lbaf.is_some_and(|l| l.metadata_size < 8) {
                return Status::INVALID_FORMAT;
            }
            if pi > 3 {
                return Status::INVALID_FIELD;
            }
            if let Err(why) = ns.check_format(f) {
                log::debug!("Format NVM of namespace {}: {why}", ns.nsid);
                return Status::INVALID_FORMAT;
            }
        }
        for i in targets {
            let ns = self.ns[i].clone();
            if ns.format(f) {
                self.namespace_changed(ns.nsid);
            }
        }
        Status::SUCCESS
    }
}

fn insert_sorted(v: &mut Vec<u16>, q: u16) {
    let at = v.partition_point(|&x| x < q);
    v.insert(at, q);
}
