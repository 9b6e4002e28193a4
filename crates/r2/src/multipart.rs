//! Multipart uploads: an upload's parts stream into blobs of their own (blob first, row last,
//! as single puts do); completing one checks R2's rules on the parts and makes one object of
//! them without copying a byte.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::Stream;
use rusqlite::Connection;

use crate::blob::{Expected, Stored};
use crate::error::{R2Error, Result};
use crate::meta::{Data, Part, Upload};
use crate::object::{DeclaredChecksum, HttpMetadata, ObjectInfo};
use crate::object::{MAX_PARTS, MAX_UPLOAD_BYTES, check_custom_metadata, check_key, multipart_etag};
use crate::options::{CompleteOptions, PartInfo, PartListing, PartOptions, UploadInfo};
use crate::{R2, blob, check_storage_class, meta, now_ms, object};

impl R2 {
    /// Starts a multipart upload and returns its id.
    pub async fn create_multipart_upload(
        &self,
        bucket: &str,
        key: &str,
        http: HttpMetadata,
        custom: BTreeMap<String, String>,
        storage_class: Option<&str>,
        checksum: Option<DeclaredChecksum>,
    ) -> Result<String> {
        check_key(key)?;
        check_custom_metadata(&custom)?;
        let upload = Upload {
            key: key.to_owned(),
            created_ms: now_ms(),
            state: meta::IN_PROGRESS,
            http,
            custom,
            storage_class: check_storage_class(storage_class)?,
            checksum,
        };
        let upload_id = format!("{}{}", blob::new_id(), blob::new_id());
        let id = upload_id.clone();
        self.commit(bucket, None, move |tx| {
            meta::check_live(tx)?;
            Ok((meta::insert_upload(tx, &id, &upload)?, Vec::new()))
        })
        .await?;
        Ok(upload_id)
    }

    fn live_upload(&self, conn: &Connection, upload_id: &str, key: &str) -> Result<Upload> {
        meta::check_live(conn)?;
        let expiry = self.settings.upload_expiry.as_millis() as i64;
        match meta::get_upload(conn, upload_id)? {
            Some(u) if u.key == key && u.state == meta::IN_PROGRESS && u.created_ms + expiry > now_ms() => Ok(u),
            _ => Err(R2Error::NoSuchUpload),
        }
    }

    /// Uploads one part (1 to 10,000; the same number again replaces it) and returns its ETag.
    pub async fn upload_part<S, E>(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        upload_id: &str,
        number: u32,
        body: S,
        options: PartOptions,
    ) -> Result<PartInfo>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: std::fmt::Display,
    {
        if !(1..=MAX_PARTS).contains(&number) {
            return Err(R2Error::InvalidArgument(
                "Part number must be an integer between 1 and 10000, inclusive.".into(),
            ));
        }
        let this = self.clone();
        let (id, k) = (upload_id.to_owned(), key.to_owned());
        let upload = self.on_bucket(bucket, move |conn| this.live_upload(conn, &id, &k)).await?;
        let mut digests = options.digests;
        // The upload's declared checksum is kept for every part, sent or not.
        digests.computed.extend(upload.checksum.map(|c| c.algorithm));
        let expected = Expected { size: options.size, max_size: MAX_UPLOAD_BYTES, inline_max: None, digests: &digests };
        let received = self.blobs.receive(bucket, body, &expected).await?;
        let Stored::Blob(pending) = received.stored else {
            return Err(R2Error::storage_text("receiving a part", "a part was kept inline"));
        };
        let part = Part {
            number,
            blob: pending.id().to_owned(),
            size: received.size,
            md5: hex::encode(received.md5),
            uploaded_ms: now_ms(),
            checksums: received.checksums,
        };
        let info = PartInfo {
            number,
            etag: part.md5.clone(),
            size: part.size,
            uploaded_ms: part.uploaded_ms,
            checksums: part.checksums.clone(),
        };
        let this = self.clone();
        let (id, k) = (upload_id.to_owned(), key.to_owned());
        self.commit(bucket, Some(pending), move |tx| {
            this.live_upload(tx, &id, &k)?;
            Ok(((), meta::put_part(tx, &id, &part)?.into_iter().collect()))
        })
        .await?;
        Ok(info)
    }

    /// Completes an upload from the named parts (`(number, etag)`), by R2's rules: every named
    /// part must exist with that ETag, numbers must not repeat, every part but the last must be
    /// at least the minimum size, and all but the last must be of one size, the last no larger.
    /// `options.conditional` is checked against the object the upload would replace, in the
    /// same transaction (S3's conditional writes); an upload refused by it stays open. An upload
    /// created with a checksum gives its object that checksum ([`DeclaredChecksum`]).
    pub async fn complete_multipart_upload(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        upload_id: &str,
        requested: Vec<(u32, String)>,
        options: CompleteOptions,
    ) -> Result<ObjectInfo> {
        let this = self.clone();
        let (id, k) = (upload_id.to_owned(), key.to_owned());
        let min_part = self.settings.min_part_size;
        self.commit(bucket, None, move |tx| {
            let upload = this.live_upload(tx, &id, &k)?;
            let current = meta::get_object(tx, &k)?;
            options.conditional.check_write(current.as_ref().map(|c| &c.info))?;
            if requested.is_empty() {
                return Err(R2Error::InvalidArgument("a multipart upload needs at least one part".into()));
            }
            let mut seen = HashSet::new();
            if !requested.iter().all(|(n, _)| seen.insert(*n)) {
                return Err(R2Error::BadUpload);
            }
            let stored = meta::parts(tx, &id)?;
            let mut chosen = Vec::with_capacity(requested.len());
            let declared = upload.checksum;
            let algorithm = declared.map(|d| d.algorithm);
            for (number, etag) in &requested {
                let etag = etag.trim().trim_matches('"').to_ascii_lowercase();
                match stored.iter().find(|p| p.number == *number) {
                    Some(p) if p.md5 == etag => chosen.push(p.clone()),
                    _ => return Err(R2Error::InvalidPart),
                }
                if let (Some(algorithm), Some(part)) = (algorithm, chosen.last()) {
                    let kept = part.checksums.get(algorithm.name());
                    let named = options.part_checksums.iter().filter(|(n, a, _)| n == number && *a == algorithm);
                    if named.into_iter().any(|(_, _, value)| Some(value) != kept) {
                        return Err(R2Error::InvalidPart);
                    }
                }
            }
            if chosen[..chosen.len() - 1].iter().any(|p| p.size < min_part) {
                return Err(R2Error::EntityTooSmall);
            }
            chosen.sort_by_key(|p| p.number);
            let (last, rest) = chosen.split_last().expect("at least one part");
            if let Some(first) = rest.first()
                && (rest.iter().any(|p| p.size != first.size) || last.size > first.size)
            {
                return Err(R2Error::BadUpload);
            }
            let chosen_numbers: HashSet<u32> = chosen.iter().map(|p| p.number).collect();
            let mut removed = meta::remove_object(tx, &k)?;
            for part in stored.iter().filter(|p| !chosen_numbers.contains(&p.number)) {
                meta::delete_part(tx, &id, part.number)?;
                removed.push(part.blob.clone());
            }
            let md5s: Vec<&str> = chosen.iter().map(|p| p.md5.as_str()).collect();
            let mut checksums = BTreeMap::new();
            if let Some(declared) = declared {
                let name = declared.algorithm.name();
                let parts: Vec<(Option<&str>, u64)> =
                    chosen.iter().map(|p| (p.checksums.get(name).map(String::as_str), p.size)).collect();
                checksums.extend(object::multipart_checksum(declared, &parts).map(|c| (name.to_owned(), c)));
            }
            let info = ObjectInfo {
                key: k.clone(),
                version: blob::new_id(),
                size: chosen.iter().map(|p| p.size).sum(),
                etag: multipart_etag(&md5s),
                uploaded_ms: now_ms(),
                http: upload.http,
                custom: upload.custom,
                checksums,
                storage_class: upload.storage_class,
                parts: Some(chosen.len() as u32),
            };
            meta::insert_object(tx, &info, Data::Parts(&id))?;
            meta::set_upload_state(tx, &id, meta::COMPLETED)?;
            Ok((info, removed))
        })
        .await
    }

    /// Aborts an upload and removes its parts; aborting a finished upload is a no-op.
    pub async fn abort_multipart_upload(&self, bucket: &str, key: &str, upload_id: &str) -> Result<()> {
        let (id, k) = (upload_id.to_owned(), key.to_owned());
        self.commit(bucket, None, move |tx| match meta::get_upload(tx, &id)? {
            Some(u) if u.key == k && u.state == meta::IN_PROGRESS => {
                meta::set_upload_state(tx, &id, meta::ABORTED)?;
                Ok(((), meta::remove_parts(tx, &id)?))
            }
            Some(u) if u.key == k => Ok(((), Vec::new())),
            _ => Err(R2Error::NoSuchUpload),
        })
        .await
    }

    /// Lists an upload's parts after `marker`, at most `max`.
    pub async fn list_parts(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        upload_id: &str,
        marker: u32,
        max: usize,
    ) -> Result<PartListing> {
        let this = self.clone();
        let (id, k) = (upload_id.to_owned(), key.to_owned());
        self.on_bucket(bucket, move |conn| {
            let upload = this.live_upload(conn, &id, &k)?;
            let all: Vec<PartInfo> = meta::parts(conn, &id)?
                .into_iter()
                .filter(|p| p.number > marker)
                .map(|p| PartInfo {
                    number: p.number,
                    etag: p.md5,
                    size: p.size,
                    uploaded_ms: p.uploaded_ms,
                    checksums: p.checksums,
                })
                .collect();
            let truncated = all.len() > max;
            Ok(PartListing {
                key: upload.key,
                storage_class: upload.storage_class,
                parts: all.into_iter().take(max).collect(),
                truncated,
            })
        })
        .await
    }

    /// Lists unfinished uploads in key order (then by start time), after the markers.
    pub async fn list_multipart_uploads(
        &self,
        bucket: &str,
        prefix: &str,
        key_marker: Option<String>,
        upload_id_marker: Option<String>,
        max: usize,
    ) -> Result<(Vec<UploadInfo>, bool)> {
        let expiry = self.settings.upload_expiry.as_millis() as i64;
        let prefix = prefix.to_owned();
        self.on_bucket(bucket, move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT key, upload_id, created, storage_class FROM uploads WHERE state = 0 AND created > ?1 \
                 ORDER BY key, upload_id",
            )?;
            let rows = stmt.query_map([now_ms() - expiry], |r| {
                Ok(UploadInfo {
                    key: meta::key_text(r.get(0)?)?,
                    upload_id: r.get(1)?,
                    initiated_ms: r.get(2)?,
                    storage_class: r.get(3)?,
                })
            })?;
            let mut out = Vec::new();
            let mut past_marker = key_marker.is_none();
            for row in rows {
                let upload = row?;
                if !upload.key.starts_with(&prefix) {
                    continue;
                }
                if !past_marker {
                    let marker = key_marker.as_deref().unwrap_or_default();
                    past_marker = match upload.key.as_str().cmp(marker) {
                        std::cmp::Ordering::Greater => true,
                        std::cmp::Ordering::Equal => upload_id_marker.as_deref().is_some_and(|m| {
                            // Within the marker key, uploads after the marker id.
                            upload.upload_id.as_str() > m
                        }),
                        std::cmp::Ordering::Less => false,
                    };
                    if !past_marker {
                        continue;
                    }
                }
                if out.len() == max {
                    return Ok((out, true));
                }
                out.push(upload);
            }
            Ok((out, false))
        })
        .await
    }
}
