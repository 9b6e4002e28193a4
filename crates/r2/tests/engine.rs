//! The R2 engine on a real data directory: blob-first writes, removal after commit, reads that
//! outlive an overwrite, the sweep of orphans, and listing across pages.

use bytes::Bytes;
use futures_util::StreamExt;
use kura_r2::{
    CompleteOptions, Conditional, EtagCondition, GetOptions, ListOptions, PutOptions, R2, R2Error, R2Settings,
};

const BUCKET: &str = "00112233445566778899aabbccddeeff";

fn body(data: &[u8]) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    futures_util::stream::iter(vec![Ok(Bytes::copy_from_slice(data))])
}

async fn read_all(r2: &R2, key: &str) -> Vec<u8> {
    let mut object = r2.get_object(BUCKET, key, GetOptions::default()).await.unwrap();
    let mut out = Vec::new();
    while let Some(chunk) = object.body.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    out
}

/// An engine that keeps every non-empty body in a blob file, so the tests can watch the files.
fn blob_engine(root: &std::path::Path) -> R2 {
    R2::open(root.to_owned(), R2Settings { inline_max: 0, ..R2Settings::default() }).unwrap()
}

fn blob_files(root: &std::path::Path) -> usize {
    let blobs = root.join(BUCKET).join("blobs");
    std::fs::read_dir(blobs).unwrap().map(|shard| std::fs::read_dir(shard.unwrap().path()).unwrap().count()).sum()
}

#[tokio::test]
async fn overwrites_remove_old_blobs_but_not_under_a_reader() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r2");
    let r2 = blob_engine(&root);
    r2.create_bucket(BUCKET).await.unwrap();
    r2.put_object(BUCKET, "k", body(b"first"), PutOptions::default()).await.unwrap();
    assert_eq!(blob_files(&root), 1);

    // A read that started before the overwrite streams the old bytes to the end.
    let mut reader = r2.get_object(BUCKET, "k", GetOptions::default()).await.unwrap();
    r2.put_object(BUCKET, "k", body(b"second"), PutOptions::default()).await.unwrap();
    assert_eq!(blob_files(&root), 2, "the old blob stays while it is read");
    let old = reader.body.next().await.unwrap().unwrap();
    assert_eq!(&old[..], b"first");
    drop(reader);
    assert_eq!(blob_files(&root), 1, "and goes when the reader is done");
    assert_eq!(read_all(&r2, "k").await, b"second");

    r2.delete_object(BUCKET, "k").await.unwrap();
    assert_eq!(blob_files(&root), 0);
    assert!(matches!(r2.get_object(BUCKET, "k", GetOptions::default()).await, Err(R2Error::NoSuchKey)));
}

#[tokio::test]
async fn a_failed_precondition_or_digest_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r2");
    let r2 = blob_engine(&root);
    r2.create_bucket(BUCKET).await.unwrap();
    r2.put_object(BUCKET, "k", body(b"kept"), PutOptions::default()).await.unwrap();
    let mut options = PutOptions::default();
    options.digests.md5 = Some([0; 16]);
    assert!(matches!(r2.put_object(BUCKET, "k", body(b"other"), options).await, Err(R2Error::BadDigest { .. })));
    let options = PutOptions { size: Some(100), ..Default::default() };
    assert!(matches!(r2.put_object(BUCKET, "k", body(b"short"), options).await, Err(R2Error::IncompleteBody(_))));
    assert_eq!(read_all(&r2, "k").await, b"kept");
    assert_eq!(blob_files(&root), 1, "no blob of a refused write is left behind");
}

#[tokio::test]
async fn the_sweep_removes_orphans_only() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r2");
    let r2 = blob_engine(&root);
    r2.create_bucket(BUCKET).await.unwrap();
    r2.put_object(BUCKET, "k", body(b"live"), PutOptions::default()).await.unwrap();
    // What a crash between a blob's sync and its row's commit leaves.
    let shard = root.join(BUCKET).join("blobs").join("ab");
    std::fs::create_dir_all(&shard).unwrap();
    std::fs::write(shard.join("ab000000000000000000000000000000"), b"orphan").unwrap();
    assert_eq!(blob_files(&root), 2);
    let report = r2.sweep(BUCKET).await.unwrap();
    assert_eq!(report.orphans, 1);
    assert_eq!(blob_files(&root), 1);
    assert_eq!(read_all(&r2, "k").await, b"live");
}

#[tokio::test]
async fn listing_pages_fold_prefixes_and_never_repeat() {
    let dir = tempfile::tempdir().unwrap();
    let r2 = R2::open(dir.path().join("r2"), R2Settings::default()).unwrap();
    r2.create_bucket(BUCKET).await.unwrap();
    let mut keys = Vec::new();
    for i in 0..30 {
        keys.push(format!("flat/{i:02}"));
        keys.push(format!("dir/{i:02}/inner"));
    }
    keys.push("z\u{00e9}".into());
    keys.push("z\u{1f600}".into());
    for key in &keys {
        r2.put_object(BUCKET, key, body(b"x"), PutOptions::default()).await.unwrap();
    }
    // Without a delimiter: every key once, in UTF-8 byte order, across pages of 7.
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page =
            r2.list(BUCKET, ListOptions { limit: 7, cursor: cursor.clone(), ..Default::default() }).await.unwrap();
        assert!(page.objects.len() <= 7);
        seen.extend(page.objects.into_iter().map(|o| o.key));
        if !page.truncated {
            break;
        }
        cursor = page.cursor;
    }
    let mut sorted = keys.clone();
    sorted.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    assert_eq!(seen, sorted);

    // With a delimiter under dir/: 30 common prefixes, across pages of 4.
    let mut prefixes = Vec::new();
    let mut cursor = None;
    loop {
        let options = ListOptions {
            prefix: "dir/".into(),
            delimiter: Some("/".into()),
            limit: 4,
            cursor: cursor.clone(),
            ..Default::default()
        };
        let page = r2.list(BUCKET, options).await.unwrap();
        assert!(page.objects.is_empty());
        prefixes.extend(page.prefixes);
        if !page.truncated {
            break;
        }
        cursor = page.cursor;
    }
    assert_eq!(prefixes, (0..30).map(|i| format!("dir/{i:02}/")).collect::<Vec<_>>());

    // A limit of 0 says only whether anything matches.
    let none = r2.list(BUCKET, ListOptions { prefix: "flat/".into(), limit: 0, ..Default::default() }).await.unwrap();
    assert!(none.truncated && none.objects.is_empty());
    let after = r2
        .list(BUCKET, ListOptions { start_after: Some("flat/28".into()), limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(after.objects[0].key, "flat/29");
}

#[tokio::test]
async fn small_bodies_live_in_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r2");
    let r2 = R2::open(root.clone(), R2Settings::default()).unwrap();
    r2.create_bucket(BUCKET).await.unwrap();
    let small = vec![5u8; 16 * 1024];
    let info = r2.put_object(BUCKET, "small", body(&small), PutOptions::default()).await.unwrap();
    assert_eq!(info.size, 16 * 1024);
    assert_eq!(blob_files(&root), 0, "a body within the inline limit needs no blob file");
    assert_eq!(read_all(&r2, "small").await, small);
    let range = GetOptions { range: Some(kura_r2::ByteRange::From { start: 10, end: Some(19) }), ..Default::default() };
    let mut part = r2.get_object(BUCKET, "small", range).await.unwrap();
    assert_eq!(part.range, Some((10, 10)));
    assert_eq!(&part.body.next().await.unwrap().unwrap()[..], &small[10..20]);

    // One byte more goes to a blob; overwriting it with a small body removes the blob.
    let large = vec![6u8; 16 * 1024 + 1];
    r2.put_object(BUCKET, "small", body(&large), PutOptions::default()).await.unwrap();
    assert_eq!(blob_files(&root), 1);
    assert_eq!(read_all(&r2, "small").await, large);
    r2.put_object(BUCKET, "small", body(b""), PutOptions::default()).await.unwrap();
    assert_eq!(blob_files(&root), 0);
    assert_eq!(read_all(&r2, "small").await, b"");
}

#[tokio::test]
async fn a_marker_at_a_common_prefix_skips_it() {
    let dir = tempfile::tempdir().unwrap();
    let r2 = R2::open(dir.path().join("r2"), R2Settings::default()).unwrap();
    r2.create_bucket(BUCKET).await.unwrap();
    for key in ["asdf", "boo/bar", "boo/baz/xyzzy", "cquux/thud", "cquux/bla"] {
        r2.put_object(BUCKET, key, body(b"x"), PutOptions::default()).await.unwrap();
    }
    let page = |after: &str, limit| ListOptions {
        delimiter: Some("/".into()),
        start_after: Some(after.into()).filter(|a: &String| !a.is_empty()),
        limit,
        ..Default::default()
    };
    let first = r2.list(BUCKET, page("asdf", 1)).await.unwrap();
    assert_eq!((first.prefixes.clone(), first.truncated), (vec!["boo/".to_owned()], true));
    let second = r2.list(BUCKET, page("boo/", 1)).await.unwrap();
    assert_eq!((second.prefixes, second.truncated), (vec!["cquux/".to_owned()], false));
    let inside = r2.list(BUCKET, page("boo/bar", 5)).await.unwrap();
    assert_eq!(inside.prefixes, vec!["cquux/".to_owned()], "a marker inside a group skips the group");
}

#[tokio::test]
async fn a_deleted_bucket_takes_no_more_writes_and_a_full_one_is_not_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let r2 = std::sync::Arc::new(R2::open(dir.path().join("r2"), R2Settings::default()).unwrap());
    r2.create_bucket(BUCKET).await.unwrap();
    r2.put_object(BUCKET, "k", body(b"x"), PutOptions::default()).await.unwrap();
    assert!(matches!(r2.mark_deleted(BUCKET).await, Err(R2Error::BucketNotEmpty)));
    r2.delete_object(BUCKET, "k").await.unwrap();
    r2.mark_deleted(BUCKET).await.unwrap();
    let late = r2.put_object(BUCKET, "late", body(b"y"), PutOptions::default()).await;
    assert!(matches!(late, Err(R2Error::NoSuchBucket)), "{late:?}");
    r2.unmark_deleted(BUCKET).await.unwrap();
    r2.put_object(BUCKET, "again", body(b"z"), PutOptions::default()).await.unwrap();

    // An empty part is a whole, empty answer.
    let upload =
        r2.create_multipart_upload(BUCKET, "m", Default::default(), Default::default(), None, None).await.unwrap();
    let part = r2.upload_part(BUCKET, "m", &upload, 1, body(b""), Default::default()).await.unwrap();
    r2.complete_multipart_upload(BUCKET, "m", &upload, vec![(1, part.etag)], Default::default()).await.unwrap();
    let got = r2.get_object(BUCKET, "m", GetOptions { part_number: Some(1), ..Default::default() }).await.unwrap();
    assert_eq!((got.range, got.length()), (None, 0));
}

#[tokio::test]
async fn a_conditional_completion_is_checked_against_the_object_it_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let r2 = std::sync::Arc::new(R2::open(dir.path().join("r2"), R2Settings::default()).unwrap());
    r2.create_bucket(BUCKET).await.unwrap();
    let old = r2.put_object(BUCKET, "k", body(b"old"), PutOptions::default()).await.unwrap();
    let upload =
        r2.create_multipart_upload(BUCKET, "k", Default::default(), Default::default(), None, None).await.unwrap();
    let part = r2.upload_part(BUCKET, "k", &upload, 1, body(b"new"), Default::default()).await.unwrap();
    let parts = || vec![(1, part.etag.clone())];
    let only_new = Conditional { if_none_match: Some(vec![EtagCondition::Any]), ..Default::default() };
    let with = |conditional| CompleteOptions { conditional, ..Default::default() };
    let refused = r2.complete_multipart_upload(BUCKET, "k", &upload, parts(), with(only_new)).await;
    assert!(matches!(refused, Err(R2Error::PreconditionFailed)), "{refused:?}");
    let other = Conditional { if_match: Some(vec![EtagCondition::parse("\"nope\"")]), ..Default::default() };
    let refused = r2.complete_multipart_upload(BUCKET, "k", &upload, parts(), with(other)).await;
    assert!(matches!(refused, Err(R2Error::PreconditionFailed)), "{refused:?}");
    // Refused, the object is the old one and the upload is still open.
    assert_eq!(r2.head_object(BUCKET, "k").await.unwrap().unwrap().etag, old.etag);
    let current =
        Conditional { if_match: Some(vec![EtagCondition::parse(&format!("\"{}\"", old.etag))]), ..Default::default() };
    let done = r2.complete_multipart_upload(BUCKET, "k", &upload, parts(), with(current)).await.unwrap();
    assert_eq!(r2.head_object(BUCKET, "k").await.unwrap().unwrap().etag, done.etag);
}
