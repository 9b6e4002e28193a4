//! What R2 adds to a SignatureDoesNotMatch: the string it signed and the canonical request it
//! built (as text and as bytes), and the signature the client sent, so the client can see where
//! its own signing went another way. Rebuilt here from the request, as SigV4 defines them.

use axum::http::{HeaderMap, Method, Uri, header};
use sha2::{Digest, Sha256};

use super::url::{query_pairs, uri_encode};

/// The parts of a request SigV4 signs, kept before the request is handed on.
pub(crate) struct Signed {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
}

/// The debugging fields of a SignatureDoesNotMatch.
pub(crate) struct Details {
    pub string_to_sign: String,
    pub canonical_request: String,
    pub signature_provided: String,
}

impl Signed {
    pub(crate) fn keep(method: &Method, uri: &Uri, headers: &HeaderMap) -> Signed {
        Signed { method: method.clone(), uri: uri.clone(), headers: headers.clone() }
    }

    /// The fields, if the request carried a SigV4 signature (in its headers or its query).
    pub(crate) fn details(&self) -> Option<Details> {
        let query = self.uri.query().unwrap_or("");
        let params = query_pairs(query, false);
        let param = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let (credential, signed_headers, signature, date, payload, presigned) =
            match self.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
                Some(auth) => {
                    let fields = auth.strip_prefix("AWS4-HMAC-SHA256")?;
                    let field = |name: &str| {
                        fields
                            .split(',')
                            .find_map(|p| p.trim().strip_prefix(name)?.strip_prefix('=').map(str::to_owned))
                    };
                    let date = self.headers.get("x-amz-date").or_else(|| self.headers.get(header::DATE))?;
                    let payload = self.headers.get("x-amz-content-sha256")?.to_str().ok()?.to_owned();
                    (
                        field("Credential")?,
                        field("SignedHeaders")?,
                        field("Signature")?,
                        date.to_str().ok()?.to_owned(),
                        payload,
                        false,
                    )
                }
                None => (
                    param("X-Amz-Credential")?,
                    param("X-Amz-SignedHeaders")?,
                    param("X-Amz-Signature")?,
                    param("X-Amz-Date")?,
                    "UNSIGNED-PAYLOAD".to_owned(),
                    true,
                ),
            };
        let mut query_pairs: Vec<(String, String)> = params
            .iter()
            .filter(|(k, _)| !(presigned && k == "X-Amz-Signature"))
            .map(|(k, v)| (uri_encode(k), uri_encode(v)))
            .collect();
        query_pairs.sort();
        let canonical_query: Vec<String> = query_pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut canonical_headers = String::new();
        for name in signed_headers.split(';') {
            let values: Vec<String> = self
                .headers
                .get_all(name)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            canonical_headers.push_str(&format!("{name}:{}\n", values.join(",")));
        }
        let canonical_request = format!(
            "{}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{payload}",
            self.method,
            self.uri.path(),
            canonical_query.join("&")
        );
        let scope = credential.split_once('/').map_or("", |(_, scope)| scope);
        let string_to_sign =
            format!("AWS4-HMAC-SHA256\n{date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical_request.as_bytes())));
        Some(Details { string_to_sign, canonical_request, signature_provided: signature })
    }
}

/// The bytes of a text as R2 shows them: two hex digits each, separated by spaces.
pub(crate) fn bytes(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}
