//! The engine's rules on a real queue file, with a clock the tests move.

use std::sync::atomic::{AtomicI64, Ordering};

use super::*;

const Q: &str = "0123456789abcdef0123456789abcdef";

struct Fixture {
    queues: Queues,
    now: Arc<AtomicI64>,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let now = Arc::new(AtomicI64::new(1_800_000_000_000));
    let clock = Arc::clone(&now);
    let queues = Queues::open(dir.path().join("queues"), RegistrySettings::default(), None)
        .unwrap()
        .with_clock(Arc::new(move || clock.load(Ordering::SeqCst)));
    queues.create_queue(Q).await.unwrap();
    Fixture { queues, now, _dir: dir }
}

fn text(body: &str) -> NewMessage {
    NewMessage { body: body.as_bytes().to_vec(), content_type: ContentType::Text, delay_seconds: None }
}

fn bodies(messages: &[Message]) -> Vec<String> {
    messages.iter().map(|m| String::from_utf8(m.body.clone()).unwrap()).collect()
}

#[tokio::test]
async fn messages_are_leased_oldest_first_and_acknowledged_once() {
    let f = fixture().await;
    let backlog = f.queues.send(Q, vec![text("a"), text("b"), text("c")], 0).await.unwrap();
    assert_eq!((backlog.count, backlog.bytes, backlog.oldest_ms), (3, 3, Some(1_800_000_000_000)));
    let first = f.queues.lease(Q, 2, 30_000).await.unwrap();
    assert_eq!(bodies(&first), ["a", "b"]);
    assert!(first.iter().all(|m| m.attempts == 1));
    // Leased messages are given to no one else.
    assert_eq!(bodies(&f.queues.lease(Q, 10, 30_000).await.unwrap()), ["c"]);
    assert!(f.queues.lease(Q, 10, 30_000).await.unwrap().is_empty());
    let leases = first.iter().map(|m| m.lease_id.clone()).collect::<Vec<_>>();
    assert_eq!(f.queues.settle(Q, leases.clone(), vec![]).await.unwrap(), (2, 0));
    assert_eq!(f.queues.settle(Q, leases, vec![]).await.unwrap(), (0, 0), "an acknowledgement counts once");
    let backlog = f.queues.backlog(Q).await.unwrap();
    assert_eq!((backlog.count, backlog.in_flight), (1, 1));
    let totals = f.queues.totals(Q).await.unwrap();
    assert_eq!((totals.count, totals.bytes, totals.oldest_ms), (1, 1, Some(1_800_000_000_000)));
    f.queues.purge(Q).await.unwrap();
    assert_eq!(f.queues.totals(Q).await.unwrap(), Backlog::default(), "kept through deletions");
}

#[tokio::test]
async fn an_expired_lease_redelivers_with_attempts_counted() {
    let f = fixture().await;
    f.queues.send(Q, vec![text("m")], 0).await.unwrap();
    let first = f.queues.lease(Q, 1, 30_000).await.unwrap();
    f.now.fetch_add(29_999, Ordering::SeqCst);
    assert!(f.queues.lease(Q, 1, 30_000).await.unwrap().is_empty());
    f.now.fetch_add(1, Ordering::SeqCst);
    let second = f.queues.lease(Q, 1, 30_000).await.unwrap();
    assert_eq!((second[0].id.as_str(), second[0].attempts), (first[0].id.as_str(), 2));
    // The first holder's late acknowledgement no longer holds the message.
    assert_eq!(f.queues.settle(Q, vec![first[0].lease_id.clone()], vec![]).await.unwrap(), (0, 0));
    assert_eq!(f.queues.settle(Q, vec![second[0].lease_id.clone()], vec![]).await.unwrap(), (1, 0));
    // A late acknowledgement is taken while no one else holds the message.
    f.queues.send(Q, vec![text("late")], 0).await.unwrap();
    let leased = f.queues.lease(Q, 1, 1_000).await.unwrap();
    f.now.fetch_add(5_000, Ordering::SeqCst);
    assert_eq!(f.queues.settle(Q, vec![leased[0].lease_id.clone()], vec![]).await.unwrap(), (1, 0));
}

#[tokio::test]
async fn delays_and_retries_wait_their_time() {
    let f = fixture().await;
    let delayed = NewMessage { delay_seconds: Some(5), ..text("later") };
    f.queues.send(Q, vec![delayed, text("now")], 0).await.unwrap();
    assert_eq!(bodies(&f.queues.lease(Q, 10, 30_000).await.unwrap()), ["now"]);
    f.now.fetch_add(5_000, Ordering::SeqCst);
    let later = f.queues.lease(Q, 10, 30_000).await.unwrap();
    assert_eq!(bodies(&later), ["later"]);
    assert_eq!(f.queues.settle(Q, vec![], vec![(later[0].lease_id.clone(), 10)]).await.unwrap(), (0, 1));
    assert_eq!(f.queues.backlog(Q).await.unwrap().delayed, 1);
    f.now.fetch_add(9_999, Ordering::SeqCst);
    assert!(f.queues.lease(Q, 10, 30_000).await.unwrap().iter().all(|m| m.body != b"later"));
    f.now.fetch_add(1, Ordering::SeqCst);
    let again = f.queues.lease(Q, 10, 30_000).await.unwrap();
    assert_eq!((bodies(&again), again[0].attempts), (vec!["later".to_owned()], 2));
    // A send's default delay applies where a message has none of its own.
    f.queues.send(Q, vec![text("default")], 3).await.unwrap();
    assert_eq!(f.queues.ready(Q, 10).await.unwrap(), (0, Some(f.queues.now_ms() + 3_000)));
}

#[tokio::test]
async fn limits_hold_at_their_exact_boundaries() {
    let f = fixture().await;
    let sized = |n: usize| NewMessage { body: vec![b'x'; n], content_type: ContentType::Bytes, delay_seconds: None };
    f.queues.send(Q, vec![sized(MAX_MESSAGE_BYTES)], 0).await.unwrap();
    let e = f.queues.send(Q, vec![sized(MAX_MESSAGE_BYTES + 1)], 0).await.unwrap_err();
    assert_eq!(e.to_string(), "message length of 128001 bytes exceeds limit of 128000");
    assert_eq!(e.code(), 10204);
    f.queues.send(Q, vec![sized(MAX_MESSAGE_BYTES), sized(MAX_BATCH_BYTES - MAX_MESSAGE_BYTES)], 0).await.unwrap();
    let over = vec![sized(MAX_MESSAGE_BYTES), sized(MAX_BATCH_BYTES - MAX_MESSAGE_BYTES), sized(1)];
    assert_eq!(f.queues.send(Q, over, 0).await.unwrap_err().code(), 10205);
    f.queues.send(Q, (0..100).map(|_| sized(1)).collect(), 0).await.unwrap();
    assert_eq!(f.queues.send(Q, (0..101).map(|_| sized(1)).collect(), 0).await.unwrap_err().code(), 10206);
    assert_eq!(f.queues.send(Q, vec![], 0).await.unwrap_err().code(), 10206);
    let late = NewMessage { delay_seconds: Some(MAX_DELAY_SECONDS), ..sized(1) };
    f.queues.send(Q, vec![late.clone()], 0).await.unwrap();
    let too_late = NewMessage { delay_seconds: Some(MAX_DELAY_SECONDS + 1), ..late };
    assert_eq!(f.queues.send(Q, vec![too_late], 0).await.unwrap_err().code(), 10202);
    assert!(parse_delay("43200").is_ok() && parse_delay("43201").is_err() && parse_delay("-1").is_err());
    assert_eq!(ContentType::parse("JSON").unwrap(), ContentType::Json);
    assert_eq!(ContentType::parse("xml").unwrap_err().code(), 10203);
    let before = f.queues.backlog(Q).await.unwrap().count;
    assert_eq!(before, 1 + 2 + 100 + 1, "refused sends wrote nothing");
}

#[tokio::test]
async fn taken_and_released_and_deleted() {
    let f = fixture().await;
    f.queues.send(Q, vec![text("poison"), text("fine")], 0).await.unwrap();
    let leased = f.queues.lease(Q, 10, 60_000).await.unwrap();
    let taken = f.queues.take(Q, vec![leased[0].lease_id.clone()]).await.unwrap();
    assert_eq!(bodies(&taken), ["poison"]);
    // A delivery that died with its process is not waited out.
    assert_eq!(f.queues.release_leases(Q).await.unwrap(), 1);
    assert_eq!(bodies(&f.queues.lease(Q, 10, 60_000).await.unwrap()), ["fine"]);
    let peeked = f.queues.peek(Q, 10).await.unwrap();
    assert_eq!((peeked.len(), peeked[0].in_flight, peeked[0].attempts), (1, true, 2));
    f.queues.delete_queue(Q).await.unwrap();
    assert!(matches!(f.queues.backlog(Q).await, Err(QueueError::NotFound)));
    assert!(matches!(f.queues.send(Q, vec![text("x")], 0).await, Err(QueueError::NotFound)));
}
