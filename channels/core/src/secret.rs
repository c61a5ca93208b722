//! [`Secret`]: a credential whose `Debug` never shows it. A leaf type: the gateway's config
//! makes them (secrets by indirection), the platform crates' settings hold them, the scrubber
//! is given every one. Holds no behaviour that reads or prints the value.

use std::fmt;
use std::path::{Path, PathBuf};

/// A secret value. Its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String, Option<PathBuf>);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into(), None)
    }
    /// Wraps a secret read from the file `path` (`*_file`): the file is one of the daemon's
    /// protected paths.
    pub fn from_file(s: impl Into<String>, path: PathBuf) -> Self {
        Self(s.into(), Some(path))
    }
    /// The secret itself. Call only where it is sent to its destination.
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// The file it was read from, if any.
    pub fn file(&self) -> Option<&Path> {
        self.1.as_deref()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}
