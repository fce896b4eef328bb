//! One stored change: what the store keeps for watches and what the simulated
//! cluster ([`crate::sim`]) takes note of. A module of its own so that the store can
//! hold the simulation's state without the two importing each other.

use std::sync::Arc;

use serde_json::Value;

use crate::path::ResourceKey;

/// One change, kept for watches that resume from an older resource version.
pub(crate) struct Change {
    pub rv: u64,
    pub resource: ResourceKey,
    pub namespace: String,
    pub kind: ChangeKind,
    pub object: Arc<Value>,
    /// The object before a modification, so that a selective watch can tell an
    /// object that stops (or starts) matching.
    pub old: Option<Arc<Value>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}
