//! Obtaining the pinned workerd when none is installed: the npm package of this platform's
//! build (`@cloudflare/workerd-<platform>`), fetched from the npm registry (the environment's
//! `npm_config_registry`, as npm reads it there, names a mirror; an `.npmrc` is not read),
//! checked against the integrity pinned here before anything is kept, and its one binary
//! unpacked into the data directory. A newcomer's first `wrangler deploy` needs no other
//! install step.

use std::io::Read;
use std::path::{Path, PathBuf};

use base64::Engine;
use sha2::{Digest, Sha512};

use crate::error::{Result, WorkersError};
use crate::runtime::{WORKERD_VERSION, install_command};

/// Each platform's package and the `dist.integrity` (SHA-512) the registry lists for it at
/// [`WORKERD_VERSION`].
const PACKAGES: &[(&str, &str, &str, &str)] = &[
    (
        "linux",
        "x86_64",
        "linux-64",
        "YlEBFbAYZHe/ylzl8WEYQEU/jr+0XMqXaST2oBk5oVjksdb1NGuJaggluCdZAzuJJ8UqdTmyhY5u/qrasbiFWA==",
    ),
    (
        "linux",
        "aarch64",
        "linux-arm64",
        "qJ0X0m6cL8fWDUPDg8K4IxYZXNJI6XbeOihqjnqKbAClrjdPDn8VUSd+z2XiCQ5NylMtMrpa/skC9UfaR6mh8g==",
    ),
    (
        "macos",
        "x86_64",
        "darwin-64",
        "yFR1XaJbSDLg/qbwtrYaU2xwFXatIPKR5nrMQCN1q/m6+Qe/j6r+kCnFEvOJjMZOm9iCKsE6Qly5clgl4u32qw==",
    ),
    (
        "macos",
        "aarch64",
        "darwin-arm64",
        "LqWKcE7x/9KyC2iQvKPeb20hKST3dYXDZlYTvFymgR1DfLS0OFOCzVGTloVNd7WqvK4SkdzBYfxo7QMIAeBK0w==",
    ),
];

/// Where an obtained workerd lives under the Workers directory `dir`.
pub fn obtained_path(dir: &Path) -> PathBuf {
    dir.join("runtime").join(WORKERD_VERSION).join("workerd")
}

/// The registry's URL of this platform's package, and its pinned integrity.
fn package() -> Option<(String, &'static str)> {
    let (_, _, platform, integrity) =
        PACKAGES.iter().find(|(os, arch, _, _)| *os == std::env::consts::OS && *arch == std::env::consts::ARCH)?;
    let registry = std::env::var("npm_config_registry")
        .ok()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| "https://registry.npmjs.org/".to_owned());
    let registry = registry.trim_end_matches('/');
    let url = format!("{registry}/@cloudflare/workerd-{platform}/-/workerd-{platform}-{WORKERD_VERSION}.tgz");
    Some((url, integrity))
}

/// Why workerd could not be obtained, as the error a deploy answers: what went wrong, and the
/// one command that installs it instead.
fn failed(why: impl std::fmt::Display) -> WorkersError {
    WorkersError::NoWorkerd {
        searched: format!("none was installed, and fetching it failed: {why}"),
        install: install_command(),
    }
}

/// Fetches, checks and unpacks workerd into [`obtained_path`] of `dir`; answers its path.
pub async fn obtain(dir: &Path) -> Result<PathBuf> {
    let target = obtained_path(dir);
    let Some((url, integrity)) = package() else {
        return Err(failed(format!(
            "there is no prebuilt workerd for {} on {}",
            std::env::consts::ARCH,
            std::env::consts::OS
        )));
    };
    tracing::info!(%url, into = %target.display(), "no workerd is installed: fetching workerd {WORKERD_VERSION}");
    fetch_checked(&url, integrity, &target).await?;
    tracing::info!(path = %target.display(), "workerd {WORKERD_VERSION} is installed");
    Ok(target)
}

/// Downloads the package at `url`, refuses it unless its SHA-512 is `integrity`, and unpacks
/// its binary to `target`.
async fn fetch_checked(url: &str, integrity: &str, target: &Path) -> Result<()> {
    let tarball = download(url).await?;
    let digest = base64::engine::general_purpose::STANDARD.encode(Sha512::digest(&tarball));
    if digest != integrity {
        return Err(failed(format!("{url} is not the package pinned (its SHA-512 is {digest})")));
    }
    let target = target.to_owned();
    tokio::task::spawn_blocking(move || unpack(&tarball, &target))
        .await
        .map_err(|e| failed(format!("unpacking stopped: {e}")))?
}

/// The most a package may be (the pinned ones are about 37 MB): a registry or proxy that says
/// or sends more is refused before it can fill memory.
const MAX_PACKAGE_BYTES: u64 = 256 * 1024 * 1024;

/// The tarball at `url`, with its progress in kura's log; within [`MAX_PACKAGE_BYTES`] and ten
/// minutes (Workers changes wait for it), whatever the registry sends.
async fn download(url: &str) -> Result<Vec<u8>> {
    let client = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(30))
        .timeout(std::time::Duration::from_secs(600))
        .build()
        .map_err(|e| failed(e.to_string()))?;
    let mut response = client.get(url).send().await.map_err(|e| failed(format!("GET {url}: {e}")))?;
    if !response.status().is_success() {
        return Err(failed(format!("GET {url}: {}", response.status())));
    }
    let too_big = || failed(format!("GET {url}: more than {} MB", MAX_PACKAGE_BYTES / 1_000_000));
    let size = response.content_length().unwrap_or(0);
    if size > MAX_PACKAGE_BYTES {
        return Err(too_big());
    }
    let mut body = Vec::with_capacity(size as usize);
    let mut reported = 0;
    while let Some(chunk) = response.chunk().await.map_err(|e| failed(format!("GET {url}: {e}")))? {
        if (body.len() + chunk.len()) as u64 > MAX_PACKAGE_BYTES {
            return Err(too_big());
        }
        body.extend_from_slice(&chunk);
        let quarter = (body.len() as u64 * 4).checked_div(size).unwrap_or(0);
        if quarter > reported && quarter < 4 {
            reported = quarter;
            tracing::info!("fetching workerd: {}% of {:.1} MB", quarter * 25, size as f64 / 1e6);
        }
    }
    Ok(body)
}

/// Writes the package's `bin/workerd` to `target`, whole or not at all.
fn unpack(tarball: &[u8], target: &Path) -> Result<()> {
    let dir = target.parent().expect("the target is a file in a directory");
    std::fs::create_dir_all(dir).map_err(WorkersError::io(format!("creating {}", dir.display())))?;
    // What an unpacking a crash cut short left behind.
    for entry in std::fs::read_dir(dir).map_err(WorkersError::io(format!("reading {}", dir.display())))?.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".workerd-") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(tarball));
    let entries = archive.entries().map_err(|e| failed(format!("reading the package: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| failed(format!("reading the package: {e}")))?;
        let path = entry.path().map_err(|e| failed(format!("reading the package: {e}")))?;
        if path != Path::new("package/bin/workerd") {
            continue;
        }
        let partial = dir.join(format!(".workerd-{}", crate::random_hex(6)));
        let written = write_executable(&mut entry, &partial);
        if written.is_err() {
            let _ = std::fs::remove_file(&partial);
        }
        written?;
        return std::fs::rename(&partial, target).map_err(WorkersError::io(format!("installing {}", target.display())));
    }
    Err(failed("the package has no bin/workerd"))
}

fn write_executable(from: &mut impl Read, to: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .open(to)
        .map_err(WorkersError::io(format!("creating {}", to.display())))?;
    std::io::copy(from, &mut file).map_err(WorkersError::io(format!("writing {}", to.display())))?;
    file.sync_all().map_err(WorkersError::io(format!("writing {}", to.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pinned_integrity_is_a_sha512() {
        for (_, _, platform, integrity) in PACKAGES {
            let bytes = base64::engine::general_purpose::STANDARD.decode(integrity).expect(platform);
            assert_eq!(bytes.len(), 64, "{platform}");
        }
    }

    #[tokio::test]
    async fn a_download_that_is_not_the_pinned_package_is_refused_and_nothing_is_kept() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/workerd.tgz", listener.local_addr().unwrap());
        let app = axum::Router::new().route("/workerd.tgz", axum::routing::get(|| async { "not the package" }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let dir = tempfile::tempdir().unwrap();
        let target = obtained_path(dir.path());
        let pinned = PACKAGES[0].3;
        let refused = fetch_checked(&url, pinned, &target).await.unwrap_err();
        assert!(matches!(refused, WorkersError::NoWorkerd { .. }), "{refused}");
        assert!(refused.to_string().contains("is not the package pinned"), "{refused}");
        assert!(refused.to_string().contains("npm install workerd@"), "names the command instead: {refused}");
        assert!(!target.exists() && !dir.path().join("runtime").exists(), "nothing is kept");

        let gone = format!("{}/missing.tgz", url.trim_end_matches("/workerd.tgz"));
        let refused = fetch_checked(&gone, pinned, &target).await.unwrap_err();
        assert!(refused.to_string().contains("404"), "{refused}");
    }

    #[test]
    fn a_package_without_the_binary_is_refused_and_nothing_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let target = obtained_path(dir.path());
        let no_binary = {
            let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
            let mut header = tar::Header::new_gnu();
            header.set_size(2);
            header.set_mode(0o644);
            header.set_cksum();
            builder.append_data(&mut header, "package/README.md", &b"hi"[..]).unwrap();
            builder.into_inner().unwrap().finish().unwrap()
        };
        let refused = unpack(&no_binary, &target).unwrap_err();
        assert!(refused.to_string().contains("no bin/workerd"), "{refused}");
        assert!(!target.exists());
        assert_eq!(std::fs::read_dir(target.parent().unwrap()).unwrap().count(), 0, "no partial file is left");
    }
}
