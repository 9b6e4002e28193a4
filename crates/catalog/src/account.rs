//! Accounts: the tenants that own tokens and resources.

use rusqlite::OptionalExtension;

use crate::{Catalog, Error, Result, now_iso, random_hex};

/// An account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// 32 lowercase hex characters when kura chose it; whatever `KURA_ACCOUNT_ID` said otherwise.
    pub id: String,
    /// A human name.
    pub name: String,
    /// ISO 8601 creation time.
    pub created_at: String,
}

/// Account ids are what wrangler accepts in `CLOUDFLARE_ACCOUNT_ID`: 1–32 of `A-Za-z0-9_-`.
pub fn is_valid_account_id(id: &str) -> bool {
    (1..=32).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn account_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Account> {
    Ok(Account { id: row.get(0)?, name: row.get(1)?, created_at: row.get(2)? })
}

impl Catalog {
    /// Creates an account; with `id` it takes exactly that id, otherwise a random one.
    pub fn create_account(&self, id: Option<&str>, name: &str) -> Result<Account> {
        let id = match id {
            Some(id) if !is_valid_account_id(id) => {
                return Err(Error::Invalid(format!(
                    "invalid account id '{id}': use 1 to 32 letters, digits, '_' or '-'"
                )));
            }
            Some(id) => id.to_owned(),
            None => random_hex(16),
        };
        let account = Account { id, name: name.to_owned(), created_at: now_iso() };
        self.write_checked(|tx| {
            let exists: bool = tx
                .query_row("SELECT 1 FROM accounts WHERE id = ?1", [&account.id], |_| Ok(true))
                .optional()
                .map_err(|e| self.storage(e))?
                .unwrap_or(false);
            if exists {
                return Err(Error::Duplicate { kind: "account" });
            }
            tx.execute(
                "INSERT INTO accounts (id, name, created_at) VALUES (?1, ?2, ?3)",
                (&account.id, &account.name, &account.created_at),
            )
            .map_err(|e| self.storage(e))?;
            Ok(())
        })?;
        Ok(account)
    }

    /// The account with this id.
    pub fn account(&self, id: &str) -> Result<Option<Account>> {
        self.read_found(|c| {
            c.prepare_cached("SELECT id, name, created_at FROM accounts WHERE id = ?1")?
                .query_row([id], account_from_row)
                .optional()
        })
    }

    /// Every account, oldest first.
    pub fn accounts(&self) -> Result<Vec<Account>> {
        self.read(|c| {
            c.prepare_cached("SELECT id, name, created_at FROM accounts ORDER BY created_at, rowid")?
                .query_map([], account_from_row)?
                .collect()
        })
    }

    /// The oldest account: the one local commands use when none is named.
    pub fn default_account(&self) -> Result<Option<Account>> {
        Ok(self.accounts()?.into_iter().next())
    }
}
