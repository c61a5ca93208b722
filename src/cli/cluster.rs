//! `weft cluster status`: the nodes, partitions and connection leases of the cluster of
//! `[cluster]`, read from NATS with a connection of its own (no running gateway needed).

use super::CliError;
use crate::config::Config;

/// `weft cluster` actions.
#[derive(Debug, clap::Subcommand)]
pub enum ClusterAction {
    /// Nodes (alive, since), partitions and connection leases (holder, revision, expires in).
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Run `weft cluster ACTION`.
///
/// # Errors
/// No `[cluster]` section, a build without cluster support, or NATS unreachable.
pub async fn run(config: &Config, action: ClusterAction) -> Result<(), CliError> {
    let ClusterAction::Status { json } = action;
    let Some(s) = &config.cluster else {
        return Err(CliError::Failed(
            "no [cluster] section in the configuration: this gateway runs in single-node mode (docs/cluster.md)".into(),
        ));
    };
    #[cfg(feature = "cluster")]
    {
        let v = crate::cluster::status::collect(s)
            .await
            .map_err(|e| CliError::Failed(format!("cluster: {e}")))?;
        if json {
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        } else {
            print!("{}", crate::cluster::status::render(&v));
        }
        Ok(())
    }
    #[cfg(not(feature = "cluster"))]
    {
        let _ = (s, json);
        Err(CliError::Failed(
            "this build of weft has no cluster support (build it with `cargo build --release --features cluster`)".into(),
        ))
    }
}
