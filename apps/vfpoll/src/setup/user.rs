//! `vfpoll setup --user NAME`: what an unprivileged user needs for a run, given by root.
//!
//! A run opens VFIO nodes, maps hugepages and has VFIO pin them for DMA. Root gives the user:
//! - **the device nodes**: `/dev/vfio/<group>` (type1 container path) and, where the kernel has
//!   VFIO device cdevs and iommufd, `/dev/vfio/devices/vfioN` and `/dev/iommu`, chowned to the
//!   user (devtmpfs makes them root's: mode 0600, `/dev/iommu` 0660). `/dev/vfio/vfio` is
//!   read-write for everyone already (the kernel registers it with mode 0666); made so if not.
//! - **hugetlbfs**: the mount's root folder chowned to the user (the kernel mounts it 0755 for
//!   its mounter), for file-backed DMA memory. Anonymous `MAP_HUGETLB`, what the tools use,
//!   needs no permission (only the pool's free pages).
//! - **the memlock limit**: VFIO charges every page it pins to `RLIMIT_MEMLOCK` unless the
//!   process has `CAP_IPC_LOCK`: type1 to the process's `locked_vm` (`vfio_pin_pages_remote`,
//!   `vfio_lock_acct` in `drivers/vfio/vfio_iommu_type1.c`), iommufd to the user's, summed over
//!   all its processes (`IOPT_PAGES_ACCOUNT_USER`, `drivers/iommu/iommufd/pages.c`). `mlock` of
//!   hugetlb memory is checked against the same limit (`do_mlock`) but not charged
//!   (`mlock_fixup` skips hugetlb mappings). So a run needs a limit of at least the DMA memory it
//!   maps, which on hugepages is at most the reservation: setup prints that figure and how to
//!   set it, and with `--pid` raises it for running processes (`prlimit(2)`).
//!
//! No-IOMMU mode cannot be given away: opening `/dev/vfio/noiommu-N` and choosing the no-IOMMU
//! "IOMMU" need `CAP_SYS_RAWIO` (`vfio_group_fops_open`, `vfio_noiommu_open`), and the physical
//! addresses its devices need come from `/proc/self/pagemap`, which shows frame numbers only to
//! `CAP_SYS_ADMIN`. `setup --user` refuses it with that reason.
//!
//! Each ownership change is recorded in `<state dir>/user-grants` with what it replaced;
//! `vfpoll reset` puts it back (a device's nodes also vanish when it leaves vfio-pci, and are
//! root's again when it is bound anew: run `setup --user` again then).

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use vfpoll_pci::bind;
use vfpoll_pci::sysfs;
use vfpoll_pci::{Bdf, Host};

/// The reason no-IOMMU mode stays root's, in the words setup and doctor print.
pub const NOIOMMU_NEEDS_ROOT: &str = "no-IOMMU mode needs root: opening /dev/vfio/noiommu-N needs \
    CAP_SYS_RAWIO, and the physical addresses its devices DMA to come from /proc/self/pagemap, which \
    shows them only to CAP_SYS_ADMIN; no file ownership can give that to a user";

/// The file (in the state folder) that lists the ownership changes of `setup --user`.
pub const GRANTS_FILE: &str = "user-grants";

/// A user to give the devices to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Login name, or the number when the user database has none.
    pub name: String,
    /// User ID.
    pub uid: u32,
    /// Primary group; `None` for a numeric ID the user database does not know.
    pub gid: Option<u32>,
}

impl fmt::Display for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name == self.uid.to_string() {
            write!(f, "uid {}", self.uid)
        } else {
            write!(f, "{} (uid {})", self.name, self.uid)
        }
    }
}

/// Whether `host` is a fake tree (`--root`) rather than the machine.
fn is_fake(host: &Host) -> bool {
    host.proc != Path::new("/proc")
}

/// The root folder of `host`'s trees: `/`, or the `--root` folder.
fn root_of(host: &Host) -> PathBuf {
    host.proc.parent().unwrap_or(Path::new("/")).to_owned()
}

/// An absolute machine path as seen in `host`'s trees (`/dev/hugepages` is
/// `<root>/dev/hugepages` under `--root`).
pub fn on_host(host: &Host, p: &Path) -> PathBuf {
    if is_fake(host) {
        root_of(host).join(p.strip_prefix("/").unwrap_or(p))
    } else {
        p.to_owned()
    }
}

/// `(name, uid, gid)` of each entry of `<root>/etc/passwd`.
fn passwd(host: &Host) -> Vec<(String, u32, u32)> {
    let text = fs::read_to_string(root_of(host).join("etc/passwd")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((
                f.first()?.to_string(),
                f.get(2)?.parse().ok()?,
                f.get(3)?.parse().ok()?,
            ))
        })
        .collect()
}

/// Finds the user `spec` names (a login name or a numeric user ID) in `<root>/etc/passwd`, on
/// the machine also through the system's user database (NSS: LDAP, sssd).
pub fn resolve(host: &Host, spec: &str) -> anyhow::Result<User> {
    let db = passwd(host);
    let found = match spec.parse::<u32>() {
        Ok(uid) => db.iter().find(|e| e.1 == uid),
        Err(_) => db.iter().find(|e| e.0 == spec),
    };
    let user = match found {
        Some((name, uid, gid)) => User {
            name: name.clone(),
            uid: *uid,
            gid: Some(*gid),
        },
        None => {
            let nss = if is_fake(host) {
                None
            } else {
                match spec.parse::<u32>() {
                    Ok(uid) => nix::unistd::User::from_uid(uid.into()).ok().flatten(),
                    Err(_) => nix::unistd::User::from_name(spec).ok().flatten(),
                }
            };
            match (nss, spec.parse::<u32>()) {
                (Some(u), _) => User {
                    name: u.name,
                    uid: u.uid.as_raw(),
                    gid: Some(u.gid.as_raw()),
                },
                (None, Ok(uid)) => User {
                    name: uid.to_string(),
                    uid,
                    gid: None,
                },
                (None, Err(_)) => bail!(
                    "there is no user `{spec}` (not in {}): create it first (adduser {spec}), or pass a numeric user ID",
                    root_of(host).join("etc/passwd").display()
                ),
            }
        }
    };
    if user.uid == 0 {
        bail!("--user {spec} is root, who needs no setup --user: name the unprivileged user that will run vfpoll");
    }
    Ok(user)
}

/// The login name of `uid` (its number when the user database has none), for the fixes the
/// doctor prints.
pub fn name_of(host: &Host, uid: u32) -> String {
    if let Some((n, ..)) = passwd(host).into_iter().find(|e| e.1 == uid) {
        return n;
    }
    if !is_fake(host) {
        if let Ok(Some(u)) = nix::unistd::User::from_uid(uid.into()) {
            return u.name;
        }
    }
    uid.to_string()
}

/// Owner, group and permission bits of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Permission bits (`0o7777`).
    pub mode: u32,
}

/// Under `--root`, ownership changes go to this file of the state folder (`<uid> <gid> <mode>
/// <path>` per line) instead of the files: the tests run without root.
const FAKE_OWNERS: &str = "fake-owners";

fn fake_owners(host: &Host) -> PathBuf {
    root_of(host).join("run/vfpoll").join(FAKE_OWNERS)
}

fn fake_table(host: &Host) -> Vec<(Owner, PathBuf)> {
    let text = fs::read_to_string(fake_owners(host)).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(4, ' ');
            let uid = f.next()?.parse().ok()?;
            let gid = f.next()?.parse().ok()?;
            let mode = u32::from_str_radix(f.next()?, 8).ok()?;
            Some((Owner { uid, gid, mode }, PathBuf::from(f.next()?)))
        })
        .collect()
}

/// Who owns `p` (a path in `host`'s trees).
pub fn owner(host: &Host, p: &Path) -> io::Result<Owner> {
    let m = fs::metadata(p)?;
    if is_fake(host) {
        if let Some((o, _)) = fake_table(host).into_iter().rev().find(|(_, q)| q == p) {
            return Ok(o);
        }
    }
    Ok(Owner {
        uid: m.uid(),
        gid: m.gid(),
        mode: m.mode() & 0o7777,
    })
}

/// Gives `p` the owner, group and mode of `o`.
fn set_owner(host: &Host, p: &Path, o: Owner) -> io::Result<()> {
    if is_fake(host) {
        let file = fake_owners(host);
        fs::create_dir_all(file.parent().unwrap_or(Path::new("/")))?;
        let mut t = fs::read_to_string(&file).unwrap_or_default();
        t.push_str(&format!("{} {} {:o} {}\n", o.uid, o.gid, o.mode, p.display()));
        return fs::write(file, t);
    }
    let now = owner(host, p)?;
    if (now.uid, now.gid) != (o.uid, o.gid) {
        nix::unistd::chown(p, Some(o.uid.into()), Some(o.gid.into())).map_err(io::Error::from)?;
    }
    // chown clears set-user/group-ID bits: write the mode after it.
    if now.mode != o.mode || (now.uid, now.gid) != (o.uid, o.gid) {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(p, fs::Permissions::from_mode(o.mode))?;
    }
    Ok(())
}

/// One recorded ownership change: `path` was given to `to`; it had `was` before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The device whose node it is; `None` for the shared ones (`/dev/iommu`, hugetlbfs).
    pub bdf: Option<Bdf>,
    /// The user it was given to.
    pub to: u32,
    /// Its owner before.
    pub was: Owner,
    /// The path (in `host`'s trees).
    pub path: PathBuf,
}

fn grants_path(state_dir: &Path) -> PathBuf {
    state_dir.join(GRANTS_FILE)
}

/// The grants recorded in `state_dir`.
pub fn grants(state_dir: &Path) -> Vec<Grant> {
    let text = fs::read_to_string(grants_path(state_dir)).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.splitn(6, ' ').collect();
            let [bdf, to, uid, gid, mode, path] = f[..] else {
                return None;
            };
            Some(Grant {
                bdf: if bdf == "-" { None } else { Some(bdf.parse().ok()?) },
                to: to.parse().ok()?,
                was: Owner {
                    uid: uid.parse().ok()?,
                    gid: gid.parse().ok()?,
                    mode: u32::from_str_radix(mode, 8).ok()?,
                },
                path: PathBuf::from(path),
            })
        })
        .collect()
}

fn write_grants(state_dir: &Path, g: &[Grant]) -> io::Result<()> {
    let p = grants_path(state_dir);
    if g.is_empty() {
        return match fs::remove_file(&p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    fs::create_dir_all(state_dir)?;
    let text: String = g
        .iter()
        .map(|g| {
            let bdf = g.bdf.map_or("-".to_owned(), |b| b.to_string());
            let w = g.was;
            format!(
                "{bdf} {} {} {} {:o} {}\n",
                g.to,
                w.uid,
                w.gid,
                w.mode,
                g.path.display()
            )
        })
        .collect();
    let tmp = p.with_extension("tmp");
    fs::write(&tmp, text)?;
    fs::rename(tmp, p)
}

/// The VFIO nodes of a device on vfio-pci: its group node and, where the kernel has VFIO
/// device cdevs, `/dev/vfio/devices/vfioN` (named by the single entry of `<device>/vfio-dev/`).
pub fn device_nodes(host: &Host, bdf: Bdf) -> anyhow::Result<Vec<PathBuf>> {
    let d = sysfs::device(host, bdf)?;
    let Some(g) = d.iommu_group else {
        bail!("{bdf} has no IOMMU group: bind it to vfio-pci first (vfpoll bind {bdf})");
    };
    let Some(node) = bind::group_node(host, g) else {
        bail!("{bdf}: /dev/vfio/{g} is missing: bind it to vfio-pci first (vfpoll bind {bdf})");
    };
    let mut out = vec![node];
    if let Some(cdev) = cdev_node(host, bdf) {
        out.push(cdev);
    }
    Ok(out)
}

/// `/dev/vfio/devices/vfioN` of a device, when the kernel made one.
pub fn cdev_node(host: &Host, bdf: Bdf) -> Option<PathBuf> {
    let dir = host.pci_device_dir(bdf).join("vfio-dev");
    let name = fs::read_dir(dir).ok()?.filter_map(Result::ok).next()?.file_name();
    Some(host.dev.join("vfio/devices").join(name)).filter(|p| p.exists())
}

/// Whether `p` is a no-IOMMU group node (`/dev/vfio/noiommu-N`).
pub fn is_noiommu_node(p: &Path) -> bool {
    p.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("noiommu-"))
}

/// What [`give`] does with one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The user owns it with read-write access already.
    Unchanged,
    /// It was (or would be) given to the user.
    Given {
        /// Its owner before.
        was: Owner,
    },
}

/// Gives `path` to `user`: owner `user`, group its primary group (unchanged if unknown), owner
/// bits `rw` (`rwx` for a folder) added to the mode; records the change in `state_dir` unless
/// `dry_run`.
pub fn give(
    host: &Host,
    state_dir: &Path,
    user: &User,
    bdf: Option<Bdf>,
    path: &Path,
    dry_run: bool,
) -> anyhow::Result<Change> {
    let was = owner(host, path).with_context(|| format!("{}", path.display()))?;
    let is_dir = fs::metadata(path).is_ok_and(|m| m.is_dir());
    let own = if is_dir { 0o700 } else { 0o600 };
    let want = Owner {
        uid: user.uid,
        gid: user.gid.unwrap_or(was.gid),
        mode: was.mode | own,
    };
    if was.uid == user.uid && was.mode & own == own {
        return Ok(Change::Unchanged);
    }
    if dry_run {
        return Ok(Change::Given { was });
    }
    set_owner(host, path, want).with_context(|| {
        format!(
            "giving {} to {user} (chown {}: {})",
            path.display(),
            user.uid,
            path.display()
        )
    })?;
    let mut g = grants(state_dir);
    // The first record of a path keeps its original owner.
    if !g.iter().any(|x| x.path == path) {
        g.push(Grant {
            bdf,
            to: user.uid,
            was,
            path: path.to_owned(),
        });
        write_grants(state_dir, &g)
            .with_context(|| format!("recording in {}", grants_path(state_dir).display()))?;
    }
    Ok(Change::Given { was })
}

/// Makes `p` read-write for everyone (`/dev/vfio/vfio`, as the kernel makes it), recording the
/// change.
pub fn open_to_all(host: &Host, state_dir: &Path, path: &Path, dry_run: bool) -> anyhow::Result<Change> {
    let was = owner(host, path).with_context(|| format!("{}", path.display()))?;
    if was.mode & 0o666 == 0o666 {
        return Ok(Change::Unchanged);
    }
    if !dry_run {
        set_owner(
            host,
            path,
            Owner {
                mode: was.mode | 0o666,
                ..was
            },
        )
        .with_context(|| format!("chmod a+rw {}", path.display()))?;
        let mut g = grants(state_dir);
        if !g.iter().any(|x| x.path == path) {
            // Its owner stays: undo puts the mode back while it does.
            g.push(Grant {
                bdf: None,
                to: was.uid,
                was,
                path: path.to_owned(),
            });
            write_grants(state_dir, &g)?;
        }
    }
    Ok(Change::Given { was })
}

/// Which grants [`undo`] takes back.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// All of them.
    All,
    /// Those of these devices' nodes.
    Devices(&'a [Bdf]),
}

/// Gives back what `setup --user` gave: each recorded path that still exists and still has the
/// owner it was given gets its old owner, group and mode; a node that vanished (its device
/// left vfio-pci) or changed hands since is only dropped from the record. Returns one line per
/// path put back.
pub fn undo(host: &Host, state_dir: &Path, scope: Scope<'_>) -> anyhow::Result<Vec<String>> {
    let all = grants(state_dir);
    let (take, keep): (Vec<Grant>, Vec<Grant>) = all.into_iter().partition(|g| match scope {
        Scope::All => true,
        Scope::Devices(d) => g.bdf.is_some_and(|b| d.contains(&b)),
    });
    let mut lines = Vec::new();
    let mut failed = Vec::new();
    for g in take {
        let Ok(now) = owner(host, &g.path) else {
            continue;
        };
        if now.uid != g.to {
            continue;
        }
        match set_owner(host, &g.path, g.was) {
            Ok(()) => lines.push(format!(
                "user: {} back to owner {} (uid {}), mode {:o}",
                g.path.display(),
                name_of(host, g.was.uid),
                g.was.uid,
                g.was.mode
            )),
            Err(e) => {
                lines.push(format!("user: error: {}: {e}", g.path.display()));
                failed.push(g);
            }
        }
    }
    let mut rest = keep;
    rest.extend(failed);
    write_grants(state_dir, &rest)?;
    Ok(lines)
}

/// The memlock limit of process `pid` (`/proc/<pid>/limits`): `(soft, hard)`, `None` unlimited.
pub fn memlock_of(host: &Host, pid: u32) -> anyhow::Result<(Option<u64>, Option<u64>)> {
    let p = host.proc.join(pid.to_string()).join("limits");
    let text = fs::read_to_string(&p).with_context(|| format!("no process {pid} ({})", p.display()))?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("Max locked memory"))
        .with_context(|| format!("{} has no `Max locked memory` line", p.display()))?;
    let v: Vec<Option<u64>> = line.split_whitespace().take(2).map(|s| s.parse().ok()).collect();
    match v[..] {
        [soft, hard] => Ok((soft, hard)),
        _ => bail!("cannot read the memlock limit in {}", p.display()),
    }
}

/// The real user ID of process `pid` (`/proc/<pid>/status`).
pub fn uid_of(host: &Host, pid: u32) -> anyhow::Result<u32> {
    let p = host.proc.join(pid.to_string()).join("status");
    let text = fs::read_to_string(&p).with_context(|| format!("no process {pid} ({})", p.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("Uid:")?.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("{} has no Uid line", p.display()))
}

/// Sets the memlock limit of process `pid` (`prlimit(2)`; under `--root`, the fake
/// `/proc/<pid>/limits`).
fn set_memlock(host: &Host, pid: u32, soft: u64, hard: Option<u64>) -> anyhow::Result<()> {
    if is_fake(host) {
        let p = host.proc.join(pid.to_string()).join("limits");
        let text = fs::read_to_string(&p)?;
        let show = |v: Option<u64>| v.map_or("unlimited".to_owned(), |v| v.to_string());
        let new: String = text
            .lines()
            .map(|l| {
                if l.starts_with("Max locked memory") {
                    format!(
                        "{:<26}{:<21}{:<21}{:<10}\n",
                        "Max locked memory",
                        soft,
                        show(hard),
                        "bytes"
                    )
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        return Ok(fs::write(p, new)?);
    }
    use rustix::process::{prlimit, Pid, Resource, Rlimit};
    let raw = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .context("not a process ID")?;
    prlimit(
        Some(raw),
        Resource::Memlock,
        Rlimit {
            current: Some(soft),
            maximum: hard,
        },
    )
    .with_context(|| format!("prlimit(2) on process {pid}"))?;
    Ok(())
}

/// Raises the memlock limit of `pid`, a process of `user`, to at least `need` bytes (soft and,
/// if lower, hard); never lowers it. Returns what it did, as a line.
pub fn raise_memlock(host: &Host, user: &User, pid: u32, need: u64, dry_run: bool) -> anyhow::Result<String> {
    let uid = uid_of(host, pid)?;
    if uid != user.uid {
        bail!(
            "process {pid} runs as {}, not {user}: --pid names processes of the --user",
            name_of(host, uid)
        );
    }
    let show = |v: Option<u64>| v.map_or("unlimited".to_owned(), |b| format!("{} KiB", b >> 10));
    let (soft, hard) = memlock_of(host, pid)?;
    if soft.is_none_or(|s| s >= need) {
        return Ok(format!(
            "memlock: process {pid} may lock {} (>= {}); unchanged",
            show(soft),
            show(Some(need))
        ));
    }
    let new_hard = hard.map(|h| h.max(need));
    let would = if dry_run { "would raise" } else { "raised" };
    if !dry_run {
        set_memlock(host, pid, need, new_hard)?;
    }
    Ok(format!(
        "memlock: {would} process {pid}'s limit from {} (hard {}) to {} (hard {})",
        show(soft),
        show(hard),
        show(Some(need)),
        show(new_hard)
    ))
}

/// How to give `user` a memlock limit of `need` bytes, as lines to print.
pub fn memlock_advice(user: &User, need: u64) -> Vec<String> {
    let kib = need.div_ceil(1024);
    let mib = need.div_ceil(1 << 20);
    vec![
        format!(
            "memlock: runs of {user} pin up to {mib} MiB (the --hugepages reservation) and VFIO charges it to \
             RLIMIT_MEMLOCK (type1: per process; iommufd: per user, all its processes together), so the limit \
             must be at least {kib} KiB (the kernel's default is 8192 KiB)"
        ),
        format!(
            "memlock: to raise it: add `{} - memlock {kib}` to /etc/security/limits.conf (new logins), or \
             LimitMEMLOCK={mib}M in a systemd unit, or for a running process `prlimit --memlock={need} --pid PID` \
             or `vfpoll setup --user {} --hugepages {mib} --pid PID`",
            user.name, user.name
        ),
    ]
}

#[cfg(test)]
pub(crate) mod tests;
