//! The engine's rules, on a real data directory, with a clock the tests move.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use super::*;

const NS: &str = "0123456789abcdef0123456789abcdef";

struct Fixture {
    kv: Kv,
    now: Arc<AtomicI64>,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let now = Arc::new(AtomicI64::new(1_800_000_000));
    let clock = Arc::clone(&now);
    let kv = Kv::open(dir.path().join("kv"), R2Settings::default())
        .unwrap()
        .with_clock(Arc::new(move || clock.load(Ordering::SeqCst)));
    kv.create_namespace(NS).await.unwrap();
    Fixture { kv, now, _dir: dir }
}

fn body(text: &str) -> impl Stream<Item = std::result::Result<Bytes, std::io::Error>> + Send + use<> {
    futures_util::stream::iter([Ok(Bytes::from(text.to_owned()))])
}

async fn text(kv: &Kv, key: &str) -> Option<String> {
    let value = kv.get(NS, key).await.unwrap()?;
    Some(String::from_utf8(value.bytes().await.unwrap().to_vec()).unwrap())
}

#[tokio::test]
async fn a_value_reads_back_with_its_metadata_and_expiry() {
    let f = fixture().await;
    let expiration = f.kv.expiration(None, Some("60")).unwrap();
    assert_eq!(expiration, Some(1_800_000_060));
    let options = PutOptions { expiration, metadata: Some(r#"{"a":1}"#.into()), size: None };
    f.kv.put(NS, "k", body("v"), options).await.unwrap();
    let value = f.kv.get(NS, "k").await.unwrap().unwrap();
    assert_eq!(value.entry.metadata.as_deref(), Some(r#"{"a":1}"#));
    assert_eq!(value.entry.expiration, Some(1_800_000_060));
    assert_eq!(&value.bytes().await.unwrap()[..], b"v");
    assert_eq!(text(&f.kv, "missing").await, None);
    // Metadata is kept as JSON.stringify writes it (it travels in a header to the binding).
    let options = PutOptions { metadata: Some("{\n  \"b\" : [1, \"é\"]\n}".into()), ..Default::default() };
    f.kv.put(NS, "pretty", body("v"), options).await.unwrap();
    assert_eq!(f.kv.head(NS, "pretty").await.unwrap().unwrap().metadata.as_deref(), Some(r#"{"b":[1,"é"]}"#));
}

#[tokio::test]
async fn an_expired_key_is_never_returned_and_is_removed() {
    let f = fixture().await;
    let expiration = f.kv.expiration(None, Some("60")).unwrap();
    f.kv.put(NS, "short", body("1"), PutOptions { expiration, ..Default::default() }).await.unwrap();
    f.kv.put(NS, "long", body("2"), PutOptions::default()).await.unwrap();
    f.now.fetch_add(59, Ordering::SeqCst);
    assert_eq!(text(&f.kv, "short").await.as_deref(), Some("1"));
    // Expiry is inclusive: at the expiration second the key is gone.
    f.now.fetch_add(1, Ordering::SeqCst);
    assert_eq!(text(&f.kv, "short").await, None);
    assert!(f.kv.head(NS, "short").await.unwrap().is_none());
    let page = f.kv.list(NS, ListOptions::default()).await.unwrap();
    assert_eq!(page.keys.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(), ["long"]);
    assert!(page.list_complete && page.cursor.is_none());
    // What the sweep finds is gone from storage; a second sweep finds nothing.
    let stored = |kv: Kv| async move { kv.storage().head_object(NS, "short").await.unwrap().is_some() };
    let _ = f.kv.remove_expired(NS).await.unwrap();
    assert!(!stored(f.kv.clone()).await);
    assert_eq!(f.kv.remove_expired(NS).await.unwrap(), 0);
}

#[tokio::test]
async fn removing_expired_keys_spares_a_key_written_again() {
    let f = fixture().await;
    let expiration = f.kv.expiration(None, Some("60")).unwrap();
    f.kv.put(NS, "k", body("old"), PutOptions { expiration, ..Default::default() }).await.unwrap();
    // The same bytes and the same expiry, written again after the first expired: only the
    // version tells the two apart.
    let stale = f.kv.storage().head_object(NS, "k").await.unwrap().unwrap();
    f.now.fetch_add(120, Ordering::SeqCst);
    let expiration = f.kv.expiration(None, Some("60")).unwrap();
    f.kv.put(NS, "k", body("old"), PutOptions { expiration, ..Default::default() }).await.unwrap();
    let removed = f.kv.storage().delete_versions(NS, vec![("k".into(), stale.version)]).await.unwrap();
    assert_eq!(removed, 0);
    assert_eq!(f.kv.remove_expired(NS).await.unwrap(), 0);
    assert_eq!(text(&f.kv, "k").await.as_deref(), Some("old"));
}

#[tokio::test]
async fn limits_hold_at_their_exact_boundaries() {
    let f = fixture().await;
    let put = |key: String, options: PutOptions| {
        let kv = f.kv.clone();
        async move { kv.put(NS, &key, body("x"), options).await }
    };
    put("k".repeat(512), PutOptions::default()).await.unwrap();
    let e = put("k".repeat(513), PutOptions::default()).await.unwrap_err();
    assert_eq!(e.to_string(), "UTF-8 encoded length of 513 exceeds key length limit of 512.");
    // 171 three-byte characters are 513 bytes.
    assert!(matches!(put("€".repeat(171), PutOptions::default()).await, Err(KvError::KeyTooLong(513))));
    assert!(matches!(put(String::new(), PutOptions::default()).await, Err(KvError::EmptyKey)));
    assert!(matches!(put("..".into(), PutOptions::default()).await, Err(KvError::IllegalKey(_))));

    let metadata = |n: usize| Some(format!("\"{}\"", "m".repeat(n - 2)));
    put("m".into(), PutOptions { metadata: metadata(1024), ..Default::default() }).await.unwrap();
    let e = put("m".into(), PutOptions { metadata: metadata(1025), ..Default::default() }).await.unwrap_err();
    assert_eq!(e.to_string(), "Metadata length of 1025 exceeds limit of 1024.");
    assert!(matches!(
        put("m".into(), PutOptions { metadata: Some("{".into()), ..Default::default() }).await,
        Err(KvError::MetadataNotJson(_))
    ));

    assert_eq!(f.kv.expiration(None, Some("60")).unwrap(), Some(1_800_000_060));
    assert_eq!(
        f.kv.expiration(None, Some("59")).unwrap_err().to_string(),
        "Invalid expiration_ttl of 59. Expiration TTL must be at least 60."
    );
    assert!(matches!(f.kv.expiration(None, Some("0")), Err(KvError::ExpirationTtlNotPositive(_))));
    assert!(matches!(f.kv.expiration(None, Some("soon")), Err(KvError::ExpirationTtlNotPositive(_))));
    assert_eq!(f.kv.expiration(Some("1800000060"), None).unwrap(), Some(1_800_000_060));
    assert!(matches!(f.kv.expiration(Some("1800000059"), None), Err(KvError::ExpirationTooSoon(_))));
    assert!(matches!(f.kv.expiration(Some("1800000000"), None), Err(KvError::ExpirationPast(_))));
    // The TTL wins when both are given.
    assert_eq!(f.kv.expiration(Some("1"), Some("120")).unwrap(), Some(1_800_000_120));

    assert_eq!(parse_list_limit("1000").unwrap(), 1000);
    assert!(matches!(parse_list_limit("1001"), Err(KvError::LimitTooLarge(_))));
    assert!(matches!(parse_list_limit("0"), Err(KvError::LimitTooSmall(_))));
    check_cache_ttl("30").unwrap();
    assert!(check_cache_ttl("29").is_err() && check_cache_ttl("x").is_err());

    // A value of exactly 25 MiB is taken; one byte more is refused, declared or not.
    let exact = vec![0u8; MAX_VALUE_BYTES as usize];
    let chunked = |bytes: Vec<u8>| futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from(bytes))]);
    f.kv.put(NS, "big", chunked(exact.clone()), PutOptions::default()).await.unwrap();
    let mut over = exact;
    over.push(0);
    let e = f.kv.put(NS, "big", chunked(over.clone()), PutOptions::default()).await.unwrap_err();
    assert!(matches!(e, KvError::ValueTooLarge(None)), "{e}");
    let declared = PutOptions { size: Some(over.len() as u64), ..Default::default() };
    let e = f.kv.put(NS, "big", chunked(over), declared).await.unwrap_err();
    assert_eq!(e.to_string(), "Value length of 26214401 exceeds limit of 26214400.");
    assert_eq!(f.kv.head(NS, "big").await.unwrap().unwrap().size, MAX_VALUE_BYTES);
}

#[tokio::test]
async fn listing_pages_in_byte_order_and_sees_keys_added_between_pages() {
    let f = fixture().await;
    for i in 0..25 {
        f.kv.put(NS, &format!("key-{i:02}"), body("v"), PutOptions::default()).await.unwrap();
    }
    f.kv.put(NS, "other", body("v"), PutOptions::default()).await.unwrap();
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let options = ListOptions { prefix: "key-".into(), limit: 10, cursor: cursor.take() };
        let page = f.kv.list(NS, options).await.unwrap();
        seen.extend(page.keys.iter().map(|e| e.key.clone()));
        if seen.len() == 10 {
            // Added behind the cursor's position: seen on a later page.
            f.kv.put(NS, "key-99", body("v"), PutOptions::default()).await.unwrap();
        }
        if page.list_complete {
            assert!(page.cursor.is_none());
            break;
        }
        cursor = page.cursor;
    }
    let mut expected: Vec<String> = (0..25).map(|i| format!("key-{i:02}")).collect();
    expected.push("key-99".into());
    assert_eq!(seen, expected);
    assert!(matches!(
        f.kv.list(NS, ListOptions { cursor: Some("!!".into()), ..Default::default() }).await,
        Err(KvError::InvalidCursor)
    ));
}

#[tokio::test]
async fn a_page_is_filled_past_expired_keys() {
    let f = fixture().await;
    let soon = f.kv.expiration(None, Some("60")).unwrap();
    for i in 0..30 {
        let expiration = if i < 20 { soon } else { None };
        f.kv.put(NS, &format!("k{i:02}"), body("v"), PutOptions { expiration, ..Default::default() }).await.unwrap();
    }
    f.now.fetch_add(60, Ordering::SeqCst);
    let page = f.kv.list(NS, ListOptions { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(page.keys.len(), 10);
    assert_eq!(page.keys[0].key, "k20");
    assert!(page.list_complete);
}

#[tokio::test]
async fn a_bulk_read_returns_text_or_json_in_the_order_asked() {
    let f = fixture().await;
    f.kv.put(NS, "a", body(r#"{"n":1}"#), PutOptions { metadata: Some("[1]".into()), ..Default::default() })
        .await
        .unwrap();
    f.kv.put(NS, "b", body("plain"), PutOptions::default()).await.unwrap();
    let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let got = f.kv.get_many(NS, keys(&["b", "none", "a"]), ValueType::Text).await.unwrap();
    assert_eq!(got[0].1.as_ref().unwrap().0, serde_json::json!("plain"));
    assert!(got[1].1.is_none());
    assert_eq!(got[2].1.as_ref().unwrap().1.metadata.as_deref(), Some("[1]"));
    let got = f.kv.get_many(NS, keys(&["a"]), ValueType::Json).await.unwrap();
    assert_eq!(got[0].1.as_ref().unwrap().0, serde_json::json!({"n": 1}));
    assert!(matches!(f.kv.get_many(NS, keys(&["a", "b"]), ValueType::Json).await, Err(KvError::NotJson)));
    assert!(matches!(f.kv.get_many(NS, vec![], ValueType::Text).await, Err(KvError::NoKeys)));
    let many: Vec<String> = (0..101).map(|i| i.to_string()).collect();
    assert!(matches!(f.kv.get_many(NS, many, ValueType::Text).await, Err(KvError::TooManyKeys)));
    assert!(matches!(ValueType::parse("arrayBuffer"), Err(KvError::InvalidType(_))));
}

#[tokio::test]
async fn a_deleted_namespace_answers_not_found() {
    let f = fixture().await;
    f.kv.put(NS, "k", body("v"), PutOptions::default()).await.unwrap();
    f.kv.delete(NS, vec!["k".into(), "never".into()]).await.unwrap();
    assert_eq!(text(&f.kv, "k").await, None);
    f.kv.delete_namespace(NS).await.unwrap();
    assert!(matches!(f.kv.get(NS, "k").await, Err(KvError::NamespaceNotFound)));
}
