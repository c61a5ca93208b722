//! `weft sessions list|show|clear`.

use super::agent::{backend, Backend};
use super::{CliError, SessionsAction};
use crate::admin::{session_json, sessions_json};
use crate::config::Config;
use crate::types::SessionKey;

fn encode(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Run one sessions action, printing text (JSON with `--json`).
///
/// # Errors
/// Invalid key, unknown session, or no access to gateway or store.
pub async fn run(config: &Config, action: SessionsAction) -> Result<(), CliError> {
    if let SessionsAction::Show { key, .. } | SessionsAction::Clear { key, .. } = &action {
        SessionKey::parse(key).map_err(CliError::msg)?;
    }
    let (as_json, render): (bool, fn(&serde_json::Value) -> String) = match &action {
        SessionsAction::List { json } => (*json, super::human::sessions),
        SessionsAction::Show { json, .. } => (*json, super::human::session),
        SessionsAction::Clear { json, .. } => (*json, |v| {
            if v["cleared"] == serde_json::Value::Bool(true) {
                "cleared: the transcript is deleted\n".to_string()
            } else {
                "nothing to clear: no such session\n".to_string()
            }
        }),
    };
    let b = backend(config).await?;
    let v = match (&b, action) {
        (Backend::Gateway(c), SessionsAction::List { .. }) => c.get("/v1/sessions").await?,
        (Backend::Store(s), SessionsAction::List { .. }) => {
            sessions_json(s).map_err(CliError::msg)?
        }
        (Backend::Gateway(c), SessionsAction::Show { key, .. }) => c
            .get_opt(&format!("/v1/sessions/{}", encode(&key)))
            .await?
            .ok_or_else(|| CliError::Failed(format!("no session `{key}`")))?,
        (Backend::Store(s), SessionsAction::Show { key, .. }) => {
            session_json(s, &key, &crate::admin::sessions::windows_of(config))
                .map_err(CliError::msg)?
                .ok_or_else(|| CliError::Failed(format!("no session `{key}`")))?
        }
        (Backend::Gateway(c), SessionsAction::Clear { key, .. }) => {
            c.delete(&format!("/v1/sessions/{}", encode(&key))).await?
        }
        (Backend::Store(s), SessionsAction::Clear { key, .. }) => {
            let k = SessionKey::parse(&key).map_err(CliError::msg)?;
            serde_json::json!({ "cleared": s.clear_session(&k).map_err(CliError::msg)? })
        }
    };
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(CliError::msg)?
        );
    } else {
        print!("{}", render(&v));
    }
    Ok(())
}
