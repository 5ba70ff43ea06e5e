//! Small helpers shared by the subcommands: the error type, running child processes, timing,
//! shell quoting and a stable hash.

use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Every failure of a task: a message for the user, already with its context.
#[derive(Debug)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error(e.to_string())
    }
}

/// The result of every task.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Builds an [`Error`] from format arguments, like `format!`.
macro_rules! err {
    ($($arg:tt)*) => { $crate::util::Error(format!($($arg)*)) };
}
pub(crate) use err;

/// Adds context (usually a path) to I/O errors.
pub trait Context<T> {
    /// Prefixes the error message with `what`.
    fn context(self, what: impl fmt::Display) -> Result<T>;
}

impl<T, E: fmt::Display> Context<T> for Result<T, E> {
    fn context(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|e| err!("{what}: {e}"))
    }
}

/// `cmd` as a shell would show it, for error messages and `--print-cmd`: the variables set for
/// it first (QEMU 10's `QEMU_MODULE_DIR`, ...), then the program and its arguments.
pub fn show(cmd: &Command) -> String {
    let mut words: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| v.map(|v| format!("{}={}", k.to_string_lossy(), shell_quote(v))))
        .collect();
    words.push(shell_quote(cmd.get_program()));
    words.extend(cmd.get_args().map(shell_quote));
    words.join(" ")
}

/// Runs `cmd` with inherited stdio; fails unless it exits with 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().context(format_args!("cannot run {}", show(cmd)))?;
    if status.success() {
        Ok(())
    } else {
        Err(err!("{} failed ({status})", show(cmd)))
    }
}

/// Runs `cmd` with its output captured; fails (quoting the output) unless it exits with 0.
pub fn run_quiet(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .context(format_args!("cannot run {}", show(cmd)))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(err!(
            "{} failed ({})\n{}{}",
            show(cmd),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Runs `cmd` quietly and returns its stdout as text.
pub fn stdout_of(cmd: &mut Command) -> Result<String> {
    Ok(String::from_utf8_lossy(&run_quiet(cmd)?.stdout).into_owned())
}

/// Runs `f` and prints `<prefix>: <label> ... <seconds>` (with `note` when it returns one).
pub fn step<T>(prefix: &str, label: &str, f: impl FnOnce() -> Result<(T, Note)>) -> Result<T> {
    let t0 = Instant::now();
    match f() {
        Ok((v, note)) => {
            let note = match note {
                Note::None => String::new(),
                Note::Cached => " (cached)".into(),
                Note::Text(t) => format!(" ({t})"),
            };
            eprintln!("{prefix}: {label:<28} {}{note}", secs(t0.elapsed()));
            Ok(v)
        }
        Err(e) => {
            eprintln!("{prefix}: {label:<28} {} FAILED", secs(t0.elapsed()));
            Err(e)
        }
    }
}

/// What [`step`] adds to its line.
pub enum Note {
    /// Nothing.
    None,
    /// The result was already there.
    Cached,
    /// A short remark.
    Text(String),
}

/// A duration as seconds with one decimal, e.g. `4.2 s`.
pub fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// Quotes `s` for a POSIX shell (single quotes unless it is made of safe characters only).
pub fn shell_quote(s: &OsStr) -> String {
    String::from_utf8_lossy(&shell_quote_bytes(s.as_bytes())).into_owned()
}

/// Byte-exact [`shell_quote`], for arguments that are not UTF-8.
pub fn shell_quote_bytes(s: &[u8]) -> Vec<u8> {
    let safe = |b: &u8| b.is_ascii_alphanumeric() || b"_-./=:,+@%".contains(b);
    if !s.is_empty() && s.iter().all(safe) {
        return s.to_vec();
    }
    let mut q = vec![b'\''];
    for &b in s {
        if b == b'\'' {
            q.extend_from_slice(b"'\\''");
        } else {
            q.push(b);
        }
    }
    q.push(b'\'');
    q
}

/// 64-bit FNV-1a: a hash that stays the same across Rust versions (stamps on disk).
#[derive(Clone, Copy)]
pub struct Fnv(u64);

impl Fnv {
    /// The empty hash.
    pub fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    /// Mixes `bytes` in, followed by a separator so that `("ab","c")` and `("a","bc")` differ.
    pub fn add(mut self, bytes: &[u8]) -> Self {
        for &b in bytes.iter().chain(&[0xff]) {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        self
    }

    /// The hash as 16 hex digits.
    pub fn hex(self) -> String {
        format!("{:016x}", self.0)
    }
}

/// Creates `dir` (and parents) and returns it.
pub fn mkdir(dir: impl AsRef<Path>) -> Result<PathBuf> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).context(format_args!("cannot create {}", dir.display()))?;
    Ok(dir.to_path_buf())
}

/// Reads a small text file, `None` when it does not exist or cannot be read.
pub fn read_opt(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Writes `text` to `path` (replacing it).
pub fn write(path: &Path, text: impl AsRef<[u8]>) -> Result<()> {
    std::fs::write(path, text).context(format_args!("cannot write {}", path.display()))
}

/// 64 random bits from `/dev/urandom`.
pub fn random_u64() -> Result<u64> {
    use std::io::Read;
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .context("cannot read /dev/urandom")?;
    Ok(u64::from_le_bytes(b))
}

/// A lock file holding the pid of the `xtask` that owns a directory (a run dir, the assets).
///
/// Another `xtask` sees it and waits or goes elsewhere; a lock whose process is gone (killed)
/// is taken over. Removed on drop.
#[derive(Debug)]
pub struct Lock {
    path: PathBuf,
}

impl Lock {
    /// Takes the lock at `path`, or `None` when a live `xtask` holds it.
    pub fn try_acquire(path: &Path) -> Result<Option<Lock>> {
        loop {
            match fs::OpenOptions::new().write(true).create_new(true).open(path) {
                Ok(mut f) => {
                    use std::io::Write;
                    write!(f, "{}", std::process::id()).context(path.display())?;
                    return Ok(Some(Lock {
                        path: path.to_path_buf(),
                    }));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if Self::holder(path).is_some() {
                        return Ok(None);
                    }
                    // Stale: its xtask is gone.
                    match fs::remove_file(path) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => {
                            return Err(err!("{}: {e}", path.display()))
                        }
                        _ => {}
                    }
                }
                Err(e) => return Err(err!("{}: {e}", path.display())),
            }
        }
    }

    /// Takes the lock at `path`, waiting (with a message) while another `xtask` holds it.
    pub fn acquire(path: &Path) -> Result<Lock> {
        let t0 = Instant::now();
        let mut told = false;
        loop {
            if let Some(l) = Self::try_acquire(path)? {
                return Ok(l);
            }
            if !told && t0.elapsed() > Duration::from_secs(1) {
                let pid = Self::holder(path).unwrap_or(0);
                eprintln!("xtask: waiting for {} (held by pid {pid})", path.display());
                told = true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The pid in the lock file, when that process is a live `xtask`.
    fn holder(path: &Path) -> Option<u32> {
        let pid: u32 = fs::read_to_string(path).ok()?.trim().parse().ok()?;
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (comm.trim() == "xtask").then_some(pid)
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote(OsStr::new("ls")), "ls");
        assert_eq!(shell_quote(OsStr::new("")), "''");
        assert_eq!(shell_quote(OsStr::new("a b")), "'a b'");
        assert_eq!(shell_quote(OsStr::new("it's")), "'it'\\''s'");
        assert_eq!(shell_quote(OsStr::new("$HOME")), "'$HOME'");
    }

    #[test]
    fn fnv_separates_fields() {
        assert_ne!(
            Fnv::new().add(b"ab").add(b"c").hex(),
            Fnv::new().add(b"a").add(b"bc").hex()
        );
        assert_eq!(Fnv::new().hex(), "cbf29ce484222325");
    }

    #[test]
    fn lock_is_exclusive_and_stale_locks_are_taken_over() {
        let dir = std::env::temp_dir().join(format!("xtask-lock-test-{}", std::process::id()));
        mkdir(&dir).unwrap();
        let path = dir.join("lock");
        // The test binary is not called `xtask`, so its own pid counts as stale: write a pid
        // that cannot be a live xtask and check the takeover.
        write(&path, "4294967295").unwrap();
        let l = Lock::try_acquire(&path).unwrap().expect("stale lock taken over");
        assert_eq!(fs::read_to_string(&path).unwrap(), std::process::id().to_string());
        drop(l);
        assert!(!path.exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
