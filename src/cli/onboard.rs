//! `weft onboard`: write a commented default config and create the workspace with its
//! context-file templates.

use std::path::{Path, PathBuf};

use super::CliError;
use crate::config::{clawft_home, Env};

/// The example config shipped in `config/`, written by onboard.
pub const EXAMPLE_CONFIG: &str = include_str!("../../config/clawft.example.toml");

/// Write the config (refusing to overwrite without `force`; with it, the previous file is kept
/// as `NAME.bak`, replacing an older backup) and the workspace dirs. Returns the paths written.
///
/// # Errors
/// The config exists (without `force`), or a file cannot be written.
pub fn run(config_path: Option<&Path>, env: &Env, force: bool) -> Result<Vec<PathBuf>, CliError> {
    let home = clawft_home(env);
    let path = config_path.map_or_else(|| home.join("config.toml"), Path::to_path_buf);
    let json_sibling = home.join("config.json");
    if !force && (path.exists() || (config_path.is_none() && json_sibling.exists())) {
        let existing = if path.exists() { &path } else { &json_sibling };
        return Err(CliError::Failed(format!(
            "{} already exists; not overwriting it (use --force to replace it)",
            existing.display()
        )));
    }
    let mut written = Vec::new();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| CliError::Failed(format!("{}: {e}", dir.display())))?;
    }
    if path.exists() {
        let mut bak = path.clone().into_os_string();
        bak.push(".bak");
        let bak = PathBuf::from(bak);
        // A copy keeps the original's 0600 mode; the config is not touched if this fails.
        std::fs::copy(&path, &bak).map_err(|e| {
            CliError::Failed(format!(
                "cannot back up {} to {}: {e}; nothing was overwritten",
                path.display(),
                bak.display()
            ))
        })?;
        println!("kept the previous config as {}", bak.display());
    }
    std::fs::write(&path, EXAMPLE_CONFIG)
        .map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    }
    written.push(path);
    let workspace = home.join("workspace");
    let memory = workspace.join("memory");
    std::fs::create_dir_all(&memory)
        .map_err(|e| CliError::Failed(format!("{}: {e}", memory.display())))?;
    written.push(workspace.clone());
    written.push(memory);
    written.extend(write_templates(&workspace)?);
    Ok(written)
}

/// The context-file templates onboard writes (also into a new agent's workspace).
pub use crate::turn::context::TEMPLATES;

/// Write the [`TEMPLATES`] missing from `workspace`; returns the files written.
fn write_templates(workspace: &Path) -> Result<Vec<PathBuf>, CliError> {
    crate::turn::context::write_templates(workspace)
        .map_err(|(path, e)| CliError::Failed(format!("{}: {e}", path.display())))
}
