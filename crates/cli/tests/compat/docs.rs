//! The documentation, run as written: every `sh` block of README.md and docs/*.md, in order,
//! one file per session — a fresh working directory, a fresh `kura serve` on its default
//! flags and ports in it (where the doc says to start one), and the banner's `export`s applied
//! as the walk-through tells the reader to apply them. A documented command that stops working
//! fails this test.
//!
//! A small runner of our own, not trycmd: the docs are shell sessions across several tools
//! (kura, wrangler, the AWS CLI, npm, node, curl) that share a working directory and an
//! environment, not one binary's invocations with snapshotted output.
//!
//! What a reader brings that a doc does not show is given in HTML comments just before a
//! block, which a rendered doc hides:
//!
//! ```text
//! <!-- doc-test
//! skip: why this block cannot run here
//! skip-line: a line of the block to leave out (the test command itself)
//! before: shell run first (the reader's own files: a photo, a project)
//! replace: <placeholder> => shell that yields what the reader would paste
//! stdin: what the reader types at a prompt
//! file: the path a non-shell block (a wrangler.toml, a src/index.js) is saved at
//! then: shell run after the block (running the snippet just saved)
//! -->
//! ```
//!
//! Two more rules stand for the reader: `NAME=…` in a command is the value the banner printed
//! for NAME (the session fails if the banner printed none), and `/path/to/kura` is the clone —
//! a copy of the parts the docs use (kura-bindings' sources, the example Workers), so that what
//! a doc builds there never touches this repository, which other tests use at the same time.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{compat_dir, kura_bin, wrangler};

/// The command a doc starts the server with; the runner starts the same server itself.
const SERVE: &str = "cargo run --release -p kura-cli -- serve";

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// A fenced block and what the comment before it asked.
#[derive(Debug)]
struct Block {
    /// `file.md:line`.
    at: String,
    language: String,
    text: String,
    directives: BTreeMap<String, Vec<String>>,
}

impl Block {
    fn directive(&self, key: &str) -> &[String] {
        self.directives.get(key).map(Vec::as_slice).unwrap_or_default()
    }
}

fn blocks(file: &Path) -> Vec<Block> {
    let name = file.strip_prefix(repository()).unwrap_or(file).display().to_string();
    let text = std::fs::read_to_string(file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut directives = BTreeMap::<String, Vec<String>>::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.trim() == "<!-- doc-test" {
            i += 1;
            while i < lines.len() && lines[i].trim() != "-->" {
                let (key, value) = lines[i].split_once(':').unwrap_or_else(|| panic!("{name}:{}: {}", i + 1, lines[i]));
                directives.entry(key.trim().to_owned()).or_default().push(value.trim().to_owned());
                i += 1;
            }
        } else if let Some(language) = line.strip_prefix("```") {
            let start = i + 1;
            i += 1;
            while i < lines.len() && !lines[i].starts_with("```") {
                i += 1;
            }
            out.push(Block {
                at: format!("{name}:{start}"),
                language: language.trim().to_owned(),
                text: lines[start..i].join("\n"),
                directives: std::mem::take(&mut directives),
            });
        } else if !line.trim().is_empty() && !directives.is_empty() && !line.starts_with("<!--") {
            // A directive belongs to the block right after it, not to one further down.
            panic!("{name}:{}: a doc-test comment must come just before its block", i + 1);
        }
        i += 1;
    }
    out
}

/// `kura serve` as the reader starts it: default flags, in the session's directory.
struct Server {
    child: Child,
}

impl Server {
    /// Starts it and answers the banner's `export`s.
    fn start(cwd: &Path) -> (Server, Vec<(String, String)>) {
        let mut child = Command::new(kura_bin())
            .arg("serve")
            // As the reader's: the banner's exports name these ports.
            .current_dir(cwd)
            .env_remove("KURA_ACCOUNT_ID")
            .env_remove("KURA_API_TOKEN")
            .env_remove("KURA_S3_ACCESS_KEY_ID")
            .env_remove("KURA_S3_SECRET_ACCESS_KEY")
            .env_remove("KURA_WORKERD")
            .env_remove("KURA_DATA")
            .env("KURA_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut exports = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(workers) = line.trim().strip_prefix("Workers:") {
                    // Without its listener (8787 taken, say) every Worker step would fail later,
                    // and less clearly.
                    if !workers.trim().starts_with("http") {
                        exports.push(("KURA_DOCS_NO_WORKERS".to_owned(), workers.trim().to_owned()));
                    }
                }
                // `export A=1` or `export A=1 B=2`, as printed.
                if let Some(assignments) = line.trim().strip_prefix("export ") {
                    for pair in assignments.split_whitespace() {
                        if let Some((k, v)) = pair.split_once('=') {
                            exports.push((k.to_owned(), v.to_owned()));
                        }
                    }
                }
                if line == "ready" {
                    let _ = tx.send(std::mem::take(&mut exports));
                }
            }
        });
        let exports = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("kura serve started on its default ports (is another server on 127.0.0.1:8780, 8781 or 8787?)");
        if let Some((_, why)) = exports.iter().find(|(k, _)| k == "KURA_DOCS_NO_WORKERS") {
            panic!("kura serve runs no Workers ({why}): is something else on 127.0.0.1:8787?");
        }
        (Server { child }, exports)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `NAME=…` becomes `NAME="$NAME"`: the reader's copy of what the banner printed.
fn fill_ellipses(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("=…") {
        let before = &rest[..at];
        let name_start = before.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
        let name = &before[name_start..];
        out.push_str(before);
        out.push_str(&format!(
            "=\"${{{name}:?the doc leaves {name} to the reader, and the banner printed no {name}}}\""
        ));
        rest = &rest[at + "=…".len()..];
    }
    out.push_str(rest);
    out
}

/// Runs one doc's blocks as one session; panics naming the block that failed.
fn run_session(doc: &Path) {
    let session = tempfile::tempdir().unwrap();
    let cwd = session.path().join("work");
    std::fs::create_dir_all(&cwd).unwrap();
    // `npx wrangler@4.85.0` is the wrangler scripts/test installed (npx would fetch the same).
    let shims = session.path().join("shims");
    std::fs::create_dir_all(&shims).unwrap();
    let npx = shims.join("npx");
    let real_npx = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join("npx"))
        .find(|candidate| candidate.is_file())
        .expect("npx is installed (scripts/test needs Node)");
    std::fs::write(
        &npx,
        format!(
            "#!/bin/sh\nif [ \"$1\" = wrangler@4.85.0 ]; then shift; exec {} \"$@\"; fi\nexec {} \"$@\"\n",
            wrangler().display(),
            real_npx.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&npx, std::fs::Permissions::from_mode(0o755)).unwrap();
    let kura_dir = Path::new(kura_bin()).parent().unwrap().to_owned();
    let path = format!("{}:{}:{}", shims.display(), kura_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), path),
        ("HOME".into(), session.path().join("home").display().to_string()),
        ("WRANGLER_SEND_METRICS".into(), "false".into()),
        ("CI".into(), "true".into()),
        ("NO_COLOR".into(), "1".into()),
        ("AWS_CONFIG_FILE".into(), "/dev/null".into()),
        ("AWS_SHARED_CREDENTIALS_FILE".into(), "/dev/null".into()),
        ("AWS_PAGER".into(), String::new()),
        ("npm_config_cache".into(), std::env::var("HOME").map(|h| format!("{h}/.npm")).unwrap_or_default()),
    ];
    let mut server = None;
    let clone = session.path().join("kura");
    let repo_root = repository();
    let bindings = repo_root.join("packages/kura-bindings");
    for file in ["package.json", "package-lock.json", "tsconfig.json", "scripts", "src"] {
        copy(&bindings.join(file), &clone.join("packages/kura-bindings").join(file));
    }
    copy(&repo_root.join("crates/cli/tests/compat/workers"), &clone.join("crates/cli/tests/compat/workers"));
    let repo = clone.display().to_string();
    // The shell's state (cd, exports) carries from block to block, as in the reader's terminal.
    let state = session.path().join("state.sh");
    std::fs::write(&state, format!("cd {}\n", cwd.display())).unwrap();
    for block in blocks(doc) {
        if !block.directive("skip").is_empty() {
            continue;
        }
        if let Some(file) = block.directive("file").first() {
            let path = cwd.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, format!("{}\n", block.text)).unwrap();
        } else if block.language != "sh" {
            continue;
        }
        let mut script = String::new();
        for before in block.directive("before") {
            script.push_str(&format!("{before}\n"));
        }
        if block.language == "sh" {
            for line in block.text.lines() {
                let command = line.split(" #").next().unwrap_or_default().trim();
                if command == SERVE {
                    assert!(server.is_none(), "{}: a second server in one doc", block.at);
                    let (started, exports) = Server::start(&cwd);
                    server = Some(started);
                    env.extend(exports);
                    continue;
                }
                if block.directive("skip-line").iter().any(|skipped| skipped == command) {
                    continue;
                }
                script.push_str(line);
                script.push('\n');
            }
        }
        for then in block.directive("then") {
            script.push_str(&format!("{then}\n"));
        }
        let mut script = fill_ellipses(&script.replace("/path/to/kura", &repo));
        for replace in block.directive("replace") {
            let (placeholder, shell) = replace.split_once("=>").expect("replace: <placeholder> => shell");
            script = script.replace(placeholder.trim(), shell.trim());
        }
        // The block, after the session's state, then the state saved for the next block.
        let wrapped = format!(
            "set -euo pipefail\n. {state}\n{script}\n{{ echo \"cd $(printf %q \"$PWD\")\"; export -p; }} > {state}.next\n",
            state = state.display()
        );
        // A block that hangs (a prompt no one answers) fails, rather than the suite hanging.
        let mut child = Command::new("timeout")
            .args(["300", "bash", "-c"])
            .arg(&wrapped)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            for line in block.directive("stdin") {
                let _ = writeln!(stdin, "{line}");
            }
        }
        let out = child.wait_with_output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{} failed as written:\n{}\n--- it said:\n{said}", block.at, block.text);
        std::fs::rename(format!("{}.next", state.display()), &state).unwrap();
    }
    drop(server);
}

/// Copies a file, or a directory with everything in it.
fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            copy(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        std::fs::copy(from, to).unwrap();
    }
}

#[test]
fn the_readme_and_the_docs_run_as_written() {
    assert!(compat_dir().join("node_modules/.bin/wrangler").exists(), "scripts/test installs wrangler");
    let docs = repository().join("docs");
    let mut files = vec![repository().join("README.md")];
    let mut others: Vec<PathBuf> = std::fs::read_dir(&docs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    others.sort();
    files.extend(others);
    for file in files {
        run_session(&file);
    }
}

#[test]
fn a_placeholder_left_to_the_reader_is_the_banner_s_value() {
    assert_eq!(
        fill_ellipses("export A=… B=x C=…"),
        "export A=\"${A:?the doc leaves A to the reader, and the banner printed no A}\" B=x C=\"${C:?the doc leaves C to the reader, and the banner printed no C}\""
    );
}
