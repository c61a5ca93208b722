//! The JetStream streams of the cluster and how session partitions map onto them: the inbound
//! journal `WEFT_IN` (subject `weft.in.<n>`) and the session log `WEFT_STATE` (subject
//! `weft.state.<n>`), made when a node first reaches NATS; a session's partition; a
//! partition's lease key. A leaf: the node sets the streams up, the partition owners and the
//! session log use them, and nothing here imports them back.

use std::time::Duration;

use async_nats::jetstream::{self, stream};

use super::error::ClusterError;

/// The stream of the inbound journal.
pub const IN_STREAM: &str = "WEFT_IN";
/// The stream of the session log.
pub const STATE_STREAM: &str = "WEFT_STATE";
/// How long JetStream remembers a message id to drop a second publication of it: longer than
/// any platform redelivers an unconfirmed update (Telegram keeps them 24 h).
pub const DEDUP_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The partition of a session key (FNV-1a, stable across builds and machines).
pub fn partition_of(key: &str, partitions: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    u32::try_from(h % u64::from(partitions.max(1))).unwrap_or(0)
}

/// The inbound journal's subject of partition `p`.
pub fn in_subject(p: u32) -> String {
    format!("weft.in.{p}")
}

/// The session log's subject of partition `p`.
pub fn state_subject(p: u32) -> String {
    format!("weft.state.{p}")
}

/// The lease key of partition `p`.
pub fn lease_key(p: u32) -> String {
    format!("part.{p}")
}

/// Make the stream of `config` if missing: replicated on three servers when the cluster has
/// them (one otherwise).
async fn ensure(js: &jetstream::Context, config: stream::Config) -> Result<(), ClusterError> {
    if js.get_stream(&config.name).await.is_ok() {
        return Ok(());
    }
    let mut last = String::new();
    for replicas in [3, 1] {
        let c = stream::Config {
            num_replicas: replicas,
            ..config.clone()
        };
        match js.create_stream(c).await {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
        // Made by another node meanwhile?
        if js.get_stream(&config.name).await.is_ok() {
            return Ok(());
        }
    }
    Err(ClusterError::Nats(format!(
        "stream {}: {last}",
        config.name
    )))
}

/// Make the inbound journal's stream if missing (a work queue kept on file, deduplicated for
/// [`DEDUP_WINDOW`]).
///
/// # Errors
/// JetStream refused or did not answer.
pub async fn ensure_inbound(js: &jetstream::Context) -> Result<(), ClusterError> {
    ensure(
        js,
        stream::Config {
            name: IN_STREAM.into(),
            description: Some("weft inbound journal".into()),
            subjects: vec!["weft.in.>".into()],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: DEDUP_WINDOW,
            ..Default::default()
        },
    )
    .await
}

/// Make the session log's stream if missing: kept without age limit (the replay starts from
/// what a node applied last).
///
/// # Errors
/// JetStream refused or did not answer.
pub async fn ensure_session_log(js: &jetstream::Context) -> Result<(), ClusterError> {
    ensure(
        js,
        stream::Config {
            name: STATE_STREAM.into(),
            description: Some("weft session log".into()),
            subjects: vec!["weft.state.>".into()],
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            ..Default::default()
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_stable_and_spread() {
        assert_eq!(
            partition_of("telegram:1", 64),
            partition_of("telegram:1", 64)
        );
        let mut seen = std::collections::HashSet::new();
        for i in 0..100 {
            seen.insert(partition_of(&format!("telegram:{i}"), 8));
        }
        assert_eq!(seen.len(), 8);
        assert_eq!(partition_of("x", 1), 0);
        assert_eq!(partition_of("x", 0), 0);
    }
}
