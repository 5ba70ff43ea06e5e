//! What `vfpoll target` serves, as a [`Plan`]: built from the command line or from a TOML file
//! (`--config`), checked as a whole before anything is opened, and compared with the running
//! plan when the file is reloaded (SIGHUP).
//!
//! ```toml
//! cores = "1-2"            # one pinned worker per core (default: one unpinned worker)
//! page_size = "2M"         # data buffer pages: 2M or 1G (4K behind an IOMMU)
//! noiommu = false          # VFIO no-IOMMU mode for NVMe namespaces
//! spin_us = 100            # polling after the last work before a worker sleeps
//! nvme_completion = "irq"  # irq: NVMe queue pairs interrupt, so a worker past its spin time
//!                          # sleeps until a completion; poll: no interrupts, it naps and polls
//!
//! [[listener]]
//! address = "127.0.0.1:4420"
//! port_id = 1              # default: its place in the file, from 1
//! ana_state = "optimized"  # ANA state of every group through this listener (multipath):
//!                          # optimized, non-optimized, inaccessible, persistent-loss, change
//!
//! [[subsystem]]
//! nqn = "nqn.2024-01.io.example:disks"
//! serial = "..."           # default: derived from the NQN (stable across restarts)
//! model = "vfpoll"
//! allow_hosts = ["nqn.2014-08.org.nvmexpress:uuid:..."]   # default: any host
//!
//! [[subsystem.namespace]]
//! nsid = 1                 # default: the next free NSID
//! nvme = "0000:00:03.0/1"  # an NVMe namespace (BDF/NSID, bound to vfio-pci)
//! ana_group = 1            # its ANA group (1 to 128, default 1)
//!
//! [[subsystem.namespace]]
//! malloc = "64M"           # or RAM
//! block_size = 512
//!
//! [[subsystem.host]]
//! nqn = "nqn.2014-08.org.nvmexpress:uuid:..."
//! dhchap_secret = "DHHC-1:01:...:"       # the host must authenticate (DH-HMAC-CHAP); the
//! dhchap_ctrl_secret = "DHHC-1:01:...:"  # file must then be chmod 600
//! ```

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde::Deserialize;
use vfpoll_dma::PageSize;
use vfpoll_engine::affinity::parse_cores;
use vfpoll_nvmf::auth::HostAuth;
use vfpoll_nvmf::fabrics::{validate_nqn, AnaState, Limits, Listener, RateLimit, ANAGRPMAX};
use vfpoll_nvmf::server::DEFAULT_SPIN;
use vfpoll_pci::Bdf;

use crate::units::{parse_nonzero_bytes, parse_page_size};

/// The subsystem NQN when none is given.
pub const DEFAULT_NQN: &str = "nqn.2024-01.io.vfpoll:target";
/// The listener when none is given: loopback, the NVMe/TCP port.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:4420";

/// Where a namespace's blocks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Namespace `nsid` of the NVMe controller at `bdf` (bound to vfio-pci).
    Nvme {
        /// The controller.
        bdf: Bdf,
        /// Its namespace.
        nsid: u32,
    },
    /// RAM: `bytes` in blocks of `block_size`.
    Malloc {
        /// Size in bytes.
        bytes: u64,
        /// 512 or 4096.
        block_size: u32,
    },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Nvme { bdf, nsid } => write!(f, "nvme:{bdf}/{nsid}"),
            Source::Malloc { bytes, block_size } => write!(f, "malloc:{bytes}B/{block_size}"),
        }
    }
}

/// A namespace of a subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsPlan {
    /// Its NSID in the subsystem.
    pub nsid: u32,
    /// Its ANA group.
    pub ana_group: u32,
    /// Its blocks.
    pub source: Source,
}

/// A subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemPlan {
    /// Its NQN.
    pub nqn: String,
    /// Serial number (default: derived from the NQN).
    pub serial: Option<String>,
    /// Model number (default: "vfpoll").
    pub model: Option<String>,
    /// Hosts allowed (`None`: any).
    pub allowed_hosts: Option<Vec<String>>,
    /// Namespaces, by NSID.
    pub namespaces: Vec<NsPlan>,
    /// Rate limits per host and per namespace.
    pub limits: Limits,
    /// Hosts that must authenticate (DH-HMAC-CHAP), with their secrets.
    pub host_auth: BTreeMap<String, Arc<HostAuth>>,
}

/// Everything the target serves and how.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// One worker per entry, pinned to that core (`None`: one unpinned worker).
    pub cores: Vec<Option<usize>>,
    /// The core list as written, for messages.
    pub cores_text: Option<String>,
    /// Page size of the data buffers.
    pub page_size: PageSize,
    /// VFIO no-IOMMU mode for NVMe namespaces.
    pub noiommu: bool,
    /// How long an idle worker polls before sleeping.
    pub spin: Duration,
    /// NVMe queue pairs interrupt when completions arrive (their workers can sleep on them).
    pub nvme_irq: bool,
    /// Where the Prometheus metrics are served (`None`: not served).
    pub metrics: Option<SocketAddr>,
    /// Where reservations that persist through power loss are kept (`None`: PTPL is not
    /// offered; reservations last as long as the process).
    pub state_dir: Option<PathBuf>,
    /// The listeners.
    pub listeners: Vec<Listener>,
    /// The subsystems.
    pub subsystems: Vec<SubsystemPlan>,
}

/// The target-wide settings, from the command line or the file.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// `--cores`.
    pub cores: Option<String>,
    /// `--page-size`.
    pub page_size: Option<PageSize>,
    /// `--noiommu`.
    pub noiommu: bool,
    /// `--spin-us`.
    pub spin_us: Option<u64>,
    /// `--nvme-completion`: `Some(true)` irq, `Some(false)` poll.
    pub nvme_irq: Option<bool>,
    /// `--metrics`.
    pub metrics: Option<SocketAddr>,
    /// `--state-dir`.
    pub state_dir: Option<PathBuf>,
}

impl Plan {
    /// A plan of one subsystem `nqn` from the command line: `nvme` namespaces first (NSIDs 1,
    /// 2, ... in order), then the RAM ones.
    pub fn from_args(
        settings: Settings,
        listen: &[SocketAddr],
        nqn: &str,
        nvme: &[String],
        malloc: &[u64],
        block_size: u32,
        allow_hosts: &[String],
    ) -> anyhow::Result<Plan> {
        let mut namespaces = Vec::new();
        for spec in nvme {
            let (bdf, nsid) = parse_ns(spec).map_err(|e| anyhow::anyhow!("--ns {e}"))?;
            namespaces.push(Source::Nvme { bdf, nsid });
        }
        for &bytes in malloc {
            namespaces.push(Source::Malloc { bytes, block_size });
        }
        if namespaces.is_empty() {
            bail!("nothing to serve: give --ns BDF/NSID, --malloc SIZE or --config FILE");
        }
        let listen: Vec<SocketAddr> = if listen.is_empty() {
            vec![DEFAULT_LISTEN.parse().expect("a socket address")]
        } else {
            listen.to_vec()
        };
        let plan = Plan {
            listeners: listen
                .iter()
                .enumerate()
                .map(|(i, a)| Listener::tcp(i as u16 + 1, *a))
                .collect(),
            subsystems: vec![SubsystemPlan {
                nqn: nqn.to_owned(),
                serial: None,
                model: None,
                allowed_hosts: (!allow_hosts.is_empty()).then(|| allow_hosts.to_vec()),
                namespaces: namespaces
                    .into_iter()
                    .enumerate()
                    .map(|(i, source)| NsPlan {
                        nsid: i as u32 + 1,
                        ana_group: 1,
                        source,
                    })
                    .collect(),
                limits: Limits::default(),
                host_auth: BTreeMap::new(),
            }],
            ..Plan::settings(&settings)?
        };
        plan.check()?;
        Ok(plan)
    }

    /// The plan a TOML file describes; `overrides` from the command line win over the file's
    /// target-wide settings.
    pub fn from_file(path: &Path, overrides: &Settings) -> anyhow::Result<Plan> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut plan = Plan::from_toml(&text, overrides).with_context(|| format!("{}", path.display()))?;
        // The file's state_dir is relative to the file (the command line's to the working
        // directory).
        if overrides.state_dir.is_none() {
            if let (Some(d), Some(base)) = (plan.state_dir.as_mut(), path.parent()) {
                if d.is_relative() {
                    *d = base.join(&*d);
                }
            }
        }
        if plan.subsystems.iter().any(|s| !s.host_auth.is_empty()) {
            super::secrets::check_private(path, "it holds DH-HMAC-CHAP secrets")?;
        }
        Ok(plan)
    }

    /// The plan TOML `text` describes (see the module documentation).
    pub fn from_toml(text: &str, overrides: &Settings) -> anyhow::Result<Plan> {
        let f: File = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        let settings = Settings {
            cores: overrides.cores.clone().or(f.cores),
            page_size: match (overrides.page_size, f.page_size) {
                (Some(p), _) => Some(p),
                (None, Some(s)) => Some(parse_page_size(&s).map_err(|e| anyhow::anyhow!("page_size: {e}"))?),
                (None, None) => None,
            },
            noiommu: overrides.noiommu || f.noiommu,
            spin_us: overrides.spin_us.or(f.spin_us),
            metrics: overrides.metrics.or(f.metrics),
            state_dir: overrides.state_dir.clone().or(f.state_dir),
            nvme_irq: match (overrides.nvme_irq, f.nvme_completion.as_deref()) {
                (Some(v), _) => Some(v),
                (None, None) => None,
                (None, Some(s)) => {
                    Some(parse_completion(s).map_err(|e| anyhow::anyhow!("nvme_completion: {e}"))?)
                }
            },
        };
        // The ANA groups in use: a listener's `ana_state` applies to each.
        let mut groups: BTreeSet<u32> = f
            .subsystem
            .iter()
            .flat_map(|s| &s.namespace)
            .map(|n| n.ana_group.unwrap_or(1))
            .collect();
        groups.insert(1);
        if let Some(g) = groups.iter().find(|&&g| !(1..=ANAGRPMAX).contains(&g)) {
            bail!("ana_group {g}: ANA groups run from 1 to {ANAGRPMAX}");
        }
        let mut listeners = Vec::new();
        for (i, l) in f.listener.iter().enumerate() {
            if l.tls.is_some() {
                bail!("listener {}: tls: NVMe/TCP TLS (TP 8011) is not built: it needs the host's tlshd (ktls-utils), which Debian 12 does not ship; remove the key", l.address);
            }
            let portid = l.port_id.unwrap_or(i as u16 + 1);
            let mut listener = Listener::tcp(portid, l.address);
            if let Some(name) = &l.ana_state {
                let Some(state) = AnaState::from_name(name) else {
                    bail!("listener {}: ana_state {name:?}: use optimized, non-optimized, inaccessible, persistent-loss or change", l.address);
                };
                for &g in &groups {
                    listener = listener.with_ana(g, state);
                }
            }
            listeners.push(listener);
        }
        if listeners.is_empty() {
            listeners.push(Listener::tcp(
                1,
                DEFAULT_LISTEN.parse().expect("a socket address"),
            ));
        }
        let mut subsystems = Vec::new();
        for s in f.subsystem {
            let mut limits = Limits::default();
            let mut host_auth = BTreeMap::new();
            for h in &s.host {
                let what = || format!("subsystem {} host {}", s.nqn, h.nqn);
                check_host_name(&h.nqn).map_err(|e| anyhow::anyhow!("{}: {e}", what()))?;
                let keys = super::secrets::HostKeys {
                    secret: h.dhchap_secret.as_deref(),
                    ctrl_secret: h.dhchap_ctrl_secret.as_deref(),
                    hashes: h.dhchap_hashes.as_deref(),
                    groups: h.dhchap_dhgroups.as_deref(),
                };
                if let Some(a) = super::secrets::host_auth(&keys).with_context(what)? {
                    if h.nqn.starts_with("hostid:") {
                        bail!("{}: a host known only by its HOSTID cannot authenticate: DH-HMAC-CHAP proves a host NQN", what());
                    }
                    host_auth.insert(h.nqn.clone(), Arc::new(a));
                }
                let l = rate_limit(h.max_iops, h.max_bytes_per_s.as_deref())
                    .map_err(|e| anyhow::anyhow!("{}: {e}", what()))?;
                if limits.hosts.insert(h.nqn.clone(), l).is_some() {
                    bail!("{}: given twice", what());
                }
            }
            let mut namespaces = Vec::new();
            let mut next = 1u32;
            for n in s.namespace {
                let nsid = n.nsid.unwrap_or(next);
                let what = || format!("subsystem {} namespace {nsid}", s.nqn);
                let source = match (n.nvme, n.malloc) {
                    (Some(spec), None) => {
                        if n.block_size.is_some() {
                            bail!("{}: block_size is for malloc namespaces (an NVMe namespace has its own format)", what());
                        }
                        let (bdf, nsid) =
                            parse_ns(&spec).map_err(|e| anyhow::anyhow!("{}: nvme = {e}", what()))?;
                        Source::Nvme { bdf, nsid }
                    }
                    (None, Some(size)) => Source::Malloc {
                        bytes: parse_nonzero_bytes(&size)
                            .map_err(|e| anyhow::anyhow!("{}: malloc: {e}", what()))?,
                        block_size: n.block_size.unwrap_or(512),
                    },
                    _ => bail!(
                        "{}: give exactly one of nvme = \"BDF/NSID\" or malloc = \"SIZE\"",
                        what()
                    ),
                };
                let l = rate_limit(n.max_iops, n.max_bytes_per_s.as_deref())
                    .map_err(|e| anyhow::anyhow!("{}: {e}", what()))?;
                if l.is_limited() {
                    limits.namespaces.insert(nsid, l);
                }
                namespaces.push(NsPlan {
                    nsid,
                    ana_group: n.ana_group.unwrap_or(1),
                    source,
                });
                next = nsid.saturating_add(1);
            }
            subsystems.push(SubsystemPlan {
                nqn: s.nqn,
                serial: s.serial,
                model: s.model,
                allowed_hosts: s.allow_hosts,
                namespaces,
                limits,
                host_auth,
            });
        }
        let plan = Plan {
            listeners,
            subsystems,
            ..Plan::settings(&settings)?
        };
        plan.check()?;
        Ok(plan)
    }

    /// A plan with these settings and nothing to serve yet.
    fn settings(s: &Settings) -> anyhow::Result<Plan> {
        let page_size = s.page_size.unwrap_or(PageSize::Huge2M);
        if page_size == PageSize::Base4K && s.noiommu {
            // A command's data buffer (128 KiB) must be contiguous on the bus: behind an IOMMU
            // its pages sit at one IOVA range, without one only a page is contiguous (and MDTS
            // cannot state a 4 KiB limit: 0 means none).
            bail!("page size 4K without an IOMMU: a command's 128 KiB data buffer would span physical pages the controller cannot see as one; use 2M (reserve hugepages with `vfpoll setup`), or leave no-IOMMU mode");
        }
        let cores = match &s.cores {
            Some(list) => parse_cores(list)
                .map_err(|e| anyhow::anyhow!("cores {list}: {e}"))?
                .into_iter()
                .map(Some)
                .collect(),
            None => vec![None],
        };
        Ok(Plan {
            cores,
            cores_text: s.cores.clone(),
            page_size,
            noiommu: s.noiommu,
            spin: s.spin_us.map_or(DEFAULT_SPIN, Duration::from_micros),
            nvme_irq: s.nvme_irq.unwrap_or(true),
            metrics: s.metrics,
            state_dir: s.state_dir.clone(),
            listeners: Vec::new(),
            subsystems: Vec::new(),
        })
    }

    /// Checks what the fabrics layer cannot see: names, duplicates, one use per NVMe namespace.
    pub fn check(&self) -> anyhow::Result<()> {
        let mut ports = HashSet::new();
        let mut addrs = HashSet::new();
        for l in &self.listeners {
            if l.portid == 0 || !ports.insert(l.portid) {
                bail!(
                    "listener {}:{}: port_id {} is 0 or used twice; give each listener its own",
                    l.traddr,
                    l.trsvcid,
                    l.portid
                );
            }
            if !addrs.insert((l.traddr.clone(), l.trsvcid.clone())) {
                bail!("listener {}:{} is given twice", l.traddr, l.trsvcid);
            }
        }
        if self.subsystems.is_empty() {
            bail!("no subsystem: add a [[subsystem]] with an nqn and its [[subsystem.namespace]]s");
        }
        let mut nqns = HashSet::new();
        let mut used = HashSet::new();
        for s in &self.subsystems {
            validate_nqn(&s.nqn)?;
            if !nqns.insert(s.nqn.as_str()) {
                bail!("subsystem {} is given twice: give each its own NQN", s.nqn);
            }
            for h in s.allowed_hosts.iter().flatten() {
                validate_nqn(h).map_err(|e| anyhow::anyhow!("subsystem {}: allowed host: {e}", s.nqn))?;
            }
            for h in s.host_auth.keys() {
                validate_nqn(h)
                    .map_err(|e| anyhow::anyhow!("subsystem {}: host with a secret: {e}", s.nqn))?;
                if s.allowed_hosts.as_ref().is_some_and(|a| !a.contains(h)) {
                    bail!("subsystem {}: host {h} has a DH-HMAC-CHAP secret but is not in allow_hosts; add it there", s.nqn);
                }
            }
            let mut nsids = BTreeSet::new();
            for n in &s.namespaces {
                if n.nsid == 0 || !nsids.insert(n.nsid) {
                    bail!("subsystem {}: NSID {} is 0 or used twice", s.nqn, n.nsid);
                }
                match n.source {
                    Source::Nvme { bdf, nsid } => {
                        if !used.insert((bdf, nsid)) {
                            bail!("NVMe namespace {bdf}/{nsid} is served twice: a namespace belongs to one subsystem namespace (hosts of both would overwrite each other's data unknowingly)");
                        }
                    }
                    Source::Malloc { block_size, .. } => {
                        if block_size != 512 && block_size != 4096 {
                            bail!(
                                "subsystem {} namespace {}: block size {block_size}: use 512 or 4096",
                                s.nqn,
                                n.nsid
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether any namespace is on an NVMe controller.
    pub fn has_nvme(&self) -> bool {
        self.subsystems
            .iter()
            .flat_map(|s| &s.namespaces)
            .any(|n| matches!(n.source, Source::Nvme { .. }))
    }
}

/// `irq` → true, `poll` → false.
pub fn parse_completion(s: &str) -> Result<bool, String> {
    match s {
        "irq" => Ok(true),
        "poll" => Ok(false),
        _ => Err(format!("{s:?}: use irq or poll")),
    }
}

/// `0000:00:03.0/1` → the BDF and NSID.
pub fn parse_ns(s: &str) -> anyhow::Result<(Bdf, u32)> {
    let Some((bdf, nsid)) = s.rsplit_once('/') else {
        bail!("{s}: write BDF/NSID, e.g. 0000:00:03.0/1");
    };
    let bdf: Bdf = bdf
        .parse()
        .map_err(|e| anyhow::anyhow!("{s}: {bdf} is not a PCI address: {e}"))?;
    let nsid: u32 = nsid
        .parse()
        .ok()
        .filter(|&n| n != 0)
        .with_context(|| format!("{s}: {nsid} is not a namespace ID (1 and up)"))?;
    Ok((bdf, nsid))
}

/// The TOML file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    cores: Option<String>,
    page_size: Option<String>,
    #[serde(default)]
    noiommu: bool,
    spin_us: Option<u64>,
    nvme_completion: Option<String>,
    metrics: Option<SocketAddr>,
    state_dir: Option<PathBuf>,
    #[serde(default)]
    listener: Vec<FileListener>,
    #[serde(default)]
    subsystem: Vec<FileSubsystem>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileListener {
    address: SocketAddr,
    port_id: Option<u16>,
    ana_state: Option<String>,
    /// Reserved for NVMe/TCP TLS (TP 8011), refused until it is built.
    tls: Option<toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSubsystem {
    nqn: String,
    serial: Option<String>,
    model: Option<String>,
    allow_hosts: Option<Vec<String>>,
    #[serde(default)]
    namespace: Vec<FileNamespace>,
    #[serde(default)]
    host: Vec<FileHost>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHost {
    nqn: String,
    max_iops: Option<u64>,
    max_bytes_per_s: Option<String>,
    dhchap_secret: Option<String>,
    dhchap_ctrl_secret: Option<String>,
    dhchap_hashes: Option<Vec<String>>,
    dhchap_dhgroups: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileNamespace {
    nsid: Option<u32>,
    nvme: Option<String>,
    malloc: Option<String>,
    block_size: Option<u32>,
    ana_group: Option<u32>,
    max_iops: Option<u64>,
    max_bytes_per_s: Option<String>,
}

/// A rate limit from `max_iops` and `max_bytes_per_s` (binary units, e.g. "100M"); zero is
/// refused (leave the key out for no limit).
fn rate_limit(iops: Option<u64>, bytes: Option<&str>) -> anyhow::Result<RateLimit> {
    if iops == Some(0) {
        bail!("max_iops = 0 would stop all I/O: give a positive rate, or leave max_iops out for no limit");
    }
    let bytes_per_s = bytes
        .map(|b| {
            parse_nonzero_bytes(b)
                .map_err(|e| anyhow::anyhow!("max_bytes_per_s: {e} (leave max_bytes_per_s out for no limit)"))
        })
        .transpose()?;
    Ok(RateLimit { iops, bytes_per_s })
}

/// A host as limits name it: its host NQN, or `hostid:<uuid>` for a host that connects
/// without one.
fn check_host_name(name: &str) -> anyhow::Result<()> {
    if let Some(uuid) = name.strip_prefix("hostid:") {
        let ok = uuid.len() == 36
            && uuid.char_indices().all(|(i, c)| match i {
                8 | 13 | 18 | 23 => c == '-',
                _ => c.is_ascii_hexdigit() && !c.is_ascii_uppercase(),
            });
        if !ok {
            bail!("hostid:{uuid}: write the HOSTID as a lowercase UUID, hostid:xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx");
        }
        return Ok(());
    }
    validate_nqn(name)?;
    Ok(())
}

/// Every key the file takes, as `key` (top level) or `table.key` (`listener.address`,
/// `subsystem.namespace.nvme`), read from the parser itself (its "unknown field" errors list
/// the fields it knows), tables of tables left out: what the docs must name.
#[cfg(test)]
pub(super) fn file_keys() -> Vec<String> {
    let sub = "[[subsystem]]\nnqn = \"nqn.2024-01.io.vfpoll:a\"\n";
    let levels = [
        ("", "zz_unknown = 1\n".to_owned()),
        (
            "listener.",
            "[[listener]]\naddress = \"127.0.0.1:1\"\nzz_unknown = 1\n".to_owned(),
        ),
        ("subsystem.", format!("{sub}zz_unknown = 1\n")),
        (
            "subsystem.namespace.",
            format!("{sub}[[subsystem.namespace]]\nzz_unknown = 1\n"),
        ),
        (
            "subsystem.host.",
            format!("{sub}[[subsystem.host]]\nnqn = \"x\"\nzz_unknown = 1\n"),
        ),
    ];
    let tables = ["listener", "subsystem", "namespace", "host"];
    let mut keys = Vec::new();
    for (prefix, text) in levels {
        let e = toml::from_str::<File>(&text).unwrap_err().to_string();
        let list = e.split("expected one of").nth(1).unwrap_or_else(|| panic!("{e}"));
        for k in list.split('`').skip(1).step_by(2) {
            if !tables.contains(&k) {
                keys.push(format!("{prefix}{k}"));
            }
        }
    }
    keys
}

/// A TOML error on one line: where, and what.
fn toml_error(text: &str, e: &toml::de::Error) -> anyhow::Error {
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            anyhow::anyhow!("line {line}: {}", e.message().trim())
        }
        None => anyhow::anyhow!("{}", e.message().trim()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
        cores = "0-1"
        spin_us = 3000

        [[listener]]
        address = "127.0.0.1:4420"

        [[listener]]
        address = "127.0.0.2:4421"
        port_id = 7
        ana_state = "non-optimized"

        [[subsystem]]
        nqn = "nqn.2024-01.io.vfpoll:a"
        allow_hosts = ["nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"]

        [[subsystem.namespace]]
        nvme = "0000:00:03.0/1"

        [[subsystem.namespace]]
        nsid = 5
        malloc = "1M"
        block_size = 4096
        ana_group = 2

        [[subsystem.namespace]]
        malloc = "64k"

        [[subsystem]]
        nqn = "nqn.2024-01.io.vfpoll:b"
    "#;

    #[test]
    fn a_file_becomes_a_plan() {
        let p = Plan::from_toml(FILE, &Settings::default()).unwrap();
        assert_eq!(p.cores, vec![Some(0), Some(1)]);
        assert_eq!(p.spin, Duration::from_millis(3));
        assert_eq!(p.page_size, PageSize::Huge2M);
        let ports: Vec<u16> = p.listeners.iter().map(|l| l.portid).collect();
        assert_eq!(ports, [1, 7]);
        assert_eq!(p.listeners[1].traddr, "127.0.0.2");
        assert!(p.listeners[0].ana.is_empty(), "optimized unless told");
        let ana: Vec<(u32, AnaState)> = p.listeners[1].ana.iter().map(|(g, s)| (*g, *s)).collect();
        assert_eq!(ana, [(1, AnaState::NonOptimized), (2, AnaState::NonOptimized)]);
        let a = &p.subsystems[0];
        let nsids: Vec<u32> = a.namespaces.iter().map(|n| n.nsid).collect();
        assert_eq!(nsids, [1, 5, 6], "NSIDs follow the last one given");
        assert_eq!(
            a.namespaces[1].source,
            Source::Malloc {
                bytes: 1 << 20,
                block_size: 4096
            }
        );
        assert_eq!(a.allowed_hosts.as_ref().map(Vec::len), Some(1));
        assert!(p.subsystems[1].namespaces.is_empty());
        assert!(p.has_nvme());
        let o = Settings {
            cores: Some("3".into()),
            ..Settings::default()
        };
        assert_eq!(
            Plan::from_toml(FILE, &o).unwrap().cores,
            vec![Some(3)],
            "the command line wins"
        );
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let err = |t: &str| format!("{:#}", Plan::from_toml(t, &Settings::default()).unwrap_err());
        let e = err("\n\ncolour = 1");
        assert!(
            e.contains("line 3") && e.contains("unknown field") && !e.contains('\n'),
            "{e}"
        );
        let l = "[[listener]]\naddress = \"127.0.0.1:1\"\nana_state = \"sideways\"\n";
        assert!(
            err(&format!("{l}[[subsystem]]\nnqn = \"nqn.2024-01.io.vfpoll:a\"\n")).contains("non-optimized")
        );
        assert!(err("").contains("no subsystem"));
        let sub = "[[subsystem]]\nnqn = \"nqn.2024-01.io.vfpoll:a\"\n";
        assert!(err(&format!("{sub}[[subsystem.namespace]]\n")).contains("exactly one of"));
        assert!(err(&format!(
            "{sub}[[subsystem.namespace]]\nmalloc = \"1M\"\nblock_size = 520\n"
        ))
        .contains("512 or 4096"));
        assert!(err(&format!(
            "{sub}[[subsystem.namespace]]\nnvme = \"0000:00:03.0/1\"\nblock_size = 512\n"
        ))
        .contains("own format"));
        assert!(err(&format!(
            "{sub}[[subsystem.namespace]]\nnvme = \"0000:00:03.0/1\"\n[[subsystem.namespace]]\nnvme = \"0000:00:03.0/1\"\n"
        ))
        .contains("served twice"));
        assert!(err(&format!("{sub}[[subsystem.namespace]]\nnsid = 2\nmalloc = \"1M\"\n[[subsystem.namespace]]\nnsid = 2\nmalloc = \"1M\"\n")).contains("used twice"));
        assert!(err(&format!("{sub}{sub}")).contains("given twice"));
        assert!(err("[[subsystem]]\nnqn = \"disk\"\n").contains("nqn."));
        let e = err(&format!("page_size = \"4K\"\nnoiommu = true\n{sub}"));
        assert!(e.contains("without an IOMMU") && e.contains("use 2M"), "{e}");
        assert!(Plan::from_toml(&format!("page_size = \"4K\"\n{sub}"), &Settings::default()).is_ok());
        let two =
            "[[listener]]\naddress = \"127.0.0.1:1\"\n[[listener]]\naddress = \"127.0.0.1:2\"\nport_id = 1\n";
        assert!(err(&format!("{two}{sub}")).contains("used twice"));
    }

    #[test]
    fn the_command_line_becomes_a_plan() {
        let p = Plan::from_args(
            Settings::default(),
            &[],
            DEFAULT_NQN,
            &["0000:00:03.0/2".into()],
            &[1 << 20],
            4096,
            &[],
        )
        .unwrap();
        assert_eq!(p.listeners.len(), 1);
        assert_eq!(p.listeners[0].trsvcid, "4420");
        let ns = &p.subsystems[0].namespaces;
        assert_eq!(ns[0].nsid, 1);
        assert_eq!(ns[0].source.to_string(), "nvme:0000:00:03.0/2");
        assert_eq!(ns[1].nsid, 2);
        assert!(p.subsystems[0].allowed_hosts.is_none());
        let none = Plan::from_args(Settings::default(), &[], DEFAULT_NQN, &[], &[], 512, &[]);
        assert!(none.unwrap_err().to_string().contains("nothing to serve"));
    }

    #[test]
    fn rate_limits_per_host_and_namespace() {
        let text = r#"
            [[subsystem]]
            nqn = "nqn.2024-01.io.vfpoll:a"

            [[subsystem.host]]
            nqn = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"
            max_iops = 5000

            [[subsystem.host]]
            nqn = "hostid:5f1c1a52-7a8e-4c8b-9d0e-76667061726b"
            max_bytes_per_s = "100M"

            [[subsystem.namespace]]
            malloc = "1M"
            max_iops = 20000
            max_bytes_per_s = "1G"

            [[subsystem.namespace]]
            malloc = "1M"
        "#;
        let p = Plan::from_toml(text, &Settings::default()).unwrap();
        let l = &p.subsystems[0].limits;
        assert_eq!(
            l.hosts["nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555"],
            RateLimit {
                iops: Some(5000),
                bytes_per_s: None
            }
        );
        assert_eq!(
            l.hosts["hostid:5f1c1a52-7a8e-4c8b-9d0e-76667061726b"].bytes_per_s,
            Some(100 << 20)
        );
        assert_eq!(
            l.namespaces.get(&1),
            Some(&RateLimit {
                iops: Some(20000),
                bytes_per_s: Some(1 << 30)
            })
        );
        assert!(!l.namespaces.contains_key(&2), "namespace 2 has no limit");
        let err = |t: &str| format!("{:#}", Plan::from_toml(t, &Settings::default()).unwrap_err());
        let sub = "[[subsystem]]\nnqn = \"nqn.2024-01.io.vfpoll:a\"\n";
        assert!(err(&format!(
            "{sub}[[subsystem.namespace]]\nmalloc = \"1M\"\nmax_iops = 0\n"
        ))
        .contains("leave max_iops out"));
        assert!(err(&format!(
            "{sub}[[subsystem.namespace]]\nmalloc = \"1M\"\nmax_bytes_per_s = \"fast\"\n"
        ))
        .contains("max_bytes_per_s"));
        assert!(err(&format!(
            "{sub}[[subsystem.host]]\nnqn = \"hostid:XYZ\"\nmax_iops = 1\n"
        ))
        .contains("lowercase UUID"));
        let h = "[[subsystem.host]]\nnqn = \"nqn.2024-01.io.vfpoll:h\"\nmax_iops = 1\n";
        assert!(err(&format!("{sub}{h}{h}")).contains("given twice"));
    }

    #[test]
    fn ns_specs_parse() {
        let (bdf, nsid) = parse_ns("0000:00:03.0/2").unwrap();
        assert_eq!((bdf.to_string().as_str(), nsid), ("0000:00:03.0", 2));
        assert!(parse_ns("0000:00:03.0").is_err());
        assert!(parse_ns("0000:00:03.0/0").is_err());
        assert!(parse_ns("nonsense/1").is_err());
    }
}
