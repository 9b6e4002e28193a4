//! Where `kura r2` commands run: in-process on the data directory, or over the v4 API. Both
//! answer in the v4 API's JSON shapes.

use std::path::Path;

use anyhow::Context;
use clap::Args;
use futures_util::{StreamExt, TryStreamExt};
use reqwest::Method;
use serde_json::{Value as Json, json};
use tokio::io::AsyncWriteExt;

use kura_r2::{GetOptions, HttpMetadata, ListOptions, PutOptions};

use crate::DataArgs;
use crate::local::Local;
use kura_client::ApiClient;
use kura_client::v4::Envelope;
use kura_server::render::{bucket_json, r2_object_json};

/// HTTP metadata given on the command line.
#[derive(Args, Clone, Debug, Default)]
pub struct ObjectMetadata {
    /// Content-Type.
    #[arg(long, short = 'c')]
    pub content_type: Option<String>,
    /// Content-Disposition.
    #[arg(long, short = 'd')]
    pub content_disposition: Option<String>,
    /// Content-Encoding.
    #[arg(long, short = 'e')]
    pub content_encoding: Option<String>,
    /// Content-Language.
    #[arg(long)]
    pub content_language: Option<String>,
    /// Cache-Control.
    #[arg(long)]
    pub cache_control: Option<String>,
    /// Expires (an HTTP date).
    #[arg(long)]
    pub expires: Option<String>,
}

impl ObjectMetadata {
    fn http(&self) -> HttpMetadata {
        HttpMetadata {
            content_type: self.content_type.clone(),
            content_language: self.content_language.clone(),
            content_disposition: self.content_disposition.clone(),
            content_encoding: self.content_encoding.clone(),
            cache_control: self.cache_control.clone(),
            expires: self.expires.clone(),
        }
    }

    fn headers(&self) -> Vec<(&'static str, &String)> {
        [
            ("content-type", &self.content_type),
            ("content-disposition", &self.content_disposition),
            ("content-encoding", &self.content_encoding),
            ("content-language", &self.content_language),
            ("cache-control", &self.cache_control),
            ("expires", &self.expires),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.as_ref().map(|v| (name, v)))
        .collect()
    }
}

/// Where commands run.
pub enum Backend {
    /// In-process.
    Local(Box<Local>),
    /// Over the v4 API.
    Remote(ApiClient),
}

/// Percent-encodes an object key for a URL path, keeping `/`.
fn key_path(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
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

    fn local_bucket(local: &Local, name: &str) -> anyhow::Result<kura_catalog::R2Bucket> {
        local.node.catalog().r2_bucket(&local.account, name)?.with_context(|| format!("no bucket named '{name}'"))
    }

    pub async fn create_bucket(&self, name: &str, location: Option<&str>, class: Option<&str>) -> anyhow::Result<Json> {
        match self {
            Backend::Local(l) => {
                let bucket =
                    kura_server::buckets::create(l.node.catalog(), l.node.r2(), &l.account, name, location, class)
                        .await?;
                Ok(bucket_json(&bucket))
            }
            Backend::Remote(api) => {
                let mut body = json!({ "name": name });
                if let Some(l) = location {
                    body["locationHint"] = json!(l);
                }
                if let Some(c) = class {
                    body["storageClass"] = json!(c);
                }
                api.call(Method::POST, &api.account_path("/r2/buckets"), Some(&body)).await.map_err(Into::into)
            }
        }
    }

    pub async fn list_buckets(&self) -> anyhow::Result<Vec<Json>> {
        match self {
            Backend::Local(l) => Ok(l.node.catalog().list_r2_buckets(&l.account)?.iter().map(bucket_json).collect()),
            Backend::Remote(api) => {
                let result = api.call(Method::GET, &api.account_path("/r2/buckets"), None).await?;
                Ok(result["buckets"].as_array().cloned().unwrap_or_default())
            }
        }
    }

    pub async fn delete_bucket(&self, name: &str) -> anyhow::Result<()> {
        match self {
            Backend::Local(l) => {
                kura_server::buckets::delete(l.node.catalog(), l.node.r2(), &l.account, name).await?;
            }
            Backend::Remote(api) => {
                api.call(Method::DELETE, &api.account_path(&format!("/r2/buckets/{name}")), None).await?;
            }
        }
        Ok(())
    }

    /// Uploads `file` (or standard input when `None`) with a progress bar.
    pub async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        file: Option<&Path>,
        metadata: &ObjectMetadata,
    ) -> anyhow::Result<Json> {
        let stdin_copy;
        let file = match file {
            Some(file) => file,
            None => {
                stdin_copy = super::stdin_to_temp()?;
                stdin_copy.path()
            }
        };
        let size = std::fs::metadata(file).with_context(|| format!("cannot read {}", file.display()))?.len();
        let reader = tokio::fs::File::open(file).await.with_context(|| format!("cannot read {}", file.display()))?;
        let bar = crate::progress::bytes("Uploading", size);
        let stream = tokio_util::io::ReaderStream::with_capacity(bar.wrap_async_read(reader), 256 * 1024);
        let result = match self {
            Backend::Local(l) => {
                let bucket = Self::local_bucket(l, bucket)?;
                let options = PutOptions { http: metadata.http(), size: Some(size), ..Default::default() };
                let info = l.node.r2().put_object(&bucket.id, key, stream, options).await?;
                Ok(r2_object_json(&info))
            }
            Backend::Remote(api) => {
                let path = api.account_path(&format!("/r2/buckets/{bucket}/objects/{}", key_path(key)));
                let mut request = api
                    .request(Method::PUT, &path)
                    .header(reqwest::header::CONTENT_LENGTH, size)
                    .body(reqwest::Body::wrap_stream(stream));
                for (name, value) in metadata.headers() {
                    request = request.header(name, value);
                }
                let response = api.send(request, &format!("Uploading {bucket}/{key}")).await?;
                let envelope: Json = response.json().await.context("reading the upload's answer")?;
                Ok(envelope["result"].clone())
            }
        };
        bar.finish_and_clear();
        result
    }

    /// Downloads an object to `file`, or to standard output when `None`.
    pub async fn get_object(&self, bucket: &str, key: &str, file: Option<&Path>) -> anyhow::Result<()> {
        let (size, mut stream): (u64, futures_util::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>) =
            match self {
                Backend::Local(l) => {
                    let bucket = Self::local_bucket(l, bucket)?;
                    let object = l.node.r2().get_object(&bucket.id, key, GetOptions::default()).await?;
                    (object.length(), object.body.boxed())
                }
                Backend::Remote(api) => {
                    let path = api.account_path(&format!("/r2/buckets/{bucket}/objects/{}", key_path(key)));
                    let response =
                        api.send(api.request(Method::GET, &path), &format!("Downloading {bucket}/{key}")).await?;
                    let size = response.content_length().unwrap_or(0);
                    (size, response.bytes_stream().map_err(std::io::Error::other).boxed())
                }
            };
        let bar = crate::progress::bytes("Downloading", size);
        match file {
            Some(path) => {
                let mut out =
                    tokio::fs::File::create(path).await.with_context(|| format!("cannot create {}", path.display()))?;
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.context("the download broke off")?;
                    out.write_all(&chunk).await?;
                    bar.inc(chunk.len() as u64);
                }
                out.flush().await?;
            }
            None => {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                while let Some(chunk) = stream.next().await {
                    out.write_all(&chunk.context("the download broke off")?)?;
                }
                out.flush()?;
            }
        }
        bar.finish_and_clear();
        Ok(())
    }

    pub async fn delete_object(&self, bucket: &str, key: &str) -> anyhow::Result<()> {
        match self {
            Backend::Local(l) => {
                let bucket = Self::local_bucket(l, bucket)?;
                l.node.r2().delete_object(&bucket.id, key).await?;
            }
            Backend::Remote(api) => {
                let path = api.account_path(&format!("/r2/buckets/{bucket}/objects/{}", key_path(key)));
                api.call(Method::DELETE, &path, None).await?;
            }
        }
        Ok(())
    }

    /// Every object (and common prefix) under `prefix`, all pages.
    pub async fn list_objects(
        &self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
    ) -> anyhow::Result<(Vec<Json>, Vec<String>)> {
        let (mut objects, mut prefixes) = (Vec::new(), Vec::new());
        let mut cursor: Option<String> = None;
        loop {
            let (page_objects, page_prefixes, next) = match self {
                Backend::Local(l) => {
                    let bucket = Self::local_bucket(l, bucket)?;
                    let options = ListOptions {
                        prefix: prefix.to_owned(),
                        delimiter: delimiter.map(str::to_owned),
                        cursor: cursor.clone(),
                        limit: 1000,
                        ..Default::default()
                    };
                    let page = l.node.r2().list(&bucket.id, options).await?;
                    (page.objects.iter().map(r2_object_json).collect(), page.prefixes, page.cursor)
                }
                Backend::Remote(api) => {
                    let path = api.account_path(&format!("/r2/buckets/{bucket}/objects"));
                    let mut query = vec![("prefix", prefix.to_owned()), ("per_page", "1000".to_owned())];
                    if let Some(d) = delimiter {
                        query.push(("delimiter", d.to_owned()));
                    }
                    if let Some(c) = &cursor {
                        query.push(("cursor", c.clone()));
                    }
                    let response = api.send(api.request(Method::GET, &path).query(&query), "Listing objects").await?;
                    let envelope: Envelope<Vec<Json>> = response.json().await.context("reading the listing")?;
                    let info = envelope.result_info.unwrap_or_default();
                    let next = (info.is_truncated == Some(true)).then(|| info.cursor.unwrap_or_default());
                    (envelope.result.unwrap_or_default(), info.delimited.unwrap_or_default(), next)
                }
            };
            objects.extend(page_objects);
            prefixes.extend(page_prefixes);
            match next {
                Some(next) if !next.is_empty() => cursor = Some(next),
                _ => break,
            }
        }
        Ok((objects, prefixes))
    }
}
