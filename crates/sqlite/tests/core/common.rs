//! A registry of databases in a fresh directory, with helpers to run SQL on one of them.

pub use std::sync::Arc;
pub use std::time::Duration;

pub use kura_sqlite::{
    Access, Bookmark, DatabaseOptions, Error, HistorySettings, Registry, RegistrySettings, Request, Restored,
    ResultMode, Statement, StatementResult, TRANSACTION_MESSAGE, Value,
};

pub struct Context {
    pub dir: tempfile::TempDir,
    pub registry: Registry,
}

impl Context {
    pub fn new() -> Self {
        Self::with_settings(RegistrySettings::default())
    }

    pub fn with_settings(settings: RegistrySettings) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        let registry = Registry::new(settings, move |key: &str| {
            Some(DatabaseOptions::new(root.join(format!("{key}.sqlite"))).create(true))
        });
        Context { dir, registry }
    }

    /// Databases that keep a history, each in a directory of its own (`<key>/db.sqlite`).
    pub fn with_history(settings: HistorySettings) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        let registry = Registry::new(RegistrySettings::default(), move |key: &str| {
            let dir = root.join(key);
            std::fs::create_dir_all(&dir).unwrap();
            Some(DatabaseOptions::new(dir.join("db.sqlite")).create(true).history(settings.clone(), key))
        });
        Context { dir, registry }
    }

    pub async fn run(&self, sql: &str) -> Result<Vec<StatementResult>, Error> {
        self.registry.execute("db", Request::new(vec![Statement::new(sql)])).await
    }

    pub async fn run_params(&self, sql: &str, params: Vec<Value>) -> Result<Vec<StatementResult>, Error> {
        self.registry.execute("db", Request::new(vec![Statement::with_params(sql, params)])).await
    }

    pub async fn ok(&self, sql: &str) -> Vec<StatementResult> {
        self.run(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub async fn err(&self, sql: &str) -> String {
        match self.run(sql).await {
            Ok(r) => panic!("{sql} succeeded: {r:?}"),
            Err(e) => e.to_string(),
        }
    }

    pub async fn scalar(&self, sql: &str) -> Value {
        let results = self.ok(sql).await;
        results.last().unwrap().rows[0][0].clone()
    }
}
