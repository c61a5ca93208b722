//! clawft: the `weft` agent gateway.
//!
//! ```text
//! channels/<platform> ─InboundDelivery─▶ ingress pump (access, SessionKey, journal + flush, ack)
//!   ─Inbox─▶ BusActor (SessionKey → SessionActor, spawned on first message, supervised)
//!   ─SessionMsg::Inbound─▶ SessionActor (queue, transcript; one turn at a time)
//!   ─spawns─▶ turn::run_turn (LLM ⇄ ToolRegistry) ─SessionMsg::TurnFinished─▶ SessionActor
//!   ─Outbox (persist, then route)─▶ ChannelActor outbox worker ─▶ Channel::send
//! ```
//!
//! # Layout
//! By layer, from the bottom up; a module imports only from layers below it
//! (`docs/architecture.md`, checked by `tests/it/layering.rs`).
//! - [`types`]: leaf types: [`types::SessionKey`], [`types::Secret`], [`types::SettingError`],
//!   text sanitising, credential scrubbing ([`types::scrub::Scrubber`]). [`metrics`],
//!   [`telemetry`], [`notify`]: process-wide facilities.
//! - [`llm`]: providers behind [`llm::ChatModel`]. [`net`]: the SSRF guard ([`net::ssrf`]) of
//!   `web_fetch` and MCP URL servers.
//! - [`store`]: sled transcripts, inbound journal, outbox.
//! - [`tools`]: [`tools::Tool`], [`tools::ToolRegistry`], built-in tools.
//! - [`skills`]: `SKILL.md` skills. [`mcp`]: MCP client and server. [`memory`]: memory
//!   documents, their search index and the memory tools. [`media`]: chat attachments
//!   downloaded into the workspace, sniffed and transcribed. [`browser`]: the agent's
//!   headless Chromium (DevTools protocol over a pipe, requests through the egress proxy) and
//!   the `browser` tool. [`cluster`]: cluster mode on NATS JetStream (connection, node
//!   registry, leases with fencing, one connection per bot account).
//! - [`config`]: file + environment → validated [`config::Config`]; the only env reader.
//!   [`approval`]: approvals asked of the user in their chat (exec `ask` mode).
//! - [`egress`]: channel actors (outbox workers), the [`egress::Outbox`] handle and the live
//!   [`egress::ChannelTable`]. [`turn`]: the tool-call loop. [`scheduler`]: schedules, catch-up
//!   and the jobs in the store (the core the daemon's scheduler stands on; no timer in it).
//! - [`session`]: one actor per conversation. [`bus`]: routes inbound messages to sessions.
//! - [`ingress`]: listeners, the ingress pump, access rules and pairing. [`subagent`]: the
//!   subagent supervisor and the `subagents` tool.
//! - [`daemon`]: the composition root: builds everything from the config, recovery, reloads,
//!   shutdown order. [`admin`]: the control plane behind the HTTP API. [`cli`]: the `weft`
//!   subcommands.

pub mod admin;
pub mod approval;
pub mod browser;
pub mod bus;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod egress;
pub mod ingress;
pub mod llm;
pub mod mcp;
pub mod media;
pub mod memory;
pub mod metrics;
pub mod net;
pub mod notify;
pub mod scheduler;
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
