//! Cluster mode on NATS JetStream (docs/cluster.md): several gateways share the work, with no
//! single machine to lose. The `[cluster]` settings ([`settings`]); the connection, the buckets
//! and streams it sets up and the node registry ([`node`], its error in [`error`], the
//! streams and the session partitions in [`streams`]); leases with fencing on a JetStream
//! key-value bucket ([`fence`], [`lease`]); one connection per bot account across the
//! cluster: a channel's long-lived connection runs only on the node holding its lease
//! ([`leased`]), its resume state in the cluster, its writes fenced by the lease ([`state`]);
//! the inbound journal in JetStream with session partitions leased to and consumed by their
//! owner ([`inbound`], shared out by [`balance`]), and the partitions' session state in the
//! session log the owner writes and its successor replays ([`session_log`]). [`status`] is
//! what `weft cluster status` and `weft doctor` read. Every other piece of shared state (jobs,
//! usage, pairing, approvals, documents) is kept by the module that owns it through the
//! shared-state seam ([`crate::store::shared`]), which [`kv`] implements on the cluster's
//! key-value buckets: this module knows none of those pieces.
//!
//! Imports between the files point one way: `error`, `settings`, `fence` and `streams` at the
//! bottom, then `lease`, `node`, then what runs on a node. Everything but [`settings`] needs
//! the `cluster` cargo feature.

pub mod settings;

#[cfg(feature = "cluster")]
pub mod balance;
#[cfg(feature = "cluster")]
pub mod error;
#[cfg(feature = "cluster")]
pub mod fence;
#[cfg(feature = "cluster")]
pub mod inbound;
#[cfg(feature = "cluster")]
pub mod kv;
#[cfg(feature = "cluster")]
pub mod lease;
#[cfg(feature = "cluster")]
pub mod leased;
#[cfg(feature = "cluster")]
pub mod node;
#[cfg(feature = "cluster")]
pub mod session_log;
#[cfg(feature = "cluster")]
pub mod state;
#[cfg(feature = "cluster")]
pub mod status;
#[cfg(feature = "cluster")]
pub mod streams;

#[cfg(feature = "cluster")]
pub use leased::connection_lease_key;
#[cfg(feature = "cluster")]
pub use node::{Cluster, LEASE_BUCKET, NODE_BUCKET, STATE_BUCKET};

pub use crate::store::shared::key_part;

/// No cluster in a build without the `cluster` feature: `Option<Cluster>` is always `None`.
#[cfg(not(feature = "cluster"))]
#[derive(Clone, Debug)]
pub enum Cluster {}
