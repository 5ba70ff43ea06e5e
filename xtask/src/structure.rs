//! Import circles between the files of a crate (`cargo xtask circles`, and a test of the
//! workspace).
//!
//! A module *imports* another when its code names it, or an item inside it, through a path
//! that starts with `crate::`, `super::` or `self::` (in `use` trees, in expressions and types,
//! and in macro arguments). The module tree comes from the `mod` declarations from `lib.rs` and
//! `main.rs` down, following `#[path]`. Test code does not count: items under `#[cfg(test)]`
//! (a test module and everything in it, test-only `use` lines and functions). Nor does a child's
//! reference to its own ancestor's items (`super::Item` from `a::b` to `a`): that is how a
//! module reaches what its parent shares with it, not a second arrow. Every other reference is an
//! arrow from the file that makes it to the deepest module its path names. A circle is a
//! strongly connected component of more than one file: no module of it can be read without the
//! others. Issue 26 asks for none: the types a crate shares sit at its bottom and modules import
//! only downward.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// A module path inside a crate: `["fabrics", "admin"]`; empty for the crate root.
type ModPath = Vec<String>;

/// One import circle: the crate's folder (relative to the root searched) and its modules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Circle {
    /// The crate's folder, e.g. `driver/nvme`.
    pub crate_dir: PathBuf,
    /// The modules of the circle, sorted, `lib` (or `main`) for the crate root.
    pub modules: Vec<String>,
}

impl std::fmt::Display for Circle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.crate_dir.display(), self.modules.join(" <-> "))
    }
}

/// The import circles of every crate below `root` (a folder with `Cargo.toml` and `src/`;
/// `target/`, `.git/` and hidden folders are skipped), in crate order.
pub fn circles(root: &Path) -> Result<Vec<Circle>, String> {
    let mut crates = Vec::new();
    find_crates(root, &mut crates)?;
    crates.sort();
    let mut out = Vec::new();
    for dir in crates {
        for top in ["lib.rs", "main.rs"] {
            let file = dir.join("src").join(top);
            if !file.exists() {
                continue;
            }
            let tree = ModuleTree::read(&file)?;
            let rel = dir.strip_prefix(root).unwrap_or(&dir).to_path_buf();
            let root_name = top.trim_end_matches(".rs");
            for scc in tree.circles() {
                let mut modules: Vec<String> = scc
                    .iter()
                    .map(|m| {
                        if m.is_empty() {
                            root_name.to_owned()
                        } else {
                            m.join("::")
                        }
                    })
                    .collect();
                modules.sort();
                out.push(Circle {
                    crate_dir: rel.clone(),
                    modules,
                });
            }
        }
    }
    Ok(out)
}

fn find_crates(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    if dir.join("Cargo.toml").is_file() && dir.join("src").is_dir() {
        out.push(dir.to_path_buf());
    }
    let rd = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            find_crates(&e.path(), out)?;
        }
    }
    Ok(())
}

/// The file modules of one crate root and the arrows between them.
#[derive(Default)]
struct ModuleTree {
    /// Every module that is a file.
    files: BTreeSet<ModPath>,
    /// Arrows from a file module to the modules it names.
    arrows: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

impl ModuleTree {
    fn read(root: &Path) -> Result<Self, String> {
        let mut tree = Self::default();
        let mut refs: Vec<(ModPath, Reference)> = Vec::new();
        let mut todo = vec![(ModPath::new(), root.to_path_buf())];
        while let Some((module, path)) = todo.pop() {
            if !tree.files.insert(module.clone()) {
                continue;
            }
            let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let file = syn::parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            let mut v = FileVisitor {
                scope: module.clone(),
                dir: own_dir(&path),
                file_dir: path.parent().map(Path::to_path_buf).unwrap_or_default(),
                children: Vec::new(),
                refs: Vec::new(),
            };
            v.visit_file(&file);
            refs.extend(v.refs.into_iter().map(|r| (module.clone(), r)));
            todo.extend(v.children);
        }
        for (from, r) in refs {
            if let Some(to) = tree.resolve(&from, &r) {
                tree.arrows.entry(from).or_default().insert(to);
            }
        }
        Ok(tree)
    }

    /// The file module a reference names, or `None` where it names nothing counted.
    fn resolve(&self, from: &ModPath, r: &Reference) -> Option<ModPath> {
        let mut base: ModPath = match r.base {
            Base::Crate => ModPath::new(),
            Base::Super => r.scope[..r.scope.len().saturating_sub(1)].to_vec(),
            Base::SelfMod => r.scope.clone(),
        };
        let mut rest = r.segments.as_slice();
        while let Some((first, tail)) = rest.split_first() {
            if first != "super" {
                break;
            }
            base.pop();
            rest = tail;
        }
        let full: ModPath = base.iter().chain(rest).cloned().collect();
        let best = (0..=full.len())
            .rev()
            .map(|i| full[..i].to_vec())
            .find(|p| self.files.contains(p))?;
        let own_ancestor = best.len() < from.len() && from.starts_with(&best) && best == base;
        (best != *from && !own_ancestor).then_some(best)
    }

    /// Tarjan's strongly connected components of more than one module.
    fn circles(&self) -> Vec<Vec<ModPath>> {
        struct State<'a> {
            tree: &'a ModuleTree,
            index: BTreeMap<&'a ModPath, usize>,
            low: BTreeMap<&'a ModPath, usize>,
            stack: Vec<&'a ModPath>,
            on_stack: BTreeSet<&'a ModPath>,
            next: usize,
            out: Vec<Vec<ModPath>>,
        }
        fn connect<'a>(s: &mut State<'a>, v: &'a ModPath) {
            s.index.insert(v, s.next);
            s.low.insert(v, s.next);
            s.next += 1;
            s.stack.push(v);
            s.on_stack.insert(v);
            let tree = s.tree;
            for w in tree.arrows.get(v).into_iter().flatten() {
                if !s.index.contains_key(w) {
                    connect(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if s.on_stack.contains(w) {
                    let iw = s.index[w];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if s.low[v] == s.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = s.stack.pop() {
                    s.on_stack.remove(w);
                    comp.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    s.out.push(comp);
                }
            }
        }
        let mut s = State {
            tree: self,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            next: 0,
            out: Vec::new(),
        };
        for v in &self.files {
            if !s.index.contains_key(v) {
                connect(&mut s, v);
            }
        }
        s.out
    }
}

/// The folder of a file's child modules: `src/` for `lib.rs`, `main.rs` and `mod.rs`,
/// `src/a/` for `src/a.rs`.
fn own_dir(path: &Path) -> PathBuf {
    let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
    match path.file_name().and_then(|n| n.to_str()) {
        Some("lib.rs" | "main.rs" | "mod.rs") => parent,
        _ => parent.join(path.file_stem().unwrap_or_default()),
    }
}

#[derive(Debug, Clone, Copy)]
enum Base {
    Crate,
    Super,
    SelfMod,
}

/// A path naming something in the crate, where it was written.
#[derive(Debug)]
struct Reference {
    /// The module scope it was written in (a file module, or an inline module in it).
    scope: ModPath,
    base: Base,
    /// The segments after `crate`/`super`/`self`.
    segments: Vec<String>,
}

struct FileVisitor {
    /// The module the code being visited is in (inline modules included).
    scope: ModPath,
    /// Where children of the current scope are looked for.
    dir: PathBuf,
    /// The folder of the file itself (`#[path]` is relative to it).
    file_dir: PathBuf,
    children: Vec<(ModPath, PathBuf)>,
    refs: Vec<Reference>,
}

impl FileVisitor {
    fn record(&mut self, segments: impl IntoIterator<Item = String>) {
        let mut segments = segments.into_iter();
        let base = match segments.next().as_deref() {
            Some("crate") => Base::Crate,
            Some("super") => Base::Super,
            Some("self") => Base::SelfMod,
            _ => return,
        };
        self.refs.push(Reference {
            scope: self.scope.clone(),
            base,
            segments: segments.collect(),
        });
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.record(prefix.iter().cloned().chain([n.ident.to_string()])),
            syn::UseTree::Rename(r) => self.record(prefix.iter().cloned().chain([r.ident.to_string()])),
            syn::UseTree::Glob(_) => self.record(prefix.iter().cloned()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }

    /// Paths inside a macro's tokens: `crate :: a :: b` runs, groups searched too.
    fn tokens(&mut self, tokens: TokenStream) {
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tts.len() {
            match &tts[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if matches!(id.to_string().as_str(), "crate" | "super" | "self") => {
                    let mut segs = vec![id.to_string()];
                    let mut j = i + 1;
                    while j + 2 < tts.len() && is_colon(&tts[j]) && is_colon(&tts[j + 1]) {
                        match &tts[j + 2] {
                            TokenTree::Ident(next) => segs.push(next.to_string()),
                            _ => break,
                        }
                        j += 3;
                    }
                    if segs.len() > 1 {
                        self.record(segs);
                    }
                    i = j.max(i + 1);
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

fn is_colon(t: &TokenTree) -> bool {
    matches!(t, TokenTree::Punct(p) if p.as_char() == ':')
}

/// `#[cfg(test)]` or `#[cfg(all(test, ...))]`.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta.require_list().is_ok_and(|l| {
                let t: String = l.tokens.to_string().split_whitespace().collect();
                t == "test" || t.starts_with("test,") || t.starts_with("all(test")
            })
    })
}

fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item;
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

impl<'ast> Visit<'ast> for FileVisitor {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let name = m.ident.to_string();
        let mut module = self.scope.clone();
        module.push(name.clone());
        match &m.content {
            None => {
                let file = match path_attr(&m.attrs) {
                    Some(p) => self.file_dir.join(p),
                    None => {
                        let flat = self.dir.join(format!("{name}.rs"));
                        if flat.exists() {
                            flat
                        } else {
                            self.dir.join(&name).join("mod.rs")
                        }
                    }
                };
                if file.exists() {
                    self.children.push((module, file));
                }
            }
            Some((_, items)) => {
                let saved_dir = self.dir.clone();
                self.dir = self.dir.join(&name);
                let saved_scope = std::mem::replace(&mut self.scope, module);
                for item in items {
                    self.visit_item(item);
                }
                self.scope = saved_scope;
                self.dir = saved_dir;
            }
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.record(p.segments.iter().map(|s| s.ident.to_string()));
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate in a scratch folder from `(path, text)` pairs.
    fn scratch(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-structure-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("src")).unwrap();
        fs::write(dir.join("Cargo.toml"), "[package]\nname = \"x\"\n").unwrap();
        for (p, text) in files {
            let p = dir.join("src").join(p);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        dir
    }

    fn found(dir: &Path) -> Vec<String> {
        let c = circles(dir).unwrap();
        fs::remove_dir_all(dir).unwrap();
        c.iter().map(|c| c.modules.join(" <-> ")).collect()
    }

    #[test]
    fn two_siblings_that_name_each_other_are_a_circle() {
        let d = scratch(
            "pair",
            &[
                ("lib.rs", "mod a; mod b; mod c;"),
                ("a.rs", "use crate::b::B; pub struct A;"),
                ("b.rs", "pub struct B; fn f() -> crate::a::A { crate::a::A }"),
                ("c.rs", "use crate::a::A;"),
            ],
        );
        assert_eq!(found(&d), ["a <-> b"]);
    }

    #[test]
    fn downward_imports_and_a_childs_super_items_are_not() {
        let d = scratch(
            "down",
            &[
                ("lib.rs", "mod types; mod a; pub struct Shared;"),
                ("types.rs", "pub struct T;"),
                ("a.rs", "mod inner; use crate::types::T; use crate::Shared;"),
                ("a/inner.rs", "use super::Helper; use super::super::types::T;"),
            ],
        );
        assert_eq!(found(&d), Vec::<String>::new());
    }

    #[test]
    fn test_code_use_groups_macros_and_path_attributes() {
        // Test-only code does not count; a use group, a macro argument and a #[path] file do.
        let d = scratch(
            "kinds",
            &[
                (
                    "lib.rs",
                    "mod a; #[path = \"other/b_file.rs\"] mod b; mod c; mod d;",
                ),
                ("a.rs", "use crate::{c::C, b::B};"),
                (
                    "other/b_file.rs",
                    "pub fn f() { let _ = format!(\"{:?}\", crate::a::X); }",
                ),
                (
                    "c.rs",
                    "#[cfg(test)] mod tests { use crate::d::D; } #[cfg(test)] use crate::d::E;",
                ),
                ("d.rs", "use crate::c::C;"),
            ],
        );
        assert_eq!(found(&d), ["a <-> b"]);
    }

    #[test]
    fn inline_modules_resolve_from_their_own_scope() {
        // `super::` inside `mod inner { .. }` of a.rs is a.rs itself: no arrow.
        let d = scratch(
            "inline",
            &[
                ("lib.rs", "mod a; mod b;"),
                ("a.rs", "mod inner { use super::Thing; } pub struct Thing;"),
                ("b.rs", "use crate::a::Thing;"),
            ],
        );
        assert_eq!(found(&d), Vec::<String>::new());
    }

    /// Issue 26: no import circle between files anywhere in the workspace.
    #[test]
    fn the_workspace_has_no_import_circles() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let found = circles(root).unwrap();
        assert!(
            found.is_empty(),
            "import circles (move what both sides share to a module below them; \
             `cargo xtask circles` lists them):\n{}",
            found.iter().map(|c| format!("  {c}\n")).collect::<String>()
        );
    }
}
