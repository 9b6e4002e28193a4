//! The start-up probe that decides whether a store's conditional writes can be trusted to
//! decide ownership. Some stores (Garage 2.5.0 among them) ignore `If-None-Match` and
//! `If-Match` and answer 200 while overwriting — `object_store` then reports success — so
//! kura asks, with a random name, before it relies on them.

use bytes::Bytes;

use crate::storage::{PutMode, Storage, StorageError, Version};

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// A second create was refused and a replace with a wrong version was refused: the store
    /// can hold leases and a manifest.
    Honoured,
    /// The store accepted a write it should have refused.
    Ignored {
        /// Which write it accepted.
        accepted: &'static str,
    },
}

impl ProbeOutcome {
    /// The reason the store cannot coordinate, for the message that refuses it.
    pub fn refusal(&self, storage: &dyn Storage) -> Option<String> {
        match self {
            ProbeOutcome::Honoured => None,
            ProbeOutcome::Ignored { accepted } => Some(format!(
                "{} ignores conditional writes (it accepted {accepted}), so it cannot decide which node owns what; \
                 use etcd as the coordinator (--coordinator etcd --etcd URL,…)",
                storage.describe()
            )),
        }
    }
}

/// Creates a random object twice, replaces it with a wrong version and then with the right one,
/// and removes it. Errors are the store's own (unreachable, refused credentials).
pub async fn probe_conditional_writes(storage: &dyn Storage) -> Result<ProbeOutcome, StorageError> {
    let mut random = [0u8; 12];
    getrandom::fill(&mut random).expect("the system has randomness");
    let name = format!("probe/{}", hex::encode(random));
    let outcome = run(storage, &name).await;
    let cleaned = storage.delete(&name).await;
    let outcome = outcome?;
    cleaned?;
    Ok(outcome)
}

async fn run(storage: &dyn Storage, name: &str) -> Result<ProbeOutcome, StorageError> {
    let first = storage.put(name, Bytes::from_static(b"first"), PutMode::Create).await?;
    match storage.put(name, Bytes::from_static(b"second"), PutMode::Create).await {
        Err(StorageError::AlreadyExists { .. }) => {}
        Err(other) => return Err(other),
        Ok(_) => return Ok(ProbeOutcome::Ignored { accepted: "a second create of one name (If-None-Match: *)" }),
    }
    let wrong = Version(format!("\"{}\"", hex::encode(name.as_bytes())));
    match storage.put(name, Bytes::from_static(b"third"), PutMode::Replace(wrong)).await {
        Err(StorageError::Precondition { .. }) => {}
        Err(other) => return Err(other),
        Ok(_) => {
            return Ok(ProbeOutcome::Ignored { accepted: "a replace naming a version it does not hold (If-Match)" });
        }
    }
    storage.put(name, Bytes::from_static(b"fourth"), PutMode::Replace(first)).await?;
    let (bytes, _) = storage.get(name).await?;
    if &bytes[..] != b"fourth" {
        return Ok(ProbeOutcome::Ignored { accepted: "a write it then did not keep" });
    }
    Ok(ProbeOutcome::Honoured)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::storage::RemoteStorage;

    #[tokio::test]
    async fn in_memory_store_passes() {
        let storage = RemoteStorage::new(Arc::new(object_store::memory::InMemory::new()), "", "memory".into());
        assert_eq!(probe_conditional_writes(&storage).await.unwrap(), ProbeOutcome::Honoured);
        assert!(storage.list("probe/").await.unwrap().is_empty(), "the probe cleans up");
    }
}
