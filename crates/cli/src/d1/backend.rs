//! Where `kura d1` commands run: in-process on the data directory (`--local`), or against a
//! server speaking Cloudflare's v4 API (`--remote`). Both answer in the v4 API's JSON shapes,
//! so the commands print the same way whichever runs them.

use std::path::Path;

use anyhow::{Context, bail};
use reqwest::Method;
use serde_json::{Value as Json, json};

use crate::DataArgs;
use crate::config::Target;
use crate::local::Local;
use kura_client::ApiClient;
use kura_d1::dump::DumpOptions;
use kura_d1::wire::{JsonResults, RowFormat, ServedBy, created_database, database_details, database_list_item};
use kura_d1::{CreateOptions, Request, Statement};

/// Where commands run.
pub enum Backend {
    /// In-process.
    Local(Box<Local>),
    /// Over the v4 API.
    Remote(ApiClient),
}

/// Streams a URL into a file, with a progress bar.
async fn download(url: &str, output: &Path) -> anyhow::Result<()> {
    let mut response = reqwest::get(url).await.context("downloading the export")?;
    if !response.status().is_success() {
        bail!("downloading the export failed with status {}", response.status());
    }
    let bar = crate::progress::bytes("Downloading", response.content_length().unwrap_or(0));
    let mut out =
        tokio::fs::File::create(output).await.with_context(|| format!("cannot create {}", output.display()))?;
    while let Some(chunk) = response.chunk().await.context("downloading the export")? {
        tokio::io::AsyncWriteExt::write_all(&mut out, &chunk).await?;
        bar.inc(chunk.len() as u64);
    }
    tokio::io::AsyncWriteExt::flush(&mut out).await?;
    bar.finish_and_clear();
    Ok(())
}

/// D1's import flow: announce the file by its MD5, upload it, have it ingested, poll.
async fn import_remotely(api: &ApiClient, uuid: &str, file: &Path, size: u64) -> anyhow::Result<Json> {
    let etag = md5_of(file)?;
    let path = api.account_path(&format!("/d1/database/{uuid}/import"));
    let init = api.call(Method::POST, &path, Some(&json!({ "action": "init", "etag": etag }))).await?;
    let mut answer = match init["upload_url"].as_str() {
        Some(url) => {
            let filename = init["filename"].clone();
            upload(url, file, size, &etag).await?;
            api.call(Method::POST, &path, Some(&json!({ "action": "ingest", "filename": filename, "etag": etag })))
                .await?
        }
        None => init,
    };
    loop {
        if answer["success"] == false {
            bail!("the import failed: {}", answer["error"].as_str().unwrap_or("unknown error"));
        }
        match answer["status"].as_str() {
            Some("complete") => return Ok(answer["result"].clone()),
            Some("error") => {
                let errors: Vec<&str> =
                    answer["errors"].as_array().into_iter().flatten().filter_map(Json::as_str).collect();
                bail!("the import failed and changed nothing: {}", errors.join("; "));
            }
            _ => {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                let poll = json!({ "action": "poll", "current_bookmark": answer["at_bookmark"] });
                answer = api.call(Method::POST, &path, Some(&poll)).await?;
            }
        }
    }
}

fn md5_of(file: &Path) -> anyhow::Result<String> {
    use md5::Digest;
    let mut hash = md5::Md5::new();
    let mut reader = std::fs::File::open(file).with_context(|| format!("cannot read {}", file.display()))?;
    std::io::copy(&mut reader, &mut hash)?;
    Ok(hex::encode(hash.finalize()))
}

/// PUTs a file to an upload URL with a progress bar, and checks the ETag that comes back.
async fn upload(url: &str, file: &Path, size: u64, etag: &str) -> anyhow::Result<()> {
    let bar = crate::progress::bytes("Uploading", size);
    let reader = tokio::fs::File::open(file).await.with_context(|| format!("cannot read {}", file.display()))?;
    let stream = tokio_util::io::ReaderStream::with_capacity(bar.wrap_async_read(reader), 256 * 1024);
    let response = reqwest::Client::new()
        .put(url)
        .header(reqwest::header::CONTENT_LENGTH, size)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .context("uploading the file")?;
    bar.finish_and_clear();
    if !response.status().is_success() {
        bail!("the file could not be uploaded: {}", response.text().await.unwrap_or_default());
    }
    let echoed = response
        .headers()
        .get(reqwest::header::ETAG)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .trim_matches('"')
        .to_owned();
    if echoed != etag {
        bail!("the file did not upload intact (sent MD5 {etag}, the server got {echoed}); please retry");
    }
    Ok(())
}

/// Unix milliseconds as the ISO 8601 text Cloudflare's API takes.
fn iso(ms: i64) -> anyhow::Result<String> {
    Ok(jiff::Timestamp::from_millisecond(ms)?.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
}

/// Percent-encodes a path segment (database names are plain, but be safe with anything).
fn segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Backend {
    pub async fn open(remote: bool, data: &DataArgs) -> anyhow::Result<Self> {
        if remote {
            return Ok(Backend::Remote(ApiClient::from_env().await?));
        }
        Ok(Backend::Local(Box::new(Local::open(data)?)))
    }

    pub fn is_remote(&self) -> bool {
        matches!(self, Backend::Remote(_))
    }

    pub async fn create(&self, name: &str, options: CreateOptions) -> anyhow::Result<Json> {
        match self {
            Backend::Local(l) => Ok(created_database(&l.node.d1().create(&l.account, name, options).await?)),
            Backend::Remote(api) => {
                let mut body = json!({ "name": name });
                if let Some(hint) = options.primary_location_hint {
                    body["primary_location_hint"] = json!(hint);
                }
                if let Some(j) = options.jurisdiction {
                    body["jurisdiction"] = json!(j);
                }
                api.call(Method::POST, &api.account_path("/d1/database"), Some(&body)).await.map_err(Into::into)
            }
        }
    }

    /// Every database, all pages.
    pub async fn list(&self) -> anyhow::Result<Vec<Json>> {
        match self {
            Backend::Local(l) => {
                let listing = l.node.d1().list(&l.account, None, 1, u64::MAX)?;
                Ok(listing.databases.iter().map(database_list_item).collect())
            }
            Backend::Remote(api) => {
                let mut all = Vec::new();
                for page in 1.. {
                    let path = api.account_path(&format!("/d1/database?page={page}&per_page=100"));
                    let items = api.call(Method::GET, &path, None).await?;
                    let items = items.as_array().cloned().unwrap_or_default();
                    let done = items.len() < 100;
                    all.extend(items);
                    if done {
                        break;
                    }
                }
                Ok(all)
            }
        }
    }

    /// The database's id: the configuration's, or looked up by name.
    pub async fn resolve(&self, target: &Target) -> anyhow::Result<String> {
        match self {
            Backend::Local(l) => {
                let d1 = l.node.d1();
                if let Some(found) = target.id.as_deref().and_then(|id| d1.get(&l.account, id).ok()) {
                    return Ok(found.uuid.clone());
                }
                match d1.get(&l.account, &target.name) {
                    Ok(db) => Ok(db.uuid.clone()),
                    // A database the configuration declares is created locally on first use, as
                    // wrangler's local mode does.
                    Err(kura_d1::Error::NotFound(_)) if target.binding.is_some() => {
                        Ok(d1.create(&l.account, &target.name, CreateOptions::default()).await?.uuid)
                    }
                    Err(e) => Err(e).with_context(|| {
                        format!("no local database '{}'; create it with `kura d1 create {}`", target.name, target.name)
                    }),
                }
            }
            Backend::Remote(api) => {
                if let Some(id) = &target.id {
                    return Ok(id.clone());
                }
                let path = api.account_path(&format!("/d1/database/{}?fields=uuid,name", segment(&target.name)));
                // Only an answer that there is no such database is reported as one: a refused
                // token or a failing server says so in its own words.
                let found = match api.call(Method::GET, &path, None).await {
                    Err(e) if e.is_not_found() => {
                        return Err(anyhow::Error::new(e).context(format!(
                            "Couldn't find a D1 DB with name or binding '{}' in your config or the API",
                            target.name
                        )));
                    }
                    found => found?,
                };
                found["uuid"].as_str().map(str::to_owned).context("the API answered without a database id")
            }
        }
    }

    pub async fn details(&self, uuid: &str) -> anyhow::Result<Json> {
        match self {
            Backend::Local(l) => Ok(Json::Object(database_details(&l.node.d1().details(&l.account, uuid).await?))),
            Backend::Remote(api) => api
                .call(Method::GET, &api.account_path(&format!("/d1/database/{uuid}")), None)
                .await
                .map_err(Into::into),
        }
    }

    pub async fn delete(&self, uuid: &str) -> anyhow::Result<()> {
        match self {
            Backend::Local(l) => {
                l.node.d1().delete(&l.account, uuid).await?;
            }
            Backend::Remote(api) => {
                api.call(Method::DELETE, &api.account_path(&format!("/d1/database/{uuid}")), None).await?;
            }
        }
        Ok(())
    }

    /// Runs SQL (one or many statements) atomically; results as `/query` returns them.
    pub async fn query(&self, uuid: &str, sql: &str) -> anyhow::Result<Vec<Json>> {
        match self {
            Backend::Local(l) => {
                let request = Request::new(vec![Statement::new(sql)]);
                let results = l.node.d1().query(&l.account, uuid, request).await?;
                let json = serde_json::to_value(JsonResults {
                    results: &results,
                    format: RowFormat::Objects,
                    served_by: ServedBy::PRIMARY,
                })?;
                Ok(json.as_array().cloned().unwrap_or_default())
            }
            Backend::Remote(api) => {
                let path = api.account_path(&format!("/d1/database/{uuid}/query"));
                let result = api.call(Method::POST, &path, Some(&json!({ "sql": sql }))).await?;
                Ok(result.as_array().cloned().unwrap_or_default())
            }
        }
    }

    /// The current bookmark, or the one for a time (Unix milliseconds).
    pub async fn bookmark(&self, uuid: &str, at: Option<i64>) -> anyhow::Result<String> {
        match self {
            Backend::Local(l) => Ok(l.node.d1().bookmark(&l.account, uuid, at).await?.to_string()),
            Backend::Remote(api) => {
                let query = match at {
                    Some(ms) => format!("?timestamp={}", segment(&iso(ms)?)),
                    None => String::new(),
                };
                let path = api.account_path(&format!("/d1/database/{uuid}/time_travel/bookmark{query}"));
                let result = api.call(Method::GET, &path, None).await?;
                result["bookmark"].as_str().map(str::to_owned).context("the API answered without a bookmark")
            }
        }
    }

    /// Restores to a bookmark; returns `{bookmark, previous_bookmark, message}`.
    pub async fn restore(&self, uuid: &str, bookmark: &str) -> anyhow::Result<Json> {
        match self {
            Backend::Local(l) => {
                let target = kura_d1::RestoreTarget::Bookmark(bookmark.to_owned());
                let restored = l.node.d1().restore(&l.account, uuid, target).await?;
                Ok(kura_d1::wire::restored(&restored))
            }
            Backend::Remote(api) => {
                let path = api
                    .account_path(&format!("/d1/database/{uuid}/time_travel/restore?bookmark={}", segment(bookmark)));
                api.call(Method::POST, &path, None).await.map_err(Into::into)
            }
        }
    }

    /// Exports the database as SQL into `output`.
    pub async fn export(&self, uuid: &str, options: DumpOptions, output: &Path) -> anyhow::Result<()> {
        match self {
            Backend::Local(l) => {
                l.node.d1().export(&l.account, uuid, options, output.to_owned()).await?;
                Ok(())
            }
            Backend::Remote(api) => {
                let body = json!({
                    "output_format": "polling",
                    "dump_options": { "no_schema": options.no_schema, "no_data": options.no_data, "tables": options.tables },
                });
                let path = api.account_path(&format!("/d1/database/{uuid}/export"));
                let mut answer = api.call(Method::POST, &path, Some(&body)).await?;
                // A server that exports in the background answers "active" until it is done.
                while answer["status"] == "active" {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    let poll = json!({ "output_format": "polling", "dump_options": body["dump_options"], "current_bookmark": answer["at_bookmark"] });
                    answer = api.call(Method::POST, &path, Some(&poll)).await?;
                }
                if answer["status"] != "complete" {
                    bail!("the export failed: {}", answer["error"].as_str().unwrap_or("unknown error"));
                }
                let url = answer["result"]["signed_url"].as_str().context("the export has no download URL")?;
                download(url, output).await
            }
        }
    }

    /// Runs a file of SQL in one transaction; returns wrangler's import result
    /// (`num_queries`, `final_bookmark`, `meta`).
    pub async fn import(&self, uuid: &str, file: &Path) -> anyhow::Result<Json> {
        let size = std::fs::metadata(file).with_context(|| format!("cannot read {}", file.display()))?.len();
        match self {
            Backend::Local(l) => {
                let bar = crate::progress::bytes("Importing", size);
                let reader = std::fs::File::open(file).with_context(|| format!("cannot read {}", file.display()))?;
                let input = Box::new(std::io::BufReader::with_capacity(256 * 1024, bar.wrap_read(reader)));
                let outcome = l.node.d1().import(&l.account, uuid, input).await;
                bar.finish_and_clear();
                let (outcome, bookmark) = outcome?;
                Ok(kura_d1::wire::imported(&outcome, &bookmark))
            }
            Backend::Remote(api) => import_remotely(api, uuid, file, size).await,
        }
    }

    /// Queries, rows read and rows written in the last 24 hours.
    pub async fn usage_24h(&self, uuid: &str) -> anyhow::Result<[u64; 4]> {
        let now = jiff::Timestamp::now();
        let from = now.as_second() - 24 * 3600;
        match self {
            Backend::Local(l) => {
                let mut sums = [0u64; 4];
                for u in l.node.d1().usage(uuid, from, now.as_second())? {
                    sums[0] += u.read_queries;
                    sums[1] += u.write_queries;
                    sums[2] += u.rows_read;
                    sums[3] += u.rows_written;
                }
                Ok(sums)
            }
            Backend::Remote(api) => {
                let body = json!({
                    "query": "query getD1MetricsOverviewQuery($accountTag: string, $filter: ZoneWorkersRequestsFilter_InputObject) { viewer { accounts(filter: {accountTag: $accountTag}) { d1AnalyticsAdaptiveGroups(limit: 10000, filter: $filter) { sum { readQueries writeQueries rowsRead rowsWritten } dimensions { datetimeHour } } } } }",
                    "variables": {
                        "accountTag": api.account,
                        "filter": { "AND": [{
                            "datetimeHour_geq": jiff::Timestamp::from_second(from)?.to_string(),
                            "datetimeHour_leq": now.to_string(),
                            "databaseId": uuid,
                        }]},
                    },
                });
                let answer = api.call_raw(Method::POST, "/graphql", &body).await?;
                let mut sums = [0u64; 4];
                let groups = &answer["data"]["viewer"]["accounts"][0]["d1AnalyticsAdaptiveGroups"];
                for g in groups.as_array().into_iter().flatten() {
                    for (i, key) in ["readQueries", "writeQueries", "rowsRead", "rowsWritten"].iter().enumerate() {
                        sums[i] += g["sum"][key].as_u64().unwrap_or(0);
                    }
                }
                Ok(sums)
            }
        }
    }

    /// Closes the data directory cleanly (local) after the command.
    pub async fn close(self) {
        if let Backend::Local(l) = self {
            l.node.d1().shutdown().await;
        }
    }
}
