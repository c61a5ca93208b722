//! clawft: the `weft` agent gateway.
//!
//! ```text
//! channels/<platform> ─InboundDelivery─▶ ChannelActor: ingress pump (sanitise, SessionKey,
//!                                         journal + flush, ack) ─BusMsg::Inbound─▶ BusActor
//! BusActor (SessionKey → SessionActor, spawned on first message, supervised)
//!   ─SessionMsg::Inbound─▶ SessionActor (queue, transcript; one turn at a time)
//!   ─spawns─▶ turn::run_turn (LLM ⇄ ToolRegistry) ─SessionMsg::TurnFinished─▶ SessionActor
//!   ─BusMsg::Outbound─▶ BusActor ─ChannelMsg::Send─▶ ChannelActor outbox ─▶ Channel::send
//! ```
//!
//! # Layout
//! - [`config`]: file + environment → validated [`config::Config`]; the only env reader.
//! - [`types`]: leaf types: [`types::SessionKey`], [`types::Secret`], text sanitising.
//! - [`ingress`]: access rules and pairing.
//! - [`bus`], [`session`], [`egress`]: the actors.
//! - [`turn`]: the tool-call loop.
//! - [`llm`]: providers behind [`llm::ChatModel`].
//! - [`net`]: the SSRF guard ([`net::ssrf`]) of `web_fetch` and MCP URL servers.
//! - [`tools`]: [`tools::Tool`], [`tools::ToolRegistry`], built-in tools.
//! - [`store`]: sled transcripts, inbound journal, outbox.
//! - [`daemon`]: builds the tree, recovery, shutdown order.
//! - [`admin`]: the admin side of the HTTP API (status, sessions).
//! - [`approval`]: approvals asked of the user in their chat (exec `ask` mode).
//! - [`cli`]: the `weft` subcommands.

pub mod admin;
pub mod approval;
pub mod bus;
pub mod channels;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod egress;
pub mod ingress;
pub mod llm;
pub mod mcp;
pub mod metrics;
pub mod net;
pub mod notify;
pub mod session;
pub mod skills;
pub mod store;
pub mod subagent;
pub mod telemetry;
pub mod tools;
pub mod turn;
pub mod types;

/// Install ring as the process-wide rustls crypto provider (two backends are linked; without
/// this the first TLS client panics). Idempotent.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
