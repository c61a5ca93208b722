//! Leaf types shared by every layer: ids ([`SessionKey`]), [`Secret`], [`SettingError`], text
//! sanitising, credential scrubbing ([`scrub::Scrubber`]). This module imports nothing from the
//! crate (see `docs/architecture.md`, layer 0).

pub mod private;
pub mod private_dir;
pub mod scrub;
pub mod secret;
pub mod session_key;
pub mod setting;
pub mod sniff;
pub mod text;
pub mod tz;
pub mod voice;

/// Std locks taken whether or not poisoned (defined with the channel contract, shared here).
pub use clawft_channel_core::lock::{MutexExt, RwLockExt};
pub use secret::Secret;
pub use session_key::{InvalidSessionKey, SenderId, SessionKey, MAX_SESSION_KEY_BYTES};
pub use setting::SettingError;
pub use text::{sanitize_content, sanitize_output};
pub use voice::VoiceReplies;

/// What kind of JSON value `v` is, as an error message names it ("a string", "an array"...).
pub fn json_type_name(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
