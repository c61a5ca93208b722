//! The [`ToolRegistry`]: name → tool, schemas sorted by name, and `dispatch`, which parses the
//! model's argument text, applies the policy and the rate limit, runs the tool with a timeout,
//! sanitises (terminal escapes, controls, invisible characters), scrubs secrets and truncates
//! the result. This is the one place tool output is made safe: the model, the store, the logs
//! and the chats all see the same text.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tracing::Instrument;

use super::policy::ToolPolicy;
use super::ratelimit::RateLimiter;
use super::scrub::Scrubber;
use super::truncate::truncate_result;
use super::{discovery, Tool, ToolContext, ToolError, MAX_TOOL_RESULT_BYTES};
use crate::llm::ToolSpec;
use crate::types::RwLockExt;

/// What the model receives for one tool call: kept as a value (the turn reads fields of it,
/// e.g. `use_skill`'s `allowed_tools`) and serialised once, into the tool message.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolOutcome {
    /// The result or `{"error", "error_code"}`, sanitised, scrubbed and truncated.
    pub value: Value,
    /// The error, if the call failed.
    pub error: Option<ToolError>,
}

impl ToolOutcome {
    /// The JSON text the model sees, held to [`MAX_TOOL_RESULT_BYTES`] as the provider receives
    /// it, whatever was added to the value after the call (a guard's notice).
    pub fn content(&self) -> String {
        let v = truncate_result(self.value.clone(), MAX_TOOL_RESULT_BYTES);
        serde_json::to_string(&v).unwrap_or_else(|_| "null".into())
    }
}

/// A tool from a dynamic source, and whether it is internal (hidden unless a skill exposes it).
#[derive(Clone)]
pub struct SourcedTool {
    /// The tool (named `server__tool` for MCP).
    pub tool: Arc<dyn Tool>,
    /// Shown to the model only when an active skill's `allowed_tools` matches it.
    pub internal: bool,
}

/// What a turn offers the model: see [`ToolRegistry::offer`].
#[derive(Clone, Debug, Default)]
pub struct Offer {
    /// The schemas sent: the core tools sorted by name, then the loaded ones in load order.
    pub specs: Vec<ToolSpec>,
    /// How many of `specs` are core (the rest were loaded).
    pub core: usize,
    /// The allowed tools that are not core: `(name, one line)`, sorted by name, for the
    /// system prompt's list ([`discovery::list_section`]); loaded ones included (the list
    /// does not change when a tool is loaded).
    pub deferred: Vec<(String, String)>,
}

/// Tools that come and go at run time (MCP servers connecting, reconnecting, changing their
/// list). The registry asks for the current set on every turn and call.
pub trait ToolSource: Send + Sync + 'static {
    /// The tools available now.
    fn tools(&self) -> Vec<SourcedTool>;

    /// Resolves once the tools still being fetched for the first time are known (an MCP
    /// server's first connection attempt), within the source's own bound. Default: at once.
    fn first_connect(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// The registry in force, replaceable at run time (config reload) while turns run: each turn
/// takes the current one at its start and keeps it to its end.
pub struct ToolsHandle(std::sync::RwLock<Arc<ToolRegistry>>);

impl ToolsHandle {
    /// A handle holding `r`.
    pub fn new(r: ToolRegistry) -> Arc<Self> {
        Arc::new(Self(std::sync::RwLock::new(Arc::new(r))))
    }

    /// The registry in force.
    pub fn current(&self) -> Arc<ToolRegistry> {
        self.0.read_locked().clone()
    }

    /// Put `r` in force for turns that start from now on.
    pub fn replace(&self, r: ToolRegistry) {
        *self.0.write_locked() = Arc::new(r);
    }
}

/// Registered tools.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    sources: Vec<Arc<dyn ToolSource>>,
    scrubber: Scrubber,
    policy: Arc<ToolPolicy>,
    limiter: Option<Arc<RateLimiter>>,
    timeout: Option<Duration>,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Secret values to redact from every result (on top of the credential patterns, which
    /// are always applied).
    pub fn with_secrets(mut self, secrets: Vec<String>) -> Self {
        self.scrubber = Scrubber::new(secrets);
        self
    }

    /// The policy deciding which tools the model sees and may call.
    pub fn with_policy(mut self, policy: ToolPolicy) -> Self {
        self.policy = Arc::new(policy);
        self
    }

    /// Per-session rate limiting of tool calls.
    pub fn with_rate_limit(mut self, limiter: Option<Arc<RateLimiter>>) -> Self {
        self.limiter = limiter;
        self
    }

    /// The scrubber applied to every result.
    pub fn scrubber(&self) -> &Scrubber {
        &self.scrubber
    }

    /// `raw_args` of a call to `name` as the transcript keeps them: the credentials the tool
    /// finds in them ([`Tool::credentials_in`]) are learned by the scrubber and replaced by
    /// `[REDACTED]`. `None` when nothing is masked.
    pub fn stored_arguments(
        &self,
        name: &str,
        raw_args: &str,
        ctx: &ToolContext,
    ) -> Option<String> {
        let (tool, _) = self.get(name)?;
        let args: Value = serde_json::from_str(raw_args).ok()?;
        let creds = tool.credentials_in(&args, ctx);
        if creds.is_empty() {
            return None;
        }
        for c in &creds {
            self.scrubber.learn(c);
        }
        let mut masked = args;
        self.scrubber.scrub_value(&mut masked);
        Some(masked.to_string())
    }

    /// The policy in force.
    pub fn policy(&self) -> &ToolPolicy {
        &self.policy
    }

    /// This registry with the policy narrowed by `deny` (for subagents): never wider.
    pub fn narrowed(&self, deny: Vec<super::policy::Pattern>) -> Self {
        let mut r = self.clone();
        r.policy = Arc::new(self.policy.narrowed(deny));
        r
    }

    /// Wait until every source has its first list of tools (each within its own bound, e.g.
    /// `tools.mcp_connect_wait_secs`): a turn calls this before it lists the tools.
    pub async fn first_connect(&self) {
        futures::future::join_all(self.sources.iter().map(|s| s.first_connect())).await;
    }

    /// Add a dynamic source of tools (MCP).
    pub fn with_source(mut self, source: Arc<dyn ToolSource>) -> Self {
        self.sources.push(source);
        self
    }

    /// A tool by name (built-in first, then the sources), whatever the policy says, and
    /// whether it is internal.
    pub fn get(&self, name: &str) -> Option<(Arc<dyn Tool>, bool)> {
        if let Some(t) = self.tools.get(name) {
            return Some((t.clone(), false));
        }
        self.sources
            .iter()
            .flat_map(|s| s.tools())
            .find(|t| t.tool.name() == name)
            .map(|t| (t.tool, t.internal))
    }

    /// Every tool (built-in and from sources), sorted by name; a built-in wins a name clash.
    pub fn all(&self) -> Vec<SourcedTool> {
        let mut all: BTreeMap<String, SourcedTool> = BTreeMap::new();
        for s in &self.sources {
            for t in s.tools() {
                all.entry(t.tool.name().to_string()).or_insert(t);
            }
        }
        for (n, t) in &self.tools {
            all.insert(
                n.clone(),
                SourcedTool {
                    tool: t.clone(),
                    internal: false,
                },
            );
        }
        all.into_values().collect()
    }

    fn visible(&self, t: &SourcedTool, exposed: &[String]) -> bool {
        let name = t.tool.name();
        self.policy.allows(name)
            && (!t.internal
                || exposed
                    .iter()
                    .any(|g| super::policy::wildcard(g.as_bytes(), name.as_bytes())))
    }

    /// Specs of the visible tools plus those matched by `globs` (a skill's `allowed_tools`,
    /// internal MCP tools included), sorted by name. The policy still applies: deny wins.
    pub fn schemas_for_tools(&self, globs: &[String]) -> Vec<ToolSpec> {
        self.all()
            .into_iter()
            .filter(|t| self.visible(t, globs))
            .map(|t| ToolSpec {
                name: t.tool.name().to_string(),
                description: t.tool.description().to_string(),
                parameters: t.tool.parameters(),
            })
            .collect()
    }

    /// Whether `name` is offered in full in every request: a core tool
    /// ([`super::builtin::Builtin::core`]) or one the policy pins (`always`). Without `tool_search`
    /// (denied or not registered) every tool is: nothing could load the others.
    fn is_core(&self, name: &str, has_search: bool) -> bool {
        !has_search || super::builtin::is_core(name) || self.policy.pinned(name)
    }

    fn has_search(&self, exposed: &[String]) -> bool {
        self.tools.get(discovery::TOOL_SEARCH).is_some_and(|t| {
            self.visible(
                &SourcedTool {
                    tool: t.clone(),
                    internal: false,
                },
                exposed,
            )
        })
    }

    /// What a turn offers the model (docs/tools.md, "Core tools and `tool_search`"): the
    /// schemas of the core tools sorted by name, then those of `loaded` (allowed tools the
    /// turn loaded, in the order given; the order of loading, so a later load appends and the
    /// request prefix stays byte-stable); and the other allowed tools by name and one line.
    /// `exposed` (an active skill's `allowed_tools`) makes internal tools loadable; `omit`
    /// takes tools out of the offer and of the list (`use_skill` without skills); `loaded`
    /// still loads them.
    pub fn offer(&self, exposed: &[String], loaded: &[String], omit: &[&str]) -> Offer {
        let has_search = self.has_search(exposed);
        let all = self.all();
        let spec = |t: &SourcedTool| ToolSpec {
            name: t.tool.name().to_string(),
            description: t.tool.description().to_string(),
            parameters: t.tool.parameters(),
        };
        let mut specs: Vec<ToolSpec> = all
            .iter()
            .filter(|t| {
                let n = t.tool.name();
                self.visible(t, exposed) && self.is_core(n, has_search) && !omit.contains(&n)
            })
            .map(spec)
            .collect();
        let core = specs.len();
        for name in loaded {
            if specs.iter().any(|s| &s.name == name) {
                continue;
            }
            if let Some(t) = all.iter().find(|t| t.tool.name() == name) {
                if self.visible(t, exposed) {
                    specs.push(spec(t));
                }
            }
        }
        let deferred = all
            .iter()
            .filter(|t| {
                let n = t.tool.name();
                self.visible(t, &[]) && !self.is_core(n, has_search) && !omit.contains(&n)
            })
            .map(|t| {
                (
                    t.tool.name().to_string(),
                    discovery::one_line(t.tool.description()),
                )
            })
            .collect();
        Offer {
            specs,
            core,
            deferred,
        }
    }

    /// The allowed tools matched by `globs` (a skill's `allowed_tools`), internal ones
    /// included, sorted by name.
    pub fn matching(&self, globs: &[String]) -> Vec<String> {
        self.all()
            .iter()
            .filter(|t| {
                let n = t.tool.name();
                self.visible(t, globs)
                    && globs
                        .iter()
                        .any(|g| super::policy::wildcard(g.as_bytes(), n.as_bytes()))
            })
            .map(|t| t.tool.name().to_string())
            .collect()
    }

    /// `tool_search`: the allowed tools that are not core, ranked for the query.
    fn search_tools(&self, args: Value, exposed: &[String]) -> Result<Value, ToolError> {
        let a: discovery::ToolSearchArgs = super::parse_args(discovery::TOOL_SEARCH, args)?;
        let has_search = self.has_search(exposed);
        let candidates: Vec<discovery::Candidate> = self
            .all()
            .iter()
            .filter(|t| self.visible(t, exposed) && !self.is_core(t.tool.name(), has_search))
            .map(|t| discovery::Candidate::of(t.tool.as_ref()))
            .collect();
        let found: Vec<Value> = discovery::rank(&candidates, &a.query, a.limit())
            .into_iter()
            .map(|i| json!({"name": candidates[i].name, "description": candidates[i].description}))
            .collect();
        let note = if found.is_empty() {
            "No tool matches: try other words, or a name from the \"More tools\" list."
        } else {
            "These tools are loaded: call them now, in this turn."
        };
        Ok(json!({ "tools": found, "note": note }))
    }

    /// Per-call timeout.
    pub fn with_timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    /// Add a tool; a tool of the same name is replaced.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.name().to_string(), tool);
    }

    /// Registered names (built-in and from sources), sorted, whatever the policy says.
    pub fn names(&self) -> Vec<String> {
        self.all()
            .into_iter()
            .map(|t| t.tool.name().to_string())
            .collect()
    }

    /// Names the model is shown (policy allows, not internal), sorted.
    pub fn allowed_names(&self) -> Vec<String> {
        self.all()
            .into_iter()
            .filter(|t| self.visible(t, &[]))
            .map(|t| t.tool.name().to_string())
            .collect()
    }

    /// Number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Specs of the tools the model is shown (policy allows, not internal), sorted by name.
    pub fn schemas(&self) -> Vec<ToolSpec> {
        self.schemas_for_tools(&[])
    }

    /// Run one call: parse `raw_args`, find the tool, execute it under the timeout and the
    /// context's cancellation, and produce the model-facing result.
    pub async fn dispatch(
        &self,
        name: &str,
        call_id: &str,
        raw_args: &str,
        ctx: &ToolContext,
    ) -> ToolOutcome {
        self.dispatch_with(name, call_id, raw_args, ctx, &[]).await
    }

    /// [`ToolRegistry::dispatch`] with the internal tools matched by `exposed` (an active
    /// skill's `allowed_tools`) callable too.
    pub async fn dispatch_with(
        &self,
        name: &str,
        call_id: &str,
        raw_args: &str,
        ctx: &ToolContext,
        exposed: &[String],
    ) -> ToolOutcome {
        let span = tracing::info_span!("tool", tool = name, call_id);
        let result = async {
            let args: Value = if raw_args.trim().is_empty() {
                Value::Object(serde_json::Map::new())
            } else {
                serde_json::from_str(raw_args).map_err(|e| {
                    ToolError::InvalidArgs(format!(
                        "arguments for {name} are not valid JSON ({e}); send a JSON object matching the tool's schema"
                    ))
                })?
            };
            let (tool, internal) = self.get(name).ok_or_else(|| {
                ToolError::NotFound(format!(
                    "`{name}`; available tools: {}",
                    self.allowed_names().join(", ")
                ))
            })?;
            let sourced = SourcedTool {
                tool: tool.clone(),
                internal,
            };
            if !self.visible(&sourced, exposed) && self.policy.allows(name) {
                // Allowed, but an internal-only MCP server's tool outside its skill.
                let server = name.split_once("__").map_or(name, |(s, _)| s);
                return Err(ToolError::PermissionDenied(format!(
                    "tool `{name}` is offered only while a skill that lists it in allowed_tools is active: its MCP server `{server}` is internal_only. Use that skill (`/SKILL` in the chat, or skill_search to find it), or the operator sets tools.mcp_servers.{server}.internal_only = false"
                )));
            }
            if !self.visible(&sourced, exposed) {
                return Err(ToolError::PermissionDenied(format!(
                    "tool `{name}` is not allowed by the tool policy (tools.policy / agents.defaults.tools); available tools: {}",
                    self.allowed_names().join(", ")
                )));
            }
            if let Some(l) = &self.limiter {
                if let Err(wait) = l.check(ctx.session.as_str()) {
                    let lim = l.limit();
                    return Err(ToolError::RateLimited(format!(
                        "too many tool calls: this session may make {} calls per minute (bursts of {}); try again in {:.1}s or finish without more tools",
                        lim.per_minute,
                        lim.burst,
                        wait.as_secs_f64()
                    )));
                }
            }
            if name == discovery::TOOL_SEARCH {
                // Answered here: the registry knows every tool and the policy.
                ctx.turn.report(super::TurnEffect::ToolsLoaded);
                return self.search_tools(args, exposed);
            }
            let call_ctx = ToolContext {
                call_id: Some(Arc::from(call_id)),
                ..ctx.clone()
            };
            let run = tool.execute(args, &call_ctx);
            tokio::select! {
                biased;
                () = ctx.cancel.cancelled() => Err(ToolError::Cancelled),
                r = async {
                    let limit = match (self.timeout, tool.time_budget()) {
                        (Some(t), Some(b)) => Some(t.max(b)),
                        (t, _) => t,
                    };
                    match limit {
                        Some(t) => tokio::time::timeout(t, run)
                            .await
                            .unwrap_or(Err(ToolError::Timeout(t.as_secs()))),
                        None => run.await,
                    }
                } => r,
            }
        }
        .instrument(span.clone())
        .await;
        let _g = span.enter();
        let tool_label = if matches!(result, Err(ToolError::NotFound(_))) {
            "(unknown)"
        } else {
            name
        };
        let outcome = result.as_ref().err().map_or("ok", ToolError::code);
        crate::metrics::inc(
            "clawft_tool_calls_total",
            &[("tool", tool_label), ("outcome", outcome)],
            1,
        );
        match result {
            Ok(mut v) => {
                // Sanitise and scrub before truncating: a key cut at the boundary is still
                // caught.
                self.scrubber.clean_value(&mut v);
                let v = truncate_result(v, MAX_TOOL_RESULT_BYTES);
                tracing::debug!("tool succeeded");
                ToolOutcome {
                    value: v,
                    error: None,
                }
            }
            Err(e) => {
                tracing::info!(error_code = e.code(), "tool failed");
                let mut v = e.to_json();
                self.scrubber.clean_value(&mut v);
                // An error's text can echo the call (a long tool name, a path): the cap holds
                // on this path too.
                let v = truncate_result(v, MAX_TOOL_RESULT_BYTES);
                ToolOutcome {
                    value: v,
                    error: Some(e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use async_trait::async_trait;
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::tools::{Effect, Workspace};
    use crate::types::SessionKey;

    /// Echoes its arguments.
    struct EchoTool(&'static str);

    #[async_trait]
    impl Tool for EchoTool {
        fn name(&self) -> &str {
            self.0
        }
        fn description(&self) -> &str {
            "echo"
        }
        fn parameters(&self) -> Value {
            json!({"type": "object"})
        }
        fn effect(&self) -> Effect {
            Effect::ReadOnly
        }
        async fn execute(&self, args: Value, _ctx: &ToolContext) -> Result<Value, ToolError> {
            if args.get("sleep").is_some() {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Ok(args)
        }
    }

    fn ctx() -> (ToolContext, tempfile::TempDir) {
        let d = tempfile::tempdir().unwrap();
        (
            ToolContext {
                workspace: Arc::new(Workspace::open(d.path()).unwrap()),
                session: SessionKey::parse("t:1").unwrap(),
                cancel: CancellationToken::new(),
                user_dir: None,
                sender: None,
                call_id: None,
                turn: Default::default(),
            },
            d,
        )
    }

    #[tokio::test]
    async fn schemas_sorted_and_duplicates_replace() {
        let mut r = ToolRegistry::new();
        r.register(Arc::new(EchoTool("zeta")));
        r.register(Arc::new(EchoTool("alpha")));
        r.register(Arc::new(EchoTool("alpha")));
        let names: Vec<_> = r.schemas().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["alpha", "zeta"]);
    }

    #[tokio::test]
    async fn errors_become_results_and_secrets_are_scrubbed() {
        let mut r = ToolRegistry::new().with_secrets(vec!["sk-live-123456".into()]);
        r.register(Arc::new(EchoTool("echo")));
        let (c, _d) = ctx();
        let o = r.dispatch("nope", "c1", "{}", &c).await;
        assert_eq!(o.error.as_ref().unwrap().code(), "NOT_FOUND");
        let v: Value = o.value.clone();
        assert_eq!(v["error_code"], "NOT_FOUND");
        assert!(v["error"].as_str().unwrap().contains("echo"));

        let o = r.dispatch("echo", "c2", "{not json", &c).await;
        assert_eq!(o.error.unwrap().code(), "INVALID_ARGS");

        let o = r
            .dispatch("echo", "c3", r#"{"k":"key sk-live-123456 here"}"#, &c)
            .await;
        assert!(o.error.is_none());
        assert_eq!(o.content(), r#"{"k":"key [REDACTED] here"}"#);
    }

    struct Source(Vec<SourcedTool>);
    impl ToolSource for Source {
        fn tools(&self) -> Vec<SourcedTool> {
            self.0.clone()
        }
    }

    #[tokio::test]
    async fn sources_internal_tools_and_skill_exposure() {
        let src = Source(vec![
            SourcedTool {
                tool: Arc::new(EchoTool("gh__open_issue")),
                internal: false,
            },
            SourcedTool {
                tool: Arc::new(EchoTool("mem__store")),
                internal: true,
            },
            // A source cannot shadow a built-in.
            SourcedTool {
                tool: Arc::new(EchoTool("echo")),
                internal: true,
            },
        ]);
        let mut r = ToolRegistry::new().with_source(Arc::new(src));
        r.register(Arc::new(EchoTool("echo")));
        let shown: Vec<_> = r.schemas().into_iter().map(|s| s.name).collect();
        assert_eq!(shown, ["echo", "gh__open_issue"]);
        let with_skill: Vec<_> = r
            .schemas_for_tools(&["mem__*".to_string()])
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(with_skill, ["echo", "gh__open_issue", "mem__store"]);
        let (c, _d) = ctx();
        let o = r.dispatch("mem__store", "c1", "{}", &c).await;
        assert_eq!(o.error.unwrap().code(), "PERMISSION_DENIED");
        let o = r
            .dispatch_with(
                "mem__store",
                "c2",
                r#"{"k":1}"#,
                &c,
                &["mem__*".to_string()],
            )
            .await;
        assert_eq!(o.content(), r#"{"k":1}"#);
        // The policy still wins over a skill.
        let r = r.with_policy(crate::tools::policy::ToolPolicy {
            global: crate::tools::policy::PolicyLayer {
                deny: vec![crate::tools::policy::Pattern::parse("group:mcp").unwrap()],
                ..Default::default()
            },
            ..Default::default()
        });
        let o = r
            .dispatch_with("mem__store", "c3", "{}", &c, &["mem__*".to_string()])
            .await;
        assert_eq!(o.error.unwrap().code(), "PERMISSION_DENIED");
        assert_eq!(r.allowed_names(), ["echo"]);
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_and_cancel() {
        let mut r = ToolRegistry::new().with_timeout(Duration::from_secs(5));
        r.register(Arc::new(EchoTool("echo")));
        let (c, _d) = ctx();
        let o = r.dispatch("echo", "c1", r#"{"sleep":1}"#, &c).await;
        assert_eq!(o.error.unwrap().code(), "TIMEOUT");
        c.cancel.cancel();
        let o = r.dispatch("echo", "c2", r#"{"sleep":1}"#, &c).await;
        assert_eq!(o.error.unwrap().code(), "CANCELLED");
    }
}
