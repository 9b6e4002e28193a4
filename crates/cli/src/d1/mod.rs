//! `kura d1 …`: create, list, inspect, delete and query D1 databases, and apply migrations,
//! locally (the default) or with `--remote`.

mod backend;
mod migrations;
mod time_travel;

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Subcommand;
use serde_json::Value as Json;

use kura_d1::CreateOptions;

use crate::config::Target;
pub use crate::location::Location;
use crate::output::{cell, objects_table, print_json, table};
use backend::Backend;

impl Location {
    async fn backend(&self) -> anyhow::Result<Backend> {
        Backend::open(self.remote, &self.data).await
    }

    fn target(&self, name: &str) -> anyhow::Result<Target> {
        Ok(Target::resolve(name, self.wrangler_config()?))
    }
}

#[derive(Subcommand)]
pub enum D1Command {
    /// Create a database.
    Create {
        /// The database name.
        name: String,
        /// Location hint (wnam, enam, weur, eeur, apac, oc); recorded only.
        #[arg(long)]
        location: Option<String>,
        /// Jurisdiction (eu, fedramp); recorded only.
        #[arg(long)]
        jurisdiction: Option<String>,
        #[command(flatten)]
        at: Location,
    },
    /// List databases.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Show a database's details and its last 24 hours of usage.
    Info {
        /// The database name, or its binding in the configuration.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Delete a database and all its data.
    Delete {
        /// The database name, or its binding in the configuration.
        name: String,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y', alias = "skip-confirmation")]
        yes: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Run SQL on a database, atomically.
    Execute {
        /// The database name, or its binding in the configuration.
        name: String,
        /// The SQL to run (several statements allowed).
        #[arg(long, conflicts_with = "file")]
        command: Option<String>,
        /// A file of SQL to run.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Print the results as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Export a database as a .sql file (D1's dump format).
    Export {
        /// The database name, or its binding in the configuration.
        name: String,
        /// The file to write.
        #[arg(long)]
        output: PathBuf,
        /// Only this table (repeatable).
        #[arg(long = "table")]
        tables: Vec<String>,
        /// Only the data, no CREATE statements.
        #[arg(long, conflicts_with = "no_data")]
        no_schema: bool,
        /// Only the schema, no rows.
        #[arg(long)]
        no_data: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Create, list and apply migrations (as wrangler does).
    #[command(subcommand)]
    Migrations(migrations::MigrationsCommand),
    /// Bookmarks and point-in-time restore.
    #[command(subcommand, name = "time-travel")]
    TimeTravel(time_travel::TimeTravelCommand),
}

pub async fn run(command: D1Command) -> anyhow::Result<()> {
    match command {
        D1Command::Create { name, location, jurisdiction, at } => {
            let backend = at.backend().await?;
            let created = backend.create(&name, CreateOptions { primary_location_hint: location, jurisdiction }).await;
            backend.close().await;
            let created = created?;
            let uuid = created["uuid"].as_str().unwrap_or_default();
            println!("✅ Successfully created DB '{name}'");
            println!();
            println!("Add it to your wrangler.toml:");
            println!();
            println!("[[d1_databases]]");
            println!("binding = \"DB\"");
            println!("database_name = \"{name}\"");
            println!("database_id = \"{uuid}\"");
        }
        D1Command::List { json, at } => {
            let backend = at.backend().await?;
            let listed = backend.list().await;
            backend.close().await;
            let listed = listed?;
            if json {
                print_json(&listed);
            } else if listed.is_empty() {
                println!("No databases.");
            } else {
                println!("{}", objects_table(&listed));
            }
        }
        D1Command::Info { name, json, at } => {
            let target = at.target(&name)?;
            let backend = at.backend().await?;
            let info = info(&backend, &target).await;
            backend.close().await;
            let info = info?;
            if json {
                print_json(&info);
            } else {
                let rows = info.as_object().into_iter().flatten().map(|(k, v)| vec![k.clone(), cell(v)]).collect();
                println!("{}", table(&["", &name], rows));
            }
        }
        D1Command::Delete { name, yes, at } => {
            let target = at.target(&name)?;
            let backend = at.backend().await?;
            let outcome = delete(&backend, &target, yes).await;
            backend.close().await;
            outcome?;
        }
        D1Command::Execute { name, command, file, json, at } => {
            let target = at.target(&name)?;
            match (command, file) {
                (Some(sql), None) => {
                    let backend = at.backend().await?;
                    let outcome = execute(&backend, &target, &sql).await;
                    backend.close().await;
                    print_results(&outcome?, json);
                }
                (None, Some(path)) => {
                    let mut head = [0u8; 16];
                    let mut opened =
                        std::fs::File::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
                    let n = std::io::Read::read(&mut opened, &mut head)?;
                    if head[..n].starts_with(b"SQLite format 3") {
                        bail!("that file is an SQLite database, not SQL text; export it to SQL first");
                    }
                    let backend = at.backend().await?;
                    let outcome = import(&backend, &target, &path).await;
                    backend.close().await;
                    print_import(&outcome?, json);
                }
                _ => bail!("Missing required option --command or --file."),
            }
        }
        D1Command::Export { name, output, tables, no_schema, no_data, at } => {
            if output.is_dir() {
                bail!("--output must be a file, and {} is a directory", output.display());
            }
            let target = at.target(&name)?;
            let backend = at.backend().await?;
            let options = kura_d1::dump::DumpOptions { no_schema, no_data, tables, ..Default::default() };
            let outcome = export(&backend, &target, options, &output).await;
            backend.close().await;
            outcome?;
            println!("🌀 Exported to {} successfully!", output.display());
        }
        D1Command::Migrations(command) => migrations::run(command).await?,
        D1Command::TimeTravel(command) => time_travel::run(command).await?,
    }
    Ok(())
}

async fn info(backend: &Backend, target: &Target) -> anyhow::Result<Json> {
    let uuid = backend.resolve(target).await?;
    let mut info = backend.details(&uuid).await?;
    let [read_queries, write_queries, rows_read, rows_written] = backend.usage_24h(&uuid).await?;
    if let Some(map) = info.as_object_mut() {
        map.insert("read_queries_24h".into(), read_queries.into());
        map.insert("write_queries_24h".into(), write_queries.into());
        map.insert("rows_read_24h".into(), rows_read.into());
        map.insert("rows_written_24h".into(), rows_written.into());
    }
    Ok(info)
}

pub(crate) fn confirm(question: &str) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        return Ok(true);
    }
    eprint!("{question} (y/N) ");
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

async fn delete(backend: &Backend, target: &Target, yes: bool) -> anyhow::Result<()> {
    let uuid = backend.resolve(target).await?;
    let place = if backend.is_remote() { "remote" } else { "local" };
    println!("About to delete {place} database '{}' ({uuid}).", target.name);
    println!("This action is irreversible and will permanently delete all data in the database.");
    if !yes && !confirm("Ok to proceed?")? {
        println!("Not deleting.");
        return Ok(());
    }
    backend.delete(&uuid).await?;
    println!("Deleted '{}' successfully.", target.name);
    Ok(())
}

async fn execute(backend: &Backend, target: &Target, sql: &str) -> anyhow::Result<Vec<Json>> {
    let uuid = backend.resolve(target).await?;
    let place = if backend.is_remote() { "remote" } else { "local" };
    eprintln!("🌀 Executing on {place} database {} ({uuid}):", target.name);
    backend.query(&uuid, sql).await
}

async fn import(backend: &Backend, target: &Target, file: &std::path::Path) -> anyhow::Result<Json> {
    let uuid = backend.resolve(target).await?;
    let place = if backend.is_remote() { "remote" } else { "local" };
    eprintln!("🌀 Importing {} into {place} database {} ({uuid}), in one transaction:", file.display(), target.name);
    backend.import(&uuid, file).await
}

async fn export(
    backend: &Backend,
    target: &Target,
    options: kura_d1::dump::DumpOptions,
    output: &std::path::Path,
) -> anyhow::Result<()> {
    let uuid = backend.resolve(target).await?;
    let place = if backend.is_remote() { "remote" } else { "local" };
    eprintln!("🌀 Exporting {place} database {} ({uuid}) to {}", target.name, output.display());
    backend.export(&uuid, options, output).await
}

/// Prints an import's result as wrangler does.
fn print_import(result: &Json, json: bool) {
    let meta = &result["meta"];
    let (read, written) = (meta["rows_read"].as_u64().unwrap_or(0), meta["rows_written"].as_u64().unwrap_or(0));
    if json {
        print_json(&serde_json::json!([{
            "results": [{
                "Total queries executed": result["num_queries"],
                "Rows read": read,
                "Rows written": written,
                "Database size (MB)": format!("{:.2}", meta["size_after"].as_f64().unwrap_or(0.0) / 1e6),
            }],
            "success": true,
            "finalBookmark": result["final_bookmark"],
            "meta": meta,
        }]));
        return;
    }
    println!(
        "🚣 Executed {} queries in {:.2}ms ({read} rows read, {written} rows written)",
        result["num_queries"],
        meta["duration"].as_f64().unwrap_or(0.0)
    );
    println!("   Database is currently at bookmark {}.", result["final_bookmark"].as_str().unwrap_or_default());
}

fn print_results(results: &[Json], json: bool) {
    if json {
        print_json(results);
        return;
    }
    let total: f64 = results.iter().map(|r| r["meta"]["duration"].as_f64().unwrap_or(0.0)).sum();
    let noun = if results.len() == 1 { "command" } else { "commands" };
    println!("🚣 Executed {} {noun} in {total:.2}ms", results.len());
    for result in results {
        if let Some(rows) = result["results"].as_array().filter(|r| !r.is_empty()) {
            println!("{}", objects_table(rows));
        }
    }
}
