//! Durable Object ids as workerd derives them locally: 32 bytes, shown as 64 lowercase hex
//! digits. The first 16 bytes name the object (an HMAC of the name, or random); the last 16 are
//! a MAC of the first under the namespace's key, so an id is only valid for its namespace.
//!
//! ```text
//! key       = SHA-256(unique_key)
//! id[0..16] = HMAC-SHA256(key, name)[0..16]       (id_from_name; random for new_unique_id)
//! id[16..]  = HMAC-SHA256(key, id[0..16])[0..16]
//! ```

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Why a string is not an id of a namespace, in workerd's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Not 64 hex digits.
    #[error("Invalid Durable Object ID: must be 64 hex digits")]
    Malformed,
    /// Well-formed, but its MAC is not this namespace's.
    #[error("Durable Object ID is not valid for this namespace.")]
    WrongNamespace,
    /// Jurisdictions are a property of Cloudflare's network, not of one machine.
    #[error("Jurisdiction restrictions are not implemented in workerd.")]
    Jurisdiction,
}

/// An object's id, and the name it was derived from, if any.
#[derive(Clone, Eq)]
pub struct ObjectId {
    bytes: [u8; 32],
    name: Option<String>,
}

impl ObjectId {
    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.bytes
    }

    /// The name it was derived from (`id_from_name`), if any.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

/// Ids compare by their bytes only, as workerd's `equals()` does.
impl PartialEq for ObjectId {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl std::hash::Hash for ObjectId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.bytes.hash(state);
    }
}

/// 64 lowercase hex digits, as `toString()` gives them.
impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut digits = [0u8; 64];
        hex::encode_to_slice(self.bytes, &mut digits).expect("64 digits for 32 bytes");
        f.write_str(std::str::from_utf8(&digits).expect("hex digits are ASCII"))
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({self}")?;
        if let Some(name) = &self.name {
            write!(f, ", {name:?}")?;
        }
        f.write_str(")")
    }
}

/// Makes and checks the ids of one namespace.
#[derive(Clone)]
pub struct IdFactory {
    key: [u8; 32],
}

impl fmt::Debug for IdFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdFactory { .. }")
    }
}

impl IdFactory {
    /// The factory of the namespace whose unique key this is (Miniflare and wrangler use
    /// `<script name>-<class name>`).
    pub fn new(unique_key: &str) -> Self {
        IdFactory { key: Sha256::digest(unique_key.as_bytes()).into() }
    }

    fn hmac16(&self, data: &[u8]) -> [u8; 16] {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(data);
        let full = mac.finalize().into_bytes();
        let mut out = [0u8; 16];
        out.copy_from_slice(&full[..16]);
        out
    }

    fn with_mac(&self, head: [u8; 16], name: Option<String>) -> ObjectId {
        let mut bytes = [0u8; 32];
        bytes[..16].copy_from_slice(&head);
        bytes[16..].copy_from_slice(&self.hmac16(&head));
        ObjectId { bytes, name }
    }

    /// The id of the object called `name`: the same name always gives the same id.
    pub fn id_from_name(&self, name: &str) -> ObjectId {
        self.with_mac(self.hmac16(name.as_bytes()), Some(name.to_owned()))
    }

    /// A new, random id. A jurisdiction is refused, as workerd refuses it locally.
    pub fn new_unique_id(&self, jurisdiction: Option<&str>) -> Result<ObjectId, IdError> {
        if jurisdiction.is_some() {
            return Err(IdError::Jurisdiction);
        }
        let mut head = [0u8; 16];
        getrandom::fill(&mut head).expect("the operating system's random source failed");
        Ok(self.with_mac(head, None))
    }

    /// Parses an id from its 64 hex digits (either case) and checks it belongs here. The id
    /// has no name, even when it was derived from one.
    pub fn id_from_string(&self, text: &str) -> Result<ObjectId, IdError> {
        if text.len() != 64 {
            return Err(IdError::Malformed);
        }
        let decoded = hex::decode(text).map_err(|_| IdError::Malformed)?;
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(&decoded);
        let mut head = [0u8; 16];
        head.copy_from_slice(&bytes[..16]);
        if self.hmac16(&head) != bytes[16..] {
            return Err(IdError::WrongNamespace);
        }
        Ok(ObjectId { bytes, name: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_give_workerds_ids() {
        let counter = IdFactory::new("my-worker-Counter");
        assert_eq!(
            counter.id_from_name("foo").to_string(),
            "8d8d52167eba73e7f0268ab71258e747f36d3bda25975c74ec438beeadb76dd6"
        );
        assert_eq!(
            counter.id_from_name("").to_string(),
            "385054d1a4b25061f24068b3076966a0cd22da0f7f126522b60b10de5bab35a9"
        );
        assert_eq!(
            IdFactory::new("-MyDurableObject").id_from_name("room-7").to_string(),
            "4ad02e39cbd0245165db613b4b358f4cae2d34e1926ae0df10e0e7edc1131f35"
        );
        assert_eq!(counter.id_from_name("foo").name(), Some("foo"));
    }

    #[test]
    fn strings_are_checked_with_workerds_errors() {
        let counter = IdFactory::new("my-worker-Counter");
        let id = counter.id_from_name("foo");
        let parsed = counter.id_from_string(&id.to_string().to_uppercase()).unwrap();
        assert_eq!(parsed, id, "ids compare by bytes, whatever their names");
        assert_eq!(parsed.name(), None);
        assert_eq!(counter.id_from_string("abc"), Err(IdError::Malformed));
        assert_eq!(counter.id_from_string(&"zz".repeat(32)), Err(IdError::Malformed));
        let other = IdFactory::new("other-worker-Counter");
        assert_eq!(other.id_from_string(&id.to_string()), Err(IdError::WrongNamespace));
        assert_eq!(IdError::Malformed.to_string(), "Invalid Durable Object ID: must be 64 hex digits");
        assert_eq!(IdError::WrongNamespace.to_string(), "Durable Object ID is not valid for this namespace.");
    }

    #[test]
    fn unique_ids_are_random_and_valid_here_only() {
        let counter = IdFactory::new("my-worker-Counter");
        let a = counter.new_unique_id(None).unwrap();
        let b = counter.new_unique_id(None).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.name(), None);
        assert_eq!(counter.id_from_string(&a.to_string()).unwrap(), a);
        assert_eq!(IdFactory::new("x-Y").id_from_string(&a.to_string()), Err(IdError::WrongNamespace));
        assert_eq!(counter.new_unique_id(Some("eu")), Err(IdError::Jurisdiction));
    }
}
