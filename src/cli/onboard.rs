//! `weft onboard`: write a commented default config and create the workspace.

use std::path::{Path, PathBuf};

use super::CliError;
use crate::config::{clawft_home, Env};

/// The example config shipped in `config/`, written by onboard.
pub const EXAMPLE_CONFIG: &str = include_str!("../../config/clawft.example.toml");

/// Write the config (refusing to overwrite without `force`) and the workspace dirs. Returns the
/// paths written.
///
/// # Errors
/// The config exists (without `force`), or a file cannot be written.
pub fn run(config_path: Option<&Path>, env: &Env, force: bool) -> Result<Vec<PathBuf>, CliError> {
    let home = clawft_home(env);
    let path = config_path.map_or_else(|| home.join("config.toml"), Path::to_path_buf);
    let json_sibling = home.join("config.json");
    if !force && (path.exists() || (config_path.is_none() && json_sibling.exists())) {
        let existing = if path.exists() { &path } else { &json_sibling };
        return Err(CliError(format!(
            "{} already exists; not overwriting it (use --force to replace it)",
            existing.display()
        )));
    }
    let mut written = Vec::new();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| CliError(format!("{}: {e}", dir.display())))?;
    }
    std::fs::write(&path, EXAMPLE_CONFIG)
        .map_err(|e| CliError(format!("{}: {e}", path.display())))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    }
    written.push(path);
    let workspace = home.join("workspace");
    let memory = workspace.join("memory");
    std::fs::create_dir_all(&memory).map_err(|e| CliError(format!("{}: {e}", memory.display())))?;
    written.push(workspace);
    written.push(memory);
    Ok(written)
}
