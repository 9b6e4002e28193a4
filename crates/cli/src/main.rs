//! `kura`: the one binary. `kura serve` runs the server on a data directory; `kura d1 …` works
//! on D1 databases locally (in-process, on the data directory) or remotely (any server speaking
//! Cloudflare's v4 API: kura, or Cloudflare itself); `kura r2 …` and `kura do …` do the same for
//! R2 and Durable Objects; `kura accounts` and `kura tokens` manage credentials.

mod admin;
mod check;
mod cluster;
mod config;
mod d1;
mod durable_objects;
mod local;
mod location;
mod membership;
mod output;
mod progress;
mod r2;
mod serve;
mod workers;
mod wrangler_state;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// kura: D1, R2 and Durable Objects on your own machines.
#[derive(Parser)]
#[command(name = "kura", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How logs are written to stderr: `text` for people, `json` (one object per line, with
    /// the request's span — its id and surface) for log collectors.
    #[arg(long, global = true, env = "KURA_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server: Cloudflare's v4 API (D1, R2, Durable Objects, Workers), the S3 listener and deployed Workers, on a data directory.
    Serve(Box<serve::ServeArgs>),
    /// Manage D1 databases, locally or remotely.
    #[command(subcommand)]
    D1(d1::D1Command),
    /// Manage R2 buckets and objects, locally or remotely, and presign URLs.
    #[command(subcommand)]
    R2(r2::R2Command),
    /// Manage Durable Object namespaces and inspect, query and export their objects.
    #[command(subcommand)]
    Do(durable_objects::DoCommand),
    /// List and delete deployed Workers and read their logs, locally or remotely.
    #[command(subcommand)]
    Workers(workers::WorkersCommand),
    /// Bring data from elsewhere into the data directory.
    #[command(subcommand)]
    Import(ImportCommand),
    /// Manage accounts in the data directory.
    #[command(subcommand)]
    Accounts(admin::AccountsCommand),
    /// Manage API tokens in the data directory.
    #[command(subcommand)]
    Tokens(admin::TokensCommand),
    /// Check a stopped server's data directory for damage: SQLite integrity, history checksums
    /// and positions, and that every R2 object's bytes are where its row says.
    Check(check::CheckArgs),
    /// Look at a cluster node (the one CLOUDFLARE_API_BASE_URL names).
    #[command(subcommand)]
    Node(cluster::NodeCommand),
}

#[derive(Subcommand)]
enum ImportCommand {
    /// A `wrangler dev` project's local state (its D1 databases, R2 buckets and Durable
    /// Objects); run again, it imports only what is missing. The server must be stopped.
    WranglerState {
        /// The state directory (the project's `.wrangler/state/v3`).
        dir: PathBuf,
        /// The project's wrangler configuration, which names its D1 databases (default:
        /// wrangler.json, wrangler.jsonc or wrangler.toml here).
        #[arg(long, short = 'c')]
        config: Option<PathBuf>,
        #[command(flatten)]
        data: DataArgs,
    },
}

/// Where the data directory is.
#[derive(Args, Clone, Debug)]
pub struct DataArgs {
    /// The data directory.
    #[arg(long = "data", env = "KURA_DATA", default_value = ".kura", global = true)]
    pub data: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        // A command piped into `head` or `grep -q` ends quietly when the reader goes, as Unix
        // tools do, rather than panic on the closed pipe. The server keeps Rust's default
        // (SIGPIPE ignored): a client that hangs up must not end it.
        // SAFETY: restoring a signal's default disposition before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("KURA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_log_filter(&cli.command)));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        LogFormat::Json => logs.json().with_current_span(true).with_span_list(false).init(),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(*args).await,
            Command::D1(command) => d1::run(command).await,
            Command::R2(command) => r2::run(command).await,
            Command::Do(command) => durable_objects::run(command).await,
            Command::Workers(command) => workers::run(command).await,
            Command::Import(ImportCommand::WranglerState { dir, config, data }) => {
                let config = config::WranglerConfig::find(config.as_deref())?;
                let local = local::Local::open(&data)?;
                let outcome = wrangler_state::run(&dir, config, &local).await;
                local.node.durable_objects().shutdown().await;
                local.node.d1().shutdown().await;
                local.node.r2().shutdown().await;
                outcome
            }
            Command::Accounts(command) => admin::run_accounts(command),
            Command::Tokens(command) => admin::run_tokens(command),
            Command::Node(command) => cluster::run_node(command).await,
            Command::Check(args) => check::run(args),
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("✘ {}", output::error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// The server logs its start and notable events; other commands stay quiet unless asked.
fn default_log_filter(command: &Command) -> &'static str {
    match command {
        // s3s reports every client error (a bad signature, an unknown key) at ERROR; kura answers
        // those to the client, they are not the server's failures.
        Command::Serve(_) => "info,tower_http=warn,s3s=off",
        _ => "warn,s3s=off",
    }
}
