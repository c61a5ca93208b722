//! The Bot API calls the adapter makes, sent through teloxide-core's [`Bot`] (transport, API
//! base URL, token redaction, error parsing) with our own minimal payloads.
//!
//! Own payloads instead of teloxide's typed ones: their outputs are deliberately small
//! (`getMe` and `getUpdates` return raw JSON, `sendMessage` only the `message_id`), so a field
//! Telegram (or an older local `telegram-bot-api`) adds, drops or changes can never make a call
//! that succeeded look failed: a sent message reported as failed would be sent twice by the
//! outbox, and an update that does not parse would block the offset.

use std::time::Duration;

use clawft_channel_core::ChannelError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use teloxide_core::requests::{JsonRequest, Payload};
use teloxide_core::types::{ChatId, Seconds};
use teloxide_core::{ApiError, Bot, RequestError};

use crate::ids::{Chat, MessageId, Topic, UpdateId};

/// Timeout of every call but `getUpdates`.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How much longer than its long-poll `timeout` a `getUpdates` may take before the watchdog
/// declares the connection dead: the timeout itself, between 1 and 10 s.
pub(crate) fn poll_grace(timeout: Duration) -> Duration {
    timeout.clamp(Duration::from_secs(1), Duration::from_secs(10))
}

#[derive(Debug, Serialize)]
pub(crate) struct GetMe {}

impl Payload for GetMe {
    type Output = Value;
    const NAME: &'static str = "getMe";
}

#[derive(Debug, Serialize)]
pub(crate) struct GetUpdates {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<UpdateId>,
    pub timeout: u64,
    pub allowed_updates: Vec<&'static str>,
}

impl Payload for GetUpdates {
    type Output = Vec<Value>;
    const NAME: &'static str = "getUpdates";
}

#[derive(Debug, Serialize)]
pub(crate) struct ReplyParameters {
    pub message_id: MessageId,
    pub allow_sending_without_reply: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct SendMessage {
    pub chat_id: Chat,
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parse_mode: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_thread_id: Option<Topic>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_parameters: Option<ReplyParameters>,
}

/// The part of a sent `Message` we need.
#[derive(Debug, Deserialize)]
pub(crate) struct SentMessage {
    pub message_id: MessageId,
}

impl Payload for SendMessage {
    type Output = SentMessage;
    const NAME: &'static str = "sendMessage";
}

#[derive(Debug, Serialize)]
pub(crate) struct EditMessageText {
    pub chat_id: Chat,
    pub message_id: MessageId,
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parse_mode: Option<&'static str>,
}

impl Payload for EditMessageText {
    type Output = Value;
    const NAME: &'static str = "editMessageText";
}

#[derive(Debug, Serialize)]
pub(crate) struct SendChatAction {
    pub chat_id: Chat,
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_thread_id: Option<Topic>,
}

impl Payload for SendChatAction {
    type Output = Value;
    const NAME: &'static str = "sendChatAction";
}

#[derive(Debug, Serialize)]
pub(crate) struct GetFile {
    pub file_id: String,
}

impl Payload for GetFile {
    type Output = Value;
    const NAME: &'static str = "getFile";
}

/// The envelope of a Bot API answer, for the calls made outside teloxide (uploads). Plain
/// strings and numbers: teloxide's `ApiError` parser is large, and the classification reads
/// the description anyway.
#[derive(Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error_code: Option<u16>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Parameters>,
}

#[derive(Deserialize)]
struct Parameters {
    #[serde(default)]
    retry_after: Option<u32>,
    #[serde(default)]
    migrate_to_chat_id: Option<i64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct DeleteWebhook {
    pub drop_pending_updates: bool,
}

impl Payload for DeleteWebhook {
    type Output = Value;
    const NAME: &'static str = "deleteWebhook";
}

/// A Bot API answer's `result`, or its error as teloxide would report it.
fn parse_answer(text: &str) -> Result<Value, CallError> {
    let invalid = |source: serde_json::Error| {
        CallError::Request(RequestError::InvalidJson {
            source: std::sync::Arc::new(source),
            raw: text.chars().take(500).collect::<String>().into_boxed_str(),
        })
    };
    let a: Answer = serde_json::from_str(text).map_err(invalid)?;
    if a.ok {
        return Ok(a.result.unwrap_or(Value::Null));
    }
    let params = a.parameters.unwrap_or(Parameters {
        retry_after: None,
        migrate_to_chat_id: None,
    });
    Err(CallError::Request(
        match (params.retry_after, params.migrate_to_chat_id, a.error_code) {
            (Some(s), _, _) => RequestError::RetryAfter(Seconds::from_seconds(s)),
            (None, Some(c), _) => RequestError::MigrateToChatId(ChatId(c)),
            (None, None, Some(401)) => RequestError::Api(ApiError::InvalidToken),
            (None, None, _) => RequestError::Api(ApiError::Unknown(
                a.description
                    .unwrap_or_else(|| "error without a description".into()),
            )),
        },
    ))
}

/// Who the bot is (from `getMe`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Me {
    pub id: i64,
    pub username: String,
}

/// Why a call failed, before classification.
#[derive(Debug)]
pub(crate) enum CallError {
    Request(RequestError),
    /// No answer within the call's deadline.
    Timeout(Duration),
    /// HTTP 413: the upload is over the server's limit.
    TooLarge,
}

impl CallError {
    fn api(&self) -> Option<&ApiError> {
        match self {
            CallError::Request(RequestError::Api(e)) => Some(e),
            _ => None,
        }
    }

    /// Telegram's description of an API error.
    fn description(&self) -> Option<String> {
        self.api().map(|e| match e {
            ApiError::Unknown(s) => s.clone(),
            e => e.to_string(),
        })
    }

    /// 400 "can't parse entities": the HTML was refused; resend as plain text.
    pub fn is_parse_entities(&self) -> bool {
        matches!(self.api(), Some(ApiError::CantParseEntities(_)))
            || self
                .description()
                .is_some_and(|d| d.contains("can't parse entities"))
    }

    /// 400 "message is not modified": an edit to the same text; harmless.
    pub fn is_not_modified(&self) -> bool {
        matches!(self.api(), Some(ApiError::MessageNotModified))
            || self
                .description()
                .is_some_and(|d| d.contains("message is not modified"))
    }

    /// The message to edit is gone (deleted by the user) or too old to edit.
    pub fn is_edit_target_gone(&self) -> bool {
        matches!(
            self.api(),
            Some(ApiError::MessageToEditNotFound | ApiError::MessageCantBeEdited)
        ) || self.description().is_some_and(|d| {
            d.contains("message to edit not found") || d.contains("message can't be edited")
        })
    }

    /// `getUpdates` refused because a webhook is set.
    pub fn is_webhook_active(&self) -> bool {
        matches!(self.api(), Some(ApiError::CantGetUpdates))
            || self
                .description()
                .is_some_and(|d| d.contains("webhook is active"))
    }

    /// Classify for the outbox: 429 → RateLimited, 401 → Auth, 400/403 → Rejected, the rest
    /// (5xx, network, unparseable answers, timeouts) → Transient. Never contains the token.
    pub fn classify(&self, token: &str) -> ChannelError {
        let e = match self {
            CallError::Timeout(d) => {
                ChannelError::Transient(format!("no answer from Telegram within {}s", d.as_secs()))
            }
            CallError::TooLarge => {
                ChannelError::Rejected("Telegram refused the upload as too large (413)".into())
            }
            CallError::Request(RequestError::RetryAfter(s)) => ChannelError::RateLimited {
                retry_after: Some(s.duration()),
            },
            CallError::Request(RequestError::Api(ApiError::InvalidToken)) => ChannelError::Auth(
                "Telegram refused the bot token (401 Unauthorized): set channels.telegram.token \
                 to the token @BotFather gave you"
                    .into(),
            ),
            CallError::Request(RequestError::Api(_)) => {
                let d = self.description().unwrap_or_default();
                if d.starts_with("Bad Request") || d.starts_with("Forbidden") {
                    ChannelError::Rejected(d)
                } else if d.starts_with("Too Many Requests") {
                    ChannelError::RateLimited { retry_after: None }
                } else {
                    ChannelError::Transient(format!("Telegram error: {d}"))
                }
            }
            CallError::Request(RequestError::MigrateToChatId(id)) => ChannelError::Rejected(
                format!("the group was upgraded to a supergroup; its new chat id is {id}"),
            ),
            CallError::Request(RequestError::Network(e)) => {
                ChannelError::Transient(format!("network: {e}"))
            }
            CallError::Request(RequestError::InvalidJson { raw, .. }) => {
                let raw: String = raw.chars().take(200).collect();
                ChannelError::Transient(format!("unparseable answer from Telegram: {raw}"))
            }
            CallError::Request(RequestError::Io(e)) => ChannelError::Transient(format!("io: {e}")),
        };
        scrub(e, token)
    }
}

/// Remove the token (and its secret half) from an error's text.
fn scrub(e: ChannelError, token: &str) -> ChannelError {
    let clean = |s: String| {
        let mut s = s;
        if !token.is_empty() {
            s = s.replace(token, "<token>");
        }
        if let Some((_, secret)) = token.split_once(':') {
            if secret.len() >= 8 {
                s = s.replace(secret, "<token>");
            }
        }
        s
    };
    match e {
        ChannelError::Transient(s) => ChannelError::Transient(clean(s)),
        ChannelError::Auth(s) => ChannelError::Auth(clean(s)),
        ChannelError::Rejected(s) => ChannelError::Rejected(clean(s)),
        ChannelError::Gone(s) => ChannelError::Gone(clean(s)),
        ChannelError::Fatal(s) => ChannelError::Fatal(clean(s)),
        other => other,
    }
}

/// The Bot API client.
pub(crate) struct Api {
    bot: Bot,
}

impl Api {
    pub fn new(token: &str, api_url: reqwest::Url) -> Result<Self, ChannelError> {
        let loopback = api_url.host_str().is_some_and(|h| {
            h.eq_ignore_ascii_case("localhost")
                || h.trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        });
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            // The token is in the path: never follow a redirect elsewhere with it.
            .redirect(reqwest::redirect::Policy::none());
        if loopback {
            builder = builder.no_proxy();
        }
        let client = builder
            .build()
            .map_err(|e| ChannelError::Fatal(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            bot: Bot::with_client(token, client).set_api_url(api_url),
        })
    }

    pub fn token(&self) -> &str {
        self.bot.token()
    }

    /// Whether `url` is on the configured API origin (scheme, host and port).
    pub fn same_origin(&self, url: &reqwest::Url) -> bool {
        let api = self.bot.api_url();
        api.scheme() == url.scheme()
            && api.host_str().map(str::to_ascii_lowercase)
                == url.host_str().map(str::to_ascii_lowercase)
            && api.port_or_known_default() == url.port_or_known_default()
    }

    /// `{api_url}/file/bot{token}/{file_path}`: where the Bot API serves a file `getFile`
    /// described. `None` for a path that is not a plain relative one (a local server in
    /// `--local` mode answers absolute paths on its own disk).
    pub fn file_url(&self, file_path: &str) -> Option<reqwest::Url> {
        let segments: Vec<&str> = file_path.split('/').collect();
        if segments
            .iter()
            .any(|s| s.is_empty() || *s == "." || *s == "..")
        {
            return None;
        }
        let mut url = self.bot.api_url();
        {
            let mut path = url.path_segments_mut().ok()?;
            path.pop_if_empty()
                .push("file")
                .push(&format!("bot{}", self.bot.token()));
            for s in segments {
                path.push(s);
            }
        }
        Some(url)
    }

    /// Upload a `multipart/form-data` body to `method` (`sendDocument`, ...): the answer's
    /// `result`, or the error classified like teloxide's (`retry_after` → 429, description →
    /// [`ApiError`]).
    pub async fn upload(
        &self,
        method: &str,
        content_type: String,
        body: Vec<u8>,
        deadline: Duration,
    ) -> Result<Value, CallError> {
        let mut url = self.bot.api_url();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty()
                .push(&format!("bot{}", self.bot.token()))
                .push(method);
        }
        let req = self
            .bot
            .client()
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body)
            .send();
        // The URL holds the token: never in the error.
        let net = |e: reqwest::Error| {
            CallError::Request(RequestError::Network(std::sync::Arc::new(e.without_url())))
        };
        let work = async {
            let resp = req.await.map_err(net)?;
            if resp.status() == reqwest::StatusCode::PAYLOAD_TOO_LARGE {
                return Err(CallError::TooLarge);
            }
            let text = resp.text().await.map_err(net)?;
            parse_answer(&text)
        };
        match tokio::time::timeout(deadline, work).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout(deadline)),
        }
    }

    pub async fn call<P>(&self, payload: P, deadline: Duration) -> Result<P::Output, CallError>
    where
        P: Payload + Serialize + Send + 'static,
        P::Output: serde::de::DeserializeOwned + Send + 'static,
    {
        let req = JsonRequest::new(self.bot.clone(), payload);
        match tokio::time::timeout(deadline, req).await {
            Ok(r) => r.map_err(CallError::Request),
            Err(_) => Err(CallError::Timeout(deadline)),
        }
    }

    pub async fn call_default<P>(&self, payload: P) -> Result<P::Output, CallError>
    where
        P: Payload + Serialize + Send + 'static,
        P::Output: serde::de::DeserializeOwned + Send + 'static,
    {
        self.call(payload, CALL_TIMEOUT).await
    }

    /// `getMe`, tolerant of fields this client does not know (or that an older server lacks).
    pub async fn get_me(&self) -> Result<Me, CallError> {
        let v = self.call_default(GetMe {}).await?;
        let id = v.get("id").and_then(Value::as_i64);
        let username = v.get("username").and_then(Value::as_str);
        match (id, username) {
            (Some(id), Some(u)) => Ok(Me {
                id,
                username: u.to_string(),
            }),
            _ => Err(CallError::Request(RequestError::InvalidJson {
                source: std::sync::Arc::new(serde::de::Error::custom(
                    "getMe answer lacks id or username",
                )),
                raw: v.to_string().into_boxed_str(),
            })),
        }
    }

    /// One long poll.
    pub async fn get_updates(
        &self,
        offset: Option<UpdateId>,
        timeout: Duration,
    ) -> Result<Vec<Value>, CallError> {
        self.call(
            GetUpdates {
                offset,
                timeout: timeout.as_secs(),
                // Only new messages: edits, reactions, member updates are not fetched.
                allowed_updates: vec!["message"],
            },
            timeout + poll_grace(timeout),
        )
        .await
    }
}
