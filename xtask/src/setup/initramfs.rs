//! The guest's initramfs: busybox, the init script, the kernel modules a mode needs (with their
//! dependencies), stamped so that an unchanged set is not rebuilt.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{module_name, vfio, KernelDir, BUSYBOX, INIT, INITRAMFS_FORMAT, MODULES, OPTIONAL_MODULES};
use crate::cpio;
use crate::util::{err, mkdir, read_opt, run_quiet, write, Context, Fnv, Note, Result};

/// The modules of [`MODULES`] (and of [`OPTIONAL_MODULES`] where the tree has them) and
/// everything they depend on: (names, files relative to the module dir), from the boot module
/// tree's `modules.dep` ([`KernelDir::boot_module_dir`]).
pub(super) fn module_closure(kd: &KernelDir) -> Result<(Vec<String>, Vec<String>)> {
    let dep_path = kd.boot_module_dir().join("modules.dep");
    let deps = fs::read_to_string(&dep_path).context(dep_path.display())?;
    let mut by_name = std::collections::HashMap::new();
    for line in deps.lines() {
        let Some((file, rest)) = line.split_once(':') else {
            continue;
        };
        let stem = file.rsplit('/').next().unwrap_or(file);
        let name = stem.split(".ko").next().unwrap_or(stem);
        let rest: Vec<&str> = rest.split_whitespace().collect();
        by_name.insert(module_name(name), (file, rest));
    }
    // Built into the kernel (6.12 builds virtio_pci in): nothing to copy, and modprobe, which
    // reads modules.builtin, has nothing to load.
    let builtin_path = kd.boot_module_dir().join("modules.builtin");
    let builtin: std::collections::HashSet<String> = read_opt(&builtin_path)
        .unwrap_or_default()
        .lines()
        .map(|f| {
            let stem = f.rsplit('/').next().unwrap_or(f);
            module_name(stem.split(".ko").next().unwrap_or(stem))
        })
        .collect();
    let mut files = std::collections::BTreeSet::new();
    let mut names = Vec::new();
    let optional = OPTIONAL_MODULES
        .iter()
        .filter(|m| by_name.contains_key(&module_name(m)));
    for m in MODULES.iter().chain(optional) {
        if builtin.contains(&module_name(m)) {
            names.push(module_name(m));
            continue;
        }
        let (file, rest) = by_name
            .get(&module_name(m))
            .ok_or_else(|| err!("module {m} is neither in {} nor built in", dep_path.display()))?;
        files.insert(file.to_string());
        files.extend(rest.iter().map(|s| s.to_string()));
    }
    names.extend(files.iter().map(|f| {
        let stem = f.rsplit('/').next().unwrap_or(f);
        module_name(stem.split(".ko").next().unwrap_or(stem))
    }));
    names.sort();
    names.dedup();
    Ok((names, files.into_iter().collect()))
}

pub(super) fn stamp_path(kd: &KernelDir, mode: &str) -> PathBuf {
    kd.dir.join(format!("initramfs-{mode}.stamp"))
}

/// A hash of everything that goes into an initramfs.
pub(super) fn stamp(kd: &KernelDir, files: &[String], vfio: Option<&Path>) -> Result<String> {
    let bb = fs::metadata(BUSYBOX).context(BUSYBOX)?;
    let mut h = Fnv::new()
        .add(INITRAMFS_FORMAT.as_bytes())
        .add(kd.kver.as_bytes())
        .add(INIT.as_bytes())
        .add(&bb.len().to_le_bytes())
        .add(&bb.mtime().to_le_bytes());
    for f in files {
        h = h.add(f.as_bytes());
    }
    if let Some(ko) = vfio {
        h = h.add(&fs::read(ko).context(ko.display())?);
    }
    if kd.iommufd {
        h = h.add(vfio::fingerprint(kd).as_bytes());
    }
    Ok(h.hex())
}

/// Builds `initramfs-<mode>.cpio`: static busybox, `/init`, `/dev/console` and the module closure
/// (with `vfio` replaced by `vfio_ko` when given), `modules.dep` made by busybox's depmod.
pub(super) fn initramfs(kd: &KernelDir, mode: &str, vfio_ko: Option<&Path>) -> Result<(Vec<String>, Note)> {
    let (names, files) = module_closure(kd)?;
    let stamp_now = stamp(kd, &files, vfio_ko)?;
    let out = kd.initramfs(mode);
    if out.exists() && read_opt(&stamp_path(kd, mode)).as_deref() == Some(&stamp_now) {
        return Ok((names, Note::Cached));
    }

    // Stage the module tree so that busybox depmod can index exactly these modules.
    let stage = kd.dir.join(format!("initramfs-{mode}.d"));
    let _ = fs::remove_dir_all(&stage);
    let mdir_rel = format!("lib/modules/{}", kd.kver);
    let mdir = stage.join(&mdir_rel);
    for f in &files {
        let dst = mdir.join(f);
        mkdir(dst.parent().unwrap_or(&mdir))?;
        let is_vfio = f.rsplit('/').next().is_some_and(|s| s.starts_with("vfio.ko"));
        match vfio_ko {
            Some(ko) if is_vfio => {
                if f.ends_with(".ko") {
                    fs::copy(ko, &dst).context(ko.display())?;
                } else {
                    return Err(err!("{f}: cannot replace a compressed module"));
                }
            }
            _ => {
                fs::copy(kd.boot_module_dir().join(f), &dst).context(f)?;
            }
        }
    }
    for f in ["modules.builtin", "modules.builtin.modinfo", "modules.order"] {
        let src = kd.boot_module_dir().join(f);
        if src.exists() {
            fs::copy(&src, mdir.join(f))?;
        }
    }
    run_quiet(
        Command::new(BUSYBOX)
            .args(["depmod", "-b"])
            .arg(&stage)
            .arg(&kd.kver),
    )?;

    let tmp = out.with_extension("tmp");
    let file = fs::File::create(&tmp).context(tmp.display())?;
    let mut w = cpio::Writer::new(std::io::BufWriter::new(file));
    for d in ["bin", "dev", "lib", "lib/modules"] {
        w.dir(d, 0o755)?;
    }
    w.char_dev("dev/console", 0o600, 5, 1)?;
    w.file("bin/busybox", 0o755, &fs::read(BUSYBOX).context(BUSYBOX)?)?;
    w.file("init", 0o755, INIT.as_bytes())?;
    add_tree(&mut w, &stage, &mdir_rel)?;
    w.finish()?;
    fs::rename(&tmp, &out)?;
    fs::remove_dir_all(&stage)?;
    write(&stamp_path(kd, mode), &stamp_now)?;
    let size = fs::metadata(&out)?.len();
    Ok((
        names,
        Note::Text(format!(
            "{} modules, {:.1} MiB",
            files.len(),
            size as f64 / (1 << 20) as f64
        )),
    ))
}

/// Adds `root/rel` and everything below it, sorted so the archive is reproducible.
fn add_tree<W: std::io::Write>(w: &mut cpio::Writer<W>, root: &Path, rel: &str) -> Result<()> {
    let path = root.join(rel);
    let meta = fs::metadata(&path)?;
    let perm = meta.permissions().mode() & 0o7777;
    if meta.is_dir() {
        w.dir(rel, perm)?;
        let mut names: Vec<String> = fs::read_dir(&path)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?;
        names.sort();
        for n in names {
            add_tree(w, root, &format!("{rel}/{n}"))?;
        }
    } else {
        w.file(rel, perm, &fs::read(&path)?)?;
    }
    Ok(())
}
