//! `weft doctor`: checks a setup end to end and prints each finding as ok / warn / fail with
//! what to do about it. Exit code 1 when anything fails.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::client::GatewayClient;
use super::CliError;
use crate::config::{Config, ProviderKind};
use crate::store::{Store, StoreError};

/// How long one network check may take.
const NET_TIMEOUT: Duration = Duration::from_secs(8);

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// `ok`, `warn` or `fail`.
    pub level: &'static str,
    /// What was checked.
    pub check: String,
    /// What was found, and what to do.
    pub detail: String,
}

fn ok(check: impl Into<String>, detail: impl Into<String>) -> Finding {
    Finding {
        level: "ok",
        check: check.into(),
        detail: detail.into(),
    }
}

fn warn(check: impl Into<String>, detail: impl Into<String>) -> Finding {
    Finding {
        level: "warn",
        check: check.into(),
        detail: detail.into(),
    }
}

/// What speaks for `tts` and voice replies, what makes voice notes of it, and what draws
/// for `image` (found at start: `espeak-ng`, `ffmpeg`, `opusenc` on `PATH`).
pub fn media_findings(m: &crate::media::MediaSettings) -> Vec<Finding> {
    use crate::media::generate::{SpeechBackend, Transcoder};
    let tts = match &m.tts {
        SpeechBackend::None => warn(
            "speech",
            "none: the tts tool and voice replies are refused; install espeak-ng (offline) or set [media.tts] base_url and model",
        ),
        b @ SpeechBackend::Http(_) => ok("speech", b.describe()),
        b @ SpeechBackend::Espeak { .. } => ok("speech", b.describe()),
    };
    let notes = match (&m.tts, &m.transcoder) {
        (SpeechBackend::Espeak { .. }, None) => ok(
            "voice notes",
            "no ffmpeg or opusenc: espeak-ng's WAV goes as an audio file, not a voice note; install ffmpeg or opus-tools for voice notes",
        ),
        (_, Some(Transcoder::Ffmpeg(p))) => ok(
            "voice notes",
            format!("speech made Ogg/Opus by {}", p.display()),
        ),
        (_, Some(Transcoder::Opusenc(p))) => ok(
            "voice notes",
            format!("speech made Ogg/Opus by {}", p.display()),
        ),
        (SpeechBackend::Http(_), None) => ok("voice notes", "the speech endpoint answers Ogg/Opus"),
        (SpeechBackend::None, None) => warn(
            "voice notes",
            "none: nothing speaks (see speech), so no voice notes are sent",
        ),
    };
    let heard = match &m.transcription {
        Some(t) => ok(
            "transcription",
            format!(
                "voice notes and audio are transcribed by {} at {}",
                t.model,
                crate::types::scrub::redact_url(&t.base_url)
            ),
        ),
        None => warn(
            "transcription",
            "none: voice notes reach the model as files it cannot hear; set [media.transcription] base_url and model (an OpenAI-compatible /audio/transcriptions, e.g. a local whisper.cpp server)",
        ),
    };
    let images = match &m.images {
        Some(i) => ok("images", format!("{} at {}", i.model, i.base_url)),
        None => ok(
            "images",
            "none: the image tool is refused; set [media.images] base_url and model to draw",
        ),
    };
    vec![tts, notes, images, heard]
}

fn fail(check: impl Into<String>, detail: impl Into<String>) -> Finding {
    Finding {
        level: "fail",
        check: check.into(),
        detail: detail.into(),
    }
}

fn http() -> Result<reqwest::Client, CliError> {
    reqwest::Client::builder()
        .timeout(NET_TIMEOUT)
        .connect_timeout(NET_TIMEOUT)
        .build()
        .map_err(CliError::msg)
}

fn permissions(check: &str, path: &Path) -> Option<Finding> {
    let meta = std::fs::metadata(path).ok()?;
    let mode = meta.permissions().mode();
    Some(if mode & 0o004 != 0 {
        warn(
            check,
            format!(
                "{} is world-readable (mode {:o}): run `chmod 600 {}`",
                path.display(),
                mode & 0o777,
                path.display()
            ),
        )
    } else {
        ok(
            check,
            format!("{} (mode {:o})", path.display(), mode & 0o777),
        )
    })
}

/// Whether anything weft keeps (`~/.clawft`, the store, the workspace) is open to other local
/// users. The gateway makes it private at start; a `fail` here means it has not started since,
/// or something changed the modes after.
pub fn private_files_finding(config: &Config) -> Finding {
    let mut roots = vec![config.home.clone()];
    for extra in [&config.store.path, &config.agent.workspace] {
        if !extra.starts_with(&config.home) {
            roots.push(extra.clone());
        }
    }
    let open: Vec<std::path::PathBuf> = roots
        .iter()
        .flat_map(|r| crate::types::private::too_open(r, 5))
        .collect();
    let shown: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    match open.first() {
        None => ok(
            "private files",
            format!("{}: only this user can read them", shown.join(", ")),
        ),
        Some(first) => fail(
            "private files",
            format!(
                "{} (and {} more) can be read by other local users (transcripts, the node-signing key): restart the gateway, which makes them private, or run `chmod -R go-rwx {}`",
                first.display(),
                open.len() - 1,
                shown.join(" ")
            ),
        ),
    }
}

/// Whether the workspace holds the daemon's own files (or lies inside its store or credentials
/// directory). The file tools refuse them anyway and the exec sandbox carves them out, but a
/// kernel without Landlock leaves them readable to `exec_shell`, and an operator who copies or
/// archives the workspace takes them along: a workspace of its own is the fix.
pub fn workspace_findings(config: &Config) -> Vec<Finding> {
    use crate::tools::protected::{canonical, ProtectedKind};
    let ws = canonical(&config.agent.workspace);
    let key = "agents.defaults.workspace";
    let mut out = Vec::new();
    // Outermost first, so a directory is named once, not every file in it.
    let mut inside: Vec<(std::path::PathBuf, ProtectedKind)> =
        crate::daemon::protected_paths(config)
            .iter()
            .map(|p| (canonical(&p.path), p.kind))
            .filter(|(c, k)| c.starts_with(&ws) && c.exists() && *k != ProtectedKind::UserMemory)
            .collect();
    inside.sort_by_key(|(c, _)| c.components().count());
    let mut seen: Vec<std::path::PathBuf> = Vec::new();
    for (c, kind) in inside {
        if !seen.iter().any(|s| c.starts_with(s)) {
            out.push(warn(
                "workspace",
                format!(
                    "the workspace {} contains the daemon's {} {}: file tools refuse it and the exec sandbox hides it, but without Landlock exec_shell can read it; set {key} to a directory of its own (e.g. ~/.clawft/workspace) or move it out",
                    ws.display(),
                    kind.describe(),
                    c.display()
                ),
            ));
            seen.push(c);
        }
    }
    let holders = [
        (Some(config.store.path.clone()), ProtectedKind::Store),
        (
            config.tools.credentials_dir.clone(),
            ProtectedKind::Credentials,
        ),
    ];
    for (dir, kind) in holders {
        let Some(dir) = dir.map(|d| canonical(&d)) else {
            continue;
        };
        if ws.starts_with(&dir) {
            out.push(warn(
                "workspace",
                format!(
                    "the workspace {} lies inside the daemon's {} {}: set {key} to a directory outside it",
                    ws.display(),
                    kind.describe(),
                    dir.display()
                ),
            ));
        }
    }
    if out.is_empty() {
        out.push(ok(
            "workspace",
            format!(
                "{} holds none of the daemon's config, credentials, store or state directory",
                ws.display()
            ),
        ));
    }
    out
}

async fn providers(config: &Config, client: &reqwest::Client) -> Vec<Finding> {
    let mut out = Vec::new();
    let hints = config.provider_hints();
    for p in &config.providers {
        let check = format!("provider {}", p.name);
        if p.kind == ProviderKind::Ollama {
            out.push(ollama_provider(config, p, client, &check).await);
            continue;
        }
        let hint = |f: fn(&crate::config::provenance::ProviderHints) -> &String| {
            hints.get(&p.name).map(f).cloned().unwrap_or_default()
        };
        let local = p.base_url.contains("127.0.0.1") || p.base_url.contains("localhost");
        if p.api_key.is_none() && !local {
            out.push(warn(
                &check,
                format!(
                    "no API key for {}: set providers.{}.api_key_env or api_key_file",
                    p.base_url, p.name
                ),
            ));
        }
        let base = crate::types::scrub::redact_url(p.base_url.trim_end_matches('/'));
        let mut req = client.get(crate::llm::http::join_url(&p.base_url, "/models"));
        if let Some(k) = &p.api_key {
            req = match p.kind {
                ProviderKind::Anthropic => req
                    .header("x-api-key", k.expose())
                    .header("anthropic-version", "2023-06-01"),
                ProviderKind::OpenAi | ProviderKind::Ollama => req.bearer_auth(k.expose()),
            };
        }
        out.push(match req.send().await {
            Ok(r) if r.status().as_u16() == 401 || r.status().as_u16() == 403 => fail(
                &check,
                format!(
                    "{base} refused the API key (HTTP {}). {}",
                    r.status().as_u16(),
                    hint(|h| &h.auth)
                ),
            ),
            Ok(r) => {
                let status = r.status().as_u16();
                let listed = if r.status().is_success() {
                    r.json::<serde_json::Value>().await.ok().and_then(|v| {
                        v["data"].as_array().map(|a| {
                            a.iter()
                                .filter_map(|m| m["id"].as_str().map(str::to_string))
                                .collect::<Vec<_>>()
                        })
                    })
                } else {
                    None
                };
                match listed {
                    // The provider lists its models and the configured one is not among them:
                    // every turn would fail with "model not found".
                    Some(ids) if !ids.is_empty() && !p.model.is_empty() && !ids.contains(&p.model) => {
                        let shown: Vec<&str> = ids.iter().take(8).map(String::as_str).collect();
                        fail(
                            &check,
                            format!(
                                "{base} answers, but does not list the model `{}` among its {} models ({}{}): set agents.defaults.model (or providers.{}.model) to one it serves",
                                p.model,
                                ids.len(),
                                shown.join(", "),
                                if ids.len() > shown.len() { ", …" } else { "" },
                                p.name
                            ),
                        )
                    }
                    Some(_) => ok(
                        &check,
                        format!("{base} answers (HTTP {status}) and serves model {}", p.model),
                    ),
                    None => ok(
                        &check,
                        format!("{base} answers (HTTP {status}), model {}", p.model),
                    ),
                }
            }
            // No provider configured: the fix is a key, not a base URL (the same words as
            // `weft agent`'s).
            Err(e) => match crate::daemon::connect_hint(config) {
                Some(h) => fail(&check, format!("{h} ({e})")),
                None => fail(
                    &check,
                    format!(
                        "{base} is unreachable ({e}): is the server running? {}",
                        hint(|h| &h.connect)
                    ),
                ),
            },
        });
    }
    out
}

/// An Ollama provider (native API): the model's own window from `/api/show`, the window the
/// gateway asks for (`num_ctx`), and whether the model takes tools.
async fn ollama_provider(
    config: &Config,
    p: &crate::config::ProviderConfig,
    client: &reqwest::Client,
    check: &str,
) -> Finding {
    let root = crate::llm::ollama::server_root(&p.base_url);
    let base = crate::types::scrub::redact_url(&root);
    let resp = client
        .post(crate::llm::http::join_url(&root, "/api/show"))
        .json(&serde_json::json!({ "model": p.model }))
        .send()
        .await;
    let r = match resp {
        Ok(r) => r,
        Err(e) => {
            return match crate::daemon::connect_hint(config) {
                Some(h) => fail(check, format!("{h} ({e})")),
                None => fail(
                    check,
                    format!("Ollama at {base} is unreachable ({e}): is `ollama serve` running?"),
                ),
            }
        }
    };
    if r.status().as_u16() == 404 {
        return fail(
            check,
            format!(
                "Ollama at {base} does not have the model `{m}`: run `ollama pull {m}` (or set providers.{n}.model to one `ollama list` shows)",
                m = p.model,
                n = p.name
            ),
        );
    }
    if !r.status().is_success() {
        return fail(
            check,
            format!(
                "Ollama at {base} answered HTTP {} to /api/show",
                r.status().as_u16()
            ),
        );
    }
    let facts = crate::llm::ollama::facts_of(&r.json().await.unwrap_or_default());
    let agent = config.agent.window.context_window;
    let asked = agent
        .min(p.num_ctx_max)
        .min(facts.context_length.unwrap_or(u64::MAX));
    let own = facts
        .context_length
        .map_or_else(|| "not reported".to_string(), |n| format!("{n} tokens"));
    let tools = match facts.tools {
        Some(true) => "takes tools (native tool calls)",
        Some(false) => "takes no tools (its template has none): tool calls are read from its text",
        None => "tool support not reported (tool calls are also read from its text)",
    };
    let detail = format!(
        "Ollama at {base} serves model {m}: its own window {own}; weft asks for num_ctx {asked} (the agent's window {agent}, providers.{n}.num_ctx_max {max}), keep_alive {ka}; {tools}",
        m = p.model,
        n = p.name,
        max = p.num_ctx_max,
        ka = p.keep_alive,
    );
    if facts.tools == Some(false) {
        warn(check, detail)
    } else {
        ok(check, detail)
    }
}

/// What the running gateway knows of its providers (it serves the family; this shell's keys
/// may differ from its own): a failure for each provider it cannot use, and a failure when a
/// gateway runs but does not answer. `None` when no gateway runs. The second value names the
/// providers the gateway has used successfully (this shell's failures for them are warnings).
async fn gateway_providers(config: &Config) -> Option<(Vec<Finding>, Vec<String>)> {
    let client = match GatewayClient::detect(config).await {
        Ok(Some(c)) => c,
        Ok(None) => return None,
        Err(e) => {
            return Some((
                vec![fail(
                    "gateway",
                    format!("a gateway holds the store but cannot be asked ({e}): is it hung? `weft logs` shows what it does"),
                )],
                Vec::new(),
            ))
        }
    };
    let status = match client.get("/v1/status").await {
        Ok(v) => v,
        Err(e) => {
            return Some((
                vec![fail(
                    "gateway",
                    format!(
                        "the gateway at {} does not answer ({e}): is it hung? `weft logs` shows what it does",
                        client.base()
                    ),
                )],
                Vec::new(),
            ))
        }
    };
    let mut out = Vec::new();
    let mut working = Vec::new();
    for p in status["providers"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or("?");
        let model = p["model"].as_str().unwrap_or("");
        let check = format!("gateway's {name}");
        let at = |k: &str| {
            p[k].as_u64()
                .and_then(|ms| chrono::DateTime::from_timestamp_millis(i64::try_from(ms).ok()?))
                .map_or_else(
                    || "?".to_string(),
                    |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
                )
        };
        out.push(match p["state"].as_str() {
            Some("failing") => fail(
                check,
                format!(
                    "the running gateway's calls to {name} (model {model}) fail since {}: {} ({}); fix the key or model where the gateway runs (for the service: its service.env), then `systemctl restart clawft` or restart `weft gateway`",
                    at("failing_since_ms"),
                    p["last_error"]["message"].as_str().unwrap_or("?"),
                    p["last_error"]["kind"].as_str().unwrap_or("?"),
                ),
            ),
            Some("ok") => {
                working.push(name.to_string());
                ok(check, format!("the running gateway's last call to {name} (model {model}) succeeded at {}", at("last_success_ms")))
            }
            _ => ok(check, format!("the running gateway has not called {name} (model {model}) yet")),
        });
    }
    Some((out, working))
}

/// Each chat channel: its allow-list, then what its platform checks (a token accepted, a
/// login, a daemon reachable) unless a secret it needs is not in this shell.
async fn channels(config: &Config) -> Vec<Finding> {
    use clawft_channel_core::spec::Verdict;
    let mut out = Vec::new();
    for c in &config.chat_channels {
        let check = format!("channel {}", c.id());
        if c.allow_from.is_empty() && !c.pairing {
            out.push(warn(
                &check,
                format!(
                    "{} is empty and pairing is off: nobody can talk to the bot",
                    c.config_key("allow_from")
                ),
            ));
        }
        if let Some(d) = config
            .deferred_secrets
            .iter()
            .find(|d| d.key == c.config_key("token") || d.key == c.config_key("app_token"))
        {
            out.push(deferred_finding(config, &check, d));
            continue;
        }
        out.push(
            match c
                .settings
                .setup()
                .doctor(&c.account_ref(), NET_TIMEOUT)
                .await
            {
                Verdict::Ok(d) => ok(&check, d),
                Verdict::Warn(d) => warn(&check, d),
                Verdict::Fail(d) => fail(&check, d),
            },
        );
    }
    out
}

/// A secret of the service this shell does not hold (it lives in the service's environment):
/// not checked from here. A warning when the service's credentials file has it, else a failure
/// saying how to give it to the service.
fn deferred_finding(config: &Config, check: &str, d: &crate::config::DeferredSecret) -> Finding {
    let file = config.home.join(crate::config::SERVICE_ENV_FILE);
    let in_file = d
        .var
        .as_ref()
        .is_some_and(|v| super::service::read_env_file(&file).contains_key(v));
    if in_file {
        warn(
            check,
            format!(
                "{}, but the service's {} has it: not checked from this shell (to check it, run `set -a; . {}; set +a; weft doctor`)",
                d.reason,
                file.display(),
                file.display()
            ),
        )
    } else {
        fail(
            check,
            format!(
                "{}: the gateway will not start without it; set it where the gateway runs (for the service: export it, then `weft service install --write-credentials`)",
                d.reason
            ),
        )
    }
}

async fn store_and_bind(config: &Config) -> Vec<Finding> {
    let mut out = Vec::new();
    // An unreadable control file shows up as the store being in use by an unknown process.
    let gateway = GatewayClient::detect(config).await.ok().flatten();
    match Store::open(&config.store.path, config.store.cache_bytes) {
        Ok(s) => {
            out.push(
                match (s.pending_inbound(), s.pending_outbound(), s.sessions()) {
                    (Ok(i), Ok(o), Ok(sess)) => ok(
                        "store",
                        format!(
                            "{}: {} sessions, {} messages waiting, {} replies undelivered",
                            config.store.path.display(),
                            sess.len(),
                            i.len(),
                            o.len()
                        ),
                    ),
                    (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => fail(
                        "store",
                        format!(
                        "{} cannot be read ({e}): restore it from a backup (see deploy/README.md)",
                        config.store.path.display()
                    ),
                    ),
                },
            );
            drop(s);
        }
        Err(StoreError::Locked(p)) => out.push(if gateway.is_some() {
            ok("store", format!("{p} is in use by the running gateway"))
        } else {
            fail(
                "store",
                format!("{p} is locked by another process whose API does not answer: stop it"),
            )
        }),
        Err(e) => out.push(fail(
            "store",
            format!("{e}: check store.path and its permissions"),
        )),
    }
    if config.http.enabled {
        out.push(
            match (&gateway, std::net::TcpListener::bind(config.http.bind)) {
                (Some(c), _) => ok("http", format!("the gateway answers at {}", c.base())),
                (None, Ok(_)) => ok("http", format!("{} is free to bind", config.http.bind)),
                (None, Err(e)) => fail(
                    "http",
                    format!(
                        "cannot bind {} ({e}): another program uses it; change channels.http.bind",
                        config.http.bind
                    ),
                ),
            },
        );
    }
    out
}

/// Run every check and return the findings.
///
/// # Errors
/// The HTTP client cannot be built.
pub async fn check(config: &Config) -> Result<Vec<Finding>, CliError> {
    let mut out = Vec::new();
    out.push(ok(
        "config",
        config.path.as_ref().map_or_else(
            || "no config file: defaults and environment (run `weft onboard`)".to_string(),
            |p| format!("{} parsed", p.display()),
        ),
    ));
    if let Some(p) = &config.path {
        out.extend(permissions("config permissions", p));
    }
    if let Some(dir) = &config.tools.credentials_dir {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                out.extend(permissions("credential permissions", &e.path()));
            }
        }
    }
    out.push(private_files_finding(config));
    out.extend(workspace_findings(config));
    out.extend(window_findings(config));
    out.extend(service_credentials(
        config,
        &crate::config::Env::from_process(),
    ));
    out.extend(cluster_finding(config).await);
    let client = http()?;
    let mut shell = providers(config, &client).await;
    if let Some((from_gateway, working)) = gateway_providers(config).await {
        // This shell may hold other keys than the gateway: what the gateway uses successfully
        // is not failed for what this shell sees.
        for f in &mut shell {
            if f.level == "fail" && working.iter().any(|w| f.check == format!("provider {w}")) {
                f.level = "warn";
                f.detail = format!(
                    "{} (from this shell; the running gateway's calls succeed)",
                    f.detail
                );
            }
        }
        out.extend(shell);
        out.extend(from_gateway);
    } else {
        out.extend(shell);
    }
    out.extend(channels(config).await);
    for d in &config.deferred_secrets {
        if !d.key.starts_with("channels.") || d.key == "channels.http.token" {
            out.push(deferred_finding(config, &d.key, d));
        }
    }
    if let Some(m) = crate::daemon::start_mcp(config) {
        let skills = super::open_workspace(config)
            .map(|ws| {
                crate::skills::SkillDirs {
                    global: Some(config.home.join("skills")),
                    workspace: std::sync::Arc::new(ws),
                }
                .load()
            })
            .unwrap_or_default();
        m.settle(Duration::from_secs(15)).await;
        for s in m.status() {
            let check = format!("mcp {}", s.name);
            let line = s.to_string();
            let hidden = config
                .tools
                .mcp_servers
                .iter()
                .find(|c| c.name == s.name)
                .is_some_and(|c| c.internal_only);
            out.push(if line.starts_with("connected") && hidden && !skill_exposes(&skills, &s.name) {
                // The first-hour surprise: the server works, but the model never sees its tools.
                warn(
                    check,
                    format!(
                        "{line}, but its tools are hidden from the model: internal_only is true (the default) and no skill's allowed_tools names them; set tools.mcp_servers.{0}.internal_only = false, or add a skill with allowed_tools: [\"{0}__*\"]",
                        s.name
                    ),
                )
            } else if line.starts_with("connected") {
                ok(check, line)
            } else {
                fail(
                    check,
                    format!("{line}: check tools.mcp_servers.{} (command/url)", s.name),
                )
            });
        }
        m.shutdown().await;
    }
    let st = crate::tools::exec::sandbox_status(&config.tools.exec);
    out.push(if !crate::tools::sandbox::probe().fs_enforced {
        warn(
            "sandbox",
            format!(
                "{}: exec_shell runs without the filesystem sandbox; use Linux >= 5.13 with Landlock enabled, or set tools.exec.require_sandbox",
                st.summary()
            ),
        )
    } else if st.jail.is_some_and(|j| !j.pid_namespace) {
        warn(
            "sandbox",
            format!(
                "{}: commands cannot get their own namespaces, so they have no network at all and what they start in the background can outlive them; allow user, network and pid namespaces (systemd: RestrictNamespaces=user net pid)",
                st.summary()
            ),
        )
    } else {
        ok("sandbox", st.summary())
    });
    out.extend(media_findings(&config.media));
    let (found, line) = crate::browser::doctor_line(&config.tools.browser);
    out.push(if found {
        ok("browser", line)
    } else {
        warn("browser", line)
    });
    out.extend(store_and_bind(config).await);
    // Findings quote URLs, server answers and transport errors: none may show a secret.
    let scrubber = crate::types::scrub::Scrubber::new(
        config
            .secrets
            .iter()
            .map(|s| s.expose().to_string())
            .collect(),
    );
    for f in &mut out {
        if let std::borrow::Cow::Owned(d) = scrubber.scrub_str(&f.detail) {
            f.detail = d;
        }
    }
    Ok(out)
}

/// Per agent: whether its model's context window holds the instructions, the core tools and
/// one exchange (issue 32; the gateway logs the same error at start). MCP tools, which connect
/// later, are not counted: the list of tools not loaded grows by a line per MCP tool.
pub fn window_findings(config: &Config) -> Vec<Finding> {
    let names = std::iter::once(None).chain(config.agents.iter().map(|a| Some(a.name.as_str())));
    let mut out = Vec::new();
    for name in names {
        let view = match name {
            None => config.clone(),
            Some(n) => match config.for_agent(n) {
                Some(v) => v,
                None => continue,
            },
        };
        let check = format!("context window ({})", name.unwrap_or("main"));
        let ws = match super::open_workspace(&view) {
            Ok(ws) => std::sync::Arc::new(ws),
            Err(e) => {
                out.push(warn(check, e.to_string()));
                continue;
            }
        };
        let store = crate::store::Store::memory();
        let registry = crate::daemon::build::build_registry(
            &view,
            Some(std::sync::Arc::new(crate::tools::message::NoSink)),
            None,
            Vec::new(),
            crate::daemon::build::RegistryParts {
                subagents: Some(crate::subagent::SubagentHub::new(
                    view.tools.subagents.clone(),
                )),
                scheduler: Some(crate::scheduler::Scheduler::new(
                    store.clone(),
                    view.scheduler,
                    None,
                    view.tools.message_allow.clone(),
                    view.heartbeat.clone(),
                    ws.clone(),
                )),
                processes: Some(crate::tools::exec::process::ProcessTable::new()),
                sessions: Some(crate::session::tools::SessionDirectory::new(store)),
                ..Default::default()
            },
        );
        let prompt = crate::turn::context::ContextPrompt::new(
            &crate::session::prompt::system_prompt(None, ws.root()),
            view.agent.system_prompt.as_deref(),
            ws.clone(),
        )
        .current();
        let skills = crate::skills::SkillDirs {
            global: Some(view.home.join("skills")),
            workspace: ws,
        }
        .load();
        let overhead = crate::session::window::overhead_of(&registry, &prompt, &skills, &[]);
        out.push(
            match crate::session::window::fits_one_exchange(&view.agent, overhead) {
                Ok(()) => match view.agent.window.budget_capped() {
                    Some(capped) => warn(check, capped),
                    None => ok(
                        check,
                        format!(
                            "{} tokens; every request carries ~{overhead} (instructions and core tools); prompt budget {} tokens",
                            view.agent.window.context_window, view.agent.window.prompt_budget
                        ),
                    ),
                },
                Err(e) => fail(check, e),
            },
        );
    }
    out
}

/// When the user service is installed: whether it will see the environment variables the config
/// needs (a service does not inherit the shell's environment; `weft service install
/// --write-credentials` writes them to its credentials file).
pub fn service_credentials(config: &Config, env: &crate::config::Env) -> Vec<Finding> {
    use super::service::{needed_env, read_env_file, Scope};
    let scope = Scope::new(false, env);
    let Some(path) = config.path.as_deref() else {
        return Vec::new();
    };
    if !scope.unit_path.exists() {
        return Vec::new();
    }
    let have = read_env_file(&scope.env_file);
    let missing: Vec<String> = needed_env(path, env)
        .into_iter()
        .filter(|n| !have.contains_key(n))
        .collect();
    vec![if missing.is_empty() {
        ok(
            "service credentials",
            format!(
                "the service ({}) sees what the config needs{}",
                scope.unit_path.display(),
                if have.is_empty() {
                    String::new()
                } else {
                    format!(" (from {})", scope.env_file.display())
                }
            ),
        )
    } else {
        warn(
            "service credentials",
            format!(
                "the service ({}) will not see {}: it does not inherit this shell's environment{}; run `weft service install --write-credentials` (writes {}, mode 600, read by the unit)",
                scope.unit_path.display(),
                missing.join(", "),
                if missing.iter().any(|n| n.ends_with("_API_KEY")) {
                    " and without a provider key falls back to a local Ollama"
                } else {
                    ""
                },
                scope.env_file.display()
            ),
        )
    }]
}

/// `weft doctor`: print the findings; `Err` (exit 1) when any failed.
///
/// # Errors
/// A failed check.
pub async fn run(config: &Config, as_json: bool) -> Result<(), CliError> {
    let findings = check(config).await?;
    if as_json {
        let rows: Vec<_> = findings
            .iter()
            .map(|f| json!({"level": f.level, "check": f.check, "detail": f.detail}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(CliError::msg)?
        );
    } else {
        for f in &findings {
            println!("{:<5} {:<22} {}", f.level, f.check, f.detail);
        }
    }
    let failed = findings.iter().filter(|f| f.level == "fail").count();
    if failed > 0 {
        return Err(CliError::Failed(format!("{failed} check(s) failed")));
    }
    Ok(())
}

/// `[cluster]`: NATS reachable with these credentials, JetStream enabled.
async fn cluster_finding(config: &Config) -> Option<Finding> {
    let s = config.cluster.as_ref()?;
    #[cfg(feature = "cluster")]
    {
        Some(match crate::cluster::status::check(s).await {
            Ok(detail) => ok("cluster", format!("node {}: {detail}", s.node_id)),
            Err(e) => fail("cluster", format!("node {}: {e}", s.node_id)),
        })
    }
    #[cfg(not(feature = "cluster"))]
    {
        let _ = s;
        Some(fail(
            "cluster",
            "[cluster] is set, but this build of weft has no cluster support (build it with `cargo build --release --features cluster`)",
        ))
    }
}

/// Whether some skill's `allowed_tools` matches a tool of MCP server `server` (`server__…`).
fn skill_exposes(skills: &[crate::skills::Skill], server: &str) -> bool {
    let probe = format!("{server}__");
    skills.iter().flat_map(|s| &s.allowed_tools).any(|g| {
        g.strip_suffix('*').map_or_else(
            || g.starts_with(&probe),
            |prefix| probe.starts_with(prefix) || prefix.starts_with(&probe),
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::config::Env;

    fn load(home: &Path, text: &str, extra: &[(&str, &str)]) -> Config {
        let path = home.join(".clawft/config.toml");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        let mut env = vec![("HOME", home.to_str().unwrap())];
        env.extend_from_slice(extra);
        Config::load(Some(&path), &Env::from_pairs(env)).unwrap()
    }

    #[test]
    fn doctor_reports_what_speaks_and_what_draws() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let espeak = bin.join("espeak-ng");
        std::fs::write(&espeak, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&espeak, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let path = bin.to_str().unwrap().to_string();
        let c = load(tmp.path(), "", &[("PATH", path.as_str())]);
        let f = media_findings(&c.media);
        assert_eq!(f[0].level, "ok");
        assert!(
            f[0].detail.contains("espeak-ng (offline)"),
            "{}",
            f[0].detail
        );
        assert!(
            f[1].detail.contains("no ffmpeg or opusenc"),
            "{}",
            f[1].detail
        );
        assert!(f[2].detail.contains("[media.images]"), "{}", f[2].detail);
        let c = load(
            tmp.path(),
            "[media.tts]\noffline = false",
            &[("PATH", path.as_str())],
        );
        let f = media_findings(&c.media);
        assert_eq!(f[0].level, "warn");
        assert!(f[0].detail.contains("install espeak-ng"), "{}", f[0].detail);
        // No speech: no claim about a speech endpoint; no transcription: said.
        assert_eq!(f[1].level, "warn", "{}", f[1].detail);
        assert!(!f[1].detail.contains("endpoint answers"), "{}", f[1].detail);
        assert_eq!(f[3].check, "transcription");
        assert_eq!(f[3].level, "warn");
        assert!(
            f[3].detail.contains("[media.transcription]"),
            "{}",
            f[3].detail
        );
    }

    #[test]
    fn doctor_warns_when_the_workspace_holds_the_daemons_files() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        std::fs::create_dir_all(home.join("creds")).unwrap();
        // The service's home as the workspace: config, store and credentials inside it.
        let c = load(
            &home,
            &format!(
                "[agents.defaults]\nworkspace = \"{h}\"\n[store]\npath = \"{h}/.clawft/store\"\n",
                h = home.display()
            ),
            &[(
                "CREDENTIALS_DIRECTORY",
                home.join("creds").to_str().unwrap(),
            )],
        );
        std::fs::create_dir_all(home.join(".clawft/store")).unwrap();
        let f = workspace_findings(&c);
        let text: Vec<String> = f
            .iter()
            .map(|f| format!("{} {}", f.level, f.detail))
            .collect();
        assert!(f.iter().all(|f| f.level == "warn"), "{text:?}");
        // The state directory once (not each file in it), and the credentials directory.
        assert_eq!(f.len(), 2, "{text:?}");
        assert!(
            text.iter()
                .any(|t| t.contains("config") && t.contains(".clawft")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("credentials") && t.contains("creds")),
            "{text:?}"
        );
        assert!(
            text.iter().all(|t| t.contains("agents.defaults.workspace")),
            "{text:?}"
        );

        // The default layout: the workspace holds none of them.
        let other = tmp.path().join("other");
        let c = load(&other, "", &[]);
        std::fs::create_dir_all(&c.agent.workspace).unwrap();
        let f = workspace_findings(&c);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].level, "ok", "{}", f[0].detail);
    }
}
