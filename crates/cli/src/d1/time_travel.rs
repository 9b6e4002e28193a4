//! `kura d1 time-travel info|restore`: bookmarks and point-in-time restore, with wrangler's
//! options and messages.

use anyhow::bail;
use clap::Subcommand;

use super::Location;
use super::backend::Backend;
use crate::config::Target;
use crate::output::print_json;

#[derive(Subcommand)]
pub enum TimeTravelCommand {
    /// Show the current bookmark, or the bookmark for a time.
    Info {
        /// The database name, or its binding in the configuration.
        name: String,
        /// A time: ISO 8601, or Unix seconds.
        #[arg(long)]
        timestamp: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Restore the database to a bookmark or a time; the previous state stays restorable.
    Restore {
        /// The database name, or its binding in the configuration.
        name: String,
        /// The bookmark to restore.
        #[arg(long, conflicts_with = "timestamp")]
        bookmark: Option<String>,
        /// A time to restore (ISO 8601, or Unix seconds): the last commit at or before it.
        #[arg(long)]
        timestamp: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
        #[command(flatten)]
        at: Location,
    },
}

fn millis(timestamp: &str) -> anyhow::Result<i64> {
    kura_d1::parse_timestamp(timestamp).map_err(anyhow::Error::msg)
}

pub async fn run(command: TimeTravelCommand) -> anyhow::Result<()> {
    match command {
        TimeTravelCommand::Info { name, timestamp, json, at } => {
            let target = at.target(&name)?;
            let backend = at.backend().await?;
            let outcome = info(&backend, &target, timestamp.as_deref()).await;
            backend.close().await;
            let bookmark = outcome?;
            if json {
                print_json(&serde_json::json!({ "bookmark": bookmark }));
            } else {
                match timestamp {
                    Some(t) => println!("⚠️ Timestamp '{t}' corresponds with bookmark '{bookmark}'"),
                    None => println!("⚠️ The current bookmark is '{bookmark}'"),
                }
                println!(
                    "⚡️ To restore to this specific bookmark, run:\n `kura d1 time-travel restore {name} --bookmark={bookmark}`"
                );
            }
        }
        TimeTravelCommand::Restore { name, bookmark, timestamp, json, yes, at } => {
            if bookmark.is_none() && timestamp.is_none() {
                bail!("Missing required option --timestamp or --bookmark.");
            }
            let target = at.target(&name)?;
            let backend = at.backend().await?;
            let outcome = restore(&backend, &target, bookmark, timestamp, json, yes).await;
            backend.close().await;
            let Some(result) = outcome? else { return Ok(()) };
            if json {
                print_json(&result);
            } else {
                println!(
                    "✅ Database {name} restored back to bookmark {}",
                    result["bookmark"].as_str().unwrap_or_default()
                );
                println!(
                    "↩️ To undo this operation, you can restore to the previous bookmark: {}",
                    result["previous_bookmark"].as_str().unwrap_or_default()
                );
            }
        }
    }
    Ok(())
}

async fn info(backend: &Backend, target: &Target, timestamp: Option<&str>) -> anyhow::Result<String> {
    let uuid = backend.resolve(target).await?;
    let at = timestamp.map(millis).transpose()?;
    backend.bookmark(&uuid, at).await
}

async fn restore(
    backend: &Backend,
    target: &Target,
    bookmark: Option<String>,
    timestamp: Option<String>,
    json: bool,
    yes: bool,
) -> anyhow::Result<Option<serde_json::Value>> {
    let uuid = backend.resolve(target).await?;
    let bookmark = match (bookmark, timestamp) {
        (Some(b), _) => b,
        (None, Some(t)) => backend.bookmark(&uuid, Some(millis(&t)?)).await?,
        (None, None) => unreachable!("checked by the caller"),
    };
    if !json {
        println!("🚧 Restoring database {} from bookmark {bookmark}", target.name);
        println!(
            "⚠️ This will overwrite all data in database {}.\nIn-flight queries and transactions will be cancelled.",
            target.name
        );
    }
    if !yes && !super::confirm("OK to proceed?")? {
        println!("Not restoring.");
        return Ok(None);
    }
    Ok(Some(backend.restore(&uuid, &bookmark).await?))
}
