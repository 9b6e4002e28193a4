//! From the catalog to a running configuration: the deployed scripts with their versions,
//! secrets and Durable Object classes, the disks those classes store their objects on, and the
//! routing table of the Workers listener.

use std::path::Path;

use kura_catalog::{DoNamespace, WorkerScript};

use crate::config::{self, HostedClass, Purpose, ServedScript};
use crate::error::{Result, WorkersError};
use crate::version::StoredVersion;
use crate::{Workers, proxy};

/// A unique key workerd may use as a directory name: it names the namespace's directory on the
/// class's disk.
pub(crate) fn is_usable_unique_key(key: &str) -> bool {
    (1..=200).contains(&key.len())
        && !key.starts_with('.')
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'$'))
}

pub(crate) fn hosted_class(namespace: &DoNamespace) -> HostedClass {
    HostedClass {
        class_name: namespace.class_name.clone(),
        unique_key: namespace.unique_key.clone(),
        namespace_id: namespace.id.clone(),
        use_sqlite: namespace.use_sqlite,
    }
}

impl Workers {
    /// The classes a script implements in workerd, as the catalog has them now.
    pub(crate) fn hosted_classes(&self, script: &WorkerScript) -> Result<Vec<HostedClass>> {
        Ok(self
            .inner
            .catalog
            .list_do_namespaces(&script.account_id)?
            .iter()
            .filter(|n| n.hosted_by_workerd() && n.script.as_deref() == Some(&script.name))
            .map(hosted_class)
            .collect())
    }

    /// Every deployed script, ready to configure.
    pub(crate) fn served_scripts(&self) -> Result<Vec<ServedScript>> {
        let catalog = &self.inner.catalog;
        let mut served = Vec::new();
        for script in catalog.deployed_worker_scripts()? {
            let version_id = script.deployed_version.clone().expect("deployed scripts have a version");
            let Some(version) = catalog.worker_version(&script.id, &version_id)? else {
                tracing::error!(
                    script = script.name,
                    version = version_id,
                    "the deployed version is missing; not serving it"
                );
                continue;
            };
            served.push(ServedScript {
                version: StoredVersion::from_json(&version.metadata)?,
                version_created_on: version.created_on,
                modules_dir: self.version_dir(&version_id),
                secrets: catalog.worker_secrets(&script.id)?,
                classes: self.hosted_classes(&script)?,
                id: script.id,
                account_id: script.account_id,
                name: script.name,
                version_id,
            });
        }
        Ok(served)
    }

    /// Makes each script's disk hold one link per class, to the class's objects directory.
    fn prepare_disks(&self, scripts: &[ServedScript]) -> Result<()> {
        let disks = &self.inner.layout.disks_dir;
        for script in scripts.iter().filter(|s| !s.classes.is_empty()) {
            let disk = disks.join(&script.id);
            let _ = std::fs::remove_dir_all(&disk);
            std::fs::create_dir_all(&disk).map_err(WorkersError::io(format!("creating {}", disk.display())))?;
            for class in &script.classes {
                let objects = self.inner.do_root.join(&class.namespace_id).join("workerd");
                std::fs::create_dir_all(&objects)
                    .map_err(WorkersError::io(format!("creating {}", objects.display())))?;
                link(&objects, &disk.join(&class.unique_key))?;
            }
        }
        Ok(())
    }

    /// Writes the configuration of what is deployed now and has workerd run it. Callers hold
    /// the change lock.
    pub(crate) async fn reload(&self) -> Result<()> {
        let scripts = self.served_scripts()?;
        // In a cluster, a version deployed through another node has its files here first.
        self.bring_in(&scripts).await?;
        let Some(runtime) = self.inner.runtime.get() else {
            self.set_routes(&scripts);
            return Ok(());
        };
        self.prepare_disks(&scripts)?;
        let config = config::render(&self.layout_for(runtime), &scripts, Purpose::Serve);
        runtime.apply(config).await?;
        self.set_routes(&scripts);
        let mut running: Vec<_> =
            scripts.iter().map(|s| (s.account_id.clone(), s.name.clone(), s.version_id.clone())).collect();
        running.sort();
        *self.inner.applied.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Applied { fingerprint: fingerprint(&scripts), scripts: running });
        Ok(())
    }

    /// On a cluster's node, until `shutdown`: whenever the shared catalog brings in a copy
    /// that deploys something else (a deploy, rollback, deletion or secret changed through
    /// another node), runs that, as a deploy through this node would. A failure (the store
    /// unreachable) is tried again at the next look.
    pub async fn follow_catalog(self, shutdown: impl std::future::Future<Output = ()>) {
        const LOOK_EVERY: std::time::Duration = std::time::Duration::from_millis(250);
        const AFTER_FAILURES_AT_MOST: std::time::Duration = std::time::Duration::from_secs(8);
        tokio::pin!(shutdown);
        let (mut seen, mut wait) = (None, LOOK_EVERY);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let installs = self.inner.catalog.installs();
            if seen == Some(installs) {
                continue;
            }
            match self.follow_once().await {
                Ok(()) => (seen, wait) = (Some(installs), LOOK_EVERY),
                Err(e) => {
                    // Tried again later and later (the store may be down a while).
                    wait = (wait * 2).min(AFTER_FAILURES_AT_MOST);
                    tracing::warn!(error = %e, retry_in = ?wait, "cannot run what the cluster deploys yet");
                }
            }
        }
    }

    async fn follow_once(&self) -> Result<()> {
        let _changes = self.inner.changes.lock().await;
        let scripts = self.served_scripts()?;
        let now = fingerprint(&scripts);
        if self.inner.applied.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|a| &a.fingerprint) == Some(&now) {
            return Ok(());
        }
        if !scripts.is_empty() {
            // The first Worker the cluster deploys: this node fetches workerd as a deploy would.
            self.runtime().await?;
        }
        tracing::info!(scripts = scripts.len(), "running what the cluster deploys now");
        self.reload().await?;
        // A Worker deleted through another node leaves its files here otherwise.
        self.remove_unknown_versions()
    }

    pub(crate) fn set_routes(&self, scripts: &[ServedScript]) {
        // Every deploy, rollback and deletion passes here: a queue's consumer may have become
        // another script (or none).
        self.queues_changed();
        let mut routes = self.inner.routes.write().unwrap_or_else(|p| p.into_inner());
        let domains = std::mem::take(&mut routes.domains);
        let mut by_name = std::collections::HashMap::new();
        for script in scripts {
            by_name.entry(script.name.clone()).or_insert_with(|| script.id.clone());
        }
        *routes = proxy::Routes { by_name, domains };
        drop(routes);
        let mut served = std::collections::HashMap::new();
        for script in scripts.iter().filter(|s| s.version.has_assets) {
            let version = &script.version;
            let date = config::effective_date(version, None);
            let loaded = crate::assets::VersionAssets::read(&script.modules_dir).and_then(|assets| {
                let assets =
                    assets.ok_or_else(|| WorkersError::Storage("the version's assets file is missing".into()))?;
                let has_worker = !version.modules.is_empty();
                crate::assets::serve::ServedAssets::new(
                    assets,
                    has_worker,
                    (&date, &version.compatibility_flags),
                    self.inner.assets.dir().to_owned(),
                )
            });
            match loaded {
                Ok(assets) => {
                    served.insert(script.id.clone(), std::sync::Arc::new(assets));
                }
                Err(e) => tracing::error!(script = script.name, error = %e, "the Worker's assets cannot be served"),
            }
        }
        *self.inner.served_assets.write().unwrap_or_else(|p| p.into_inner()) = served;
    }

    /// Has a workerd of its own run `candidate` (with nothing connected and objects in memory):
    /// whether workerd accepts it, and if not, what it said.
    /// An assets-only version has no code to check.
    pub(crate) async fn check(&self, candidate: &ServedScript) -> Result<()> {
        if candidate.version.modules.is_empty() {
            return Ok(());
        }
        let runtime = self.runtime().await?;
        // Short: its sockets sit one directory below the served ones, within the same budget
        // (see `socket_dir`).
        let name = format!("k{}", &crate::random_hex(3));
        let mut layout = self.layout_for(runtime);
        layout.config_dir = self.inner.dir.join("config").join(format!("check-{name}"));
        layout.socket_dir = self.inner.layout.socket_dir.join(&name);
        let config = config::render(&layout, std::slice::from_ref(candidate), Purpose::Check);
        let outcome = runtime.check(&config, &layout.config_dir).await;
        let _ = std::fs::remove_dir_all(&layout.config_dir);
        let _ = std::fs::remove_dir_all(&layout.socket_dir);
        outcome.map_err(|e| match e {
            WorkersError::ScriptRejected(said) => WorkersError::ScriptRejected(explain_refusal(&said, candidate)),
            other => other,
        })
    }
}

/// workerd's complaint in the user's terms: its service names are kura's, not theirs, and an
/// uncaught exception reads as Cloudflare reports it (`Uncaught Error: … at index.js:2:7`).
fn explain_refusal(said: &str, script: &ServedScript) -> String {
    let service = config::worker_service(&script.id);
    let lines: Vec<String> = said
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.replace(&format!("service {service}: "), "").replace(&service, &script.name))
        .collect();
    match lines.iter().position(|l| l.contains("Uncaught")) {
        Some(first) => lines[first..].join("\n"),
        None => format!("workerd refused the Worker: {}", lines.join("\n")),
    }
}

/// What workerd was last configured with.
pub(crate) struct Applied {
    /// See [`fingerprint`].
    fingerprint: String,
    /// (account, name, version id) of each script, sorted.
    pub(crate) scripts: Vec<(String, String, String)>,
}

/// What a configuration runs, summed up: each script's version, secrets and classes. Two
/// catalogs with the same fingerprint configure workerd the same way.
fn fingerprint(scripts: &[ServedScript]) -> String {
    use sha2::Digest;
    let mut sum = sha2::Sha256::new();
    for script in scripts {
        for part in [&script.id, &script.version_id] {
            sum.update(part.as_bytes());
            sum.update([0]);
        }
        for (name, text) in &script.secrets {
            sum.update(format!("{}:{name}={}:{text}\0", name.len(), text.len()).as_bytes());
        }
        for class in &script.classes {
            sum.update(format!("{}/{}/{}\0", class.namespace_id, class.class_name, class.unique_key).as_bytes());
        }
        sum.update([1]);
    }
    hex::encode(sum.finalize())
}

fn link(target: &Path, at: &Path) -> Result<()> {
    let _ = std::fs::remove_file(at);
    std::os::unix::fs::symlink(target, at).map_err(WorkersError::io(format!("linking {}", at.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_keys_usable_as_directory_names() {
        assert!(is_usable_unique_key("chat-Room") && is_usable_unique_key("my_worker-Room$2"));
        for bad in ["", ".hidden", "a/b", "..", "a b", &"k".repeat(201)] {
            assert!(!is_usable_unique_key(bad), "{bad}");
        }
    }
}
