//! `tools.mcp_servers.NAME`: the raw section ([`McpServerFile`]) and its validated form
//! ([`McpServerSettings`]). Reads the environment only through the lookup the config module
//! passes in (for `headers_env` and the few variables children inherit).

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use url::Url;

use crate::types::SettingError;

/// Default per-call timeout of an MCP tool (seconds).
pub const DEFAULT_CALL_TIMEOUT_SECS: u64 = 60;
/// Longest per-call timeout accepted (seconds).
pub const MAX_CALL_TIMEOUT_SECS: u64 = 3600;
/// Default deadline of the `initialize` handshake (seconds).
pub const DEFAULT_INIT_TIMEOUT_SECS: u64 = 30;
/// Longest `initialize` deadline accepted (seconds; `npx -y` may download first).
pub const MAX_INIT_TIMEOUT_SECS: u64 = 600;
/// Longest server name (the tool names `{server}__{tool}` must stay short).
pub const MAX_SERVER_NAME_LEN: usize = 32;

/// Variables a stdio server inherits from the daemon's environment when set; everything else
/// (API keys, bot tokens) is withheld. `env` adds to these.
pub const INHERITED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "TERM",
    "SHELL",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
];

/// `env` keys refused: they change which code the child (or its interpreter) loads.
const DISALLOWED_ENV: &[&str] = &[
    "PATH",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PERL5OPT",
    "PERL5LIB",
    "RUBYOPT",
    "BASH_ENV",
    "ENV",
];

/// Headers the MCP transport sets itself (or that describe the body): refused in `headers`.
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "content-length",
    "host",
    "connection",
    "transfer-encoding",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

/// One MCP server, `tools.mcp_servers.NAME` (seed 000/001). Set exactly one of `command`
/// (stdio) and `url` (streamable HTTP).
#[derive(Debug, Default, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServerFile {
    /// Program to spawn for a stdio server, e.g. `npx` (default: none).
    pub command: Option<String>,
    /// Arguments of `command` (default: []).
    pub args: Option<Vec<String>>,
    /// Extra environment variables of the stdio server (default: {}). The child inherits only
    /// PATH, HOME, locale and TLS variables from the daemon; PATH, LD_*, DYLD_*, NODE_OPTIONS
    /// and the like cannot be set here.
    pub env: Option<BTreeMap<String, String>>,
    /// Streamable HTTP endpoint of a remote server, e.g. `https://mcp.example.com/mcp`
    /// (default: none).
    pub url: Option<String>,
    /// HTTP headers sent on every request to `url`, literal values (default: {}).
    pub headers: Option<BTreeMap<String, String>>,
    /// HTTP headers whose value is read from an environment variable: header → variable name,
    /// e.g. `{"Authorization" = "GITHUB_MCP_AUTH"}` (default: {}). Values are secrets: they
    /// are scrubbed from tool results.
    pub headers_env: Option<BTreeMap<String, String>>,
    /// Keep the tools out of the model's tool list unless an active skill's `allowed_tools`
    /// names them (default: true).
    pub internal_only: Option<bool>,
    /// Deadline of one tool call in seconds; on expiry the call is cancelled on the server
    /// (default: 60, at most 3600).
    pub timeout_secs: Option<u64>,
    /// Deadline of the `initialize` handshake in seconds (default: 30, at most 600).
    pub init_timeout_secs: Option<u64>,
    /// Skip the SSRF guard for `url` (allow private, loopback and link-local addresses, and
    /// proxies): only for servers you run yourself (default: false).
    pub trusted: Option<bool>,
    /// Only the server's tools whose name (as the server names it) matches one of these globs
    /// (`*`, `?`) are taken (default: all).
    pub tool_allow: Option<Vec<String>>,
    /// The server's tools whose name matches one of these globs are never taken, whatever
    /// `tool_allow` says (default: none).
    pub tool_deny: Option<Vec<String>>,
}

/// How to reach a server.
#[derive(Clone, PartialEq, Eq)]
pub enum McpTransport {
    /// A child process speaking MCP over stdin/stdout.
    Stdio {
        /// Program.
        command: String,
        /// Arguments.
        args: Vec<String>,
        /// The child's whole environment (inherited allow-list plus `env`).
        env: BTreeMap<String, String>,
    },
    /// Streamable HTTP.
    Http {
        /// Endpoint.
        url: Url,
        /// Headers sent on every request (literal and from the environment).
        headers: Vec<(String, String)>,
        /// Whether the SSRF guard is skipped.
        trusted: bool,
    },
}

impl std::fmt::Debug for McpTransport {
    // Header values and env values may be secrets: names only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            McpTransport::Stdio { command, args, env } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.keys().collect::<Vec<_>>())
                .finish(),
            McpTransport::Http {
                url,
                headers,
                trusted,
            } => f
                .debug_struct("Http")
                .field("url", &redacted_url(url))
                .field(
                    "headers",
                    &headers.iter().map(|(k, _)| k).collect::<Vec<_>>(),
                )
                .field("trusted", trusted)
                .finish(),
        }
    }
}

/// A validated `tools.mcp_servers.NAME`.
#[derive(Clone, Debug, PartialEq)]
pub struct McpServerSettings {
    /// Server name, the prefix of its tools (`NAME__tool`).
    pub name: String,
    /// How to reach it.
    pub transport: McpTransport,
    /// Tools hidden unless a skill exposes them.
    pub internal_only: bool,
    /// Deadline of one tool call.
    pub call_timeout: Duration,
    /// Deadline of the `initialize` handshake.
    pub init_timeout: Duration,
    /// Values read through `headers_env` (to scrub from results).
    secrets: Vec<crate::types::Secret>,
    /// `tool_allow`: the server's tool names taken (globs); `None`: all.
    pub tool_allow: Option<Vec<String>>,
    /// `tool_deny`: the server's tool names never taken (globs); wins over `tool_allow`.
    pub tool_deny: Vec<String>,
}

impl McpServerSettings {
    /// A stdio server with the defaults (tests and programmatic use). The environment is
    /// exactly `env`.
    pub fn stdio(name: &str, command: &str, args: &[&str], env: BTreeMap<String, String>) -> Self {
        Self {
            name: name.to_string(),
            transport: McpTransport::Stdio {
                command: command.to_string(),
                args: args.iter().map(|a| (*a).to_string()).collect(),
                env,
            },
            internal_only: true,
            call_timeout: Duration::from_secs(DEFAULT_CALL_TIMEOUT_SECS),
            init_timeout: Duration::from_secs(DEFAULT_INIT_TIMEOUT_SECS),
            secrets: Vec::new(),
            tool_allow: None,
            tool_deny: Vec::new(),
        }
    }

    /// An HTTP server with the defaults (tests and programmatic use).
    pub fn http(name: &str, url: Url, trusted: bool) -> Self {
        Self {
            name: name.to_string(),
            transport: McpTransport::Http {
                url,
                headers: Vec::new(),
                trusted,
            },
            internal_only: true,
            call_timeout: Duration::from_secs(DEFAULT_CALL_TIMEOUT_SECS),
            init_timeout: Duration::from_secs(DEFAULT_INIT_TIMEOUT_SECS),
            secrets: Vec::new(),
            tool_allow: None,
            tool_deny: Vec::new(),
        }
    }

    /// Whether the server's tool `name` (its own name, without the prefix) is granted:
    /// matched by `tool_allow` when set, and by no `tool_deny` (deny wins).
    pub fn grants(&self, name: &str) -> bool {
        let m = |p: &String| crate::tools::policy::wildcard(p.as_bytes(), name.as_bytes());
        self.tool_allow.as_ref().is_none_or(|a| a.iter().any(m)) && !self.tool_deny.iter().any(m)
    }

    /// Secret values this server's settings hold (header values from `headers_env`): add them
    /// to the registry's scrubber.
    pub fn secrets(&self) -> Vec<String> {
        self.secrets
            .iter()
            .map(|s| s.expose().to_string())
            .collect()
    }

    /// `stdio` or `http`.
    pub fn transport_kind(&self) -> &'static str {
        match self.transport {
            McpTransport::Stdio { .. } => "stdio",
            McpTransport::Http { .. } => "http",
        }
    }

    /// What to show in listings: the command line, or the URL without credentials or query.
    pub fn target(&self) -> String {
        match &self.transport {
            McpTransport::Stdio { command, args, .. } => {
                let mut s = command.clone();
                for a in args {
                    s.push(' ');
                    s.push_str(a);
                }
                s
            }
            McpTransport::Http { url, .. } => redacted_url(url),
        }
    }
}

/// A `tool_allow`/`tool_deny` list: each glob non-empty.
fn globs(
    key: &str,
    field: &str,
    list: Option<&[String]>,
) -> Result<Option<Vec<String>>, SettingError> {
    let Some(list) = list else { return Ok(None) };
    if let Some(i) = list.iter().position(|g| g.trim().is_empty()) {
        return Err(SettingError::new(
            format!("{key}.{field}[{i}]"),
            "an empty pattern; give a tool name or a glob such as \"*write*\"",
        ));
    }
    Ok(Some(list.iter().map(|g| g.trim().to_string()).collect()))
}

/// `scheme://host:port/path`, without user info, query or fragment.
pub(crate) fn redacted_url(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

/// Whether `name` is usable as a server name: `[A-Za-z0-9_-]{1,32}` without `__` (the
/// separator of `{server}__{tool}`).
///
/// # Errors
/// What is wrong with it, about `tools.mcp_servers.NAME`.
pub fn validate_server_name(name: &str) -> Result<(), SettingError> {
    let invalid = |detail: String| SettingError::new(format!("tools.mcp_servers.{name}"), detail);
    if name.is_empty() || name.len() > MAX_SERVER_NAME_LEN {
        return Err(invalid(format!(
            "the server name `{name}` must be 1 to {MAX_SERVER_NAME_LEN} characters"
        )));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(invalid(format!(
            "the server name `{name}` may only contain letters, digits, `_` and `-`"
        )));
    }
    if name.contains("__") {
        return Err(invalid(format!(
            "the server name `{name}` must not contain `__` (it separates server and tool in `server__tool`)"
        )));
    }
    Ok(())
}

fn nonempty(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

fn check_header(key: &str, name: &str, value: &str) -> Result<(), SettingError> {
    let n = reqwest::header::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| SettingError::new(key, format!("`{name}` is not a valid HTTP header name")))?;
    if RESERVED_HEADERS.contains(&n.as_str()) {
        return Err(SettingError::new(
            key,
            format!("the `{name}` header is set by the MCP transport and cannot be configured"),
        ));
    }
    reqwest::header::HeaderValue::from_str(value).map_err(|_| {
        SettingError::new(
            key,
            format!("the value of `{name}` must be visible ASCII text"),
        )
    })?;
    Ok(())
}

impl McpServerFile {
    /// Validate `tools.mcp_servers.NAME`. `env_lookup` reads the daemon's environment (for
    /// `headers_env` and [`INHERITED_ENV`]). `Ok(None)`: neither `command` nor `url` is set;
    /// the caller logs a warning naming the server and skips it (seed 000).
    ///
    /// # Errors
    /// A message starting with the key (`tools.mcp_servers.NAME.…`) and saying what is expected.
    pub fn resolve(
        &self,
        name: &str,
        env_lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<McpServerSettings>, SettingError> {
        let key = format!("tools.mcp_servers.{name}");
        validate_server_name(name)?;
        let command = nonempty(&self.command);
        let url = nonempty(&self.url);
        let timeout = |field: &str, v: Option<u64>, default: u64, max: u64| match v {
            None => Ok(Duration::from_secs(default)),
            Some(n) if (1..=max).contains(&n) => Ok(Duration::from_secs(n)),
            Some(n) => Err(SettingError::new(
                format!("{key}.{field}"),
                format!("expected 1..={max} seconds, got {n}"),
            )),
        };
        let call_timeout = timeout(
            "timeout_secs",
            self.timeout_secs,
            DEFAULT_CALL_TIMEOUT_SECS,
            MAX_CALL_TIMEOUT_SECS,
        )?;
        let init_timeout = timeout(
            "init_timeout_secs",
            self.init_timeout_secs,
            DEFAULT_INIT_TIMEOUT_SECS,
            MAX_INIT_TIMEOUT_SECS,
        )?;
        let mut secrets = Vec::new();
        let transport = match (command, url) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err(SettingError::new(
                    key.clone(),
                    "set either `command` (a stdio server) or `url` (an HTTP server), not both",
                ))
            }
            (Some(command), None) => {
                for (field, set) in [
                    ("headers", self.headers.is_some()),
                    ("headers_env", self.headers_env.is_some()),
                    ("trusted", self.trusted.is_some()),
                ] {
                    if set {
                        return Err(SettingError::new(
                            format!("{key}.{field}"),
                            "only applies to `url` servers; this one has `command`",
                        ));
                    }
                }
                let mut env = BTreeMap::new();
                for var in INHERITED_ENV {
                    if let Some(v) = env_lookup(var) {
                        env.insert((*var).to_string(), v);
                    }
                }
                for (k, v) in self.env.iter().flatten() {
                    let bad_name = k.is_empty() || k.contains('=') || k.contains('\0');
                    if bad_name {
                        return Err(SettingError::new(
                            format!("{key}.env"),
                            format!("`{k}` is not a valid environment variable name"),
                        ));
                    }
                    let upper = k.to_ascii_uppercase();
                    if DISALLOWED_ENV.contains(&upper.as_str())
                        || upper.starts_with("LD_")
                        || upper.starts_with("DYLD_")
                    {
                        return Err(SettingError::new(format!("{key}.env.{k}"), "this variable changes which code the server loads and cannot be set; use an absolute `command` path instead"));
                    }
                    if v.contains('\0') {
                        return Err(SettingError::new(
                            format!("{key}.env.{k}"),
                            "the value contains a NUL byte",
                        ));
                    }
                    env.insert(k.clone(), v.clone());
                }
                if command.contains('\0') || self.args.iter().flatten().any(|a| a.contains('\0')) {
                    return Err(SettingError::new(
                        format!("{key}.command"),
                        "contains a NUL byte",
                    ));
                }
                McpTransport::Stdio {
                    command: command.to_string(),
                    args: self.args.clone().unwrap_or_default(),
                    env,
                }
            }
            (None, Some(url)) => {
                if self.args.is_some() || self.env.is_some() {
                    return Err(SettingError::new(
                        key.clone(),
                        "`args` and `env` only apply to `command` servers; this one has `url`",
                    ));
                }
                let parsed = Url::parse(url).map_err(|e| {
                    SettingError::new(format!("{key}.url"), format!("`{url}` is not a valid URL ({e}); expected e.g. https://mcp.example.com/mcp"))
                })?;
                if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
                    return Err(SettingError::new(
                        format!("{key}.url"),
                        format!("expected an http:// or https:// URL with a host, got `{url}`"),
                    ));
                }
                let mut headers = Vec::new();
                for (h, v) in self.headers.iter().flatten() {
                    check_header(&format!("{key}.headers"), h, v)?;
                    headers.push((h.clone(), v.clone()));
                }
                for (h, var) in self.headers_env.iter().flatten() {
                    let k = format!("{key}.headers_env");
                    let v = env_lookup(var).filter(|v| !v.is_empty()).ok_or_else(|| {
                        SettingError::new(
                            format!("{k}.{h}"),
                            format!("the environment variable `{var}` is not set"),
                        )
                    })?;
                    check_header(&k, h, &v)?;
                    if headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(h)) {
                        return Err(SettingError::new(
                            format!("{k}.{h}"),
                            "the header is also set in `headers`; keep one",
                        ));
                    }
                    secrets.push(crate::types::Secret::new(v.clone()));
                    headers.push((h.clone(), v));
                }
                McpTransport::Http {
                    url: parsed,
                    headers,
                    trusted: self.trusted.unwrap_or(false),
                }
            }
        };
        Ok(Some(McpServerSettings {
            name: name.to_string(),
            transport,
            internal_only: self.internal_only.unwrap_or(true),
            call_timeout,
            init_timeout,
            secrets,
            tool_allow: globs(&key, "tool_allow", self.tool_allow.as_deref())?,
            tool_deny: globs(&key, "tool_deny", self.tool_deny.as_deref())?.unwrap_or_default(),
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn tool_allow_and_deny_are_globs_and_deny_wins() {
        let f: McpServerFile = serde_json::from_value(serde_json::json!({
            "command": "node", "tool_allow": ["read_*", "write_file"], "tool_deny": ["*write*"]
        }))
        .unwrap();
        let s = f.resolve("fs", &env).unwrap().unwrap();
        assert!(s.grants("read_text_file"));
        assert!(!s.grants("write_file"), "deny wins over allow");
        assert!(!s.grants("list_directory"), "not in tool_allow");
        let bad: McpServerFile = serde_json::from_value(
            serde_json::json!({"command": "node", "tool_deny": ["*write*", " "]}),
        )
        .unwrap();
        let e = bad.resolve("fs", &env).unwrap_err();
        assert_eq!(e.key, "tools.mcp_servers.fs.tool_deny[1]");
    }

    fn env(k: &str) -> Option<String> {
        match k {
            "PATH" => Some("/usr/bin:/bin".into()),
            "HOME" => Some("/home/u".into()),
            "OPENAI_API_KEY" => Some("sk-secret".into()),
            "GH_AUTH" => Some("Bearer ghp_x".into()),
            _ => None,
        }
    }

    #[test]
    fn stdio_defaults_and_child_environment() {
        let f: McpServerFile = serde_json::from_value(serde_json::json!({
            "command": "npx", "args": ["-y", "srv"], "env": {"API_BASE": "https://x"}
        }))
        .unwrap();
        let s = f.resolve("my-srv_1", &env).unwrap().unwrap();
        assert!(s.internal_only);
        assert_eq!(s.call_timeout, Duration::from_secs(60));
        assert_eq!(s.init_timeout, Duration::from_secs(30));
        assert_eq!(s.transport_kind(), "stdio");
        assert_eq!(s.target(), "npx -y srv");
        let McpTransport::Stdio { env: e, .. } = &s.transport else {
            panic!()
        };
        // The daemon's secrets are not inherited; PATH/HOME are; env adds.
        assert_eq!(
            e.keys().map(String::as_str).collect::<Vec<_>>(),
            ["API_BASE", "HOME", "PATH"]
        );
        assert!(!format!("{s:?}").contains("https://x"));
    }

    #[test]
    fn http_headers_from_env_are_secrets() {
        let f = McpServerFile {
            url: Some("https://user:pw@mcp.example.com/mcp?key=1".into()),
            headers: Some(BTreeMap::from([("X-Team".into(), "a".into())])),
            headers_env: Some(BTreeMap::from([("Authorization".into(), "GH_AUTH".into())])),
            internal_only: Some(false),
            timeout_secs: Some(5),
            ..Default::default()
        };
        let s = f.resolve("gh", &env).unwrap().unwrap();
        assert!(!s.internal_only);
        assert_eq!(s.secrets(), ["Bearer ghp_x"]);
        assert_eq!(s.target(), "https://mcp.example.com/mcp");
        assert!(!format!("{s:?}").contains("ghp_x"));
        let McpTransport::Http {
            headers, trusted, ..
        } = &s.transport
        else {
            panic!()
        };
        assert!(!trusted);
        assert_eq!(headers.len(), 2);
    }

    #[test]
    fn neither_is_skipped_and_errors_name_the_key() {
        assert!(McpServerFile::default()
            .resolve("x", &env)
            .unwrap()
            .is_none());
        // Empty strings count as unset (seed defaults are "").
        let f = McpServerFile {
            command: Some(String::new()),
            url: Some(" ".into()),
            ..Default::default()
        };
        assert!(f.resolve("x", &env).unwrap().is_none());
        let cases: Vec<(&str, McpServerFile, &str)> = vec![
            (
                "x",
                McpServerFile {
                    command: Some("a".into()),
                    url: Some("http://h/".into()),
                    ..Default::default()
                },
                "not both",
            ),
            ("a__b", McpServerFile::default(), "`__`"),
            ("a.b", McpServerFile::default(), "letters, digits"),
            ("", McpServerFile::default(), "1 to 32"),
            (
                "x",
                McpServerFile {
                    url: Some("ftp://h/".into()),
                    ..Default::default()
                },
                "tools.mcp_servers.x.url",
            ),
            (
                "x",
                McpServerFile {
                    url: Some("not a url".into()),
                    ..Default::default()
                },
                "tools.mcp_servers.x.url",
            ),
            (
                "x",
                McpServerFile {
                    command: Some("a".into()),
                    env: Some(BTreeMap::from([("LD_PRELOAD".into(), "/x.so".into())])),
                    ..Default::default()
                },
                "tools.mcp_servers.x.env.LD_PRELOAD",
            ),
            (
                "x",
                McpServerFile {
                    command: Some("a".into()),
                    env: Some(BTreeMap::from([("path".into(), "/x".into())])),
                    ..Default::default()
                },
                "tools.mcp_servers.x.env.path",
            ),
            (
                "x",
                McpServerFile {
                    command: Some("a".into()),
                    trusted: Some(true),
                    ..Default::default()
                },
                "tools.mcp_servers.x.trusted",
            ),
            (
                "x",
                McpServerFile {
                    url: Some("http://h/".into()),
                    args: Some(vec![]),
                    ..Default::default()
                },
                "`args` and `env`",
            ),
            (
                "x",
                McpServerFile {
                    url: Some("http://h/".into()),
                    headers_env: Some(BTreeMap::from([("Authorization".into(), "NOPE".into())])),
                    ..Default::default()
                },
                "tools.mcp_servers.x.headers_env.Authorization: the environment variable `NOPE` is not set",
            ),
            (
                "x",
                McpServerFile {
                    url: Some("http://h/".into()),
                    headers: Some(BTreeMap::from([("Mcp-Session-Id".into(), "1".into())])),
                    ..Default::default()
                },
                "tools.mcp_servers.x.headers",
            ),
            (
                "x",
                McpServerFile {
                    url: Some("http://h/".into()),
                    headers: Some(BTreeMap::from([("X-A".into(), "line\nbreak".into())])),
                    ..Default::default()
                },
                "visible ASCII",
            ),
            (
                "x",
                McpServerFile {
                    command: Some("a".into()),
                    timeout_secs: Some(0),
                    ..Default::default()
                },
                "tools.mcp_servers.x.timeout_secs: expected 1..=3600",
            ),
            (
                "x",
                McpServerFile {
                    command: Some("a".into()),
                    init_timeout_secs: Some(601),
                    ..Default::default()
                },
                "tools.mcp_servers.x.init_timeout_secs",
            ),
        ];
        for (name, f, want) in cases {
            let e = f.resolve(name, &env).unwrap_err().to_string();
            assert!(e.contains(want), "{name}: `{e}` lacks `{want}`");
        }
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let r: Result<McpServerFile, _> =
            serde_json::from_value(serde_json::json!({"command": "a", "cmd": "b"}));
        assert!(r.is_err());
    }
}
