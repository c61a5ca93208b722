//! Cluster mode on NATS JetStream (docs/cluster.md): several gateways share the work, with no
//! single machine to lose. This slice: the `[cluster]` settings ([`settings`]), the connection
//! and the node registry ([`node`]), leases with fencing on a JetStream key-value bucket
//! ([`fence`], [`lease`]), and one connection per bot account across the cluster: a channel's
//! long-lived connection runs only on the node holding its lease ([`leased`]), its resume state
//! in the cluster, its writes fenced by the lease ([`state`]); the inbound journal in JetStream
//! with session partitions leased to and consumed by their owner ([`inbound`]), and the
//! partitions' session state in the session log the owner writes and its successor replays
//! ([`session_log`]). [`status`] is
//! what `weft cluster status` and `weft doctor` read. Shared state: the scheduled jobs and their
//! once-per-occurrence claims ([`jobs`]), the usage counters the budgets add up ([`usage`]),
//! pairing ([`access`]), approvals ([`approvals`]) and the memory documents and context files
//! ([`docs`]).
//!
//! Everything but [`settings`] needs the `cluster` cargo feature.

pub mod settings;

#[cfg(feature = "cluster")]
pub mod access;
#[cfg(feature = "cluster")]
pub mod approvals;
#[cfg(feature = "cluster")]
pub mod balance;
#[cfg(feature = "cluster")]
pub mod docs;
#[cfg(feature = "cluster")]
pub mod fence;
#[cfg(feature = "cluster")]
pub mod inbound;
#[cfg(feature = "cluster")]
pub mod jobs;
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
pub mod usage;

#[cfg(feature = "cluster")]
pub use node::Cluster;

/// No cluster in a build without the `cluster` feature: `Option<Cluster>` is always `None`.
#[cfg(not(feature = "cluster"))]
#[derive(Clone, Debug)]
pub enum Cluster {}

/// The key-value bucket of the leases (history 1, max age = the lease TTL).
pub const LEASE_BUCKET: &str = "weft_leases";
/// The key-value bucket of the node registry (entries expire after three TTLs without a
/// heartbeat).
pub const NODE_BUCKET: &str = "weft_nodes";
/// The key-value bucket of the channels' resume state (no expiry).
pub const STATE_BUCKET: &str = "weft_channel_state";

/// A key-value key part for `s`: A-Z a-z 0-9 - _ kept, every other byte as `=XX`.
pub fn key_part(s: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "={b:02X}");
        }
    }
    if out.is_empty() {
        out.push_str("=00");
    }
    out
}

/// The lease key of the connection of channel `id` (`telegram`, `telegram.NAME`):
/// `conn.<platform>.<account>` (`default` for the channel's own account).
pub fn connection_lease_key(id: &str) -> String {
    let (platform, account) = id.split_once('.').unwrap_or((id, "default"));
    format!("conn.{}.{}", key_part(platform), key_part(account))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_valid_and_distinct() {
        assert_eq!(connection_lease_key("telegram"), "conn.telegram.default");
        assert_eq!(connection_lease_key("telegram.bot2"), "conn.telegram.bot2");
        assert_eq!(key_part("a.b c"), "a=2Eb=20c");
        assert_ne!(key_part("a.b"), key_part("a=2Eb"));
        assert_eq!(key_part(""), "=00");
    }
}
