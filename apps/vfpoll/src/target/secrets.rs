//! DH-HMAC-CHAP secrets for `vfpoll target`: per host in the TOML file (`dhchap_secret`,
//! `dhchap_ctrl_secret`, `dhchap_hashes`, `dhchap_dhgroups` in a `[[subsystem.host]]`) or on
//! the command line from files (`--dhchap-secret NQN=FILE`, `--dhchap-ctrl-secret NQN=FILE`).
//!
//! A file that holds secrets must be readable by its owner only (as SPDK's keyring and ssh
//! refuse keys others can read): one with any group or other permission bit is refused with
//! the `chmod 600` that fixes it. Secrets never go on the command line itself, where every
//! local user sees them (`ps`).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context as _};
use vfpoll_nvmf::auth::{DhGroup, HashId, HostAuth, Secret};

/// Refuses `path` unless only its owner may read it; `why` says what it holds.
pub fn check_private(path: &Path, why: &str) -> anyhow::Result<()> {
    let mode = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "{}: {why}, and its mode {:04o} lets group or others read it; run `chmod 600 {}` (and keep it owned by the user that runs the target)",
            path.display(),
            mode & 0o7777,
            path.display()
        );
    }
    Ok(())
}

/// What a `[[subsystem.host]]` says about authentication.
#[derive(Debug, Default)]
pub struct HostKeys<'a> {
    /// `dhchap_secret`.
    pub secret: Option<&'a str>,
    /// `dhchap_ctrl_secret`.
    pub ctrl_secret: Option<&'a str>,
    /// `dhchap_hashes`.
    pub hashes: Option<&'a [String]>,
    /// `dhchap_dhgroups`.
    pub groups: Option<&'a [String]>,
}

/// The authentication a host's keys ask for: `None` without `dhchap_secret` (then the other
/// keys are refused: they would do nothing).
pub fn host_auth(k: &HostKeys<'_>) -> anyhow::Result<Option<HostAuth>> {
    let Some(secret) = k.secret else {
        if k.ctrl_secret.is_some() || k.hashes.is_some() || k.groups.is_some() {
            bail!("dhchap_ctrl_secret, dhchap_hashes and dhchap_dhgroups need the host's dhchap_secret");
        }
        return Ok(None);
    };
    let host = Secret::parse(secret).context("dhchap_secret")?;
    let controller = k
        .ctrl_secret
        .map(|s| Secret::parse(s).context("dhchap_ctrl_secret"))
        .transpose()?;
    if controller.as_ref() == Some(&host) {
        bail!("dhchap_ctrl_secret is the host's own secret: give the controller a secret of its own (`nvme gen-dhchap-key`), or a host that learnt one could pose as the target");
    }
    let mut a = HostAuth::new(host, controller);
    if let Some(h) = k.hashes {
        a.hashes = h
            .iter()
            .map(|n| {
                HashId::from_name(n)
                    .with_context(|| format!("dhchap_hashes: {n:?}: use sha256, sha384 or sha512"))
            })
            .collect::<anyhow::Result<_>>()?;
        if a.hashes.is_empty() {
            bail!("dhchap_hashes is empty: name at least one of sha256, sha384, sha512");
        }
    }
    if let Some(g) = k.groups {
        a.groups = g
            .iter()
            .map(|n| {
                DhGroup::from_name(n).with_context(|| {
                    format!("dhchap_dhgroups: {n:?}: use null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144 or ffdhe8192")
                })
            })
            .collect::<anyhow::Result<_>>()?;
        if a.groups.is_empty() {
            bail!("dhchap_dhgroups is empty: name at least one group (null for none)");
        }
    }
    Ok(Some(a))
}

/// The hosts of `--dhchap-secret NQN=FILE` and `--dhchap-ctrl-secret NQN=FILE`.
pub fn from_args(
    secrets: &[String],
    ctrl_secrets: &[String],
) -> anyhow::Result<BTreeMap<String, Arc<HostAuth>>> {
    fn split<'a>(flag: &str, arg: &'a str) -> anyhow::Result<(&'a str, &'a Path)> {
        if arg.starts_with("DHHC-1:") || arg.contains("=DHHC-1:") {
            bail!("{flag}: give NQN=FILE with the secret in FILE (chmod 600), not the secret itself: a command line is visible to every local user");
        }
        let Some((nqn, file)) = arg.rsplit_once('=') else {
            bail!("{flag} {arg:?}: expected NQN=FILE");
        };
        Ok((nqn, Path::new(file)))
    }
    fn read(flag: &str, path: &Path) -> anyhow::Result<String> {
        check_private(path, &format!("{flag} reads a DH-HMAC-CHAP secret from it"))?;
        std::fs::read_to_string(path).with_context(|| format!("{flag}: reading {}", path.display()))
    }
    let mut texts: BTreeMap<String, (String, Option<String>)> = BTreeMap::new();
    for arg in secrets {
        let (nqn, path) = split("--dhchap-secret", arg)?;
        if texts
            .insert(nqn.to_owned(), (read("--dhchap-secret", path)?, None))
            .is_some()
        {
            bail!("--dhchap-secret: host {nqn} is given twice");
        }
    }
    for arg in ctrl_secrets {
        let (nqn, path) = split("--dhchap-ctrl-secret", arg)?;
        let Some(t) = texts.get_mut(nqn) else {
            bail!("--dhchap-ctrl-secret {nqn}: that host has no --dhchap-secret");
        };
        if t.1.replace(read("--dhchap-ctrl-secret", path)?).is_some() {
            bail!("--dhchap-ctrl-secret: host {nqn} is given twice");
        }
    }
    let mut out = BTreeMap::new();
    for (nqn, (secret, ctrl)) in texts {
        let keys = HostKeys {
            secret: Some(&secret),
            ctrl_secret: ctrl.as_deref(),
            ..HostKeys::default()
        };
        let a = host_auth(&keys)
            .with_context(|| format!("host {nqn}"))?
            .expect("a secret was given");
        out.insert(nqn, Arc::new(a));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    const CTRL: &str = "DHHC-1:00:QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl9YjiZe:";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:5f1c1a52-7a8e-4c8b-9d0e-76667061726b";

    fn file(text: &str, mode: u32) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        f
    }

    #[test]
    fn secret_files_must_be_private_and_hold_valid_secrets() {
        let key = file(&format!("{KEY}\n"), 0o600);
        let ctrl = file(CTRL, 0o400);
        let arg = |f: &tempfile::NamedTempFile| format!("{HOST}={}", f.path().display());
        let m = from_args(&[arg(&key)], &[arg(&ctrl)]).unwrap();
        assert!(m[HOST].controller.is_some());
        let open = file(KEY, 0o640);
        let e = format!("{:#}", from_args(&[arg(&open)], &[]).unwrap_err());
        assert!(e.contains("chmod 600") && e.contains("0640"), "{e}");
        let e = format!("{:#}", from_args(&[format!("{HOST}={KEY}")], &[]).unwrap_err());
        assert!(e.contains("not the secret itself"), "{e}");
        let bad = file("DHHC-1:00:AAEC:", 0o600);
        let e = format!("{:#}", from_args(&[arg(&bad)], &[]).unwrap_err());
        assert!(e.contains("32, 48 or 64"), "{e}");
        let e = format!("{:#}", from_args(&[], &[arg(&ctrl)]).unwrap_err());
        assert!(e.contains("no --dhchap-secret"), "{e}");
    }

    #[test]
    fn host_keys_are_checked() {
        let hashes = vec!["sha512".to_owned()];
        let groups = vec!["ffdhe4096".to_owned(), "null".to_owned()];
        let a = host_auth(&HostKeys {
            secret: Some(KEY),
            ctrl_secret: Some(CTRL),
            hashes: Some(&hashes),
            groups: Some(&groups),
        })
        .unwrap()
        .unwrap();
        assert_eq!(a.hashes, vec![HashId::Sha512]);
        assert_eq!(a.groups, vec![DhGroup::Ffdhe4096, DhGroup::Null]);
        let e = |k: HostKeys<'_>| format!("{:#}", host_auth(&k).unwrap_err());
        assert!(e(HostKeys {
            secret: Some(KEY),
            ctrl_secret: Some(KEY),
            ..HostKeys::default()
        })
        .contains("secret of its own"));
        assert!(e(HostKeys {
            ctrl_secret: Some(CTRL),
            ..HostKeys::default()
        })
        .contains("need the host's dhchap_secret"));
        let md5 = vec!["md5".to_owned()];
        assert!(e(HostKeys {
            secret: Some(KEY),
            hashes: Some(&md5),
            ..HostKeys::default()
        })
        .contains("sha256, sha384 or sha512"));
        assert!(host_auth(&HostKeys::default()).unwrap().is_none());
    }
}
