//! `memory.*` settings: the file's shape and the checked values. The config layer aggregates
//! them; this module never imports it.

use serde::{Deserialize, Serialize};

/// Whose memory a chat user works with.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Each chat user has their own `USER.md` and memory documents in
    /// `~/.clawft/users/<channel>-<user>/`, read with a fallback to the agent's files, closed to
    /// the generic file tools and to commands. The terminal, the control token and the
    /// gateway's own messages use the agent's memory.
    #[default]
    User,
    /// One memory shared by everyone the agent talks to.
    Agent,
}

impl Scope {
    /// `user` or `agent`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::User => "user",
            Scope::Agent => "agent",
        }
    }
}

/// `memory` in the config file.
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryFile {
    /// `user` (default): memory per chat user; `agent`: one shared memory.
    pub scope: Option<Scope>,
    /// Let `memory_search` also search the user's own past conversations (default false).
    pub search_transcripts: Option<bool>,
    /// An OpenAI-compatible `/embeddings` endpoint: hybrid (keyword + vector) search.
    pub embeddings: Option<super::embed::EmbeddingSettings>,
}

/// The checked `memory` settings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemorySettings {
    /// Whose memory a chat user works with.
    pub scope: Scope,
    /// Whether `memory_search` also searches the caller's past conversations.
    pub search_transcripts: bool,
    /// The embeddings endpoint, when hybrid search is on.
    pub embeddings: Option<super::embed::EmbeddingSettings>,
    /// Its API key (from `memory.embeddings.api_key_env`, read by the config layer).
    pub embeddings_key: Option<crate::types::Secret>,
}

impl MemoryFile {
    /// The checked settings.
    ///
    /// # Errors
    /// A value out of range, naming its key.
    pub fn resolve(&self) -> Result<MemorySettings, crate::types::SettingError> {
        if let Some(e) = &self.embeddings {
            e.check()
                .map_err(|d| crate::types::SettingError::new("memory.embeddings", d))?;
        }
        Ok(MemorySettings {
            scope: self.scope.unwrap_or_default(),
            search_transcripts: self.search_transcripts.unwrap_or(false),
            embeddings: self.embeddings.clone(),
            embeddings_key: None,
        })
    }
}
