//! workerd's configuration, written by kura from the deployed scripts: one worker per script
//! (its modules, compatibility, bindings), one listening socket per script, the services that
//! carry bindings to kura (D1, R2, KV and queue requests, object announcements, logs) with the headers
//! that say whose they are, and the disks Durable Object classes store their objects on.
//!
//! The format is capnp text (workerd has no other text format).
//! Module bytes are `embed`ded from their files (paths relative to the config file, as capnp
//! requires); vars are written as escaped literals; secrets never reach the file — they are
//! `fromEnvironment` bindings, handed to the process in its environment.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use crate::version::{Binding, ModuleKind, StoredVersion};

/// Headers kura's binding listener reads: who the request is for. workerd adds them to every
/// request of a binding's service; the Worker's own code never sees or sets them.
pub mod headers {
    /// The secret of this run of kura: requests without it are refused.
    pub const SECRET: &str = "x-kura-worker-secret";
    /// The account whose resource the binding names.
    pub const ACCOUNT: &str = "x-kura-account";
    /// The D1 database, by UUID.
    pub const D1_DATABASE: &str = "x-kura-d1-database";
    /// The R2 bucket, by name.
    pub const R2_BUCKET: &str = "x-kura-r2-bucket";
    /// The KV namespace, by id.
    pub const KV_NAMESPACE: &str = "x-kura-kv-namespace";
    /// The queue a producer binding sends to, by name.
    pub const QUEUE: &str = "x-kura-queue";
    /// The producer binding's `delivery_delay`, in seconds.
    pub const QUEUE_DELAY: &str = "x-kura-queue-delay";
    /// The script (storage id) an announcement or a log comes from.
    pub const SCRIPT: &str = "x-kura-script";
    /// The script (storage id) whose assets an `env.ASSETS.fetch()` asks for.
    pub const ASSETS: &str = "x-kura-assets";
    /// In a cluster, the Durable Object namespace (storage id) a stub's call is for.
    pub const DO_NAMESPACE: &str = "x-kura-do-namespace";
    /// The object a stub's call is for (workerd's 64 hex digits).
    pub const DO_OBJECT: &str = "x-kura-do-object";
    /// The name the object was reached by, percent-encoded (absent for ids not made from one).
    pub const DO_NAME: &str = "x-kura-do-name";
    /// What the call is: `fetch` or `call` (JavaScript RPC).
    pub const DO_KIND: &str = "x-kura-do-kind";
    /// The class whose door a call goes through (set by kura on the serving node).
    pub const DO_CLASS: &str = "x-kura-do-class";
    /// On the door's answer: `fetch` (the object's own response) or `value` (an RPC outcome).
    pub const DO_ANSWER: &str = "x-kura-do-answer";
}

/// The name of the binding the Durable Object wrapper announces objects through; it is taken
/// out of the `env` the user's classes see.
pub const ANNOUNCE_BINDING: &str = "__KURA_DO";

/// A Durable Object class of a script whose objects workerd runs.
#[derive(Debug, Clone)]
pub struct HostedClass {
    /// The exported class.
    pub class_name: String,
    /// The key its ids derive from.
    pub unique_key: String,
    /// The namespace's storage id.
    pub namespace_id: String,
    /// Whether it has the SQL API.
    pub use_sqlite: bool,
}

/// A deployed script, with everything its configuration needs.
#[derive(Debug, Clone)]
pub struct ServedScript {
    /// Storage id.
    pub id: String,
    /// The account.
    pub account_id: String,
    /// The name.
    pub name: String,
    /// The deployed version's id.
    pub version_id: String,
    /// When it was uploaded (for `version_metadata`).
    pub version_created_on: String,
    /// The version.
    pub version: StoredVersion,
    /// Where its modules' files are.
    pub modules_dir: PathBuf,
    /// Its secrets.
    pub secrets: Vec<(String, String)>,
    /// Its own Durable Object classes.
    pub classes: Vec<HostedClass>,
}

/// Where things are, for one configuration.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The directory the config file is written to (embed paths are relative to it).
    pub config_dir: PathBuf,
    /// The directory the per-script sockets listen in.
    pub socket_dir: PathBuf,
    /// kura's binding listener.
    pub bindings_socket: PathBuf,
    /// The value of [`headers::SECRET`].
    pub secret: String,
    /// Per script, a directory whose entries (one per class, named by its unique key) lead to
    /// the namespaces' object directories.
    pub disks_dir: PathBuf,
    /// The newest compatibility date workerd supports; later dates are lowered to it.
    pub max_compatibility_date: Option<String>,
    /// Whether this node is one of a cluster's: Durable Object stubs then reach their objects
    /// through kura (on whichever node serves the namespace) instead of this workerd directly.
    pub clustered: bool,
}

/// Whether a configuration is served or only checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Every deployed script, for real.
    Serve,
    /// One candidate, to see whether workerd accepts it: objects in memory, nothing connected.
    Check,
}

/// A configuration ready to run.
#[derive(Debug, Clone)]
pub struct WorkerdConfig {
    /// The capnp text.
    pub text: String,
    /// The process's environment additions (secrets).
    pub env: Vec<(String, String)>,
    /// The wrapper modules the text embeds, to be written beside it: (file name, contents).
    pub generated: Vec<(String, String)>,
    /// Per script id, the socket it is served on.
    pub sockets: Vec<(String, PathBuf)>,
}

/// The date scripts without one run at (Cloudflare's default for old scripts).
const DEFAULT_COMPATIBILITY_DATE: &str = "2021-11-03";

/// The JavaScript of the Durable Object wrapper: each hosted class is exported as a subclass
/// that, before its first request, tells kura which object it is (id and name), so kura lists
/// objects by name and starts capturing their history; the announcement binding is removed
/// from the `env` the class sees.
const WRAPPER_MODULE: &str = include_str!("wrapper.js");

/// The JavaScript of the tail worker that sends a script's logs and exceptions to kura.
const TAIL_MODULE: &str = include_str!("tail.js");

/// The generated Worker kura fires a script's Cron Triggers through.
const CRON_TRIGGER_MODULE: &str = include_str!("cron-trigger.js");

/// In a cluster, the Durable Object namespace binding scripts see (a wrapped binding around
/// workerd's own, whose stubs call through kura).
const OBJECTS_STUB_MODULE: &str = concat!(include_str!("objects-codec.js"), include_str!("objects-stub.js"));

/// In a cluster, the Worker kura makes a script's objects' calls through on the node serving
/// their namespace.
const OBJECTS_DOOR_MODULE: &str = concat!(include_str!("objects-codec.js"), include_str!("objects-door.js"));

/// The compatibility date the door runs at.
const DOOR_COMPATIBILITY_DATE: &str = "2025-06-01";

/// The internal module name of [`OBJECTS_STUB_MODULE`].
const OBJECTS_STUB_NAME: &str = "kura:objects-stub";

/// The socket key (and service) of the door to `script_id`'s Durable Objects.
pub fn objects_door(script_id: &str) -> String {
    format!("door-{script_id}")
}

/// The socket key (and service) of the Worker that fires `script_id`'s Cron Triggers.
pub fn cron_trigger(script_id: &str) -> String {
    format!("cron-{script_id}")
}

/// A capnp text literal.
pub fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `path` relative to `from`, both absolute (capnp embeds only relative paths).
fn relative(from: &Path, path: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = path.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for part in &to[common..] {
        out.push(part);
    }
    out
}

fn embed(layout: &Layout, path: &Path) -> String {
    format!("embed {}", quote(&relative(&layout.config_dir, path).to_string_lossy()))
}

/// The compatibility date a version runs at.
pub fn effective_date(version: &StoredVersion, max: Option<&str>) -> String {
    let wanted = version.compatibility_date.as_deref().unwrap_or(DEFAULT_COMPATIBILITY_DATE);
    match max {
        Some(max) if wanted > max => max.to_owned(),
        _ => wanted.to_owned(),
    }
}

/// The service name of a script's worker.
pub fn worker_service(script_id: &str) -> String {
    format!("w-{script_id}")
}

/// The socket a script is served on.
pub fn socket_path(layout: &Layout, script_id: &str) -> PathBuf {
    layout.socket_dir.join(format!("w-{}.sock", &script_id[..script_id.len().min(16)]))
}

/// Builds the configuration for `scripts`.
pub fn render(layout: &Layout, scripts: &[ServedScript], purpose: Purpose) -> WorkerdConfig {
    let mut services = String::new();
    let mut sockets = String::new();
    let mut externals: HashMap<String, String> = HashMap::new();
    let mut config = WorkerdConfig { text: String::new(), env: Vec::new(), generated: Vec::new(), sockets: Vec::new() };
    let mut stubs_through_kura = false;
    let by_name: HashMap<(&str, &str), &ServedScript> =
        scripts.iter().map(|s| ((s.account_id.as_str(), s.name.as_str()), s)).collect();
    let bindings_address = match purpose {
        Purpose::Serve => format!("unix:{}", layout.bindings_socket.display()),
        Purpose::Check => format!("unix:{}", layout.socket_dir.join("unused.sock").display()),
    };
    let mut external = |name: String, injected: Vec<(&str, String)>| -> String {
        externals.entry(name.clone()).or_insert_with(|| {
            let mut inject = format!("(name = {}, value = {})", quote(headers::SECRET), quote(&layout.secret));
            for (header, value) in injected {
                let _ = write!(inject, ", (name = {}, value = {})", quote(header), quote(&value));
            }
            format!(
                "    (name = {}, external = (address = {}, http = (injectRequestHeaders = [{inject}]))),\n",
                quote(&name),
                quote(&bindings_address)
            )
        });
        name
    };

    // An assets-only Worker has no code for workerd to run: kura serves its files itself.
    for (index, script) in scripts.iter().enumerate().filter(|(_, s)| !s.version.modules.is_empty()) {
        let service = worker_service(&script.id);
        let mut bindings = Vec::new();
        for binding in &script.version.bindings {
            let name = quote(binding.name());
            match binding {
                Binding::PlainText { text, .. } => bindings.push(format!("(name = {name}, text = {})", quote(text))),
                Binding::Json { json, .. } => {
                    bindings.push(format!("(name = {name}, json = {})", quote(&json.to_string())))
                }
                Binding::VersionMetadata { .. } => {
                    let meta =
                        serde_json::json!({"id": script.version_id, "tag": "", "timestamp": script.version_created_on});
                    bindings.push(format!("(name = {name}, json = {})", quote(&meta.to_string())));
                }
                Binding::D1 { id, .. } => {
                    let svc = external(
                        format!("d1-{}-{id}", script.account_id),
                        vec![(headers::ACCOUNT, script.account_id.clone()), (headers::D1_DATABASE, id.clone())],
                    );
                    bindings.push(format!(
                        "(name = {name}, wrapped = (moduleName = \"cloudflare-internal:d1-api\", \
                         innerBindings = [(name = \"fetcher\", service = {})]))",
                        quote(&svc)
                    ));
                }
                Binding::R2Bucket { bucket_name, .. } => {
                    let svc = external(
                        format!("r2-{}-{bucket_name}", script.account_id),
                        vec![(headers::ACCOUNT, script.account_id.clone()), (headers::R2_BUCKET, bucket_name.clone())],
                    );
                    bindings.push(format!("(name = {name}, r2Bucket = {})", quote(&svc)));
                }
                Binding::KvNamespace { namespace_id, .. } => {
                    let svc = external(
                        format!("kv-{}-{namespace_id}", script.account_id),
                        vec![
                            (headers::ACCOUNT, script.account_id.clone()),
                            (headers::KV_NAMESPACE, namespace_id.clone()),
                        ],
                    );
                    bindings.push(format!("(name = {name}, kvNamespace = {})", quote(&svc)));
                }
                Binding::Queue { queue_name, delivery_delay, .. } => {
                    let mut injected =
                        vec![(headers::ACCOUNT, script.account_id.clone()), (headers::QUEUE, queue_name.clone())];
                    if let Some(delay) = delivery_delay {
                        injected.push((headers::QUEUE_DELAY, delay.to_string()));
                    }
                    let svc = external(
                        format!("queue-{}-{queue_name}-{}", script.account_id, delivery_delay.unwrap_or(0)),
                        injected,
                    );
                    bindings.push(format!("(name = {name}, queue = {})", quote(&svc)));
                }
                Binding::DurableObjectNamespace { class_name, script_name, .. } => {
                    let target = match script_name {
                        None => script,
                        Some(other) => match by_name.get(&(script.account_id.as_str(), other.as_str())) {
                            Some(target) if purpose == Purpose::Serve => target,
                            _ => continue,
                        },
                    };
                    let designator = format!(
                        "(className = {}, serviceName = {})",
                        quote(class_name),
                        quote(&worker_service(&target.id))
                    );
                    let hosted = target.classes.iter().find(|c| &c.class_name == class_name);
                    // A check renders what will serve (the stub module runs in the script's isolate).
                    match hosted {
                        Some(hosted) if layout.clustered => {
                            let kura = external(
                                format!("objects-{}", hosted.namespace_id),
                                vec![
                                    (headers::ACCOUNT, script.account_id.clone()),
                                    (headers::DO_NAMESPACE, hosted.namespace_id.clone()),
                                ],
                            );
                            stubs_through_kura = true;
                            bindings.push(format!(
                                "(name = {name}, wrapped = (moduleName = {}, innerBindings = [\
                                 (name = \"namespace\", durableObjectNamespace = {designator}), \
                                 (name = \"kura\", service = {})]))",
                                quote(OBJECTS_STUB_NAME),
                                quote(&kura)
                            ));
                        }
                        _ => bindings.push(format!("(name = {name}, durableObjectNamespace = {designator})")),
                    }
                }
                Binding::Assets { .. } => {
                    let svc = external(format!("assets-{}", script.id), vec![(headers::ASSETS, script.id.clone())]);
                    bindings.push(format!("(name = {name}, service = {})", quote(&svc)));
                }
                Binding::Service { service: target, entrypoint, props, .. } => {
                    let target = if target == &script.name {
                        Some(script)
                    } else if purpose == Purpose::Serve {
                        by_name.get(&(script.account_id.as_str(), target.as_str())).copied()
                    } else {
                        None
                    };
                    let Some(target) = target else { continue };
                    let mut designator = format!("name = {}", quote(&worker_service(&target.id)));
                    if let Some(entrypoint) = entrypoint {
                        let _ = write!(designator, ", entrypoint = {}", quote(entrypoint));
                    }
                    if let Some(props) = props {
                        let _ = write!(designator, ", props = (json = {})", quote(&props.to_string()));
                    }
                    bindings.push(format!("(name = {name}, service = ({designator}))"));
                }
            }
        }
        for (i, (name, text)) in script.secrets.iter().enumerate() {
            let variable = format!("KURA_SECRET_{index}_{i}");
            bindings.push(format!("(name = {}, fromEnvironment = {})", quote(name), quote(&variable)));
            config.env.push((variable, text.clone()));
        }

        let mut modules = Vec::new();
        let wrapped = !script.classes.is_empty() && script.version.main_module.is_some();
        if wrapped {
            let main = script.version.main_module.as_deref().expect("checked");
            let entry_file = format!("entry-{}.js", script.id);
            config.generated.push((entry_file.clone(), wrapper_entry(main, &script.classes)));
            modules.push(format!(
                "(name = \"__kura_entry.js\", esModule = {})",
                embed(layout, &layout.config_dir.join(&entry_file))
            ));
            config.generated.push(("kura-do-wrapper.js".to_owned(), WRAPPER_MODULE.to_owned()));
            modules.push(format!(
                "(name = \"__kura_do_wrapper.js\", esModule = {})",
                embed(layout, &layout.config_dir.join("kura-do-wrapper.js"))
            ));
            let svc = external(format!("announce-{}", script.id), vec![(headers::SCRIPT, script.id.clone())]);
            bindings.push(format!("(name = {}, service = {})", quote(ANNOUNCE_BINDING), quote(&svc)));
        }
        for module in script.version.loaded_modules() {
            let file = script.modules_dir.join(&module.file);
            if script.version.body_part.as_deref() == Some(module.name.as_str()) {
                continue;
            }
            let field = match module.kind {
                ModuleKind::EsModule => "esModule",
                ModuleKind::CommonJs => "commonJsModule",
                ModuleKind::Wasm => "wasm",
                ModuleKind::Data => "data",
                ModuleKind::Text => "text",
                ModuleKind::Json => "json",
                ModuleKind::SourceMap => continue,
            };
            modules.push(format!("(name = {}, {field} = {})", quote(&module.name), embed(layout, &file)));
        }
        let code =
            match script.version.body_part.as_deref().and_then(|b| script.version.modules.iter().find(|m| m.name == b))
            {
                Some(body) => format!("serviceWorkerScript = {}", embed(layout, &script.modules_dir.join(&body.file))),
                None => format!("modules = [\n        {}\n      ]", modules.join(",\n        ")),
            };
        let date = effective_date(&script.version, layout.max_compatibility_date.as_deref());
        let flags: Vec<String> = script.version.compatibility_flags.iter().map(|f| quote(f)).collect();
        let mut worker = format!(
            "      {code},\n      compatibilityDate = {},\n      compatibilityFlags = [{}],\n      bindings = [\n        {}\n      ],\n",
            quote(&date),
            flags.join(", "),
            bindings.join(",\n        ")
        );
        if !script.classes.is_empty() {
            let namespaces: Vec<String> = script
                .classes
                .iter()
                .map(|c| {
                    format!(
                        "(className = {}, uniqueKey = {}, enableSql = {})",
                        quote(&c.class_name),
                        quote(&c.unique_key),
                        c.use_sqlite
                    )
                })
                .collect();
            let _ = writeln!(worker, "      durableObjectNamespaces = [{}],", namespaces.join(", "));
            match purpose {
                Purpose::Serve => {
                    let disk = format!("disk-{}", script.id);
                    let _ = writeln!(worker, "      durableObjectStorage = (localDisk = {}),", quote(&disk));
                    let _ = writeln!(
                        services,
                        "    (name = {}, disk = (path = {}, writable = true)),",
                        quote(&disk),
                        quote(&layout.disks_dir.join(&script.id).to_string_lossy())
                    );
                }
                Purpose::Check => {
                    let _ = writeln!(worker, "      durableObjectStorage = (inMemory = void),");
                }
            }
        }
        if purpose == Purpose::Serve {
            let tail = format!("t-{}", script.id);
            let _ = writeln!(worker, "      tails = [{}],", quote(&tail));
            let sink = external(format!("logs-{}", script.id), vec![(headers::SCRIPT, script.id.clone())]);
            let _ = writeln!(
                services,
                "    (name = {}, worker = (modules = [(name = \"tail.js\", esModule = {})], compatibilityDate = \"2024-09-23\", \
                 bindings = [(name = \"SINK\", service = {})])),",
                quote(&tail),
                embed(layout, &layout.config_dir.join("kura-tail.js")),
                quote(&sink)
            );
        }
        let _ = writeln!(services, "    (name = {}, worker = (\n{worker}    )),", quote(&service));
        let socket = socket_path(layout, &script.id);
        let _ = writeln!(
            sockets,
            "    (name = {}, address = {}, http = (), service = {}),",
            quote(&format!("s-{}", script.id)),
            quote(&format!("unix:{}", socket.display())),
            quote(&service)
        );
        config.sockets.push((script.id.clone(), socket));
        if purpose == Purpose::Serve {
            // `Fetcher.scheduled()` is a service binding's, behind a flag workerd only takes
            // with --experimental (which kura runs it with).
            let trigger = cron_trigger(&script.id);
            let _ = writeln!(
                services,
                "    (name = {}, worker = (modules = [(name = \"cron.js\", esModule = {})], compatibilityDate = \"2024-09-23\", \
                 compatibilityFlags = [\"service_binding_extra_handlers\"], bindings = [(name = \"TARGET\", service = {})])),",
                quote(&trigger),
                embed(layout, &layout.config_dir.join("kura-cron-trigger.js")),
                quote(&service)
            );
            let socket = layout.socket_dir.join(format!("c-{}.sock", &script.id[..script.id.len().min(16)]));
            let _ = writeln!(
                sockets,
                "    (name = {}, address = {}, http = (), service = {}),",
                quote(&format!("s-{trigger}")),
                quote(&format!("unix:{}", socket.display())),
                quote(&trigger)
            );
            config.sockets.push((trigger, socket));
        }
        if layout.clustered && !script.classes.is_empty() {
            let door = objects_door(&script.id);
            let namespaces: Vec<String> = script
                .classes
                .iter()
                .map(|c| {
                    format!(
                        "(name = {}, durableObjectNamespace = (className = {}, serviceName = {}))",
                        quote(&c.class_name),
                        quote(&c.class_name),
                        quote(&service)
                    )
                })
                .collect();
            // A date with JavaScript RPC (2024-04-03 on), and no later than this workerd's.
            let date = match layout.max_compatibility_date.as_deref() {
                Some(max) if max < DOOR_COMPATIBILITY_DATE => max,
                _ => DOOR_COMPATIBILITY_DATE,
            };
            let _ = writeln!(
                services,
                "    (name = {}, worker = (modules = [(name = \"door.js\", esModule = {})], compatibilityDate = {}, \
                 bindings = [{}])),",
                quote(&door),
                embed(layout, &layout.config_dir.join("kura-objects-door.js")),
                quote(date),
                namespaces.join(", ")
            );
            let socket = layout.socket_dir.join(format!("o-{}.sock", &script.id[..script.id.len().min(16)]));
            let _ = writeln!(
                sockets,
                "    (name = {}, address = {}, http = (), service = {}),",
                quote(&format!("s-{door}")),
                quote(&format!("unix:{}", socket.display())),
                quote(&door)
            );
            config.sockets.push((door, socket));
            config.generated.push(("kura-objects-door.js".to_owned(), OBJECTS_DOOR_MODULE.to_owned()));
        }
    }
    if purpose == Purpose::Serve && !scripts.is_empty() {
        config.generated.push(("kura-tail.js".to_owned(), TAIL_MODULE.to_owned()));
        config.generated.push(("kura-cron-trigger.js".to_owned(), CRON_TRIGGER_MODULE.to_owned()));
    }
    let mut externals: Vec<_> = externals.into_values().collect();
    externals.sort();
    let mut extensions = String::new();
    if stubs_through_kura {
        config.generated.push(("kura-objects-stub.js".to_owned(), OBJECTS_STUB_MODULE.to_owned()));
        extensions = format!(
            "  extensions = [(modules = [(name = {}, esModule = {}, internal = true)])],\n",
            quote(OBJECTS_STUB_NAME),
            embed(layout, &layout.config_dir.join("kura-objects-stub.js"))
        );
    }
    config.text = format!(
        "# Written by kura from the deployed Workers; rewritten on every deploy.\n\
         using Workerd = import \"/workerd/workerd.capnp\";\n\
         const config :Workerd.Config = (\n  services = [\n{services}{}  ],\n  sockets = [\n{sockets}  ],\n{extensions});\n",
        externals.concat()
    );
    config
}

/// The generated entry module of a script with Durable Object classes: everything of the
/// user's entry module, with each class replaced by its announcing subclass.
fn wrapper_entry(main_module: &str, classes: &[HostedClass]) -> String {
    let specifier = serde_json::to_string(&format!("./{main_module}")).expect("a string serialises");
    let mut out = format!(
        "import * as user from {specifier};\nimport {{ announcing }} from \"./__kura_do_wrapper.js\";\nexport * from {specifier};\n\
         export default user.default;\n"
    );
    for class in classes {
        let name = serde_json::to_string(&class.class_name).expect("a string serialises");
        let _ = writeln!(out, "export const {} = announcing(user[{name}], {name});", class.class_name);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::StoredModule;

    fn layout() -> Layout {
        Layout {
            config_dir: "/data/workers/config".into(),
            socket_dir: "/data/workers/run".into(),
            bindings_socket: "/data/workers/run/bindings.sock".into(),
            secret: "s".into(),
            disks_dir: "/data/workers/disks".into(),
            clustered: false,
            max_compatibility_date: Some("2026-04-24".into()),
        }
    }

    fn script(bindings: Vec<Binding>, classes: Vec<HostedClass>) -> ServedScript {
        ServedScript {
            id: "0123456789abcdef0123456789abcdef".into(),
            account_id: "acct".into(),
            name: "chat".into(),
            version_id: "v".into(),
            version_created_on: "2026-01-01T00:00:00.000Z".into(),
            version: StoredVersion {
                format: 1,
                main_module: Some("index.js".into()),
                body_part: None,
                modules: vec![StoredModule {
                    name: "index.js".into(),
                    kind: ModuleKind::EsModule,
                    file: "0".into(),
                    size: 1,
                }],
                compatibility_date: Some("2026-12-01".into()),
                compatibility_flags: vec!["nodejs_compat".into()],
                bindings,
                usage_model: "standard".into(),
                etag: "e".into(),
                has_assets: false,
            },
            modules_dir: "/data/workers/scripts/0123/v".into(),
            secrets: vec![("API_KEY".into(), "sh\"h".into())],
            classes,
        }
    }

    #[test]
    fn quoting_and_paths() {
        assert_eq!(quote("a\"b\\c\nd\u{1}é"), "\"a\\\"b\\\\c\\nd\\x01é\"");
        assert_eq!(
            relative(Path::new("/data/workers/config"), Path::new("/data/workers/scripts/x/0")),
            PathBuf::from("../scripts/x/0")
        );
    }

    #[test]
    fn a_script_with_every_binding() {
        let bindings = vec![
            Binding::PlainText { name: "GREETING".into(), text: "hi \"there\"".into() },
            Binding::D1 { name: "DB".into(), id: "db-uuid".into() },
            Binding::R2Bucket { name: "FILES".into(), bucket_name: "files".into() },
            Binding::DurableObjectNamespace { name: "ROOMS".into(), class_name: "Room".into(), script_name: None },
        ];
        let classes = vec![HostedClass {
            class_name: "Room".into(),
            unique_key: "chat-Room".into(),
            namespace_id: "n".into(),
            use_sqlite: true,
        }];
        let config = render(&layout(), &[script(bindings, classes)], Purpose::Serve);
        let text = &config.text;
        assert!(text.contains("compatibilityDate = \"2026-04-24\""), "dates past workerd's are lowered:\n{text}");
        assert!(text.contains("(name = \"GREETING\", text = \"hi \\\"there\\\"\")"), "{text}");
        assert!(text.contains("embed \"../scripts/0123/v/0\""), "{text}");
        assert!(text.contains("(name = \"x-kura-d1-database\", value = \"db-uuid\")"), "{text}");
        assert!(text.contains("r2Bucket = \"r2-acct-files\""), "{text}");
        assert!(text.contains("uniqueKey = \"chat-Room\", enableSql = true"), "{text}");
        assert!(text.contains("localDisk = \"disk-0123456789abcdef0123456789abcdef\""), "{text}");
        assert!(!text.contains("sh\\\"h"), "secrets stay out of the file");
        assert_eq!(config.env, [("KURA_SECRET_0_0".to_owned(), "sh\"h".to_owned())]);
        assert!(
            config
                .generated
                .iter()
                .any(|(_, js)| js.contains("export const Room = announcing(user[\"Room\"], \"Room\")"))
        );
    }

    #[test]
    fn on_a_clusters_node_stubs_call_through_kura_and_a_door_reaches_the_class() {
        let bindings = vec![Binding::DurableObjectNamespace {
            name: "ROOMS".into(),
            class_name: "Room".into(),
            script_name: None,
        }];
        let classes = vec![HostedClass {
            class_name: "Room".into(),
            unique_key: "chat-Room".into(),
            namespace_id: "n1".into(),
            use_sqlite: true,
        }];
        let one = script(bindings.clone(), classes.clone());
        let alone = render(&layout(), std::slice::from_ref(&one), Purpose::Serve);
        assert!(alone.text.contains("(name = \"ROOMS\", durableObjectNamespace = (className = \"Room\""));
        assert!(!alone.text.contains("extensions") && !alone.text.contains("door-"), "{}", alone.text);

        let clustered = Layout { clustered: true, ..layout() };
        let config = render(&clustered, &[one], Purpose::Serve);
        let text = &config.text;
        assert!(text.contains("(name = \"ROOMS\", wrapped = (moduleName = \"kura:objects-stub\""), "{text}");
        assert!(text.contains("(name = \"namespace\", durableObjectNamespace = (className = \"Room\""), "{text}");
        assert!(text.contains("(name = \"x-kura-do-namespace\", value = \"n1\")"), "{text}");
        assert!(text.contains("extensions = [(modules = [(name = \"kura:objects-stub\""), "{text}");
        assert!(text.contains("internal = true"), "{text}");
        let door = "door-0123456789abcdef0123456789abcdef";
        assert!(text.contains(&format!("(name = \"{door}\", worker = ")), "{text}");
        assert!(config.sockets.iter().any(|(key, _)| key == door), "{:?}", config.sockets);
        let generated: Vec<&str> = config.generated.iter().map(|(name, _)| name.as_str()).collect();
        assert!(generated.contains(&"kura-objects-stub.js") && generated.contains(&"kura-objects-door.js"));
        // A check of a candidate runs what will serve: the stub module runs in its isolate.
        let check = render(&clustered, &[script(bindings, classes)], Purpose::Check);
        assert!(check.text.contains("kura:objects-stub") && check.text.contains(door), "{}", check.text);
        assert!(check.text.contains("inMemory = void") && !check.text.contains("bindings.sock"), "{}", check.text);
    }

    #[test]
    fn a_check_connects_nothing_and_stores_in_memory() {
        let classes = vec![HostedClass {
            class_name: "Room".into(),
            unique_key: "chat-Room".into(),
            namespace_id: "n".into(),
            use_sqlite: true,
        }];
        let config = render(&layout(), &[script(vec![], classes)], Purpose::Check);
        assert!(config.text.contains("inMemory = void") && !config.text.contains("bindings.sock"), "{}", config.text);
        assert!(!config.text.contains("tails"));
    }
}
