//! What R2 refuses before it verifies a signature, in R2's order and words: no credentials,
//! another scheme than SigV4, a missing payload hash, a missing or malformed date, a malformed
//! credential scope, `host` left unsigned, presigned URLs missing parameters or meant to live
//! longer than a week. `s3s` then verifies the signature itself.

use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;

use super::url::query_pairs;
use crate::error::s3 as xml;

/// The longest a presigned URL may live, in seconds (a week).
const MAX_PRESIGNED_EXPIRY: u64 = 604_800;

/// The parameters a presigned URL must carry, in the order R2 names the missing ones.
const PRESIGN_PARAMETERS: [&str; 5] =
    ["X-Amz-Algorithm", "X-Amz-Signature", "X-Amz-Date", "X-Amz-SignedHeaders", "X-Amz-Expires"];

fn refusal(status: StatusCode, code: &str, message: impl AsRef<str>) -> Option<Response> {
    Some(xml::xml_error(status, code, message.as_ref()))
}

fn invalid_argument(message: impl AsRef<str>) -> Option<Response> {
    refusal(StatusCode::BAD_REQUEST, "InvalidArgument", message)
}

fn use_sigv4() -> Option<Response> {
    refusal(StatusCode::BAD_REQUEST, "InvalidRequest", "Please use AWS4-HMAC-SHA256")
}

fn unauthorized() -> Option<Response> {
    refusal(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
}

/// `YYYYMMDDTHHMMSSZ`, the only date form R2 takes.
fn is_amz_date(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 16 && b[8] == b'T' && b[15] == b'Z' && b[..8].iter().chain(&b[9..15]).all(u8::is_ascii_digit)
}

/// Checks a credential scope (`<key>/<date>/<region>/s3/aws4_request`) against the date.
fn check_scope(credential: &str, amz_date: &str) -> Option<Response> {
    let parts: Vec<&str> = credential.split('/').collect();
    if parts.len() < 5 {
        return invalid_argument(format!(
            "Credential sigv4 header should have at least 5 slash-separated parts, not {}",
            parts.len()
        ));
    }
    let (date, service, terminator) = (parts[parts.len() - 4], parts[parts.len() - 2], parts[parts.len() - 1]);
    if service != "s3" {
        return invalid_argument(format!("Credential service should be s3, not {service}"));
    }
    if terminator != "aws4_request" {
        return invalid_argument(format!("Credential termination string should be aws4_request, not {terminator}"));
    }
    if amz_date.get(..8) != Some(date) {
        return invalid_argument(format!(
            "Credential signed date {date} does not match {} from 'x-amz-date' header",
            amz_date.get(..8).unwrap_or(amz_date)
        ));
    }
    None
}

fn signs_host(signed_headers: &str) -> bool {
    signed_headers.split(';').any(|h| h.trim().eq_ignore_ascii_case("host"))
}

fn header_auth(authorization: &str, headers: &HeaderMap) -> Option<Response> {
    let Some(fields) = authorization.strip_prefix("AWS4-HMAC-SHA256") else { return use_sigv4() };
    if !headers.contains_key("x-amz-content-sha256") {
        return refusal(StatusCode::BAD_REQUEST, "InvalidRequest", "Missing x-amz-content-sha256");
    }
    let date = headers.get("x-amz-date").or_else(|| headers.get(header::DATE));
    let Some(date) = date.map(|d| String::from_utf8_lossy(d.as_bytes()).into_owned()) else {
        return invalid_argument("No date provided in x-amz-date nor date header");
    };
    if !is_amz_date(&date) {
        return invalid_argument(format!("Date provided in 'x-amz-date' header ({date}) didn't parse successfully"));
    }
    let field = |name: &str| {
        fields.split(',').find_map(|part| part.trim().strip_prefix(name).and_then(|v| v.strip_prefix('=')))
    };
    let (Some(credential), Some(signed), Some(_)) = (field("Credential"), field("SignedHeaders"), field("Signature"))
    else {
        return use_sigv4();
    };
    if let Some(refused) = check_scope(credential, &date) {
        return Some(refused);
    }
    if !signs_host(signed) {
        return unauthorized();
    }
    None
}

fn presigned_auth(params: &[(String, String)]) -> Option<Response> {
    let get = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let missing: Vec<&str> = PRESIGN_PARAMETERS.into_iter().filter(|p| get(p).is_none()).collect();
    match missing.as_slice() {
        [] => {}
        [one] => return invalid_argument(format!("Required search parameter {one} missing")),
        many => return invalid_argument(format!("Required search parameters {} missing", many.join(",  "))),
    }
    if get("X-Amz-Algorithm") != Some("AWS4-HMAC-SHA256") {
        return use_sigv4();
    }
    let date = get("X-Amz-Date").unwrap_or_default();
    if !is_amz_date(date) {
        return invalid_argument(format!("Date provided in X-Amz-Date ({date}) didn't parse successfully"));
    }
    if let Some(refused) = check_scope(get("X-Amz-Credential").unwrap_or_default(), date) {
        return Some(refused);
    }
    match get("X-Amz-Expires").unwrap_or_default().parse::<u64>() {
        Ok(seconds) if seconds > MAX_PRESIGNED_EXPIRY => {
            return invalid_argument(
                "X-Amz-Expires must be less than a week (in seconds); that is, the given X-Amz-Expires must be less than 604800 seconds",
            );
        }
        Ok(_) => {}
        Err(_) => return invalid_argument("X-Amz-Expires should be a number"),
    }
    if !signs_host(get("X-Amz-SignedHeaders").unwrap_or_default()) {
        return unauthorized();
    }
    None
}

/// R2's refusal of a request it would not verify, if any.
pub(super) fn refuse(request: &Request) -> Option<Response> {
    let params = query_pairs(request.uri().query().unwrap_or(""), true);
    if let Some(authorization) = request.headers().get(header::AUTHORIZATION) {
        return header_auth(&String::from_utf8_lossy(authorization.as_bytes()), request.headers());
    }
    if params.iter().any(|(k, _)| k == "X-Amz-Credential") {
        return presigned_auth(&params);
    }
    if params.iter().any(|(k, _)| k == "AWSAccessKeyId" || k == "Signature") {
        return use_sigv4();
    }
    let form =
        request.headers().get(header::CONTENT_TYPE).is_some_and(|ct| ct.as_bytes().starts_with(b"multipart/form-data"));
    if request.method() == axum::http::Method::POST && form {
        // Browser form uploads (POST policy), which R2 does not take, in R2's own words.
        return refusal(
            StatusCode::NOT_IMPLEMENTED,
            "NotImplemented",
            "Presigned post requests are not yet implemented not implemented",
        );
    }
    invalid_argument("Authorization")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(uri: &str, headers: &[(&str, &str)]) -> Request {
        let mut builder = Request::builder().uri(uri);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        builder.body(axum::body::Body::empty()).unwrap()
    }

    async fn message(response: Option<Response>) -> (u16, String) {
        let response = response.expect("a refusal");
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 4096).await.unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn header_auth_refusals_read_like_r2s() {
        let date = "20261202T120000Z";
        let auth = |cred: &str, signed: &str| {
            format!("AWS4-HMAC-SHA256 Credential={cred}, SignedHeaders={signed}, Signature=00")
        };
        let good = auth("AK/20261202/auto/s3/aws4_request", "host;x-amz-date");
        let cases: Vec<(Request, u16, &str)> = vec![
            (request("/b", &[]), 400, "<Message>Authorization</Message>"),
            (request("/b", &[("authorization", "AWS AK:sig")]), 400, "Please use AWS4-HMAC-SHA256"),
            (request("/b", &[("authorization", &good), ("x-amz-date", date)]), 400, "Missing x-amz-content-sha256"),
            (
                request("/b", &[("authorization", &good), ("x-amz-content-sha256", "UNSIGNED-PAYLOAD")]),
                400,
                "No date provided in x-amz-date nor date header",
            ),
            (
                request(
                    "/b",
                    &[("authorization", &good), ("x-amz-content-sha256", "x"), ("x-amz-date", "Wed, 02 Dec 2026")],
                ),
                400,
                "didn&apos;t parse successfully",
            ),
            (
                request(
                    "/b",
                    &[
                        ("authorization", &auth("AK/20261202/auto", "host")),
                        ("x-amz-content-sha256", "x"),
                        ("x-amz-date", date),
                    ],
                ),
                400,
                "at least 5 slash-separated parts, not 3",
            ),
            (
                request(
                    "/b",
                    &[
                        ("authorization", &auth("AK/20261202/auto/ec2/aws4_request", "host")),
                        ("x-amz-content-sha256", "x"),
                        ("x-amz-date", date),
                    ],
                ),
                400,
                "Credential service should be s3, not ec2",
            ),
            (
                request(
                    "/b",
                    &[
                        ("authorization", &auth("AK/20261201/auto/s3/aws4_request", "host")),
                        ("x-amz-content-sha256", "x"),
                        ("x-amz-date", date),
                    ],
                ),
                400,
                "Credential signed date 20261201 does not match 20261202",
            ),
            (
                request(
                    "/b",
                    &[
                        ("authorization", &auth("AK/20261202/auto/s3/aws4_request", "x-amz-date")),
                        ("x-amz-content-sha256", "x"),
                        ("x-amz-date", date),
                    ],
                ),
                401,
                "<Code>Unauthorized</Code>",
            ),
        ];
        for (req, status, text) in cases {
            let (got, body) = message(refuse(&req)).await;
            assert_eq!(got, status, "{body}");
            assert!(body.contains(text), "{body} lacks {text}");
        }
        let fine = request("/b", &[("authorization", &good), ("x-amz-content-sha256", "x"), ("x-amz-date", date)]);
        assert!(refuse(&fine).is_none());
    }

    #[tokio::test]
    async fn presigned_refusals_read_like_r2s() {
        let (_, body) =
            message(refuse(&request("/b/k?X-Amz-Credential=AK%2F20261202%2Fauto%2Fs3%2Faws4_request&X-Amz-Date=20261202T120000Z&X-Amz-SignedHeaders=host&X-Amz-Expires=60", &[]))).await;
        assert!(body.contains("Required search parameters X-Amz-Algorithm,  X-Amz-Signature missing"), "{body}");
        let base = "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AK%2F20261202%2Fauto%2Fs3%2Faws4_request&X-Amz-Date=20261202T120000Z&X-Amz-Signature=00";
        let (status, body) =
            message(refuse(&request(&format!("{base}&X-Amz-SignedHeaders=host&X-Amz-Expires=604801"), &[]))).await;
        assert_eq!(status, 400);
        assert!(body.contains("must be less than a week"), "{body}");
        let (status, _) =
            message(refuse(&request(&format!("{base}&X-Amz-SignedHeaders=content-type&X-Amz-Expires=60"), &[]))).await;
        assert_eq!(status, 401);
        assert!(refuse(&request(&format!("{base}&X-Amz-SignedHeaders=host&X-Amz-Expires=60"), &[])).is_none());
        let (_, body) = message(refuse(&request("/b/k?AWSAccessKeyId=AK&Signature=x&Expires=1", &[]))).await;
        assert!(body.contains("Please use AWS4-HMAC-SHA256"), "{body}");
    }
}
