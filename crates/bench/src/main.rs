//! kura-bench: measures kura over its real HTTP API and, in the same run, the physical limit
//! (the same statements on in-process SQLite) and the peer (Miniflare running them inside a
//! Worker), and the peer's Worker code again with workerd's D1 binding pointed at kura; then
//! prints every figure beside its ratios. The machine is shared and noisy; the
//! ratios are what count.
//!
//! ```text
//! cargo run --release -p kura-bench -- d1 [--seconds 5] [--no-peer]
//! cargo run --release -p kura-bench -- r2 [--seconds 5] [--gib 1] [--no-peer]
//! cargo run --release -p kura-bench -- time-travel [--gib 1] [--transactions 100000]
//! cargo run --release -p kura-bench -- do [--seconds 5] [--on-disk 100000] [--no-peer]
//! cargo run --release -p kura-bench -- workers [--seconds 5] [--no-peer]
//! cargo build --release -p kura-cli && cargo run --release -p kura-bench -- cluster [--seconds 5]
//! cargo run --release -p kura-bench -- fuzz [--cases 100000]
//! cargo run --release -p kura-bench -- crash [--kills 200] [--seed N]
//! cargo build --release -p kura-cli && cargo run --release -p kura-bench -- capacity [--connections 2000]
//! ```

mod capacity;
mod child;
mod cluster;
mod crash;
mod d1;
mod durable_objects;
mod floor_server;
mod fuzz;
mod limit;
mod load;
mod memory;
mod node;
mod peer;
mod r2;
mod report;
mod server;
mod time_travel;
mod worker;
mod workers;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "kura-bench", about = "kura beside the physical limit and the Miniflare peer")]
struct Cli {
    #[command(subcommand)]
    suite: Suite,
}

#[derive(Subcommand)]
enum Suite {
    /// D1: point SELECTs, durable single-row INSERTs, 100-statement batches.
    D1(Settings),
    /// R2 over S3: 1 KiB and 1 MiB PUT and GET at 16 clients, a multipart upload streamed back.
    R2 {
        #[command(flatten)]
        settings: Settings,
        /// Size of the multipart object, in GiB.
        #[arg(long, default_value_t = 1.0)]
        gib: f64,
    },
    /// Time Travel: restore time beside a file copy, log bytes per small transaction.
    TimeTravel {
        #[command(flatten)]
        settings: Settings,
        /// Size of the database, in GiB.
        #[arg(long, default_value_t = 1.0)]
        gib: f64,
        /// Small transactions logged after the last snapshot.
        #[arg(long, default_value_t = 100_000)]
        transactions: u64,
    },
    /// Durable Objects: requests over 1,000 objects at 16 clients (runtime and HTTP), the first
    /// request to an evicted object, memory per idle object and with many objects on disk.
    Do {
        #[command(flatten)]
        settings: Settings,
        /// Objects written for the memory measurement.
        #[arg(long, default_value_t = 100_000)]
        on_disk: u64,
    },
    /// Workers: one deployed Worker at 16 clients doing a constant answer, a D1 point SELECT,
    /// an R2 1 KiB GET, a Durable Object call and a 4 KiB static asset, beside Miniflare
    /// serving the same Worker; the constant with a wrangler tail attached; Cron Trigger
    /// lateness; memory with the Worker idle.
    Workers(Settings),
    /// Node bindings: point SELECTs through kura-bindings' D1Database at 16 and 1 concurrent
    /// promises beside kura-bench's own client on the same endpoint, the limit, and Miniflare's
    /// D1 from Node.
    Node(Settings),
    /// Scale-out: durable INSERTs with every commit shipped to a three-node Garage under etcd
    /// (RPO 0) beside one node and beside a PUT per commit; PUTs per commit; a takeover of a
    /// 100 MiB database.
    Cluster(Settings),
    /// Fuzzing's long mode: every property-based target of outside input with many cases.
    Fuzz {
        /// Cases (requests, for the targets at the wire) per target.
        #[arg(long, default_value_t = 100_000)]
        cases: u64,
    },
    /// The crash test's long mode: kill -9 at random moments of a mixed workload, many times.
    Crash {
        /// Kills (each followed by a restart and a check against the model).
        #[arg(long, default_value_t = 200)]
        kills: u64,
        /// Replays the run a failure named.
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Capacity: resident memory and descriptors per idle connection, per idle open database and
    /// per bucket, beside their limits; bounded after 10,000 databases and buckets are touched.
    Capacity {
        /// Idle kept-alive connections held at once.
        #[arg(long, default_value_t = 2_000)]
        connections: usize,
        /// D1 databases created and written.
        #[arg(long, default_value_t = 10_000)]
        databases: usize,
        /// Buckets created and written.
        #[arg(long, default_value_t = 10_000)]
        buckets: usize,
    },
    /// (Internal) the connection floor's process: one route through kura's serving loop.
    #[command(hide = true)]
    HttpFloor,
    /// (Internal) the memory measurement's fresh process: touches the objects under DIR.
    #[command(hide = true)]
    DoFootprint { dir: PathBuf, objects: u64 },
    /// (Internal) the memory limit's fresh process: bare SQLite connections on files under DIR.
    #[command(hide = true)]
    DoFootprintLimit { dir: PathBuf },
}

/// Settings every suite shares.
#[derive(Args, Clone)]
pub struct Settings {
    /// Seconds each kura and limit workload runs.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Skip the Miniflare peer.
    #[arg(long)]
    pub no_peer: bool,
    /// The peer script (default: ../shared/bench/miniflare_peer.mjs beside the repository).
    #[arg(long)]
    pub peer_script: Option<PathBuf>,
    /// Operations per peer workload.
    #[arg(long, default_value_t = 2000)]
    pub peer_ops: u64,
    /// Run only these kura workloads (comma-separated; d1: floor1, floor16, select16, select1,
    /// insert1 (in turns with a server that only commits, as is and after kura's own time of
    /// work, which insert1mem measures first), insert1mem (the same on tmpfs), insert16,
    /// batch1, batch4; do: sdk16, sdk1 and cold (each in turns with the limit), http16 and
    /// http1 (in turns with a server doing only the limit's work and with the limit), memory;
    /// cluster: engine, takeover, d1, r2), skipping the peer (and, but for do's, the limit);
    /// for profiling. workers: requests, queues, tail, cron (each beside the peer).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Where to keep data files (default: the system's temporary directory).
    #[arg(long)]
    pub scratch: Option<PathBuf>,
}

impl Settings {
    /// A fresh directory for a run's data files, under `--scratch` when given.
    pub fn scratch_dir(&self) -> std::io::Result<tempfile::TempDir> {
        match &self.scratch {
            Some(dir) => tempfile::tempdir_in(dir),
            None => tempfile::tempdir(),
        }
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.suite {
        Suite::D1(settings) => d1::run(&settings),
        Suite::R2 { settings, gib } => r2::run(&settings, gib),
        Suite::TimeTravel { settings, gib, transactions } => time_travel::run_suite(&settings, gib, transactions),
        Suite::Do { settings, on_disk } => durable_objects::run(&settings, on_disk),
        Suite::Workers(settings) => workers::run(&settings),
        Suite::Cluster(settings) => cluster::run(&settings),
        Suite::Node(settings) => node::run(&settings),
        Suite::Fuzz { cases } => fuzz::run(cases),
        Suite::Crash { kills, seed } => crash::run(kills, seed),
        Suite::Capacity { connections, databases, buckets } => capacity::run(connections, databases, buckets),
        Suite::HttpFloor => capacity::http_floor_child(),
        Suite::DoFootprint { dir, objects } => durable_objects::footprint_child(dir, objects),
        Suite::DoFootprintLimit { dir } => durable_objects::footprint_limit_child(&dir),
    }
}
