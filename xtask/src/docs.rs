//! `cargo xtask test`'s docs check: the command lines and examples of `README.md` and
//! `docs/*.md` stay true to the code.
//!
//! - Every `vfpoll` and `cargo xtask` command line in a shell block (```` ```sh ````, `bash`,
//!   `shell`, `console` or no language; in other blocks, such as `text`, only lines after a
//!   `$ ` prompt) goes through the real parser: `cargo xtask`'s own ([`crate::cli::parse`]),
//!   and the `vfpoll` binary (a debug build of the workspace's) with `VFPOLL_PARSE_ONLY=1`, in
//!   which it parses its command line with clap as always and exits without running anything.
//!   A subcommand or flag that does not exist, or a value its parser refuses, fails the check
//!   with the page, the line and the parser's message. Commands are found where a shell runs
//!   them: at the start of a line, after `sudo`, variable assignments, `&&`, `||`, `;` or `|`,
//!   and after `cargo xtask vm ... --`.
//! - Every ```` ```c ```` block is a whole program: it is compiled and linked against the
//!   installed libvfpoll the way `examples/c/` are (`cc -std=c11 -Wall -Wextra -Werror` and the
//!   pkg-config file), never run.
//! - Every page with ```` ```rust ```` blocks must be included in the doctests of a crate of
//!   the workspace (`#[doc = include_str!("../../README.md")]` on a `#[cfg(doctest)]` item of
//!   its `src/lib.rs`: `vfpoll-tests` for the README, or the crate a page documents), where
//!   `cargo test` compiles (and, unless `no_run` or `ignore`, runs) them.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::build;
use crate::util::{err, run, Context, Result};
use crate::Workspace;

/// The environment variable that makes `vfpoll` parse its command line and stop
/// (`apps/vfpoll/src/main.rs`).
pub const PARSE_ONLY_ENV: &str = "VFPOLL_PARSE_ONLY";

/// Where the doctests of the README live (other pages may live in the crate they document).
const DOCTEST_HOST: &str = "tests/src/lib.rs";

/// The text of every crate root (`src/lib.rs`) of the workspace, for the doctest includes.
fn crate_roots(root: &Path) -> String {
    let mut out = String::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name();
            if p.is_dir() {
                if !matches!(name.to_str(), Some("target" | ".git" | "node_modules" | "docs")) {
                    dirs.push(p);
                }
            } else if name == "lib.rs" && p.parent().is_some_and(|x| x.ends_with("src")) {
                out.push_str(&fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    out
}

/// Whether a crate root includes `page` (relative to the workspace) in its docs.
fn included(roots: &str, page: &str) -> bool {
    roots.match_indices("include_str!(\"").any(|(i, m)| {
        let rest = &roots[i + m.len()..];
        rest.split('"')
            .next()
            .is_some_and(|path| path.trim_start_matches("../").trim_start_matches("./") == page)
    })
}

/// One fenced code block of a page.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Block {
    /// The info string's first word (`sh`, `rust`, `c`, ...), lower case; empty when none.
    lang: String,
    /// The 1-based line number of the block's first line of code.
    first_line: usize,
    /// Its lines.
    lines: Vec<String>,
}

/// The fenced code blocks of a Markdown page (```` ``` ```` or `~~~`, at most 3 spaces of
/// indentation, closed by a fence of the same kind at least as long).
fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(char, usize, usize, Block)> = None;
    for (i, line) in text.lines().enumerate() {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let t = line.trim_start_matches(' ');
        let fence = |c: char| t.chars().take_while(|&x| x == c).count();
        match &mut open {
            Some((c, len, ind, b)) => {
                let n = fence(*c);
                if indent <= 3 && n >= *len && t[n..].trim().is_empty() {
                    let (_, _, _, b) = open.take().expect("open block");
                    out.push(b);
                } else {
                    // Code lines lose the fence's indentation, as CommonMark says.
                    let strip = line.len() - line.trim_start_matches(' ').len();
                    b.lines.push(line[strip.min(*ind)..].to_string());
                }
            }
            None if indent <= 3 => {
                for c in ['`', '~'] {
                    let n = fence(c);
                    if n >= 3 {
                        let info = t[n..].trim();
                        let lang = info
                            .split(|ch: char| ch == ',' || ch.is_whitespace())
                            .next()
                            .unwrap_or("")
                            .to_ascii_lowercase();
                        open = Some((
                            c,
                            n,
                            indent,
                            Block {
                                lang,
                                first_line: i + 2,
                                lines: Vec::new(),
                            },
                        ));
                        break;
                    }
                }
            }
            None => {}
        }
    }
    out
}

/// Blocks whose every line is a shell command line.
fn is_shell(lang: &str) -> bool {
    matches!(lang, "" | "sh" | "bash" | "shell" | "console" | "zsh")
}

/// The shell command lines of a block with their line numbers: continuation lines (`\` at the
/// end) joined, `$ ` prompts taken off; in a block that is not a shell block, only the lines
/// after a `$ ` prompt.
fn command_lines(b: &Block) -> Vec<(usize, String)> {
    let shell = is_shell(&b.lang);
    let mut out = Vec::new();
    let mut cur: Option<(usize, String)> = None;
    for (i, line) in b.lines.iter().enumerate() {
        let n = b.first_line + i;
        let text = match &mut cur {
            Some((_, acc)) => {
                acc.push(' ');
                acc.push_str(line.trim());
                acc.clone()
            }
            None => {
                let t = line.trim_start();
                let t = match t.strip_prefix("$ ") {
                    Some(rest) => rest,
                    None if shell => t,
                    None => continue,
                };
                cur = Some((n, t.to_string()));
                t.to_string()
            }
        };
        if let Some(body) = text.strip_suffix('\\') {
            let (start, _) = cur.take().expect("current line");
            cur = Some((start, body.trim_end().to_string()));
            continue;
        }
        let (start, full) = cur.take().expect("current line");
        out.push((start, full));
    }
    if let Some(c) = cur {
        out.push(c);
    }
    out
}

/// One shell word or operator.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Word(String),
    /// `&&`, `||`, `;`, `|`, `&`: a new command starts after it.
    Sep,
    /// A redirection (`>`, `2>`, `<`, `>>`, `2>&1`, ...): it and its target are not arguments.
    Redirect,
}

/// Splits a command line as a POSIX shell would, enough for the docs: quotes, backslashes,
/// operators, redirections and comments (`#` at the start of a word). `$$` becomes `1` (the
/// docs use it for "this shell's process ID"); other `$` words stay as written.
fn tokens(line: &str) -> Vec<Tok> {
    #[derive(Default)]
    struct State {
        out: Vec<Tok>,
        word: String,
        in_word: bool,
        /// The last word was a redirection operator alone (`>`): the next word is its target.
        target_next: bool,
    }
    impl State {
        fn flush(&mut self) {
            if !self.in_word {
                return;
            }
            self.in_word = false;
            let w = std::mem::take(&mut self.word);
            if std::mem::take(&mut self.target_next) {
                self.out.push(Tok::Redirect);
                return;
            }
            let op = w.trim_start_matches(|c: char| c.is_ascii_digit());
            if op.starts_with('>') || op.starts_with('<') {
                self.out.push(Tok::Redirect);
                // `>` alone takes the next word; `>out`, `2>/dev/null`, `2>&1` carry theirs.
                self.target_next = op.trim_start_matches(['>', '<', '&']).is_empty();
                return;
            }
            self.out.push(Tok::Word(if w == "$$" { "1".into() } else { w }));
        }
    }
    let mut st = State::default();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                st.in_word = true;
                for d in chars.by_ref() {
                    if d == '\'' {
                        break;
                    }
                    st.word.push(d);
                }
            }
            '"' => {
                st.in_word = true;
                while let Some(d) = chars.next() {
                    match d {
                        '"' => break,
                        '\\' => {
                            if let Some(e) = chars.next() {
                                st.word.push(e);
                            }
                        }
                        _ => st.word.push(d),
                    }
                }
            }
            '\\' => {
                st.in_word = true;
                if let Some(d) = chars.next() {
                    st.word.push(d);
                }
            }
            '#' if !st.in_word => break,
            // `2>&1`, `>&2`: part of a redirection word.
            '&' if st.word.ends_with('>') => st.word.push(c),
            ';' | '|' | '&' => {
                st.flush();
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                st.out.push(Tok::Sep);
            }
            c if c.is_whitespace() => st.flush(),
            _ => {
                st.in_word = true;
                st.word.push(c);
            }
        }
    }
    st.flush();
    st.out
}

/// A command the check parses.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cmd {
    /// `vfpoll ARGS` (any path ending in `/vfpoll` too).
    Vfpoll(Vec<String>),
    /// `cargo xtask ARGS`.
    Xtask(Vec<String>),
}

fn is_vfpoll(w: &str) -> bool {
    w == "vfpoll" || w.ends_with("/vfpoll")
}

/// The `vfpoll` and `cargo xtask` commands of one command line.
fn commands(line: &str) -> Vec<Cmd> {
    let mut out = Vec::new();
    let toks = tokens(line);
    for seg in toks.split(|t| *t == Tok::Sep) {
        let words: Vec<&str> = seg
            .iter()
            .filter_map(|t| match t {
                Tok::Word(w) => Some(w.as_str()),
                _ => None,
            })
            .collect();
        let mut i = 0;
        // What may come before the command: sudo and its options, env, time, VAR=value.
        while i < words.len() {
            let w = words[i];
            if matches!(w, "sudo" | "env" | "time" | "exec" | "nohup")
                || (i > 0 && words[..i].contains(&"sudo") && w.starts_with('-'))
                || (w.contains('=') && !w.starts_with('-') && !w.starts_with('='))
            {
                i += 1;
            } else {
                break;
            }
        }
        let rest: Vec<String> = words
            .get(i..)
            .unwrap_or_default()
            .iter()
            .map(|s| s.to_string())
            .collect();
        match rest.first().map(String::as_str) {
            Some(w) if is_vfpoll(w) => out.push(Cmd::Vfpoll(rest[1..].to_vec())),
            Some("cargo") if rest.get(1).map(String::as_str) == Some("xtask") => {
                let args = rest[2..].to_vec();
                // `cargo xtask vm ... -- vfpoll ...`: the guest's command is checked too.
                if args.first().map(String::as_str) == Some("vm") {
                    if let Some(p) = args.iter().position(|a| a == "--") {
                        if args.get(p + 1).is_some_and(|w| is_vfpoll(w)) {
                            out.push(Cmd::Vfpoll(args[p + 2..].to_vec()));
                        }
                    }
                }
                out.push(Cmd::Xtask(args));
            }
            _ => {}
        }
    }
    out
}

/// The pages the check reads: `README.md` and `docs/*.md`, as they are now.
fn pages(root: &Path) -> Result<Vec<PathBuf>> {
    let mut pages = vec![root.join("README.md")];
    let docs = root.join("docs");
    if docs.is_dir() {
        let mut more: Vec<PathBuf> = fs::read_dir(&docs)
            .context(format_args!("reading {}", docs.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .collect();
        more.sort();
        pages.extend(more);
    }
    Ok(pages)
}

/// What one page's check found wrong, one line each.
#[derive(Default)]
struct Findings {
    errors: Vec<String>,
    vfpoll: usize,
    xtask: usize,
    c: usize,
    rust: usize,
}

/// The check: returns a one-line summary, or an error listing every stale line.
pub fn check(ws: &Workspace) -> Result<String> {
    run(build::cargo(ws).args(["build", "-p", "vfpoll", "--bin", "vfpoll"]))?;
    let vfpoll = ws.target.join("debug/vfpoll");
    let mut f = Findings::default();
    let doctests = crate_roots(&ws.root);
    let mut c_blocks = Vec::new();
    for page in pages(&ws.root)? {
        let rel = page.strip_prefix(&ws.root).unwrap_or(&page).display().to_string();
        let text = fs::read_to_string(&page).context(format_args!("reading {}", page.display()))?;
        let mut has_rust = false;
        for b in blocks(&text) {
            match b.lang.as_str() {
                "rust" => {
                    has_rust = true;
                    f.rust += 1;
                }
                "c" => c_blocks.push((rel.clone(), b.clone())),
                _ => {}
            }
            for (line, cmd_line) in command_lines(&b) {
                for cmd in commands(&cmd_line) {
                    let at = format!("{rel}:{line}");
                    match cmd {
                        Cmd::Vfpoll(args) => {
                            f.vfpoll += 1;
                            if let Err(e) = parse_vfpoll(&vfpoll, &args) {
                                f.errors.push(format!("{at}: `vfpoll {}`: {e}", args.join(" ")));
                            }
                        }
                        Cmd::Xtask(args) => {
                            f.xtask += 1;
                            let os: Vec<OsString> = args.iter().map(OsString::from).collect();
                            if let Err(e) = crate::cli::parse(os) {
                                f.errors
                                    .push(format!("{at}: `cargo xtask {}`: {e}", args.join(" ")));
                            }
                        }
                    }
                }
            }
        }
        if has_rust && !included(&doctests, &rel) {
            f.errors.push(format!(
                "{rel} has Rust examples that no doctest compiles: add `#[doc = include_str!(\"../../{rel}\")]` \
                 to a `#[cfg(doctest)]` item in the src/lib.rs of a crate that has their dependencies \
                 ({DOCTEST_HOST}, or the crate the page documents)"
            ));
        }
    }
    f.c = c_blocks.len();
    if !c_blocks.is_empty() {
        compile_c(ws, &c_blocks, &mut f.errors)?;
    }
    if !f.errors.is_empty() {
        let mut s = format!("{} stale line(s) in the docs:\n", f.errors.len());
        for e in &f.errors {
            let _ = writeln!(s, "  {e}");
        }
        return Err(err!("{}", s.trim_end()));
    }
    Ok(format!(
        "{} vfpoll and {} cargo xtask command lines parsed, {} C examples built, {} Rust examples in doctests",
        f.vfpoll, f.xtask, f.c, f.rust
    ))
}

/// Runs the real `vfpoll` parser on `args`; `Err` holds clap's message.
fn parse_vfpoll(vfpoll: &Path, args: &[String]) -> Result<()> {
    let o = Command::new(vfpoll)
        .args(args)
        .env(PARSE_ONLY_ENV, "1")
        .output()
        .context(format_args!("running {}", vfpoll.display()))?;
    if o.status.success() {
        return Ok(());
    }
    let msg = String::from_utf8_lossy(&o.stderr);
    let first = msg
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| msg.lines().next().unwrap_or("no message"));
    Err(err!("{}", first.trim()))
}

/// Builds every C block as a program against the installed libvfpoll (as `examples/c/` are).
fn compile_c(ws: &Workspace, c_blocks: &[(String, Block)], errors: &mut Vec<String>) -> Result<()> {
    let prefix = crate::build::install_capi(ws, "debug")?;
    let pc = crate::build::capi_flags(&prefix)?;
    let dir = ws.target.join("debug/docs-c");
    fs::create_dir_all(&dir).context(format_args!("creating {}", dir.display()))?;
    for (page, b) in c_blocks {
        let stem = format!(
            "{}-{}",
            page.trim_end_matches(".md").replace('/', "-"),
            b.first_line
        );
        let src = dir.join(format!("{stem}.c"));
        // `#line` makes the compiler's messages name the page and its line.
        let body = format!("#line {} \"{page}\"\n{}\n", b.first_line, b.lines.join("\n"));
        fs::write(&src, body).context(format_args!("writing {}", src.display()))?;
        let o = Command::new("cc")
            .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror"])
            .arg(&src)
            .args(pc.split_whitespace())
            .arg("-o")
            .arg(dir.join(&stem))
            .output()
            .context("running cc")?;
        if !o.status.success() {
            let msg = String::from_utf8_lossy(&o.stderr);
            let lines: Vec<&str> = msg.lines().filter(|l| l.contains("error")).take(5).collect();
            errors.push(format!(
                "{page}:{}: the C example does not build: {}",
                b.first_line,
                lines.join(" | ")
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_blocks_with_their_language_and_lines() {
        let md = "text\n```sh\nvfpoll status\n```\n\n  ~~~~c\n  int x;\n  ~~~~\n```rust,no_run\nlet a = 1;\n````\n";
        let b = blocks(md);
        assert_eq!(b.len(), 3, "{b:?}");
        assert_eq!((b[0].lang.as_str(), b[0].first_line), ("sh", 3));
        assert_eq!(b[0].lines, ["vfpoll status"]);
        assert_eq!(
            (b[1].lang.as_str(), b[1].lines.as_slice()),
            ("c", &["int x;".to_string()][..])
        );
        // A longer fence closes a block; a shorter one does not.
        assert_eq!((b[2].lang.as_str(), b[2].first_line), ("rust", 10));
        let md = "````text\n```\nstill text\n````\n";
        assert_eq!(blocks(md)[0].lines, ["```", "still text"]);
    }

    #[test]
    fn command_lines_join_continuations_and_take_prompts() {
        let b = Block {
            lang: "sh".into(),
            first_line: 10,
            lines: vec![
                "sudo vfpoll setup \\".into(),
                "   --hugepages 1024   # comment".into(),
                "$ vfpoll status".into(),
            ],
        };
        assert_eq!(
            command_lines(&b),
            [
                (10, "sudo vfpoll setup --hugepages 1024   # comment".to_string()),
                (12, "vfpoll status".to_string())
            ]
        );
        let text = Block {
            lang: "text".into(),
            first_line: 1,
            lines: vec![
                "vfpoll: output".into(),
                "$ vfpoll hello --device 0000:00:03.0".into(),
            ],
        };
        assert_eq!(
            command_lines(&text),
            [(2, "vfpoll hello --device 0000:00:03.0".to_string())]
        );
    }

    #[test]
    fn commands_are_found_where_a_shell_runs_them() {
        let v = |s: &[&str]| Cmd::Vfpoll(s.iter().map(|x| x.to_string()).collect());
        let x = |s: &[&str]| Cmd::Xtask(s.iter().map(|x| x.to_string()).collect());
        assert_eq!(
            commands("sudo target/release/vfpoll setup --hugepages 1024 --bind 0000:3b:00.0   # x"),
            [v(&["setup", "--hugepages", "1024", "--bind", "0000:3b:00.0"])]
        );
        assert_eq!(
            commands("RUST_LOG=debug vfpoll perf --model --json > out.json 2>&1 && vfpoll reset"),
            [v(&["perf", "--model", "--json"]), v(&["reset"])]
        );
        assert_eq!(
            commands("sudo vfpoll setup --user alice --pid $$ | tee log"),
            [v(&["setup", "--user", "alice", "--pid", "1"])]
        );
        assert_eq!(commands("setcap cap_ipc_lock=ep vfpoll"), []);
        assert_eq!(commands("echo 'vfpoll perf'"), []);
        assert_eq!(
            commands("cargo xtask vm --no-build -- vfpoll perf --model"),
            [
                v(&["perf", "--model"]),
                x(&["vm", "--no-build", "--", "vfpoll", "perf", "--model"])
            ]
        );
        assert_eq!(
            commands("VFPOLL_FUZZ_SECS=0 cargo xtask test --filter \"nvme\""),
            [x(&["test", "--filter", "nvme"])]
        );
        assert_eq!(commands("sudo -E vfpoll status >/dev/null"), [v(&["status"])]);
    }

    #[test]
    fn doctest_includes_are_found_in_crate_roots() {
        let roots =
            "#[doc = include_str!(\"../../README.md\")]\n#[doc = include_str!(\"../../docs/store.md\")]";
        assert!(included(roots, "README.md"));
        assert!(included(roots, "docs/store.md"));
        assert!(!included(roots, "docs/python.md"));
        assert!(!included(roots, "store.md"));
    }

    /// The check itself, on this tree: `cargo test -p xtask -- --ignored docs_of_this_tree`.
    #[test]
    #[ignore = "builds vfpoll and libvfpoll; cargo xtask test runs the same check"]
    fn docs_of_this_tree() {
        match check(&Workspace::locate()) {
            Ok(summary) => eprintln!("docs: {summary}"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_stale_xtask_flag_is_refused_by_the_real_parser() {
        let os = |s: &[&str]| s.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(crate::cli::parse(os(&["test", "--filter", "nvme", "--mode", "both"])).is_ok());
        assert!(crate::cli::parse(os(&["test", "--no-such-flag"])).is_err());
        assert!(crate::cli::parse(os(&["bench", "--plot", "--time", "2"])).is_ok());
    }
}
