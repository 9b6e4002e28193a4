//! Percent-encoding as S3 and SigV4 use it, for the S3 listener's pieces that read raw URLs.

/// SigV4's (and `encoding-type=url`'s) URI encoding: everything but the unreserved characters
/// `A-Z a-z 0-9 - _ . ~`, as `%XX`.
pub(crate) fn uri_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes `%XX` escapes (and, in form-encoded query strings, `+` as a space); a `%` not
/// followed by two hex digits stays as it is, and bytes that are not UTF-8 are replaced.
pub(crate) fn percent_decode(text: &str, plus_as_space: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let escaped =
                    bytes.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
                match escaped {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' if plus_as_space => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A query string's pairs, decoded.
pub(crate) fn query_pairs(query: &str, plus_as_space: bool) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k, plus_as_space), percent_decode(v, plus_as_space))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_round_trip() {
        assert_eq!(uri_encode("a b/ü~"), "a%20b%2F%C3%BC~");
        assert_eq!(percent_decode("a%20b%2F%C3%BC~", false), "a b/ü~");
        assert_eq!(percent_decode("a+b%zz%", true), "a b%zz%");
        assert_eq!(percent_decode("a+b", false), "a+b");
        assert_eq!(
            query_pairs("x=1&y&z=a%2Bb", true),
            vec![("x".into(), "1".into()), ("y".into(), String::new()), ("z".into(), "a+b".into())]
        );
    }
}
