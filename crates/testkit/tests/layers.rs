//! Every crate's modules form one-way layers: no module uses, directly or through others, a
//! module that uses it back; and at every level of the module tree, the sibling subtrees (a
//! module with all its descendants) use each other one way too. A module composing its own
//! children (declaring them, re-exporting them, mounting their routes) is not a use; everything
//! else is: `use` trees, and paths through `crate::`, `super::`, `self::` or a child module's
//! name, outside the test module at a file's end. A failure names each circle with the uses
//! that close it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

#[test]
fn every_crate_is_layered_one_way() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut circles = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(&crates).expect("the crates directory lists") {
        let src = entry.expect("an entry reads").path().join("src");
        if !src.is_dir() {
            continue;
        }
        let graph = uses(&src);
        checked += graph.len();
        let subtrees = between_subtrees(&graph);
        for (graph, circle) in circles_in(&graph)
            .into_iter()
            .map(|c| (&graph, c))
            .chain(circles_in(&subtrees).into_iter().map(|c| (&subtrees, c)))
        {
            let name = |m: &Module| if m.is_empty() { "crate root".to_owned() } else { m.join("::") };
            let mut text = format!("{}: {}", src.display(), circle.iter().map(name).collect::<Vec<_>>().join(", "));
            for m in &circle {
                let within: Vec<String> = graph[m].iter().filter(|u| circle.contains(u)).map(name).collect();
                text.push_str(&format!("\n    {} uses {}", name(m), within.join(", ")));
            }
            circles.push(text);
        }
    }
    assert!(checked > 100, "only {checked} modules found under {}", crates.display());
    assert!(circles.is_empty(), "modules that use each other in a circle:\n{}", circles.join("\n"));
}

/// Each module of the crate at `src` and the modules it uses.
fn uses(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let files: BTreeMap<Module, String> = rust_files(src)
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("a source file reads");
            (module_of(src, &path), without_tests(&without_comments(&text)))
        })
        .collect();
    files
        .iter()
        .map(|(module, text)| {
            let used = paths_in(text)
                .into_iter()
                .filter_map(|path| resolve(module, &path, &files))
                .filter(|used| used != module && !used.starts_with(module))
                .collect();
            (module.clone(), used)
        })
        .collect()
}

/// The uses between sibling subtrees: a use from inside `a::x` of something inside `a::y` is
/// one of `a::x` by `a::y`'s sibling; a use of an ancestor (its own items) is not counted.
fn between_subtrees(graph: &BTreeMap<Module, BTreeSet<Module>>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut between: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, used) in graph {
        for used in used {
            let common = module.iter().zip(used).take_while(|(a, b)| a == b).count();
            if common < module.len() && common < used.len() {
                between.entry(module[..=common].to_vec()).or_default().insert(used[..=common].to_vec());
            }
        }
    }
    let ends: BTreeSet<Module> = between.values().flatten().cloned().collect();
    for end in ends {
        between.entry(end).or_default();
    }
    between
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a source directory lists") {
        let path = entry.expect("an entry reads").path();
        if path.is_dir() {
            found.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    found
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `lib.rs` and `main.rs` are the root.
fn module_of(src: &Path, file: &Path) -> Module {
    let relative = file.strip_prefix(src).expect("under src").with_extension("");
    let mut parts: Module = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

fn without_comments(text: &str) -> String {
    text.lines().map(|line| line.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

/// The text before a file's test module (`#[cfg(test)]` then `mod`), which ends each file that
/// has one.
fn without_tests(text: &str) -> String {
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]") {
        let at = from + at;
        if text[at + "#[cfg(test)]".len()..].trim_start().starts_with("mod ") {
            return text[..at].to_owned();
        }
        from = at + 1;
    }
    text.to_owned()
}

/// Every path the text names: each leaf of each `use` tree, and each `a::b` written inline.
fn paths_in(text: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(at) = find_word(rest, "use") {
        let after = &rest[at + 3..];
        let Some(end) = after.find(';') else { break };
        let tree: String = after[..end].chars().filter(|c| !c.is_whitespace()).collect();
        expand(&[], &tree, &mut paths);
        rest = &after[end..];
    }
    let bytes = text.as_bytes();
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if is_word(bytes[i]) && (i == 0 || !(is_word(bytes[i - 1]) || bytes[i - 1] == b':')) {
            let mut segments = Vec::new();
            let mut j = i;
            loop {
                let start = j;
                while j < bytes.len() && is_word(bytes[j]) {
                    j += 1;
                }
                segments.push(text[start..j].to_owned());
                if text[j..].starts_with("::") && text[j + 2..].starts_with(|c: char| c.is_alphanumeric() || c == '_') {
                    j += 2;
                } else {
                    break;
                }
            }
            if segments.len() > 1 {
                paths.push(segments);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    paths
}

fn find_word(text: &str, word: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(at) = text[from..].find(word) {
        let at = from + at;
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + word.len()).copied();
        let boundary = |b: Option<u8>| b.is_none_or(|b| !(b.is_ascii_alphanumeric() || b == b'_'));
        if boundary(before) && after.is_some_and(|b| b.is_ascii_whitespace()) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// The leaves of a `use` tree (`a::{b, c::{d}}`), written without whitespace.
fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    if tree.is_empty() {
        return;
    }
    let (head, group) = match tree.find('{') {
        Some(open) if tree.ends_with('}') => (&tree[..open], Some(&tree[open + 1..tree.len() - 1])),
        _ => (tree, None),
    };
    let mut path: Vec<String> = prefix.to_vec();
    path.extend(head.split("::").filter(|s| !s.is_empty()).map(|s| s.split("as").next().unwrap_or(s).to_owned()));
    match group {
        None => out.push(path),
        Some(group) => {
            let mut depth = 0;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&path, &group[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand(&path, &group[start..], out);
        }
    }
}

/// The module of the crate `path`, written in `module`, reaches (the longest module prefix).
fn resolve(module: &Module, path: &[String], files: &BTreeMap<Module, String>) -> Option<Module> {
    let (mut base, mut rest): (Module, &[String]) = match path.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &path[1..]),
        Some("self") => (module.clone(), &path[1..]),
        Some("super") => (module.clone(), path),
        Some(first) if files.contains_key(&[module.as_slice(), &[first.to_owned()]].concat()) => (module.clone(), path),
        _ => return None,
    };
    while rest.first().is_some_and(|s| s == "super") {
        base.pop();
        rest = &rest[1..];
    }
    (0..=rest.len()).rev().map(|n| [base.as_slice(), &rest[..n]].concat()).find(|m| files.contains_key(m))
}

/// The groups of modules that reach each other (Tarjan's strongly connected components, of
/// more than one module).
fn circles_in(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'g Module, usize>,
        low: BTreeMap<&'g Module, usize>,
        stack: Vec<&'g Module>,
        circles: Vec<Vec<Module>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in &self.graph[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut circle = Vec::new();
                while let Some(w) = self.stack.pop() {
                    circle.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if circle.len() > 1 {
                    self.circles.push(circle);
                }
            }
        }
    }
    let mut walk = Walk { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), circles: Vec::new() };
    for v in graph.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.circles
}

#[test]
fn the_check_sees_a_circle() {
    let dir = tempfile_dir();
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(dir.join("a/mod.rs"), "mod inner;\nuse crate::b::Thing;\n").unwrap();
    std::fs::write(dir.join("a/inner.rs"), "pub fn f() { super::super::b::g(); }\n").unwrap();
    std::fs::write(dir.join("b.rs"), "use crate::{x, a::inner::f};\n#[cfg(test)]\nmod tests { use crate::c; }\n")
        .unwrap();
    let graph = uses(&dir);
    assert_eq!(graph[&vec!["a".to_owned()]], BTreeSet::from([vec!["b".to_owned()]]));
    let circles = circles_in(&graph);
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert_eq!(circles[0].len(), 2, "a::inner uses b and b uses a::inner: {circles:?}");
    std::fs::write(dir.join("b.rs"), "pub fn g() {}\n").unwrap();
    assert!(circles_in(&uses(&dir)).is_empty());
    // Through a parent: b uses a (its own items), a::inner uses b. No module-level circle, but
    // the subtrees a and b use each other.
    std::fs::write(dir.join("a/mod.rs"), "mod inner;\npub struct Thing;\n").unwrap();
    std::fs::write(dir.join("b.rs"), "use crate::a::Thing;\npub fn g() {}\n").unwrap();
    let graph = uses(&dir);
    assert!(circles_in(&graph).is_empty());
    assert_eq!(circles_in(&between_subtrees(&graph)).len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kura-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}
