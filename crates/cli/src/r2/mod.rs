//! `kura r2 …`: buckets and objects, locally (the default, in-process on the data directory) or
//! with `--remote` (Cloudflare's v4 API, as wrangler's `r2` commands use it), and presigned URLs.

mod backend;
mod presign;

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde_json::Value as Json;

use crate::DataArgs;
use crate::output::{cell, print_json, table};
use backend::{Backend, ObjectMetadata};

/// Where a command runs.
#[derive(Args, Clone)]
pub struct Location {
    /// Work on the local data directory, in this process (the default).
    #[arg(long, conflicts_with = "remote")]
    local: bool,
    /// Work against the v4 API named by CLOUDFLARE_API_BASE_URL (kura, or Cloudflare itself).
    #[arg(long)]
    remote: bool,
    #[command(flatten)]
    data: DataArgs,
}

#[derive(Subcommand)]
pub enum R2Command {
    /// Manage buckets.
    #[command(subcommand)]
    Bucket(BucketCommand),
    /// Manage objects.
    #[command(subcommand)]
    Object(ObjectCommand),
    /// Print a presigned URL for an object (SigV4 in the query string, as R2 accepts).
    Presign(presign::PresignArgs),
}

#[derive(Subcommand)]
pub enum BucketCommand {
    /// Create a bucket.
    Create {
        /// The bucket name: 3 to 63 of a-z, 0-9 and '-'.
        name: String,
        /// Location hint (apac, eeur, enam, weur, wnam, oc); recorded only.
        #[arg(long)]
        location: Option<String>,
        /// Default storage class: Standard or InfrequentAccess.
        #[arg(long, short = 's')]
        storage_class: Option<String>,
        #[command(flatten)]
        at: Location,
    },
    /// List buckets.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Delete an empty bucket.
    Delete {
        /// The bucket name.
        name: String,
        #[command(flatten)]
        at: Location,
    },
}

#[derive(Subcommand)]
pub enum ObjectCommand {
    /// Upload a file (or standard input) as an object.
    Put {
        /// BUCKET/KEY.
        path: String,
        /// The file to upload.
        #[arg(long, short = 'f', conflicts_with = "pipe")]
        file: Option<PathBuf>,
        /// Read the object from standard input.
        #[arg(long, short = 'p')]
        pipe: bool,
        #[command(flatten)]
        metadata: ObjectMetadata,
        #[command(flatten)]
        at: Location,
    },
    /// Download an object to a file (or standard output).
    Get {
        /// BUCKET/KEY.
        path: String,
        /// Where to write it (default: the key's last segment).
        #[arg(long, short = 'f', conflicts_with = "pipe")]
        file: Option<PathBuf>,
        /// Write the object to standard output.
        #[arg(long, short = 'p')]
        pipe: bool,
        #[command(flatten)]
        at: Location,
    },
    /// Delete an object.
    Delete {
        /// BUCKET/KEY.
        path: String,
        #[command(flatten)]
        at: Location,
    },
    /// List a bucket's objects.
    List {
        /// The bucket.
        bucket: String,
        /// Only keys starting with this.
        #[arg(long)]
        prefix: Option<String>,
        /// Fold keys at this delimiter into common prefixes.
        #[arg(long)]
        delimiter: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Location,
    },
}

/// Splits `bucket/key` as wrangler does.
fn bucket_and_key(path: &str) -> anyhow::Result<(&str, &str)> {
    match path.split_once('/') {
        Some((bucket, key)) if !bucket.is_empty() && !key.is_empty() => Ok((bucket, key)),
        _ => bail!("the object path must be BUCKET/KEY, not '{path}'"),
    }
}

pub async fn run(command: R2Command) -> anyhow::Result<()> {
    match command {
        R2Command::Bucket(command) => run_bucket(command).await,
        R2Command::Object(command) => run_object(command).await,
        R2Command::Presign(args) => presign::run(args).await,
    }
}

async fn run_bucket(command: BucketCommand) -> anyhow::Result<()> {
    match command {
        BucketCommand::Create { name, location, storage_class, at } => {
            let backend = Backend::open(at.remote, &at.data).await?;
            backend.create_bucket(&name, location.as_deref(), storage_class.as_deref()).await?;
            println!("Created bucket '{name}'.");
        }
        BucketCommand::List { json, at } => {
            let backend = Backend::open(at.remote, &at.data).await?;
            let buckets = backend.list_buckets().await?;
            if json {
                print_json(&Json::Array(buckets));
            } else {
                let rows = buckets
                    .iter()
                    .map(|b| vec![cell(&b["name"]), cell(&b["creation_date"]), cell(&b["storage_class"])])
                    .collect();
                println!("{}", table(&["name", "creation_date", "storage_class"], rows));
            }
        }
        BucketCommand::Delete { name, at } => {
            let backend = Backend::open(at.remote, &at.data).await?;
            backend.delete_bucket(&name).await?;
            println!("Deleted bucket '{name}'.");
        }
    }
    Ok(())
}

async fn run_object(command: ObjectCommand) -> anyhow::Result<()> {
    match command {
        ObjectCommand::Put { path, file, pipe, metadata, at } => {
            let (bucket, key) = bucket_and_key(&path)?;
            if file.is_none() && !pipe {
                bail!("say what to upload: --file PATH, or --pipe to read standard input");
            }
            let backend = Backend::open(at.remote, &at.data).await?;
            let info = backend.put_object(bucket, key, file.as_deref(), &metadata).await?;
            eprintln!("Uploaded '{key}' to '{bucket}' ({} bytes, ETag {}).", info["size"], cell(&info["etag"]));
        }
        ObjectCommand::Get { path, file, pipe, at } => {
            let (bucket, key) = bucket_and_key(&path)?;
            let backend = Backend::open(at.remote, &at.data).await?;
            let target = if pipe {
                None
            } else {
                Some(file.unwrap_or_else(|| PathBuf::from(key.rsplit('/').next().unwrap_or(key))))
            };
            backend.get_object(bucket, key, target.as_deref()).await?;
            if let Some(target) = target {
                eprintln!("Downloaded '{key}' from '{bucket}' to {}.", target.display());
            }
        }
        ObjectCommand::Delete { path, at } => {
            let (bucket, key) = bucket_and_key(&path)?;
            let backend = Backend::open(at.remote, &at.data).await?;
            backend.delete_object(bucket, key).await?;
            eprintln!("Deleted '{key}' from '{bucket}'.");
        }
        ObjectCommand::List { bucket, prefix, delimiter, json, at } => {
            let backend = Backend::open(at.remote, &at.data).await?;
            let (objects, prefixes) =
                backend.list_objects(&bucket, prefix.as_deref().unwrap_or(""), delimiter.as_deref()).await?;
            if json {
                print_json(&serde_json::json!({ "objects": objects, "delimited_prefixes": prefixes }));
            } else {
                let mut rows: Vec<Vec<String>> =
                    prefixes.iter().map(|p| vec![p.clone(), String::new(), String::new(), String::new()]).collect();
                rows.extend(
                    objects
                        .iter()
                        .map(|o| vec![cell(&o["key"]), cell(&o["size"]), cell(&o["etag"]), cell(&o["uploaded"])]),
                );
                println!("{}", table(&["key", "size", "etag", "uploaded"], rows));
            }
        }
    }
    Ok(())
}

/// Reads `--file` or standard input fully to a temporary file when its size is unknown.
pub(crate) fn stdin_to_temp() -> anyhow::Result<tempfile::NamedTempFile> {
    let mut temp = tempfile::NamedTempFile::new().context("cannot create a temporary file")?;
    std::io::copy(&mut std::io::stdin().lock(), &mut temp).context("cannot read standard input")?;
    Ok(temp)
}
