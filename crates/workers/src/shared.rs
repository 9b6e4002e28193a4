//! Workers across a cluster: every version's files — its modules, its list of assets and the
//! assets' contents — kept in the store the nodes share, so any node can run any deployed
//! version. An upload is shared before the catalog records it (a node that reads the version
//! in the catalog always finds its files), and each node brings in the files of what the
//! catalog deploys before it hands the configuration to its workerd.
//!
//! Objects are written once and never change: `workers/versions/<version id>/<file>` (a
//! version id is a fresh UUID) and `workers/assets/<hash>` (named by its contents' hash).

use std::collections::HashSet;
use std::io;
use std::path::Path;
use std::sync::Mutex;

use bytes::Bytes;

use crate::assets::{VERSION_FILE, VersionAssets};
use crate::config::ServedScript;
use crate::error::{Result, WorkersError};
use crate::version::StoredVersion;
use crate::{Workers, random_hex};

/// The store the nodes of a cluster share, as the Workers layer reads and writes it (the
/// binary that joins the cluster implements it over the cluster's storage).
#[async_trait::async_trait]
pub trait SharedFiles: Send + Sync + std::fmt::Debug {
    /// Writes `bytes` under `name`, durably before returning. A name always holds the same
    /// bytes, so writing one that exists already is not an error.
    async fn put(&self, name: &str, bytes: Bytes) -> io::Result<()>;
    /// Reads the object `name` (an `io::ErrorKind::NotFound` error if there is none).
    async fn get(&self, name: &str) -> io::Result<Bytes>;
    /// Whether there is an object `name`.
    async fn exists(&self, name: &str) -> io::Result<bool>;
    /// Removes the object `name`; a missing one is not an error.
    async fn delete(&self, name: &str) -> io::Result<()>;
}

/// How many objects one node moves to or from the store at once.
const AT_ONCE: usize = 8;

fn version_object(version_id: &str, file: &str) -> String {
    format!("workers/versions/{version_id}/{file}")
}

fn asset_object(hash: &str) -> String {
    format!("workers/assets/{hash}")
}

fn unavailable(doing: impl std::fmt::Display) -> impl FnOnce(io::Error) -> WorkersError {
    move |e| WorkersError::Unavailable(format!("the cluster's store failed {doing}: {e}"))
}

/// Asset hashes this node knows the store holds, so a redeploy of the same site sends none.
#[derive(Default)]
pub(crate) struct KnownShared(Mutex<HashSet<String>>);

impl KnownShared {
    fn contains(&self, hash: &str) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).contains(hash)
    }

    fn insert(&self, hash: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(hash.to_owned());
    }
}

/// One object's move to or from the store.
type Move<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + 'a>>;

/// Runs `moves`, [`AT_ONCE`] at a time, stopping at the first failure.
async fn each(moves: Vec<Move<'_>>) -> Result<()> {
    use futures_util::StreamExt;
    let mut running = futures_util::stream::iter(moves).buffer_unordered(AT_ONCE);
    while let Some(done) = running.next().await {
        done?;
    }
    Ok(())
}

impl Workers {
    /// The shared store, when this node is one of a cluster's.
    pub(crate) fn shared(&self) -> Option<&dyn SharedFiles> {
        self.inner.shared.as_deref()
    }

    /// Puts a new version's files in the shared store (nothing on a node of its own): its
    /// modules, its list of assets, and each asset the store lacks.
    pub(crate) async fn share_version(
        &self,
        version_id: &str,
        stored: &StoredVersion,
        assets: Option<&VersionAssets>,
    ) -> Result<()> {
        let Some(shared) = self.shared() else { return Ok(()) };
        let dir = self.version_dir(version_id);
        let mut files: Vec<&str> = stored.modules.iter().map(|m| m.file.as_str()).collect();
        if assets.is_some() {
            files.push(VERSION_FILE);
        }
        let modules = files.into_iter().map(|file| -> Move<'_> {
            let path = dir.join(file);
            Box::pin(async move {
                let bytes = read(&path)?;
                shared.put(&version_object(version_id, file), bytes).await.map_err(unavailable("storing a module"))
            })
        });
        each(modules.collect()).await?;
        let Some(assets) = assets else { return Ok(()) };
        let hashes: HashSet<&str> = assets.files.values().map(|a| a.hash.as_str()).collect();
        let store = &self.inner.assets;
        let known = &self.inner.known_shared;
        let uploads = hashes.into_iter().filter(|h| !known.contains(h)).map(|hash| -> Move<'_> {
            Box::pin(async move {
                let name = asset_object(hash);
                if !shared.exists(&name).await.map_err(unavailable("looking for an asset"))? {
                    let bytes = read(&store.file(hash))?;
                    shared.put(&name, bytes).await.map_err(unavailable("storing an asset"))?;
                }
                known.insert(hash);
                Ok(())
            })
        });
        each(uploads.collect()).await
    }

    /// Removes a deleted script's versions' own files from the shared store (nothing on a node
    /// of its own). Assets stay: named by their contents, other versions may list them. A
    /// failure leaves objects no version names, and is only logged.
    pub(crate) async fn forget_shared_versions(&self, versions: &[(String, StoredVersion)]) {
        let Some(shared) = self.shared() else { return };
        let mut removals = Vec::new();
        for (version_id, stored) in versions {
            let mut files: Vec<&str> = stored.modules.iter().map(|m| m.file.as_str()).collect();
            if stored.has_assets {
                files.push(VERSION_FILE);
            }
            for file in files {
                removals.push(Box::pin(async move {
                    shared
                        .delete(&version_object(version_id, file))
                        .await
                        .map_err(unavailable("removing a deleted Worker's module"))
                }) as Move<'_>);
            }
        }
        if let Err(e) = each(removals).await {
            tracing::warn!(error = %e, "could not remove a deleted Worker's files from the store");
        }
    }

    /// Brings in from the shared store the files of every version in `scripts` this node lacks
    /// (nothing on a node of its own). A version's directory appears whole or not at all.
    pub(crate) async fn bring_in(&self, scripts: &[ServedScript]) -> Result<()> {
        let Some(shared) = self.shared() else { return Ok(()) };
        for script in scripts {
            self.bring_in_version_files(&script.version_id, &script.version).await?;
            let Some(assets) = VersionAssets::read(&script.modules_dir)? else { continue };
            let store = &self.inner.assets;
            let missing = assets.files.values().filter(|a| !store.file(&a.hash).is_file()).map(|asset| -> Move<'_> {
                Box::pin(async move {
                    let bytes =
                        shared.get(&asset_object(&asset.hash)).await.map_err(unavailable("reading an asset"))?;
                    store.store(&asset.hash, asset.content_type.as_deref(), &bytes)
                })
            });
            each(missing.collect()).await?;
        }
        Ok(())
    }

    /// Brings in a version's own files (its modules and its list of assets) if this node lacks
    /// them (nothing on a node of its own).
    pub(crate) async fn bring_in_version_files(&self, version_id: &str, stored: &StoredVersion) -> Result<()> {
        match self.shared() {
            Some(shared) if !self.version_dir(version_id).is_dir() => {
                self.bring_in_version(shared, version_id, stored).await
            }
            _ => Ok(()),
        }
    }

    async fn bring_in_version(&self, shared: &dyn SharedFiles, version_id: &str, stored: &StoredVersion) -> Result<()> {
        // Beside the versions, under a name the start-up sweep removes (no version has it).
        let incoming = self.inner.dir.join("versions").join(format!(".incoming-{}", random_hex(6)));
        std::fs::create_dir_all(&incoming).map_err(WorkersError::io(format!("creating {}", incoming.display())))?;
        let mut files: Vec<&str> = stored.modules.iter().map(|m| m.file.as_str()).collect();
        if stored.has_assets {
            files.push(VERSION_FILE);
        }
        let fetches = files.into_iter().map(|file| -> Move<'_> {
            let path = incoming.join(file);
            Box::pin(async move {
                let bytes =
                    shared.get(&version_object(version_id, file)).await.map_err(unavailable("reading a module"))?;
                write_synced(&path, &bytes)
            })
        });
        let fetched = each(fetches.collect()).await.and_then(|()| {
            std::fs::File::open(&incoming)
                .and_then(|d| d.sync_all())
                .and_then(|()| std::fs::rename(&incoming, self.version_dir(version_id)))
                .map_err(WorkersError::io(format!("installing version {version_id}")))
        });
        if fetched.is_err() {
            let _ = std::fs::remove_dir_all(&incoming);
        }
        fetched
    }
}

fn read(path: &Path) -> Result<Bytes> {
    std::fs::read(path).map(Bytes::from).map_err(WorkersError::io(format!("reading {}", path.display())))
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .map_err(WorkersError::io(format!("writing {}", path.display())))
}
