//! Who may talk to the bot on each chat platform: deny by default.
//!
//! A channel is `Open` (the HTTP API behind its bind address and token, the terminal) or
//! `Restricted`: only senders whose platform user id is in `allow_from` (ids, never usernames,
//! which can change hands), plus senders the operator paired. An empty list admits nobody.
//!
//! Pairing (optional, `channels.NAME.pairing = true`): an unknown sender gets a one-time code in
//! their chat; the operator runs `weft pairing approve CODE`, which admits that sender id on that
//! channel from then on. Codes expire after an hour; one code per sender at a time, so a stranger
//! cannot make the bot spam; the code is random (from the OS generator).
//!
//! In cluster mode pairing is a piece of shared state ([`SharedAccess`], bucket
//! [`ACCESS_BUCKET`]) given to [`Access::with_shared`]; the local store keeps a copy of it, so a
//! check never waits on NATS.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use clawft_channel_core::{InboundEvent, Surface};
use serde::{Deserialize, Serialize};

use crate::store::shared::{self, Bucket, Payload, Replicated, Shared, SharedError, Watched};
use crate::store::{Store, StoreError};

/// Store namespace of admitted (paired) senders: key `channel:user`.
pub const PAIRED: &str = "paired";
/// Store namespace of pending codes: key = code.
pub const PENDING: &str = "pairing";
/// How long a code stays valid.
const CODE_TTL_MS: u64 = 3_600_000;

/// Access rule of one channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessRule {
    /// Everyone who can reach the channel (HTTP API, terminal).
    Open,
    /// Only these ids (and paired senders).
    Restricted {
        /// Admitted platform user ids.
        allow_from: BTreeSet<String>,
        /// Whether unknown senders get a pairing code.
        pairing: bool,
    },
}

/// What ingress does with a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Process it.
    Allowed,
    /// Refuse it; reply with this text in the sender's chat, if any.
    Denied {
        /// What to tell the sender (a pairing code), when something should be said.
        reply: Option<String>,
    },
}

/// A pending pairing request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// The code.
    #[serde(default)]
    pub code: String,
    /// Channel id.
    pub channel: String,
    /// Sender's platform user id.
    pub user: String,
    /// Chat where the code was sent.
    pub chat: String,
    /// When it was made.
    pub created_ms: u64,
}

/// The terminal's chat id and the agent it names: `SESSION@AGENT` (`weft agent --agent`).
pub fn terminal_chat(chat: &str) -> (&str, Option<&str>) {
    match chat.rsplit_once('@') {
        Some((c, a)) if !c.is_empty() && !a.is_empty() => (c, Some(a)),
        _ => (chat, None),
    }
}

/// The bucket of pairing (no expiry), authoritative in cluster mode: `pending.<code>` → a
/// pending request ([`Pending`]) and `paired.<channel>.<user>` → an admitted sender (when, in
/// ms).
pub const ACCESS_BUCKET: Bucket = Bucket {
    name: "weft_access",
    max_age: std::time::Duration::ZERO,
    description: "weft pairing",
    wait: std::time::Duration::from_secs(3),
};

impl Payload for Pending {}

/// Pairing shared with other gateways (cluster mode): authoritative for codes and paired
/// senders. Each gateway keeps its local store's pairing namespaces a copy of it
/// ([`SharedAccess::mirror`]), so the check of each message reads the local store and never
/// waits on NATS. Cheap to clone.
#[derive(Clone)]
pub struct SharedAccess {
    pending: Shared<Pending>,
    paired: Shared<u64>,
}

impl std::fmt::Debug for SharedAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedAccess")
    }
}

/// The key parts of paired sender `who` (`channel:user`).
fn sender_parts(who: &str) -> [&str; 2] {
    let (channel, user) = who.split_once(':').unwrap_or((who, ""));
    [channel, user]
}

impl SharedAccess {
    /// Pairing kept through `seam`.
    pub fn new(seam: Arc<dyn Replicated>) -> Self {
        Self {
            pending: Shared::new(seam.clone(), ACCESS_BUCKET, "pending"),
            paired: Shared::new(seam, ACCESS_BUCKET, "paired"),
        }
    }

    /// Publish code `code` issued (`Some`, its record) or dropped as expired (`None`), in the
    /// background.
    pub fn publish_pending(&self, code: &str, record: Option<&Pending>) {
        let (pending, code, record) = (self.pending.clone(), code.to_string(), record.cloned());
        shared::in_background("pairing code", move || {
            let (pending, code, record) = (pending.clone(), code.clone(), record.clone());
            async move {
                match &record {
                    Some(r) => pending.put(&[&code], r).await.map(drop),
                    None => pending.delete(&[&code]).await,
                }
            }
        });
    }

    /// The refusal of a pairing change the cluster did not take.
    fn refused(what: &str, e: &SharedError) -> SharedError {
        SharedError::new(
            e.kind(),
            format!("{what} refused: {e} (pairing changes need the cluster; nothing was changed)"),
        )
    }

    /// Admit `who` (`channel:user`, paired at `at_ms`) and drop code `code`, in the cluster.
    /// Blocking: call it off the runtime.
    ///
    /// # Errors
    /// The cluster did not take it (then nothing was admitted).
    pub fn approve(&self, code: &str, who: &str, at_ms: u64) -> Result<(), SharedError> {
        shared::wait(async {
            self.paired.put(&sender_parts(who), &at_ms).await?;
            // Admitted from here; a code left behind (NATS lost just now) admits the same
            // sender again, and expires.
            if let Err(e) = self.pending.delete(&[code]).await {
                tracing::warn!(error = %e, "cluster: approved pairing code not dropped");
            }
            Ok(())
        })
        .map_err(|e| Self::refused("pairing approval", &e))
    }

    /// Remove paired sender `who` (`channel:user`) in the cluster. Blocking: call it off the
    /// runtime.
    ///
    /// # Errors
    /// The cluster did not take it (then nothing was removed).
    pub fn revoke(&self, who: &str) -> Result<(), SharedError> {
        shared::wait(self.paired.delete(&sender_parts(who)))
            .map_err(|e| Self::refused("pairing revocation", &e))
    }

    /// Keep the local store's pairing namespaces ([`PENDING`], [`PAIRED`]) a copy of the
    /// cluster's records, from now on (spawned on the current runtime).
    pub fn mirror(&self, store: &Store) {
        tokio::spawn(mirror_into(
            self.pending.watch(),
            store.clone(),
            PENDING,
            |c| serde_json::to_string(c).ok(),
        ));
        tokio::spawn(mirror_into(
            self.paired.watch(),
            store.clone(),
            PAIRED,
            |at| Some(at.to_string()),
        ));
    }
}

/// Write every record `watch` sees into namespace `ns` of `store` (its key parts joined with
/// `:`, its value as `text` makes it), made durable with the next flush.
async fn mirror_into<V: Payload>(
    mut watch: shared::Watch<V>,
    store: Store,
    ns: &'static str,
    text: fn(&V) -> Option<String>,
) {
    while let Some(w) = watch.next().await {
        let (key, value) = match w {
            Watched::Started => continue,
            Watched::Put { key, value, .. } => (key, text(&value)),
            Watched::Removed { key, .. } => (key, None),
        };
        let key = key.join(":");
        if let Err(e) = store.state_put_unflushed(ns, &key, value.as_deref()) {
            tracing::error!(error = %e, key, "cluster: pairing record not mirrored in the store");
            continue;
        }
        if let Err(e) = store.flush_ticket().await {
            tracing::error!(error = %e, key, "cluster: pairing record mirrored but not flushed");
        }
    }
}

/// Access rules of every channel, with the store for pairing.
#[derive(Clone, Debug, Default)]
pub struct Access {
    rules: HashMap<String, AccessRule>,
    per_user: std::collections::HashSet<String>,
    bindings: crate::config::agents::Bindings,
    shared: Option<SharedAccess>,
}

fn code() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    uuid::Uuid::new_v4()
        .as_bytes()
        .iter()
        .take(8)
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect()
}

impl Access {
    /// Rules by channel id; channels not listed are `Open`.
    pub fn new(rules: HashMap<String, AccessRule>) -> Self {
        Self {
            rules,
            per_user: std::collections::HashSet::new(),
            bindings: crate::config::agents::Bindings::default(),
            shared: None,
        }
    }

    /// Pairing shared with other gateways through `shared` (cluster mode).
    #[must_use]
    pub fn with_shared(mut self, shared: Option<SharedAccess>) -> Self {
        self.shared = shared;
        self
    }

    /// Which agent serves which messages (`[[bindings]]`).
    pub fn with_bindings(mut self, bindings: crate::config::agents::Bindings) -> Self {
        self.bindings = bindings;
        self
    }

    /// Channels whose chats hold one session per sender (`group_sessions = "user"`).
    pub fn with_per_user(mut self, channels: impl IntoIterator<Item = String>) -> Self {
        self.per_user = channels.into_iter().collect();
        self
    }

    /// The session `ev` belongs to: its conversation (chat, thread, and sender where the
    /// channel isolates users), served by the agent the bindings choose.
    ///
    /// # Errors
    /// An id that cannot form a session key.
    pub fn session_key(
        &self,
        ev: &InboundEvent,
    ) -> Result<crate::types::SessionKey, crate::types::InvalidSessionKey> {
        use crate::types::SessionKey;
        // The terminal (in process, or the local CLI through the HTTP API with the control
        // token, checked by the channel): its own session, the one `weft agent` uses without
        // a gateway. `weft agent --agent NAME` names the agent as `SESSION@NAME`.
        let surface = ev.channel.surface();
        let terminal = surface == Some(Surface::Terminal)
            || (surface == Some(Surface::Http)
                && ev.sender.as_str() == clawft_channel_http::TERMINAL_SENDER);
        if terminal {
            let (chat, agent) = terminal_chat(ev.chat.as_str());
            let key = SessionKey::from_parts(&[Surface::Terminal.id(), chat])?;
            let agent = agent.unwrap_or_else(|| self.agent_for(ev, Surface::Terminal.id()));
            return key.with_agent(agent);
        }
        // `POST /v1/chat/completions` (only callers holding the API's token reach it): chat
        // `SESSION@AGENT` with the agent its `model` named, filed under `http:SESSION`, the
        // session `/v1/chat` uses for that chat id, served by that agent.
        if surface == Some(Surface::Http)
            && ev.sender.as_str() == clawft_channel_http::OPENAI_SENDER
        {
            let (chat, agent) = terminal_chat(ev.chat.as_str());
            let key = SessionKey::from_parts(&[Surface::Http.id(), chat])?;
            return key.with_agent(agent.unwrap_or(crate::types::session_key::DEFAULT_AGENT));
        }
        // The control UI's web chat (only operators reach it): chat `CHAT@AGENT` names the
        // agent the operator chose, its session `@AGENT:web:CHAT@AGENT` (the chat id whole,
        // so replies, reminders and the canvas of each agent's chat stay apart).
        #[cfg(feature = "ui")]
        if ev.channel.as_str() == clawft_channel_http::ui::WEB_CHANNEL {
            if let (_, Some(agent)) = terminal_chat(ev.chat.as_str()) {
                return SessionKey::derive(ev)?.with_agent(agent);
            }
        }
        let key = if self.per_user.contains(ev.channel.as_str()) {
            SessionKey::derive_per_user(ev)?
        } else {
            SessionKey::derive(ev)?
        };
        key.with_agent(self.agent_for(ev, ev.channel.as_str()))
    }

    fn agent_for(&self, ev: &InboundEvent, channel_id: &str) -> &str {
        self.bindings.agent_for(&crate::config::agents::Route {
            channel_id,
            chat: ev.chat.as_str(),
            user: ev.sender.as_str(),
            thread: ev
                .thread
                .as_ref()
                .map(clawft_channel_core::ThreadId::as_str),
        })
    }

    /// The rule of `channel`.
    pub fn rule(&self, channel: &str) -> &AccessRule {
        self.rules.get(channel).unwrap_or(&AccessRule::Open)
    }

    /// Decide on `ev`, creating a pairing code when the channel pairs unknown senders.
    ///
    /// # Errors
    /// Store failure (the message is then refused).
    pub fn check(
        &self,
        store: &Store,
        ev: &InboundEvent,
        now_ms: u64,
    ) -> Result<Verdict, StoreError> {
        let (allow_from, pairing) = match self.rule(ev.channel.as_str()) {
            AccessRule::Open => return Ok(Verdict::Allowed),
            AccessRule::Restricted {
                allow_from,
                pairing,
            } => (allow_from, *pairing),
        };
        let user = ev.sender.as_str();
        let who = crate::types::SenderId::of(ev);
        if allow_from.contains(user) || store.state_get(PAIRED, who.as_str())?.is_some() {
            return Ok(Verdict::Allowed);
        }
        if !pairing {
            return Ok(Verdict::Denied { reply: None });
        }
        // One live code per sender: no reply (no spam) while it is valid.
        for (c, v) in store.state_scan(PENDING)? {
            let Ok(p) = serde_json::from_str::<Pending>(&v) else {
                continue;
            };
            if now_ms.saturating_sub(p.created_ms) > CODE_TTL_MS {
                // Durable with the next flush (the pump's, or the notice's below).
                store.state_put_unflushed(PENDING, &c, None)?;
                if let Some(sh) = &self.shared {
                    sh.publish_pending(&c, None);
                }
            } else if p.channel == ev.channel.as_str() && p.user == user {
                return Ok(Verdict::Denied { reply: None });
            }
        }
        let c = code();
        let p = Pending {
            code: c.clone(),
            channel: ev.channel.to_string(),
            user: user.to_string(),
            chat: ev.chat.to_string(),
            created_ms: now_ms,
        };
        let text = serde_json::to_string(&p).map_err(|e| StoreError::Backend(e.to_string()))?;
        // Not flushed here (the ingress pump runs on the runtime): the pairing reply is routed
        // only once a flush taken after this write is done, so a code nobody saw may be lost
        // in a crash, never a code that was shown.
        store.state_put_unflushed(PENDING, &c, Some(&text))?;
        if let Some(sh) = &self.shared {
            sh.publish_pending(&c, Some(&p));
        }
        tracing::info!(channel = %ev.channel, user, code = %c, "pairing code issued");
        Ok(Verdict::Denied {
            reply: Some(format!(
                "I don't know you yet. Your pairing code is {c}. Ask the operator of this bot to run `weft pairing approve {c}` (valid for one hour)."
            )),
        })
    }
}

/// Whether `user` on `channel` was admitted with a pairing code (`weft pairing approve`).
/// A store failure reads as not paired.
pub fn is_paired(store: &Store, channel: &str, user: &str) -> bool {
    let who = crate::types::SenderId::new(channel, user);
    matches!(store.state_get(PAIRED, who.as_str()), Ok(Some(_)))
}

/// Pending pairing requests.
///
/// # Errors
/// Store failure.
pub fn pending(store: &Store) -> Result<Vec<Pending>, StoreError> {
    Ok(store
        .state_scan(PENDING)?
        .into_iter()
        .filter_map(|(c, v)| {
            serde_json::from_str::<Pending>(&v).ok().map(|mut p| {
                p.code = c;
                p
            })
        })
        .collect())
}

/// Why a pairing code could not be approved.
#[derive(Debug, thiserror::Error)]
pub enum PairingError {
    /// No pending request has this code, or it expired (the code, normalised).
    #[error("no pending pairing code {0} (codes expire after an hour)")]
    UnknownCode(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The cluster's records could not be written (nothing changed).
    #[error("{0}")]
    Shared(SharedError),
}

/// Admit the sender of pending code `code` (in the cluster first, when `shared`). Returns
/// `channel:user`.
///
/// # Errors
/// Unknown or expired code, the cluster could not be written, or store failure.
pub fn approve(
    store: &Store,
    shared: Option<&SharedAccess>,
    code: &str,
    now_ms: u64,
) -> Result<String, PairingError> {
    let code = code.trim().to_uppercase();
    let Some(p) = store
        .state_get(PENDING, &code)?
        .and_then(|v| serde_json::from_str::<Pending>(&v).ok())
        .filter(|p| now_ms.saturating_sub(p.created_ms) <= CODE_TTL_MS)
    else {
        return Err(PairingError::UnknownCode(code));
    };
    let who = crate::types::SenderId::new(&p.channel, &p.user);
    if let Some(sh) = shared {
        sh.approve(&code, who.as_str(), now_ms)
            .map_err(PairingError::Shared)?;
    }
    store
        .state_put(PAIRED, who.as_str(), Some(&now_ms.to_string()))
        .and_then(|()| store.state_put(PENDING, &code, None))?;
    Ok(who.into())
}

/// Paired senders, as `channel:user`.
///
/// # Errors
/// Store failure.
pub fn paired(store: &Store) -> Result<Vec<String>, StoreError> {
    Ok(store
        .state_scan(PAIRED)?
        .into_iter()
        .map(|(k, _)| k)
        .collect())
}

/// Remove a paired sender (`channel:user`; in the cluster first, when `shared`). Whether it
/// was paired.
///
/// # Errors
/// The cluster could not be written, or store failure.
pub fn revoke(
    store: &Store,
    shared: Option<&SharedAccess>,
    who: &str,
) -> Result<bool, PairingError> {
    let was = store.state_get(PAIRED, who)?.is_some();
    if let Some(sh) = shared {
        sh.revoke(who).map_err(PairingError::Shared)?;
    }
    store.state_put(PAIRED, who, None)?;
    Ok(was)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use clawft_channel_core::{ChannelId, ChatId, PlatformEventId, UserId};

    use super::*;

    fn ev(channel: &str, user: &str) -> InboundEvent {
        InboundEvent {
            channel: ChannelId::new(channel),
            chat: ChatId::new("c1"),
            thread: None,
            sender: UserId::new(user),
            sender_name: None,
            event_id: PlatformEventId::new("e1"),
            content: "hi".into(),
            received_at_ms: 0,
            attachments: Vec::new(),
            origin: clawft_channel_core::Origin::User,
        }
    }

    #[test]
    fn deny_by_default_allowlist_and_pairing() {
        let store = Store::memory();
        let mut rules = HashMap::new();
        rules.insert(
            "telegram".to_string(),
            AccessRule::Restricted {
                allow_from: ["42".to_string()].into(),
                pairing: true,
            },
        );
        rules.insert(
            "slack".to_string(),
            AccessRule::Restricted {
                allow_from: BTreeSet::new(),
                pairing: false,
            },
        );
        let a = Access::new(rules);
        assert_eq!(
            a.check(&store, &ev("http", "x"), 0).unwrap(),
            Verdict::Allowed
        );
        assert_eq!(
            a.check(&store, &ev("telegram", "42"), 0).unwrap(),
            Verdict::Allowed
        );
        // An empty list admits nobody, and without pairing nothing is said.
        assert_eq!(
            a.check(&store, &ev("slack", "42"), 0).unwrap(),
            Verdict::Denied { reply: None }
        );
        // A stranger gets one code, then silence.
        let Verdict::Denied { reply: Some(text) } =
            a.check(&store, &ev("telegram", "7"), 10).unwrap()
        else {
            panic!("no code");
        };
        assert_eq!(
            a.check(&store, &ev("telegram", "7"), 20).unwrap(),
            Verdict::Denied { reply: None }
        );
        let p = pending(&store).unwrap();
        assert_eq!(p.len(), 1);
        assert!(text.contains(&p[0].code));
        // A wrong code does nothing; the right one admits exactly that sender on that channel.
        assert!(approve(&store, None, "NOPE1234", 30).is_err());
        assert_eq!(
            approve(&store, None, &p[0].code.to_lowercase(), 30).unwrap(),
            "telegram:7"
        );
        assert_eq!(
            a.check(&store, &ev("telegram", "7"), 40).unwrap(),
            Verdict::Allowed
        );
        assert_ne!(
            a.check(&store, &ev("slack", "7"), 40).unwrap(),
            Verdict::Allowed
        );
        assert!(pending(&store).unwrap().is_empty());
        assert_eq!(paired(&store).unwrap(), ["telegram:7"]);
        assert!(revoke(&store, None, "telegram:7").unwrap());
        assert_ne!(
            a.check(&store, &ev("telegram", "7"), 50).unwrap(),
            Verdict::Allowed
        );
    }

    #[test]
    fn codes_expire() {
        let store = Store::memory();
        let a = Access::new(HashMap::from([(
            "telegram".to_string(),
            AccessRule::Restricted {
                allow_from: BTreeSet::new(),
                pairing: true,
            },
        )]));
        a.check(&store, &ev("telegram", "7"), 0).unwrap();
        let code = pending(&store).unwrap()[0].code.clone();
        assert!(approve(&store, None, &code, CODE_TTL_MS + 1).is_err());
        // After expiry a new code is issued.
        let v = a
            .check(&store, &ev("telegram", "7"), CODE_TTL_MS + 2)
            .unwrap();
        assert!(matches!(v, Verdict::Denied { reply: Some(_) }));
    }
}
