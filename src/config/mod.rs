//! ⓪ Configuration: reads the file (JSON or TOML) and `CLAWFT_…` overrides through the `config`
//! crate, resolves secrets by `*_env`/`*_file` indirection, validates, and returns [`Config`].
//!
//! This is the only module that reads the process environment; everything else receives typed
//! sub-configs.

//!
//! Files: [`types`] (the resolved [`Config`] and [`ConfigError`]), [`env`] (the environment
//! snapshot), [`resolve`] (file + environment → `Config`), [`secrets`] (secrets by indirection),
//! [`file`] (the raw file shape), [`subagents`] (the subagent limits), [`usage`] (prices and budgets),
//! [`provenance`] (where each value came from).

pub mod agents;
pub mod email;
pub mod env;
pub mod file;
pub mod hooks;
pub mod media;
pub mod provenance;
pub mod resolve;
pub mod secrets;
pub mod show;
pub mod subagents;
pub mod types;
pub mod usage;

pub use env::*;
pub use resolve::*;
pub use types::*;

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "accounts_tests.rs"]
mod accounts_tests;
