//! wrangler's configuration file (`wrangler.json`, `wrangler.jsonc` or `wrangler.toml`), read as
//! wrangler reads it: only what kura needs, the `d1_databases` and `kv_namespaces` bindings and
//! the Durable Object bindings with the migrations that declare their classes.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;

/// One `[[d1_databases]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct D1Binding {
    /// `env.<binding>` in a Worker.
    pub binding: String,
    /// The database's name.
    pub database_name: Option<String>,
    /// The database's id.
    pub database_id: Option<String>,
    /// The id `wrangler dev` uses instead, when set.
    #[serde(default)]
    pub preview_database_id: Option<String>,
    /// The tracking table for migrations.
    pub migrations_table: Option<String>,
    /// The migrations directory, relative to the configuration file.
    pub migrations_dir: Option<String>,
}

/// One `[[kv_namespaces]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct KvBinding {
    /// `env.<binding>` in a Worker.
    pub binding: String,
    /// The namespace's id.
    #[serde(default)]
    pub id: Option<String>,
    /// The id `wrangler dev --remote` uses instead, when set.
    #[serde(default)]
    pub preview_id: Option<String>,
}

/// One `[[durable_objects.bindings]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct DoBinding {
    /// `env.<name>` in a Worker.
    pub name: String,
    /// The class.
    pub class_name: String,
    /// The Worker that defines the class, if not this one.
    pub script_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct DurableObjectsSection {
    #[serde(default)]
    bindings: Vec<DoBinding>,
}

/// One `[[migrations]]` entry: only which classes it declares.
#[derive(Debug, Default, Deserialize)]
struct Migration {
    #[serde(default)]
    new_sqlite_classes: Vec<String>,
    #[serde(default)]
    new_classes: Vec<String>,
    #[serde(default)]
    renamed_classes: Vec<RenamedClass>,
    #[serde(default)]
    deleted_classes: Vec<String>,
}

/// A class renamed by a migration keeps its storage, and so its kind.
#[derive(Debug, Deserialize)]
struct RenamedClass {
    from: String,
    to: String,
}

#[derive(Debug, Default, Deserialize)]
struct RawConfig {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    d1_databases: Vec<D1Binding>,
    #[serde(default)]
    kv_namespaces: Vec<KvBinding>,
    #[serde(default)]
    durable_objects: DurableObjectsSection,
    #[serde(default)]
    migrations: Vec<Migration>,
}

/// A configuration file and its bindings.
#[derive(Debug, Clone)]
pub struct WranglerConfig {
    /// The file.
    pub path: PathBuf,
    /// The Worker's name.
    pub name: Option<String>,
    /// Its D1 bindings.
    pub d1_databases: Vec<D1Binding>,
    /// Its KV bindings.
    pub kv_namespaces: Vec<KvBinding>,
    /// Its Durable Object bindings.
    pub durable_objects: Vec<DoBinding>,
    /// Classes its migrations declare SQLite-backed (`new_sqlite_classes`).
    pub sqlite_classes: Vec<String>,
    /// Classes its migrations declare key-value-backed (`new_classes`).
    pub kv_classes: Vec<String>,
}

/// A Durable Object namespace as a configuration file declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoNamespaceSpec {
    /// The binding's name, which becomes the namespace's.
    pub name: String,
    pub class: String,
    pub script: String,
}

/// The files wrangler looks for, in its order of preference.
const NAMES: &[&str] = &["wrangler.json", "wrangler.jsonc", "wrangler.toml"];

impl WranglerConfig {
    /// Reads `explicit`, or else the first configuration file in the current directory.
    pub fn find(explicit: Option<&Path>) -> anyhow::Result<Option<Self>> {
        let path = match explicit {
            Some(p) => p.to_owned(),
            None => match NAMES.iter().map(PathBuf::from).find(|p| p.is_file()) {
                Some(p) => p,
                None => return Ok(None),
            },
        };
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let raw: RawConfig = if path.extension().is_some_and(|e| e == "toml") {
            toml::from_str(&text).with_context(|| format!("{} is not valid TOML", path.display()))?
        } else {
            serde_json::from_str(&strip_jsonc(&text))
                .with_context(|| format!("{} is not valid JSON", path.display()))?
        };
        let (mut sqlite_classes, mut kv_classes) = (Vec::new(), Vec::new());
        // Migrations apply in order: a renamed class keeps its kind; a deleted one is gone.
        for m in raw.migrations {
            sqlite_classes.extend(m.new_sqlite_classes);
            kv_classes.extend(m.new_classes);
            for renamed in m.renamed_classes {
                for classes in [&mut sqlite_classes, &mut kv_classes] {
                    if let Some(class) = classes.iter_mut().find(|c| **c == renamed.from) {
                        *class = renamed.to.clone();
                    }
                }
            }
            sqlite_classes.retain(|c| !m.deleted_classes.contains(c));
            kv_classes.retain(|c| !m.deleted_classes.contains(c));
        }
        Ok(Some(WranglerConfig {
            path,
            name: raw.name,
            d1_databases: raw.d1_databases,
            kv_namespaces: raw.kv_namespaces,
            durable_objects: raw.durable_objects.bindings,
            sqlite_classes,
            kv_classes,
        }))
    }

    /// The Durable Object namespace bound as `name` (or whose class is `name`), as wrangler
    /// would create it: named after the binding, the unique key derived from script and class.
    /// Only SQLite-backed classes are kura's.
    pub fn durable_object(&self, name: &str) -> anyhow::Result<Option<DoNamespaceSpec>> {
        let Some(binding) = self.durable_objects.iter().find(|b| b.name == name || b.class_name == name) else {
            return Ok(None);
        };
        let class = &binding.class_name;
        if binding.script_name.is_none() && !self.sqlite_classes.contains(class) {
            if self.kv_classes.contains(class) {
                bail!(
                    "{class} is declared with new_classes (key-value storage); kura keeps SQLite-backed Durable \
                     Objects only: declare it in new_sqlite_classes"
                );
            }
            bail!("{class} is not declared by any migration in {}: add it to new_sqlite_classes", self.path.display());
        }
        let script = binding.script_name.clone().or_else(|| self.name.clone()).with_context(|| {
            format!("{} names no Worker (`name`), which the namespace's unique key derives from", self.path.display())
        })?;
        Ok(Some(DoNamespaceSpec { name: binding.name.clone(), class: class.clone(), script }))
    }

    /// The binding whose `database_name` or `binding` is `name`.
    pub fn database(&self, name: &str) -> Option<&D1Binding> {
        self.d1_databases.iter().find(|d| d.database_name.as_deref() == Some(name) || d.binding == name)
    }

    /// The migrations directory of a binding.
    pub fn migrations_dir(&self, binding: &D1Binding) -> PathBuf {
        let base = self.path.parent().unwrap_or(Path::new("."));
        base.join(binding.migrations_dir.as_deref().unwrap_or(kura_d1::migrations::DEFAULT_DIR))
    }
}

/// The database a command names, as wrangler resolves it: the config's binding if there is one.
#[derive(Debug, Clone)]
pub struct Target {
    /// The database name (or id) to use.
    pub name: String,
    /// The id from the configuration, if any.
    pub id: Option<String>,
    /// The binding, if the name came from the configuration.
    pub binding: Option<D1Binding>,
    /// The configuration file.
    pub config: Option<WranglerConfig>,
}

impl Target {
    pub fn resolve(name: &str, config: Option<WranglerConfig>) -> Self {
        let binding = config.as_ref().and_then(|c| c.database(name)).cloned();
        let resolved_name = binding.as_ref().and_then(|b| b.database_name.clone()).unwrap_or_else(|| name.to_owned());
        let id = binding.as_ref().and_then(|b| b.database_id.clone());
        Target { name: resolved_name, id, binding, config }
    }

    /// The migrations directory and tracking table, which need a configured binding.
    pub fn migrations(&self) -> anyhow::Result<(PathBuf, String)> {
        let (Some(config), Some(binding)) = (&self.config, &self.binding) else {
            if self.config.is_none() {
                bail!("No configuration file found. Create a wrangler.jsonc file to define your D1 database.");
            }
            bail!("Couldn't find a D1 DB with the name or binding '{}' in your configuration file.", self.name);
        };
        let table = binding.migrations_table.clone().unwrap_or_else(|| kura_d1::migrations::DEFAULT_TABLE.to_owned());
        Ok((config.migrations_dir(binding), table))
    }
}

/// JSON with comments and trailing commas (JSONC) to plain JSON. Comments go first, so a comma
/// followed by a comment and then the closing bracket is seen as the trailing comma it is.
fn strip_jsonc(text: &str) -> String {
    let without_comments = outside_strings(text.as_bytes(), |bytes, i, out| match (bytes[i], bytes.get(i + 1)) {
        (b'/', Some(b'/')) => bytes[i..].iter().position(|&b| b == b'\n').map_or(bytes.len(), |n| i + n),
        (b'/', Some(b'*')) => {
            let end = bytes[i + 2..].windows(2).position(|w| w == b"*/").map_or(bytes.len(), |n| i + 2 + n + 2);
            // A block comment separates tokens as a space does.
            out.push(b' ');
            end
        }
        (b, _) => {
            out.push(b);
            i + 1
        }
    });
    let plain = outside_strings(&without_comments, |bytes, i, out| {
        let next = bytes[i + 1..].iter().find(|c| !c.is_ascii_whitespace());
        if bytes[i] != b',' || !matches!(next, Some(b'}') | Some(b']')) {
            out.push(bytes[i]);
        }
        i + 1
    });
    String::from_utf8(plain).unwrap_or_default()
}

/// Copies `bytes`, strings (with their escapes) as they are; everything else goes through
/// `step`, which appends what it keeps at `i` and answers where to go on.
fn outside_strings(bytes: &[u8], mut step: impl FnMut(&[u8], usize, &mut Vec<u8>) -> usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'"' {
            i = step(bytes, i, &mut out);
            continue;
        }
        // A string: copied through its closing quote (or the end of the text).
        out.push(b'"');
        i += 1;
        while i < bytes.len() {
            let b = bytes[i];
            out.push(b);
            i += 1;
            if b == b'\\' && i < bytes.len() {
                out.push(bytes[i]);
                i += 1;
            } else if b == b'"' {
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "(\\PC|[/*,\"\\\\])*".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                proptest::collection::btree_map("(\\PC|[/*,])*", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// `value` as JSONC: every element followed by a comma (so the last one's trails), with
    /// line and block comments between them.
    fn jsonc(value: &serde_json::Value) -> String {
        match value {
            serde_json::Value::Array(items) => {
                let inner: String = items.iter().map(|v| format!("{}, // item\n", jsonc(v))).collect();
                format!("[ /* array */ {inner}]")
            }
            serde_json::Value::Object(map) => {
                let inner: String = map
                    .iter()
                    .map(|(k, v)| {
                        format!("{} /* key */ : {},\n// member\n", serde_json::to_string(k).unwrap(), jsonc(v))
                    })
                    .collect();
                format!("{{\n{inner}}}")
            }
            leaf => serde_json::to_string(leaf).unwrap(),
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
            kura_testkit::count("KURA_FUZZ_CASES", 1_000)
        ))]

        /// Any JSON, its strings holding `//`, `/*` and commas, with comments and trailing commas
        /// added, reads back as the same JSON.
        #[test]
        fn jsonc_reads_back_as_the_json_it_decorates(value in json_value()) {
            let decorated = jsonc(&value);
            let read: serde_json::Value = serde_json::from_str(&strip_jsonc(&decorated)).unwrap();
            proptest::prop_assert_eq!(read, value);
        }

        /// Any bytes in a wrangler.json, wrangler.jsonc or wrangler.toml give a configuration or
        /// an error naming the file, never a panic.
        #[test]
        fn any_config_file_reads_or_is_refused(text in "\\PC{0,200}|[\\[\\]{}\"=,:/* a-z_0-9\n]{0,200}", ext in "json|jsonc|toml") {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(format!("wrangler.{ext}"));
            std::fs::write(&path, &text).unwrap();
            if let Err(e) = WranglerConfig::find(Some(&path)) {
                proptest::prop_assert!(e.to_string().contains("wrangler."), "{e}");
            }
        }
    }

    /// Found by `jsonc_reads_back_as_the_json_it_decorates`: a trailing comma followed by a
    /// comment was kept, so such a wrangler.jsonc was refused as invalid JSON.
    #[test]
    fn a_comment_after_a_trailing_comma_is_still_a_trailing_comma() {
        let text = "{ \"d1_databases\": [ { \"binding\": \"DB\" }, // production\n ], /* end */ }";
        let raw: RawConfig = serde_json::from_str(&strip_jsonc(text)).unwrap();
        assert_eq!(raw.d1_databases[0].binding, "DB");
    }

    #[test]
    fn jsonc_loses_comments_and_trailing_commas_only() {
        let text = r#"{
            // a comment
            "d1_databases": [ /* inline */ { "binding": "DB", "database_name": "a // not a comment", }, ],
        }"#;
        let raw: RawConfig = serde_json::from_str(&strip_jsonc(text)).unwrap();
        assert_eq!(raw.d1_databases[0].database_name.as_deref(), Some("a // not a comment"));
    }

    #[test]
    fn toml_bindings_resolve_by_name_or_binding() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wrangler.toml");
        std::fs::write(
            &path,
            "name = \"app\"\n[[d1_databases]]\nbinding = \"DB\"\ndatabase_name = \"prod\"\ndatabase_id = \"abc\"\nmigrations_dir = \"db/migrations\"\n",
        )
        .unwrap();
        let config = WranglerConfig::find(Some(&path)).unwrap().unwrap();
        let by_binding = Target::resolve("DB", Some(config.clone()));
        assert_eq!((by_binding.name.as_str(), by_binding.id.as_deref()), ("prod", Some("abc")));
        let (dir_path, table) = by_binding.migrations().unwrap();
        assert!(dir_path.ends_with("db/migrations"));
        assert_eq!(table, "d1_migrations");
        assert!(Target::resolve("other", Some(config)).migrations().is_err());
    }

    #[test]
    fn durable_object_bindings_need_a_sqlite_migration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wrangler.toml");
        std::fs::write(
            &path,
            "name = \"chat\"\n[[durable_objects.bindings]]\nname = \"ROOMS\"\nclass_name = \"Room\"\n\
             [[durable_objects.bindings]]\nname = \"OLD\"\nclass_name = \"Legacy\"\n\
             [[durable_objects.bindings]]\nname = \"NONE\"\nclass_name = \"Nowhere\"\n\
             [[migrations]]\ntag = \"v1\"\nnew_sqlite_classes = [\"Room\"]\nnew_classes = [\"Legacy\"]\n",
        )
        .unwrap();
        let config = WranglerConfig::find(Some(&path)).unwrap().unwrap();
        let rooms = config.durable_object("ROOMS").unwrap().unwrap();
        assert_eq!(rooms, DoNamespaceSpec { name: "ROOMS".into(), class: "Room".into(), script: "chat".into() });
        assert_eq!(config.durable_object("Room").unwrap(), Some(rooms));
        assert!(config.durable_object("OLD").unwrap_err().to_string().contains("new_sqlite_classes"));
        assert!(config.durable_object("NONE").is_err());
        assert_eq!(config.durable_object("OTHER").unwrap(), None);
    }

    #[test]
    fn renamed_classes_keep_their_kind_and_deleted_ones_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wrangler.json");
        std::fs::write(
            &path,
            r#"{ "name": "chat",
                 "durable_objects": { "bindings": [ { "name": "ROOMS", "class_name": "ChatRoom" },
                                                    { "name": "GONE", "class_name": "Old" } ] },
                 "migrations": [ { "tag": "v1", "new_sqlite_classes": ["Room", "Old"] },
                                 { "tag": "v2", "renamed_classes": [ { "from": "Room", "to": "ChatRoom" } ],
                                   "deleted_classes": ["Old"] } ] }"#,
        )
        .unwrap();
        let config = WranglerConfig::find(Some(&path)).unwrap().unwrap();
        assert_eq!(config.durable_object("ROOMS").unwrap().unwrap().class, "ChatRoom");
        assert!(config.durable_object("GONE").is_err());
    }
}
