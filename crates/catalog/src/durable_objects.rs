//! The registry of Durable Object namespaces: which account owns which namespace, its class,
//! the unique key its object ids derive from, and where its alarms are delivered.

use rusqlite::OptionalExtension;

use crate::{Catalog, Error, Result, now_iso, random_hex};

/// A Durable Object namespace as the catalog records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoNamespace {
    /// The storage id: 32 hex characters naming the namespace's directory (never the name).
    pub id: String,
    /// The owning account.
    pub account_id: String,
    /// The name, unique within the account (a binding's namespace, e.g. `ROOMS`).
    pub name: String,
    /// The Worker script the class belongs to, if any.
    pub script: Option<String>,
    /// The class name (`Room`).
    pub class_name: String,
    /// The key object ids derive from; `<script>-<class>` unless given, as Miniflare derives it.
    pub unique_key: String,
    /// Where alarms of objects in this namespace are delivered, as an HTTP POST.
    pub alarm_url: Option<String>,
    /// ISO 8601 creation time.
    pub created_at: String,
    /// Who runs its objects: kura's engine ([`crate::HOST_KURA`]) or workerd
    /// ([`crate::HOST_WORKERD`]), never both.
    pub host: String,
    /// Whether its objects' storage has the SQL API.
    pub use_sqlite: bool,
}

impl DoNamespace {
    /// Whether workerd runs its objects (JavaScript classes of a deployed Worker).
    pub fn hosted_by_workerd(&self) -> bool {
        self.host == crate::HOST_WORKERD
    }
}

/// What a new namespace is made of.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewDoNamespace {
    /// The name.
    pub name: String,
    /// The class name; the name when not given.
    pub class_name: Option<String>,
    /// The Worker script.
    pub script: Option<String>,
    /// The unique key; `<script>-<class>` when not given.
    pub unique_key: Option<String>,
    /// The alarm URL.
    pub alarm_url: Option<String>,
}

/// A namespace or class name: 1 to 64 letters, digits, `_` or `-`, starting with a letter or `_`.
pub fn is_valid_namespace_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=64).contains(&bytes.len())
        && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_')
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-')
}

fn is_valid_alarm_url(url: &str) -> bool {
    (url.starts_with("http://") || url.starts_with("https://"))
        && url.len() <= 2048
        && !url.contains(char::is_whitespace)
}

pub(crate) const COLUMNS: &str =
    "id, account_id, name, script, class_name, unique_key, alarm_url, created_at, host, use_sqlite";

pub(crate) fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<DoNamespace> {
    Ok(DoNamespace {
        id: row.get(0)?,
        account_id: row.get(1)?,
        name: row.get(2)?,
        script: row.get(3)?,
        class_name: row.get(4)?,
        unique_key: row.get(5)?,
        alarm_url: row.get(6)?,
        created_at: row.get(7)?,
        host: row.get(8)?,
        use_sqlite: row.get(9)?,
    })
}

impl Catalog {
    /// Registers a new namespace for an account.
    pub fn create_do_namespace(&self, account_id: &str, new: &NewDoNamespace) -> Result<DoNamespace> {
        if !is_valid_namespace_name(&new.name) {
            return Err(Error::Invalid(format!(
                "invalid namespace name '{}': use 1 to 64 letters, digits, '_' or '-', starting with a letter or '_'",
                new.name
            )));
        }
        let class_name = new.class_name.clone().unwrap_or_else(|| new.name.clone());
        if !is_valid_namespace_name(&class_name) {
            return Err(Error::Invalid(format!("invalid class name '{class_name}'")));
        }
        if let Some(url) = new.alarm_url.as_deref().filter(|u| !is_valid_alarm_url(u)) {
            return Err(Error::Invalid(format!("invalid alarm URL '{url}': use an http:// or https:// URL")));
        }
        let unique_key = match &new.unique_key {
            Some(key) if key.is_empty() || key.len() > 1024 => {
                return Err(Error::Invalid("a unique key must be 1 to 1024 bytes".into()));
            }
            Some(key) => key.clone(),
            None => format!("{}-{class_name}", new.script.as_deref().unwrap_or("")),
        };
        let namespace = DoNamespace {
            id: random_hex(16),
            account_id: account_id.to_owned(),
            name: new.name.clone(),
            script: new.script.clone(),
            class_name,
            unique_key,
            alarm_url: new.alarm_url.clone(),
            created_at: now_iso(),
            host: crate::HOST_KURA.to_owned(),
            use_sqlite: true,
        };
        self.write_checked(|tx| {
            let storage = |e| self.storage(e);
            let taken = tx
                .query_row(
                    "SELECT 1 FROM do_namespaces WHERE account_id = ?1 AND name = ?2",
                    [account_id, &new.name],
                    |_| Ok(()),
                )
                .optional()
                .map_err(storage)?;
            if taken.is_some() {
                return Err(Error::Duplicate { kind: "namespace" });
            }
            // Two namespaces with one unique key would give the same ids to different objects.
            let same_key = tx
                .query_row(
                    "SELECT name FROM do_namespaces WHERE account_id = ?1 AND unique_key = ?2",
                    [account_id, &namespace.unique_key],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map_err(storage)?;
            if let Some(other) = same_key {
                return Err(Error::Conflict(format!(
                    "the namespace '{other}' already has the unique key '{}' (its objects' ids derive from it)",
                    namespace.unique_key
                )));
            }
            let n = &namespace;
            tx.execute(
                &format!("INSERT INTO do_namespaces ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
                (
                    &n.id,
                    &n.account_id,
                    &n.name,
                    &n.script,
                    &n.class_name,
                    &n.unique_key,
                    &n.alarm_url,
                    &n.created_at,
                    &n.host,
                    n.use_sqlite,
                ),
            )
            .map_err(storage)?;
            Ok(())
        })?;
        Ok(namespace)
    }

    /// The account's namespace with this id or name.
    pub fn do_namespace(&self, account_id: &str, id_or_name: &str) -> Result<Option<DoNamespace>> {
        self.remembered(&self.do_namespaces_seen, format!("{account_id}\0{id_or_name}"), || {
            self.read_found(|c| {
                c.prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM do_namespaces WHERE account_id = ?1 AND (id = ?2 OR name = ?2) \
                     ORDER BY id = ?2 DESC LIMIT 1"
                ))?
                .query_row([account_id, id_or_name], from_row)
                .optional()
            })
        })
    }

    /// The account's namespaces in name order.
    pub fn list_do_namespaces(&self, account_id: &str) -> Result<Vec<DoNamespace>> {
        self.read_current(|c| {
            c.prepare_cached(&format!("SELECT {COLUMNS} FROM do_namespaces WHERE account_id = ?1 ORDER BY name"))?
                .query_map([account_id], from_row)?
                .collect()
        })
    }

    /// Every namespace of every account (for the alarm scheduler).
    pub fn all_do_namespaces(&self) -> Result<Vec<DoNamespace>> {
        self.read(|c| {
            c.prepare_cached(&format!("SELECT {COLUMNS} FROM do_namespaces ORDER BY id"))?
                .query_map([], from_row)?
                .collect()
        })
    }

    /// Sets or clears a namespace's alarm URL; false if the account has no such namespace.
    pub fn set_do_alarm_url(&self, account_id: &str, id: &str, url: Option<&str>) -> Result<bool> {
        if let Some(url) = url.filter(|u| !is_valid_alarm_url(u)) {
            return Err(Error::Invalid(format!("invalid alarm URL '{url}': use an http:// or https:// URL")));
        }
        let changed = self.write(|tx| {
            tx.execute(
                "UPDATE do_namespaces SET alarm_url = ?3 WHERE account_id = ?1 AND id = ?2",
                (account_id, id, url),
            )
        })?;
        Ok(changed == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names() {
        for good in ["ROOMS", "Room", "_x", "a-b_c1"] {
            assert!(is_valid_namespace_name(good), "{good}");
        }
        for bad in ["", "1abc", "a b", "a/b", "..", &"a".repeat(65)] {
            assert!(!is_valid_namespace_name(bad), "{bad}");
        }
    }

    #[test]
    fn unique_key_defaults_as_miniflare_derives_it() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::open(dir.path().join("c.sqlite")).unwrap();
        let account = catalog.create_account(None, "a").unwrap();
        let new = NewDoNamespace {
            name: "COUNTERS".into(),
            class_name: Some("Counter".into()),
            script: Some("my-worker".into()),
            ..Default::default()
        };
        let ns = catalog.create_do_namespace(&account.id, &new).unwrap();
        assert_eq!(ns.unique_key, "my-worker-Counter");
        assert!(matches!(catalog.create_do_namespace(&account.id, &new), Err(Error::Duplicate { .. })));
        let bare = catalog
            .create_do_namespace(&account.id, &NewDoNamespace { name: "MyDurableObject".into(), ..Default::default() })
            .unwrap();
        assert_eq!(bare.unique_key, "-MyDurableObject");
        assert_eq!(catalog.do_namespace(&account.id, &ns.id).unwrap().unwrap().name, "COUNTERS");
        assert_eq!(catalog.do_namespace(&account.id, "COUNTERS").unwrap().unwrap().id, ns.id);
        assert!(catalog.do_namespace("other", "COUNTERS").unwrap().is_none());
    }
}
