//! Signing outgoing S3 requests with SigV4 (headers, unsigned payload), as R2 checks them: what
//! a cluster node reads a copy's source from another node with, and what the benchmark and the
//! cluster tests send. `aws-sigv4` does the signing.

use std::time::SystemTime;

use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings, UriPathNormalizationMode,
    sign,
};
use aws_sigv4::sign::v4;

/// The headers that sign `method url` (with `headers`, which must include `host`) for the key
/// `access_key_id`/`secret`, region `auto`, service `s3`, the payload unsigned. The URL's path
/// is used as given: encode it once, as S3 expects.
pub fn signed_headers(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    access_key_id: &str,
    secret: &str,
) -> Result<Vec<(String, String)>, String> {
    let identity = aws_credential_types::Credentials::new(access_key_id, secret, None, None, "kura").into();
    let mut settings = SigningSettings::default();
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region("auto")
        .name("s3")
        .time(SystemTime::now())
        .settings(settings)
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let signable = SignableRequest::new(method, url, headers.iter().copied(), SignableBody::UnsignedPayload)
        .map_err(|e| e.to_string())?;
    let (instructions, _) = sign(signable, &params).map_err(|e| e.to_string())?.into_parts();
    Ok(instructions.headers().map(|(n, v)| (n.to_owned(), v.to_owned())).collect())
}

/// The `host` header value of `url` (`127.0.0.1:8781`).
pub fn host_of(url: &str) -> &str {
    url.split("://").nth(1).unwrap_or(url).split('/').next().unwrap_or_default()
}
