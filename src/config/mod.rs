//! ⓪ Configuration: reads the file (JSON or TOML) and `CLAWFT_…` overrides through the `config`
//! crate, resolves secrets by `*_env`/`*_file` indirection, validates, and returns [`Config`].
//!
//! This is the only module that reads the process environment; everything else receives typed
//! sub-configs. The chat platforms' own settings are their crates' (through the platform
//! contract); this module registers them and resolves their secrets.

//!
//! Files, from the bottom up (a file uses only files above it in this list): [`env`] (the
//! environment snapshot, the state directory, the `CLAWFT_…` overrides), [`error`]
//! ([`ConfigError`]), [`subagents`] (the subagent limits), [`usage`] (prices and budgets),
//! [`provenance`] (where each value came from), [`secrets`] (secrets by indirection),
//! [`hooks`], [`media`], [`channels`] (the chat platforms and their shared keys), [`file`]
//! (the raw file shape), [`types`] (the resolved sections), [`agents`] (named agents and
//! bindings), [`providers`] (one agent section: behaviour, providers, prompt window), [`loaded`] (the resolved [`Config`]), [`show`] (what `weft config show`
//! prints), [`resolve`] (file + environment → `Config`).

pub mod agents;
pub mod channels;
pub mod env;
pub mod error;
pub mod file;
pub mod hooks;
pub mod loaded;
pub mod media;
pub mod provenance;
pub mod providers;
pub mod resolve;
pub mod secrets;
pub mod show;
pub mod subagents;
pub mod types;
pub mod usage;

pub use channels::{
    check_account_name, split_channel_id, ChannelSettings, ChatChannelConfig, DEFAULT_ACCOUNT,
    DEFAULT_MAX_CHATS_IN_FLIGHT,
};
pub use env::*;
pub use error::*;
pub use loaded::*;
pub use resolve::*;
pub use types::*;

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "accounts_tests.rs"]
mod accounts_tests;
