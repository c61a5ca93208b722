//! The agent's web browser: one headless Chromium per agent, driven over the DevTools
//! protocol on a pipe ([`cdp`]), started when a turn first needs it, closed after an idle
//! time, started again after a crash. Its only way out is the daemon's egress proxy with the
//! browser's own rules (`tools.browser.allow_private`, `allow_domains`): the same connect-time
//! guard as `web_fetch` and commands. The `browser` tool ([`tool::BrowserTool`]) drives it.

#[cfg(feature = "browser")]
pub mod cdp;
#[cfg(feature = "browser")]
pub mod session;
pub mod settings;
#[cfg(feature = "browser")]
pub mod tool;

pub use settings::{BrowserFile, BrowserSettings};

/// What `weft doctor` says about the browser.
pub fn doctor_line(settings: &BrowserSettings) -> (bool, String) {
    if !cfg!(feature = "browser") {
        return (
            true,
            "browser tool: not in this build (cargo feature `browser`)".into(),
        );
    }
    if !settings.enabled {
        return (
            true,
            "browser tool: off (tools.browser.enabled = false)".into(),
        );
    }
    match settings.find_executable() {
        Some(p) => {
            let st = crate::tools::exec::sandbox_status(&crate::tools::exec::ExecSettings::default());
            let net = if !settings.jail {
                "on the host's network, using its proxy by its flags (tools.browser.jail = false)".to_string()
            } else if st.jail.is_some_and(|j| j.pid_namespace) {
                "in the commands' jail (its own network namespace, out only through its proxy)".to_string()
            } else {
                format!("on the host's network, using its proxy by its flags: no namespaces here ({})", st.summary())
            };
            (
                true,
                format!(
                    "browser tool: Chromium at {}, {net}; it also renders canvas snapshots",
                    p.display()
                ),
            )
        }
        None => (
            false,
            match &settings.executable {
                Some(p) => format!(
                    "browser tool: tools.browser.executable {} does not exist; install Chromium (Debian/Ubuntu: apt install chromium)",
                    p.display()
                ),
                None => "browser tool: no Chromium found (looked in /usr/bin, /snap/bin); install it (Debian/Ubuntu: apt install chromium) to offer the browser tool".into(),
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doctor_says_how_to_install_a_browser() {
        let missing = BrowserSettings {
            executable: Some("/nonexistent/chromium".into()),
            ..BrowserSettings::default()
        };
        let (found, line) = doctor_line(&missing);
        if cfg!(feature = "browser") {
            assert!(!found);
            assert!(line.contains("apt install chromium"), "{line}");
        }
        let off = BrowserSettings {
            enabled: false,
            ..BrowserSettings::default()
        };
        assert!(doctor_line(&off).0);
    }
}
