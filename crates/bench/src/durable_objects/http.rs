//! Durable Objects over HTTP: the batch endpoint under load, beside the same requests' floor.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use futures_util::StreamExt;
use serde_json::{Value as Json, json};

use super::limit::LimitLoad;
use super::{CLIENTS, CREATE, OBJECTS, READ, WRITE, object_for, room_name};
use crate::load::{self, Stats};
use crate::server::{ACCOUNT, TOKEN};

/// What the batch endpoint (an INSERT and a count as one request) measured at 16 clients and at
/// 1, and, in turns with it, the same server's HTTP floor, a server doing only the limit's work
/// ([`FloorServer::objects`]) and the limit.
#[derive(Default)]
pub(super) struct HttpFigures {
    pub(super) batch_16: Stats,
    pub(super) batch_1: Stats,
    pub(super) floor_16: Stats,
    pub(super) floor_1: Stats,
    pub(super) object_floor_16: Stats,
    pub(super) object_floor_1: Stats,
    pub(super) limit_16: Stats,
    pub(super) limit_1: Stats,
}

pub(super) async fn measure_http(
    api: &str,
    floor: &str,
    limit_dir: &Path,
    duration: Duration,
    wanted: &dyn Fn(&str) -> bool,
) -> anyhow::Result<HttpFigures> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    let namespaces = format!("http://{api}/client/v4/accounts/{ACCOUNT}/workers/durable_objects/namespaces");
    let created: Json = http
        .post(&namespaces)
        .bearer_auth(TOKEN)
        .json(&json!({ "name": "ROOMS", "class": "Room", "script": "bench" }))
        .send()
        .await?
        .json()
        .await?;
    let Some(id) = created["result"]["id"].as_str() else { bail!("cannot create the namespace: {created}") };
    let objects: Arc<str> = format!("{namespaces}/{id}/objects").into();
    let batch_url = {
        let objects = Arc::clone(&objects);
        move |object: u64| format!("{objects}/{}/batch", room_name(object))
    };
    // Each of kura's turns ends with every object's captures done
    // ([`crate::server::capture_by_bookmark`]). A request per object costs more than the
    // captures alone: the conservative side.
    let capture_all = {
        let http = http.clone();
        move || {
            let (http, objects) = (http.clone(), Arc::clone(&objects));
            async move {
                futures_util::stream::iter(0..OBJECTS)
                    .for_each_concurrent(CLIENTS, |object| {
                        let url = format!("{objects}/{}/bookmark", room_name(object));
                        let http = http.clone();
                        async move { crate::server::capture_by_bookmark(&http, &url).await }
                    })
                    .await;
            }
        }
    };
    let batch_body = |statements: &[(&str, Option<String>)]| {
        let operations: Vec<Json> = statements
            .iter()
            .map(|(sql, param)| json!({ "op": "sql", "sql": sql, "params": param.iter().collect::<Vec<_>>() }))
            .collect();
        json!({ "operations": operations }).to_string()
    };
    let send = {
        let http = http.clone();
        move |(url, body): (String, String)| {
            let http = http.clone();
            async move { crate::server::post_ok(&http, &url, body).await }
        }
    };
    let created_at = Instant::now();
    for object in 0..OBJECTS {
        send((batch_url(object), batch_body(&[(CREATE, None), (WRITE, Some("seed".into()))]))).await;
    }
    eprintln!("{OBJECTS} objects created over HTTP in {:.1} s; the load begins", created_at.elapsed().as_secs_f64());
    let next = Arc::new(AtomicU64::new(0));
    // Load 0 is kura's batch endpoint; load 1 the floor server, sent the same bodies; load 2
    // the limit; load 3 the same server's `/healthz` (the HTTP floor).
    let health = format!("http://{api}/healthz");
    let load = |which: usize, clients, slice, limit: &Arc<LimitLoad>| {
        let (send, batch_url, next, limit) = (send.clone(), batch_url.clone(), Arc::clone(&next), Arc::clone(limit));
        let capture_all = (which == 0).then(|| capture_all.clone());
        let floor_objects = (which == 1).then(|| format!("{floor}/objects"));
        let (http, health) = (http.clone(), health.clone());
        async move {
            match which {
                2 => return limit.take_turn(slice).await,
                3 => return load::http_floor_timed(&http, &health, clients, slice).await,
                _ => {}
            }
            let served = load::run_timed(clients, slice, move |client, n| {
                let user = format!("u{}", next.fetch_add(1, Ordering::Relaxed));
                let object = object_for(client, n);
                let body = batch_body(&[(WRITE, Some(user)), (READ, None)]);
                let url = match &floor_objects {
                    None => batch_url(object),
                    Some(floor_objects) => format!("{floor_objects}/{object}"),
                };
                let send = send.clone();
                async move {
                    send((url, body)).await;
                    1
                }
            })
            .await;
            load::then_timed(served, async {
                if let Some(capture_all) = capture_all {
                    capture_all().await;
                }
            })
            .await
        }
    };
    let in_turns = async |clients| -> anyhow::Result<[Stats; 4]> {
        let limit = LimitLoad::open(limit_dir, clients)?;
        Ok(load::alternately(duration, |which, slice| load(which, clients, slice, &limit)).await)
    };
    let [batch_16, object_floor_16, limit_16, floor_16] =
        if wanted("http16") { in_turns(CLIENTS).await? } else { Default::default() };
    let [batch_1, object_floor_1, limit_1, floor_1] =
        if wanted("http1") { in_turns(1).await? } else { Default::default() };
    Ok(HttpFigures { batch_16, batch_1, floor_16, floor_1, object_floor_16, object_floor_1, limit_16, limit_1 })
}
