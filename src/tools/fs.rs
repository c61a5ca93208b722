//! File tools contained in the workspace by kernel-checked opens: `read_file`, `list_directory`.

use std::io::Read;

use async_trait::async_trait;
use rustix::fs::{AtFlags, Mode, OFlags};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{parse_args, schema_of, Effect, Tool, ToolContext, ToolError};

/// Most bytes `read_file` reads from one file (8 MiB); the result is truncated to 64 KiB later,
/// so `offset`/`limit` are how the model pages through a large file.
const READ_FILE_MAX_BYTES: u64 = 8 * 1024 * 1024;
/// Bytes inspected for NUL to decide that a file is binary.
const BINARY_SNIFF_BYTES: usize = 8192;

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ToolError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::ExecutionFailed(format!("file task failed: {e}")))?
}

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// File path relative to the workspace.
    pub path: String,
    /// First line to return, 1-based (default: 1).
    pub offset: Option<u64>,
    /// Maximum number of lines to return (default: all).
    pub limit: Option<u64>,
}

/// `read_file`: the contents of a text file in the workspace.
pub struct ReadFile;

#[async_trait]
impl Tool for ReadFile {
    fn name(&self) -> &str {
        "read_file"
    }
    fn description(&self) -> &str {
        "Read a text file in the workspace. Optional offset/limit select lines. Returns: {content, total_lines, truncated}"
    }
    fn parameters(&self) -> Value {
        schema_of::<ReadFileArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: ReadFileArgs = parse_args(self.name(), args)?;
        if a.offset == Some(0) {
            return Err(ToolError::InvalidArgs(
                "offset is 1-based: use 1 for the first line".into(),
            ));
        }
        let ws = ctx.workspace.clone();
        blocking(move || {
            let fd = ws.open_beneath(&a.path, OFlags::RDONLY, Mode::empty())?;
            let mut file = std::fs::File::from(fd);
            let meta = file
                .metadata()
                .map_err(|e| ToolError::ExecutionFailed(format!("{}: {e}", a.path)))?;
            if meta.is_dir() {
                return Err(ToolError::InvalidArgs(format!(
                    "`{}` is a directory: use list_directory",
                    a.path
                )));
            }
            let mut buf = Vec::new();
            (&mut file)
                .take(READ_FILE_MAX_BYTES)
                .read_to_end(&mut buf)
                .map_err(|e| ToolError::ExecutionFailed(format!("{}: {e}", a.path)))?;
            let cut_by_size = meta.len() > READ_FILE_MAX_BYTES;
            if buf[..buf.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
                return Err(ToolError::BinaryFile(format!(
                    "`{}` is a binary file ({} bytes); it cannot be read as text",
                    a.path,
                    meta.len()
                )));
            }
            let text = String::from_utf8_lossy(&buf);
            let lines: Vec<&str> = text.split_inclusive('\n').collect();
            let total = lines.len() as u64;
            let start = a.offset.unwrap_or(1).saturating_sub(1);
            let take = a.limit.unwrap_or(u64::MAX);
            let selected: String = lines
                .iter()
                .skip(usize::try_from(start).unwrap_or(usize::MAX))
                .take(usize::try_from(take).unwrap_or(usize::MAX))
                .copied()
                .collect();
            let truncated = cut_by_size || start.saturating_add(take) < total;
            Ok(json!({
                "content": selected,
                "total_lines": total,
                "truncated": truncated,
            }))
        })
        .await
    }
}

/// Arguments of `list_directory`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirectoryArgs {
    /// Directory path relative to the workspace (`.` for the root).
    pub path: String,
}

/// `list_directory`: immediate children of a workspace directory, sorted by name.
pub struct ListDirectory;

#[async_trait]
impl Tool for ListDirectory {
    fn name(&self) -> &str {
        "list_directory"
    }
    fn description(&self) -> &str {
        "List the immediate children of a directory in the workspace, sorted by name. Returns: {entries: [{name, is_dir, size}]}"
    }
    fn parameters(&self) -> Value {
        schema_of::<ListDirectoryArgs>()
    }
    fn effect(&self) -> Effect {
        Effect::ReadOnly
    }
    async fn execute(&self, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let a: ListDirectoryArgs = parse_args(self.name(), args)?;
        let ws = ctx.workspace.clone();
        blocking(move || {
            let fd = ws.open_beneath(&a.path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
            let dir = rustix::fs::Dir::read_from(&fd)
                .map_err(|e| super::workspace::map_errno(&a.path, e))?;
            let mut entries = Vec::new();
            for ent in dir {
                let ent = ent.map_err(|e| super::workspace::map_errno(&a.path, e))?;
                let name = ent.file_name().to_string_lossy().into_owned();
                if name == "." || name == ".." {
                    continue;
                }
                let st = rustix::fs::statat(&fd, ent.file_name(), AtFlags::SYMLINK_NOFOLLOW).ok();
                let is_dir = st
                    .as_ref()
                    .is_some_and(|s| rustix::fs::FileType::from_raw_mode(s.st_mode).is_dir());
                let size = st.map_or(0, |s| u64::try_from(s.st_size).unwrap_or(0));
                entries.push(json!({ "name": name, "is_dir": is_dir, "size": size }));
            }
            entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            Ok(json!({ "entries": entries }))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::sync::Arc;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::ingress::SessionKey;
    use crate::tools::Workspace;

    fn ctx(dir: &std::path::Path) -> ToolContext {
        ToolContext {
            workspace: Arc::new(Workspace::open(dir).unwrap()),
            session: SessionKey::parse("t:1").unwrap(),
            cancel: CancellationToken::new(),
        }
    }

    #[tokio::test]
    async fn read_file_pages_and_refuses_escapes() {
        let root = tempfile::tempdir().unwrap();
        let ws = root.path().join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(ws.join("a.txt"), "one\ntwo\nthree\n").unwrap();
        std::fs::write(root.path().join("secret.txt"), "top secret").unwrap();
        std::os::unix::fs::symlink(root.path().join("secret.txt"), ws.join("link")).unwrap();
        std::fs::write(ws.join("bin"), b"\x7fELF\0\0\x01").unwrap();
        let c = ctx(&ws);

        let v = ReadFile
            .execute(json!({"path": "a.txt", "offset": 2, "limit": 1}), &c)
            .await
            .unwrap();
        assert_eq!(
            v,
            json!({"content": "two\n", "total_lines": 3, "truncated": true})
        );

        for bad in ["../secret.txt", "link", "sub/../../secret.txt"] {
            let e = ReadFile
                .execute(json!({ "path": bad }), &c)
                .await
                .unwrap_err();
            assert_eq!(e.code(), "INVALID_PATH", "{bad}: {e}");
        }
        let abs = root.path().join("secret.txt");
        let e = ReadFile
            .execute(json!({ "path": abs.to_str().unwrap() }), &c)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_PATH");
        let e = ReadFile
            .execute(json!({"path": "nope"}), &c)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "FILE_NOT_FOUND");
        let e = ReadFile
            .execute(json!({"path": "bin"}), &c)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "BINARY_FILE");
        let e = ReadFile
            .execute(json!({"file": "a.txt"}), &c)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_ARGS");
    }

    #[tokio::test]
    async fn list_directory_is_sorted_and_contained() {
        let root = tempfile::tempdir().unwrap();
        let ws = root.path().join("ws");
        std::fs::create_dir_all(ws.join("zdir")).unwrap();
        std::fs::write(ws.join("b.txt"), "12345").unwrap();
        std::fs::write(ws.join("a.txt"), "1").unwrap();
        let c = ctx(&ws);
        let mut v = ListDirectory
            .execute(json!({"path": "."}), &c)
            .await
            .unwrap();
        // A directory's size depends on the filesystem.
        v["entries"][2]["size"] = json!(0);
        assert_eq!(
            v,
            json!({"entries": [
                {"name": "a.txt", "is_dir": false, "size": 1},
                {"name": "b.txt", "is_dir": false, "size": 5},
                {"name": "zdir", "is_dir": true, "size": 0},
            ]})
        );
        let e = ListDirectory
            .execute(json!({"path": ".."}), &c)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_PATH");
        let e = ListDirectory
            .execute(json!({"path": "/"}), &c)
            .await
            .unwrap_err();
        assert_eq!(e.code(), "INVALID_PATH");
    }
}
