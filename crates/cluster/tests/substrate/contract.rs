//! What every coordinator must do, checked the same way against each.

use std::time::{Duration, Instant};

use bytes::Bytes;
use kura_cluster::{Acquired, Coordinator, CoordinatorError, Lease, Member};

pub fn member(node: &str) -> Member {
    Member {
        node: node.into(),
        incarnation: format!("{node}-{}", std::process::id()),
        api: format!("http://{node}.test:8080"),
        s3: format!("http://{node}.test:9000"),
    }
}

pub async fn owned(coordinator: &dyn Coordinator, resource: &str) -> Lease {
    match coordinator.acquire(resource).await.unwrap() {
        Acquired::Owned(lease) => lease,
        Acquired::Held(owner) => panic!("{resource} is held by {owner:?}"),
    }
}

fn entries(published: Vec<kura_cluster::Published>) -> Vec<String> {
    published.into_iter().map(|p| String::from_utf8(p.entry.to_vec()).unwrap()).collect()
}

/// One owner at a time, higher epochs for later owners, fenced publishes, release and forget.
pub async fn one_owner_at_a_time(a: &dyn Coordinator, b: &dyn Coordinator, resource: &str) {
    a.join(member("a")).await.unwrap();
    b.join(member("b")).await.unwrap();
    let mut nodes: Vec<String> = a.members().await.unwrap().into_iter().map(|m| m.node).collect();
    nodes.sort();
    assert_eq!(nodes, ["a", "b"]);

    let first = owned(a, resource).await;
    match b.acquire(resource).await.unwrap() {
        Acquired::Held(owner) => assert_eq!((owner.node.as_str(), owner.epoch), ("a", first.epoch())),
        Acquired::Owned(_) => panic!("two owners of {resource}"),
    }
    assert_eq!(b.owner(resource).await.unwrap().map(|o| o.node), Some("a".into()));
    let s1 = a.publish(&first, Bytes::from_static(b"one")).await.unwrap();
    let s2 = a.publish(&first, Bytes::from_static(b"two")).await.unwrap();
    assert_eq!(s2, s1 + 1);
    assert_eq!(entries(b.manifest(resource, 0).await.unwrap()), ["one", "two"]);
    assert_eq!(entries(b.manifest(resource, s1).await.unwrap()), ["two"]);

    a.release(&first).await.unwrap();
    assert!(!first.is_valid());
    let second = owned(b, resource).await;
    assert!(second.epoch() > first.epoch(), "epochs grow: {} then {}", first.epoch(), second.epoch());
    let refused = a.publish(&first, Bytes::from_static(b"late")).await;
    assert!(matches!(refused, Err(CoordinatorError::Fenced { .. })), "{refused:?}");
    let s3 = b.publish(&second, Bytes::from_static(b"three")).await.unwrap();
    assert_eq!(entries(a.manifest(resource, 0).await.unwrap()), ["one", "two", "three"]);
    b.forget(&second, s3).await.unwrap();
    assert_eq!(entries(a.manifest(resource, 0).await.unwrap()), ["three"]);
    b.release(&second).await.unwrap();
}

/// A node that stops renewing (dropped here, as a killed process would be) loses its leases
/// after the TTL, and another node takes over within the TTL plus a second.
pub async fn takeover_after_expiry(
    stopped: Box<dyn Coordinator>,
    survivor: &dyn Coordinator,
    resource: &str,
    ttl: Duration,
) -> Duration {
    stopped.join(member("stopped")).await.unwrap();
    survivor.join(member("survivor")).await.unwrap();
    let old = owned(&*stopped, resource).await;
    stopped.publish(&old, Bytes::from_static(b"before")).await.unwrap();
    drop(stopped);
    let started = Instant::now();
    let new = loop {
        match survivor.acquire(resource).await.unwrap() {
            Acquired::Owned(lease) => break lease,
            Acquired::Held(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
        assert!(started.elapsed() < ttl * 3, "no takeover after {:?}", started.elapsed());
    };
    let took = started.elapsed();
    assert!(took <= ttl + Duration::from_secs(1) + ttl / 2, "takeover took {took:?} with a TTL of {ttl:?}");
    assert!(!old.is_valid(), "the stopped owner's own clock ended its lease before the takeover");
    assert!(new.epoch() > old.epoch());
    survivor.publish(&new, Bytes::from_static(b"after")).await.unwrap();
    assert_eq!(entries(survivor.manifest(resource, 0).await.unwrap()), ["before", "after"]);
    took
}
