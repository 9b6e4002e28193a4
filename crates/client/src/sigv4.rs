//! Signing S3 requests with SigV4 (unsigned payload) as R2 checks them: in headers, what a
//! cluster node reads a copy's source from another node with and what the benchmark and the
//! tests send; in the query string, `kura r2 presign`'s URLs. `aws-sigv4` does the signing.

/// Why a request could not be signed (a malformed URL or header, or settings `aws-sigv4`
/// refused), in `aws-sigv4`'s or `http`'s words.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct SignError(Box<dyn std::error::Error + Send + Sync>);

fn failed(e: impl std::error::Error + Send + Sync + 'static) -> SignError {
    SignError(Box::new(e))
}

use std::time::{Duration, SystemTime};

use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SignatureLocation, SigningInstructions,
    SigningSettings, UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;

/// Signs `method url` (with `headers`, which must include `host`) as R2 checks it: region
/// `auto`, service `s3`, the payload unsigned, the URL's path used as given (encode it once, as
/// S3 expects). `settings` says where the signature goes.
fn sign_for_r2(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    (access_key_id, secret): (&str, &str),
    time: SystemTime,
    mut settings: SigningSettings,
    body: SignableBody<'_>,
) -> Result<SigningInstructions, SignError> {
    let identity = aws_credential_types::Credentials::new(access_key_id, secret, None, None, "kura").into();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region("auto")
        .name("s3")
        .time(time)
        .settings(settings)
        .build()
        .map_err(failed)?
        .into();
    let signable = SignableRequest::new(method, url, headers.iter().copied(), body).map_err(failed)?;
    Ok(sign(signable, &params).map_err(failed)?.into_parts().0)
}

/// The headers that sign `method url` (with `headers`, which must include `host`) for the key
/// `access_key_id`/`secret`, now.
pub fn signed_headers(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    access_key_id: &str,
    secret: &str,
) -> Result<Vec<(String, String)>, SignError> {
    signed_headers_for(method, url, headers, (access_key_id, secret), false)
}

/// As [`signed_headers`]; with `streaming_trailer`, for an aws-chunked body with a trailer and
/// no chunk signatures (`STREAMING-UNSIGNED-PAYLOAD-TRAILER`, what the AWS SDKs send when they
/// checksum an upload).
pub fn signed_headers_for(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    key: (&str, &str),
    streaming_trailer: bool,
) -> Result<Vec<(String, String)>, SignError> {
    let mut settings = SigningSettings::default();
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    let body = match streaming_trailer {
        true => SignableBody::StreamingUnsignedPayloadTrailer,
        false => SignableBody::UnsignedPayload,
    };
    let instructions = sign_for_r2(method, url, headers, key, SystemTime::now(), settings, body)?;
    Ok(instructions.headers().map(|(n, v)| (n.to_owned(), v.to_owned())).collect())
}

/// `url` presigned at `time` for `method` (with `headers`, which must include `host`) until
/// `expires` has passed: the signature in the query string, as `kura r2 presign` hands it out.
pub fn presigned_url(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    (access_key_id, secret): (&str, &str),
    expires: Duration,
    time: SystemTime,
) -> Result<String, SignError> {
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(expires);
    let instructions =
        sign_for_r2(method, url, headers, (access_key_id, secret), time, settings, SignableBody::UnsignedPayload)?;
    let mut signed = http::Request::builder().method(method).uri(url).body(()).map_err(failed)?;
    instructions.apply_to_request_http1x(&mut signed);
    Ok(signed.uri().to_string())
}

/// The `host` header value of `url` (`127.0.0.1:8781`).
pub fn host_of(url: &str) -> &str {
    url.split("://").nth(1).unwrap_or(url).split('/').next().unwrap_or_default()
}
