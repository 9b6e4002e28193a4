//! What one upload is: wrangler's metadata as it arrives (the multipart form's `metadata`
//! part), and the version kura keeps of it (its modules' files and its
//! resolved bindings), frozen as JSON in the catalog.

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::WorkersError;

/// How a module's part is typed in the upload, and so how workerd loads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModuleKind {
    /// `application/javascript+module`: an ES module.
    EsModule,
    /// `application/javascript`: a CommonJS module, or the service-worker script.
    CommonJs,
    /// `application/wasm`.
    Wasm,
    /// `application/octet-stream`: an ArrayBuffer.
    Data,
    /// `text/plain`: a string.
    Text,
    /// `application/json`: a parsed value.
    Json,
    /// `application/source-map`: kept, never loaded.
    SourceMap,
}

impl ModuleKind {
    /// The kind a part's content type names (parameters such as `charset` ignored).
    pub fn from_content_type(content_type: &str) -> Option<ModuleKind> {
        let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        Some(match essence.as_str() {
            "application/javascript+module" | "text/javascript+module" => ModuleKind::EsModule,
            "application/javascript" | "text/javascript" => ModuleKind::CommonJs,
            "application/wasm" => ModuleKind::Wasm,
            "application/octet-stream" => ModuleKind::Data,
            "text/plain" => ModuleKind::Text,
            "application/json" => ModuleKind::Json,
            "application/source-map" => ModuleKind::SourceMap,
            _ => return None,
        })
    }

    /// The content type Cloudflare reports for it.
    pub fn content_type(self) -> &'static str {
        match self {
            ModuleKind::EsModule => "application/javascript+module",
            ModuleKind::CommonJs => "application/javascript",
            ModuleKind::Wasm => "application/wasm",
            ModuleKind::Data => "application/octet-stream",
            ModuleKind::Text => "text/plain",
            ModuleKind::Json => "application/json",
            ModuleKind::SourceMap => "application/source-map",
        }
    }
}

/// One part of the upload besides the metadata.
#[derive(Debug, Clone)]
pub struct UploadedModule {
    /// The part's name: the module's name (`index.js`, `lib/util.js`).
    pub name: String,
    /// Its kind, from the part's content type.
    pub kind: ModuleKind,
    /// Its bytes.
    pub bytes: bytes::Bytes,
}

/// A script upload: the metadata and the modules.
#[derive(Debug, Clone)]
pub struct Upload {
    /// The `metadata` part.
    pub metadata: UploadMetadata,
    /// Every other part.
    pub modules: Vec<UploadedModule>,
}

/// A Durable Object migration as wrangler sends it.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct Migrations {
    /// The tag the server must have now (absent on a script's first migration).
    #[serde(default)]
    pub old_tag: Option<String>,
    /// The tag after these steps.
    #[serde(default)]
    pub new_tag: Option<String>,
    /// The steps, in order.
    #[serde(default)]
    pub steps: Vec<MigrationStep>,
}

/// One step of a migration.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct MigrationStep {
    /// Classes that start implementing Durable Objects with key-value storage.
    #[serde(default)]
    pub new_classes: Vec<String>,
    /// Classes that start implementing Durable Objects with SQLite storage.
    #[serde(default)]
    pub new_sqlite_classes: Vec<String>,
    /// Classes renamed, their objects kept.
    #[serde(default)]
    pub renamed_classes: Vec<RenamedClass>,
    /// Classes whose objects are deleted.
    #[serde(default)]
    pub deleted_classes: Vec<String>,
    /// Classes moved from another script (not supported by kura).
    #[serde(default)]
    pub transferred_classes: Vec<Json>,
}

/// `{from, to}` of a rename.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
pub struct RenamedClass {
    /// The old name.
    pub from: String,
    /// The new name.
    pub to: String,
}

/// The upload's `metadata` part. Fields kura does not act on (logpush, placement,
/// observability, limits, tail consumers) are accepted and ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct UploadMetadata {
    /// The entry module of a modules-format Worker.
    #[serde(default)]
    pub main_module: Option<String>,
    /// The script part of a service-worker-format Worker.
    #[serde(default)]
    pub body_part: Option<String>,
    /// The bindings, as JSON objects with a `type` (checked one by one, for clear errors).
    #[serde(default)]
    pub bindings: Vec<Json>,
    /// `YYYY-MM-DD`.
    #[serde(default)]
    pub compatibility_date: Option<String>,
    /// Compatibility flags.
    #[serde(default)]
    pub compatibility_flags: Vec<String>,
    /// Durable Object migrations, when some are pending.
    #[serde(default)]
    pub migrations: Option<Migrations>,
    /// Binding types carried over from the previous version when the upload lacks them
    /// (`--keep-vars`: plain_text and json).
    #[serde(default)]
    pub keep_bindings: Vec<String>,
    /// `bundled`, `unbound`, `standard`.
    #[serde(default)]
    pub usage_model: Option<String>,
    /// `workers/message`, `workers/tag`.
    #[serde(default)]
    pub annotations: Option<serde_json::Map<String, Json>>,
    /// Static assets: `{jwt: <completion token>, config: {html_handling, …}}`.
    #[serde(default)]
    pub assets: Option<Json>,
    /// Keep the previous version's assets (uploads that do not send them again).
    #[serde(default)]
    pub keep_assets: Option<bool>,
}

/// A binding of a version, as kura keeps it and as the settings API shows it (wrangler's
/// shapes). Secrets are not among them: they live beside the script, not in a version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Binding {
    /// A text var.
    PlainText {
        /// `env` name.
        name: String,
        /// Its value.
        text: String,
    },
    /// A JSON var.
    Json {
        /// `env` name.
        name: String,
        /// Its value.
        json: Json,
    },
    /// A D1 database, by id.
    D1 {
        /// `env` name.
        name: String,
        /// The database's UUID.
        id: String,
    },
    /// An R2 bucket, by name.
    R2Bucket {
        /// `env` name.
        name: String,
        /// The bucket.
        bucket_name: String,
    },
    /// A KV namespace, by id.
    KvNamespace {
        /// `env` name.
        name: String,
        /// The namespace's id.
        namespace_id: String,
    },
    /// A queue this Worker sends to.
    Queue {
        /// `env` name.
        name: String,
        /// The queue.
        queue_name: String,
        /// Seconds its messages wait before delivery unless a send says otherwise.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        delivery_delay: Option<u32>,
    },
    /// A Durable Object namespace: a class of this script or of another.
    DurableObjectNamespace {
        /// `env` name.
        name: String,
        /// The class.
        class_name: String,
        /// The script implementing it, when not this one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        script_name: Option<String>,
    },
    /// Another script of the account, called with fetch or RPC.
    Service {
        /// `env` name.
        name: String,
        /// The script.
        service: String,
        /// A named entrypoint of it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entrypoint: Option<String>,
        /// `ctx.props` for the callee.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        props: Option<Json>,
    },
    /// The version's id, tag and time (`env.X.id`).
    VersionMetadata {
        /// `env` name.
        name: String,
    },
    /// The version's static assets (`env.ASSETS.fetch()`).
    Assets {
        /// `env` name.
        name: String,
    },
}

impl Binding {
    /// The `env` name.
    pub fn name(&self) -> &str {
        match self {
            Binding::PlainText { name, .. }
            | Binding::Json { name, .. }
            | Binding::D1 { name, .. }
            | Binding::R2Bucket { name, .. }
            | Binding::KvNamespace { name, .. }
            | Binding::Queue { name, .. }
            | Binding::DurableObjectNamespace { name, .. }
            | Binding::Service { name, .. }
            | Binding::VersionMetadata { name }
            | Binding::Assets { name } => name,
        }
    }

    /// wrangler's name for the type.
    pub fn type_name(&self) -> &'static str {
        match self {
            Binding::PlainText { .. } => "plain_text",
            Binding::Json { .. } => "json",
            Binding::D1 { .. } => "d1",
            Binding::R2Bucket { .. } => "r2_bucket",
            Binding::KvNamespace { .. } => "kv_namespace",
            Binding::Queue { .. } => "queue",
            Binding::DurableObjectNamespace { .. } => "durable_object_namespace",
            Binding::Service { .. } => "service",
            Binding::VersionMetadata { .. } => "version_metadata",
            Binding::Assets { .. } => "assets",
        }
    }
}

/// A binding as uploaded, before kura resolves it against the account.
#[derive(Debug, Clone, PartialEq)]
pub enum UploadedBinding {
    /// One kura keeps in the version.
    Kept(Binding),
    /// A secret: kept beside the script.
    Secret {
        /// `env` name.
        name: String,
        /// Its value.
        text: String,
    },
    /// "Whatever the previous version had under this name."
    Inherit {
        /// `env` name.
        name: String,
    },
}

/// Binding types kura serves, for error messages.
pub const SUPPORTED_BINDINGS: &str = "d1, r2_bucket, kv_namespace, queue, durable_object_namespace, service, plain_text, json, secret_text, inherit, version_metadata and assets";

impl UploadedBinding {
    /// Reads one element of the metadata's `bindings`.
    pub fn parse(value: &Json) -> Result<UploadedBinding, WorkersError> {
        let name = value.get("name").and_then(Json::as_str).unwrap_or("").to_owned();
        let kind = value.get("type").and_then(Json::as_str).unwrap_or("");
        if !kura_catalog::is_valid_binding_name(&name) {
            return Err(WorkersError::invalid_upload(format!("'{name}' is not a valid binding name")));
        }
        let text_field = |field: &str| {
            value.get(field).and_then(Json::as_str).map(str::to_owned).ok_or_else(|| {
                WorkersError::invalid_upload(format!("binding {name} of type {kind} must have a text `{field}`"))
            })
        };
        match kind {
            "secret_text" => Ok(UploadedBinding::Secret { text: text_field("text")?, name }),
            "inherit" => Ok(UploadedBinding::Inherit { name }),
            "plain_text"
            | "json"
            | "d1"
            | "r2_bucket"
            | "kv_namespace"
            | "queue"
            | "durable_object_namespace"
            | "service"
            | "version_metadata"
            | "assets" => {
                if kind == "r2_bucket"
                    && value.get("jurisdiction").and_then(Json::as_str).is_some_and(|j| !j.is_empty())
                {
                    return Err(WorkersError::invalid_upload(format!(
                        "binding {name}: kura has no R2 jurisdictions; remove `jurisdiction`"
                    )));
                }
                if kind == "durable_object_namespace"
                    && value.get("environment").and_then(Json::as_str).is_some_and(|e| !e.is_empty())
                {
                    return Err(WorkersError::invalid_upload(format!(
                        "binding {name}: kura has no service environments; remove `environment`"
                    )));
                }
                serde_json::from_value::<Binding>(value.clone()).map(UploadedBinding::Kept).map_err(|e| {
                    WorkersError::invalid_upload(format!("binding {name} of type {kind} is malformed: {e}"))
                })
            }
            other => Err(WorkersError::invalid_upload(format!(
                "binding {name} has type '{other}', which kura does not serve; it serves {SUPPORTED_BINDINGS}"
            ))),
        }
    }

    /// The `env` name.
    pub fn name(&self) -> &str {
        match self {
            UploadedBinding::Kept(b) => b.name(),
            UploadedBinding::Secret { name, .. } | UploadedBinding::Inherit { name } => name,
        }
    }
}

/// Where a module's bytes are, within its version's directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredModule {
    /// The module's name.
    pub name: String,
    /// Its kind.
    pub kind: ModuleKind,
    /// The file in the version's directory (`0`, `1`, …: never a name from the upload).
    pub file: String,
    /// Its size in bytes.
    pub size: u64,
}

/// A version as kura keeps it (format 1), in the catalog's `metadata` column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredVersion {
    /// The format of this record.
    pub format: u32,
    /// The entry module (modules format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_module: Option<String>,
    /// The service-worker script's module, for that format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_part: Option<String>,
    /// Every module, the entry first.
    pub modules: Vec<StoredModule>,
    /// The date the upload asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compatibility_date: Option<String>,
    /// Compatibility flags.
    #[serde(default)]
    pub compatibility_flags: Vec<String>,
    /// The resolved bindings (no secrets).
    pub bindings: Vec<Binding>,
    /// `standard` unless the upload said otherwise.
    pub usage_model: String,
    /// Hex SHA-256 over the modules: the script's etag.
    pub etag: String,
    /// Whether it has static assets (their files are listed in its directory).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub has_assets: bool,
}

impl StoredVersion {
    /// The format written now.
    pub const FORMAT: u32 = 1;

    /// Reads a version back from the catalog.
    pub fn from_json(text: &str) -> Result<StoredVersion, WorkersError> {
        let version: StoredVersion = serde_json::from_str(text)
            .map_err(|e| WorkersError::Storage(format!("a stored version is unreadable: {e}")))?;
        if version.format != Self::FORMAT {
            return Err(WorkersError::Storage(format!("a stored version has unknown format {}", version.format)));
        }
        Ok(version)
    }

    /// The record as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a version serialises")
    }

    /// The modules workerd loads (source maps are kept, not loaded).
    pub fn loaded_modules(&self) -> impl Iterator<Item = &StoredModule> {
        self.modules.iter().filter(|m| m.kind != ModuleKind::SourceMap)
    }

    /// The bindings to Durable Object classes of this script.
    pub fn own_classes(&self) -> impl Iterator<Item = &str> {
        self.bindings.iter().filter_map(|b| match b {
            Binding::DurableObjectNamespace { class_name, script_name: None, .. } => Some(class_name.as_str()),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wranglers_bindings_parse() {
        // The metadata wrangler 4.85.0 sent for the reference's test project.
        let metadata: UploadMetadata = serde_json::from_value(json!({
            "main_module": "index.js",
            "bindings": [
                {"name": "GREETING", "type": "plain_text", "text": "hello"},
                {"name": "LIMITS", "type": "json", "json": {"max": 3}},
                {"name": "ROOMS", "type": "durable_object_namespace", "class_name": "Room"},
                {"name": "FILES", "type": "r2_bucket", "bucket_name": "files"},
                {"name": "DB", "type": "d1", "id": "11111111-2222-3333-4444-555555555555"},
                {"name": "API_KEY", "type": "secret_text", "text": "s3cr3t"},
                {"name": "OLD", "type": "inherit"}
            ],
            "compatibility_date": "2025-06-01",
            "compatibility_flags": ["nodejs_compat"],
            "migrations": {"new_tag": "v1", "steps": [{"new_sqlite_classes": ["Room"]}]},
            "observability": {"enabled": false}
        }))
        .unwrap();
        let parsed: Vec<_> = metadata.bindings.iter().map(|b| UploadedBinding::parse(b).unwrap()).collect();
        assert_eq!(
            parsed[0],
            UploadedBinding::Kept(Binding::PlainText { name: "GREETING".into(), text: "hello".into() })
        );
        assert_eq!(
            parsed[2],
            UploadedBinding::Kept(Binding::DurableObjectNamespace {
                name: "ROOMS".into(),
                class_name: "Room".into(),
                script_name: None
            })
        );
        assert_eq!(parsed[5], UploadedBinding::Secret { name: "API_KEY".into(), text: "s3cr3t".into() });
        assert_eq!(parsed[6], UploadedBinding::Inherit { name: "OLD".into() });
        assert_eq!(metadata.migrations.unwrap().steps[0].new_sqlite_classes, ["Room"]);
        // Kept bindings round-trip in wrangler's own shape, as the settings API shows them.
        let UploadedBinding::Kept(d1) = &parsed[4] else { panic!() };
        assert_eq!(serde_json::to_value(d1).unwrap(), metadata.bindings[4]);
    }

    #[test]
    fn bindings_kura_does_not_serve_are_refused_by_name() {
        let ai = json!({"name": "AI", "type": "ai"});
        let e = UploadedBinding::parse(&ai).unwrap_err().to_string();
        assert!(e.contains("'ai'") && e.contains("AI"), "{e}");
        let queue = json!({"name": "Q", "type": "queue", "queue_name": "jobs", "delivery_delay": 5});
        assert_eq!(
            UploadedBinding::parse(&queue).unwrap(),
            UploadedBinding::Kept(Binding::Queue {
                name: "Q".into(),
                queue_name: "jobs".into(),
                delivery_delay: Some(5)
            })
        );
        let kv = json!({"name": "KV", "type": "kv_namespace", "namespace_id": "x"});
        let parsed = UploadedBinding::parse(&kv).unwrap();
        assert_eq!(parsed, UploadedBinding::Kept(Binding::KvNamespace { name: "KV".into(), namespace_id: "x".into() }));
        let bad_name = json!({"name": "a-b", "type": "plain_text", "text": "x"});
        assert!(UploadedBinding::parse(&bad_name).is_err());
        let missing = json!({"name": "DB", "type": "d1"});
        assert!(UploadedBinding::parse(&missing).unwrap_err().to_string().contains("malformed"));
    }

    #[test]
    fn module_kinds_follow_content_types() {
        assert_eq!(ModuleKind::from_content_type("application/javascript+module"), Some(ModuleKind::EsModule));
        assert_eq!(ModuleKind::from_content_type("text/plain; charset=utf-8"), Some(ModuleKind::Text));
        assert_eq!(ModuleKind::from_content_type("image/png"), None);
    }
}
