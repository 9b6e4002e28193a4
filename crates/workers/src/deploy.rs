//! Uploads and what follows them: resolving an upload's bindings against the account (with
//! Cloudflare's errors for what is missing), its migrations into namespace changes, its modules
//! into files, a check by workerd, then one catalog transaction and a restart — so a bad deploy
//! changes nothing and the previous version serves on. Also deployments of earlier versions,
//! deletion and secrets.

use std::collections::{HashMap, HashSet};
use std::io::Write;

use kura_catalog::{NamespaceChange, NewWorkerVersion, WorkerDeployment, WorkerScript, WorkerVersion};
use sha2::Digest;

use crate::Workers;
use crate::assets::{AssetsConfig, VersionAssets};
use crate::config::{HostedClass, ServedScript};
use crate::error::{Result, WorkersError};
use crate::served::{hosted_class, is_usable_unique_key};
use crate::version::{Binding, Migrations, ModuleKind, StoredModule, StoredVersion, Upload, UploadedBinding};

/// The most bytes one upload's modules may take.
pub const MAX_SCRIPT_BYTES: usize = 64 * 1024 * 1024;

/// How an upload is handled.
#[derive(Debug, Clone)]
pub struct UploadOptions {
    /// Whether the version becomes the deployment (`PUT scripts/{name}`) or only a version
    /// (`POST scripts/{name}/versions`).
    pub deploy: bool,
    /// `bindings_inherit=strict`: an `inherit` binding the previous version lacks is an error
    /// (otherwise it is dropped).
    pub strict_inherit: bool,
    /// What uploaded it (`wrangler`, `api`).
    pub source: String,
}

/// What an upload did.
#[derive(Debug, Clone)]
pub struct Uploaded {
    /// The script as it is now.
    pub script: WorkerScript,
    /// The new version.
    pub version: WorkerVersion,
    /// Its description.
    pub stored: StoredVersion,
    /// The deployment, if it was deployed.
    pub deployment: Option<WorkerDeployment>,
}

fn missing(code: u32, message: String) -> WorkersError {
    WorkersError::MissingTarget { code, message }
}

fn is_class_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 255
        && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_' || bytes[0] == b'$')
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'$')
}

impl Workers {
    /// Handles an upload of `name` in `account_id`.
    pub async fn upload(
        &self,
        account_id: &str,
        name: &str,
        upload: Upload,
        options: UploadOptions,
    ) -> Result<Uploaded> {
        let _changes = self.inner.changes.lock().await;
        if self.shared().is_some() {
            // What this upload inherits (bindings, assets, the migration tag) is the cluster's
            // newest, not this node's copy of a moment ago.
            self.inner.catalog.refresh()?;
        }
        if !kura_catalog::is_valid_script_name(name) {
            return Err(WorkersError::invalid_upload(format!(
                "'{name}' is not a valid Worker name: use 1 to 63 lowercase letters, digits, '-' or '_'"
            )));
        }
        self.runtime().await?;
        let catalog = &self.inner.catalog;
        let previous = catalog.worker_script(account_id, name)?;
        let previous_version = match previous.as_ref().and_then(|s| s.deployed_version.as_ref().map(|v| (s, v))) {
            Some((script, version)) => catalog
                .worker_version(&script.id, version)?
                .map(|v| StoredVersion::from_json(&v.metadata))
                .transpose()?,
            None => None,
        };
        let metadata = &upload.metadata;

        // Modules, and the assets (an assets-only Worker has no modules). In a cluster, the
        // deployed version's files (whose assets `keep_assets` keeps) may not be here yet.
        if let (Some(script), Some(version)) = (&previous, &previous_version) {
            let deployed = script.deployed_version.clone().unwrap_or_default();
            self.bring_in_version_files(&deployed, version).await?;
        }
        let assets = self.version_assets(account_id, previous.as_ref(), metadata)?;
        let main = check_modules(&upload, assets.is_some())?;
        if main.is_none() && !metadata.bindings.is_empty() {
            return Err(WorkersError::invalid_upload("Cannot use assets with a binding in an assets-only Worker."));
        }
        if main.is_none() && assets.as_ref().is_some_and(|a| a.config.run_worker_first != Default::default()) {
            return Err(WorkersError::invalid_upload("Cannot set run_worker_first without a Worker script."));
        }

        // Bindings: kept ones resolved against the account, secrets aside, inherited ones
        // from the deployed version.
        let mut bindings = Vec::new();
        let mut secrets = Vec::new();
        let mut names = HashSet::new();
        for value in &metadata.bindings {
            let binding = UploadedBinding::parse(value)?;
            if !names.insert(binding.name().to_owned()) {
                return Err(WorkersError::invalid_upload(format!("binding name '{}' is used twice", binding.name())));
            }
            match binding {
                UploadedBinding::Kept(b) => bindings.push(b),
                UploadedBinding::Secret { name, text } => secrets.push((name, text)),
                UploadedBinding::Inherit { name: inherited } => {
                    let found =
                        previous_version.as_ref().and_then(|v| v.bindings.iter().find(|b| b.name() == inherited));
                    let is_secret = match &previous {
                        Some(script) => catalog.worker_secrets(&script.id)?.iter().any(|(n, _)| *n == inherited),
                        None => false,
                    };
                    match found {
                        Some(b) => bindings.push(b.clone()),
                        None if is_secret => {}
                        None if options.strict_inherit => {
                            return Err(WorkersError::invalid_upload(format!(
                                "binding '{inherited}' cannot be inherited: the deployed version has no binding of that name"
                            )));
                        }
                        None => {}
                    }
                }
            }
        }
        if let Some(previous_version) = &previous_version {
            let keep: HashSet<&str> = metadata.keep_bindings.iter().map(String::as_str).collect();
            for b in &previous_version.bindings {
                if keep.contains(b.type_name()) && !names.contains(b.name()) {
                    names.insert(b.name().to_owned());
                    bindings.push(b.clone());
                }
            }
        }

        // Migrations, then the classes the script will implement.
        let script_tag = previous.as_ref().and_then(|s| s.migration_tag.clone());
        let changes = match &metadata.migrations {
            Some(migrations) => self.migration_changes(account_id, name, previous.as_ref(), migrations)?,
            None => Vec::new(),
        };
        let classes = self.classes_after(account_id, name, previous.as_ref(), &changes)?;
        self.check_bindings(account_id, name, &bindings, &classes)?;
        if let Some(binding) = bindings.iter().find(|b| matches!(b, Binding::Assets { .. }))
            && assets.is_none()
        {
            return Err(WorkersError::invalid_upload(format!(
                "binding {} is of type assets, but the upload has no assets: give the Worker an [assets] directory",
                binding.name()
            )));
        }

        // The files, then the check, then the catalog.
        let version_id = uuid::Uuid::new_v4().to_string();
        let stored = self.write_version(&version_id, &upload, main, bindings, assets.as_ref())?;
        let candidate = ServedScript {
            id: previous.as_ref().map_or_else(|| "0".repeat(32), |s| s.id.clone()),
            account_id: account_id.to_owned(),
            name: name.to_owned(),
            version_id: version_id.clone(),
            version_created_on: String::new(),
            version: stored.clone(),
            modules_dir: self.version_dir(&version_id),
            secrets: Vec::new(),
            classes,
        };
        // Shared before it is recorded: a node that finds the version in the catalog finds its files.
        let checked = match self.check(&candidate).await {
            Ok(()) => self.share_version(&version_id, &stored, assets.as_ref()).await,
            Err(e) => Err(e),
        };
        let recorded = match checked {
            Ok(()) => {
                let annotations =
                    metadata.annotations.as_ref().map(|a| serde_json::Value::Object(a.clone()).to_string());
                let migrations = metadata.migrations.as_ref();
                catalog
                    .record_worker_version(&NewWorkerVersion {
                        account_id,
                        script_name: name,
                        version_id: &version_id,
                        metadata: &stored.to_json(),
                        source: &options.source,
                        annotations: annotations.as_deref(),
                        deploy: options.deploy,
                        migration_tag: migrations.and_then(|m| m.new_tag.as_deref()),
                        expected_tag: migrations.map(|_| script_tag.as_deref()),
                        secrets: &secrets,
                        namespaces: &changes,
                    })
                    .map_err(|e| match e {
                        kura_catalog::Error::Conflict(m) => WorkersError::MigrationConflict(m),
                        other => other.into(),
                    })
            }
            Err(e) => Err(e),
        };
        let recorded = match recorded {
            Ok(r) => {
                if let Some(jwt) = metadata.assets.as_ref().and_then(|a| a["jwt"].as_str()) {
                    self.inner.assets.consume(jwt);
                }
                r
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(self.version_dir(&version_id));
                return Err(e);
            }
        };
        if options.deploy || !secrets.is_empty() || !changes.is_empty() {
            self.apply_or_roll_back(previous.as_ref(), &recorded.script).await?;
        }
        for namespace in &recorded.deleted_namespaces {
            let dir = self.inner.do_root.join(&namespace.id);
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(namespace = namespace.name, error = %e, "could not remove a deleted class's objects");
            }
        }
        Ok(Uploaded { script: recorded.script, version: recorded.version, stored, deployment: recorded.deployment })
    }

    /// Restarts workerd on the catalog as it is; should workerd refuse it, deploys the version
    /// that served before again.
    async fn apply_or_roll_back(&self, before: Option<&WorkerScript>, after: &WorkerScript) -> Result<()> {
        let Err(e) = self.reload().await else { return Ok(()) };
        if let Some(version) = before.and_then(|s| s.deployed_version.as_deref())
            && after.deployed_version.as_deref() != Some(version)
        {
            self.inner.catalog.deploy_worker_version(after, version, "kura", None)?;
            if let Err(again) = self.reload().await {
                tracing::error!(error = %again, "the previous version would not run either");
            }
        }
        Err(e)
    }

    /// The namespace changes an upload's migrations make.
    fn migration_changes(
        &self,
        account_id: &str,
        script_name: &str,
        previous: Option<&WorkerScript>,
        migrations: &Migrations,
    ) -> Result<Vec<NamespaceChange>> {
        let existing: Vec<_> = self
            .inner
            .catalog
            .list_do_namespaces(account_id)?
            .into_iter()
            .filter(|n| n.script.as_deref() == Some(script_name))
            .collect();
        let mut classes: HashSet<String> = existing
            .iter()
            .filter(|n| n.hosted_by_workerd() && previous.is_some())
            .map(|n| n.class_name.clone())
            .collect();
        let mut changes = Vec::new();
        for step in &migrations.steps {
            if !step.transferred_classes.is_empty() {
                return Err(WorkersError::invalid_upload("kura does not support transferred_classes migrations"));
            }
            let created =
                step.new_sqlite_classes.iter().map(|c| (c, true)).chain(step.new_classes.iter().map(|c| (c, false)));
            for (class, use_sqlite) in created {
                if !is_class_name(class) {
                    return Err(WorkersError::invalid_upload(format!("'{class}' is not a valid class name")));
                }
                if !classes.insert(class.clone()) {
                    return Err(WorkersError::invalid_upload(format!(
                        "Cannot apply new-class migration to class '{class}' that is already a Durable Object class of this script"
                    )));
                }
                let adopted = existing.iter().find(|n| n.class_name == *class);
                if let Some(namespace) = adopted {
                    if !namespace.hosted_by_workerd() && self.engine_holds_objects(&namespace.id) {
                        return Err(WorkersError::invalid_upload(format!(
                            "class '{class}' of '{script_name}' is the namespace '{}', whose objects kura's own engine holds \
                             (made over HTTP or with kura do); a namespace is served by kura or by workerd, never both",
                            namespace.name
                        )));
                    }
                    if !is_usable_unique_key(&namespace.unique_key) {
                        return Err(WorkersError::invalid_upload(format!(
                            "the namespace '{}' has a unique key workerd cannot store objects under",
                            namespace.name
                        )));
                    }
                }
                changes.push(NamespaceChange::Create {
                    class_name: class.clone(),
                    unique_key: format!("{script_name}-{class}"),
                    use_sqlite,
                });
            }
            for rename in &step.renamed_classes {
                if !is_class_name(&rename.to) || !classes.remove(&rename.from) || !classes.insert(rename.to.clone()) {
                    return Err(WorkersError::invalid_upload(format!(
                        "Cannot apply renamed_classes migration from '{}' to '{}'",
                        rename.from, rename.to
                    )));
                }
                changes.push(NamespaceChange::Rename { from: rename.from.clone(), to: rename.to.clone() });
            }
            for class in &step.deleted_classes {
                if !classes.remove(class) {
                    return Err(WorkersError::invalid_upload(format!(
                        "Cannot apply deleted_classes migration to class '{class}': it is not a Durable Object class of this script"
                    )));
                }
                changes.push(NamespaceChange::Delete { class_name: class.clone() });
            }
        }
        Ok(changes)
    }

    /// Whether kura's engine keeps objects in a namespace's directory (its `xx/` shards).
    fn engine_holds_objects(&self, namespace_id: &str) -> bool {
        std::fs::read_dir(self.inner.do_root.join(namespace_id)).is_ok_and(|entries| {
            entries.flatten().any(|e| e.file_name().len() == 2 && e.file_type().is_ok_and(|t| t.is_dir()))
        })
    }

    /// The classes a script implements once `changes` apply.
    fn classes_after(
        &self,
        account_id: &str,
        script_name: &str,
        previous: Option<&WorkerScript>,
        changes: &[NamespaceChange],
    ) -> Result<Vec<HostedClass>> {
        let mut classes: Vec<HostedClass> = match previous {
            Some(script) => self.hosted_classes(script)?,
            None => Vec::new(),
        };
        let existing = self.inner.catalog.list_do_namespaces(account_id)?;
        for change in changes {
            match change {
                NamespaceChange::Create { class_name, unique_key, use_sqlite } => {
                    let adopted = existing
                        .iter()
                        .find(|n| n.script.as_deref() == Some(script_name) && n.class_name == *class_name);
                    classes.push(match adopted {
                        Some(namespace) => HostedClass { use_sqlite: *use_sqlite, ..hosted_class(namespace) },
                        None => HostedClass {
                            class_name: class_name.clone(),
                            unique_key: unique_key.clone(),
                            namespace_id: String::new(),
                            use_sqlite: *use_sqlite,
                        },
                    });
                }
                NamespaceChange::Rename { from, to } => {
                    if let Some(class) = classes.iter_mut().find(|c| c.class_name == *from) {
                        class.class_name = to.clone();
                    }
                }
                NamespaceChange::Delete { class_name } => classes.retain(|c| c.class_name != *class_name),
            }
        }
        Ok(classes)
    }

    /// Every binding must name something the account has, as Cloudflare checks at upload.
    fn check_bindings(
        &self,
        account_id: &str,
        script_name: &str,
        bindings: &[Binding],
        classes: &[HostedClass],
    ) -> Result<()> {
        let catalog = &self.inner.catalog;
        let mut scripts: HashMap<String, Option<WorkerScript>> = HashMap::new();
        let mut script = |name: &str| -> Result<Option<WorkerScript>> {
            if let Some(found) = scripts.get(name) {
                return Ok(found.clone());
            }
            let found = catalog.worker_script(account_id, name)?.filter(|s| s.deployed_version.is_some());
            scripts.insert(name.to_owned(), found.clone());
            Ok(found)
        };
        for binding in bindings {
            match binding {
                Binding::D1 { name, id } => {
                    if catalog.d1_database_by_uuid(id)?.is_none_or(|d| d.account_id != account_id) {
                        return Err(missing(
                            10181,
                            format!(
                                "D1 binding '{name}' references database '{id}' which was not found. Verify the database \
                                 exists in your account and that the database_id in your configuration is correct."
                            ),
                        ));
                    }
                }
                Binding::R2Bucket { bucket_name, .. } => {
                    if catalog.r2_bucket(account_id, bucket_name)?.is_none() {
                        return Err(missing(
                            10085,
                            format!("R2 bucket '{bucket_name}' not found. Please use a different name and try again."),
                        ));
                    }
                }
                Binding::Queue { queue_name, delivery_delay, .. } => {
                    if let Some(delay) = delivery_delay.filter(|d| *d > kura_queues::MAX_DELAY_SECONDS) {
                        return Err(WorkersError::invalid_upload(format!(
                            "the producer binding of queue {queue_name} has delivery_delay {delay}: at most {} seconds",
                            kura_queues::MAX_DELAY_SECONDS
                        )));
                    }
                    if catalog.queue(account_id, queue_name)?.is_none_or(|q| q.name != *queue_name) {
                        return Err(missing(
                            10104,
                            format!(
                                "Queue \"{queue_name}\" does not exist. To create it, run: wrangler queues create {queue_name}"
                            ),
                        ));
                    }
                }
                Binding::KvNamespace { namespace_id, .. } => {
                    if catalog.kv_namespace(account_id, namespace_id)?.is_none() {
                        return Err(missing(10041, format!("KV namespace '{namespace_id}' is not valid.")));
                    }
                }
                Binding::DurableObjectNamespace { class_name, script_name: other, .. } => {
                    let implemented = match other.as_deref().filter(|o| *o != script_name) {
                        None => classes.iter().any(|c| c.class_name == *class_name),
                        Some(other) => match script(other)? {
                            Some(target) => self.class_namespace(&target, class_name)?.is_some(),
                            None => false,
                        },
                    };
                    if !implemented {
                        return Err(missing(
                            10061,
                            format!(
                                "Cannot create binding for class '{class_name}' because it is not currently configured to \
                                 implement Durable Objects. Ensure a --new-class migration has been applied to it."
                            ),
                        ));
                    }
                }
                Binding::Service { name, service, .. } => {
                    if service != script_name && script(service)?.is_none() {
                        return Err(missing(
                            10144,
                            format!("Could not resolve service binding '{name}'. Target script '{service}' not found."),
                        ));
                    }
                }
                Binding::PlainText { .. }
                | Binding::Json { .. }
                | Binding::VersionMetadata { .. }
                | Binding::Assets { .. } => {}
            }
        }
        Ok(())
    }

    /// Writes the upload's modules (each synced, then the directory) and describes them.
    fn write_version(
        &self,
        version_id: &str,
        upload: &Upload,
        main: Option<ModuleEntry>,
        bindings: Vec<Binding>,
        assets: Option<&VersionAssets>,
    ) -> Result<StoredVersion> {
        let dir = self.version_dir(version_id);
        std::fs::create_dir_all(&dir).map_err(WorkersError::io(format!("creating {}", dir.display())))?;
        let mut modules = Vec::new();
        let mut etag = sha2::Sha256::new();
        // The entry first: workerd takes the first module as the main one.
        let mut order: Vec<&crate::version::UploadedModule> = upload.modules.iter().collect();
        order.sort_by_key(|m| main.as_ref().is_none_or(|main| m.name != main.name));
        for (i, module) in order.into_iter().enumerate() {
            let file = i.to_string();
            let mut out = std::fs::File::create(dir.join(&file)).map_err(WorkersError::io("writing a module"))?;
            out.write_all(&module.bytes).and_then(|()| out.sync_all()).map_err(WorkersError::io("writing a module"))?;
            etag.update((module.name.len() as u64).to_be_bytes());
            etag.update(module.name.as_bytes());
            etag.update((module.bytes.len() as u64).to_be_bytes());
            etag.update(&module.bytes);
            modules.push(StoredModule {
                name: module.name.clone(),
                kind: module.kind,
                file,
                size: module.bytes.len() as u64,
            });
        }
        if let Some(assets) = assets {
            assets.write(&dir)?;
        }
        std::fs::File::open(&dir).and_then(|d| d.sync_all()).map_err(WorkersError::io("syncing a version"))?;
        let metadata = &upload.metadata;
        Ok(StoredVersion {
            format: StoredVersion::FORMAT,
            main_module: main.as_ref().filter(|m| !m.service_worker).map(|m| m.name.clone()),
            body_part: main.as_ref().filter(|m| m.service_worker).map(|m| m.name.clone()),
            modules,
            compatibility_date: metadata.compatibility_date.clone(),
            compatibility_flags: metadata.compatibility_flags.clone(),
            bindings,
            usage_model: metadata.usage_model.clone().unwrap_or_else(|| "standard".to_owned()),
            etag: hex::encode(etag.finalize()),
            has_assets: assets.is_some(),
        })
    }

    /// The assets an upload gives its version: those of its finished upload session, the
    /// previous version's (`keep_assets`), or none.
    fn version_assets(
        &self,
        account_id: &str,
        previous: Option<&WorkerScript>,
        metadata: &crate::version::UploadMetadata,
    ) -> Result<Option<VersionAssets>> {
        if let Some(assets) = &metadata.assets {
            let jwt = assets["jwt"].as_str().ok_or_else(|| {
                WorkersError::invalid_upload("`assets` needs the `jwt` of a finished asset upload session")
            })?;
            let files = self.inner.assets.completed(account_id, jwt)?;
            return Ok(Some(VersionAssets { files, config: AssetsConfig::parse(&assets["config"])? }));
        }
        match previous.and_then(|s| s.deployed_version.as_deref()) {
            Some(version) if metadata.keep_assets == Some(true) => VersionAssets::read(&self.version_dir(version)),
            _ => Ok(None),
        }
    }

    /// Makes an earlier version of the script the deployment.
    pub async fn deploy_version(
        &self,
        account_id: &str,
        name: &str,
        version_id: &str,
        annotations: Option<&str>,
    ) -> Result<WorkerDeployment> {
        let _changes = self.inner.changes.lock().await;
        let script = self.inner.catalog.worker_script(account_id, name)?.ok_or(WorkersError::ScriptNotFound)?;
        if self.inner.catalog.worker_version(&script.id, version_id)?.is_none() {
            return Err(WorkersError::NotFound(format!("no version '{version_id}' of the Worker '{name}'")));
        }
        self.runtime().await?;
        // The version must run with the classes the script has now (a rollback past a
        // migration may lack one): workerd checks it before anything changes.
        let version = self.inner.catalog.worker_version(&script.id, version_id)?.expect("checked above");
        let candidate = ServedScript {
            id: script.id.clone(),
            account_id: account_id.to_owned(),
            name: name.to_owned(),
            version_id: version_id.to_owned(),
            version_created_on: version.created_on.clone(),
            version: StoredVersion::from_json(&version.metadata)?,
            modules_dir: self.version_dir(version_id),
            secrets: Vec::new(),
            classes: self.hosted_classes(&script)?,
        };
        // In a cluster, a version uploaded through another node has its files here first.
        self.bring_in(std::slice::from_ref(&candidate)).await?;
        self.check(&candidate).await?;
        let deployment = self.inner.catalog.deploy_worker_version(&script, version_id, "wrangler", annotations)?;
        let after = self.inner.catalog.worker_script(account_id, name)?.ok_or(WorkersError::ScriptNotFound)?;
        self.apply_or_roll_back(Some(&script), &after).await?;
        Ok(deployment)
    }

    /// Deletes a script and stops serving it; its Durable Object namespaces stay. False if the
    /// account has no such script.
    pub async fn delete(&self, account_id: &str, name: &str) -> Result<bool> {
        let _changes = self.inner.changes.lock().await;
        let Some(script) = self.inner.catalog.worker_script(account_id, name)? else { return Ok(false) };
        let versions = self.inner.catalog.worker_versions(&script.id)?;
        let script_had_assets =
            versions.iter().any(|v| self.version_dir(&v.id).join(crate::assets::VERSION_FILE).is_file());
        self.inner.catalog.delete_worker_script(account_id, name)?;
        if self.inner.runtime.get().is_some() {
            self.reload().await?;
        } else {
            self.reload().await.ok();
        }
        let stored: Vec<(String, StoredVersion)> = versions
            .iter()
            .filter_map(|v| StoredVersion::from_json(&v.metadata).ok().map(|s| (v.id.clone(), s)))
            .collect();
        self.forget_shared_versions(&stored).await;
        for version in versions {
            let _ = std::fs::remove_dir_all(self.version_dir(&version.id));
        }
        let _ = std::fs::remove_dir_all(self.inner.layout.disks_dir.join(&script.id));
        self.inner.logs.forget(&script.id);
        self.inner.tails.close_all(&script.id);
        if script_had_assets {
            let workers = self.clone();
            match tokio::task::spawn_blocking(move || workers.sweep_assets()).await {
                Ok(Err(e)) => tracing::warn!(error = %e, "could not remove a deleted Worker's asset files"),
                Err(e) => tracing::warn!(error = %e, "the asset sweep failed"),
                Ok(Ok(())) => {}
            }
        }
        Ok(true)
    }

    /// Sets a secret; a deployed script restarts with it.
    pub async fn set_secret(&self, account_id: &str, name: &str, secret: &str, text: &str) -> Result<()> {
        let _changes = self.inner.changes.lock().await;
        let script = self.inner.catalog.worker_script(account_id, name)?.ok_or(WorkersError::ScriptNotFound)?;
        self.inner.catalog.set_worker_secret(&script.id, secret, text)?;
        if script.deployed_version.is_some() {
            self.reload().await?;
        }
        Ok(())
    }

    /// Deletes a secret; false if the script has none of that name.
    pub async fn delete_secret(&self, account_id: &str, name: &str, secret: &str) -> Result<bool> {
        let _changes = self.inner.changes.lock().await;
        let script = self.inner.catalog.worker_script(account_id, name)?.ok_or(WorkersError::ScriptNotFound)?;
        let deleted = self.inner.catalog.delete_worker_secret(&script.id, secret)?;
        if deleted && script.deployed_version.is_some() {
            self.reload().await?;
        }
        Ok(deleted)
    }

    /// The names of a script's secrets.
    pub fn secret_names(&self, account_id: &str, name: &str) -> Result<Vec<String>> {
        let script = self.inner.catalog.worker_script(account_id, name)?.ok_or(WorkersError::ScriptNotFound)?;
        Ok(self.inner.catalog.worker_secrets(&script.id)?.into_iter().map(|(n, _)| n).collect())
    }

    /// The deployed version's entry module, as uploaded.
    pub fn module_source(&self, script: &WorkerScript, stored: &StoredVersion) -> Result<Vec<u8>> {
        let version = script.deployed_version.as_deref().ok_or(WorkersError::ScriptNotFound)?;
        let entry = stored.modules.first().ok_or(WorkersError::ScriptNotFound)?;
        std::fs::read(self.version_dir(version).join(&entry.file)).map_err(WorkersError::io("reading a module"))
    }

    /// A version's description.
    pub fn stored_version(&self, version: &WorkerVersion) -> Result<StoredVersion> {
        StoredVersion::from_json(&version.metadata)
    }
}

/// The upload's entry: its module and whether it is a service-worker script.
struct ModuleEntry {
    name: String,
    service_worker: bool,
}

/// The upload's entry module; `None` for an assets-only Worker (no modules, `has_assets`).
fn check_modules(upload: &Upload, has_assets: bool) -> Result<Option<ModuleEntry>> {
    let metadata = &upload.metadata;
    if upload.modules.is_empty() && has_assets && metadata.main_module.is_none() && metadata.body_part.is_none() {
        return Ok(None);
    }
    if upload.modules.is_empty() {
        return Err(WorkersError::invalid_upload("the upload has no script: add the Worker's modules as form parts"));
    }
    let mut names = HashSet::new();
    let mut total = 0;
    for module in &upload.modules {
        if module.name.is_empty() || module.name.len() > 1024 || !names.insert(module.name.as_str()) {
            return Err(WorkersError::invalid_upload(format!(
                "module name '{}' is empty, too long or used twice",
                module.name
            )));
        }
        total += module.bytes.len();
    }
    if total > MAX_SCRIPT_BYTES {
        return Err(WorkersError::invalid_upload(format!(
            "the script is {total} bytes; kura accepts up to {MAX_SCRIPT_BYTES} bytes of modules"
        )));
    }
    let (name, service_worker) = match (&metadata.main_module, &metadata.body_part) {
        (Some(main), _) => (main.clone(), false),
        (None, Some(body)) => (body.clone(), true),
        (None, None) => {
            return Err(WorkersError::invalid_upload("the metadata names neither main_module nor body_part"));
        }
    };
    let Some(entry) = upload.modules.iter().find(|m| m.name == name) else {
        return Err(WorkersError::invalid_upload(format!("the upload has no part for its main module '{name}'")));
    };
    let expected = if service_worker { ModuleKind::CommonJs } else { ModuleKind::EsModule };
    if entry.kind != expected && !(service_worker && entry.kind == ModuleKind::EsModule) {
        return Err(WorkersError::invalid_upload(format!(
            "the main module '{name}' must be sent as {}, not {}",
            expected.content_type(),
            entry.kind.content_type()
        )));
    }
    Ok(Some(ModuleEntry { name, service_worker }))
}
