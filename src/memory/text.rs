//! Text analysis for memory search: terms and chunks.
