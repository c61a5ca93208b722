//! ① Ingress: turns an adapter's inbound deliveries into journaled, deduplicated, sanitised
//! messages for the bus: the channel's `listen` loop and the pump ([`pump`]), and who may talk
//! on each channel ([`access`]: allowlists and pairing).
//!
//! Ingress decides nothing about conversations; it never awaits the LLM.

pub mod access;
pub mod pump;
