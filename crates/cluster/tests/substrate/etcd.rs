//! The etcd coordinator against a real three-member etcd cluster.

use std::time::Duration;

use bytes::Bytes;
use kura_cluster::{Acquired, Coordinator, CoordinatorError, EtcdClient, EtcdCoordinator};

use crate::contract::{self, member, owned};
use kura_testkit::bed::Etcd;

fn coordinator(etcd: &Etcd, first: usize, ttl: Duration) -> EtcdCoordinator {
    let mut endpoints = etcd.endpoints.clone();
    endpoints.rotate_left(first);
    EtcdCoordinator::new(EtcdClient::new(endpoints), "/kura/test", ttl)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_gives_one_owner_at_a_time_and_fences_the_replaced() {
    let etcd = Etcd::start();
    let ttl = Duration::from_secs(5);
    let (a, b) = (coordinator(&etcd, 0, ttl), coordinator(&etcd, 1, ttl));
    contract::one_owner_at_a_time(&a, &b, "d1/contract").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_hands_a_stopped_nodes_resources_over_within_the_ttl() {
    let etcd = Etcd::start();
    let ttl = Duration::from_secs(2);
    let took = contract::takeover_after_expiry(
        Box::new(coordinator(&etcd, 0, ttl)),
        &coordinator(&etcd, 2, ttl),
        "d1/expiry",
        ttl,
    )
    .await;
    eprintln!("etcd takeover after the owner stopped renewing: {took:?} (TTL {ttl:?})");
}

/// A zombie: etcd ended the owner's session (as it does when the owner was paused past its
/// TTL) while the owner's own clock still says it holds the lease. Its publish is refused by
/// the transaction's comparison, and nothing it sent becomes visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_owner_cannot_publish_after_a_takeover() {
    let etcd = Etcd::start();
    let ttl = Duration::from_secs(10);
    let (zombie, successor) = (coordinator(&etcd, 0, ttl), coordinator(&etcd, 1, ttl));
    zombie.join(member("zombie")).await.unwrap();
    successor.join(member("successor")).await.unwrap();
    let old = owned(&zombie, "d1/zombie").await;
    zombie.publish(&old, Bytes::from_static(b"acknowledged")).await.unwrap();

    let session = zombie.session_lease().await.unwrap();
    EtcdClient::new(etcd.endpoints.clone()).revoke(session).await.unwrap();
    let new = owned(&successor, "d1/zombie").await;
    assert!(old.is_valid(), "the zombie's own clock has not run out yet");
    let refused = zombie.publish(&old, Bytes::from_static(b"late")).await;
    assert!(matches!(refused, Err(CoordinatorError::Fenced { .. })), "{refused:?}");
    assert!(!old.is_valid(), "a fenced owner steps down");
    successor.publish(&new, Bytes::from_static(b"successor")).await.unwrap();
    let seen: Vec<_> = zombie.manifest("d1/zombie", 0).await.unwrap().into_iter().map(|p| p.entry).collect();
    assert_eq!(seen, [Bytes::from_static(b"acknowledged"), Bytes::from_static(b"successor")]);
    // The zombie opens a new session for whatever it takes next, and finds the resource held.
    assert!(matches!(zombie.acquire("d1/zombie").await.unwrap(), Acquired::Held(o) if o.node == "successor"));
}

/// With one of three members stopped (the one each client tries first), etcd keeps its quorum
/// and ownership keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ownership_survives_one_etcd_member_stopped() {
    let mut etcd = Etcd::start();
    let ttl = Duration::from_secs(5);
    let (a, b) = (coordinator(&etcd, 0, ttl), coordinator(&etcd, 0, ttl));
    a.join(member("a")).await.unwrap();
    b.join(member("b")).await.unwrap();
    let lease = owned(&a, "d1/quorum").await;
    a.publish(&lease, Bytes::from_static(b"before")).await.unwrap();
    etcd.stop(0);
    a.publish(&lease, Bytes::from_static(b"after")).await.unwrap();
    assert!(matches!(b.acquire("d1/quorum").await.unwrap(), Acquired::Held(_)));
    tokio::time::sleep(ttl).await;
    assert!(lease.is_valid(), "renewals go to the members still up");
    let seen: Vec<_> = b.manifest("d1/quorum", 0).await.unwrap().into_iter().map(|p| p.entry).collect();
    assert_eq!(seen, [Bytes::from_static(b"before"), Bytes::from_static(b"after")]);
}

/// A node resumed after a pause past its TTL, whose many waiting requests each find its
/// session expired at once: it opens one new session, and its member entry and every
/// ownership it takes hang off that session's lease, so it stays a live member after the
/// leases it did not keep run out (a member entry left on an abandoned lease made the other
/// nodes call the new owner "not a live member" for good). Its keeper, which learns of the
/// expiry at its next renewal, opens the next session itself, so the acquires here may find
/// it already open; either way one session serves them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_resumed_with_many_requests_rejoins_once_and_stays_a_member() {
    let etcd = Etcd::start();
    let ttl = Duration::from_secs(2);
    let resumed = std::sync::Arc::new(coordinator(&etcd, 0, ttl));
    resumed.join(member("resumed")).await.unwrap();
    let client = EtcdClient::new(etcd.endpoints.clone());
    client.revoke(resumed.session_lease().await.unwrap()).await.unwrap();
    // Its keeper learns of the expiry at its next renewal.
    tokio::time::sleep(ttl / 3 + Duration::from_millis(500)).await;

    let takes: Vec<_> = (0..16)
        .map(|i| {
            let resumed = resumed.clone();
            tokio::spawn(async move { resumed.acquire(&format!("d1/resumed-{i}")).await })
        })
        .collect();
    for take in takes {
        assert!(matches!(take.await.unwrap(), Ok(Acquired::Owned(_))));
    }
    let session = resumed.session_lease().await.unwrap();
    let entry = client.get(b"/kura/test/members/resumed").await.unwrap().expect("a member entry");
    assert_eq!(entry.lease, session, "the member entry hangs off the session's lease");
    for i in 0..16 {
        let key = format!("/kura/test/owner/d1/resumed-{i}");
        let owner = client.get(key.as_bytes()).await.unwrap().expect("an owner entry");
        assert_eq!(owner.lease, session, "{key} hangs off the session's lease");
    }
    tokio::time::sleep(ttl * 2).await;
    let members: Vec<String> = resumed.members().await.unwrap().into_iter().map(|m| m.node).collect();
    assert_eq!(members, ["resumed"], "still a live member once the abandoned leases ran out");
}

/// A node whose session etcd ended while it had nothing to do (paused past its TTL, say)
/// opens the next one at its next renewal, acquiring nothing: it is a member again, its entry
/// on the new session's lease, rather than missing from the members until its next acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_node_whose_session_expired_is_a_member_again_without_acquiring() {
    let etcd = Etcd::start();
    let ttl = Duration::from_secs(2);
    let idle = coordinator(&etcd, 0, ttl);
    idle.join(member("idle")).await.unwrap();
    let client = EtcdClient::new(etcd.endpoints.clone());
    let first = idle.session_lease().await.unwrap();
    client.revoke(first).await.unwrap();
    assert!(client.get(b"/kura/test/members/idle").await.unwrap().is_none(), "the entry went with its lease");

    let deadline = std::time::Instant::now() + ttl * 3;
    let names = || async { idle.members().await.unwrap().into_iter().map(|m| m.node).collect::<Vec<_>>() };
    while names().await.is_empty() {
        assert!(std::time::Instant::now() < deadline, "the idle node did not rejoin within {:?}", ttl * 3);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let session = idle.session_lease().await.unwrap();
    assert_ne!(session, first, "a new session");
    let entry = client.get(b"/kura/test/members/idle").await.unwrap().expect("a member entry");
    assert_eq!(entry.lease, session, "the member entry hangs off the new session's lease");
    tokio::time::sleep(ttl * 2).await;
    assert_eq!(names().await, ["idle"], "still a member, its new session renewed");
}
