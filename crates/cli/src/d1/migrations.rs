//! `kura d1 migrations create|list|apply`, with wrangler's files, tracking table and atomicity:
//! each migration and the row recording it run as one request, so a failing migration leaves
//! nothing behind and the ones before it stay applied.

use anyhow::{Context, bail};
use clap::Subcommand;

use kura_d1::migrations::{self, Migration};

use super::Location;
use super::backend::Backend;
use crate::config::Target;
use crate::output::table;

#[derive(Subcommand)]
pub enum MigrationsCommand {
    /// Create a new, empty migration file.
    Create {
        /// The database name, or its binding in the configuration.
        name: String,
        /// What the migration does (becomes part of the file name).
        message: String,
        #[command(flatten)]
        at: Location,
    },
    /// List migrations not yet applied.
    List {
        /// The database name, or its binding in the configuration.
        name: String,
        #[command(flatten)]
        at: Location,
    },
    /// Apply every migration not yet applied, in order.
    Apply {
        /// The database name, or its binding in the configuration.
        name: String,
        #[command(flatten)]
        at: Location,
    },
}

pub async fn run(command: MigrationsCommand) -> anyhow::Result<()> {
    match command {
        MigrationsCommand::Create { name, message, at } => {
            let (dir, _) = at.target(&name)?.migrations()?;
            let path = migrations::create(&dir, &message)
                .with_context(|| format!("cannot create a migration in {}", dir.display()))?;
            println!("✅ Successfully created Migration '{}'!", path.file_name().unwrap_or_default().to_string_lossy());
            println!("The migration is available for editing here:\n{}", path.display());
        }
        MigrationsCommand::List { name, at } => {
            let target = at.target(&name)?;
            let backend = at.backend().await?;
            let pending = pending(&backend, &target).await;
            backend.close().await;
            let (pending, _, _) = pending?;
            if pending.is_empty() {
                println!("✅ No migrations to apply!");
            } else {
                println!("Migrations to be applied:");
                println!("{}", table(&["Name"], pending.iter().map(|m| vec![m.name.clone()]).collect()));
            }
        }
        MigrationsCommand::Apply { name, at } => {
            let target = at.target(&name)?;
            let backend = at.backend().await?;
            let outcome = apply(&backend, &target).await;
            backend.close().await;
            outcome?;
        }
    }
    Ok(())
}

/// The migrations not yet applied, with the database id and tracking table.
async fn pending(backend: &Backend, target: &Target) -> anyhow::Result<(Vec<Migration>, String, String)> {
    let (dir, table_name) = target.migrations()?;
    if !dir.is_dir() {
        bail!("No migrations folder found at {}. Create one with `kura d1 migrations create`.", dir.display());
    }
    let uuid = backend.resolve(target).await?;
    backend.query(&uuid, &migrations::create_table_sql(&table_name)).await?;
    let applied = backend.query(&uuid, &migrations::applied_sql(&table_name)).await?;
    let applied: Vec<String> = applied
        .first()
        .and_then(|r| r["results"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|row| row["name"].as_str().map(str::to_owned))
        .collect();
    let all = migrations::list(&dir).with_context(|| format!("cannot read {}", dir.display()))?;
    Ok((migrations::unapplied(all, &applied), uuid, table_name))
}

async fn apply(backend: &Backend, target: &Target) -> anyhow::Result<()> {
    let (pending, uuid, table_name) = pending(backend, target).await?;
    if pending.is_empty() {
        println!("✅ No migrations to apply!");
        return Ok(());
    }
    println!("Migrations to be applied:");
    println!("{}", table(&["name"], pending.iter().map(|m| vec![m.name.clone()]).collect()));
    let mut statuses: Vec<(String, &str)> = pending.iter().map(|m| (m.name.clone(), "🕒")).collect();
    for (i, migration) in pending.iter().enumerate() {
        let contents = std::fs::read_to_string(&migration.path)
            .with_context(|| format!("cannot read {}", migration.path.display()))?;
        let outcome = backend.query(&uuid, &migrations::apply_sql(&contents, &table_name, &migration.name)).await;
        statuses[i].1 = if outcome.is_ok() { "✅" } else { "❌" };
        let rows = statuses.iter().map(|(n, s)| vec![n.clone(), s.to_string()]).collect();
        println!("{}", table(&["name", "status"], rows));
        if let Err(e) = outcome {
            bail!("Migration {} failed with the following errors: {}", migration.name, crate::output::error_chain(&e));
        }
    }
    Ok(())
}
