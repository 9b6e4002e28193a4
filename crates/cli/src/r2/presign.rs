//! `kura r2 presign`: a URL that lets its holder GET or PUT (or HEAD, DELETE) one object until it
//! expires, signed with SigV4 in the query string by `aws-sigv4`, exactly as R2 checks it.

use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use clap::Args;

/// R2's longest presigned lifetime.
const MAX_EXPIRY: u64 = 604_800;

#[derive(Args)]
pub struct PresignArgs {
    /// BUCKET/KEY.
    path: String,
    /// The method the URL allows: GET, PUT, HEAD or DELETE.
    #[arg(long, default_value = "GET")]
    method: String,
    /// Seconds until the URL expires (at most 604800, a week).
    #[arg(long, default_value_t = 3600)]
    expires: u64,
    /// Sign this Content-Type: a PUT must then send exactly it.
    #[arg(long)]
    content_type: Option<String>,
    /// The S3 endpoint (default: AWS_ENDPOINT_URL, else http://127.0.0.1:8781).
    #[arg(long)]
    endpoint: Option<String>,
    /// Sign with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY rather than a key of the local data
    /// directory.
    #[arg(long)]
    remote: bool,
    #[command(flatten)]
    data: crate::DataArgs,
}

/// Percent-encodes each path segment as S3 clients do (RFC 3986 unreserved kept, `/` kept).
fn encode_path(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What a presigned URL allows.
pub struct Presign<'a> {
    /// The S3 endpoint, path-style.
    pub endpoint: &'a str,
    pub bucket: &'a str,
    pub key: &'a str,
    /// GET, PUT, HEAD or DELETE.
    pub method: &'a str,
    pub expires: Duration,
    /// A Content-Type the request must send.
    pub content_type: Option<&'a str>,
}

/// The URL for `presign`, signed with this key at `now`.
pub fn presigned_url(
    presign: &Presign<'_>,
    access_key_id: &str,
    secret_access_key: &str,
    now: SystemTime,
) -> anyhow::Result<String> {
    let Presign { endpoint, bucket, key, method, expires, content_type } = *presign;
    let url = format!("{}/{bucket}/{}", endpoint.trim_end_matches('/'), encode_path(key));
    let host = url::Url::parse(&url)
        .ok()
        .and_then(|u| {
            u.host_str().map(|h| match u.port() {
                Some(p) => format!("{h}:{p}"),
                None => h.to_owned(),
            })
        })
        .context("the endpoint is not a URL")?;
    let mut headers = vec![("host", host.as_str())];
    if let Some(ct) = content_type {
        headers.push(("content-type", ct));
    }
    kura_client::sigv4::presigned_url(method, &url, &headers, (access_key_id, secret_access_key), expires, now)
        .map_err(anyhow::Error::msg)
        .context("cannot sign that URL")
}

pub async fn run(args: PresignArgs) -> anyhow::Result<()> {
    let (bucket, key) = super::bucket_and_key(&args.path)?;
    let method = args.method.to_ascii_uppercase();
    if !matches!(method.as_str(), "GET" | "PUT" | "HEAD" | "DELETE") {
        bail!("R2 presigns GET, PUT, HEAD and DELETE, not {method}");
    }
    if args.expires == 0 || args.expires > MAX_EXPIRY {
        bail!("--expires must be between 1 and {MAX_EXPIRY} seconds (a week)");
    }
    let endpoint = args
        .endpoint
        .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
        .unwrap_or_else(|| "http://127.0.0.1:8781".to_owned());
    let (access_key_id, secret) = if args.remote {
        (
            std::env::var("AWS_ACCESS_KEY_ID").context("--remote presigning needs AWS_ACCESS_KEY_ID")?,
            std::env::var("AWS_SECRET_ACCESS_KEY").context("--remote presigning needs AWS_SECRET_ACCESS_KEY")?,
        )
    } else {
        local_s3_key(&args.data)?
    };
    let presign = Presign {
        endpoint: &endpoint,
        bucket,
        key,
        method: &method,
        expires: Duration::from_secs(args.expires),
        content_type: args.content_type.as_deref(),
    };
    let url = presigned_url(&presign, &access_key_id, &secret, SystemTime::now())?;
    println!("{url}");
    Ok(())
}

/// The S3 key derived from one of the account's live tokens with R2 write access to every
/// bucket. Only the catalog is read, which is safe while a server runs on the directory.
fn local_s3_key(data: &crate::DataArgs) -> anyhow::Result<(String, String)> {
    let path = data.data.join("catalog.sqlite");
    if !path.exists() {
        bail!("no data directory at {}: start kura there first, or sign with --remote", data.data.display());
    }
    let catalog = kura_catalog::Catalog::open(&path)?;
    let account = match std::env::var("KURA_ACCOUNT_ID") {
        Ok(id) => catalog.account(&id)?,
        Err(_) => catalog.default_account()?,
    }
    .context("the data directory has no account yet")?;
    for token in catalog.tokens(&account.id)? {
        if token.revoked_at.is_none()
            && let Some(key) = catalog.s3_credential(&token.id)?
            && key.scope.can_write_r2()
            && key.buckets.is_none()
        {
            return Ok((key.access_key_id, key.secret_access_key));
        }
    }
    bail!("the account has no token with R2 write access to sign with; create one with `kura tokens create`")
}
