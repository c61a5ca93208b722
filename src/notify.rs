//! A minimal `sd_notify(3)` client: one datagram per state change to the service manager's
//! socket (`$NOTIFY_SOCKET`, resolved by `config`), no new crates. Every call is a no-op
//! without a socket, and a failed send is logged once at debug level, never fatal: the
//! gateway must run the same with or without systemd.

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Sends `READY=1`, `STATUS=…`, `WATCHDOG=1` and `STOPPING=1` to the service manager.
#[derive(Clone, Debug, Default)]
pub struct Notifier {
    socket: Option<PathBuf>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// A notifier for `socket` (`None`: every call is a no-op) with the watchdog ping interval
    /// (`Config::watchdog`, already halved).
    pub fn new(socket: Option<PathBuf>, watchdog: Option<Duration>) -> Self {
        Self { socket, watchdog }
    }

    /// Whether a notification socket is configured.
    pub fn enabled(&self) -> bool {
        self.socket.is_some()
    }

    /// The interval at which `WATCHDOG=1` must be sent, when the service manager asked for it.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog
    }

    /// `READY=1`: startup finished (channels up, API bound).
    pub fn ready(&self) {
        self.send("READY=1");
    }

    /// `STATUS=line`: a one-line state shown by `systemctl status` (newlines become spaces).
    pub fn status(&self, line: &str) {
        let line: String = line
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        self.send(&format!("STATUS={line}"));
    }

    /// `STOPPING=1`: shutdown began.
    pub fn stopping(&self) {
        self.send("STOPPING=1");
    }

    /// `WATCHDOG=1`: still alive.
    pub fn watchdog(&self) {
        self.send("WATCHDOG=1");
    }

    fn send(&self, msg: &str) {
        let Some(path) = &self.socket else { return };
        if let Err(e) = send_to(path, msg.as_bytes()) {
            tracing::debug!(socket = %path.display(), error = %e, msg, "sd_notify failed");
        }
    }
}

/// Send one datagram to a filesystem or abstract (`@name`) unix socket.
///
/// # Errors
/// The socket cannot be created or the datagram not sent.
pub fn send_to(path: &Path, msg: &[u8]) -> io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    let bytes = path.as_os_str().as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            #[cfg(target_os = "android")]
            use std::os::android::net::SocketAddrExt;
            #[cfg(target_os = "linux")]
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            let n = sock.send_to_addr(msg, &addr)?;
            return check_len(n, msg.len());
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            let _ = name;
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "abstract unix sockets exist only on Linux",
            ));
        }
    }
    let n = sock.send_to(msg, path)?;
    check_len(n, msg.len())
}

fn check_len(sent: usize, len: usize) -> io::Result<()> {
    if sent == len {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short datagram: {sent} of {len} bytes"),
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn recv(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn messages_reach_a_filesystem_socket_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let n = Notifier::new(Some(path), Some(Duration::from_millis(200)));
        assert!(n.enabled());
        assert_eq!(n.watchdog_interval(), Some(Duration::from_millis(200)));
        n.ready();
        n.status("2 channels\nup · ünïcode");
        n.watchdog();
        n.stopping();
        assert_eq!(recv(&sock), "READY=1");
        assert_eq!(recv(&sock), "STATUS=2 channels up · ünïcode");
        assert_eq!(recv(&sock), "WATCHDOG=1");
        assert_eq!(recv(&sock), "STOPPING=1");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn abstract_socket_names_are_supported() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("clawft-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        Notifier::new(Some(PathBuf::from(format!("@{name}"))), None).ready();
        assert_eq!(recv(&sock), "READY=1");
    }

    #[test]
    fn without_a_socket_or_with_a_dead_one_nothing_fails() {
        let n = Notifier::default();
        assert!(!n.enabled());
        assert_eq!(n.watchdog_interval(), None);
        n.ready();
        n.watchdog();
        let dir = tempfile::tempdir().unwrap();
        let gone = Notifier::new(Some(dir.path().join("nobody-listens")), None);
        gone.ready(); // logged, not a panic or an error
        assert!(send_to(&dir.path().join("nobody-listens"), b"READY=1").is_err());
    }
}
