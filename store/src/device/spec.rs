//! Namespace specs: the strings that name a store's namespaces on the command line, in the C
//! API and in Python.
//!
//! | spec | namespace |
//! | --- | --- |
//! | `file:/path/store.img` | a regular file through io_uring (`O_DIRECT`); format creates it with the size of `?size=` or of the format options (`file:/path/store.img?size=4G`) |
//! | `/dev/nvme0n1`, `blk:/dev/nvme0n1` | a block device through io_uring (`O_DIRECT`, `O_EXCL`) |
//! | `vfio:0000:00:03.0/1` | namespace 1 of the NVMe controller at that PCI address, bound to vfio-pci, through vfpoll's polled driver |
//! | `model:256M` | a namespace of that size on an in-process NVMe model driven through vfpoll's driver (tests; its contents vanish with the process; needs the crate feature `model`) |
//! | `mem:256M` | a namespace in memory with a volatile write cache (tests; vanishes with the process) |
//!
//! Sizes take the suffixes K, M, G, T (powers of 1024) and an optional `B`/`iB`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use vfpoll_dma::DmaContext;
use vfpoll_nvme::{Controller, ControllerOptions, QpairOptions};
use vfpoll_pci::vfio::{Backend, Container};
use vfpoll_pci::{Bdf, Host};

use super::{Device, DeviceError, MemDevice, NvmeDevice, UringDevice, UringOptions};

/// One namespace, as named by a spec string; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceSpec {
    /// A regular file.
    File {
        /// Its path.
        path: PathBuf,
        /// Size to create it with (`?size=`).
        size: Option<u64>,
    },
    /// A block device.
    Block {
        /// Its path.
        path: PathBuf,
    },
    /// An NVMe namespace through VFIO.
    Vfio {
        /// The controller's PCI address.
        bdf: Bdf,
        /// The namespace id.
        nsid: u32,
    },
    /// A namespace on an in-process NVMe model.
    Model {
        /// Bytes.
        size: u64,
    },
    /// A namespace in memory.
    Mem {
        /// Bytes.
        size: u64,
    },
}

/// Parses a size with an optional K/M/G/T suffix (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, mul) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("size {s:?}: unknown suffix {c:?} (use K, M, G or T)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("size {s:?} is not a number with an optional K, M, G or T suffix"))?;
    n.checked_mul(mul)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

impl FromStr for NamespaceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let help = "a namespace is file:PATH[?size=SIZE], blk:/dev/..., /dev/..., vfio:BDF/NSID, model:SIZE or mem:SIZE";
        if let Some(rest) = s.strip_prefix("file:") {
            let (path, size) = match rest.rsplit_once("?size=") {
                Some((p, sz)) => (p, Some(parse_size(sz)?)),
                None => (rest, None),
            };
            if path.is_empty() {
                return Err(format!("{s:?}: the file path is empty ({help})"));
            }
            return Ok(NamespaceSpec::File {
                path: path.into(),
                size,
            });
        }
        if let Some(rest) = s.strip_prefix("blk:") {
            if !rest.starts_with('/') {
                return Err(format!("{s:?}: a block device is an absolute path ({help})"));
            }
            return Ok(NamespaceSpec::Block { path: rest.into() });
        }
        if s.starts_with("/dev/") {
            return Ok(NamespaceSpec::Block { path: s.into() });
        }
        if let Some(rest) = s.strip_prefix("vfio:") {
            let (bdf, nsid) = rest.rsplit_once('/').ok_or_else(|| {
                format!("{s:?}: name the namespace after the PCI address, e.g. vfio:0000:00:03.0/1")
            })?;
            let bdf: Bdf = bdf
                .parse()
                .map_err(|e| format!("{s:?}: {bdf:?} is not a PCI address like 0000:00:03.0 ({e})"))?;
            let nsid: u32 = nsid
                .parse()
                .ok()
                .filter(|&n| n >= 1 && n != u32::MAX)
                .ok_or_else(|| format!("{s:?}: namespace id {nsid:?} must be a number from 1"))?;
            return Ok(NamespaceSpec::Vfio { bdf, nsid });
        }
        if let Some(rest) = s.strip_prefix("model:") {
            return Ok(NamespaceSpec::Model {
                size: parse_size(rest).map_err(|e| format!("{s:?}: {e}"))?,
            });
        }
        if let Some(rest) = s.strip_prefix("mem:") {
            return Ok(NamespaceSpec::Mem {
                size: parse_size(rest).map_err(|e| format!("{s:?}: {e}"))?,
            });
        }
        Err(format!("{s:?} is not a namespace: {help}"))
    }
}

impl fmt::Display for NamespaceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NamespaceSpec::File { path, size: None } => write!(f, "file:{}", path.display()),
            NamespaceSpec::File { path, size: Some(s) } => write!(f, "file:{}?size={s}", path.display()),
            NamespaceSpec::Block { path } => write!(f, "blk:{}", path.display()),
            NamespaceSpec::Vfio { bdf, nsid } => write!(f, "vfio:{bdf}/{nsid}"),
            NamespaceSpec::Model { size } => write!(f, "model:{size}"),
            NamespaceSpec::Mem { size } => write!(f, "mem:{size}"),
        }
    }
}

/// Options of [`open_all`].
#[derive(Debug, Clone, Default)]
pub(crate) struct OpenSpecOptions {
    /// Create files of this size where the spec gives none (format).
    pub create_size: Option<u64>,
    /// Whether files may be created (format) at all.
    pub create: bool,
    /// Allow buffered I/O where O_DIRECT is refused.
    pub allow_buffered: bool,
    /// io_uring depth and NVMe queue entries.
    pub queue_depth: u32,
    /// The IOMMU backend of `vfio:` namespaces.
    pub iommu: Backend,
}

#[cfg(feature = "model")]
fn model_device(size: u64, depth: u32) -> Result<NvmeDevice, DeviceError> {
    use vfpoll_dma::{FakeMapper, PageSize};
    use vfpoll_nvme_model::{ModelConfig, NamespaceConfig, NvmeModel};

    let blocks = size / 4096;
    if blocks == 0 {
        return Err(DeviceError::Open(format!("model:{size}: at least 4096 bytes")));
    }
    let mapper = Arc::new(FakeMapper::new());
    let cfg = ModelConfig {
        namespaces: vec![NamespaceConfig::new(1, 4096, blocks)],
        volatile_write_cache: true,
        ..Default::default()
    };
    let model = NvmeModel::start(cfg, mapper.clone())
        .map_err(|e| DeviceError::Open(format!("model:{size}: cannot start the NVMe model: {e}")))?;
    let opts = ControllerOptions {
        page_size: PageSize::Base4K,
        // One queue pair per I/O channel of the store (StoreOptions::io_channels).
        io_queues: 8,
        ..Default::default()
    };
    let ctrl = Controller::new(model.bar0(), DmaContext::new(mapper), opts)
        .map_err(|e| DeviceError::Open(format!("model:{size}: bringing up the model's controller: {e}")))?;
    let qopts = QpairOptions {
        entries: depth.clamp(8, 1024) as u16,
        ..Default::default()
    };
    NvmeDevice::new(&ctrl, 1, &qopts, "model", vec![Box::new(model)])
}

/// Without the `model` feature: the spec parses, but opening it says how to get the model.
#[cfg(not(feature = "model"))]
fn model_device(size: u64, _depth: u32) -> Result<NvmeDevice, DeviceError> {
    Err(DeviceError::Open(format!(
        "model:{size}: this vfpoll was built without the NVMe model; rebuild with --features model"
    )))
}

/// Opens every spec (VFIO namespaces of one controller share it; all controllers share one
/// container), in order.
pub(crate) fn open_all(
    specs: &[NamespaceSpec],
    o: &OpenSpecOptions,
) -> Result<Vec<Box<dyn Device>>, DeviceError> {
    let bdfs: Vec<Bdf> = specs
        .iter()
        .filter_map(|s| match s {
            NamespaceSpec::Vfio { bdf, .. } => Some(*bdf),
            _ => None,
        })
        .collect();
    let mut ctrls: Vec<(Bdf, Controller)> = Vec::new();
    let mut container: Option<(Arc<Container>, DmaContext)> = None;
    let mut out: Vec<Box<dyn Device>> = Vec::with_capacity(specs.len());
    for s in specs {
        let dev: Box<dyn Device> = match s {
            NamespaceSpec::File { path, size } => {
                let opts = UringOptions {
                    create_size: if o.create { size.or(o.create_size) } else { None },
                    allow_buffered: o.allow_buffered,
                    queue_depth: o.queue_depth,
                };
                Box::new(UringDevice::open(path, &opts)?)
            }
            NamespaceSpec::Block { path } => {
                let opts = UringOptions {
                    create_size: None,
                    allow_buffered: o.allow_buffered,
                    queue_depth: o.queue_depth,
                };
                Box::new(UringDevice::open(path, &opts)?)
            }
            NamespaceSpec::Mem { size } => Box::new(MemDevice::new(*size / 4096 * 4096, 512, true)),
            NamespaceSpec::Model { size } => Box::new(model_device(*size, o.queue_depth)?),
            NamespaceSpec::Vfio { bdf, nsid } => {
                let ctrl = match ctrls.iter().find(|(b, _)| b == bdf) {
                    Some((_, c)) => c.clone(),
                    None => {
                        let opts = ControllerOptions::default();
                        let fail = |e: &dyn fmt::Display| {
                            DeviceError::Open(format!(
                                "vfio:{bdf}: {e} (bind it to vfio-pci with `vfpoll bind {bdf}`; hugepages must be reserved)"
                            ))
                        };
                        let c = match &container {
                            None => {
                                let choice = o.iommu.choose(&Host::default(), &bdfs);
                                let cont = Container::open(choice.mode).map_err(|e| fail(&e))?;
                                let (c, dma) =
                                    Controller::open_first(&cont, *bdf, opts).map_err(|e| fail(&e))?;
                                container = Some((cont, dma));
                                c
                            }
                            Some((cont, dma)) => {
                                Controller::open(cont, *bdf, dma.clone(), opts).map_err(|e| fail(&e))?
                            }
                        };
                        ctrls.push((*bdf, c.clone()));
                        c
                    }
                };
                let qopts = QpairOptions {
                    entries: o.queue_depth.clamp(8, 1024) as u16,
                    ..Default::default()
                };
                let keep: Vec<Box<dyn std::any::Any + Send>> = match &container {
                    Some((c, _)) => vec![Box::new(c.clone())],
                    None => vec![],
                };
                Box::new(NvmeDevice::new(&ctrl, *nsid, &qopts, &bdf.to_string(), keep)?)
            }
        };
        out.push(dev);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print() {
        for (s, want) in [
            (
                "file:/tmp/a.img",
                NamespaceSpec::File {
                    path: "/tmp/a.img".into(),
                    size: None,
                },
            ),
            (
                "file:/tmp/a.img?size=4G",
                NamespaceSpec::File {
                    path: "/tmp/a.img".into(),
                    size: Some(4 << 30),
                },
            ),
            (
                "/dev/nvme0n1",
                NamespaceSpec::Block {
                    path: "/dev/nvme0n1".into(),
                },
            ),
            (
                "blk:/dev/sdb",
                NamespaceSpec::Block {
                    path: "/dev/sdb".into(),
                },
            ),
            ("model:64MiB", NamespaceSpec::Model { size: 64 << 20 }),
            ("mem:1048576", NamespaceSpec::Mem { size: 1 << 20 }),
        ] {
            let got: NamespaceSpec = s.parse().unwrap();
            assert_eq!(got, want, "{s}");
            assert_eq!(got.to_string().parse::<NamespaceSpec>().unwrap(), want);
        }
        let v: NamespaceSpec = "vfio:0000:00:03.0/2".parse().unwrap();
        assert_eq!(v.to_string(), "vfio:0000:00:03.0/2");
        for bad in [
            "",
            "nvme0n1",
            "file:",
            "vfio:0000:00:03.0",
            "vfio:zz/1",
            "vfio:0000:00:03.0/0",
            "model:12Q",
            "blk:dev",
        ] {
            let e = bad.parse::<NamespaceSpec>().unwrap_err();
            assert!(!e.is_empty(), "{bad}");
        }
        assert!("model:12Q"
            .parse::<NamespaceSpec>()
            .unwrap_err()
            .contains("suffix"));
    }
}
