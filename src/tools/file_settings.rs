//! The settings of the workspace file-tool family (file, search and memory tools: limits,
//! the `tools.files` section) and what its tools share: the blocking-pool runner, the size of
//! the binary sniff and of a `read_file` read. A leaf: every file tool reads it, it reads none.

use serde::{Deserialize, Serialize};

use super::ToolError;
use crate::types::SettingError;

/// Most bytes `read_file` reads from one file (8 MiB); the result is truncated to 64 KiB later,
/// so `offset`/`limit` are how the model pages through a large file.
pub(crate) const READ_FILE_MAX_BYTES: u64 = 8 * 1024 * 1024;
/// Bytes inspected for NUL to decide that a file is binary.
pub(crate) const BINARY_SNIFF_BYTES: usize = 8192;

/// Run blocking file work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ToolError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::ExecutionFailed(format!("file task failed: {e}")))?
}

/// Resolved limits of the file, search and memory tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileToolsSettings {
    /// Largest `content` `write_file` accepts, and largest result of `edit_file` (bytes).
    pub max_write_bytes: u64,
    /// Largest file `edit_file` (and a `write_file` backup) reads (bytes).
    pub max_edit_bytes: u64,
    /// Most files `glob`/`grep` look at in one call.
    pub search_max_files: usize,
    /// Bytes of each file `grep` searches (the rest of a larger file is not searched).
    pub search_max_file_bytes: u64,
    /// Longest line (characters) `grep` returns; longer ones are cut with a marker.
    pub search_max_line_chars: usize,
    /// Largest memory file read or written (bytes).
    pub memory_max_bytes: u64,
}

/// Default of [`FileToolsSettings::max_write_bytes`]: 16 MiB.
pub const DEFAULT_MAX_WRITE_BYTES: u64 = 16 * 1024 * 1024;
/// Default of [`FileToolsSettings::max_edit_bytes`]: 8 MiB, as `read_file`.
pub const DEFAULT_MAX_EDIT_BYTES: u64 = READ_FILE_MAX_BYTES;
/// Default of [`FileToolsSettings::search_max_files`]: 20 000 files.
pub const DEFAULT_SEARCH_MAX_FILES: usize = 20_000;
/// Default of [`FileToolsSettings::search_max_file_bytes`]: 8 MiB.
pub const DEFAULT_SEARCH_MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;
/// Default of [`FileToolsSettings::search_max_line_chars`]: 500 characters.
pub const DEFAULT_SEARCH_MAX_LINE_CHARS: usize = 500;
/// Default of [`FileToolsSettings::memory_max_bytes`]: 1 MiB.
pub const DEFAULT_MEMORY_MAX_BYTES: u64 = 1024 * 1024;

impl Default for FileToolsSettings {
    fn default() -> Self {
        Self {
            max_write_bytes: DEFAULT_MAX_WRITE_BYTES,
            max_edit_bytes: DEFAULT_MAX_EDIT_BYTES,
            search_max_files: DEFAULT_SEARCH_MAX_FILES,
            search_max_file_bytes: DEFAULT_SEARCH_MAX_FILE_BYTES,
            search_max_line_chars: DEFAULT_SEARCH_MAX_LINE_CHARS,
            memory_max_bytes: DEFAULT_MEMORY_MAX_BYTES,
        }
    }
}

/// Config section `tools.files` (raw, as written in the config file).
#[derive(Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileToolsFile {
    /// Largest content `write_file` accepts / `edit_file` produces, in bytes (default: 16777216).
    pub max_write_bytes: Option<u64>,
    /// Largest file `edit_file` reads, in bytes (default: 8388608).
    pub max_edit_bytes: Option<u64>,
    /// Most files `glob` and `grep` examine per call (default: 20000).
    pub search_max_files: Option<usize>,
    /// Bytes of each file `grep` searches (default: 8388608).
    pub search_max_file_bytes: Option<u64>,
    /// Longest line in `grep` results, in characters (default: 500).
    pub search_max_line_chars: Option<usize>,
    /// Largest memory file `memory_read`/`memory_write` handle, in bytes (default: 1048576).
    pub memory_max_bytes: Option<u64>,
}

impl FileToolsFile {
    /// Validate and fill defaults.
    ///
    /// # Errors
    /// Names the key (`tools.files.KEY`) and what is expected when a value is 0 or too large.
    pub fn resolve(&self) -> Result<FileToolsSettings, SettingError> {
        fn pick<T: Copy + PartialOrd + From<u8> + std::fmt::Display>(
            key: &str,
            v: Option<T>,
            default: T,
            max: T,
        ) -> Result<T, SettingError> {
            match v {
                None => Ok(default),
                Some(x) if x >= T::from(1u8) && x <= max => Ok(x),
                // The key as users have always seen it: with the rejected value.
                Some(x) => Err(SettingError::new(
                    format!("tools.files.{key} = {x}"),
                    format!("expected a number from 1 to {max}"),
                )),
            }
        }
        const GIB: u64 = 1024 * 1024 * 1024;
        Ok(FileToolsSettings {
            max_write_bytes: pick(
                "max_write_bytes",
                self.max_write_bytes,
                DEFAULT_MAX_WRITE_BYTES,
                GIB,
            )?,
            max_edit_bytes: pick(
                "max_edit_bytes",
                self.max_edit_bytes,
                DEFAULT_MAX_EDIT_BYTES,
                GIB,
            )?,
            search_max_files: pick(
                "search_max_files",
                self.search_max_files,
                DEFAULT_SEARCH_MAX_FILES,
                10_000_000,
            )?,
            search_max_file_bytes: pick(
                "search_max_file_bytes",
                self.search_max_file_bytes,
                DEFAULT_SEARCH_MAX_FILE_BYTES,
                GIB,
            )?,
            search_max_line_chars: pick(
                "search_max_line_chars",
                self.search_max_line_chars,
                DEFAULT_SEARCH_MAX_LINE_CHARS,
                1_000_000,
            )?,
            memory_max_bytes: pick(
                "memory_max_bytes",
                self.memory_max_bytes,
                DEFAULT_MEMORY_MAX_BYTES,
                GIB,
            )?,
        })
    }
}
