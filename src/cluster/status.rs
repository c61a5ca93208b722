//! What `weft cluster status` and `weft doctor` read from NATS, with a connection of their own.

use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use serde_json::{json, Value};

use super::fence::Fence;
use super::lease::Leases;
use super::node::{connect, ClusterError, NodeInfo};
use super::settings::ClusterSettings;

const WAIT: Duration = Duration::from_secs(5);

/// Connect and ask JetStream for the account: `Ok(summary)` or what is wrong.
///
/// # Errors
/// The connection or JetStream failed, with the reason.
pub async fn check(s: &ClusterSettings) -> Result<String, ClusterError> {
    let client = connect(s, WAIT, false).await?;
    let js = jetstream::new(client.clone());
    let info = tokio::time::timeout(WAIT, js.query_account())
        .await
        .map_err(|_| ClusterError::Nats("JetStream did not answer".into()))?
        .map_err(|e| ClusterError::Nats(format!("JetStream: {e}")))?;
    let server = client.server_info();
    Ok(format!(
        "connected to {} (server {} {}), JetStream: {} streams",
        server.host, server.server_name, server.version, info.streams
    ))
}

/// Nodes, partitions and connection leases, as JSON.
///
/// # Errors
/// The connection or JetStream failed.
pub async fn collect(s: &ClusterSettings) -> Result<Value, ClusterError> {
    let client = connect(s, WAIT, false).await?;
    collect_on(&jetstream::new(client), s).await
}

/// [`collect`] on a connection the caller has (the running gateway's, for its status).
///
/// # Errors
/// JetStream failed or did not answer.
pub async fn collect_on(
    js: &jetstream::Context,
    s: &ClusterSettings,
) -> Result<Value, ClusterError> {
    let js = js.clone();
    let (leases, nodes, _) = tokio::time::timeout(WAIT * 2, super::node::buckets(&js, s.lease_ttl))
        .await
        .map_err(|_| ClusterError::Nats("JetStream did not answer".into()))??;
    let now = clawft_channel_core::now_ms();
    let mut rows = Vec::new();
    let mut keys = nodes
        .keys()
        .await
        .map_err(|e| ClusterError::Nats(e.to_string()))?;
    while let Some(k) = keys.next().await {
        let k = k.map_err(|e| ClusterError::Nats(e.to_string()))?;
        let Some(v) = nodes
            .get(&k)
            .await
            .map_err(|e| ClusterError::Nats(e.to_string()))?
        else {
            continue;
        };
        if let Ok(n) = serde_json::from_slice::<NodeInfo>(&v) {
            rows.push(n);
        }
    }
    rows.sort_by(|a, b| a.node.cmp(&b.node));
    let ttl_ms = u64::try_from(s.lease_ttl.as_millis()).unwrap_or(u64::MAX);
    let leases = Leases::new(leases, Fence::new(s.lease_ttl), s.node_id.clone());
    let conns = leases
        .list("conn.")
        .await
        .map_err(|e| ClusterError::Nats(e.to_string()))?;
    let parts = leases
        .list("part.")
        .await
        .map_err(|e| ClusterError::Nats(e.to_string()))?;
    let mut owners = std::collections::BTreeMap::<String, u64>::new();
    for p in &parts {
        *owners.entry(p.holder.clone()).or_default() += 1;
    }
    Ok(json!({
        "this_node": s.node_id,
        "lease_ttl_secs": s.lease_ttl.as_secs(),
        "nodes": rows.iter().map(|n| json!({
            "node": n.node,
            "alive": now.saturating_sub(n.seen_ms) < ttl_ms * 3,
            "since_ms": n.started_ms,
            "seen_ms_ago": now.saturating_sub(n.seen_ms),
            "address": n.address,
            "version": n.version,
        })).collect::<Vec<_>>(),
        "partitions": {
            "count": s.partitions,
            "leased": true,
            "held": parts.len(),
            "owners": owners,
        },
        "connections": conns,
    }))
}

/// `collect`'s JSON as lines for a terminal.
pub fn render(v: &Value) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "cluster (this node: {}, lease TTL {} s)",
        v["this_node"].as_str().unwrap_or(""),
        v["lease_ttl_secs"]
    );
    let _ = writeln!(out, "nodes:");
    let now = clawft_channel_core::now_ms();
    for n in v["nodes"].as_array().into_iter().flatten() {
        let since = now.saturating_sub(n["since_ms"].as_u64().unwrap_or(now)) / 1000;
        let _ = writeln!(
            out,
            "  {:<20} {:<6} up {}s  {}  {}",
            n["node"].as_str().unwrap_or(""),
            if n["alive"].as_bool().unwrap_or(false) {
                "alive"
            } else {
                "gone"
            },
            since,
            n["address"].as_str().unwrap_or("-"),
            n["version"].as_str().unwrap_or(""),
        );
    }
    let owners = v["partitions"]["owners"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "partitions: {} ({} held{}{})",
        v["partitions"]["count"],
        v["partitions"]["held"],
        if owners.is_empty() { "" } else { "; " },
        owners
    );
    let _ = writeln!(out, "connection leases:");
    let conns = v["connections"].as_array().cloned().unwrap_or_default();
    if conns.is_empty() {
        let _ = writeln!(out, "  (none held)");
    }
    for c in conns {
        let _ = writeln!(
            out,
            "  {:<32} holder {:<20} revision {:<8} expires in {:.1}s",
            c["key"].as_str().unwrap_or(""),
            c["holder"].as_str().unwrap_or(""),
            c["revision"],
            c["expires_in_ms"].as_f64().unwrap_or(0.0) / 1000.0
        );
    }
    out
}
