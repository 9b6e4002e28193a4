//! A data directory opened by one process: its lock, its catalog, its engines, and the first
//! account and admin token it creates.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kura_catalog::{Account, Catalog, Scope};
use kura_d1::{D1, D1Settings};
use kura_r2::{R2, R2Settings};

/// Why a data directory could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// Another kura process holds the directory.
    #[error(
        "the data directory {dir} is in use by another kura process{}",
        pid.as_deref().map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Busy {
        /// The directory.
        dir: PathBuf,
        /// The holder's process id, as it wrote it.
        pid: Option<String>,
    },
    /// The file system failed.
    #[error("{context}: {source}")]
    Io {
        /// What kura was doing.
        context: String,
        /// The failure.
        source: std::io::Error,
    },
    /// The catalog failed or refused the configured credentials.
    #[error(transparent)]
    Catalog(#[from] kura_catalog::Error),
    /// The D1 engine failed to start.
    #[error(transparent)]
    D1(#[from] kura_d1::Error),
    /// The R2 engine failed to start.
    #[error(transparent)]
    R2(#[from] kura_r2::R2Error),
    /// The KV engine failed to start.
    #[error(transparent)]
    Kv(#[from] kura_kv::KvError),
    /// The Durable Objects engine failed to start.
    #[error(transparent)]
    DurableObjects(#[from] kura_do::DoError),
}

/// Credentials pinned by configuration (`KURA_ACCOUNT_ID`, `KURA_API_TOKEN`).
#[derive(Debug, Clone, Default)]
pub struct CredentialsConfig {
    /// Use exactly this account id.
    pub account_id: Option<String>,
    /// Make this secret an admin token of that account.
    pub api_token: Option<String>,
    /// Make this pair a read-write S3 key of that account (`KURA_S3_ACCESS_KEY_ID`,
    /// `KURA_S3_SECRET_ACCESS_KEY`).
    pub s3_key: Option<(String, String)>,
}

/// The account kura acts for by default, and an admin token if one was just created.
#[derive(Debug, Clone)]
pub struct Bootstrap {
    /// The account.
    pub account: Account,
    /// The secret of an admin token created just now, to show once.
    pub new_token: Option<String>,
}

/// Settings of the engines a node runs.
#[derive(Debug, Clone, Default)]
pub struct NodeSettings {
    /// The D1 engine's settings.
    pub d1: D1Settings,
    /// The R2 engine's settings.
    pub r2: R2Settings,
    /// In a cluster: where KV namespaces' files are placed and their values' bodies kept (the
    /// rest of KV's settings are R2's).
    pub kv_shared: Option<kura_r2::Shared>,
    /// In a cluster: which node owns each queue's file.
    pub queue_placement: Option<Arc<dyn kura_sqlite::Placement>>,
    /// The Durable Objects engine's settings.
    pub durable_objects: kura_do::DoSettings,
    /// Domains under which the S3 listener serves virtual-hosted buckets (`<bucket>.<domain>`).
    pub s3_domains: Vec<String>,
    /// In a cluster: how this node's catalog stays the cluster's (D1's placement is in
    /// `d1.placement`). `None` for a node alone.
    pub catalog_replication: Option<Arc<dyn kura_catalog::Replication>>,
    /// In a cluster: how requests reach other nodes.
    pub forwarding: Option<crate::forward::Forwarding>,
}

/// An opened data directory. Dropping it releases the directory.
pub struct Node {
    dir: PathBuf,
    catalog: Arc<Catalog>,
    d1: Arc<D1>,
    r2: Arc<R2>,
    kv: kura_kv::Kv,
    queues: kura_queues::Queues,
    durable_objects: kura_do::DurableObjects,
    s3_domains: Vec<String>,
    forwarding: Option<crate::forward::Forwarding>,
    _lock: File,
}

impl Node {
    /// Opens (creating if needed) the data directory and locks it for this process.
    pub fn open(dir: &Path, settings: NodeSettings) -> Result<Node, NodeError> {
        kura_sqlite::configure_process();
        let io = |context: String| move |source| NodeError::Io { context, source };
        // Absolute from here on: the paths the node hands out (to workerd, in its banner) must
        // not depend on whose working directory reads them.
        let dir = &std::path::absolute(dir).map_err(io(format!("resolving {}", dir.display())))?;
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let lock = lock_directory(dir)?;
        let catalog_path = dir.join("catalog.sqlite");
        let catalog = Arc::new(match settings.catalog_replication {
            Some(replication) => Catalog::open_replicated(catalog_path, replication)?,
            None => Catalog::open(catalog_path)?,
        });
        let d1 = Arc::new(D1::open(dir, Arc::clone(&catalog), settings.d1)?);
        let kv = kura_kv::Kv::open(dir.join("kv"), R2Settings { shared: settings.kv_shared, ..settings.r2.clone() })?;
        let r2 = Arc::new(R2::open(dir.join("r2"), settings.r2)?);
        let queues = kura_queues::Queues::open(dir.join("queues"), Default::default(), settings.queue_placement)
            .map_err(io(format!("opening {}", dir.join("queues").display())))?;
        let durable_objects = kura_do::DurableObjects::open(dir.join("do"), settings.durable_objects)?;
        Ok(Node {
            dir: dir.to_owned(),
            catalog,
            d1,
            r2,
            kv,
            queues,
            durable_objects,
            s3_domains: settings.s3_domains,
            forwarding: settings.forwarding,
            _lock: lock,
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The D1 engine.
    pub fn d1(&self) -> &Arc<D1> {
        &self.d1
    }

    /// The R2 engine.
    pub fn r2(&self) -> &Arc<R2> {
        &self.r2
    }

    /// The KV engine.
    pub fn kv(&self) -> &kura_kv::Kv {
        &self.kv
    }

    /// The Queues engine.
    pub fn queues(&self) -> &kura_queues::Queues {
        &self.queues
    }

    /// The Durable Objects engine.
    pub fn durable_objects(&self) -> &kura_do::DurableObjects {
        &self.durable_objects
    }

    /// In a cluster, how requests reach other nodes; `None` alone.
    pub fn forwarding(&self) -> Option<&crate::forward::Forwarding> {
        self.forwarding.as_ref()
    }

    /// The domains of virtual-hosted bucket addressing.
    pub fn s3_domains(&self) -> Vec<String> {
        self.s3_domains.clone()
    }

    /// Makes sure the default account exists (with `config`'s id if given) and, if configured,
    /// that the configured secret is one of its admin tokens. A brand-new account without a
    /// configured token gets an admin token, whose secret is returned to be shown once.
    pub fn bootstrap(&self, config: &CredentialsConfig) -> Result<Bootstrap, NodeError> {
        bootstrap(&self.catalog, config)
    }
}

/// Bootstraps credentials in a catalog; see [`Node::bootstrap`].
pub fn bootstrap(catalog: &Catalog, config: &CredentialsConfig) -> Result<Bootstrap, NodeError> {
    let existing = match &config.account_id {
        Some(id) => catalog.account(id)?,
        None => catalog.default_account()?,
    };
    let (account, created) = match existing {
        Some(account) => (account, false),
        None => (catalog.create_account(config.account_id.as_deref(), "default")?, true),
    };
    if let Some((access_key_id, secret)) = &config.s3_key {
        catalog.ensure_s3_key(&account.id, access_key_id, secret)?;
    }
    if let Some(secret) = &config.api_token {
        catalog.ensure_admin_token(&account.id, secret)?;
        return Ok(Bootstrap { account, new_token: None });
    }
    let new_token = if created {
        Some(catalog.create_token(&account.id, "admin (created on first start)", Scope::Admin, None)?.1)
    } else {
        None
    };
    Ok(Bootstrap { account, new_token })
}

/// Takes `<dir>/kura.lock` exclusively and writes our pid into it: while the file is held, no
/// server or offline command runs on the directory. Released when the file is dropped.
pub fn lock_directory(dir: &Path) -> Result<File, NodeError> {
    let path = dir.join("kura.lock");
    let io = |source| NodeError::Io { context: format!("opening {}", path.display()), source };
    let mut file = File::options().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = Some(pid.trim().to_owned()).filter(|p| !p.is_empty());
            return Err(NodeError::Busy { dir: dir.to_owned(), pid });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    write!(file, "{}", std::process::id()).map_err(io)?;
    Ok(file)
}
