//! Controller bring-up, admin commands and shutdown (NVMe Base 2.0 §3.5, §5).
//!
//! Bring-up is a sequence of named, polled steps with deadlines from CAP.TO:
//! [`Controller::new`] runs `disable` → `admin queue` → `configure` → `enable` → `identify` →
//! `queues`. Dropping the last handle (the controller and every queue pair made from it) shuts
//! the controller down cleanly (CC.SHN, waits for CSTS.SHST).
//!
//! The controller's state ([`Shared`]) is defined here, above the modules whose types it holds
//! (`namespace`, `cmb`, `vectors`, `admin`), which import nothing from it. What acts on the
//! whole controller lives in this module's children, which see it as `super`: `reset`
//! (controller resets and recovery), `removal` (surprise removal), `namespaces` (Format NVM,
//! re-reading the namespace table, namespace events) and `memory_buffer` (enabling the CMB).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant};

use vfpoll_dma::{DmaContext, PageSize};
use vfpoll_pci::mmio::Mmio;
use vfpoll_pci::vfio::{Container, Device};
use vfpoll_pci::Bdf;

use crate::admin::{AdminQueue, DataDir};
use crate::cmd::{cns, feature, log_page, Command, CommandExt as _, Completion};
use crate::error::{NvmeError, Result};
use crate::identify::oacs;
use crate::identify::{parse_ns_list, ErrorLogEntry, IdentifyController, SmartLog};
use crate::namespace::{read_namespace, zasl_of};
pub use crate::namespace::{FormatOptions, Namespace};
use crate::qmem::ShadowPages;
use crate::regs::{self, off, Cap, Cc, Csts, Shutdown, ShutdownStatus, Version};
use crate::signal::{Registration, ShutdownKind, ShutdownLimits};
use reset::{FunctionReset, ResetPolicy, ResetState};

mod memory_buffer;
mod namespaces;
pub(crate) mod removal;
pub(crate) mod reset;

/// The memory page size vfpoll programs into CC.MPS.
pub const PAGE_SIZE: usize = 4096;

/// Options of [`Controller::new`].
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// Page size of the DMA memory for queues and the admin buffer: hugepages in production,
    /// [`PageSize::Base4K`] for device models and tests.
    pub page_size: PageSize,
    /// Admin queue entries (3..=4096): a ring of N entries holds N - 1 commands, and one of
    /// them may be the Asynchronous Event Request kept outstanding.
    pub admin_entries: u16,
    /// Deadline of one admin command.
    pub admin_timeout: Duration,
    /// I/O queue pairs to ask for with Set Features (Number of Queues); the controller may grant
    /// fewer.
    pub io_queues: u16,
    /// Use shadow doorbells (Doorbell Buffer Config, NVMe Base 2.0 §5.8) where the controller
    /// offers them (OACS bit 8): I/O queues write doorbell values to host memory, and the MMIO
    /// doorbell only when the controller's EventIdx asks for it. Emulated and virtual
    /// controllers save most of their MMIO exits this way. Applies to every I/O queue pair of
    /// the controller (a controller with the buffer configured reads doorbells from it).
    pub shadow_doorbells: bool,
    /// When controller resets are given up on (back-off, storm bound, failed attempts).
    pub reset: ResetPolicy,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            page_size: PageSize::Huge2M,
            admin_entries: 32,
            admin_timeout: Duration::from_secs(10),
            io_queues: 64,
            shadow_doorbells: true,
            reset: ResetPolicy::default(),
        }
    }
}

pub(crate) struct Shared {
    pub bar: Mmio,
    pub cap: Cap,
    pub version: Version,
    pub dma: DmaContext,
    pub opts: ControllerOptions,
    /// `None` only after a failed shutdown leaked the queue's memory.
    pub(crate) admin: Mutex<Option<AdminQueue>>,
    pub identify: IdentifyController,
    /// The active namespaces; replaced whole when they change (format, namespace notices).
    pub(crate) namespaces: RwLock<Arc<[Namespace]>>,
    /// Bumped after each change of `namespaces`: queue pairs compare it with the generation
    /// of their own view before each submission (one relaxed load).
    pub(crate) ns_gen: AtomicU64,
    /// Whether controller-wide changes to the queues are barred (a Format NVM is running).
    pub(crate) formatting: AtomicBool,
    /// The controller runs several I/O command sets (CC.CSS = 110b).
    pub(crate) io_command_sets: bool,
    /// Zone Append Size Limit, for zoned namespaces.
    pub(crate) zasl: Option<usize>,
    /// I/O submission/completion queues granted by the controller.
    pub io_queues_granted: u16,
    pub(crate) qids: Mutex<Vec<bool>>,
    /// The controller's place in the signal handler's registry. Dropped first (declared before
    /// the memory), right after the shutdown in `Drop`.
    registration: Mutex<Option<Registration>>,
    /// How long shutdown may take (RTD3E, CAP.TO).
    shutdown_limits: ShutdownLimits,
    /// The controller memory buffer, once enabled.
    pub(crate) cmb: Mutex<Option<Arc<crate::cmb::Cmb>>>,
    /// The Doorbell Buffer Config pages, when in use.
    pub(crate) shadow: Option<Arc<ShadowPages>>,
    /// Interrupt vectors, once an interrupt-mode queue pair asked for them (`qpair/wait.rs`).
    pub(crate) vectors: Mutex<Option<Arc<crate::vectors::Vectors>>>,
    /// Resets: the epoch queue pairs compare, failure, history (`reset.rs`).
    pub(crate) reset: ResetState,
    /// The Asynchronous Event Configuration set at bring-up (re-applied after a reset).
    pub(crate) aen_config: Option<u32>,
    /// Features set through `Controller::set_feature`, re-applied after a reset.
    pub(crate) features: Mutex<Vec<(u8, u32)>>,
    /// A function reset for controllers VFIO did not open.
    pub(crate) function_reset: Mutex<Option<FunctionReset>>,
    /// This `Shared`, for the recovery thread.
    pub(crate) me: Weak<Shared>,
    /// The device's removal: the watch, the request, the report (`removal.rs`).
    pub(crate) removal: removal::Removal,
    pub(crate) device: Option<Device>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("serial", &self.identify.serial)
            .field("model", &self.identify.model)
            .field("version", &self.version)
            .field(
                "namespaces",
                &self.namespaces().iter().map(|n| n.nsid).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// An NVMe controller, brought up and ready for I/O queue pairs.
///
/// Cheap to clone; `Send + Sync`. Admin commands are serialised internally. I/O goes through
/// [`crate::QueuePair`]s, one per thread.
#[derive(Debug, Clone)]
pub struct Controller {
    pub(crate) shared: Arc<Shared>,
}

fn csts(bar: &Mmio) -> Csts {
    Csts(bar.read32(off::CSTS))
}

/// Polls CSTS until `done` holds or CAP.TO passes.
pub(crate) fn wait_csts(
    bar: &Mmio,
    cap: Cap,
    step: &'static str,
    done: impl FnMut(Csts) -> bool,
) -> Result<()> {
    wait_csts_for(bar, Duration::from_millis(cap.timeout_ms().max(500)), step, done)
}

/// Polls CSTS until `done` holds or `limit` passes.
fn wait_csts_for(
    bar: &Mmio,
    limit: Duration,
    step: &'static str,
    mut done: impl FnMut(Csts) -> bool,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let s = csts(bar);
        if s.device_gone() {
            return Err(NvmeError::DeviceGone);
        }
        if done(s) {
            return Ok(());
        }
        if s.fatal() && step != "disable" {
            return Err(NvmeError::ControllerFatal { csts: s.0 });
        }
        let waited = start.elapsed();
        if waited > limit {
            return Err(NvmeError::InitTimeout {
                step,
                waited,
                limit,
                csts: s.0,
            });
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

impl Controller {
    /// Opens `bdf` through `container` (its IOMMU group is attached if needed), enables bus
    /// mastering, maps BAR0 and brings the controller up, with DMA memory from `dma`.
    ///
    /// `dma` must be the context of `container` (made with `DmaContext::new(container.clone())`
    /// *after* the first device was opened, so that it knows the IOMMU's IOVA ranges); use
    /// [`Controller::open_first`] when this is the container's first device.
    pub fn open(
        container: &Arc<Container>,
        bdf: Bdf,
        dma: DmaContext,
        opts: ControllerOptions,
    ) -> Result<Self> {
        let device = container.device(bdf)?;
        Self::from_device(device, dma, opts)
    }

    /// Opens `bdf` as the first device of `container` and makes the container's DMA context,
    /// which later devices of the same container share (returned beside the controller).
    pub fn open_first(
        container: &Arc<Container>,
        bdf: Bdf,
        opts: ControllerOptions,
    ) -> Result<(Self, DmaContext)> {
        let device = container.device(bdf)?;
        let dma = DmaContext::new(container.clone());
        Ok((Self::from_device(device, dma.clone(), opts)?, dma))
    }

    fn from_device(device: Device, dma: DmaContext, opts: ControllerOptions) -> Result<Self> {
        let info = vfpoll_pci::sysfs::device(device.container().host(), device.bdf())
            .map_err(vfpoll_pci::vfio::VfioError::from)?;
        if !info.is_nvme() {
            return Err(NvmeError::Unsupported(format!(
                "{} is not an NVMe controller (class {:#08x}, expected 0x010802)",
                device.bdf(),
                info.class
            )));
        }
        device.enable_bus_master()?;
        let bar = crate::regs::map_bar(&device, 0)?;
        let ctrl = Self::bring_up(bar, dma, opts, Some(device))?;
        removal::start_watch(&ctrl.shared);
        Ok(ctrl)
    }

    /// Brings up the controller whose BAR0 is `bar` (a VFIO mapping, or a device model's).
    pub fn new(bar: Mmio, dma: DmaContext, opts: ControllerOptions) -> Result<Self> {
        Self::bring_up(bar, dma, opts, None)
    }

    fn bring_up(bar: Mmio, dma: DmaContext, opts: ControllerOptions, device: Option<Device>) -> Result<Self> {
        if !(3..=4096).contains(&opts.admin_entries) {
            return Err(NvmeError::InvalidOption(format!(
                "admin queue entries {} not in 3..=4096 (a ring of N entries holds N - 1 commands, and one may be the Asynchronous Event Request kept outstanding)",
                opts.admin_entries
            )));
        }
        let cap = Cap(bar.read64(off::CAP));
        let version = Version(bar.read32(off::VS));
        if cap.0 == u64::MAX {
            return Err(NvmeError::DeviceGone);
        }
        log::debug!("CAP {cap:?}, VS {version}");
        if cap.command_sets() & 1 == 0 {
            return Err(NvmeError::Unsupported("CAP.CSS lacks the NVM command set".into()));
        }
        if cap.mps_min() > PAGE_SIZE || cap.mps_max() < PAGE_SIZE {
            return Err(NvmeError::Unsupported(format!(
                "memory page sizes {}..={} exclude 4 KiB",
                cap.mps_min(),
                cap.mps_max()
            )));
        }
        let admin_entries = opts.admin_entries.min(cap.max_queue_entries().min(4096) as u16);

        // §3.5.1 step 1 (and §3.5.2): a controller left enabled is disabled first; CC.EN 1 → 0
        // resets it, and CSTS.RDY follows within CAP.TO.
        let cc = Cc(bar.read32(off::CC));
        if cc.enabled() {
            // If RDY has not caught up with EN yet, wait for it first (§3.1.3.5: changing EN
            // while RDY differs from it is undefined).
            wait_csts(&bar, cap, "disable", |s| s.ready())?;
            bar.write32(off::CC, cc.with_enable(false).0);
        }
        wait_csts(&bar, cap, "disable", |s| !s.ready())?;
        // Mask every pin-based/MSI vector (§3.1.3.3): interrupt-mode queue pairs unmask their own
        // (MSI), or use MSI-X, which INTMS does not mask (qpair/wait.rs).
        bar.write32(off::INTMS, u32::MAX);

        // §3.5.1 step 2: the admin queue.
        let (admin, asq, acq) = AdminQueue::new(
            &bar,
            cap.doorbell_stride(),
            &dma,
            opts.page_size,
            admin_entries,
            opts.admin_timeout,
        )?;
        bar.write32(off::AQA, regs::aqa(admin_entries as u32, admin_entries as u32));
        bar.write64(off::ASQ, asq.get());
        bar.write64(off::ACQ, acq.get());

        // §3.5.1 steps 3-4: 4 KiB pages, 64 B SQEs and 16 B CQEs, round robin; the NVM command
        // set, or every I/O command set the controller supports (CC.CSS = 110b) when CAP.CSS
        // bit 6 says it has several (zoned namespaces need it, §3.1.3.5).
        let io_command_sets = cap.command_sets() & (1 << 6) != 0;
        let cc = Cc(0)
            .with_command_set(if io_command_sets { 0b110 } else { 0 })
            .with_page_size(PAGE_SIZE)
            .with_entry_sizes(6, 4);
        bar.write32(off::CC, cc.0);
        // §3.5.1 steps 5-6: enable and wait for ready. From here on, a failure disables the
        // controller before the admin queue's memory is released (the guard).
        let mut guard = EnabledGuard {
            bar: bar.clone(),
            cap,
            admin: Some(admin),
        };
        bar.write32(off::CC, cc.with_enable(true).0);
        wait_csts(&bar, cap, "enable", |s| s.ready())?;

        let admin = guard.admin.as_mut().expect("set above");
        // §3.5.1 step 7: Identify Controller.
        let mut page = vec![0u8; 4096];
        let ident = Command::identify(cns::CONTROLLER, 0);
        admin.exec(
            "Identify Controller",
            ident,
            DataDir::FromDevice(4096),
            &[],
            &mut || check_csts(&bar),
        )?;
        admin.read_data(&mut page);
        let identify = IdentifyController::parse(&page);
        log::debug!("{identify:?}");
        if identify.sqes & 0xf > 6 || identify.cqes & 0xf > 4 {
            return Err(NvmeError::Unsupported(format!(
                "entry sizes SQES={:#x} CQES={:#x}",
                identify.sqes, identify.cqes
            )));
        }

        // §3.5.1 step 9: the active namespaces and their formats.
        let list = Command::identify(cns::ACTIVE_NS_LIST, 0);
        admin.exec(
            "Identify Active Namespaces",
            list,
            DataDir::FromDevice(4096),
            &[],
            &mut || check_csts(&bar),
        )?;
        admin.read_data(&mut page);
        let mut namespaces = Vec::new();
        let mut exec = |op: &'static str, cmd: Command| -> Result<Vec<u8>> {
            admin.exec(op, cmd, DataDir::FromDevice(4096), &[], &mut || check_csts(&bar))?;
            let mut p = vec![0u8; 4096];
            admin.read_data(&mut p);
            Ok(p)
        };
        let zasl = if io_command_sets {
            zasl_of(&mut exec, &cap)?
        } else {
            None
        };
        for nsid in parse_ns_list(&page) {
            if let Some(ns) = read_namespace(&mut exec, nsid, &identify, io_command_sets, zasl)? {
                namespaces.push(ns);
            }
        }
        let admin = guard.admin.as_mut().expect("set above");

        // §3.5.1 step 11: how many I/O queues (0's based in and out, §5.27.1.5).
        let want = opts.io_queues.max(1) as u32 - 1;
        let c = admin.exec(
            "Set Features (Number of Queues)",
            Command::set_features(feature::NUMBER_OF_QUEUES, want | (want << 16)),
            DataDir::None,
            &[],
            &mut || check_csts(&bar),
        )?;
        let granted = ((c.dw0 & 0xffff).min(c.dw0 >> 16) + 1).min(opts.io_queues.max(1) as u32) as u16;
        log::debug!("I/O queues: asked {}, granted {granted}", want + 1);

        // Shadow doorbells (§5.8): two zeroed pages, configured before any I/O queue exists.
        let mut shadow = None;
        if opts.shadow_doorbells && identify.oacs & oacs::DBBUF != 0 {
            let pages = ShadowPages::new(dma.alloc_region(2 * PAGE_SIZE, opts.page_size)?, PAGE_SIZE);
            let (db, ei) = pages.bus(PAGE_SIZE);
            let cmd = Command::doorbell_buffer_config(db, ei);
            match admin.exec("Doorbell Buffer Config", cmd, DataDir::None, &[], &mut || {
                check_csts(&bar)
            }) {
                Ok(_) => shadow = Some(Arc::new(pages)),
                Err(e @ NvmeError::Status { .. }) => log::warn!("shadow doorbells not used: {e}"),
                Err(e) => return Err(e),
            }
        }

        // Namespace Attribute Notices (§5.2, §5.27.1.7): one Asynchronous Event Request stays
        // outstanding, so a format or a namespace change elsewhere in the subsystem reaches
        // `process_events`.
        let mut aen_config = None;
        // Not with an admin queue of 2 entries (a controller's MQES can cut it to that): the
        // request would hold its one usable slot, and no other command could be submitted.
        if identify.namespace_attribute_notices() && admin.entries() > 2 {
            let cmd = Command::set_features(feature::ASYNC_EVENT_CONFIG, 1 << 8);
            match admin.exec(
                "Set Features (Asynchronous Event Configuration)",
                cmd,
                DataDir::None,
                &[],
                &mut || check_csts(&bar),
            ) {
                Ok(_) => {
                    admin.arm_event()?;
                    aen_config = Some(1 << 8);
                }
                Err(e @ NvmeError::Status { .. }) => log::warn!("namespace attribute notices not used: {e}"),
                Err(e) => return Err(e),
            }
        }

        let admin = guard.admin.take().expect("still there");
        let shutdown_limits = ShutdownLimits::new(cap, identify.rtd3e);
        let registration = Registration::new(&bar, shutdown_limits);
        Ok(Controller {
            shared: Arc::new_cyclic(|me| Shared {
                bar,
                cap,
                version,
                dma,
                opts,
                admin: Mutex::new(Some(admin)),
                identify,
                namespaces: RwLock::new(namespaces.into()),
                ns_gen: AtomicU64::new(0),
                formatting: AtomicBool::new(false),
                io_command_sets,
                zasl,
                io_queues_granted: granted,
                qids: Mutex::new(vec![false; granted as usize + 1]),
                shadow,
                vectors: Mutex::new(None),
                cmb: Mutex::new(None),
                registration: Mutex::new(Some(registration)),
                shutdown_limits,
                reset: ResetState::default(),
                aen_config,
                features: Mutex::new(Vec::new()),
                function_reset: Mutex::new(None),
                me: me.clone(),
                removal: Default::default(),
                device,
            }),
        })
    }

    /// CAP.
    pub fn cap(&self) -> Cap {
        self.shared.cap
    }

    /// How long a shutdown of this controller may take: the normal one (RTD3E, or CAP.TO), then
    /// the abrupt fallback (NVMe Base 2.0 §3.6).
    pub fn shutdown_limits(&self) -> ShutdownLimits {
        self.shared.shutdown_limits
    }

    /// VS.
    pub fn version(&self) -> Version {
        self.shared.version
    }

    /// Identify Controller, as read at bring-up.
    pub fn identify(&self) -> &IdentifyController {
        &self.shared.identify
    }

    /// The active namespaces: read at bring-up, again after a Format NVM through
    /// [`Controller::format_with`] and after a Namespace Attribute Changed notice
    /// ([`Controller::process_events`]).
    pub fn namespaces(&self) -> Arc<[Namespace]> {
        self.shared.namespaces()
    }

    /// One namespace, or [`NvmeError::NoSuchNamespace`].
    pub fn namespace(&self, nsid: u32) -> Result<Namespace> {
        self.shared.namespace(nsid)
    }

    /// MDTS in bytes (`None` = the controller sets no limit).
    pub fn mdts_bytes(&self) -> Option<usize> {
        self.shared.identify.mdts_bytes(self.shared.cap.mps_min())
    }

    /// How many I/O queue pairs the controller granted.
    pub fn io_queues_granted(&self) -> u16 {
        self.shared.io_queues_granted
    }

    /// Whether I/O queues use shadow doorbells.
    pub fn shadow_doorbells(&self) -> bool {
        self.shared.shadow.is_some()
    }

    /// The VFIO device, when opened through VFIO. Crate-private: the device could map BAR0
    /// writable or reset the function under the driver.
    pub(crate) fn device(&self) -> Option<&Device> {
        self.shared.device.as_ref()
    }

    /// The PCI address, when opened through VFIO.
    pub fn bdf(&self) -> Option<Bdf> {
        self.device().map(Device::bdf)
    }

    /// The interrupts the controller offers at VFIO index `index` (MSI-X, MSI, INTx), when
    /// opened through VFIO (`None` otherwise).
    pub fn irq_info(&self, index: vfpoll_pci::vfio::IrqIndex) -> Result<Option<vfpoll_pci::vfio::IrqInfo>> {
        self.device()
            .map(|d| d.irq_info(index))
            .transpose()
            .map_err(NvmeError::from)
    }

    /// The DMA context the controller allocates from.
    pub fn dma(&self) -> &DmaContext {
        &self.shared.dma
    }

    /// A read-only view of the controller's registers. Register writes stay inside the driver:
    /// a write to ASQ, ACQ, CMBMSC or a doorbell could aim the controller's DMA anywhere.
    pub fn registers(&self) -> Registers<'_> {
        Registers(&self.shared.bar)
    }

    /// CSTS now.
    pub fn status(&self) -> Csts {
        csts(&self.shared.bar)
    }

    /// Whether `other` is a handle to the same controller.
    pub fn same_as(&self, other: &Controller) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Runs an admin command as it is. `dir` says whether data flows; `data` is what is sent
    /// for [`DataDir::ToDevice`]; for [`DataDir::FromDevice`] the returned vector holds the
    /// data. The driver puts a data pointer to its own admin data buffer in CDW6-9 when data
    /// flows; the command's other fields go to the controller untouched.
    ///
    /// # Safety
    /// Raw passthrough: nothing checks what the command makes the controller do. It must not
    /// move more than `len` bytes through the data pointer (`FromDevice(len)`, or `data.len()`
    /// for `ToDevice`), and any address the caller put in the command (CDW4-5 metadata
    /// pointer, CDW6-9 with `DataDir::None`, CDW10-15 of commands that carry addresses such as
    /// Doorbell Buffer Config, Set Features of the Host Memory Buffer or a queue creation) must
    /// be memory the controller may access for as long as it uses it. The command may also
    /// destroy data (Format NVM, Sanitize) or change the controller's state under the driver
    /// (deleting its queues, changing the number of queues).
    pub unsafe fn admin_raw(&self, cmd: Command, dir: DataDir, data: &[u8]) -> Result<(Completion, Vec<u8>)> {
        self.shared.admin_exec("admin command", cmd, dir, data)
    }

    /// Identify with any CNS; returns the 4096-byte page.
    pub fn identify_raw(&self, cns: u32, nsid: u32) -> Result<Vec<u8>> {
        Ok(self
            .shared
            .admin_exec(
                "Identify",
                Command::identify(cns, nsid),
                DataDir::FromDevice(4096),
                &[],
            )?
            .1)
    }

    /// Get Features (current value): returns CDW0. Only features that move no data and whose
    /// CDW11 holds no address (see [`feature::without_data`]); the others need
    /// [`Controller::admin_raw`].
    pub fn get_feature(&self, fid: u8) -> Result<u32> {
        feature_checked(fid)?;
        Ok(self
            .shared
            .admin_exec("Get Features", Command::get_features(fid), DataDir::None, &[])?
            .0
            .dw0)
    }

    /// Set Features: returns CDW0. Only features that move no data (see
    /// [`feature::without_data`]); the others need [`Controller::admin_raw`]. Number of Queues
    /// is refused too: the driver sized its queues by it at bring-up; so is an Asynchronous
    /// Event Configuration without the Namespace Attribute Notices the driver turned on.
    pub fn set_feature(&self, fid: u8, dw11: u32) -> Result<u32> {
        feature_checked(fid)?;
        if fid == feature::NUMBER_OF_QUEUES {
            return Err(NvmeError::InvalidOption(
                "Number of Queues can only be set before the controller's first I/O queue (bring-up does it: ControllerOptions::io_queues)".into(),
            ));
        }
        // The driver keeps namespace geometry true through Namespace Attribute Notices
        // (Asynchronous Event Configuration, feature 0Bh, bit 8): switching them off
        // would leave queue pairs on a stale format after a change elsewhere in the subsystem.
        if let Some(needed) = self
            .shared
            .aen_config
            .filter(|&b| fid == feature::ASYNC_EVENT_CONFIG && dw11 & b != b)
        {
            return Err(NvmeError::InvalidOption(format!(
                "Asynchronous Event Configuration {dw11:#x} would switch off the notices the driver relies on ({needed:#x}: Namespace Attribute Notices, which keep namespace formats current): set those bits too"
            )));
        }
        let dw0 = self
            .shared
            .admin_exec(
                "Set Features",
                Command::set_features(fid, dw11),
                DataDir::None,
                &[],
            )?
            .0
            .dw0;
        // Kept for a reset, which reverts features to their defaults (§3.7.2).
        let mut kept = self.shared.features.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|&(f, _)| f != fid);
        kept.push((fid, dw11));
        Ok(dw0)
    }

    /// Turns the volatile write cache on or off (Set Features 06h).
    pub fn set_volatile_write_cache(&self, on: bool) -> Result<()> {
        if !self.shared.identify.has_volatile_write_cache() {
            return Err(NvmeError::Unsupported(
                "the controller has no volatile write cache".into(),
            ));
        }
        self.set_feature(feature::VOLATILE_WRITE_CACHE, on as u32)
            .map(|_| ())
    }

    /// Get Log Page: `len` bytes (a multiple of 4) of log `lid` for `nsid`.
    pub fn log_page(&self, lid: u8, nsid: u32, len: usize) -> Result<Vec<u8>> {
        if len == 0 || !len.is_multiple_of(4) {
            return Err(NvmeError::InvalidOption(format!(
                "log page length {len} must be a non-zero multiple of 4"
            )));
        }
        let cmd = Command::get_log_page(lid, nsid, (len / 4) as u32, 0);
        Ok(self
            .shared
            .admin_exec("Get Log Page", cmd, DataDir::FromDevice(len), &[])?
            .1)
    }

    /// The SMART / Health Information log (controller-wide).
    pub fn smart_log(&self) -> Result<SmartLog> {
        Ok(SmartLog::parse(&self.log_page(
            log_page::SMART,
            0xffff_ffff,
            512,
        )?))
    }

    /// The Error Information log: the non-empty entries, newest first.
    pub fn error_log(&self) -> Result<Vec<ErrorLogEntry>> {
        let n = (self.shared.identify.elpe as usize + 1).min(64);
        let page = self.log_page(log_page::ERROR, 0, n * ErrorLogEntry::SIZE)?;
        Ok(page
            .chunks_exact(ErrorLogEntry::SIZE)
            .map(ErrorLogEntry::parse)
            .filter(|e| e.error_count != 0)
            .collect())
    }

    /// Asks the controller to abort command `cid` of queue `sqid`. Returns whether it says it
    /// aborted it (CDW0 bit 0 clear).
    pub fn abort(&self, sqid: u16, cid: u16) -> Result<bool> {
        let (c, _) = self
            .shared
            .admin_exec("Abort", Command::abort(sqid, cid), DataDir::None, &[])?;
        Ok(c.dw0 & 1 == 0)
    }
}

impl Shared {
    pub(crate) fn namespaces(&self) -> Arc<[Namespace]> {
        Arc::clone(&self.namespaces.read().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn namespace(&self, nsid: u32) -> Result<Namespace> {
        let all = self.namespaces();
        all.iter()
            .find(|n| n.nsid == nsid)
            .cloned()
            .ok_or_else(|| NvmeError::NoSuchNamespace {
                nsid,
                active: all.iter().map(|n| n.nsid).collect(),
            })
    }

    /// Keeps one Asynchronous Event Request outstanding.
    pub(crate) fn arm_event(&self) -> Result<()> {
        let mut guard = self.admin_lock();
        match guard.as_mut() {
            Some(q) => q.arm_event(),
            None => Ok(()),
        }
    }

    pub(crate) fn admin_lock(&self) -> MutexGuard<'_, Option<AdminQueue>> {
        self.admin.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn admin_exec(
        &self,
        op: &'static str,
        cmd: Command,
        dir: DataDir,
        data: &[u8],
    ) -> Result<(Completion, Vec<u8>)> {
        let op = if op == "admin command" {
            crate::admin::name_of(cmd.opcode())
        } else {
            op
        };
        self.with_admin(|q, _| {
            let c = q.exec(op, cmd, dir, data, &mut || check_csts(&self.bar))?;
            let mut out = Vec::new();
            if let DataDir::FromDevice(n) = dir {
                out.resize(n, 0);
                q.read_data(&mut out);
            }
            Ok((c, out))
        })
    }

    /// Runs `f` on the admin queue with the reset epoch, while the controller runs (refused
    /// when it failed or is down): several commands under one hold, with no reset between
    /// them. A command that times out or a fatal status asks for a reset afterwards.
    pub(crate) fn with_admin<T>(&self, f: impl FnOnce(&mut AdminQueue, u64) -> Result<T>) -> Result<T> {
        let mut guard = self.admin_lock();
        let q = guard
            .as_mut()
            .ok_or_else(|| NvmeError::Failed("the admin queue was lost in a failed shutdown".into()))?;
        let epoch = self.reset.epoch.load(Ordering::Acquire);
        if let Some(f) = self.reset.failure() {
            return Err(NvmeError::Failed(f.why.clone()));
        }
        if !reset::is_up(epoch) {
            return Err(NvmeError::Failed(
                "the controller is down after a failed reset attempt (recovery retries it; Controller::failed() says when it gives up)".into(),
            ));
        }
        let r = f(q, epoch);
        drop(guard);
        if let Err(e) = &r {
            self.after_admin_error(e, epoch);
        }
        r
    }

    /// What an admin command's failure says about the controller: a stuck command or a fatal
    /// status needs a reset, all-ones reads mean it is gone.
    pub(crate) fn after_admin_error(&self, e: &NvmeError, epoch: u64) {
        match e {
            NvmeError::Timeout { .. } | NvmeError::ControllerFatal { .. } => {
                self.request_reset(e.to_string(), epoch)
            }
            NvmeError::DeviceGone => self.fail(e.to_string(), true),
            _ => {}
        }
    }

    /// Takes a free I/O queue id.
    pub(crate) fn alloc_qid(&self) -> Result<u16> {
        let mut q = self.qids.lock().unwrap_or_else(|e| e.into_inner());
        if self.formatting.load(Ordering::SeqCst) {
            return Err(NvmeError::InvalidOption(
                "a Format NVM is running on this controller: create the queue pair once it is done".into(),
            ));
        }
        match q.iter().skip(1).position(|used| !used) {
            Some(i) => {
                q[i + 1] = true;
                Ok(i as u16 + 1)
            }
            None => Err(NvmeError::InvalidOption(format!(
                "all {} I/O queue pairs the controller granted are in use",
                self.io_queues_granted
            ))),
        }
    }

    pub(crate) fn free_qid(&self, qid: u16) {
        let mut q = self.qids.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = q.get_mut(qid as usize) {
            *u = false;
        }
    }

    /// Shutdown (§3.6.1, §3.6.2): CC.SHN = 01b and a wait of up to RTD3E for CSTS.SHST = 10b;
    /// if it does not come, CC.SHN = 10b (abrupt) and a short wait; then CC.EN is cleared so
    /// the controller does no more DMA before its memory is released. Returns which shutdown
    /// completed.
    fn shutdown(&self) -> Result<ShutdownKind> {
        let limits = self.shutdown_limits;
        let complete = |s: Csts| s.shutdown_status() == ShutdownStatus::Complete;
        let set_shn = |shn| {
            let cc = Cc(self.bar.read32(off::CC));
            self.bar.write32(off::CC, cc.with_shutdown(shn).0);
        };
        set_shn(Shutdown::Normal);
        let r = match wait_csts_for(&self.bar, limits.normal, "normal shutdown", complete) {
            Ok(()) => Ok(ShutdownKind::Normal),
            Err(NvmeError::InitTimeout { waited, .. }) => {
                log::warn!(
                    "controller {}: normal shutdown not complete after {waited:?} (RTD3E {} us); shutting down abruptly",
                    self.identify.serial,
                    self.identify.rtd3e
                );
                set_shn(Shutdown::Abrupt);
                wait_csts_for(&self.bar, limits.abrupt, "abrupt shutdown", complete)
                    .map(|()| ShutdownKind::Abrupt)
            }
            Err(e) => Err(e),
        };
        self.bar
            .write32(off::CC, Cc(self.bar.read32(off::CC)).with_enable(false).0);
        let disabled = wait_csts(&self.bar, self.cap, "disable", |s| !s.ready());
        r.and_then(|k| disabled.map(|()| k))
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // No removal handler runs from here on (it holds only a weak handle).
        self.removal.stop_watch();
        // Out of the signal handler's reach before the shutdown starts.
        drop(
            self.registration
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        if self.removal.requested() {
            // Released: nothing left to shut down, and it can no longer write to memory.
            log::debug!("controller {} was removed: no shutdown", self.identify.serial);
            return;
        }
        match self.shutdown() {
            Ok(ShutdownKind::Normal) => log::debug!("controller {} shut down", self.identify.serial),
            Ok(ShutdownKind::Abrupt) => log::warn!(
                "controller {} shut down abruptly (the normal shutdown did not complete in {:?})",
                self.identify.serial,
                self.shutdown_limits.normal
            ),
            Err(e) => {
                // The controller may still write into the admin queue: never free that memory.
                log::error!(
                    "controller {} did not shut down cleanly ({e}); leaking its admin queue memory",
                    self.identify.serial
                );
                if let Some(q) = self.admin.get_mut().unwrap_or_else(|e| e.into_inner()).as_mut() {
                    q.leak();
                }
                // The controller may also still write EventIdx values.
                std::mem::forget(self.shadow.take());
            }
        }
    }
}

/// A feature the safe Get/Set Features may touch.
fn feature_checked(fid: u8) -> Result<()> {
    if feature::without_data(fid) {
        Ok(())
    } else {
        Err(NvmeError::InvalidOption(format!(
            "feature {fid:#04x} moves data or carries addresses (or is vendor specific): use the unsafe Controller::admin_raw"
        )))
    }
}

/// A read-only view of BAR0 (NVMe Base 2.0 §3.1.3): registers can be read, never written,
/// through it.
#[derive(Debug, Clone, Copy)]
pub struct Registers<'a>(&'a Mmio);

impl Registers<'_> {
    /// The 32-bit register at `off`.
    pub fn read32(&self, off: usize) -> u32 {
        self.0.read32(off)
    }

    /// The 64-bit register at `off`.
    pub fn read64(&self, off: usize) -> u64 {
        self.0.read64(off)
    }

    /// Where BAR0 is mapped (for code that must find the registers without a `Controller`,
    /// such as a signal handler; writing through it is the caller's own `unsafe`).
    pub fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
}

pub(crate) fn check_csts(bar: &Mmio) -> Result<()> {
    let s = csts(bar);
    if s.device_gone() {
        Err(NvmeError::DeviceGone)
    } else if s.fatal() {
        Err(NvmeError::ControllerFatal { csts: s.0 })
    } else {
        Ok(())
    }
}

/// Disables the controller if bring-up fails after CC.EN was set, before the admin queue's
/// memory is released; if even that fails, the memory is leaked rather than freed under a
/// controller that may still write to it.
struct EnabledGuard {
    bar: Mmio,
    cap: Cap,
    admin: Option<AdminQueue>,
}

impl Drop for EnabledGuard {
    fn drop(&mut self) {
        if let Some(admin) = self.admin.take() {
            self.bar
                .write32(off::CC, Cc(self.bar.read32(off::CC)).with_enable(false).0);
            if let Err(e) = wait_csts(&self.bar, self.cap, "disable", |s| !s.ready()) {
                log::error!("bring-up failed and the controller did not disable ({e}); leaking its admin queue memory");
                let mut admin = admin;
                admin.leak();
            }
        }
    }
}
