//! R2's Unicode metadata: `x-amz-meta-*` values arrive RFC 2047-encoded (`=?UTF-8?B?…?=` or
//! `=?UTF-8?Q?…?=`) and are stored decoded; non-ASCII values go out encoded the same way.

use base64::Engine as _;

/// Decodes every encoded word of a header value; text that is not an encoded word, or one in a
/// charset other than UTF-8, is kept as it came.
pub(crate) fn decode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    let mut after_word = false;
    while let Some(start) = rest.find("=?") {
        let (before, candidate) = rest.split_at(start);
        match decode_word(candidate) {
            Some((decoded, used)) => {
                // Whitespace between two encoded words is not part of the text.
                if !(after_word && before.trim().is_empty()) {
                    out.push_str(before);
                }
                out.push_str(&decoded);
                rest = &candidate[used..];
                after_word = true;
            }
            None => {
                out.push_str(before);
                out.push_str("=?");
                rest = &candidate[2..];
                after_word = false;
            }
        }
    }
    out.push_str(rest);
    out
}

/// One `=?charset?encoding?text?=` word: its text and how many bytes it took.
fn decode_word(word: &str) -> Option<(String, usize)> {
    let inner = word.strip_prefix("=?")?;
    let (charset, inner) = inner.split_once('?')?;
    let (encoding, inner) = inner.split_once('?')?;
    let end = inner.find("?=")?;
    let text = &inner[..end];
    if !charset.eq_ignore_ascii_case("utf-8") {
        return None;
    }
    let bytes = match encoding {
        "B" | "b" => base64::engine::general_purpose::STANDARD.decode(text).ok()?,
        "Q" | "q" => decode_q(text)?,
        _ => return None,
    };
    let used = 2 + charset.len() + 1 + encoding.len() + 1 + end + 2;
    Some((String::from_utf8(bytes).ok()?, used))
}

fn decode_q(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'_' => out.push(b' '),
            b'=' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    Some(out)
}

/// Encodes a value for a header: as it is if it is printable ASCII, else as one B word.
pub(crate) fn encode(value: &str) -> String {
    if value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return value.to_owned();
    }
    format!("=?UTF-8?B?{}?=", base64::engine::general_purpose::STANDARD.encode(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        assert_eq!(decode("=?UTF-8?B?w6l0w6k=?="), "été");
        assert_eq!(decode("=?utf-8?Q?caf=C3=A9_au_lait?="), "café au lait");
        assert_eq!(decode("plain"), "plain");
        assert_eq!(decode("a =?UTF-8?B?w6k=?= =?UTF-8?B?w6k=?= b"), "a éé b");
        assert_eq!(decode("=?ISO-8859-1?Q?caf=E9?="), "=?ISO-8859-1?Q?caf=E9?=");
        assert_eq!(decode("=?UTF-8?B?not base64!?="), "=?UTF-8?B?not base64!?=");
        for value in ["ascii only", "ünïcödé ✓", "日本語"] {
            assert_eq!(decode(&encode(value)), value);
        }
        assert_eq!(encode("plain"), "plain");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(crate::fuzz_cases()))]

        /// Any header value decodes without panicking; text without an encoded word is kept.
        #[test]
        fn any_value_decodes(value in ".*") {
            let decoded = decode(&value);
            if !value.contains("=?") {
                proptest::prop_assert_eq!(decoded, value);
            }
        }

        /// Encoded words built around arbitrary bytes (valid or not) decode without panicking.
        #[test]
        fn any_encoded_word_decodes(charset in "[A-Za-z0-9-]{0,12}", kind in "[BbQqXx]", text in "[ -~]{0,64}") {
            let _ = decode(&format!("a =?{charset}?{kind}?{text}?= b =?{charset}?{kind}?{text}"));
        }

        /// Every string survives encoding and decoding, as R2 stores Unicode metadata.
        #[test]
        fn every_string_round_trips(value in "\\PC*") {
            proptest::prop_assert_eq!(decode(&encode(&value)), value);
        }
    }
}
