//! The registry of deployed Workers: scripts by account and name, their versions (each one
//! upload: its metadata, kept as the JSON the Workers layer wrote), deployments (which version
//! serves), secrets, migration tags, and the Durable Object namespaces their migrations create,
//! rename and delete — all of one deploy in one transaction.

use rusqlite::OptionalExtension;

use crate::durable_objects::{COLUMNS as NAMESPACE_COLUMNS, from_row as namespace_from_row};
use crate::{Catalog, DoNamespace, Error, Result, now_iso, random_hex};

/// A Worker script as the catalog records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerScript {
    /// The storage id: 32 hex characters naming the script's directory (never the name).
    pub id: String,
    /// The owning account.
    pub account_id: String,
    /// The name, unique within the account.
    pub name: String,
    /// ISO 8601 time of the first upload.
    pub created_on: String,
    /// ISO 8601 time of the last change.
    pub modified_on: String,
    /// The tag of the last Durable Object migration applied.
    pub migration_tag: Option<String>,
    /// Whether the script is served on its workers.dev-style subdomain.
    pub subdomain_enabled: bool,
    /// Whether previews are served there.
    pub previews_enabled: bool,
    /// The version the current deployment serves.
    pub deployed_version: Option<String>,
}

/// One upload of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerVersion {
    /// A UUID.
    pub id: String,
    /// The script.
    pub script_id: String,
    /// 1, 2, …: the order of uploads.
    pub number: i64,
    /// ISO 8601 upload time.
    pub created_on: String,
    /// What uploaded it (`wrangler`, `api`).
    pub source: String,
    /// The Workers layer's description of the version, as JSON.
    pub metadata: String,
    /// Annotations (`workers/message`, `workers/tag`, `workers/triggered_by`), as JSON.
    pub annotations: Option<String>,
}

/// A deployment: from its time on, one version serves all requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerDeployment {
    /// A UUID.
    pub id: String,
    /// The script.
    pub script_id: String,
    /// The version it serves.
    pub version_id: String,
    /// ISO 8601 time.
    pub created_on: String,
    /// What made it (`wrangler`, `api`).
    pub source: String,
    /// Annotations, as JSON.
    pub annotations: Option<String>,
}

/// A change a Durable Object migration makes to the script's namespaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceChange {
    /// The class starts implementing Durable Objects (`new_sqlite_classes`, `new_classes`): a
    /// namespace `<script>_<class>` hosted by workerd, or the script's existing one for that
    /// class taken over.
    Create {
        /// The exported class.
        class_name: String,
        /// The key its object ids derive from.
        unique_key: String,
        /// Whether its storage has the SQL API (`new_sqlite_classes`).
        use_sqlite: bool,
    },
    /// The class is renamed; its objects stay (`renamed_classes`).
    Rename {
        /// The old class name.
        from: String,
        /// The new one.
        to: String,
    },
    /// The class and its objects go (`deleted_classes`).
    Delete {
        /// The class name.
        class_name: String,
    },
}

/// Who runs a namespace's objects: one owner per file, so never both.
pub const HOST_KURA: &str = "kura";
/// Objects of JavaScript classes, run by the workerd kura supervises.
pub const HOST_WORKERD: &str = "workerd";

/// A cron schedule of a script (its Cron Trigger).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSchedule {
    /// The script.
    pub script_id: String,
    /// The expression, exactly as configured.
    pub cron: String,
    /// When it was first set (ISO 8601).
    pub created_on: String,
    /// When it was last set.
    pub modified_on: String,
    /// The last minute (Unix seconds) it fired for.
    pub fired_minute: Option<i64>,
}

/// An upload to record.
#[derive(Debug, Clone)]
pub struct NewWorkerVersion<'a> {
    /// The account.
    pub account_id: &'a str,
    /// The script, created on its first upload.
    pub script_name: &'a str,
    /// The version's id, chosen by the caller (its files are written first).
    pub version_id: &'a str,
    /// The version's description, as JSON.
    pub metadata: &'a str,
    /// What uploaded it.
    pub source: &'a str,
    /// Annotations, as JSON.
    pub annotations: Option<&'a str>,
    /// Whether the version also becomes the deployment.
    pub deploy: bool,
    /// The migration tag to record, when the upload carried migrations.
    pub migration_tag: Option<&'a str>,
    /// The tag the upload's migrations expect to find (`old_tag`), checked in the transaction.
    pub expected_tag: Option<Option<&'a str>>,
    /// Secrets the upload sets.
    pub secrets: &'a [(String, String)],
    /// Namespace changes of its migrations, in order.
    pub namespaces: &'a [NamespaceChange],
}

/// What recording an upload did.
#[derive(Debug, Clone)]
pub struct RecordedVersion {
    /// The script as it is now.
    pub script: WorkerScript,
    /// The new version.
    pub version: WorkerVersion,
    /// The new deployment, if the version was deployed.
    pub deployment: Option<WorkerDeployment>,
    /// Namespaces the migrations deleted (their files are the caller's to remove).
    pub deleted_namespaces: Vec<DoNamespace>,
}

/// A script name, as Cloudflare allows: 1 to 63 lowercase letters, digits, `-` or `_`,
/// starting with a letter or digit.
pub fn is_valid_script_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'_')
}

/// A secret's or binding's name: 1 to 255 bytes of letters, digits and `_`, starting with a
/// letter or `_` (a JavaScript identifier, as `env.NAME` needs).
pub fn is_valid_binding_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=255).contains(&bytes.len())
        && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_' || bytes[0] == b'$')
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'$')
}

const SCRIPT_COLUMNS: &str = "id, account_id, name, created_on, modified_on, migration_tag, subdomain_enabled, \
                              previews_enabled, deployed_version";

fn script_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<WorkerScript> {
    Ok(WorkerScript {
        id: row.get(0)?,
        account_id: row.get(1)?,
        name: row.get(2)?,
        created_on: row.get(3)?,
        modified_on: row.get(4)?,
        migration_tag: row.get(5)?,
        subdomain_enabled: row.get(6)?,
        previews_enabled: row.get(7)?,
        deployed_version: row.get(8)?,
    })
}

const VERSION_COLUMNS: &str = "id, script_id, number, created_on, source, metadata, annotations";

fn version_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<WorkerVersion> {
    Ok(WorkerVersion {
        id: row.get(0)?,
        script_id: row.get(1)?,
        number: row.get(2)?,
        created_on: row.get(3)?,
        source: row.get(4)?,
        metadata: row.get(5)?,
        annotations: row.get(6)?,
    })
}

const DEPLOYMENT_COLUMNS: &str = "id, script_id, version_id, created_on, source, annotations";

fn deployment_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<WorkerDeployment> {
    Ok(WorkerDeployment {
        id: row.get(0)?,
        script_id: row.get(1)?,
        version_id: row.get(2)?,
        created_on: row.get(3)?,
        source: row.get(4)?,
        annotations: row.get(5)?,
    })
}

fn script_in(tx: &rusqlite::Connection, account_id: &str, name: &str) -> rusqlite::Result<Option<WorkerScript>> {
    tx.prepare_cached(&format!("SELECT {SCRIPT_COLUMNS} FROM workers_scripts WHERE account_id = ?1 AND name = ?2"))?
        .query_row([account_id, name], script_from_row)
        .optional()
}

fn insert_deployment(
    tx: &rusqlite::Connection,
    script_id: &str,
    version_id: &str,
    source: &str,
    annotations: Option<&str>,
) -> rusqlite::Result<WorkerDeployment> {
    let deployment = WorkerDeployment {
        id: uuid::Uuid::new_v4().to_string(),
        script_id: script_id.to_owned(),
        version_id: version_id.to_owned(),
        created_on: now_iso(),
        source: source.to_owned(),
        annotations: annotations.map(str::to_owned),
    };
    let d = &deployment;
    tx.execute(
        &format!("INSERT INTO workers_deployments ({DEPLOYMENT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"),
        (&d.id, &d.script_id, &d.version_id, &d.created_on, &d.source, &d.annotations),
    )?;
    tx.execute(
        "UPDATE workers_scripts SET deployed_version = ?2, modified_on = ?3 WHERE id = ?1",
        (script_id, version_id, &d.created_on),
    )?;
    Ok(deployment)
}

impl Catalog {
    /// The account's script called `name`.
    pub fn worker_script(&self, account_id: &str, name: &str) -> Result<Option<WorkerScript>> {
        self.read(|c| script_in(c, account_id, name))
    }

    /// The script with this storage id.
    pub fn worker_script_by_id(&self, id: &str) -> Result<Option<WorkerScript>> {
        self.read(|c| {
            c.prepare_cached(&format!("SELECT {SCRIPT_COLUMNS} FROM workers_scripts WHERE id = ?1"))?
                .query_row([id], script_from_row)
                .optional()
        })
    }

    /// The id of every version of every script (to find files no version owns).
    pub fn all_worker_version_ids(&self) -> Result<Vec<String>> {
        self.read(|c| c.prepare_cached("SELECT id FROM workers_versions")?.query_map([], |r| r.get(0))?.collect())
    }

    /// The account's scripts in name order.
    pub fn list_worker_scripts(&self, account_id: &str) -> Result<Vec<WorkerScript>> {
        self.read_current(|c| {
            c.prepare_cached(&format!(
                "SELECT {SCRIPT_COLUMNS} FROM workers_scripts WHERE account_id = ?1 ORDER BY name"
            ))?
            .query_map([account_id], script_from_row)?
            .collect()
        })
    }

    /// Every deployed script of every account (what the runtime serves).
    pub fn deployed_worker_scripts(&self) -> Result<Vec<WorkerScript>> {
        self.read(|c| {
            c.prepare_cached(&format!(
                "SELECT {SCRIPT_COLUMNS} FROM workers_scripts WHERE deployed_version IS NOT NULL ORDER BY account_id, name"
            ))?
            .query_map([], script_from_row)?
            .collect()
        })
    }

    /// Records an upload: the script (created on its first upload), the version, its secrets,
    /// its migrations' namespace changes and, if asked, a deployment of it — all or nothing.
    pub fn record_worker_version(&self, new: &NewWorkerVersion<'_>) -> Result<RecordedVersion> {
        if !is_valid_script_name(new.script_name) {
            return Err(Error::Invalid(format!("invalid script name '{}'", new.script_name)));
        }
        self.write_checked(|tx| {
            let storage = |e| self.storage(e);
            let now = now_iso();
            let script = match script_in(tx, new.account_id, new.script_name).map_err(storage)? {
                Some(script) => script,
                None => {
                    let id = random_hex(16);
                    tx.execute(
                        "INSERT INTO workers_scripts (id, account_id, name, created_on, modified_on) \
                         VALUES (?1, ?2, ?3, ?4, ?4)",
                        (&id, new.account_id, new.script_name, &now),
                    )
                    .map_err(storage)?;
                    script_in(tx, new.account_id, new.script_name).map_err(storage)?.expect("just inserted")
                }
            };
            if let Some(expected) = new.expected_tag
                && expected != script.migration_tag.as_deref()
            {
                return Err(Error::Conflict(format!(
                    "Migration tag precondition failed; current tag is {}",
                    script.migration_tag.as_deref().unwrap_or("(none)")
                )));
            }
            let number: i64 = tx
                .query_row(
                    "SELECT COALESCE(MAX(number), 0) + 1 FROM workers_versions WHERE script_id = ?1",
                    [&script.id],
                    |r| r.get(0),
                )
                .map_err(storage)?;
            let version = WorkerVersion {
                id: new.version_id.to_owned(),
                script_id: script.id.clone(),
                number,
                created_on: now.clone(),
                source: new.source.to_owned(),
                metadata: new.metadata.to_owned(),
                annotations: new.annotations.map(str::to_owned),
            };
            let v = &version;
            tx.execute(
                &format!("INSERT INTO workers_versions ({VERSION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                (&v.id, &v.script_id, v.number, &v.created_on, &v.source, &v.metadata, &v.annotations),
            )
            .map_err(storage)?;
            for (name, text) in new.secrets {
                set_secret(tx, &script.id, name, text).map_err(storage)?;
            }
            let deleted_namespaces = self.apply_namespace_changes(tx, &script, new.namespaces)?;
            if let Some(tag) = new.migration_tag {
                tx.execute("UPDATE workers_scripts SET migration_tag = ?2 WHERE id = ?1", (&script.id, tag))
                    .map_err(storage)?;
            }
            tx.execute("UPDATE workers_scripts SET modified_on = ?2 WHERE id = ?1", (&script.id, &now))
                .map_err(storage)?;
            let deployment = if new.deploy {
                Some(insert_deployment(tx, &script.id, &version.id, new.source, new.annotations).map_err(storage)?)
            } else {
                None
            };
            let script = script_in(tx, new.account_id, new.script_name).map_err(storage)?.expect("exists");
            Ok(RecordedVersion { script, version, deployment, deleted_namespaces })
        })
    }

    fn apply_namespace_changes(
        &self,
        tx: &rusqlite::Transaction<'_>,
        script: &WorkerScript,
        changes: &[NamespaceChange],
    ) -> Result<Vec<DoNamespace>> {
        let storage = |e| self.storage(e);
        let find = |class: &str| -> Result<Option<DoNamespace>> {
            tx.prepare_cached(&format!(
                "SELECT {NAMESPACE_COLUMNS} FROM do_namespaces WHERE account_id = ?1 AND script = ?2 AND class_name = ?3"
            ))
            .and_then(|mut s| s.query_row((&script.account_id, &script.name, class), namespace_from_row).optional())
            .map_err(storage)
        };
        let mut deleted = Vec::new();
        for change in changes {
            match change {
                NamespaceChange::Create { class_name, unique_key, use_sqlite } => {
                    if find(class_name)?.is_some() {
                        tx.execute(
                            "UPDATE do_namespaces SET host = ?4, use_sqlite = ?5 \
                             WHERE account_id = ?1 AND script = ?2 AND class_name = ?3",
                            (&script.account_id, &script.name, class_name, HOST_WORKERD, use_sqlite),
                        )
                        .map_err(storage)?;
                        continue;
                    }
                    let name = format!("{}_{class_name}", script.name);
                    let taken = tx
                        .query_row(
                            "SELECT 1 FROM do_namespaces WHERE account_id = ?1 AND name = ?2",
                            [&script.account_id, &name],
                            |_| Ok(()),
                        )
                        .optional()
                        .map_err(storage)?;
                    if taken.is_some() {
                        return Err(Error::Conflict(format!(
                            "a Durable Object namespace named '{name}' already exists and belongs to no class of this script"
                        )));
                    }
                    insert_hosted(tx, &script.account_id, &script.name, class_name, unique_key, *use_sqlite)
                        .map_err(storage)?;
                }
                NamespaceChange::Rename { from, to } => {
                    if find(from)?.is_none() {
                        return Err(Error::Invalid(format!(
                            "Cannot apply renamed_classes migration to class '{from}': it is not a Durable Object class of this script"
                        )));
                    }
                    if find(to)?.is_some() {
                        return Err(Error::Invalid(format!(
                            "Cannot apply renamed_classes migration: class '{to}' already implements Durable Objects"
                        )));
                    }
                    // Its name follows the class, as `<script>_<class>`, unless someone named it.
                    tx.execute(
                        "UPDATE do_namespaces SET class_name = ?4, \
                         name = CASE WHEN name = ?2 || '_' || ?3 THEN ?2 || '_' || ?4 ELSE name END \
                         WHERE account_id = ?1 AND script = ?2 AND class_name = ?3",
                        (&script.account_id, &script.name, from, to),
                    )
                    .map_err(storage)?;
                }
                NamespaceChange::Delete { class_name } => {
                    let Some(namespace) = find(class_name)? else {
                        return Err(Error::Invalid(format!(
                            "Cannot apply deleted_classes migration to class '{class_name}': it is not a Durable Object class of this script"
                        )));
                    };
                    tx.execute("DELETE FROM do_namespaces WHERE id = ?1", [&namespace.id]).map_err(storage)?;
                    deleted.push(namespace);
                }
            }
        }
        Ok(deleted)
    }

    /// Registers the namespace `<script>_<class>` for objects workerd will run once the script
    /// is deployed with that class (objects imported from `wrangler dev`).
    pub fn create_hosted_do_namespace(
        &self,
        account_id: &str,
        script: &str,
        class_name: &str,
        unique_key: &str,
    ) -> Result<DoNamespace> {
        if !is_valid_script_name(script) || !crate::is_valid_namespace_name(class_name) {
            return Err(Error::Invalid(format!("'{script}' and '{class_name}' make no namespace name")));
        }
        let id = self.write_checked(|tx| {
            let name = format!("{script}_{class_name}");
            let taken = tx
                .query_row(
                    "SELECT 1 FROM do_namespaces WHERE account_id = ?1 AND name = ?2",
                    [account_id, &name],
                    |_| Ok(()),
                )
                .optional()
                .map_err(|e| self.storage(e))?;
            if taken.is_some() {
                return Err(Error::Duplicate { kind: "namespace" });
            }
            insert_hosted(tx, account_id, script, class_name, unique_key, true).map_err(|e| self.storage(e))
        })?;
        Ok(self.do_namespace(account_id, &id)?.expect("just created"))
    }

    /// Makes `version_id` (a version of the script) the deployment.
    pub fn deploy_worker_version(
        &self,
        script: &WorkerScript,
        version_id: &str,
        source: &str,
        annotations: Option<&str>,
    ) -> Result<WorkerDeployment> {
        self.write_checked(|tx| {
            let belongs = tx
                .query_row(
                    "SELECT 1 FROM workers_versions WHERE id = ?1 AND script_id = ?2",
                    [version_id, &script.id],
                    |_| Ok(()),
                )
                .optional()
                .map_err(|e| self.storage(e))?;
            if belongs.is_none() {
                return Err(Error::Invalid(format!("no version '{version_id}' of script '{}'", script.name)));
            }
            insert_deployment(tx, &script.id, version_id, source, annotations).map_err(|e| self.storage(e))
        })
    }

    /// A version of the script.
    pub fn worker_version(&self, script_id: &str, version_id: &str) -> Result<Option<WorkerVersion>> {
        self.read(|c| {
            c.prepare_cached(&format!(
                "SELECT {VERSION_COLUMNS} FROM workers_versions WHERE script_id = ?1 AND id = ?2"
            ))?
            .query_row([script_id, version_id], version_from_row)
            .optional()
        })
    }

    /// The script's versions, newest first.
    pub fn worker_versions(&self, script_id: &str) -> Result<Vec<WorkerVersion>> {
        self.read_current(|c| {
            c.prepare_cached(&format!(
                "SELECT {VERSION_COLUMNS} FROM workers_versions WHERE script_id = ?1 ORDER BY number DESC"
            ))?
            .query_map([script_id], version_from_row)?
            .collect()
        })
    }

    /// The script's deployments, newest first.
    pub fn worker_deployments(&self, script_id: &str) -> Result<Vec<WorkerDeployment>> {
        self.read_current(|c| {
            c.prepare_cached(&format!(
                "SELECT {DEPLOYMENT_COLUMNS} FROM workers_deployments WHERE script_id = ?1 ORDER BY rowid DESC"
            ))?
            .query_map([script_id], deployment_from_row)?
            .collect()
        })
    }

    /// Deletes a script with its versions, deployments and secrets; its Durable Object
    /// namespaces stay (with their objects), so deploying it again finds them. False if the
    /// account has no such script.
    pub fn delete_worker_script(&self, account_id: &str, name: &str) -> Result<bool> {
        let deleted = self.write(|tx| {
            let Some(script) = script_in(tx, account_id, name)? else { return Ok(false) };
            for table in ["workers_schedules", "workers_secrets", "workers_deployments", "workers_versions"] {
                tx.execute(&format!("DELETE FROM {table} WHERE script_id = ?1"), [&script.id])?;
            }
            tx.execute("DELETE FROM workers_scripts WHERE id = ?1", [&script.id])?;
            Ok(true)
        })?;
        Ok(deleted)
    }

    /// Records whether the script is served on its subdomain.
    pub fn set_worker_subdomain(&self, script_id: &str, enabled: bool, previews_enabled: bool) -> Result<()> {
        self.write(|tx| {
            tx.execute(
                "UPDATE workers_scripts SET subdomain_enabled = ?2, previews_enabled = ?3 WHERE id = ?1",
                (script_id, enabled, previews_enabled),
            )
        })?;
        Ok(())
    }

    /// Sets one secret of the script.
    pub fn set_worker_secret(&self, script_id: &str, name: &str, text: &str) -> Result<()> {
        if !is_valid_binding_name(name) {
            return Err(Error::Invalid(format!("invalid secret name '{name}'")));
        }
        self.write(|tx| {
            set_secret(tx, script_id, name, text)?;
            tx.execute("UPDATE workers_scripts SET modified_on = ?2 WHERE id = ?1", (script_id, now_iso()))
        })?;
        Ok(())
    }

    /// Deletes one secret; false if the script has no such secret.
    pub fn delete_worker_secret(&self, script_id: &str, name: &str) -> Result<bool> {
        let n = self.write(|tx| {
            tx.execute("DELETE FROM workers_secrets WHERE script_id = ?1 AND name = ?2", [script_id, name])
        })?;
        Ok(n == 1)
    }

    /// Replaces the script's cron schedules with `crons` (in the order given, duplicates once);
    /// a schedule kept keeps its creation time and the minute it last fired.
    pub fn set_worker_schedules(&self, script_id: &str, crons: &[String]) -> Result<Vec<WorkerSchedule>> {
        self.write(|tx| {
            let now = now_iso();
            let kept: Vec<&String> = crons.iter().collect();
            let existing: Vec<String> = tx
                .prepare("SELECT cron FROM workers_schedules WHERE script_id = ?1")?
                .query_map([script_id], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            for cron in existing.iter().filter(|c| !kept.contains(c)) {
                tx.execute("DELETE FROM workers_schedules WHERE script_id = ?1 AND cron = ?2", [script_id, cron])?;
            }
            for cron in crons {
                tx.execute(
                    "INSERT INTO workers_schedules (script_id, cron, created_on, modified_on) VALUES (?1, ?2, ?3, ?3) \
                     ON CONFLICT (script_id, cron) DO UPDATE SET modified_on = excluded.modified_on",
                    (script_id, cron, &now),
                )?;
            }
            Ok(())
        })?;
        let mut schedules = self.worker_schedules(script_id)?;
        schedules.sort_by_key(|s| crons.iter().position(|c| *c == s.cron));
        Ok(schedules)
    }

    /// The script's cron schedules.
    pub fn worker_schedules(&self, script_id: &str) -> Result<Vec<WorkerSchedule>> {
        self.read(|c| {
            c.prepare_cached(
                "SELECT script_id, cron, created_on, modified_on, fired_minute FROM workers_schedules \
                 WHERE script_id = ?1 ORDER BY created_on, cron",
            )?
            .query_map([script_id], schedule_row)?
            .collect()
        })
    }

    /// Every schedule of every deployed script, for the scheduler.
    pub fn deployed_worker_schedules(&self) -> Result<Vec<WorkerSchedule>> {
        self.read(|c| {
            c.prepare_cached(
                "SELECT s.script_id, s.cron, s.created_on, s.modified_on, s.fired_minute FROM workers_schedules s \
                 JOIN workers_scripts w ON w.id = s.script_id WHERE w.deployed_version IS NOT NULL \
                 ORDER BY s.script_id, s.cron",
            )?
            .query_map([], schedule_row)?
            .collect()
        })
    }

    /// Claims `minute` (Unix seconds, a whole minute) for the schedule: true when it was not
    /// fired for that minute or a later one, and now counts as fired. Claimed before the
    /// handler runs, so a minute fires at most once whatever restarts.
    pub fn claim_worker_schedule_minute(&self, script_id: &str, cron: &str, minute: i64) -> Result<bool> {
        // Every node of a cluster tries each minute's claim; the losers' writes change nothing
        // and are not published.
        let claimed = self.write_rows(|tx| {
            tx.execute(
                "UPDATE workers_schedules SET fired_minute = ?3 WHERE script_id = ?1 AND cron = ?2 \
                 AND (fired_minute IS NULL OR fired_minute < ?3)",
                (script_id, cron, minute),
            )
        })?;
        Ok(claimed == 1)
    }

    /// The script's secrets (name, text), in name order.
    pub fn worker_secrets(&self, script_id: &str) -> Result<Vec<(String, String)>> {
        self.read(|c| {
            c.prepare_cached("SELECT name, text FROM workers_secrets WHERE script_id = ?1 ORDER BY name")?
                .query_map([script_id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
    }
}

fn schedule_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<WorkerSchedule> {
    Ok(WorkerSchedule {
        script_id: r.get(0)?,
        cron: r.get(1)?,
        created_on: r.get(2)?,
        modified_on: r.get(3)?,
        fired_minute: r.get(4)?,
    })
}

fn insert_hosted(
    tx: &rusqlite::Connection,
    account_id: &str,
    script: &str,
    class_name: &str,
    unique_key: &str,
    use_sqlite: bool,
) -> rusqlite::Result<String> {
    let id = random_hex(16);
    tx.execute(
        "INSERT INTO do_namespaces (id, account_id, name, script, class_name, unique_key, created_at, host, use_sqlite) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        (&id, account_id, format!("{script}_{class_name}"), script, class_name, unique_key, now_iso(), HOST_WORKERD, use_sqlite),
    )?;
    Ok(id)
}

fn set_secret(tx: &rusqlite::Connection, script_id: &str, name: &str, text: &str) -> rusqlite::Result<usize> {
    tx.execute(
        "INSERT INTO workers_secrets (script_id, name, text) VALUES (?1, ?2, ?3) \
         ON CONFLICT (script_id, name) DO UPDATE SET text = excluded.text",
        (script_id, name, text),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> (tempfile::TempDir, Catalog, String) {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path().join("c.sqlite")).unwrap();
        let account = catalog.create_account(None, "a").unwrap();
        (dir, catalog, account.id)
    }

    fn upload<'a>(account: &'a str, id: &'a str, namespaces: &'a [NamespaceChange]) -> NewWorkerVersion<'a> {
        NewWorkerVersion {
            account_id: account,
            script_name: "chat",
            version_id: id,
            metadata: "{}",
            source: "wrangler",
            annotations: None,
            deploy: true,
            migration_tag: None,
            expected_tag: None,
            secrets: &[],
            namespaces,
        }
    }

    #[test]
    fn names() {
        assert!(is_valid_script_name("my-worker_2"));
        for bad in ["", "My", "-a", "a b", &"a".repeat(64)] {
            assert!(!is_valid_script_name(bad), "{bad}");
        }
        assert!(is_valid_binding_name("API_KEY") && is_valid_binding_name("_x1"));
        assert!(!is_valid_binding_name("1A") && !is_valid_binding_name("a-b") && !is_valid_binding_name(""));
    }

    #[test]
    fn versions_deployments_and_migrations() {
        let (_dir, catalog, account) = catalog();
        let create =
            [NamespaceChange::Create { class_name: "Room".into(), unique_key: "chat-Room".into(), use_sqlite: true }];
        let first = catalog
            .record_worker_version(&NewWorkerVersion { migration_tag: Some("v1"), ..upload(&account, "v-1", &create) })
            .unwrap();
        assert_eq!(first.script.migration_tag.as_deref(), Some("v1"));
        assert_eq!(first.script.deployed_version.as_deref(), Some("v-1"));
        let ns = catalog.do_namespace(&account, "chat_Room").unwrap().unwrap();
        assert_eq!((ns.unique_key.as_str(), ns.host.as_str()), ("chat-Room", HOST_WORKERD));

        // A migration expecting another tag changes nothing.
        let rename = [NamespaceChange::Rename { from: "Room".into(), to: "Lobby".into() }];
        let stale = NewWorkerVersion {
            expected_tag: Some(None),
            migration_tag: Some("v2"),
            ..upload(&account, "v-2", &rename)
        };
        assert!(matches!(catalog.record_worker_version(&stale), Err(Error::Conflict(_))));
        assert!(catalog.worker_version(&first.script.id, "v-2").unwrap().is_none());

        let renamed = NewWorkerVersion { expected_tag: Some(Some("v1")), ..stale };
        let second = catalog.record_worker_version(&renamed).unwrap();
        assert_eq!(second.version.number, 2);
        assert!(catalog.do_namespace(&account, "chat_Room").unwrap().is_none(), "the name follows the class");
        let ns = catalog.do_namespace(&account, "chat_Lobby").unwrap().unwrap();
        assert_eq!((ns.class_name.as_str(), ns.unique_key.as_str()), ("Lobby", "chat-Room"));

        let versions = catalog.worker_versions(&first.script.id).unwrap();
        assert_eq!(versions.iter().map(|v| v.number).collect::<Vec<_>>(), [2, 1]);
        let back = catalog.deploy_worker_version(&second.script, "v-1", "api", None).unwrap();
        assert_eq!(catalog.worker_deployments(&first.script.id).unwrap()[0].id, back.id);
        assert!(catalog.deploy_worker_version(&second.script, "nope", "api", None).is_err());

        let delete = [NamespaceChange::Delete { class_name: "Lobby".into() }];
        let third = catalog.record_worker_version(&upload(&account, "v-3", &delete)).unwrap();
        assert_eq!(third.deleted_namespaces.len(), 1);
        assert!(catalog.do_namespace(&account, "chat_Lobby").unwrap().is_none());
    }

    #[test]
    fn secrets_and_deletion() {
        let (_dir, catalog, account) = catalog();
        let secrets = [("API_KEY".to_owned(), "s3cr3t".to_owned())];
        let recorded = catalog
            .record_worker_version(&NewWorkerVersion { secrets: &secrets, ..upload(&account, "v-1", &[]) })
            .unwrap();
        let id = recorded.script.id;
        catalog.set_worker_secret(&id, "OTHER", "x").unwrap();
        assert_eq!(catalog.worker_secrets(&id).unwrap().len(), 2);
        assert!(catalog.delete_worker_secret(&id, "OTHER").unwrap());
        assert!(!catalog.delete_worker_secret(&id, "OTHER").unwrap());
        assert!(catalog.set_worker_secret(&id, "bad-name", "x").is_err());
        assert!(catalog.delete_worker_script(&account, "chat").unwrap());
        assert!(catalog.worker_script(&account, "chat").unwrap().is_none());
        assert!(catalog.worker_secrets(&id).unwrap().is_empty());
        assert!(!catalog.delete_worker_script(&account, "chat").unwrap());
    }

    #[test]
    fn schedules_replace_keep_their_last_minute_and_fire_each_minute_once() {
        let (_dir, catalog, account) = catalog();
        let script = catalog.record_worker_version(&upload(&account, "v-1", &[])).unwrap().script;
        let crons = |list: &[&str]| list.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        let set = catalog.set_worker_schedules(&script.id, &crons(&["*/5 * * * *", "0 17 * * sun"])).unwrap();
        assert_eq!(set.iter().map(|s| s.cron.as_str()).collect::<Vec<_>>(), ["*/5 * * * *", "0 17 * * sun"]);
        assert_eq!(catalog.deployed_worker_schedules().unwrap().len(), 2);

        assert!(catalog.claim_worker_schedule_minute(&script.id, "*/5 * * * *", 600).unwrap());
        assert!(!catalog.claim_worker_schedule_minute(&script.id, "*/5 * * * *", 600).unwrap(), "a minute fires once");
        assert!(!catalog.claim_worker_schedule_minute(&script.id, "*/5 * * * *", 300).unwrap(), "never an earlier one");
        assert!(
            catalog.claim_worker_schedule_minute(&script.id, "0 17 * * sun", 600).unwrap(),
            "each schedule its own"
        );

        // Set again (a redeploy): the kept schedule remembers the minute it fired.
        let again = catalog.set_worker_schedules(&script.id, &crons(&["*/5 * * * *"])).unwrap();
        assert_eq!((again.len(), again[0].fired_minute), (1, Some(600)));
        assert!(!catalog.claim_worker_schedule_minute(&script.id, "*/5 * * * *", 600).unwrap());
        assert!(catalog.set_worker_schedules(&script.id, &[]).unwrap().is_empty(), "an empty list clears them");

        catalog.set_worker_schedules(&script.id, &crons(&["* * * * *"])).unwrap();
        assert!(catalog.delete_worker_script(&account, "chat").unwrap());
        assert!(catalog.worker_schedules(&script.id).unwrap().is_empty(), "deleted with the script");
    }
}
