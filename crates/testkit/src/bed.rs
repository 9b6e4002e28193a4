//! Real etcd, Garage and moto processes on loopback for the tests and the benchmark (feature
//! `bed`): a three-member etcd, a three-node Garage with its layout applied and fsync on, and
//! moto's S3 server. Each is stopped when dropped. The binaries come from `scripts/test` (etcd
//! from Debian, Garage built once per machine into `~/.cache/kura`, moto from PyPI).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kura_cluster::{RemoteStorage, S3Config};

/// A free loopback port (the listener is closed again; the race with other tests is small).
/// A port nothing listens on now, below Linux's ephemeral range (32768 and up), so that no
/// outgoing connection takes it as its own before the process meant for it binds it.
pub fn free_port() -> u16 {
    loop {
        let mut random = [0u8; 2];
        getrandom::fill(&mut random).expect("the system has randomness");
        let port = 20_000 + u16::from_le_bytes(random) % 12_000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn wait_until(what: &str, timeout: Duration, ready: impl FnMut() -> bool) {
    assert!(ready_within(timeout, ready), "{what} did not become ready within {timeout:?}");
}

fn ready_within(timeout: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while !ready() {
        if started.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

fn http_ok(url: &str) -> bool {
    std::process::Command::new("curl")
        .args(["-sf", "-o", "/dev/null", "--max-time", "1", url])
        .status()
        .is_ok_and(|s| s.success())
}

/// A child process that is killed when dropped.
pub struct Process {
    /// The process.
    pub child: Child,
}

impl Process {
    fn spawn(command: &mut Command, log: &Path) -> Process {
        let log = std::fs::File::create(log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {command:?}: {e}"));
        Process { child }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Three etcd members forming one cluster.
pub struct Etcd {
    /// The members (`None` once stopped).
    pub members: Vec<Option<Process>>,
    /// Their client URLs.
    pub endpoints: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Etcd {
    /// Starts the cluster, again on other ports if a member does not come up (a port picked
    /// free may be taken by another test before etcd binds it).
    pub fn start() -> Etcd {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Self::try_start() {
                Ok(etcd) => return etcd,
                Err(log) => failures.push(log),
            }
        }
        panic!("etcd did not start: {failures:#?}");
    }

    fn try_start() -> Result<Etcd, String> {
        let binary = std::env::var("KURA_ETCD").unwrap_or_else(|_| "etcd".into());
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        let mut endpoints = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let mut command = Command::new(&binary);
            command
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(dir.path().join(format!("m{i}")))
                .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
                .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &cluster, "--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "kura-test"])
                .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                // kura's manifests are rewritten all the time: old revisions go (docs/scale-out.md).
                .args(["--auto-compaction-mode", "revision", "--auto-compaction-retention", "10000"]);
            members.push(Some(Process::spawn(&mut command, &dir.path().join(format!("m{i}.log")))));
            endpoints.push(client_url);
        }
        for (i, endpoint) in endpoints.iter().enumerate() {
            if !ready_within(Duration::from_secs(20), || http_ok(&format!("{endpoint}/health"))) {
                let log = std::fs::read_to_string(dir.path().join(format!("m{i}.log"))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(8).collect();
                return Err(format!("member m{i} at {endpoint}: {tail:?}"));
            }
        }
        Ok(Etcd { members, endpoints, _dir: dir })
    }

    /// Stops member `i` for good.
    pub fn stop(&mut self, i: usize) {
        self.members[i] = None;
    }
}

/// The Garage binary `scripts/test` built (or `KURA_GARAGE`).
pub fn garage_binary() -> PathBuf {
    if let Ok(path) = std::env::var("KURA_GARAGE") {
        return path.into();
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let path = PathBuf::from(home).join(".cache/kura/garage-2.5.0/bin/garage");
    assert!(
        path.exists(),
        "Garage 2.5.0 is not built at {}: scripts/test builds it (once per machine)",
        path.display()
    );
    path
}

/// The access key id Garage is given.
pub const GARAGE_KEY_ID: &str = "GK0123456789abcdef01234567";
/// Its secret.
pub const GARAGE_SECRET: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
/// The bucket that key may read and write.
pub const GARAGE_BUCKET: &str = "kura";

/// Three Garage nodes with replication 3, fsync of data and metadata on, one bucket and a key.
pub struct Garage {
    /// The nodes (`None` once stopped).
    pub nodes: Vec<Option<Process>>,
    /// Each node's S3 API URL.
    pub s3_endpoints: Vec<String>,
    configs: Vec<PathBuf>,
    _dir: tempfile::TempDir,
}

impl Garage {
    /// Starts the three nodes, connects them, applies the layout, and creates the key and bucket.
    pub fn start() -> Garage {
        let binary = garage_binary();
        let dir = tempfile::tempdir().unwrap();
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).unwrap();
        let secret = hex::encode(secret);
        let mut nodes = Vec::new();
        let mut configs = Vec::new();
        let mut s3_endpoints = Vec::new();
        let mut rpc = Vec::new();
        for i in 0..3 {
            let (rpc_port, s3_port, admin_port) = (free_port(), free_port(), free_port());
            let root = dir.path().join(format!("n{i}"));
            let config = format!(
                "metadata_dir = \"{root}/meta\"\ndata_dir = \"{root}/data\"\ndb_engine = \"lmdb\"\n\
                 replication_factor = 3\nmetadata_fsync = true\ndata_fsync = true\n\
                 rpc_bind_addr = \"127.0.0.1:{rpc_port}\"\nrpc_public_addr = \"127.0.0.1:{rpc_port}\"\n\
                 rpc_secret = \"{secret}\"\n\n[s3_api]\napi_bind_addr = \"127.0.0.1:{s3_port}\"\n\
                 s3_region = \"garage\"\nroot_domain = \".s3.garage.localhost\"\n\n\
                 [admin]\napi_bind_addr = \"127.0.0.1:{admin_port}\"\n",
                root = root.display()
            );
            let path = dir.path().join(format!("n{i}.toml"));
            std::fs::write(&path, config).unwrap();
            let mut command = Command::new(&binary);
            command.arg("-c").arg(&path).arg("server").env("RUST_LOG", "garage=warn");
            nodes.push(Some(Process::spawn(&mut command, &dir.path().join(format!("n{i}.log")))));
            configs.push(path);
            s3_endpoints.push(format!("http://127.0.0.1:{s3_port}"));
            rpc.push(rpc_port);
        }
        let garage = Garage { nodes, s3_endpoints, configs, _dir: dir };
        let mut ids = Vec::new();
        for i in 0..3 {
            let mut id = String::new();
            wait_until("a Garage node", Duration::from_secs(30), || match garage.cli(i, &["node", "id", "-q"]) {
                Ok(out) => {
                    id = out.trim().to_owned();
                    true
                }
                Err(_) => false,
            });
            ids.push(id);
        }
        for id in &ids[1..] {
            garage.retry(&["node", "connect", id]);
        }
        // Node 0 must see all three before a layout can name them.
        wait_until("three connected Garage nodes", Duration::from_secs(30), || {
            garage.cli(0, &["status"]).is_ok_and(|s| ids.iter().all(|id| s.contains(&id[..16])))
        });
        for id in &ids {
            let short = id.split('@').next().unwrap();
            garage.retry(&["layout", "assign", "-z", "dc1", "-c", "1G", short]);
        }
        garage.retry(&["layout", "apply", "--version", "1"]);
        wait_until("the Garage layout", Duration::from_secs(30), || {
            garage.cli(0, &["status"]).is_ok_and(|s| !s.contains("NO ROLE"))
        });
        garage.cli(0, &["key", "import", "--yes", "-n", "kura", GARAGE_KEY_ID, GARAGE_SECRET]).unwrap();
        garage.cli(0, &["bucket", "create", GARAGE_BUCKET]).unwrap();
        garage
            .cli(0, &["bucket", "allow", GARAGE_BUCKET, "--read", "--write", "--owner", "--key", GARAGE_KEY_ID])
            .unwrap();
        garage
    }

    /// Runs the Garage CLI against node 0 until it succeeds (a node just started may not
    /// answer yet, or not know its peers yet).
    fn retry(&self, args: &[&str]) {
        let mut last = String::new();
        let ok = (0..50).any(|_| match self.cli(0, args) {
            Ok(_) => true,
            Err(e) => {
                last = e;
                std::thread::sleep(Duration::from_millis(200));
                false
            }
        });
        assert!(ok, "{last}");
    }

    /// Runs the Garage CLI against node `i`.
    pub fn cli(&self, i: usize, args: &[&str]) -> Result<String, String> {
        let out = Command::new(garage_binary()).arg("-c").arg(&self.configs[i]).args(args).output().unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "garage {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Storage over node `i`'s S3 API.
    pub fn storage(&self, i: usize, prefix: &str) -> RemoteStorage {
        RemoteStorage::s3(&S3Config {
            endpoint: Some(self.s3_endpoints[i].clone()),
            bucket: GARAGE_BUCKET.into(),
            prefix: prefix.into(),
            region: "garage".into(),
            access_key_id: GARAGE_KEY_ID.into(),
            secret_access_key: GARAGE_SECRET.into(),
        })
        .unwrap()
    }

    /// Stops node `i` for good.
    pub fn stop(&mut self, i: usize) {
        self.nodes[i] = None;
    }
}

/// moto's S3 server, with one bucket.
pub struct Moto {
    /// Its URL.
    pub endpoint: String,
    _process: Process,
    _dir: tempfile::TempDir,
}

impl Moto {
    /// Starts moto on a free port and creates its one bucket, `kura`.
    pub fn start() -> Moto {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut command = Command::new("python3");
        command.args(["-m", "moto.server", "-p", &port.to_string(), "-H", "127.0.0.1"]);
        let process = Process::spawn(&mut command, &dir.path().join("moto.log"));
        let endpoint = format!("http://127.0.0.1:{port}");
        wait_until("moto", Duration::from_secs(30), || http_ok(&format!("{endpoint}/moto-api/")));
        let created = Command::new("curl").args(["-sf", "-X", "PUT", &format!("{endpoint}/kura")]).status().unwrap();
        assert!(created.success(), "create moto's bucket");
        Moto { endpoint, _process: process, _dir: dir }
    }

    /// Storage over moto, under `prefix` in its bucket.
    pub fn storage(&self, prefix: &str) -> RemoteStorage {
        RemoteStorage::s3(&S3Config {
            endpoint: Some(self.endpoint.clone()),
            bucket: "kura".into(),
            prefix: prefix.into(),
            region: "us-east-1".into(),
            access_key_id: "testing".into(),
            secret_access_key: "testing".into(),
        })
        .unwrap()
    }
}
