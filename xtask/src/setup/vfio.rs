//! The guest kernels' VFIO modules, rebuilt out of tree where Debian left out what the test bed
//! needs. Both kernels' packages come from apt at the kernel's exact version ([`fetch_kdev`]:
//! `linux-source`, `linux-headers`, `linux-kbuild`); nothing of the kernel is committed.
//!
//! 6.1 ([`build_vfio_noiommu`], [`noiommu_modules`]): `vfio.ko` alone, with
//! `CONFIG_VFIO_NOIOMMU`, which only the no-IOMMU initramfs and module tree use.
//!
//! 6.12 ([`build`], [`module_tree`]): Debian builds it with `# CONFIG_IOMMUFD is not set`,
//! hence without `CONFIG_VFIO_DEVICE_CDEV` (it depends on `IOMMUFD`), and without
//! `CONFIG_VFIO_NOIOMMU`: no `/dev/iommu`, no `/dev/vfio/devices/vfioN`, no no-IOMMU mode. All
//! three live in modules, so this set is rebuilt against the kernel's headers (`Module.symvers`,
//! `.config`) with [`CONFIG_CHANGES`] on top of its `.config`, and every 6.12 mode boots it:
//!
//! - `iommufd.ko` (`drivers/iommu/iommufd`), new. It needs `interval_tree_span_iter_*`
//!   (`lib/interval_tree.c` under `CONFIG_INTERVAL_TREE_SPAN_ITER`, which only `IOMMUFD`
//!   selects), which the kernel lacks: that part of `lib/interval_tree.c` is compiled into
//!   `iommufd.ko` (its exports dropped), when the kernel's `Module.symvers` has no such symbol.
//! - `vfio.ko`: with `IOMMUFD` and `VFIO_DEVICE_CDEV` it gains `iommufd.o` and `device_cdev.o`
//!   and depends on `iommufd.ko`; `VFIO_NOIOMMU` is compiled in too, so one set serves every
//!   mode.
//! - `vfio-pci-core.ko`, `vfio-pci.ko`: `struct vfio_device` (include/linux/vfio.h) has
//!   `cdev` and `iommufd_device` members only under those options, and vfio-pci's
//!   `vfio_device_ops` names `vfio_iommufd_physical_bind` & co. only with `IOMMUFD` (NULL
//!   otherwise: no iommufd binding at all).
//! - `vfio_iommu_type1.ko`: its code does not change, but the symbol versions (modversions
//!   CRCs) of what it imports from `vfio.ko` do (`vfio_register_iommu_driver` takes ops whose
//!   functions take a `struct vfio_device *`): Debian's copy refuses to load against the
//!   rebuilt `vfio.ko` ("disagrees about version of symbol").
//!
//! `VFIO_GROUP` and `VFIO_CONTAINER` stay on (type1 containers keep working; the container is
//! vfio's own, `IOMMUFD_VFIO_CONTAINER` stays off). Every other module that depends on `vfio.ko`
//! is outside `drivers/vfio` (6.12: i915's `kvmgt.ko`) and is left as Debian built it: its
//! imports no longer match, so the kernel refuses to load it, which the test bed never asks for.
//! `mdev.ko` does not use `vfio.ko` and stays Debian's.
//!
//! The checks: modpost resolves every symbol against the kernel's `Module.symvers` (an
//! undefined one fails the build), each module's vermagic is the kernel's, `vfio.ko` depends
//! on `iommufd.ko` and has the no-IOMMU parameter and the cdev node name, and the module tree
//! built from the set ([`module_tree`]) has `modules.dep` saying so.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{busybox_depmod, contains, dpkg_x, link_tree, num_cpus, Apt, KernelDir};
use crate::util::{err, mkdir, read_opt, run_quiet, write, Context, Fnv, Note, Result};
use crate::Workspace;

/// Kernel options changed from the kernel's own `.config` for the rebuilt modules.
pub const CONFIG_CHANGES: &[(&str, &str)] =
    &[("IOMMUFD", "m"), ("VFIO_DEVICE_CDEV", "y"), ("VFIO_NOIOMMU", "y")];

/// Options the rebuild relies on being as the kernel has them (a later Debian kernel that
/// changes one needs this module revisited).
const CONFIG_KEPT: &[(&str, &str)] = &[
    ("VFIO", "m"),
    ("VFIO_GROUP", "y"),
    ("VFIO_CONTAINER", "y"),
    ("VFIO_IOMMU_TYPE1", "m"),
    ("VFIO_PCI_CORE", "m"),
    ("VFIO_PCI", "m"),
    ("IOMMU_API", "y"),
];

/// The rebuilt modules: where the build leaves each (under the build dir, which mirrors
/// `drivers/`) and its path in the module tree.
pub const REBUILT: &[(&str, &str)] = &[
    (
        "iommu/iommufd/iommufd.ko",
        "kernel/drivers/iommu/iommufd/iommufd.ko",
    ),
    ("vfio/vfio.ko", "kernel/drivers/vfio/vfio.ko"),
    (
        "vfio/vfio_iommu_type1.ko",
        "kernel/drivers/vfio/vfio_iommu_type1.ko",
    ),
    (
        "vfio/pci/vfio-pci-core.ko",
        "kernel/drivers/vfio/pci/vfio-pci-core.ko",
    ),
    ("vfio/pci/vfio-pci.ko", "kernel/drivers/vfio/pci/vfio-pci.ko"),
];

/// Paths of `linux-source-<series>.tar.xz` the build needs.
const SOURCE_PATHS: &[&str] = &["drivers/vfio", "drivers/iommu", "lib/interval_tree.c"];

/// Bumped when the build changes in a way the stamp cannot see.
const FORMAT: &str = "vfpoll-vfio-iommufd-1";

/// What the build of `kd`'s set depends on: the kernel package and [`CONFIG_CHANGES`].
pub fn fingerprint(kd: &KernelDir) -> String {
    let version = read_opt(&kd.package_version()).unwrap_or_default();
    let mut h = Fnv::new().add(FORMAT.as_bytes()).add(version.trim().as_bytes());
    for (k, v) in CONFIG_CHANGES {
        h = h.add(k.as_bytes()).add(v.as_bytes());
    }
    for (_, rel) in REBUILT {
        h = h.add(rel.as_bytes());
    }
    h.hex()
}

/// `kernel-<kver>/vfio-iommufd/`: the rebuilt `.ko` files, by file name.
fn set_dir(kd: &KernelDir) -> PathBuf {
    kd.dir.join("vfio-iommufd")
}

fn set_done(kd: &KernelDir) -> PathBuf {
    kd.dir.join("vfio-iommufd.done")
}

/// `kroot-vfio/lib/modules/<kver>`: the kernel's modules with the rebuilt set.
pub fn tree_root(kd: &KernelDir) -> PathBuf {
    kd.dir.join("kroot-vfio")
}

fn tree_done(kd: &KernelDir) -> PathBuf {
    kd.dir.join("kroot-vfio.done")
}

/// Whether the set and its module tree are built for the current fingerprint.
pub fn complete(kd: &KernelDir) -> bool {
    let f = fingerprint(kd);
    read_opt(&set_done(kd)).as_deref() == Some(f.as_str())
        && read_opt(&tree_done(kd)).as_deref() == Some(f.as_str())
}

/// The built file of module path `rel` ([`REBUILT`]).
fn built(kd: &KernelDir, rel: &str) -> PathBuf {
    set_dir(kd).join(rel.rsplit('/').next().unwrap_or(rel))
}

/// Builds the set ([`REBUILT`]) into [`set_dir`].
pub fn build(apt: &mut Apt, ws: &Workspace, kd: &KernelDir) -> Result<((), Note)> {
    let f = fingerprint(kd);
    if read_opt(&set_done(kd)).as_deref() == Some(f.as_str())
        && REBUILT.iter().all(|(_, rel)| built(kd, rel).exists())
    {
        return Ok(((), Note::Cached));
    }
    let kver = &kd.kver;
    let config_path = kd.kroot().join(format!("boot/config-{kver}"));
    let config = fs::read_to_string(&config_path).context(config_path.display())?;
    let changes = config_changes(&config)?;

    let src = fetch_kdev(apt, ws, kd, SOURCE_PATHS)?;
    let headers = src.headers;
    let symvers_path = headers.join("Module.symvers");
    let symvers = fs::read_to_string(&symvers_path).context(symvers_path.display())?;

    // The build dir mirrors drivers/: vfio/ (with pci/), iommu/iommufd/ and iommu/*.h, which
    // iommufd includes as "../iommu-priv.h".
    let build = kd.kdev().join("vfio-iommufd");
    let _ = fs::remove_dir_all(&build);
    let drivers = src.root.join("drivers");
    copy_tree(&drivers.join("vfio"), &build.join("vfio"))?;
    copy_tree(&drivers.join("iommu/iommufd"), &build.join("iommu/iommufd"))?;
    for e in fs::read_dir(drivers.join("iommu"))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "h") {
            fs::copy(&p, build.join("iommu").join(p.file_name().unwrap_or_default())).context(p.display())?;
        }
    }
    let mut extra = Vec::new();
    if !symvers.contains("\tinterval_tree_span_iter_first\t") {
        let lib = src.root.join("lib/interval_tree.c");
        let text = span_iter_source(&fs::read_to_string(&lib).context(lib.display())?)
            .ok_or_else(|| err!("{}: no CONFIG_INTERVAL_TREE_SPAN_ITER section", lib.display()))?;
        write(&build.join("iommu/iommufd/interval_tree_span.c"), text)?;
        extra.push("interval_tree_span.o");
    }
    // A Kbuild file takes precedence over the Makefile of its directory.
    write(
        &build.join("iommu/iommufd/Kbuild"),
        format!(
            "include $(src)/Makefile\n{}",
            extra
                .iter()
                .map(|o| format!("iommufd-y += {o}\n"))
                .collect::<String>()
        ),
    )?;
    write(&build.join("Kbuild"), "obj-m += vfio/ iommu/iommufd/\n")?;

    // The option changes reach Kbuild (which objects) as make variables and the C code
    // (autoconf.h's defines) as -D flags; the modversions CRCs follow the same source.
    let mut make = Command::new("make");
    make.arg("-C")
        .arg(&headers)
        .arg(format!("M={}", build.display()))
        .arg(format!("-j{}", num_cpus()))
        // No BTF (pahole is not on the host; the modules load without it).
        .arg("CONFIG_DEBUG_INFO_BTF_MODULES=")
        // mdev.ko does not use vfio.ko: Debian's stays.
        .arg("CONFIG_VFIO_MDEV=");
    let mut defines = Vec::new();
    for (k, v) in &changes {
        make.arg(format!("CONFIG_{k}={v}"));
        defines.push(match *v {
            "m" => format!("-DCONFIG_{k}_MODULE=1"),
            _ => format!("-DCONFIG_{k}=1"),
        });
    }
    make.arg(format!("KCFLAGS={}", defines.join(" "))).arg("modules");
    // modpost fails the build on a symbol that neither the kernel's Module.symvers nor these
    // modules export.
    run_quiet(&mut make)?;

    let set = set_dir(kd);
    let _ = fs::remove_dir_all(&set);
    mkdir(&set)?;
    for (from, rel) in REBUILT {
        let ko = build.join(from);
        let bytes = fs::read(&ko).context(ko.display())?;
        if !contains(&bytes, format!("vermagic={kver} ").as_bytes()) {
            return Err(err!("{}: not the vermagic of {kver}", ko.display()));
        }
        // Debian ships its modules without debug info; so do these.
        run_quiet(Command::new("strip").arg("--strip-debug").arg(&ko))?;
        fs::copy(&ko, built(kd, rel)).context(ko.display())?;
    }
    let vfio = fs::read(built(kd, "vfio.ko"))?;
    for (needle, what) in [
        (&b"parm=enable_unsafe_noiommu_mode"[..], "the no-IOMMU mode"),
        (b"vfio/devices/", "the device cdev (/dev/vfio/devices/)"),
        (b"depends=iommufd", "its dependency on iommufd.ko"),
    ] {
        if !contains(&vfio, needle) {
            return Err(err!("the rebuilt vfio.ko lacks {what}"));
        }
    }
    write(&set_done(kd), &f)?;
    let mut note = format!(
        "from linux-source-{} {}: {}",
        src.series,
        src.version,
        REBUILT
            .iter()
            .map(|(_, r)| r.rsplit('/').next().unwrap_or(r))
            .collect::<Vec<_>>()
            .join(" ")
    );
    if !extra.is_empty() {
        note.push_str(", iommufd.ko with lib/interval_tree.c's span iterator");
    }
    Ok(((), Note::Text(note)))
}

/// The options of [`CONFIG_CHANGES`] the kernel's `.config` does not already have, after
/// checking [`CONFIG_KEPT`] and that nothing else in the way is set.
fn config_changes(config: &str) -> Result<Vec<(&'static str, &'static str)>> {
    let value = |k: &str| {
        config.lines().find_map(|l| {
            l.strip_prefix(&format!("CONFIG_{k}="))
                .map(|v| v.trim().to_string())
        })
    };
    for (k, v) in CONFIG_KEPT {
        if value(k).as_deref() != Some(*v) {
            return Err(err!(
                "the kernel's .config has CONFIG_{k}={}, the VFIO rebuild expects {v}",
                value(k).unwrap_or_else(|| "(unset)".into())
            ));
        }
    }
    if let Some(v) = value("IOMMUFD_VFIO_CONTAINER") {
        return Err(err!(
            "the kernel's .config has CONFIG_IOMMUFD_VFIO_CONTAINER={v}: iommufd would provide \
             /dev/vfio/vfio, which the VFIO rebuild does not expect"
        ));
    }
    let mut changes = Vec::new();
    for &(k, v) in CONFIG_CHANGES {
        match value(k) {
            None => changes.push((k, v)),
            Some(have) if have == v => {}
            Some(have) => {
                return Err(err!(
                    "the kernel's .config has CONFIG_{k}={have}, the VFIO rebuild wants {v}"
                ))
            }
        }
    }
    Ok(changes)
}

/// `lib/interval_tree.c`'s `CONFIG_INTERVAL_TREE_SPAN_ITER` part as a file of its own,
/// without its `EXPORT_SYMBOL`s (its functions are iommufd.ko's own); `None` when there is
/// no such part.
fn span_iter_source(lib: &str) -> Option<String> {
    let start = lib.find("#ifdef CONFIG_INTERVAL_TREE_SPAN_ITER\n")?;
    let body = &lib[start..];
    let body = &body[body.find('\n')? + 1..];
    let end = body.rfind("#endif")?;
    let mut out = String::from(
        "// SPDX-License-Identifier: GPL-2.0-only\n\
         /* lib/interval_tree.c's span iterator, built into iommufd.ko by `cargo xtask setup`. */\n\
         #include <linux/interval_tree.h>\n",
    );
    for line in body[..end].lines() {
        if !line.starts_with("EXPORT_SYMBOL") {
            out.push_str(line);
            out.push('\n');
        }
    }
    Some(out)
}

/// `kroot-vfio/lib/modules/<kver>`: hard links to every module of `kroot` but the rebuilt
/// ones (copies, and `iommufd.ko` added), index files copied, `modules.dep` and the other
/// indexes made again by busybox's depmod (vfio.ko now depends on iommufd.ko).
pub fn module_tree(kd: &KernelDir) -> Result<((), Note)> {
    let f = fingerprint(kd);
    if read_opt(&tree_done(kd)).as_deref() == Some(f.as_str()) {
        return Ok(((), Note::Cached));
    }
    // What an earlier setup made for this kernel without the rebuilt set.
    let _ = fs::remove_dir_all(kd.noiommu_root());
    for f in [kd.noiommu_done(), kd.vfio_ko()] {
        let _ = fs::remove_file(f);
    }
    for mode in ["iommu", "noiommu"] {
        let _ = fs::remove_file(kd.initramfs(mode));
        let _ = fs::remove_file(super::stamp_path(kd, mode));
    }
    let root = tree_root(kd);
    let _ = fs::remove_dir_all(&root);
    let dst = root.join("lib/modules").join(&kd.kver);
    let mut n = 0;
    link_tree(&kd.module_dir(), &dst, Path::new(""), &mut |rel, from, to| {
        n += 1;
        let name = rel.file_name().unwrap_or_default().to_string_lossy();
        if REBUILT.iter().any(|(_, r)| rel == Path::new(r)) {
            // Replaced below.
            Ok(())
        } else if name.starts_with("modules.") {
            fs::copy(from, to).map(drop)
        } else {
            fs::hard_link(from, to).or_else(|_| fs::copy(from, to).map(drop))
        }
    })?;
    for (_, rel) in REBUILT {
        let to = dst.join(rel);
        mkdir(to.parent().unwrap_or(&dst))?;
        fs::copy(built(kd, rel), &to).context(to.display())?;
    }
    busybox_depmod(&root, &kd.kver)?;
    let dep = fs::read_to_string(dst.join("modules.dep"))?;
    let vfio_line = dep
        .lines()
        .find(|l| l.starts_with("kernel/drivers/vfio/vfio.ko:"))
        .ok_or_else(|| err!("{}: modules.dep has no vfio.ko", dst.display()))?;
    if !vfio_line.contains("kernel/drivers/iommu/iommufd/iommufd.ko") {
        return Err(err!(
            "modules.dep: vfio.ko does not depend on iommufd.ko: {vfio_line}"
        ));
    }
    let left = dependents_left(&dep);
    write(&tree_done(kd), &f)?;
    let mut note = format!("{n} files");
    if !left.is_empty() {
        note.push_str(&format!("; not rebuilt, will not load: {}", left.join(" ")));
    }
    Ok(((), Note::Text(note)))
}

/// Modules that depend on `vfio.ko` (directly or not) and are not rebuilt: built against
/// Debian's `vfio.ko`, the kernel refuses them now (e.g. i915's `kvmgt`).
fn dependents_left(dep: &str) -> Vec<String> {
    let mut left: Vec<String> = dep
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(_, deps)| {
            deps.split_whitespace()
                .any(|d| d == "kernel/drivers/vfio/vfio.ko")
        })
        .map(|(m, _)| m)
        .filter(|m| !REBUILT.iter().any(|(_, r)| r == m))
        .map(|m| {
            let stem = m.rsplit('/').next().unwrap_or(m);
            stem.trim_end_matches(".ko").to_string()
        })
        .collect();
    left.sort();
    left
}

/// What [`fetch_kdev`] unpacked.
struct KdevSource {
    /// `usr/src/linux-headers-<kver>` (its Makefile fixed to include the common headers from
    /// here): what `make -C` builds out-of-tree modules against.
    headers: PathBuf,
    /// `linux-source-<series>`, with only the paths asked for.
    root: PathBuf,
    /// `6.1`, `6.12`.
    series: String,
    /// The Debian version of the kernel packages.
    version: String,
}

/// Fetches `linux-source-<series>`, the kernel's headers (`linux-headers-<kver>`, its common
/// part) and `linux-kbuild` at the kernel's version into `kdev/` (replacing what is there),
/// and unpacks `paths` of the source tarball (which is deleted then).
fn fetch_kdev(apt: &mut Apt, ws: &Workspace, kd: &KernelDir, paths: &[&str]) -> Result<KdevSource> {
    let kver = &kd.kver;
    let version =
        read_opt(&kd.package_version()).ok_or_else(|| err!("missing {}", kd.package_version().display()))?;
    let version = version.trim();
    // 6.1.0-56-amd64 -> series 6.1; the common headers (linux-headers-6.1.0-56-common) and
    // kbuild (linux-kbuild-6.1, or linux-kbuild-6.12.117+deb12 for 6.12) as the headers name them.
    let series = kver.split('.').take(2).collect::<Vec<_>>().join(".");
    let headers_pkg = format!("linux-headers-{kver}");
    let common = apt.dependency(&headers_pkg, "linux-headers-")?;
    let kbuild = apt.dependency(&headers_pkg, "linux-kbuild-")?;
    let pkgs = [
        format!("linux-source-{series}={version}"),
        format!("{headers_pkg}={version}"),
        format!("{common}={version}"),
        format!("{kbuild}={version}"),
    ];
    let debs_dir = ws.testbed().join("debs");
    let _ = fs::remove_dir_all(&debs_dir);
    let debs = apt.download(&debs_dir, &pkgs)?;
    let kdev = kd.kdev();
    let _ = fs::remove_dir_all(&kdev);
    for deb in &debs {
        dpkg_x(deb, &kdev)?;
    }
    fs::remove_dir_all(&debs_dir)?;

    // Debian's headers Makefile includes the common headers by absolute path.
    let headers = kdev.join(format!("usr/src/linux-headers-{kver}"));
    let makefile = headers.join("Makefile");
    let text = fs::read_to_string(&makefile).context(makefile.display())?;
    let fixed = text.replace(
        "include /usr/src/",
        &format!("include {}/usr/src/", kdev.display()),
    );
    write(&makefile, fixed)?;

    let tarball = kdev.join(format!("usr/src/linux-source-{series}.tar.xz"));
    run_quiet(
        Command::new("tar")
            .arg("-xJf")
            .arg(&tarball)
            .args(paths.iter().map(|p| format!("linux-source-{series}/{p}")))
            .current_dir(&kdev),
    )?;
    fs::remove_file(&tarball)?;
    Ok(KdevSource {
        headers,
        root: kdev.join(format!("linux-source-{series}")),
        series,
        version: version.to_string(),
    })
}

/// Rebuilds `vfio.ko` with `CONFIG_VFIO_NOIOMMU`: the whole no-IOMMU mode lives in `vfio.ko`
/// (6.1: `vfio_main.c`, `container.c`; 6.12 also `group.c`), so `vfio-pci.ko` and
/// `vfio_iommu_type1.ko` stay Debian's. The objects are those `drivers/vfio/Makefile` puts into
/// `vfio.ko` under the kernel's own `.config`.
pub fn build_vfio_noiommu(apt: &mut Apt, ws: &Workspace, kd: &KernelDir) -> Result<((), Note)> {
    if kd.vfio_ko().exists() {
        return Ok(((), Note::Cached));
    }
    let kver = &kd.kver;
    let KdevSource {
        headers,
        root,
        series,
        version,
    } = fetch_kdev(apt, ws, kd, &["drivers/vfio"])?;
    let kdev = kd.kdev();
    let src = root.join("drivers/vfio");
    let build = mkdir(kdev.join("vfio-noiommu"))?;
    for e in fs::read_dir(&src).context(src.display())? {
        let p = e?.path();
        if p.is_file() && p.extension().is_some_and(|x| x == "c" || x == "h") {
            fs::copy(&p, build.join(p.file_name().unwrap_or_default())).context(p.display())?;
        }
    }
    let makefile = src.join("Makefile");
    let config_path = kd.kroot().join(format!("boot/config-{kver}"));
    let config = fs::read_to_string(&config_path).context(config_path.display())?;
    let objects = vfio_objects(
        &fs::read_to_string(&makefile).context(makefile.display())?,
        &config,
    );
    if !objects.iter().any(|o| o == "container.o") {
        return Err(err!(
            "{}: vfio.ko would have no container.o (CONFIG_VFIO_CONTAINER), which holds the \
             no-IOMMU container; objects: {objects:?}",
            makefile.display()
        ));
    }
    write(
        &build.join("Kbuild"),
        format!(
            "ccflags-y += -DCONFIG_VFIO_NOIOMMU=1\n\
             obj-m += vfio.o\n\
             vfio-y += {}\n",
            objects.join(" ")
        ),
    )?;
    run_quiet(
        Command::new("make")
            .arg("-C")
            .arg(&headers)
            .arg(format!("M={}", build.display()))
            .arg(format!("-j{}", num_cpus()))
            // 6.12 would add BTF with pahole (not on the host); the module loads without it,
            // and its debug info is stripped below anyway.
            .arg("CONFIG_DEBUG_INFO_BTF_MODULES=")
            .arg("modules"),
    )?;
    let ko = fs::read(build.join("vfio.ko"))?;
    if !contains(&ko, b"parm=enable_unsafe_noiommu_mode") {
        return Err(err!("the rebuilt vfio.ko lacks enable_unsafe_noiommu_mode"));
    }
    if !contains(&ko, format!("vermagic={kver} ").as_bytes()) {
        return Err(err!("the rebuilt vfio.ko has the wrong vermagic"));
    }
    // Debian ships its modules without debug info; so does this one.
    run_quiet(
        Command::new("strip")
            .arg("--strip-debug")
            .arg(build.join("vfio.ko")),
    )?;
    fs::copy(build.join("vfio.ko"), kd.vfio_ko())?;
    Ok((
        (),
        Note::Text(format!(
            "from linux-source-{series} {version}: {}",
            objects.join(" ")
        )),
    ))
}

/// The objects `drivers/vfio/Makefile` (`makefile`) links into `vfio.ko` under `.config`
/// (`config`): `vfio-y += a.o b.o` always, `vfio-$(CONFIG_X) += c.o` where `CONFIG_X=y`.
fn vfio_objects(makefile: &str, config: &str) -> Vec<String> {
    let enabled = |opt: &str| config.lines().any(|l| l.trim() == format!("{opt}=y"));
    let joined = makefile.replace("\\\n", " ");
    let mut objects = Vec::new();
    for line in joined.lines() {
        let Some((lhs, rhs)) = line.split_once("+=").or_else(|| line.split_once(":=")) else {
            continue;
        };
        let lhs = lhs.trim();
        let take = match lhs.strip_prefix("vfio-") {
            Some("y") => true,
            Some(cond) => cond
                .strip_prefix("$(")
                .and_then(|c| c.strip_suffix(')'))
                .is_some_and(enabled),
            None => false,
        };
        if take {
            objects.extend(rhs.split_whitespace().map(str::to_string));
        }
    }
    objects
}

/// `kroot-noiommu/lib/modules/<kver>`: hard links to every module of `kroot` but `vfio.ko`,
/// which is the rebuilt one, so that `modprobe` in a no-IOMMU guest never loads Debian's.
/// The index files are copies (vfio.ko's dependencies and symbols are the same).
pub fn noiommu_modules(kd: &KernelDir) -> Result<((), Note)> {
    if kd.noiommu_done().exists() {
        return Ok(((), Note::Cached));
    }
    let root = kd.noiommu_root();
    let _ = fs::remove_dir_all(&root);
    let src = kd.module_dir();
    let dst = root.join("lib/modules").join(&kd.kver);
    let mut n = 0;
    link_tree(&src, &dst, Path::new(""), &mut |rel, from, to| {
        n += 1;
        let name = rel.file_name().unwrap_or_default().to_string_lossy();
        if rel == Path::new("kernel/drivers/vfio/vfio.ko") {
            fs::copy(kd.vfio_ko(), to).map(drop)
        } else if name.starts_with("modules.") {
            fs::copy(from, to).map(drop)
        } else {
            fs::hard_link(from, to).or_else(|_| fs::copy(from, to).map(drop))
        }
    })?;
    let vfio = dst.join("kernel/drivers/vfio/vfio.ko");
    if !contains(
        &fs::read(&vfio).context(vfio.display())?,
        b"parm=enable_unsafe_noiommu_mode",
    ) {
        return Err(err!("{}: not the rebuilt vfio.ko", vfio.display()));
    }
    write(&kd.noiommu_done(), "")?;
    Ok(((), Note::Text(format!("{n} files"))))
}

/// Copies the directory tree `src` to `dst` (regular files and directories only).
fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    mkdir(dst)?;
    for e in fs::read_dir(src).context(src.display())? {
        let e = e?;
        let to = dst.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_tree(&e.path(), &to)?;
        } else if e.file_type()?.is_file() {
            fs::copy(e.path(), &to).context(e.path().display())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vfio_objects_follow_makefile_and_config() {
        // Linux 6.1's drivers/vfio/Makefile (virqfd is a module of its own there).
        let m61 = "vfio_virqfd-y := virqfd.o\n\nobj-$(CONFIG_VFIO) += vfio.o\n\n\
                   vfio-y += vfio_main.o \\\n\t  iova_bitmap.o \\\n\t  container.o\n\n\
                   obj-$(CONFIG_VFIO_VIRQFD) += vfio_virqfd.o\n";
        assert_eq!(
            vfio_objects(m61, "CONFIG_VFIO=m\nCONFIG_VFIO_VIRQFD=m\n"),
            ["vfio_main.o", "iova_bitmap.o", "container.o"]
        );
        // Linux 6.12's, with Debian's choices: no cdev, no iommufd, no debugfs.
        let m612 = "obj-$(CONFIG_VFIO) += vfio.o\n\nvfio-y += vfio_main.o \\\n\
                    \t  iova_bitmap.o\n\
                    vfio-$(CONFIG_VFIO_DEVICE_CDEV) += device_cdev.o\n\
                    vfio-$(CONFIG_VFIO_GROUP) += group.o\n\
                    vfio-$(CONFIG_IOMMUFD) += iommufd.o\n\
                    vfio-$(CONFIG_VFIO_CONTAINER) += container.o\n\
                    vfio-$(CONFIG_VFIO_VIRQFD) += virqfd.o\n\
                    vfio-$(CONFIG_VFIO_DEBUGFS) += debugfs.o\n";
        let config = "CONFIG_VFIO=m\nCONFIG_VFIO_GROUP=y\nCONFIG_VFIO_CONTAINER=y\n\
                      # CONFIG_IOMMUFD is not set\nCONFIG_VFIO_VIRQFD=y\n";
        assert_eq!(
            vfio_objects(m612, config),
            [
                "vfio_main.o",
                "iova_bitmap.o",
                "group.o",
                "container.o",
                "virqfd.o"
            ]
        );
    }

    #[test]
    fn config_changes_check_the_kernel_config() {
        let debian = "CONFIG_VFIO=m\nCONFIG_VFIO_GROUP=y\nCONFIG_VFIO_CONTAINER=y\n\
                      CONFIG_VFIO_IOMMU_TYPE1=m\n# CONFIG_VFIO_NOIOMMU is not set\n\
                      CONFIG_VFIO_PCI_CORE=m\nCONFIG_VFIO_PCI=m\nCONFIG_IOMMU_API=y\n\
                      # CONFIG_IOMMUFD is not set\n";
        assert_eq!(config_changes(debian).unwrap(), CONFIG_CHANGES);
        // Already as wanted: not changed again.
        let with = format!("{debian}CONFIG_VFIO_NOIOMMU=y\n");
        assert_eq!(
            config_changes(&with).unwrap(),
            [("IOMMUFD", "m"), ("VFIO_DEVICE_CDEV", "y")]
        );
        let e = config_changes(&format!("{debian}CONFIG_IOMMUFD=y\n")).unwrap_err();
        assert!(e.0.contains("CONFIG_IOMMUFD=y"), "{e}");
        let e = config_changes(&debian.replace("CONFIG_VFIO_CONTAINER=y\n", "")).unwrap_err();
        assert!(e.0.contains("CONFIG_VFIO_CONTAINER=(unset)"), "{e}");
        let e = config_changes(&format!("{debian}CONFIG_IOMMUFD_VFIO_CONTAINER=y\n")).unwrap_err();
        assert!(e.0.contains("/dev/vfio/vfio"), "{e}");
    }

    #[test]
    fn span_iter_source_takes_the_section_without_exports() {
        let lib = "#include <linux/interval_tree.h>\nINTERVAL_TREE_DEFINE(x)\n\
                   EXPORT_SYMBOL_GPL(interval_tree_insert);\n\n\
                   #ifdef CONFIG_INTERVAL_TREE_SPAN_ITER\nvoid interval_tree_span_iter_first(void)\n\
                   {\n#ifdef X\n#endif\n}\nEXPORT_SYMBOL_GPL(interval_tree_span_iter_first);\n#endif\n";
        let s = span_iter_source(lib).unwrap();
        assert!(s.contains("void interval_tree_span_iter_first(void)\n{\n#ifdef X\n#endif\n}\n"));
        assert!(!s.contains("EXPORT_SYMBOL"), "{s}");
        assert!(
            !s.contains("INTERVAL_TREE_DEFINE") && !s.contains("CONFIG_INTERVAL"),
            "{s}"
        );
        assert!(span_iter_source("int x;\n").is_none());
    }

    #[test]
    fn dependents_left_names_what_still_needs_the_old_vfio() {
        let dep = "kernel/drivers/gpu/drm/i915/kvmgt.ko: kernel/drivers/gpu/drm/i915/i915.ko \
                   kernel/drivers/vfio/vfio.ko\n\
                   kernel/drivers/vfio/pci/vfio-pci.ko: kernel/drivers/vfio/pci/vfio-pci-core.ko \
                   kernel/drivers/vfio/vfio.ko\n\
                   kernel/drivers/vfio/vfio.ko: kernel/drivers/iommu/iommufd/iommufd.ko\n\
                   kernel/drivers/vfio/mdev/mdev.ko:\n";
        assert_eq!(dependents_left(dep), ["kvmgt"]);
    }
}
