//! wrangler's configuration file (`wrangler.json`, `wrangler.jsonc` or `wrangler.toml`), read as
//! wrangler reads it: only what kura needs, the `d1_databases` bindings and the Durable Object
//! bindings with the migrations that declare their classes.

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

/// JSON with comments and trailing commas (JSONC) to plain JSON.
fn strip_jsonc(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    let mut in_string = false;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            out.push(b);
            if b == b'\\' && i + 1 < bytes.len() {
                out.push(bytes[i + 1]);
                i += 1;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
            out.push(b);
        } else if b == b'/' && bytes.get(i + 1) == Some(&b'/') {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        } else if b == b'/' && bytes.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
            continue;
        } else if b == b',' {
            let next = bytes[i + 1..].iter().find(|c| !c.is_ascii_whitespace());
            if !matches!(next, Some(b'}') | Some(b']')) {
                out.push(b);
            }
        } else {
            out.push(b);
        }
        i += 1;
    }
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

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
