//! The catalog against a real file: accounts, tokens and D1 records, from two connections.

use kura_catalog::{Catalog, Error, NewD1Database, Scope, UsageDelta};

fn open() -> (tempfile::TempDir, Catalog) {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::open(dir.path().join("catalog.sqlite")).unwrap();
    (dir, catalog)
}

fn new_db<'a>(account: &'a str, name: &'a str) -> NewD1Database<'a> {
    NewD1Database { account_id: account, name, max_per_account: 3, ..Default::default() }
}

#[test]
fn tokens_authenticate_until_revoked_and_only_for_their_account() {
    let (dir, catalog) = open();
    let a = catalog.create_account(None, "a").unwrap();
    let b = catalog.create_account(Some("team-b"), "b").unwrap();
    assert_eq!(a.id.len(), 32);
    let (token, secret) = catalog.create_token(&a.id, "ci", Scope::D1Read, None).unwrap();
    let found = catalog.authenticate(&secret).unwrap().unwrap();
    assert_eq!(
        (found.id.as_str(), found.account_id.as_str(), found.scope),
        (token.id.as_str(), a.id.as_str(), Scope::D1Read)
    );
    assert!(catalog.authenticate("not-a-token-at-all").unwrap().is_none());

    // A second connection (another process, say) revokes it; the first sees it at once.
    let other = Catalog::open(dir.path().join("catalog.sqlite")).unwrap();
    assert!(!other.revoke_token(&b.id, &token.id).unwrap(), "another account cannot revoke it");
    assert!(other.revoke_token(&a.id, &token.id).unwrap());
    assert!(catalog.authenticate(&secret).unwrap().is_none());
    assert!(catalog.tokens(&a.id).unwrap()[0].revoked_at.is_some());

    // Authenticated tokens are remembered, never past a revocation through this catalog.
    let (second, secret) = catalog.create_token(&a.id, "ci-2", Scope::Admin, None).unwrap();
    for _ in 0..3 {
        assert_eq!(catalog.authenticate(&secret).unwrap().unwrap().id, second.id);
    }
    assert!(catalog.revoke_token(&a.id, &second.id).unwrap());
    assert!(catalog.authenticate(&secret).unwrap().is_none());
}

#[test]
fn configured_tokens_are_pinned_to_their_account() {
    let (_dir, catalog) = open();
    let a = catalog.create_account(Some("acct-a"), "a").unwrap();
    let b = catalog.create_account(Some("acct-b"), "b").unwrap();
    let t = catalog.ensure_admin_token(&a.id, "configured-secret-0123456789").unwrap();
    assert_eq!(catalog.ensure_admin_token(&a.id, "configured-secret-0123456789").unwrap().id, t.id);
    assert!(matches!(catalog.ensure_admin_token(&b.id, "configured-secret-0123456789"), Err(Error::Conflict(_))));
    assert!(matches!(catalog.ensure_admin_token(&a.id, "short"), Err(Error::Invalid(_))));
    assert!(matches!(catalog.create_account(Some("acct-a"), "again"), Err(Error::Duplicate { .. })));
    assert!(matches!(catalog.create_account(Some("bad id!"), "x"), Err(Error::Invalid(_))));
}

#[test]
fn databases_have_unique_names_per_account_and_a_limit() {
    let (_dir, catalog) = open();
    let a = catalog.create_account(None, "a").unwrap();
    let b = catalog.create_account(None, "b").unwrap();
    let db = catalog.create_d1_database(&new_db(&a.id, "prod")).unwrap();
    assert!(matches!(catalog.create_d1_database(&new_db(&a.id, "prod")), Err(Error::Duplicate { .. })));
    catalog.create_d1_database(&new_db(&b.id, "prod")).unwrap();
    assert!(matches!(catalog.create_d1_database(&new_db(&a.id, "bad name")), Err(Error::Invalid(_))));
    catalog.create_d1_database(&new_db(&a.id, "staging")).unwrap();
    catalog.create_d1_database(&new_db(&a.id, "dev")).unwrap();
    assert!(matches!(catalog.create_d1_database(&new_db(&a.id, "more")), Err(Error::LimitReached { limit: 3, .. })));

    assert_eq!(catalog.d1_database(&a.id, "prod").unwrap().unwrap().uuid, db.uuid);
    assert_eq!(catalog.d1_database(&a.id, &db.uuid.to_uppercase()).unwrap().unwrap().name, "prod");
    assert!(catalog.d1_database(&b.id, &db.uuid).unwrap().is_none(), "ids do not cross accounts");

    let page1 = catalog.list_d1_databases(&a.id, None, 1, 2).unwrap();
    let page2 = catalog.list_d1_databases(&a.id, None, 2, 2).unwrap();
    assert_eq!((page1.databases.len(), page2.databases.len(), page1.total), (2, 1, 3));
    assert_eq!(catalog.list_d1_databases(&a.id, Some("STAG"), 1, 10).unwrap().databases[0].name, "staging");

    assert!(catalog.delete_d1_database(&a.id, &db.uuid).unwrap());
    assert!(!catalog.delete_d1_database(&a.id, &db.uuid).unwrap());
}

#[test]
fn looked_up_databases_are_remembered_never_past_a_change_by_another_connection() {
    let (dir, catalog) = open();
    let a = catalog.create_account(None, "a").unwrap();
    let db = catalog.create_d1_database(&new_db(&a.id, "prod")).unwrap();
    for _ in 0..3 {
        assert_eq!(catalog.d1_database(&a.id, "prod").unwrap().unwrap().uuid, db.uuid);
    }
    // Another process changes it: the next lookup through the first sees the change.
    let other = Catalog::open(dir.path().join("catalog.sqlite")).unwrap();
    assert!(other.set_d1_read_replication(&a.id, &db.uuid, "auto").unwrap());
    assert_eq!(catalog.d1_database(&a.id, "prod").unwrap().unwrap().read_replication, "auto");
    assert!(other.delete_d1_database(&a.id, &db.uuid).unwrap());
    assert!(catalog.d1_database(&a.id, "prod").unwrap().is_none());
    assert!(catalog.d1_database(&a.id, &db.uuid).unwrap().is_none());
    // A database made under the same name is found, not the one remembered before.
    let again = catalog.create_d1_database(&new_db(&a.id, "prod")).unwrap();
    assert_eq!(catalog.d1_database(&a.id, "prod").unwrap().unwrap().uuid, again.uuid);
}

#[test]
fn usage_accumulates_per_hour() {
    let (_dir, catalog) = open();
    let delta =
        UsageDelta { database_id: "d", hour: 3600, read_queries: 2, write_queries: 1, rows_read: 10, rows_written: 1 };
    catalog.add_d1_usage(&[delta, delta, UsageDelta { hour: 7200, ..delta }]).unwrap();
    let usage = catalog.d1_usage("d", 0, 7200).unwrap();
    assert_eq!(usage.len(), 2);
    assert_eq!((usage[0].read_queries, usage[0].rows_read, usage[1].write_queries), (4, 20, 1));
}
