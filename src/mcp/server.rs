//! MCP server mode (`weft mcp-server`): clawft's tools served to another MCP client over
//! stdio. Tools come from [`ToolProvider`]s; [`BuiltinProvider`] serves exactly what a
//! [`ToolRegistry`] shows and calls through [`ToolRegistry::dispatch`], so the tool policy,
//! sandbox, rate limit, secret scrubbing and truncation all apply. Nothing but protocol is
//! written to stdout: the caller must send logs to stderr.

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::tools::{ToolContext, ToolError, ToolRegistry, Workspace};
use crate::types::SessionKey;

/// Why the MCP server could not be set up or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum McpServerError {
    /// The fixed session key [`MCP_SERVER_SESSION`] was refused (a broken invariant).
    #[error(transparent)]
    SessionKey(#[from] crate::types::InvalidSessionKey),
    /// A provider namespace is empty or contains `__`.
    #[error("provider namespace `{0}` must be non-empty and must not contain `__`")]
    InvalidNamespace(String),
    /// Two providers of a [`CompositeProvider`] share a namespace.
    #[error("two providers share the namespace `{0}`")]
    DuplicateNamespace(String),
    /// The client's `initialize` handshake failed (boxed: rmcp's error is several hundred bytes).
    #[error("MCP handshake failed: {0}")]
    Handshake(#[source] Box<rmcp::service::ServerInitializeError>),
    /// The service task panicked or was aborted.
    #[error("the MCP server task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// Session key of calls made through the MCP server (rate limiting, logs).
pub const MCP_SERVER_SESSION: &str = "mcp:server";

/// A tool as listed by a provider.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDefinition {
    /// Name (unique within the provider).
    pub name: String,
    /// Description.
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub input_schema: Value,
}

/// The outcome of one call: JSON text, and whether it is an error (`isError: true`).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCallOutput {
    /// JSON text of the result, or of `{"error", "error_code"}`.
    pub text: String,
    /// Whether the call failed.
    pub is_error: bool,
}

impl ToolCallOutput {
    /// An error result from a [`ToolError`].
    pub fn error(e: &ToolError) -> Self {
        Self {
            text: e.to_json().to_string(),
            is_error: true,
        }
    }
}

/// Tools served over MCP (seed 001). `call_tool` gets a cancellation token that fires when
/// the client sends `notifications/cancelled` or disconnects.
#[async_trait]
pub trait ToolProvider: Send + Sync + 'static {
    /// Prefix used by [`CompositeProvider`] (`{namespace}__{tool}`).
    fn namespace(&self) -> &str;
    /// The tools offered now.
    fn list_tools(&self) -> Vec<ToolDefinition>;
    /// Call one.
    async fn call_tool(&self, name: &str, args: Value, cancel: CancellationToken)
        -> ToolCallOutput;
}

/// The registry's tools: exactly those [`ToolRegistry::schemas`] shows, called through
/// [`ToolRegistry::dispatch`] with session `mcp:server` in `workspace`.
pub struct BuiltinProvider {
    registry: Arc<ToolRegistry>,
    workspace: Arc<Workspace>,
    session: SessionKey,
    namespace: String,
    calls: std::sync::atomic::AtomicU64,
}

impl BuiltinProvider {
    /// Serve `registry`'s visible tools in `workspace`, namespace `clawft`.
    ///
    /// # Errors
    /// Never in practice (the fixed session key is valid); kept fallible for the key check.
    pub fn new(
        registry: Arc<ToolRegistry>,
        workspace: Arc<Workspace>,
    ) -> Result<Self, McpServerError> {
        Ok(Self {
            registry,
            workspace,
            session: SessionKey::parse(MCP_SERVER_SESSION)?,
            namespace: "clawft".into(),
            calls: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Another namespace (for [`CompositeProvider`]).
    pub fn with_namespace(mut self, ns: &str) -> Self {
        self.namespace = ns.to_string();
        self
    }
}

#[async_trait]
impl ToolProvider for BuiltinProvider {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn list_tools(&self) -> Vec<ToolDefinition> {
        self.registry
            .schemas()
            .into_iter()
            .map(|s| ToolDefinition {
                name: s.name,
                description: s.description,
                input_schema: s.parameters,
            })
            .collect()
    }

    async fn call_tool(
        &self,
        name: &str,
        args: Value,
        cancel: CancellationToken,
    ) -> ToolCallOutput {
        let ctx = ToolContext {
            workspace: self.workspace.clone(),
            session: self.session.clone(),
            cancel,
            user_dir: None,
            sender: None,
            call_id: None,
            turn: Default::default(),
        };
        let n = self
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let out = self
            .registry
            .dispatch(name, &format!("mcp-{n}"), &args.to_string(), &ctx)
            .await;
        ToolCallOutput {
            text: out.content(),
            is_error: out.error.is_some(),
        }
    }
}

/// Several providers behind one server: tools named `{namespace}__{tool}`, calls routed by
/// the prefix.
pub struct CompositeProvider {
    providers: Vec<Arc<dyn ToolProvider>>,
}

impl CompositeProvider {
    /// Compose `providers`.
    ///
    /// # Errors
    /// Two providers share a namespace, or a namespace contains `__` or is empty.
    pub fn new(providers: Vec<Arc<dyn ToolProvider>>) -> Result<Self, McpServerError> {
        let mut seen = std::collections::BTreeSet::new();
        for p in &providers {
            let ns = p.namespace();
            if ns.is_empty() || ns.contains("__") {
                return Err(McpServerError::InvalidNamespace(ns.to_string()));
            }
            if !seen.insert(ns.to_string()) {
                return Err(McpServerError::DuplicateNamespace(ns.to_string()));
            }
        }
        Ok(Self { providers })
    }
}

#[async_trait]
impl ToolProvider for CompositeProvider {
    fn namespace(&self) -> &str {
        "composite"
    }

    fn list_tools(&self) -> Vec<ToolDefinition> {
        self.providers
            .iter()
            .flat_map(|p| {
                let ns = p.namespace().to_string();
                p.list_tools().into_iter().map(move |t| ToolDefinition {
                    name: format!("{ns}__{}", t.name),
                    ..t
                })
            })
            .collect()
    }

    async fn call_tool(
        &self,
        name: &str,
        args: Value,
        cancel: CancellationToken,
    ) -> ToolCallOutput {
        let routed = name.split_once("__").and_then(|(ns, tool)| {
            self.providers
                .iter()
                .find(|p| p.namespace() == ns)
                .map(|p| (p, tool))
        });
        match routed {
            Some((p, tool)) => p.call_tool(tool, args, cancel).await,
            None => ToolCallOutput::error(&ToolError::NotFound(format!(
                "`{name}`; tools are named namespace__tool, namespaces: {}",
                self.providers
                    .iter()
                    .map(|p| p.namespace())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }
}

/// rmcp's view of a provider.
#[derive(Clone)]
struct McpServerHandler {
    provider: Arc<dyn ToolProvider>,
}

impl ServerHandler for McpServerHandler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("clawft", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self
            .provider
            .list_tools()
            .into_iter()
            .map(|t| {
                let schema = match t.input_schema {
                    Value::Object(m) => m,
                    _ => {
                        let mut m = Map::new();
                        m.insert("type".into(), Value::String("object".into()));
                        m
                    }
                };
                rmcp::model::Tool::new(t.name, t.description, Arc::new(schema))
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.unwrap_or_default());
        let out = self
            .provider
            .call_tool(&request.name, args, context.ct.clone())
            .await;
        let content = vec![ContentBlock::text(out.text)];
        Ok(if out.is_error {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        }
        .into())
    }
}

/// Serve `provider` over any transport rmcp accepts (tests use an in-memory pipe or a child's
/// pipes) until the client disconnects.
///
/// # Errors
/// The handshake failed or the service task panicked.
pub async fn serve<T, E, A>(
    provider: Arc<dyn ToolProvider>,
    transport: T,
) -> Result<(), McpServerError>
where
    T: rmcp::transport::IntoTransport<RoleServer, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let running = McpServerHandler { provider }
        .serve(transport)
        .await
        .map_err(|e| McpServerError::Handshake(Box::new(e)))?;
    running
        .waiting()
        .await
        .map(|_| ())
        .map_err(McpServerError::Task)
}

/// Serve `provider` on stdin/stdout until the client closes stdin.
///
/// # Errors
/// As [`serve`].
pub async fn serve_stdio(provider: Arc<dyn ToolProvider>) -> Result<(), McpServerError> {
    serve(provider, rmcp::transport::stdio()).await
}
