//! `kura do …`: Durable Object namespaces and their objects (list with names and sizes, SQL on
//! one object, export, queries across all of them), locally (the default) or with `--remote`.
//! A namespace is named as created, or by a binding of the wrangler configuration, from which
//! it is created on first use.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Subcommand;
use reqwest::Method;
use serde_json::{Value as Json, json};

use kura_catalog::NewDoNamespace;
use kura_d1::wire::JsonParams;
use kura_server::render::{cursor_json, do_object_json, fan_out_json, namespace_json};

use crate::local::Local;
use crate::location::Location;
use crate::output::{cell, objects_table, print_json, table};
use kura_client::ApiClient;
use kura_client::v4::Envelope;

#[derive(Subcommand)]
pub enum DoCommand {
    /// Create or list namespaces.
    #[command(subcommand)]
    Namespace(NamespaceCommand),
    /// List a namespace's objects, with their names and sizes.
    List {
        /// The namespace (name, id, or binding in the configuration).
        namespace: String,
        /// Most objects to list.
        #[arg(long, default_value_t = 1000)]
        limit: u64,
        /// Continue after this object id (the previous page's cursor).
        #[arg(long)]
        cursor: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Run SQL on one object, as one request (all or nothing).
    Sql {
        /// The namespace (name, id, or binding in the configuration).
        namespace: String,
        /// The object: its name, or its id (64 hex digits).
        object: String,
        /// The SQL (several statements allowed; the last one's rows are shown).
        sql: String,
        /// A bound parameter, as JSON (`--param 42 --param '"text"'`); repeatable.
        #[arg(long = "param", allow_hyphen_values = true)]
        params: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Export one object's storage as SQL (tables, rows, indexes and its KV entries).
    Export {
        /// The namespace (name, id, or binding in the configuration).
        namespace: String,
        /// The object: its name, or its id.
        object: String,
        /// The file to write (default: standard output).
        #[arg(long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        at: Location,
    },
    /// Run one read-only statement on every object (or those given): rows tagged with each
    /// object's id and name. Not one snapshot: each object answers at its own moment.
    QueryAll {
        /// The namespace (name, id, or binding in the configuration).
        namespace: String,
        /// The read-only SQL.
        sql: String,
        /// Only this object (name or id); repeatable.
        #[arg(long = "object")]
        objects: Vec<String>,
        /// A bound parameter, as JSON; repeatable.
        #[arg(long = "param", allow_hyphen_values = true)]
        params: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
}

#[derive(Subcommand)]
pub enum NamespaceCommand {
    /// Create a namespace (class and script default from the configuration's binding).
    Create {
        /// The namespace's name (a binding of the configuration gives class and script).
        name: String,
        /// The class; defaults to the binding's, or to the name.
        #[arg(long)]
        class: Option<String>,
        /// The Worker; defaults to the configuration's.
        #[arg(long)]
        script: Option<String>,
        /// The key object ids derive from (default `<script>-<class>`, as Miniflare derives it,
        /// so names give the ids `wrangler dev` gives them).
        #[arg(long)]
        unique_key: Option<String>,
        /// Where alarms are POSTed.
        #[arg(long)]
        alarm_url: Option<String>,
        #[command(flatten)]
        at: Location,
    },
    /// List namespaces.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
}

/// Where commands run.
enum Backend {
    Local(Box<Local>),
    Remote(ApiClient),
}

const NAMESPACES: &str = "/workers/durable_objects/namespaces";

fn segment(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>().replace('+', "%20")
}

impl Backend {
    async fn open(at: &Location) -> anyhow::Result<Backend> {
        Ok(if at.remote {
            Backend::Remote(ApiClient::from_env().await?)
        } else {
            Backend::Local(Box::new(Local::open(&at.data)?))
        })
    }

    fn place(&self) -> &'static str {
        if matches!(self, Backend::Remote(_)) { "remote" } else { "local" }
    }

    async fn create_namespace(&self, new: NewDoNamespace) -> anyhow::Result<Json> {
        match self {
            Backend::Local(l) => Ok(namespace_json(&l.node.catalog().create_do_namespace(&l.account, &new)?)),
            Backend::Remote(api) => {
                let body = json!({
                    "name": new.name, "class": new.class_name, "script": new.script,
                    "unique_key": new.unique_key, "alarm_url": new.alarm_url,
                });
                api.call(Method::POST, &api.account_path(NAMESPACES), Some(&body)).await.map_err(Into::into)
            }
        }
    }

    async fn namespaces(&self) -> anyhow::Result<Vec<Json>> {
        match self {
            Backend::Local(l) => {
                Ok(l.node.catalog().list_do_namespaces(&l.account)?.iter().map(namespace_json).collect())
            }
            Backend::Remote(api) => {
                let list = api.call(Method::GET, &api.account_path(NAMESPACES), None).await?;
                Ok(list.as_array().cloned().unwrap_or_default())
            }
        }
    }

    /// The namespace whose id or name is `name`, if there is one.
    async fn find_namespace(&self, name: &str) -> anyhow::Result<Option<Json>> {
        Ok(match self {
            Backend::Local(l) => l.node.catalog().do_namespace(&l.account, name)?.as_ref().map(namespace_json),
            Backend::Remote(_) => self
                .namespaces()
                .await?
                .into_iter()
                .find(|ns| ns["id"].as_str() == Some(name) || ns["name"].as_str() == Some(name)),
        })
    }

    /// The namespace `name` names, created from the configuration's binding (by its name or
    /// its class) if it is one and does not exist yet.
    async fn namespace(&self, name: &str, at: &Location) -> anyhow::Result<Json> {
        if let Some(ns) = self.find_namespace(name).await? {
            return Ok(ns);
        }
        let config = at.wrangler_config()?;
        let Some(spec) = config.as_ref().map(|c| c.durable_object(name)).transpose()?.flatten() else {
            bail!("Durable Object namespace '{name}' not found: create it with `kura do namespace create {name}`");
        };
        if let Some(ns) = self.find_namespace(&spec.name).await? {
            return Ok(ns);
        }
        // The class may already have a namespace: a deployed Worker's (`<script>_<class>`).
        let same_class = self.namespaces().await?.into_iter().find(|ns| {
            ns["script"].as_str() == Some(spec.script.as_str()) && ns["class"].as_str() == Some(spec.class.as_str())
        });
        if let Some(ns) = same_class {
            return Ok(ns);
        }
        eprintln!(
            "Creating namespace {} (class {}, script {}) from the configuration",
            spec.name, spec.class, spec.script
        );
        self.create_namespace(NewDoNamespace {
            name: spec.name,
            class_name: Some(spec.class),
            script: Some(spec.script),
            unique_key: None,
            alarm_url: None,
        })
        .await
    }

    async fn objects(&self, ns: &Json, cursor: &str, limit: u64) -> anyhow::Result<(Vec<Json>, Option<String>)> {
        match self {
            Backend::Local(l) => {
                let engine_ns = engine_namespace(ns)?;
                let page = l.node.durable_objects().list(&engine_ns, cursor, limit + 1).await?;
                let next = (page.len() as u64 > limit).then(|| page[limit as usize - 1].entry.id.clone());
                Ok((page.iter().take(limit as usize).map(do_object_json).collect(), next))
            }
            Backend::Remote(api) => {
                // The envelope's result_info carries the cursor, so this reads the whole body.
                let path = api.account_path(&format!(
                    "{NAMESPACES}/{}/objects?limit={limit}&cursor={}",
                    id_of(ns),
                    segment(cursor)
                ));
                let response = api.send(api.request(Method::GET, &path), "Listing the objects").await?;
                let body: Envelope<Vec<Json>> = response.json().await.context("Listing the objects")?;
                let next = body.result_info.as_ref().and_then(|i| i.next_cursor()).map(str::to_owned);
                Ok((body.result.unwrap_or_default(), next))
            }
        }
    }

    async fn sql(&self, ns: &Json, object: &str, sql: String, params: JsonParams) -> anyhow::Result<Json> {
        match self {
            Backend::Local(l) => {
                let engine_ns = engine_namespace(ns)?;
                let id = object_id(&engine_ns, object)?;
                let cursor =
                    l.node.durable_objects().run(&engine_ns, &id, move |storage| storage.exec(&sql, params.0)).await?;
                Ok(cursor_json(&cursor))
            }
            Backend::Remote(api) => {
                let path = api.account_path(&format!("{NAMESPACES}/{}/objects/{}/query", id_of(ns), segment(object)));
                let body = json!({ "sql": sql, "params": params_json(&params) });
                let results = api.call(Method::POST, &path, Some(&body)).await?;
                Ok(results.get(0).cloned().unwrap_or(Json::Null))
            }
        }
    }

    async fn export(&self, ns: &Json, object: &str) -> anyhow::Result<String> {
        match self {
            Backend::Local(l) => {
                let engine_ns = engine_namespace(ns)?;
                let id = object_id(&engine_ns, object)?;
                if !l.node.durable_objects().exists(&engine_ns, &id).await? {
                    bail!("The object has stored nothing yet");
                }
                Ok(l.node.durable_objects().export(&engine_ns, &id).await?)
            }
            Backend::Remote(api) => {
                let path = api.account_path(&format!("{NAMESPACES}/{}/objects/{}/export", id_of(ns), segment(object)));
                let response = api.send(api.request(Method::GET, &path), "Exporting the object").await?;
                Ok(response.text().await.context("Exporting the object")?)
            }
        }
    }

    async fn query_all(
        &self,
        ns: &Json,
        sql: String,
        params: JsonParams,
        objects: Vec<String>,
    ) -> anyhow::Result<Json> {
        match self {
            Backend::Local(l) => {
                let engine_ns = engine_namespace(ns)?;
                let chosen = if objects.is_empty() {
                    None
                } else {
                    Some(objects.iter().map(|o| object_id(&engine_ns, o)).collect::<anyhow::Result<Vec<_>>>()?)
                };
                let rows = l.node.durable_objects().fan_out(&engine_ns, chosen, &sql, params.0).await?;
                Ok(fan_out_json(&rows))
            }
            Backend::Remote(api) => {
                let path = api.account_path(&format!("{NAMESPACES}/{}/fan_out", id_of(ns)));
                let mut body = json!({ "sql": sql, "params": params_json(&params) });
                if !objects.is_empty() {
                    body["objects"] = json!(objects);
                }
                api.call(Method::POST, &path, Some(&body)).await.map_err(Into::into)
            }
        }
    }

    async fn close(self) {
        if let Backend::Local(l) = self {
            l.node.durable_objects().shutdown().await;
        }
    }
}

fn id_of(ns: &Json) -> &str {
    ns["id"].as_str().unwrap_or_default()
}

/// The engine's view of a namespace the API described.
fn engine_namespace(ns: &Json) -> anyhow::Result<kura_do::Namespace> {
    let engine = kura_do::Namespace::new(id_of(ns), ns["unique_key"].as_str().unwrap_or_default())?;
    Ok(if ns["host"] == kura_catalog::HOST_WORKERD { engine.hosted_elsewhere() } else { engine })
}

fn object_id(ns: &kura_do::Namespace, object: &str) -> anyhow::Result<kura_do::ObjectId> {
    if object.is_empty() {
        bail!("An object needs a name or an id");
    }
    Ok(ns.id_from_name_or_string(object)?)
}

/// `--param` values, each JSON (a bare word that is not JSON is taken as text).
fn parse_params(params: &[String]) -> anyhow::Result<JsonParams> {
    let values: Vec<Json> =
        params.iter().map(|p| serde_json::from_str(p).unwrap_or_else(|_| Json::String(p.clone()))).collect();
    serde_json::from_value(Json::Array(values)).context("a --param is not a value SQL can bind")
}

fn params_json(params: &JsonParams) -> Json {
    Json::Array(
        params.0.iter().map(|v| serde_json::to_value(kura_d1::wire::JsonValue(v)).unwrap_or(Json::Null)).collect(),
    )
}

/// `{columns, rows}` as a table.
fn rows_table(columns: &Json, rows: &Json) -> String {
    let header: Vec<&str> = columns.as_array().into_iter().flatten().filter_map(Json::as_str).collect();
    let body: Vec<Vec<String>> = rows
        .as_array()
        .into_iter()
        .flatten()
        .map(|row| row.as_array().into_iter().flatten().map(cell).collect())
        .collect();
    table(&header, body)
}

pub async fn run(command: DoCommand) -> anyhow::Result<()> {
    match command {
        DoCommand::Namespace(NamespaceCommand::Create { name, class, script, unique_key, alarm_url, at }) => {
            // A binding of the configuration gives class and script, and must be SQLite-backed.
            let spec = match at.wrangler_config()? {
                Some(config) if class.is_none() => config.durable_object(&name)?,
                Some(config) => config.durable_object(&name).ok().flatten(),
                None => None,
            };
            let new = NewDoNamespace {
                class_name: class.or_else(|| spec.as_ref().map(|s| s.class.clone())),
                script: script.or_else(|| spec.as_ref().map(|s| s.script.clone())),
                // Named by its class, a binding still gives the namespace the binding's name.
                name: spec.as_ref().map_or(name, |s| s.name.clone()),
                unique_key,
                alarm_url,
            };
            let backend = Backend::open(&at).await?;
            let outcome = backend.create_namespace(new).await;
            let place = backend.place();
            backend.close().await;
            let ns = outcome?;
            println!(
                "✅ Created {place} namespace {} ({}): class {}, unique key {}",
                cell(&ns["name"]),
                cell(&ns["id"]),
                cell(&ns["class"]),
                cell(&ns["unique_key"])
            );
        }
        DoCommand::Namespace(NamespaceCommand::List { json, at }) => {
            let backend = Backend::open(&at).await?;
            let outcome = backend.namespaces().await;
            backend.close().await;
            let namespaces = outcome?;
            if json {
                print_json(&namespaces);
            } else if namespaces.is_empty() {
                println!("No namespaces.");
            } else {
                println!("{}", objects_table(&namespaces));
            }
        }
        DoCommand::List { namespace, limit, cursor, json, at } => {
            if !(1..=10_000).contains(&limit) {
                bail!("--limit must be between 1 and 10000");
            }
            let backend = Backend::open(&at).await?;
            let outcome = async {
                let ns = backend.namespace(&namespace, &at).await?;
                backend.objects(&ns, cursor.as_deref().unwrap_or_default(), limit).await
            }
            .await;
            backend.close().await;
            let (objects, next) = outcome?;
            if json {
                print_json(&json!({ "objects": objects, "cursor": next }));
            } else {
                if objects.is_empty() {
                    println!("No objects.");
                } else {
                    println!("{}", objects_table(&objects));
                }
                if let Some(next) = next {
                    println!("More objects follow: --cursor {next}");
                }
            }
        }
        DoCommand::Sql { namespace, object, sql, params, json, at } => {
            if object.is_empty() {
                bail!("An object needs a name or an id");
            }
            let params = parse_params(&params)?;
            let backend = Backend::open(&at).await?;
            let outcome = async {
                let ns = backend.namespace(&namespace, &at).await?;
                eprintln!("🌀 Executing on {} object {object} of {}:", backend.place(), cell(&ns["name"]));
                backend.sql(&ns, &object, sql, params).await
            }
            .await;
            backend.close().await;
            let result = outcome?;
            if json {
                print_json(&result);
            } else {
                let meta = &result["meta"];
                println!("🚣 {} rows read, {} rows written", meta["rows_read"], meta["rows_written"]);
                if result["rows"].as_array().is_some_and(|r| !r.is_empty()) {
                    println!("{}", rows_table(&result["columns"], &result["rows"]));
                }
            }
        }
        DoCommand::Export { namespace, object, output, at } => {
            if object.is_empty() {
                bail!("An object needs a name or an id");
            }
            if output.as_ref().is_some_and(|o| o.is_dir()) {
                bail!("--output must be a file, not a directory");
            }
            let backend = Backend::open(&at).await?;
            let outcome = async {
                let ns = backend.namespace(&namespace, &at).await?;
                backend.export(&ns, &object).await
            }
            .await;
            backend.close().await;
            let dump = outcome?;
            match output {
                Some(path) => {
                    std::fs::write(&path, dump).with_context(|| format!("cannot write {}", path.display()))?;
                    eprintln!("🌀 Exported to {} successfully!", path.display());
                }
                None => print!("{dump}"),
            }
        }
        DoCommand::QueryAll { namespace, sql, objects, params, json, at } => {
            let params = parse_params(&params)?;
            let backend = Backend::open(&at).await?;
            let outcome = async {
                let ns = backend.namespace(&namespace, &at).await?;
                backend.query_all(&ns, sql, params, objects).await
            }
            .await;
            backend.close().await;
            let answer = outcome?;
            let failed =
                answer["objects"].as_array().into_iter().flatten().filter(|o| o.get("error").is_some()).count();
            if json {
                print_json(&answer);
                if failed > 0 {
                    bail!("{failed} object(s) failed; their errors are in the answer");
                }
                return Ok(());
            }
            if answer["objects"].as_array().is_none_or(|o| o.is_empty()) {
                println!("No objects.");
                return Ok(());
            }
            eprintln!("(not one snapshot: each object answered at its own moment)");
            for object in answer["objects"].as_array().into_iter().flatten() {
                let who = match object["name"].as_str() {
                    Some(name) => format!("{name} ({})", cell(&object["id"])),
                    None => cell(&object["id"]),
                };
                if let Some(error) = object["error"].as_str() {
                    println!("✘ {who}: {error}");
                } else {
                    println!("● {who}");
                    if object["rows"].as_array().is_some_and(|r| !r.is_empty()) {
                        println!("{}", rows_table(&object["columns"], &object["rows"]));
                    }
                }
            }
            if failed > 0 {
                bail!("{failed} object(s) failed; their errors are above");
            }
        }
    }
    Ok(())
}
