//! Where a `kura d1` or `kura do` command runs (in-process on the data directory, or against a
//! v4 API) and which wrangler configuration it reads.

use std::path::PathBuf;

use clap::Args;

use crate::DataArgs;
use crate::config::WranglerConfig;

/// Where a command runs and how it reads configuration.
#[derive(Args, Clone)]
pub struct Location {
    /// Work on the local data directory, in this process (the default).
    #[arg(long, conflicts_with = "remote")]
    pub local: bool,
    /// Work against the v4 API named by CLOUDFLARE_API_BASE_URL (kura, or Cloudflare itself).
    #[arg(long)]
    pub remote: bool,
    /// The wrangler configuration file (default: wrangler.json, wrangler.jsonc or wrangler.toml here).
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub data: DataArgs,
}

impl Location {
    /// The configuration file named, or found here; `None` when there is none.
    pub fn wrangler_config(&self) -> anyhow::Result<Option<WranglerConfig>> {
        WranglerConfig::find(self.config.as_deref())
    }
}
