//! A namespace as the engine needs it: where its objects live, how their ids derive, and
//! whether another process (workerd) runs them.

use crate::error::{DoError, Result};
use crate::id::{IdFactory, ObjectId};

/// A namespace as the engine needs it: where its objects live and how their ids derive.
#[derive(Debug, Clone)]
pub struct Namespace {
    pub(crate) storage_id: String,
    ids: IdFactory,
    pub(crate) elsewhere: bool,
}

impl Namespace {
    /// The namespace stored under `storage_id` (32 hex digits) whose ids derive from
    /// `unique_key`.
    pub fn new(storage_id: &str, unique_key: &str) -> Result<Self> {
        if storage_id.len() != 32 || !storage_id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
            return Err(DoError::Invalid(format!("'{storage_id}' is not a namespace storage id")));
        }
        Ok(Namespace { storage_id: storage_id.to_owned(), ids: IdFactory::new(unique_key), elsewhere: false })
    }

    /// The same namespace, its objects run by another process (workerd, for a deployed
    /// Worker's class) in `<namespace id>/workerd/<object id>.sqlite`: the engine lists,
    /// exports and reads them, never writes them or runs requests on them.
    pub fn hosted_elsewhere(mut self) -> Self {
        self.elsewhere = true;
        self
    }

    /// Whether another process runs the objects.
    pub fn is_hosted_elsewhere(&self) -> bool {
        self.elsewhere
    }

    /// The storage id.
    pub fn storage_id(&self) -> &str {
        &self.storage_id
    }

    /// The id of the object called `name`.
    pub fn id_from_name(&self, name: &str) -> ObjectId {
        self.ids.id_from_name(name)
    }

    /// A new random id.
    pub fn new_unique_id(&self, jurisdiction: Option<&str>) -> Result<ObjectId> {
        Ok(self.ids.new_unique_id(jurisdiction)?)
    }

    /// Parses and checks an id.
    pub fn id_from_string(&self, text: &str) -> Result<ObjectId> {
        Ok(self.ids.id_from_string(text)?)
    }

    /// An id given as 64 hex digits, or else a name.
    pub fn id_from_name_or_string(&self, text: &str) -> Result<ObjectId> {
        if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            self.id_from_string(text)
        } else {
            Ok(self.id_from_name(text))
        }
    }

    pub(crate) fn object_key(&self, id: &ObjectId) -> String {
        format!("{}/{id}", self.storage_id)
    }
}
