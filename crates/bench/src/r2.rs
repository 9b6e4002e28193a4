//! The R2 suite: kura's S3 listener over HTTP (SigV4-signed requests, 16 clients) for 1 KiB and
//! 1 MiB PUT and GET, a 1 GiB multipart upload streamed back whole with the process's memory
//! watched; beside the physical limit (the same bytes written durably and read back through one
//! file) and the peer (Miniflare's R2).

use std::io::{Read, Seek, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::load::{self, Stats};
use crate::report::{self, Row};
use crate::server::{Kura, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY};
use crate::{Settings, peer};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;
pub(crate) const BUCKET: &str = "bench";

/// An S3 client that signs every request (SigV4 in headers, unsigned payload).
#[derive(Clone)]
pub(crate) struct S3 {
    http: reqwest::Client,
    endpoint: Arc<str>,
    host: Arc<str>,
}

impl S3 {
    pub(crate) fn new(endpoint: &str) -> S3 {
        let host = endpoint.trim_start_matches("http://").to_owned();
        S3 { http: reqwest::Client::new(), endpoint: endpoint.into(), host: host.into() }
    }

    pub(crate) fn signed(&self, method: reqwest::Method, path_and_query: &str) -> reqwest::RequestBuilder {
        let url = format!("{}{path_and_query}", self.endpoint);
        let signed = kura_client::sigv4::signed_headers(
            method.as_str(),
            &url,
            &[("host", &*self.host)],
            S3_ACCESS_KEY_ID,
            S3_SECRET_ACCESS_KEY,
        )
        .expect("signing");
        let mut builder = self.http.request(method, &url);
        for (name, value) in signed {
            builder = builder.header(name, value);
        }
        builder
    }

    pub(crate) async fn put(&self, key: &str, body: bytes::Bytes) -> String {
        let response =
            self.signed(reqwest::Method::PUT, &format!("/{BUCKET}/{key}")).body(body).send().await.expect("PUT");
        let status = response.status();
        let etag = response.headers().get("etag").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        let text = response.text().await.unwrap_or_default();
        assert!(status.is_success(), "PUT {key}: {status} {text}");
        etag
    }

    /// GETs an object and counts its bytes without keeping them.
    pub(crate) async fn get(&self, key: &str) -> u64 {
        let mut response = self.signed(reqwest::Method::GET, &format!("/{BUCKET}/{key}")).send().await.expect("GET");
        assert!(response.status().is_success(), "GET {key}: {}", response.status());
        let mut total = 0;
        while let Some(chunk) = response.chunk().await.expect("GET body") {
            total += chunk.len() as u64;
        }
        total
    }
}

/// The physical limit: `size`-byte writes appended to one file, each made durable (fsync), as
/// each PUT is; then the same bytes read back in order.
fn limit(dir: &std::path::Path, size: usize, duration: Duration) -> anyhow::Result<(Stats, Stats)> {
    let path = dir.join(format!("limit-{size}"));
    let mut file = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path)?;
    let data = vec![7u8; size];
    let mut latencies = Vec::new();
    let start = Instant::now();
    while start.elapsed() < duration {
        let began = Instant::now();
        file.write_all(&data)?;
        file.sync_data()?;
        latencies.push(began.elapsed());
    }
    let written = latencies.len() as u64;
    let write = Stats::from_latencies(latencies, written, start.elapsed());
    file.rewind()?;
    let mut buffer = vec![0u8; size];
    let mut latencies = Vec::new();
    let start = Instant::now();
    for _ in 0..written {
        let began = Instant::now();
        file.read_exact(&mut buffer)?;
        latencies.push(began.elapsed());
    }
    let read = Stats::from_latencies(latencies, written, start.elapsed());
    drop(file);
    std::fs::remove_file(path)?;
    Ok((write, read))
}

/// The disk's own read bandwidth: the file read back with O_DIRECT (past the page cache) in
/// `size` reads. `None` where the file system refuses O_DIRECT.
fn disk_read(dir: &std::path::Path, size: usize, duration: Duration) -> anyhow::Result<Option<Stats>> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("limit-direct");
    {
        let mut file = std::fs::File::create(&path)?;
        let data = vec![5u8; size];
        let start = Instant::now();
        while start.elapsed() < duration {
            file.write_all(&data)?;
        }
        file.sync_all()?;
    }
    let Ok(mut file) = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path) else {
        return Ok(None);
    };
    let layout = std::alloc::Layout::from_size_align(size, 4096)?;
    // SAFETY: the layout has a non-zero size; the buffer is freed below and used only here.
    let buffer = unsafe { std::alloc::alloc_zeroed(layout) };
    anyhow::ensure!(!buffer.is_null(), "out of memory");
    // SAFETY: `buffer` points at `size` initialised bytes that nothing else references.
    let slice = unsafe { std::slice::from_raw_parts_mut(buffer, size) };
    let mut latencies = Vec::new();
    let start = Instant::now();
    let outcome = loop {
        let began = Instant::now();
        match file.read(slice) {
            Ok(n) if n == size => latencies.push(began.elapsed()),
            Ok(_) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    let elapsed = start.elapsed();
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(buffer, layout) };
    std::fs::remove_file(&path)?;
    if outcome.is_err() || latencies.is_empty() {
        return Ok(None);
    }
    let reads = latencies.len() as u64;
    Ok(Some(Stats::from_latencies(latencies, reads, elapsed)))
}

struct Figures {
    put_1k: Stats,
    get_1k: Stats,
    put_1m: Stats,
    get_1m: Stats,
    multipart_upload: Stats,
    multipart_download: Stats,
    memory_before: f64,
    memory_peak: f64,
}

async fn measure(s3: S3, duration: Duration, gib: f64) -> anyhow::Result<Figures> {
    let response = s3.signed(reqwest::Method::PUT, &format!("/{BUCKET}")).send().await?;
    anyhow::ensure!(response.status().is_success(), "creating the bucket: {}", response.status());
    let small = bytes::Bytes::from(vec![7u8; KIB]);
    let big = bytes::Bytes::from(vec![9u8; MIB]);

    eprintln!("R2: 1 KiB PUT and GET, 16 clients…");
    let put_1k = {
        let (s3, small) = (s3.clone(), small.clone());
        load::run(16, duration, move |c, n| {
            let (s3, small) = (s3.clone(), small.clone());
            async move {
                s3.put(&format!("small/{c}/{n}"), small).await;
                1
            }
        })
        .await
    };
    let get_1k = {
        let s3 = s3.clone();
        load::run(16, duration, move |c, n| {
            let s3 = s3.clone();
            async move {
                s3.get(&format!("small/{c}/{}", n % 200)).await;
                1
            }
        })
        .await
    };
    eprintln!("R2: 1 MiB PUT and GET, 16 clients…");
    let put_1m = {
        let (s3, big) = (s3.clone(), big.clone());
        load::run(16, duration, move |c, n| {
            let (s3, big) = (s3.clone(), big.clone());
            async move {
                // Each client overwrites its own 8 keys, so the disk holds a bounded set.
                s3.put(&format!("big/{c}/{}", n % 8), big).await;
                1
            }
        })
        .await
    };
    let get_1m = {
        let s3 = s3.clone();
        load::run(16, duration, move |c, n| {
            let s3 = s3.clone();
            async move {
                s3.get(&format!("big/{c}/{}", n % 8)).await;
                1
            }
        })
        .await
    };

    let total = (gib * 1024.0 * MIB as f64) as u64;
    let part = 16 * MIB as u64;
    let parts = total.div_ceil(part);
    eprintln!("R2: a {gib} GiB multipart upload ({parts} parts of 16 MiB, 4 at a time), then reading it back…");
    let (memory_before, _) = crate::memory::resident_mib();
    let started = Instant::now();
    let created = s3.signed(reqwest::Method::POST, &format!("/{BUCKET}/huge?uploads")).send().await?.text().await?;
    let upload_id = created
        .split("<UploadId>")
        .nth(1)
        .and_then(|rest| rest.split("</UploadId>").next())
        .context("no UploadId in the answer")?
        .to_owned();
    let chunk = bytes::Bytes::from(vec![3u8; part as usize]);
    let mut etags = vec![String::new(); parts as usize];
    let mut latencies = Vec::new();
    for wave in (1..=parts).collect::<Vec<_>>().chunks(4) {
        let mut tasks = Vec::new();
        for &number in wave {
            let (s3, upload_id) = (s3.clone(), upload_id.clone());
            let size = part.min(total - (number - 1) * part) as usize;
            let body = chunk.slice(..size);
            tasks.push(tokio::spawn(async move {
                let began = Instant::now();
                let etag = s3.put(&format!("huge?partNumber={number}&uploadId={upload_id}"), body).await;
                (number, etag, began.elapsed())
            }));
        }
        for task in tasks {
            let (number, etag, took) = task.await?;
            etags[(number - 1) as usize] = etag;
            latencies.push(took);
        }
    }
    let mut xml = String::from("<CompleteMultipartUpload>");
    for (i, etag) in etags.iter().enumerate() {
        xml.push_str(&format!("<Part><PartNumber>{}</PartNumber><ETag>{etag}</ETag></Part>", i + 1));
    }
    xml.push_str("</CompleteMultipartUpload>");
    let done =
        s3.signed(reqwest::Method::POST, &format!("/{BUCKET}/huge?uploadId={upload_id}")).body(xml).send().await?;
    anyhow::ensure!(done.status().is_success(), "completing the upload: {}", done.text().await?);
    let multipart_upload = Stats::from_latencies(latencies, total / MIB as u64, started.elapsed());
    let started = Instant::now();
    let read = s3.get("huge").await;
    anyhow::ensure!(read == total, "read back {read} of {total} bytes");
    let multipart_download = Stats::from_latencies(vec![started.elapsed()], total / MIB as u64, started.elapsed());
    let (_, memory_peak) = crate::memory::resident_mib();
    Ok(Figures { put_1k, get_1k, put_1m, get_1m, multipart_upload, multipart_download, memory_before, memory_peak })
}

pub fn run(settings: &Settings, gib: f64) -> anyhow::Result<()> {
    let scratch = settings.scratch_dir()?;
    let duration = Duration::from_secs_f64(settings.seconds);
    let kura = Kura::start(&scratch.path().join("kura"), true).context("starting kura")?;
    let client_runtime = crate::load::client_runtime()?;
    let figures = client_runtime.block_on(measure(S3::new(&kura.s3), duration, gib))?;
    kura.shutdown();

    eprintln!("measuring the physical limit (the same bytes through one file, fsync per object)…");
    let limit_dir = scratch.path().join("limit");
    std::fs::create_dir_all(&limit_dir)?;
    let (limit_put_1k, limit_get_1k) = limit(&limit_dir, KIB, duration)?;
    let (limit_put_1m, cached_get_1m) = limit(&limit_dir, MIB, duration)?;
    let limit_get_1m = disk_read(&limit_dir, MIB, duration)?.unwrap_or(cached_get_1m);

    let (peer_figures, peer_note) = if settings.no_peer {
        (Vec::new(), "skipped (--no-peer)".to_owned())
    } else {
        eprintln!("running the peer (Miniflare)…");
        match peer::run(settings, &[], &scratch.path().join("peer")) {
            Ok(f) => (
                f,
                format!(
                    "Miniflare 4.20260730.0's R2, one client: 1 KiB inside a Worker, 1 MiB from Node ({} ops per 1 KiB workload)",
                    settings.peer_ops
                ),
            ),
            Err(why) => (Vec::new(), format!("not measured: {why}")),
        }
    };
    let worker = |op: &str| peer::rate(&peer_figures, op);
    let node = |op: &str| peer::rate_from(&peer_figures, op, "node");

    let rows = vec![
        Row {
            workload: "PUT 1 KiB".into(),
            clients: 16,
            unit: "objects",
            kura: figures.put_1k,
            peer: worker("r2_put_1KiB"),
            limit: Some(limit_put_1k),
            target: worker("r2_put_1KiB").map(|p| 5.0 * p),
        },
        Row {
            workload: "GET 1 KiB".into(),
            clients: 16,
            unit: "objects",
            kura: figures.get_1k,
            peer: worker("r2_get_1KiB"),
            limit: Some(limit_get_1k),
            target: worker("r2_get_1KiB").map(|p| 5.0 * p),
        },
        Row {
            workload: "PUT 1 MiB".into(),
            clients: 16,
            unit: "MiB",
            kura: figures.put_1m,
            peer: node("r2_put_1MiB"),
            limit: Some(limit_put_1m),
            target: Some(0.5 * limit_put_1m.rate()),
        },
        Row {
            workload: "GET 1 MiB".into(),
            clients: 16,
            unit: "MiB",
            kura: figures.get_1m,
            peer: node("r2_get_1MiB"),
            limit: Some(limit_get_1m),
            target: Some(0.7 * limit_get_1m.rate()),
        },
        Row {
            workload: format!("multipart upload {gib} GiB"),
            clients: 4,
            unit: "MiB",
            kura: figures.multipart_upload,
            peer: None,
            limit: Some(limit_put_1m),
            target: None,
        },
        Row {
            workload: format!("GET {gib} GiB (streamed)"),
            clients: 1,
            unit: "MiB",
            kura: figures.multipart_download,
            peer: None,
            limit: Some(limit_get_1m),
            target: None,
        },
    ];
    report::print("R2 over S3 (SigV4-signed HTTP requests)", &rows, &peer_note);
    println!(
        "memory: {:.0} MiB resident before the {gib} GiB upload, {:.0} MiB at the peak of upload and download \
         (server and load generator in one process; the object is never held whole)",
        figures.memory_before, figures.memory_peak
    );
    println!(
        "limit: writes are the same bytes appended to one file with fsync per object (1 KiB: {:.0}/s, 1 MiB: {:.0} MiB/s); \
         1 KiB reads come from the page cache ({:.0}/s); 1 MiB reads are the disk's, with O_DIRECT ({:.0} MiB/s; \
         {:.0} MiB/s from the page cache)",
        limit_put_1k.rate(),
        limit_put_1m.rate(),
        limit_get_1k.rate(),
        limit_get_1m.rate(),
        cached_get_1m.rate()
    );
    Ok(())
}
