//! The one integration-test binary: drives the daemon through its public seams (the HTTP API,
//! the `weft` binary) against an OpenAI-compatible fake LLM on 127.0.0.1.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod access;
mod accounts;
mod agents;
mod browser;
mod cli_output;
mod cli_polish;
#[cfg(feature = "cluster")]
mod cluster;
#[cfg(feature = "cluster")]
mod cluster_access;
#[cfg(feature = "cluster")]
mod cluster_balance;
#[cfg(feature = "cluster")]
mod cluster_bus;
#[cfg(feature = "cluster")]
mod cluster_docs;
#[cfg(feature = "cluster")]
mod cluster_state;
mod common;
mod context_files;
mod control;
#[cfg(feature = "ui")]
mod control_ui;
#[cfg(feature = "ui")]
mod control_ui_config;
#[cfg(feature = "ui")]
mod control_ui_pages;
mod conversation;
mod cron_ops;
mod custom_tools;
mod delivery;
#[cfg(feature = "email")]
mod email;
mod exec_jail;
mod fake_llm;
mod first_hour;
mod gateway;
mod inputs;
mod layering;
mod lean;
mod local_models;
#[cfg(feature = "matrix")]
mod matrix;
mod mcp;
mod media;
mod memory;
mod memory_embed;
#[cfg(not(feature = "ui"))]
mod no_ui;
mod nodes;
mod openai_api;
mod operators;
mod platform_limits;
mod platforms;
mod process;
mod process_tool;
mod scheduler;
mod scrubbing;
mod service;
mod session_tools;
mod signal;
mod slow_store;
mod store_crash;
mod store_faults;
mod subagents;
mod tools;
#[cfg(feature = "ui")]
mod ui_sessions;
mod usage;
mod voice;
mod webhooks;
#[cfg(feature = "whatsapp")]
mod whatsapp;
mod window;
