//! The `canvas` tool (seed 004, group `ui`): the agent presents a visual page (HTML, or
//! Markdown rendered to HTML) to the person it works for, shown next to the chat in the
//! control UI. One canvas per session, kept in the store (it survives a restart), at most
//! [`MAX_BYTES`]. The UI serves it in a sandboxed frame of its own opaque origin: its scripts
//! cannot read the UI's cookie, call the API or reach the network.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{parse_args, Effect, Tool, ToolContext, ToolError};
use crate::store::Store;

/// Store namespace of the canvases: key = session key.
pub const NS: &str = "canvas";
/// Largest canvas page, in bytes (256 KiB).
pub const MAX_BYTES: usize = 256 * 1024;

/// What a session's canvas holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Canvas {
    /// The page's title.
    pub title: String,
    /// The page (HTML).
    pub html: String,
    /// Whether it is shown (`hide` keeps the page, unshown).
    pub visible: bool,
    /// Bumped at each change (the UI reloads the frame when it moves).
    pub version: u64,
    /// When it last changed.
    pub updated_ms: u64,
}

/// The canvas of `session` as JSON (`{"visible": false}` when there is none).
///
/// # Errors
/// The store failed.
pub fn canvas_json(store: &Store, session: &str) -> Result<Value, crate::store::StoreError> {
    Ok(match load(store, session)? {
        Some(c) => serde_json::to_value(c).unwrap_or_default(),
        None => json!({"visible": false, "version": 0}),
    })
}

fn load(store: &Store, session: &str) -> Result<Option<Canvas>, crate::store::StoreError> {
    Ok(store
        .state_get(NS, session)?
        .and_then(|s| serde_json::from_str(&s).ok()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    action: String,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    html: Option<String>,
    #[serde(default)]
    markdown: Option<String>,
}

/// Size of a snapshot, in CSS pixels (a desktop window's).
pub const SNAPSHOT_WIDTH: u32 = 1024;
/// See [`SNAPSHOT_WIDTH`].
pub const SNAPSHOT_HEIGHT: u32 = 768;

/// Renders a canvas page to a PNG: the browser tool's Chromium, when one is configured.
#[async_trait]
pub trait Renderer: Send + Sync + 'static {
    /// A PNG of `html` at `width`×`height`.
    ///
    /// # Errors
    /// The browser could not start or render it; the text says why.
    async fn png(&self, html: &str, width: u32, height: u32) -> Result<Vec<u8>, String>;
}

/// The `canvas` tool.
pub struct CanvasTool {
    store: Store,
    renderer: Option<std::sync::Arc<dyn Renderer>>,
}

impl CanvasTool {
    /// The tool over `store` (`snapshot` is "not available" without [`Self::with_renderer`]).
    pub fn new(store: Store) -> Self {
        Self {
            store,
            renderer: None,
        }
    }

    /// `snapshot` renders through `r`.
    #[must_use]
    pub fn with_renderer(mut self, r: std::sync::Arc<dyn Renderer>) -> Self {
        self.renderer = Some(r);
        self
    }

    /// `snapshot`: a PNG of what is shown, saved in the workspace (`canvas/snapshot-….png`)
    /// and given to a model that can see as the result's image.
    async fn snapshot(&self, shown: Option<Canvas>, ctx: &ToolContext) -> Result<Value, ToolError> {
        let Some(r) = &self.renderer else {
            return Err(ToolError::ExecutionFailed(
                "snapshot is not available: no browser is configured for this gateway (the canvas is shown in the control UI; describe it instead)".into(),
            ));
        };
        let Some(c) = shown.filter(|c| c.visible) else {
            return Err(ToolError::InvalidArgs(
                "nothing is shown in this session's canvas: `present` a page first".into(),
            ));
        };
        let png = r
            .png(&c.html, SNAPSHOT_WIDTH, SNAPSHOT_HEIGHT)
            .await
            .map_err(|e| ToolError::ExecutionFailed(format!("snapshot failed: {e}")))?;
        let ms = clawft_channel_core::now_ms();
        let rel = format!("canvas/snapshot-{ms}-{:04x}.png", fastrand::u16(..));
        let (dir, name) = ctx.workspace.open_parent(&rel, true)?;
        super::workspace::write_atomic(&dir, &name, &png, 0o644, None, &rel)?;
        Ok(json!({
            "action": "snapshot",
            "title": c.title,
            "version": c.version,
            "path": rel,
            // A model that can see gets the picture for the rest of the turn.
            "image": rel,
            "bytes": png.len(),
            "width": SNAPSHOT_WIDTH,
            "height": SNAPSHOT_HEIGHT,
        }))
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Markdown to HTML, the common part: headings, lists, fenced code, paragraphs (text escaped).
pub fn markdown_to_html(md: &str) -> String {
    let mut out = String::new();
    let mut para: Vec<&str> = Vec::new();
    let mut in_list = false;
    let mut in_code = false;
    let flush = |out: &mut String, para: &mut Vec<&str>| {
        if !para.is_empty() {
            out.push_str(&format!("<p>{}</p>\n", escape(&para.join(" "))));
            para.clear();
        }
    };
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            flush(&mut out, &mut para);
            out.push_str(if in_code {
                "</code></pre>\n"
            } else {
                "<pre><code>"
            });
            in_code = !in_code;
            continue;
        }
        if in_code {
            out.push_str(&escape(line));
            out.push('\n');
            continue;
        }
        let t = line.trim();
        let item = t.strip_prefix("- ").or_else(|| t.strip_prefix("* "));
        if in_list && item.is_none() {
            out.push_str("</ul>\n");
            in_list = false;
        }
        if let Some(item) = item {
            flush(&mut out, &mut para);
            if !in_list {
                out.push_str("<ul>\n");
                in_list = true;
            }
            out.push_str(&format!("<li>{}</li>\n", escape(item)));
        } else if let Some((level, text)) = (1..=6).rev().find_map(|n| {
            t.strip_prefix(&format!("{} ", "#".repeat(n)))
                .map(|r| (n, r))
        }) {
            flush(&mut out, &mut para);
            out.push_str(&format!("<h{level}>{}</h{level}>\n", escape(text)));
        } else if t.is_empty() {
            flush(&mut out, &mut para);
        } else {
            para.push(t);
        }
    }
    flush(&mut out, &mut para);
    if in_list {
        out.push_str("</ul>\n");
    }
    if in_code {
        out.push_str("</code></pre>\n");
    }
    out
}

/// A whole page from the tool's arguments.
fn page(title: &str, html: Option<String>, markdown: Option<String>) -> Result<String, ToolError> {
    let body = match (html, markdown) {
        (Some(h), None) => h,
        (None, Some(m)) => markdown_to_html(&m),
        _ => {
            return Err(ToolError::InvalidArgs(
                "give the page as exactly one of `html` or `markdown`".into(),
            ))
        }
    };
    if body
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("<!doctype")
    {
        return Ok(body);
    }
    Ok(format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{}</title></head><body>{body}</body></html>",
        escape(title)
    ))
}

#[async_trait]
impl Tool for CanvasTool {
    fn name(&self) -> &str {
        crate::tools::builtin::Builtin::Canvas.name()
    }
    fn description(&self) -> &str {
        "Show a visual page to the person in the control UI's canvas, next to the chat: present (a new page: title plus html or markdown), update (replace the page), hide, snapshot (a PNG of it, when a browser is configured). Scripts in the page run sandboxed, without network. Returns: the canvas's state."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["present", "update", "hide", "snapshot"]},
                "title": {"type": "string"},
                "html": {"type": "string", "description": "The page as HTML (inline script and style allowed)."},
                "markdown": {"type": "string", "description": "The page as Markdown, instead of html."}
            },
            "required": ["action"]
        })
    }
    fn effect(&self) -> Effect {
        Effect::Writes
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: Args = parse_args(self.name(), args)?;
        let key = ctx.session.as_str().to_string();
        let failed =
            |e: crate::store::StoreError| ToolError::ExecutionFailed(format!("store: {e}"));
        let old = load(&self.store, &key).map_err(failed)?;
        let mut c = match (a.action.as_str(), old) {
            ("present", old) => {
                let title = a.title.unwrap_or_default();
                Canvas {
                    html: page(&title, a.html, a.markdown)?,
                    title,
                    visible: true,
                    version: old.map_or(0, |o| o.version),
                    updated_ms: 0,
                }
            }
            ("update", Some(mut c)) => {
                if let Some(t) = a.title {
                    c.title = t;
                }
                c.html = page(&c.title, a.html, a.markdown)?;
                c.visible = true;
                c
            }
            ("hide", Some(mut c)) => {
                c.visible = false;
                c
            }
            ("update" | "hide", None) => {
                return Err(ToolError::InvalidArgs(
                    "this session's canvas is empty: `present` a page first".into(),
                ))
            }
            ("snapshot", old) => return self.snapshot(old, ctx).await,
            (other, _) => {
                return Err(ToolError::InvalidArgs(format!(
                    "unknown action `{other}`; one of present, update, hide, snapshot"
                )))
            }
        };
        if c.html.len() > MAX_BYTES {
            return Err(ToolError::InvalidArgs(format!(
                "the page is {} bytes; a canvas holds at most {} KB: make it smaller",
                c.html.len(),
                MAX_BYTES / 1024
            )));
        }
        c.version += 1;
        c.updated_ms = clawft_channel_core::now_ms();
        let text =
            serde_json::to_string(&c).map_err(|e| ToolError::ExecutionFailed(e.to_string()))?;
        // Durable before the answer, without holding the runtime while the disk flushes.
        self.store
            .state_put_unflushed(NS, &key, Some(&text))
            .map_err(failed)?;
        self.store.flush_ticket().await.map_err(failed)?;
        self.store.announce(
            NS,
            &key,
            json!({"visible": c.visible, "version": c.version, "title": c.title}),
        );
        Ok(json!({
            "action": a.action,
            "visible": c.visible,
            "title": c.title,
            "bytes": c.html.len(),
            "version": c.version,
            "shown_at": format!("the control UI's chat page of session {key}"),
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::Arc;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::tools::Workspace;
    use crate::types::SessionKey;

    fn ctx(dir: &std::path::Path, session: &str) -> ToolContext {
        ToolContext {
            workspace: Arc::new(Workspace::open(dir).unwrap()),
            session: SessionKey::parse(session).unwrap(),
            cancel: CancellationToken::new(),
            user_dir: None,
            sender: None,
            call_id: None,
            turn: Default::default(),
        }
    }

    #[tokio::test]
    async fn present_update_hide_per_session_with_a_size_limit() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::memory();
        let t = CanvasTool::new(store.clone());
        let a = ctx(dir.path(), "web:a");
        let b = ctx(dir.path(), "web:b");
        // Nothing to update or hide yet.
        let e = t
            .execute(json!({"action": "update", "html": "x"}), &a)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("present"), "{e}");
        let v = t
            .execute(
                json!({"action": "present", "title": "T", "markdown": "# Plan\n\n- one <b>\n- two"}),
                &a,
            )
            .await
            .unwrap();
        assert_eq!(v["version"], 1);
        let shown = canvas_json(&store, "web:a").unwrap();
        let html = shown["html"].as_str().unwrap();
        assert!(
            html.contains("<h1>Plan</h1>") && html.contains("<li>one &lt;b&gt;</li>"),
            "{html}"
        );
        assert_eq!(canvas_json(&store, "web:b").unwrap()["visible"], false);
        t.execute(json!({"action": "hide"}), &a).await.unwrap();
        assert_eq!(canvas_json(&store, "web:a").unwrap()["visible"], false);
        // Too big: refused, the old page kept.
        let big = "x".repeat(MAX_BYTES + 1);
        let e = t
            .execute(json!({"action": "update", "html": big}), &a)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("at most 256 KB"), "{e}");
        assert!(canvas_json(&store, "web:a").unwrap()["html"]
            .as_str()
            .unwrap()
            .contains("Plan"));
        // Both html and markdown, or neither: refused.
        assert!(t
            .execute(
                json!({"action": "present", "html": "a", "markdown": "b"}),
                &b
            )
            .await
            .is_err());
        let e = t
            .execute(json!({"action": "snapshot"}), &b)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("not available"), "{e}");
    }

    /// A disk whose flushes take 300 ms (an SD card): the write is in memory at once.
    #[derive(Default)]
    struct SlowDisk(crate::store::kv::MemKv);

    impl crate::store::kv::Kv for SlowDisk {
        fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, crate::store::StoreError> {
            self.0.get(key)
        }
        fn scan_prefix(
            &self,
            prefix: &[u8],
        ) -> Result<crate::store::kv::Pairs, crate::store::StoreError> {
            self.0.scan_prefix(prefix)
        }
        fn apply(&self, ops: Vec<crate::store::kv::Op>) -> Result<(), crate::store::StoreError> {
            self.0.apply(ops)
        }
        fn flush(&self) -> Result<(), crate::store::StoreError> {
            std::thread::sleep(std::time::Duration::from_millis(300));
            self.0.flush()
        }
        fn next_id(&self) -> Result<u64, crate::store::StoreError> {
            self.0.next_id()
        }
        fn size_on_disk(&self) -> u64 {
            0
        }
    }

    /// Presenting a page waits for its flush without holding the runtime's only thread: the
    /// other tasks (another chat's turn) keep running meanwhile.
    #[tokio::test(flavor = "current_thread")]
    async fn presenting_leaves_the_runtime_free_while_the_disk_flushes() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::with_kv(Arc::new(SlowDisk::default()));
        let t = CanvasTool::new(store.clone());
        let a = ctx(dir.path(), "web:a");
        let ticks = Arc::new(AtomicU32::new(0));
        let counted = ticks.clone();
        let other = tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                counted.fetch_add(1, Ordering::Relaxed);
            }
        });
        tokio::task::yield_now().await;
        let started = std::time::Instant::now();
        t.execute(json!({"action": "present", "html": "<p>hi</p>"}), &a)
            .await
            .unwrap();
        assert!(
            started.elapsed() >= std::time::Duration::from_millis(300),
            "answered before the page was durable"
        );
        other.abort();
        assert!(
            ticks.load(Ordering::Relaxed) >= 10,
            "the runtime was held during the flush: {} ticks",
            ticks.load(Ordering::Relaxed)
        );
        assert_eq!(canvas_json(&store, "web:a").unwrap()["version"], 1);
    }
}
