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

/// The context-file templates onboard writes (`turn::context`), never over an existing file.
pub const TEMPLATES: &[(&str, &str)] = &[
    (
        "SOUL.md",
        "# Soul\n\nYour persona and tone. Edit freely.\n\n\
         - Be direct and friendly; skip filler and flattery.\n\
         - Say so when you are unsure, and check facts with your tools.\n\
         - Ask before doing anything destructive or hard to undo.\n",
    ),
    (
        "IDENTITY.md",
        "# Identity\n\n- Name: weft\n- What you are: a personal assistant reached through chat, \
         running on the operator's own machine.\n",
    ),
    (
        "AGENTS.md",
        "# Operating instructions\n\n\
         - Keep notes worth remembering with `memory_write`; read them with `memory_read`.\n\
         - Work in the workspace with relative paths.\n\
         - Prefer one clear answer over several partial ones.\n",
    ),
    (
        "USER.md",
        "# User\n\nWho you work for. Fill in what helps:\n\n- Name:\n- Time zone:\n\
         - Language:\n- Preferences:\n",
    ),
    (
        "BOOTSTRAP.md",
        "# First run\n\nThis file is shown to you until it is deleted. In your first \
         conversation: introduce yourself, ask the user their name, time zone and how they like \
         answers, write what you learn into USER.md (and your chosen name into IDENTITY.md), \
         then delete this file.\n",
    ),
];

/// Write the [`TEMPLATES`] missing from `workspace`; returns the files written.
/// `BOOTSTRAP.md` only into a fresh workspace (none of the templates there yet): once deleted
/// after the first run, a later `onboard --force` does not start a first run again.
fn write_templates(workspace: &Path) -> Result<Vec<PathBuf>, CliError> {
    let fresh = TEMPLATES.iter().all(|(n, _)| !workspace.join(n).exists());
    let mut written = Vec::new();
    for (name, text) in TEMPLATES {
        if *name == "BOOTSTRAP.md" && !fresh {
            continue;
        }
        let path = workspace.join(name);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path);
        match file {
            Ok(mut f) => {
                use std::io::Write;
                f.write_all(text.as_bytes())
                    .map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))?;
                written.push(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(CliError::Failed(format!("{}: {e}", path.display()))),
        }
    }
    Ok(written)
}
