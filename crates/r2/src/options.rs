//! What callers pass to the engine and get back from it: settings, options of a put, a get, a
//! part or a completion, and what uploads, parts and sweeps report.

use std::collections::BTreeMap;
use std::io;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use kura_sqlite::RegistrySettings;

use crate::object::{ByteRange, ChecksumAlgorithm, Conditional, ExpectedDigests, HttpMetadata, ObjectInfo};
use crate::shared::Shared;

/// How the engine behaves.
#[derive(Debug, Clone)]
pub struct R2Settings {
    /// Bodies up to this size live in their metadata row (committed with others in one group
    /// commit) rather than in a blob file of their own with two more fsyncs.
    pub inline_max: usize,
    /// Smallest size of every multipart part but the last (R2: 5 MiB).
    pub min_part_size: u64,
    /// Age after which an unfinished multipart upload is aborted (R2: 7 days).
    pub upload_expiry: Duration,
    /// How bucket actors run.
    pub registry: RegistrySettings,
    /// In a cluster: the shared store bodies live in and the placement of buckets' metadata.
    /// `None` keeps everything in the data directory.
    pub shared: Option<Shared>,
}

impl Default for R2Settings {
    fn default() -> Self {
        R2Settings {
            inline_max: 16 * 1024,
            min_part_size: 5 * 1024 * 1024,
            upload_expiry: Duration::from_secs(7 * 24 * 3600),
            registry: RegistrySettings { max_open: 128, ..RegistrySettings::default() },
            shared: None,
        }
    }
}

/// What a write stores besides the bytes.
#[derive(Debug, Clone, Default)]
pub struct PutOptions {
    /// HTTP metadata.
    pub http: HttpMetadata,
    /// Custom metadata.
    pub custom: BTreeMap<String, String>,
    /// `Standard` (default) or `InfrequentAccess`.
    pub storage_class: Option<String>,
    /// Preconditions on the object being replaced.
    pub conditional: Conditional,
    /// Digests the body must match.
    pub digests: ExpectedDigests,
    /// The body's length, when the client declared it.
    pub size: Option<u64>,
    /// A limit on the body below R2's own (for stores built on R2's, such as KV's values).
    pub max_size: Option<u64>,
}

/// What a read asks for.
#[derive(Debug, Clone, Default)]
pub struct GetOptions {
    /// One byte range.
    pub range: Option<ByteRange>,
    /// Preconditions.
    pub conditional: Conditional,
    /// Only this part of a multipart object (1-based).
    pub part_number: Option<u32>,
}

/// A byte stream of object data.
pub type ByteStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send + Sync + 'static>>;

/// An object being read: its metadata, the range served, and its bytes.
pub struct ObjectBody {
    /// The object.
    pub info: ObjectInfo,
    /// `(offset, length)` when a range (or a part) was asked for.
    pub range: Option<(u64, u64)>,
    /// The bytes of the range, or of the whole object.
    pub body: ByteStream,
}

impl ObjectBody {
    /// How many bytes `body` yields.
    pub fn length(&self) -> u64 {
        self.range.map_or(self.info.size, |(_, len)| len)
    }
}

/// The object a copy reads, and the preconditions it must meet.
#[derive(Debug, Clone)]
pub struct CopySource<'a> {
    /// The source bucket's storage id.
    pub bucket: &'a str,
    /// The source key.
    pub key: &'a str,
    /// `x-amz-copy-source-if-*`.
    pub conditional: Conditional,
}

/// A part's body as the client declared it.
#[derive(Debug, Clone, Default)]
pub struct PartOptions {
    /// The declared length, if any.
    pub size: Option<u64>,
    /// Digests the bytes must match.
    pub digests: ExpectedDigests,
}

/// How a copy treats metadata.
#[derive(Debug, Clone)]
pub enum MetadataDirective {
    /// Keep the source's metadata.
    Copy,
    /// Use the request's metadata.
    Replace {
        /// HTTP metadata.
        http: HttpMetadata,
        /// Custom metadata.
        custom: BTreeMap<String, String>,
    },
}

/// A multipart upload in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadInfo {
    /// The key.
    pub key: String,
    /// The upload id.
    pub upload_id: String,
    /// When it started, milliseconds since the epoch.
    pub initiated_ms: i64,
    /// Its storage class.
    pub storage_class: String,
}

/// An uploaded part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartInfo {
    /// 1 to 10,000.
    pub number: u32,
    /// Its ETag (hex MD5), unquoted.
    pub etag: String,
    /// Its size.
    pub size: u64,
    /// When it was uploaded, milliseconds since the epoch.
    pub uploaded_ms: i64,
    /// The checksums it was sent with, and the upload's declared one (name to base64).
    pub checksums: BTreeMap<String, String>,
}

/// How a multipart upload is completed beyond the parts it names.
#[derive(Debug, Clone, Default)]
pub struct CompleteOptions {
    /// Checked against the object the upload would replace (S3's conditional writes).
    pub conditional: Conditional,
    /// The parts' checksums as the client names them (part number, algorithm, base64): those
    /// of the upload's declared algorithm must be the parts'.
    pub part_checksums: Vec<(u32, ChecksumAlgorithm, String)>,
}

/// A page of parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartListing {
    /// The upload's key.
    pub key: String,
    /// The upload's storage class.
    pub storage_class: String,
    /// Parts after the marker, in order.
    pub parts: Vec<PartInfo>,
    /// Whether more follow.
    pub truncated: bool,
}

/// What a sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Orphan blobs removed.
    pub orphans: usize,
    /// Expired multipart uploads aborted.
    pub expired_uploads: usize,
}
