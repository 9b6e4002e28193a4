//! What an object is (its metadata as R2 keeps it) and the rules that read it: conditionals,
//! byte ranges, checksums and the size limits on keys and metadata.

use std::collections::BTreeMap;

use base64::Engine as _;
use md5::Digest as _;
use serde::{Deserialize, Serialize};

use crate::error::{R2Error, Result};

/// Longest key, in UTF-8 bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Largest custom metadata, in bytes of names and values.
pub const MAX_METADATA_BYTES: usize = 8192;
/// Largest single upload (PutObject, one part): 5 GiB − 5 MiB.
pub const MAX_UPLOAD_BYTES: u64 = 5 * 1024 * 1024 * 1024 - 5 * 1024 * 1024;
/// Most parts of a multipart upload.
pub const MAX_PARTS: u32 = 10_000;

/// The HTTP headers stored with an object and sent back on reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpMetadata {
    /// `Content-Type`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// `Content-Language`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    /// `Content-Disposition`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    /// `Content-Encoding`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    /// `Cache-Control`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    /// `Expires`, as the client sent it (R2's `cacheExpiry`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
}

/// One object's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The key.
    pub key: String,
    /// 32 hex characters, new on every write of the key.
    pub version: String,
    /// Size in bytes.
    pub size: u64,
    /// The ETag without quotes: hex MD5, or `md5-of-part-md5s-N` for multipart objects.
    pub etag: String,
    /// Upload time, milliseconds since the Unix epoch.
    pub uploaded_ms: i64,
    /// HTTP metadata.
    pub http: HttpMetadata,
    /// Custom metadata (`x-amz-meta-*`).
    pub custom: BTreeMap<String, String>,
    /// Checksums kept with the object: `md5` (hex) for single uploads, and any `x-amz-checksum-*`
    /// the client sent (`crc32`, `crc32c`, `crc64nvme`, `sha1`, `sha256`; base64, as S3 shows
    /// them).
    pub checksums: BTreeMap<String, String>,
    /// `Standard` or `InfrequentAccess`.
    pub storage_class: String,
    /// How many parts, for multipart objects.
    pub parts: Option<u32>,
}

impl ObjectInfo {
    /// The ETag as HTTP sends it, quoted.
    pub fn http_etag(&self) -> String {
        format!("\"{}\"", self.etag)
    }
}

/// Checks a key against R2's limit.
pub fn check_key(key: &str) -> Result<()> {
    if key.len() > MAX_KEY_BYTES {
        return Err(R2Error::InvalidObjectName);
    }
    Ok(())
}

/// Checks custom metadata against R2's limit.
pub fn check_custom_metadata(custom: &BTreeMap<String, String>) -> Result<()> {
    let bytes: usize = custom.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_METADATA_BYTES {
        return Err(R2Error::MetadataTooLarge);
    }
    Ok(())
}

/// One ETag in an `If-Match` or `If-None-Match` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtagCondition {
    /// `*`.
    Any,
    /// A tag, unquoted; `weak` if it came as `W/"…"`.
    Tag {
        /// The tag.
        value: String,
        /// Whether it was weak.
        weak: bool,
    },
}

impl EtagCondition {
    /// Parses one list element of an `If-Match` / `If-None-Match` header.
    pub fn parse(text: &str) -> EtagCondition {
        let text = text.trim();
        if text == "*" {
            return EtagCondition::Any;
        }
        let (weak, rest) = match text.strip_prefix("W/") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let value = rest.strip_prefix('"').and_then(|r| r.strip_suffix('"')).unwrap_or(rest);
        EtagCondition::Tag { value: value.to_owned(), weak }
    }

    /// Parses a whole header value (a comma-separated list).
    pub fn parse_list(text: &str) -> Vec<EtagCondition> {
        text.split(',').filter(|s| !s.trim().is_empty()).map(EtagCondition::parse).collect()
    }
}

/// Preconditions on an object, as R2 evaluates them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conditional {
    /// `If-Match` (strong comparison).
    pub if_match: Option<Vec<EtagCondition>>,
    /// `If-None-Match` (weak comparison).
    pub if_none_match: Option<Vec<EtagCondition>>,
    /// `If-Modified-Since`, milliseconds since the epoch.
    pub if_modified_since_ms: Option<i64>,
    /// `If-Unmodified-Since`, milliseconds since the epoch.
    pub if_unmodified_since_ms: Option<i64>,
    /// Compare times at whole seconds (dates from HTTP headers carry no more).
    pub seconds_granularity: bool,
}

/// How a conditional request turned out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead.
    Pass,
    /// `If-Match` or `If-Unmodified-Since` failed: 412.
    PreconditionFailed,
    /// `If-None-Match` or `If-Modified-Since` failed: 304 on reads (412 on writes).
    NotModified,
}

impl Conditional {
    /// Whether any condition is set.
    pub fn is_empty(&self) -> bool {
        self.if_match.is_none()
            && self.if_none_match.is_none()
            && self.if_modified_since_ms.is_none()
            && self.if_unmodified_since_ms.is_none()
    }

    /// R2's evaluation (the R2 gateway's rules: strict time comparisons, If-None-Match
    /// overriding If-Modified-Since and If-Match overriding If-Unmodified-Since).
    pub fn evaluate(&self, object: Option<&ObjectInfo>) -> Verdict {
        let Some(object) = object else {
            return if self.if_match.is_none() && self.if_modified_since_ms.is_none() {
                Verdict::Pass
            } else {
                Verdict::PreconditionFailed
            };
        };
        let truncate = |ms: i64| if self.seconds_granularity { ms.div_euclid(1000) } else { ms };
        let uploaded = truncate(object.uploaded_ms);
        let if_match = self.if_match.as_ref().is_none_or(|list| {
            list.iter().any(|c| match c {
                EtagCondition::Any => true,
                EtagCondition::Tag { value, weak } => !weak && *value == object.etag,
            })
        });
        let if_none_match = self.if_none_match.as_ref().is_none_or(|list| {
            !list.iter().any(|c| match c {
                EtagCondition::Any => true,
                EtagCondition::Tag { value, .. } => *value == object.etag,
            })
        });
        let if_modified_since = self.if_modified_since_ms.is_none_or(|since| truncate(since) < uploaded)
            || (self.if_none_match.is_some() && if_none_match);
        let if_unmodified_since = self.if_unmodified_since_ms.is_none_or(|before| uploaded < truncate(before))
            || (self.if_match.is_some() && if_match);
        if !if_match || !if_unmodified_since {
            Verdict::PreconditionFailed
        } else if !if_none_match || !if_modified_since {
            Verdict::NotModified
        } else {
            Verdict::Pass
        }
    }

    /// The verdict for a read: 412 or 304 as errors.
    pub fn check_read(&self, object: Option<&ObjectInfo>) -> Result<()> {
        match self.evaluate(object) {
            Verdict::Pass => Ok(()),
            Verdict::PreconditionFailed => Err(R2Error::PreconditionFailed),
            Verdict::NotModified => Err(R2Error::NotModified),
        }
    }

    /// The verdict for a write: any failure is 412.
    pub fn check_write(&self, object: Option<&ObjectInfo>) -> Result<()> {
        match self.evaluate(object) {
            Verdict::Pass => Ok(()),
            _ => Err(R2Error::PreconditionFailed),
        }
    }
}

/// A single byte range, as a `Range` header names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRange {
    /// `bytes=start-` or `bytes=start-end` (inclusive).
    From {
        /// First byte.
        start: u64,
        /// Last byte, inclusive.
        end: Option<u64>,
    },
    /// `bytes=-n`: the last `n` bytes.
    Suffix(u64),
}

impl ByteRange {
    /// The offset and length this range selects from an object of `size` bytes (S3's rules:
    /// an end past the object is clamped; a start at or past the end, an empty object or an
    /// empty suffix is 416).
    pub fn resolve(self, size: u64) -> Result<(u64, u64)> {
        if size == 0 {
            return Err(R2Error::InvalidRange);
        }
        match self {
            ByteRange::From { start, end } => {
                if let Some(end) = end
                    && end < start
                {
                    return Err(R2Error::InvalidArgument("range must be positive.".into()));
                }
                if start >= size {
                    return Err(R2Error::InvalidRange);
                }
                let last = end.unwrap_or(u64::MAX).min(size - 1);
                Ok((start, last - start + 1))
            }
            ByteRange::Suffix(0) => Err(R2Error::InvalidRange),
            ByteRange::Suffix(n) => {
                let n = n.min(size);
                Ok((size - n, n))
            }
        }
    }
}

/// A checksum algorithm S3 clients send in `x-amz-checksum-*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChecksumAlgorithm {
    /// CRC-32 (ISO-HDLC).
    Crc32,
    /// CRC-32C (Castagnoli).
    Crc32c,
    /// CRC-64/NVME.
    Crc64Nvme,
    /// SHA-1.
    Sha1,
    /// SHA-256.
    Sha256,
    /// SHA-384 (the Workers binding's `sha384`).
    Sha384,
    /// SHA-512 (the Workers binding's `sha512`).
    Sha512,
}

impl ChecksumAlgorithm {
    /// The algorithm of a lowercase name ([`ChecksumAlgorithm::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        [
            ChecksumAlgorithm::Crc32,
            ChecksumAlgorithm::Crc32c,
            ChecksumAlgorithm::Crc64Nvme,
            ChecksumAlgorithm::Sha1,
            ChecksumAlgorithm::Sha256,
            ChecksumAlgorithm::Sha384,
            ChecksumAlgorithm::Sha512,
        ]
        .into_iter()
        .find(|a| a.name() == name)
    }

    /// The CRC of this algorithm, if it is one (the ones whose values combine).
    fn crc(self) -> Option<crc_fast::CrcAlgorithm> {
        match self {
            ChecksumAlgorithm::Crc32 => Some(crc_fast::CrcAlgorithm::Crc32IsoHdlc),
            ChecksumAlgorithm::Crc32c => Some(crc_fast::CrcAlgorithm::Crc32Iscsi),
            ChecksumAlgorithm::Crc64Nvme => Some(crc_fast::CrcAlgorithm::Crc64Nvme),
            _ => None,
        }
    }

    /// The lowercase name used in header names and stored checksums.
    pub fn name(self) -> &'static str {
        match self {
            ChecksumAlgorithm::Crc32 => "crc32",
            ChecksumAlgorithm::Crc32c => "crc32c",
            ChecksumAlgorithm::Crc64Nvme => "crc64nvme",
            ChecksumAlgorithm::Sha1 => "sha1",
            ChecksumAlgorithm::Sha256 => "sha256",
            ChecksumAlgorithm::Sha384 => "sha384",
            ChecksumAlgorithm::Sha512 => "sha512",
        }
    }

    /// The name R2's messages use (`SHA-256`).
    pub fn display_name(self) -> &'static str {
        match self {
            ChecksumAlgorithm::Crc32 => "CRC32",
            ChecksumAlgorithm::Crc32c => "CRC32C",
            ChecksumAlgorithm::Crc64Nvme => "CRC64NVME",
            ChecksumAlgorithm::Sha1 => "SHA-1",
            ChecksumAlgorithm::Sha256 => "SHA-256",
            ChecksumAlgorithm::Sha384 => "SHA-384",
            ChecksumAlgorithm::Sha512 => "SHA-512",
        }
    }
}

/// The checksum a multipart upload declares its object will carry: of the whole object (CRCs
/// only, whose values combine), or of its parts' checksums (S3's "composite", CRC-64/NVME
/// excepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeclaredChecksum {
    /// The algorithm.
    pub algorithm: ChecksumAlgorithm,
    /// Whether it covers the whole object.
    pub full_object: bool,
}

impl DeclaredChecksum {
    /// `algorithm` of the kind asked for (`Some(true)` for the whole object), or of S3's
    /// default kind for it; `None` for a combination S3 does not offer.
    pub fn new(algorithm: ChecksumAlgorithm, full_object: Option<bool>) -> Option<Self> {
        let full_object = full_object.unwrap_or(algorithm == ChecksumAlgorithm::Crc64Nvme);
        let offered = match full_object {
            true => algorithm.crc().is_some(),
            false => algorithm != ChecksumAlgorithm::Crc64Nvme,
        };
        offered.then_some(DeclaredChecksum { algorithm, full_object })
    }

    /// How it is kept: the algorithm's name, with `/full` for a whole-object one.
    pub(crate) fn to_text(self) -> String {
        format!("{}{}", self.algorithm.name(), if self.full_object { "/full" } else { "" })
    }

    pub(crate) fn from_text(text: &str) -> Option<Self> {
        let (name, full_object) = match text.strip_suffix("/full") {
            Some(name) => (name, true),
            None => (text, false),
        };
        Some(DeclaredChecksum { algorithm: ChecksumAlgorithm::from_name(name)?, full_object })
    }
}

/// A checksum that arrives after the body (an aws-chunked trailer): the algorithm, and how to
/// read the value once the body has ended.
#[derive(Clone)]
pub struct TrailingChecksum {
    /// The algorithm the trailer names.
    pub algorithm: ChecksumAlgorithm,
    /// The value sent, decoded; `None` if the trailer never came.
    pub value: std::sync::Arc<dyn Fn() -> Option<Vec<u8>> + Send + Sync>,
}

impl std::fmt::Debug for TrailingChecksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrailingChecksum").field("algorithm", &self.algorithm).finish_non_exhaustive()
    }
}

/// What the client says the body's digests are; each is checked against the bytes received.
#[derive(Debug, Clone, Default)]
pub struct ExpectedDigests {
    /// `Content-MD5`, decoded.
    pub md5: Option<[u8; 16]>,
    /// `x-amz-checksum-*` values, decoded from base64.
    pub checksums: Vec<(ChecksumAlgorithm, Vec<u8>)>,
    /// A checksum sent as a trailer after the body.
    pub trailing: Option<TrailingChecksum>,
    /// Checksums to compute and keep though none was sent (a multipart upload's declared one).
    pub computed: Vec<ChecksumAlgorithm>,
}

enum Running {
    Crc(crc_fast::Digest, usize),
    Sha1(sha1::Sha1),
    Sha256(sha2::Sha256),
    Sha384(sha2::Sha384),
    Sha512(sha2::Sha512),
}

/// Digests computed while a body streams in: MD5 always, and whatever the client asked to check.
pub(crate) struct Digester {
    md5: md5::Md5,
    others: Vec<(ChecksumAlgorithm, Running)>,
}

impl Digester {
    pub(crate) fn new(expected: &ExpectedDigests) -> Self {
        let mut algorithms: Vec<ChecksumAlgorithm> = expected.checksums.iter().map(|(a, _)| *a).collect();
        algorithms.extend(expected.trailing.as_ref().map(|t| t.algorithm));
        algorithms.extend(expected.computed.iter().copied());
        algorithms.sort();
        algorithms.dedup();
        let others = algorithms
            .into_iter()
            .map(|a| {
                let running = match a {
                    ChecksumAlgorithm::Crc32 => {
                        Running::Crc(crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32IsoHdlc), 4)
                    }
                    ChecksumAlgorithm::Crc32c => {
                        Running::Crc(crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi), 4)
                    }
                    ChecksumAlgorithm::Crc64Nvme => {
                        Running::Crc(crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc64Nvme), 8)
                    }
                    ChecksumAlgorithm::Sha1 => Running::Sha1(sha1::Sha1::new()),
                    ChecksumAlgorithm::Sha256 => Running::Sha256(sha2::Sha256::new()),
                    ChecksumAlgorithm::Sha384 => Running::Sha384(sha2::Sha384::new()),
                    ChecksumAlgorithm::Sha512 => Running::Sha512(sha2::Sha512::new()),
                };
                (a, running)
            })
            .collect();
        Digester { md5: md5::Md5::new(), others }
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.md5.update(bytes);
        for (_, running) in &mut self.others {
            match running {
                Running::Crc(d, _) => d.update(bytes),
                Running::Sha1(d) => d.update(bytes),
                Running::Sha256(d) => d.update(bytes),
                Running::Sha384(d) => d.update(bytes),
                Running::Sha512(d) => d.update(bytes),
            }
        }
    }

    /// The MD5, and the checked checksums as stored (base64), or the first mismatch as R2's
    /// BadDigest.
    pub(crate) fn finish(self, expected: &ExpectedDigests) -> Result<([u8; 16], BTreeMap<String, String>)> {
        let md5: [u8; 16] = self.md5.finalize().into();
        if let Some(sent) = expected.md5
            && sent != md5
        {
            return Err(R2Error::BadDigest { algorithm: "MD5", sent: sent.to_vec(), actual: md5.to_vec() });
        }
        let mut stored = BTreeMap::new();
        let trailing = match &expected.trailing {
            Some(t) => match (t.value)() {
                Some(value) => Some((t.algorithm, value)),
                None => {
                    return Err(R2Error::InvalidArgument(format!(
                        "the x-amz-checksum-{} trailer is missing",
                        t.algorithm.name()
                    )));
                }
            },
            None => None,
        };
        for (algorithm, running) in self.others {
            let actual = match running {
                Running::Crc(d, width) => d.finalize().to_be_bytes()[8 - width..].to_vec(),
                Running::Sha1(d) => d.finalize().to_vec(),
                Running::Sha256(d) => d.finalize().to_vec(),
                Running::Sha384(d) => d.finalize().to_vec(),
                Running::Sha512(d) => d.finalize().to_vec(),
            };
            for (_, sent) in expected.checksums.iter().chain(trailing.iter()).filter(|(a, _)| *a == algorithm) {
                if *sent != actual {
                    return Err(R2Error::BadDigest {
                        algorithm: algorithm.display_name(),
                        sent: sent.clone(),
                        actual: actual.clone(),
                    });
                }
            }
            stored.insert(algorithm.name().to_owned(), base64::engine::general_purpose::STANDARD.encode(&actual));
        }
        Ok((md5, stored))
    }
}

/// A multipart object's checksum from its parts' (base64, in order, with their sizes): the
/// parts' CRCs combined into the whole object's, or the checksum of the parts' binary
/// checksums followed by `-N`. `None` if a part lacks one.
pub(crate) fn multipart_checksum(declared: DeclaredChecksum, parts: &[(Option<&str>, u64)]) -> Option<String> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let decoded: Vec<Vec<u8>> = parts.iter().map(|(c, _)| c.and_then(|c| b64.decode(c).ok())).collect::<Option<_>>()?;
    if declared.full_object {
        let crc = declared.algorithm.crc()?;
        let width = decoded.first().map_or(8, Vec::len);
        let mut whole: Option<u64> = None;
        for (bytes, (_, size)) in decoded.iter().zip(parts) {
            let mut wide = [0u8; 8];
            wide[8 - bytes.len().min(8)..].copy_from_slice(&bytes[..bytes.len().min(8)]);
            let part = u64::from_be_bytes(wide);
            whole = Some(whole.map_or(part, |so_far| crc_fast::checksum_combine(crc, so_far, part, *size)));
        }
        let whole = whole.unwrap_or_else(|| crc_fast::checksum(crc, b""));
        return Some(b64.encode(&whole.to_be_bytes()[8 - width..]));
    }
    let algorithm = declared.algorithm;
    let mut digester = Digester::new(&ExpectedDigests { computed: vec![algorithm], ..Default::default() });
    decoded.iter().for_each(|d| digester.update(d));
    let (_, mut computed) = digester.finish(&ExpectedDigests::default()).ok()?;
    computed.remove(algorithm.name()).map(|c| format!("{c}-{}", parts.len()))
}

/// The ETag of a multipart object: MD5 over the parts' binary MD5s, then `-N`.
pub(crate) fn multipart_etag(part_md5s: &[&str]) -> String {
    let mut hasher = md5::Md5::new();
    for part in part_md5s {
        hasher.update(hex::decode(part).unwrap_or_default());
    }
    format!("{}-{}", hex::encode(hasher.finalize()), part_md5s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(etag: &str, uploaded_ms: i64) -> ObjectInfo {
        ObjectInfo {
            key: "k".into(),
            version: "v".into(),
            size: 5,
            etag: etag.into(),
            uploaded_ms,
            http: HttpMetadata::default(),
            custom: BTreeMap::new(),
            checksums: BTreeMap::new(),
            storage_class: "Standard".into(),
            parts: None,
        }
    }

    #[test]
    fn multipart_etag_matches_r2s_example() {
        assert_eq!(
            multipart_etag(&["bce6bf66aeb76c7040fdd5f4eccb78e6", "8165449fc15bbf43d3b674595cbcc406"]),
            "f77dc0eecdebcd774a2a22cb393ad2ff-2"
        );
    }

    #[test]
    fn conditionals_follow_r2() {
        let o = object("abc", 10_500);
        let c = |f: fn(&mut Conditional)| {
            let mut c = Conditional { seconds_granularity: true, ..Default::default() };
            f(&mut c);
            c.evaluate(Some(&o))
        };
        assert_eq!(c(|c| c.if_match = Some(vec![EtagCondition::parse("\"abc\"")])), Verdict::Pass);
        assert_eq!(c(|c| c.if_match = Some(vec![EtagCondition::parse("W/\"abc\"")])), Verdict::PreconditionFailed);
        assert_eq!(c(|c| c.if_none_match = Some(vec![EtagCondition::parse("W/\"abc\"")])), Verdict::NotModified);
        assert_eq!(c(|c| c.if_none_match = Some(vec![EtagCondition::Any])), Verdict::NotModified);
        assert_eq!(c(|c| c.if_modified_since_ms = Some(10_000)), Verdict::NotModified);
        assert_eq!(c(|c| c.if_modified_since_ms = Some(9_000)), Verdict::Pass);
        assert_eq!(c(|c| c.if_unmodified_since_ms = Some(10_999)), Verdict::PreconditionFailed);
        assert_eq!(c(|c| c.if_unmodified_since_ms = Some(11_000)), Verdict::Pass);
        // If-None-Match that passes overrides a failing If-Modified-Since.
        assert_eq!(
            c(|c| {
                c.if_none_match = Some(vec![EtagCondition::parse("\"other\"")]);
                c.if_modified_since_ms = Some(20_000);
            }),
            Verdict::Pass
        );
        let missing = Conditional { if_none_match: Some(vec![EtagCondition::Any]), ..Default::default() };
        assert_eq!(missing.evaluate(None), Verdict::Pass);
        let missing = Conditional { if_match: Some(vec![EtagCondition::Any]), ..Default::default() };
        assert_eq!(missing.evaluate(None), Verdict::PreconditionFailed);
    }

    #[test]
    fn ranges_follow_s3() {
        let r = |start, end| ByteRange::From { start, end };
        assert_eq!(r(0, Some(3)).resolve(10).unwrap(), (0, 4));
        assert_eq!(r(5, None).resolve(10).unwrap(), (5, 5));
        assert_eq!(r(5, Some(100)).resolve(10).unwrap(), (5, 5));
        assert_eq!(ByteRange::Suffix(3).resolve(10).unwrap(), (7, 3));
        assert_eq!(ByteRange::Suffix(30).resolve(10).unwrap(), (0, 10));
        assert!(matches!(r(10, None).resolve(10), Err(R2Error::InvalidRange)));
        assert!(matches!(r(0, None).resolve(0), Err(R2Error::InvalidRange)));
        assert!(matches!(ByteRange::Suffix(0).resolve(10), Err(R2Error::InvalidRange)));
        assert!(matches!(r(5, Some(2)).resolve(10), Err(R2Error::InvalidArgument(_))));
    }

    #[test]
    fn multipart_checksums_cover_the_object_or_its_parts() {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let cuts = [0, 1, 4096, 4097, 9_999, 10_000];
        for algorithm in [ChecksumAlgorithm::Crc32, ChecksumAlgorithm::Crc32c, ChecksumAlgorithm::Crc64Nvme] {
            let sum = |bytes: &[u8]| {
                let mut d = Digester::new(&ExpectedDigests { computed: vec![algorithm], ..Default::default() });
                d.update(bytes);
                d.finish(&ExpectedDigests::default()).unwrap().1.remove(algorithm.name()).unwrap()
            };
            let sums: Vec<String> = cuts.windows(2).map(|w| sum(&data[w[0]..w[1]])).collect();
            let parts: Vec<(Option<&str>, u64)> =
                sums.iter().zip(cuts.windows(2)).map(|(s, w)| (Some(s.as_str()), (w[1] - w[0]) as u64)).collect();
            let whole = DeclaredChecksum::new(algorithm, Some(true)).unwrap();
            assert_eq!(multipart_checksum(whole, &parts), Some(sum(&data)), "{algorithm:?}");
        }
        let sha = |bytes: &[u8]| sha2::Sha256::digest(bytes).to_vec();
        let (a, b) = (sha(b"first"), sha(b"second"));
        let parts = [(Some(b64.encode(&a)), 5u64), (Some(b64.encode(&b)), 6)];
        let parts: Vec<(Option<&str>, u64)> = parts.iter().map(|(s, n)| (s.as_deref(), *n)).collect();
        let composite = DeclaredChecksum::new(ChecksumAlgorithm::Sha256, None).unwrap();
        let expected = format!("{}-2", b64.encode(sha(&[a, b].concat())));
        assert_eq!(multipart_checksum(composite, &parts), Some(expected));
        assert_eq!(multipart_checksum(composite, &[(None, 1)]), None, "a part without one");
        assert_eq!(DeclaredChecksum::new(ChecksumAlgorithm::Sha256, Some(true)), None);
        assert_eq!(DeclaredChecksum::new(ChecksumAlgorithm::Crc64Nvme, Some(false)), None);
        for declared in [whole_crc32(), composite] {
            assert_eq!(DeclaredChecksum::from_text(&declared.to_text()), Some(declared));
        }
    }

    fn whole_crc32() -> DeclaredChecksum {
        DeclaredChecksum::new(ChecksumAlgorithm::Crc32, Some(true)).unwrap()
    }

    #[test]
    fn digests_check_what_the_client_sent() {
        let expected = ExpectedDigests {
            md5: Some(hex::decode("5d41402abc4b2a76b9719d911017c592").unwrap().try_into().unwrap()),
            checksums: vec![(ChecksumAlgorithm::Crc32, 0x3610a686u32.to_be_bytes().to_vec())],
            ..Default::default()
        };
        let mut d = Digester::new(&expected);
        d.update(b"hel");
        d.update(b"lo");
        let (_, stored) = d.finish(&expected).unwrap();
        assert_eq!(stored["crc32"], "NhCmhg==");
        let mut d = Digester::new(&expected);
        d.update(b"hellO");
        assert!(matches!(d.finish(&expected), Err(R2Error::BadDigest { .. })));
    }
}
