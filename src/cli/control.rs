//! The control plane's rendezvous: `control.json` in the store directory. `weft gateway` writes
//! it at each start (mode 0600, a fresh random token, the API's address, its pid) and removes it
//! on a clean shutdown; the other `weft` commands read the one of *their* store to find and
//! authenticate to the gateway that owns it. Nothing here probes a port: no file, no gateway.
//!
//! The store directory is already out of reach of commands run by `exec_shell` (a protected
//! path of the sandbox), so the token is readable only by the operator's account.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::CliError;

/// File name of the control file inside the store directory.
pub const CONTROL_FILE: &str = "control.json";
/// Random bytes in a control token (256 bits, hex-encoded to 64 characters).
const TOKEN_BYTES: usize = 32;

/// What a running gateway tells the local CLI: where its API answers and the token it accepts.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlInfo {
    /// Address of the gateway's HTTP API (a wildcard bind is written as loopback).
    pub addr: SocketAddr,
    /// The gateway's process id (a file left by `kill -9` names a process that is gone).
    pub pid: u32,
    /// Bearer token accepted on every route; new at each start.
    pub token: String,
    /// The store directory the gateway owns (for the operator reading the file).
    pub store: PathBuf,
}

impl std::fmt::Debug for ControlInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlInfo")
            .field("addr", &self.addr)
            .field("pid", &self.pid)
            .field("token", &"***")
            .field("store", &self.store)
            .finish()
    }
}

/// `store/control.json`.
pub fn path(store: &Path) -> PathBuf {
    store.join(CONTROL_FILE)
}

/// Where a client reaches an API bound to `bind`: a wildcard address is reached on loopback.
pub fn reachable(mut bind: SocketAddr) -> SocketAddr {
    match bind.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => bind.set_ip(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        IpAddr::V6(ip) if ip.is_unspecified() => bind.set_ip(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        IpAddr::V4(_) | IpAddr::V6(_) => {}
    }
    bind
}

/// A fresh control token: 32 bytes from the kernel's CSPRNG (`getrandom(2)`), as hex.
///
/// # Errors
/// The kernel refused `getrandom`.
pub fn new_token() -> std::io::Result<String> {
    let mut buf = [0u8; TOKEN_BYTES];
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(clawft_channel_core::hex(&buf))
}

/// Write `info` to `store/control.json`, mode 0600, atomically: a 0600 temp file in the same
/// directory, renamed over the old one (a reader sees the old file or the new, never a partial
/// one, and the token never exists with wider permissions). Not synced: it only matters while
/// this gateway runs, and a gateway starting after a crash of the machine writes it again (an
/// fsync here was ~0.5 ms of every start).
///
/// # Errors
/// The store directory is not writable.
pub fn write(store: &Path, info: &ControlInfo) -> std::io::Result<()> {
    let tmp = store.join(format!(".{CONTROL_FILE}.{}.tmp", std::process::id()));
    // A temp file left by a crash of this pid's predecessor: never write through it.
    if let Err(e) = std::fs::remove_file(&tmp) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(e);
        }
    }
    let body = serde_json::to_vec_pretty(info).map_err(std::io::Error::other)?;
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&body)?;
        std::fs::rename(&tmp, path(store))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Remove `store/control.json` if it still holds `token` (it is ours).
pub fn remove(store: &Path, token: &str) {
    let p = path(store);
    match read(store) {
        Ok(Some(info)) if info.token == token => {
            if let Err(e) = std::fs::remove_file(&p) {
                tracing::warn!(path = %p.display(), error = %e, "cannot remove the control file");
            }
        }
        Ok(_) | Err(_) => {}
    }
}

/// The control file of `store`, `None` when there is none (no gateway runs for this store).
///
/// # Errors
/// The file exists but cannot be read (another user's store) or is not a control file.
pub fn read(store: &Path) -> Result<Option<ControlInfo>, CliError> {
    let p = path(store);
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(CliError::Failed(format!(
                "cannot read {} ({e}): run weft as the user that runs the gateway of this store",
                p.display()
            )))
        }
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        CliError::Failed(format!(
            "{} is not a control file ({e}): `weft gateway` rewrites it at each start; remove it if no gateway runs for this store",
            p.display()
        ))
    })
}

/// Whether process `pid` exists (a control file left behind by `kill -9` names a dead one).
pub fn pid_alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    // EPERM: it exists but belongs to another user.
    !matches!(
        rustix::process::test_kill_process(pid),
        Err(rustix::io::Errno::SRCH)
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn tokens_are_64_hex_characters_and_never_repeat() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn the_file_is_0600_replaced_whole_and_removed_only_by_its_owner() {
        let dir = tempfile::tempdir().unwrap();
        let info = |token: &str| ControlInfo {
            addr: "127.0.0.1:18790".parse().unwrap(),
            pid: std::process::id(),
            token: token.into(),
            store: dir.path().to_path_buf(),
        };
        assert_eq!(read(dir.path()).unwrap(), None);
        write(dir.path(), &info("first")).unwrap();
        write(dir.path(), &info("second")).unwrap();
        let meta = std::fs::metadata(path(dir.path())).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(read(dir.path()).unwrap(), Some(info("second")));
        // Only the control file is left (no temp file).
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(!format!("{:?}", info("second")).contains("second"));
        remove(dir.path(), "first");
        assert!(path(dir.path()).exists(), "removed another gateway's file");
        remove(dir.path(), "second");
        assert!(!path(dir.path()).exists());
    }

    #[test]
    fn a_corrupt_file_is_named_and_a_dead_pid_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path(dir.path()), "{").unwrap();
        let e = read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("control.json") && e.contains("remove it"), "{e}");
        assert!(pid_alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!pid_alive(pid));
        assert!(!pid_alive(0));
    }

    #[test]
    fn wildcard_binds_are_reached_on_loopback() {
        assert_eq!(
            reachable("0.0.0.0:5".parse().unwrap()),
            "127.0.0.1:5".parse().unwrap()
        );
        assert_eq!(
            reachable("[::]:5".parse().unwrap()),
            "[::1]:5".parse().unwrap()
        );
        assert_eq!(
            reachable("10.0.0.1:5".parse().unwrap()),
            "10.0.0.1:5".parse().unwrap()
        );
    }
}
