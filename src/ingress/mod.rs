//! ① Ingress: turns an adapter's [`InboundEvent`] into a journaled, deduplicated, sanitised
//! message for the bus. Owns the one [`SessionKey`] encoder.
//!
//! Ingress decides nothing about conversations; it never awaits the LLM.

pub mod access;
