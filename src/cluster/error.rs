//! The error of the cluster's own machinery (the connection, buckets and streams it sets up):
//! a leaf every other file of the module may use. The shared state the domain modules keep in
//! the cluster fails with the seam's typed error instead ([`crate::store::shared::SharedError`]).

use crate::store::shared::SharedError;
use crate::store::StoreError;

/// A cluster operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The client could not be set up (credentials file, TLS files).
    #[error("cluster: {0}")]
    Setup(String),
    /// NATS or JetStream did not answer or refused.
    #[error("NATS: {0}")]
    Nats(String),
    /// The local store (the cache of the cluster's state) failed.
    #[error("local store: {0}")]
    Store(#[from] StoreError),
}

impl From<ClusterError> for SharedError {
    fn from(e: ClusterError) -> Self {
        SharedError::unavailable(e)
    }
}
