//! `kura accounts` and `kura tokens`: credentials in the data directory's catalog. These work
//! while a server runs on the same directory (the catalog is safe to share between processes).

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use kura_catalog::{Catalog, Scope};
use kura_server::CredentialsConfig;

use crate::DataArgs;
use crate::output::{print_json, table};

#[derive(Subcommand)]
pub enum AccountsCommand {
    /// Create an account and an admin API token for it.
    Create {
        /// Use this id (1–32 of A-Z a-z 0-9 _ -); random if omitted.
        #[arg(long)]
        id: Option<String>,
        /// A human name.
        #[arg(long, default_value = "account")]
        name: String,
        #[command(flatten)]
        data: DataArgs,
    },
    /// List accounts.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        data: DataArgs,
    },
}

#[derive(Args)]
pub struct AccountArg {
    /// The account (default: KURA_ACCOUNT_ID, else the first account).
    #[arg(long, env = "KURA_ACCOUNT_ID", hide_env_values = true)]
    account: Option<String>,
}

#[derive(Subcommand)]
pub enum TokensCommand {
    /// Create an API token; its secret is printed once.
    Create {
        /// A human name.
        #[arg(long, default_value = "token")]
        name: String,
        /// What it may do: admin, d1:read, d1:write, r2:read, r2:write, do:read or do:write.
        #[arg(long, default_value = "admin")]
        scope: String,
        /// Limit its R2 access (and its S3 key's) to this bucket; repeat for several.
        #[arg(long = "bucket")]
        buckets: Vec<String>,
        #[command(flatten)]
        account: AccountArg,
        #[command(flatten)]
        data: DataArgs,
    },
    /// List an account's tokens (never their secrets).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        account: AccountArg,
        #[command(flatten)]
        data: DataArgs,
    },
    /// Revoke a token by id.
    Revoke {
        /// The token id (from `kura tokens list`).
        id: String,
        #[command(flatten)]
        account: AccountArg,
        #[command(flatten)]
        data: DataArgs,
    },
}

/// Opens the catalog, creating the data directory and its first account if needed.
fn open_catalog(data: &DataArgs) -> anyhow::Result<Catalog> {
    crate::membership::refuse_if_clustered(&data.data)?;
    std::fs::create_dir_all(&data.data).with_context(|| format!("cannot create {}", data.data.display()))?;
    let catalog = Catalog::open(data.data.join("catalog.sqlite"))?;
    let boot = kura_server::bootstrap(&catalog, &CredentialsConfig::default())?;
    if let Some(secret) = boot.new_token {
        eprintln!("Created account {} with an admin API token (shown only this once): {secret}", boot.account.id);
    }
    Ok(catalog)
}

fn resolve_account(catalog: &Catalog, arg: &AccountArg) -> anyhow::Result<String> {
    match &arg.account {
        Some(id) => match catalog.account(id)? {
            Some(a) => Ok(a.id),
            None => bail!("no account '{id}' in this data directory"),
        },
        None => Ok(catalog.default_account()?.context("the data directory has no account")?.id),
    }
}

/// Prints the S3 key R2 derives from a token, if the token reaches R2.
fn print_s3_key(catalog: &Catalog, token_id: &str) -> anyhow::Result<()> {
    if let Some(key) = catalog.s3_credential(token_id)? {
        let reach = key.buckets.as_ref().map_or_else(|| "all buckets".to_owned(), |b| b.join(", "));
        // Each value alone on its line, so a line copied whole is the value.
        println!("S3 access key id:     {}", key.access_key_id);
        println!("S3 secret access key: {}", key.secret_access_key);
        println!("S3 key reaches:       {reach}");
    }
    Ok(())
}

pub fn run_accounts(command: AccountsCommand) -> anyhow::Result<()> {
    match command {
        AccountsCommand::Create { id, name, data } => {
            let catalog = open_catalog(&data)?;
            let account = catalog.create_account(id.as_deref(), &name)?;
            let (token, secret) = catalog.create_token(&account.id, "admin", Scope::Admin, None)?;
            println!("Created account {} ({})", account.id, account.name);
            println!("Admin API token (shown only this once): {secret}");
            print_s3_key(&catalog, &token.id)?;
        }
        AccountsCommand::List { json, data } => {
            let catalog = open_catalog(&data)?;
            let accounts = catalog.accounts()?;
            if json {
                let rows: Vec<_> = accounts
                    .iter()
                    .map(|a| serde_json::json!({ "id": a.id, "name": a.name, "created_at": a.created_at }))
                    .collect();
                print_json(&rows);
            } else {
                let rows = accounts.iter().map(|a| vec![a.id.clone(), a.name.clone(), a.created_at.clone()]).collect();
                println!("{}", table(&["id", "name", "created_at"], rows));
            }
        }
    }
    Ok(())
}

pub fn run_tokens(command: TokensCommand) -> anyhow::Result<()> {
    match command {
        TokensCommand::Create { name, scope, buckets, account, data } => {
            let catalog = open_catalog(&data)?;
            let account = resolve_account(&catalog, &account)?;
            let scope: Scope = scope.parse()?;
            let limit = (!buckets.is_empty()).then_some(buckets.as_slice());
            let (token, secret) = catalog.create_limited_token(&account, &name, scope, None, limit)?;
            println!("Created token {} ({scope}) for account {account}", token.id);
            println!("Secret (shown only this once): {secret}");
            print_s3_key(&catalog, &token.id)?;
        }
        TokensCommand::List { json, account, data } => {
            let catalog = open_catalog(&data)?;
            let account = resolve_account(&catalog, &account)?;
            let tokens = catalog.tokens(&account)?;
            if json {
                let rows: Vec<_> = tokens
                    .iter()
                    .map(|t| {
                        serde_json::json!({
                            "id": t.id, "name": t.name, "scope": t.scope.to_string(),
                            "buckets": t.buckets, "created_at": t.created_at, "revoked_at": t.revoked_at,
                        })
                    })
                    .collect();
                print_json(&rows);
            } else {
                let rows = tokens
                    .iter()
                    .map(|t| {
                        let status = if t.revoked_at.is_some() { "revoked" } else { "active" };
                        let buckets = t.buckets.as_ref().map_or_else(|| "all".to_owned(), |b| b.join(", "));
                        vec![
                            t.id.clone(),
                            t.name.clone(),
                            t.scope.to_string(),
                            buckets,
                            status.into(),
                            t.created_at.clone(),
                        ]
                    })
                    .collect();
                println!("{}", table(&["id", "name", "scope", "buckets", "status", "created_at"], rows));
            }
        }
        TokensCommand::Revoke { id, account, data } => {
            let catalog = open_catalog(&data)?;
            let account = resolve_account(&catalog, &account)?;
            if !catalog.revoke_token(&account, &id)? {
                bail!("account {account} has no active token '{id}'");
            }
            println!("Revoked token {id}");
        }
    }
    Ok(())
}
