//! `kura workers …`: the Workers deployed to kura (with `wrangler deploy`) — list them, delete
//! one, read its logs — locally (the default, on the data directory without a server) or with
//! `--remote`.

use anyhow::bail;
use clap::Subcommand;
use reqwest::Method;
use serde_json::Value as Json;

use kura_server::render::script_json;
use kura_workers::{StoredVersion, Workers, WorkersSettings};

use crate::local::Local;
use crate::location::Location;
use crate::output::{cell, print_json, table};
use kura_client::ApiClient;

#[derive(Subcommand)]
pub enum WorkersCommand {
    /// List the deployed Workers.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Delete a Worker: it stops serving; its Durable Objects' data stays.
    Delete {
        /// The Worker's name.
        name: String,
        #[command(flatten)]
        at: Location,
    },
    /// Run a Worker's `scheduled` handler now, as a Cron Trigger would (needs the server: --remote).
    Trigger {
        /// The Worker's name.
        name: String,
        /// The handler's `controller.cron`.
        #[arg(long)]
        cron: String,
        /// The handler's `controller.scheduledTime`, Unix milliseconds (default: this minute).
        #[arg(long)]
        time: Option<i64>,
        #[command(flatten)]
        at: Location,
    },
    /// Show a Worker's recent console output and uncaught exceptions, oldest first.
    Logs {
        /// The Worker's name.
        name: String,
        /// Print the events as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
}

fn local_workers(local: &Local) -> anyhow::Result<Workers> {
    let dir = local.node.dir();
    Ok(Workers::open(
        dir.join("workers"),
        dir.join("do"),
        std::sync::Arc::clone(local.node.catalog()),
        WorkersSettings { offline: true, ..Default::default() },
    )?)
}

fn segment(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>().replace('+', "%20")
}

pub async fn run(command: WorkersCommand) -> anyhow::Result<()> {
    match command {
        WorkersCommand::List { json, at } => {
            let scripts = if at.remote {
                let api = ApiClient::from_env().await?;
                api.call(Method::GET, &api.account_path("/workers/scripts"), None)
                    .await?
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            } else {
                let local = Local::open(&at.data)?;
                let catalog = local.node.catalog();
                let mut out = Vec::new();
                for script in catalog.list_worker_scripts(&local.account)? {
                    let version = match &script.deployed_version {
                        Some(id) => catalog.worker_version(&script.id, id)?,
                        None => None,
                    };
                    let stored = version.map(|v| StoredVersion::from_json(&v.metadata)).transpose()?;
                    out.push(script_json(&script, stored.as_ref()));
                }
                out
            };
            if json {
                print_json(&scripts);
            } else if scripts.is_empty() {
                println!(
                    "No Workers are deployed. Deploy one with `wrangler deploy` (CLOUDFLARE_API_BASE_URL pointing at kura)."
                );
            } else {
                let rows = scripts
                    .iter()
                    .map(|s| {
                        ["id", "modified_on", "compatibility_date", "migration_tag"]
                            .iter()
                            .map(|k| if s[*k].is_null() { String::new() } else { cell(&s[*k]) })
                            .collect()
                    })
                    .collect();
                println!("{}", table(&["name", "modified", "compatibility date", "migration tag"], rows));
            }
        }
        WorkersCommand::Delete { name, at } => {
            if at.remote {
                let api = ApiClient::from_env().await?;
                api.call(Method::DELETE, &api.account_path(&format!("/workers/scripts/{}", segment(&name))), None)
                    .await?;
            } else {
                let local = Local::open(&at.data)?;
                if !local_workers(&local)?.delete(&local.account, &name).await? {
                    bail!("This Worker does not exist on your account: '{name}'");
                }
            }
            println!("Deleted the Worker '{name}'.");
        }
        WorkersCommand::Trigger { name, cron, time, at } => {
            if !at.remote {
                bail!(
                    "a Worker runs only in a server's workerd: add --remote (CLOUDFLARE_API_BASE_URL pointing at kura)"
                );
            }
            let api = ApiClient::from_env().await?;
            let path = api.account_path(&format!("/workers/scripts/{}/schedules/trigger", segment(&name)));
            let mut body = serde_json::json!({ "cron": cron });
            if let Some(time) = time {
                body["scheduledTime"] = time.into();
            }
            let run = api.call(Method::POST, &path, Some(&body)).await?;
            let outcome = run["outcome"].as_str().unwrap_or("unknown");
            println!("\"{cron}\" - {outcome}{}", if run["noRetry"] == true { " (no retry)" } else { "" });
            if outcome != "ok" {
                bail!(
                    "the scheduled handler did not succeed: {outcome} (`kura workers logs {name} --remote` has its exception)"
                );
            }
        }
        WorkersCommand::Logs { name, json, at } => {
            let events: Vec<Json> = if at.remote {
                let api = ApiClient::from_env().await?;
                let path = api.account_path(&format!("/workers/scripts/{}/logs", segment(&name)));
                api.call(Method::GET, &path, None).await?.as_array().cloned().unwrap_or_default()
            } else {
                let local = Local::open(&at.data)?;
                let workers = local_workers(&local)?;
                let Some(script) = local.node.catalog().worker_script(&local.account, &name)? else {
                    bail!("This Worker does not exist on your account: '{name}'");
                };
                workers.logged(&script.id)
            };
            if json {
                print_json(&events);
            } else {
                for event in &events {
                    print_event(event);
                }
            }
        }
    }
    Ok(())
}

/// One invocation's events as `wrangler tail` prints them.
fn print_event(event: &Json) {
    let when = event["eventTimestamp"]
        .as_i64()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map(|t| t.to_string())
        .unwrap_or_default();
    let request = &event["event"]["request"];
    let threw = event["exceptions"].as_array().is_some_and(|e| !e.is_empty());
    // workerd's tail reports a scheduled run that threw as "ok", with the exception beside it.
    let outcome = match event["outcome"].as_str().unwrap_or("unknown") {
        "ok" if threw => "exception",
        outcome => outcome,
    };
    // A Cron Trigger's run, as `wrangler tail` prints it: `"*/5 * * * *" @ <time> - Ok`.
    if let Some(cron) = event["event"]["cron"].as_str() {
        let scheduled = event["event"]["scheduledTime"]
            .as_i64()
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
            .map(|t| t.to_string())
            .unwrap_or_default();
        let mut shown = outcome.chars();
        let outcome: String = shown.next().map(|c| c.to_uppercase().chain(shown).collect()).unwrap_or_default();
        println!("\"{cron}\" @ {scheduled} - {outcome}");
    } else {
        match request["url"].as_str() {
            Some(url) => println!("{} {url} - {outcome} @ {when}", request["method"].as_str().unwrap_or("GET")),
            None => println!("{outcome} @ {when}"),
        }
    }
    for line in event["logs"].as_array().into_iter().flatten() {
        println!(
            "  ({}) {}",
            line["level"].as_str().unwrap_or("log"),
            kura_workers::logs::render_message(&line["message"])
        );
    }
    for exception in event["exceptions"].as_array().into_iter().flatten() {
        println!(
            "  ✘ {}: {}",
            exception["name"].as_str().unwrap_or("Error"),
            exception["message"].as_str().unwrap_or("")
        );
    }
}
