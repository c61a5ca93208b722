//! The built-in base text of the system prompt; the workspace's context files follow it
//! (`turn::context`).

use std::path::Path;

/// The default system prompt for a workspace.
pub fn system_prompt(custom: Option<&str>, workspace: &Path) -> String {
    if let Some(c) = custom {
        return c.to_string();
    }
    format!(
        "You are weft, a helpful assistant reached through a chat channel. \
Use your tools when they help. \
File tools work inside the workspace directory {}; give paths relative to it. \
A tool result with an `error` field failed: read `error_code`, then fix the arguments or try another way. \
Keep replies concise and use Markdown sparingly.",
        workspace.display()
    )
}
