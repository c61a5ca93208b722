//! The OS sandbox around every process `exec_shell` and `spawn` start. This, not the shell
//! policy, is the security boundary. It is applied to the child only (between `fork` and
//! `exec`); the daemon itself is never restricted.
//!
//! # What it guarantees (when [`SandboxStatus::fs_enforced`] is true)
//!
//! Enforced by Landlock, i.e. by the kernel, whatever the command does (shell tricks, symlinks,
//! `..`, interpreters, static binaries), and inherited by every descendant:
//! - **Writes** (create, delete, rename, truncate, write, link, make device/fifo/socket) only
//!   beneath the session workspace, the daemon's private temp dir (`TMPDIR`, mode 0700) and the
//!   configured `write_paths`. Plus writing to `/dev/null`, `/dev/zero`, `/dev/full`.
//! - **Reads and execution** only beneath those, the system trees programs need (`/usr`, `/bin`,
//!   `/sbin`, `/lib*`, `/etc`, `/opt`, the target of `/etc/resolv.conf`) and the configured
//!   `read_paths`; `/proc` is readable (not writable, not executable); `/dev/urandom` and
//!   `/dev/random` are readable. Nothing else: not the shared `/tmp`, not `/home`, `/root`,
//!   `/var`, `/run`, `/srv`, not `/dev` devices.
//! - **Protected paths** (the daemon's config file, credentials and store directories, given by
//!   the daemon, plus `/etc/shadow`, `/etc/gshadow`, `/etc/sudoers*`, `/etc/ssh`,
//!   `/etc/ssl/private`, `/etc/credstore*`) are neither readable nor writable even when they lie
//!   beneath an allowed tree: such a tree is not allowed as a whole; instead its entries are
//!   allowed one by one, descending towards each protected path and leaving it out. The cost: a
//!   split directory itself (e.g. `/etc`) cannot be listed and new files cannot be created
//!   directly in it, only in its allowed subdirectories.
//! - With `network = "off"` and Landlock ABI >= 4: no TCP `connect` or `bind` at all (IPv4 and
//!   IPv6, including 127.0.0.1), on top of the command's own network namespace (see
//!   `tools::exec`'s jail, which also covers network, lifetime and resource limits).
//! - With Landlock ABI >= 6: the command cannot send signals to processes outside its own
//!   sandbox (it cannot kill the daemon or another session's command) nor connect to abstract
//!   UNIX sockets created outside it. Landlock also always forbids `ptrace` of processes outside
//!   the sandbox, which makes `/proc/<daemon pid>/environ`, `mem`, `fd/` unreadable.
//! - `PR_SET_NO_NEW_PRIVS`: setuid/setgid binaries (`sudo`, `su`) gain nothing.
//! - No capabilities: the capability bounding set and the capability sets are emptied, so a
//!   daemon running as root does not give its commands root's powers (`CAP_DAC_OVERRIDE`,
//!   `CAP_SYS_MODULE`, `CAP_SYS_ADMIN`, ...). They keep uid 0 and so still own root's files
//!   *within the allowed trees*.
//! - The environment is scrubbed ([`scrub_env`]): only `PATH`, `LANG`, `LC_*`, `TZ`, `TERM`,
//!   `USER`, `LOGNAME` and configured names pass; never a name containing `KEY`, `TOKEN`,
//!   `SECRET`, `PASSWORD`, `PASSWD` or `CREDENTIAL`, nor a value containing one of the daemon's
//!   secrets. `HOME` is the workspace, `TMPDIR` the private temp dir.
//!
//! # What it does not guarantee
//! - Nothing at all when Landlock is unavailable (kernel < 5.13, or not enabled in the `lsm=`
//!   boot list): commands then still run, with only the scrubbed environment, no-new-privs and
//!   dropped capabilities; [`probe`] says so, the daemon warns, and `require_sandbox = true`
//!   refuses to run commands instead.
//! - Landlock itself restricts only TCP (ABI >= 4); UDP, ICMP, DNS and raw sockets are kept
//!   from the network by the jail's network namespace (or, without namespaces, its seccomp
//!   filter), not by this module.
//! - Connecting to UNIX sockets by path (e.g. `/var/run/docker.sock`) is not restricted by the
//!   Landlock ABIs this sandbox requests (<= 6); only creating socket files is. Do not add paths
//!   holding privileged sockets to `read_paths`.
//! - Landlock rules follow the file hierarchy: a hard link to a protected file placed inside an
//!   allowed tree, or a bind mount, is reachable by that other name. (A rule is never put on such
//!   a name itself, where the tree is split around protected paths: a rule on a file or directory
//!   belongs to its inode, and would open the protected one by its own path too.) Paths are
//!   resolved when each command starts, so a protected path created later beneath an allowed
//!   tree is covered from the next command on.
//! - Processes, memory and CPU are limited by the jail (cgroups), not here; disk space is not
//!   limited. A process that leaves the process group (`setsid`) is killed by the jail's pid
//!   namespace, not by the group kill.
//! - Reads of world-readable `/proc` files (other processes' command lines) are allowed.
//! - The private temp dir is shared by all sessions of one daemon.

use std::ffi::OsString;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope, ABI,
};

/// The Landlock ABI whose access rights the sandbox requests, reduced (best effort) to what the
/// running kernel supports. 6 adds signal and abstract-socket scoping; it is tested here.
const TARGET_ABI: ABI = ABI::V6;

/// System trees commands may read and execute from.
const SYSTEM_READ_EXEC: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    // Often a symlink into /run (systemd-resolved): resolved so DNS works.
    "/etc/resolv.conf",
];
/// Readable, never writable nor executable.
const SYSTEM_READ_ONLY: &[&str] = &["/proc", "/dev/urandom", "/dev/random"];
/// Devices commands may read and write.
const DEVICES_RW: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];
/// System files that stay unreadable although `/etc` is readable.
const SYSTEM_PROTECTED: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/credstore",
    "/etc/credstore.encrypted",
];
/// Most directory entries visited when splitting trees around protected paths; past it, the
/// rest is left out (denied), never allowed wholesale.
const MAX_SPLIT_ENTRIES: usize = 20_000;
/// Most entries of protected directories looked at for files with several links (their other
/// names get no rule; past it, the rest are not looked for).
const MAX_ALIAS_ENTRIES: usize = 10_000;
/// `PATH` given to commands when the daemon's environment has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Variables passed to commands when present in the daemon's environment (plus `LC_*`).
const BASE_ENV: &[&str] = &["PATH", "LANG", "TZ", "TERM", "USER", "LOGNAME"];
/// A variable whose name contains one of these (case-insensitive) is never passed on.
pub const SECRET_NAME_PARTS: &[&str] =
    &["KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL"];

/// What the sandbox enforces. From [`probe`]: what the kernel supports; from the exec runtime:
/// what is enforced for commands given the settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SandboxStatus {
    /// Landlock ABI version usable (0: Landlock unavailable; capped at the newest ABI whose
    /// features the sandbox uses, 6).
    pub landlock_abi: u32,
    /// Filesystem access is restricted (ABI >= 1).
    pub fs_enforced: bool,
    /// TCP connect/bind is denied (ABI >= 4 and `network = "off"`; from [`probe`]: supported).
    pub net_enforced: bool,
    /// Signals and abstract UNIX sockets are scoped to the sandbox (ABI >= 6).
    pub scoped: bool,
    /// The per-command jail: network, lifetime and limits (`None` from [`probe`], which only
    /// looks at Landlock).
    pub jail: Option<JailStatus>,
}

/// What commands' network is, as enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkStatus {
    /// Their own network namespace; HTTP(S) only through the daemon's egress proxy.
    Proxy,
    /// Their own network namespace; proxy mode, but the daemon runs no egress proxy: no
    /// network at all.
    ProxyUnavailable,
    /// Their own network namespace: no network at all (`network = "off"`).
    Off,
    /// No namespaces available: a seccomp filter refuses every socket family but `AF_UNIX`, so
    /// no network at all (not even through the proxy).
    Seccomp,
    /// The host's network, unrestricted (`network = "direct"`).
    Direct,
    /// Neither namespaces nor the seccomp filter are available: the host's network.
    Unisolated,
}

/// How one resource of commands is limited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// A per-command cgroup v1.
    CgroupV1,
    /// A per-command cgroup v2.
    CgroupV2,
    /// `RLIMIT_NPROC` in the command's own user namespace (processes only).
    Rlimit,
    /// Not limited (configured as 0, or no mechanism available).
    None,
}

impl LimitKind {
    fn describe(self) -> &'static str {
        match self {
            Self::CgroupV1 => "cgroup v1",
            Self::CgroupV2 => "cgroup v2",
            Self::Rlimit => "RLIMIT_NPROC in its own user namespace",
            Self::None => "",
        }
    }
}

/// What the per-command jail enforces (see `tools::exec`'s jail): network, lifetime, limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct JailStatus {
    /// The network commands have.
    pub network: NetworkStatus,
    /// Each command runs in its own pid namespace: nothing it starts outlives it.
    pub pid_namespace: bool,
    /// Why namespaces are unavailable (an errno), when they are.
    pub namespace_errno: i32,
    /// Configured tasks per command (0: no limit).
    pub max_processes: u32,
    /// What enforces `max_processes`.
    pub processes: LimitKind,
    /// Configured memory per command in MiB (0: no limit).
    pub max_memory_mb: u64,
    /// What enforces `max_memory_mb`.
    pub memory: LimitKind,
}

impl JailStatus {
    /// The jail's part of the status line.
    pub fn summary(&self) -> String {
        let why = || {
            format!(
                "unshare failed: {}",
                io::Error::from_raw_os_error(self.namespace_errno)
            )
        };
        let network = match self.network {
            NetworkStatus::Proxy => {
                "HTTP(S) through the egress proxy only (own network namespace)".to_string()
            }
            NetworkStatus::ProxyUnavailable => {
                "none (own network namespace; no egress proxy running)".to_string()
            }
            NetworkStatus::Off => "none (own network namespace)".to_string(),
            NetworkStatus::Seccomp => format!("none (no namespaces: seccomp; {})", why()),
            NetworkStatus::Direct => {
                "direct (the host's network, unrestricted: tools.exec.network = \"direct\")"
                    .to_string()
            }
            NetworkStatus::Unisolated => format!("NOT isolated (no namespaces: {})", why()),
        };
        let lifetime = if self.pid_namespace {
            "own pid namespace (nothing outlives the command)"
        } else {
            "process group only (a process that leaves it can outlive the command)"
        };
        let limit = |zero: bool, max: String, kind: LimitKind, missing: &str| {
            if zero {
                "not limited (set to 0)".to_string()
            } else if kind == LimitKind::None {
                format!("not limited ({missing})")
            } else {
                format!("at most {max} ({})", kind.describe())
            }
        };
        format!(
            "network: {network}; lifetime: {lifetime}; processes: {}; memory: {}",
            limit(
                self.max_processes == 0,
                self.max_processes.to_string(),
                self.processes,
                "no pids cgroup and no user namespace"
            ),
            limit(
                self.max_memory_mb == 0,
                format!("{} MiB", self.max_memory_mb),
                self.memory,
                "no memory cgroup"
            ),
        )
    }
}

impl SandboxStatus {
    /// One line for logs and `weft status`.
    pub fn summary(&self) -> String {
        let fs = if self.fs_enforced {
            format!(
                "exec sandbox enforced (Landlock ABI {}): filesystem yes, TCP blocked {}, signal/socket scoping {}",
                self.landlock_abi,
                if self.net_enforced { "yes" } else { "no" },
                if self.scoped { "yes" } else { "no" },
            )
        } else {
            format!(
                "exec sandbox NOT enforced (Landlock ABI {}): commands can read and write anything the daemon's user can",
                self.landlock_abi
            )
        };
        match &self.jail {
            Some(j) => format!("{fs}; {}", j.summary()),
            None => fs,
        }
    }
}

/// What the running kernel supports, computed once: `fs_enforced`, `net_enforced` and `scoped`
/// here mean "can be enforced".
pub fn probe() -> SandboxStatus {
    static STATUS: OnceLock<SandboxStatus> = OnceLock::new();
    *STATUS.get_or_init(|| {
        let abi = [
            (ABI::V6, 6),
            (ABI::V5, 5),
            (ABI::V4, 4),
            (ABI::V3, 3),
            (ABI::V2, 2),
            (ABI::V1, 1),
        ]
        .into_iter()
        .find(|(abi, n)| kernel_supports(*abi, *n))
        .map_or(0, |(_, n)| n);
        SandboxStatus {
            landlock_abi: abi,
            fs_enforced: abi >= 1,
            net_enforced: abi >= 4,
            scoped: abi >= 6,
            jail: None,
        }
    })
}

/// Whether a ruleset using every feature of `abi` can be created (hard requirement).
fn kernel_supports(abi: ABI, n: u32) -> bool {
    let attempt = || -> Result<(), landlock::RulesetError> {
        let mut rs = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_all(abi))?;
        if n >= 4 {
            rs = rs.handle_access(AccessNet::from_all(abi))?;
        }
        if n >= 6 {
            rs = rs.scope(Scope::from_all(abi))?;
        }
        rs.create().map(drop)
    };
    attempt().is_ok()
}

/// Which paths a command may use, besides the workspace and the private temp dir.
#[derive(Clone, Debug, Default)]
pub struct SandboxPlan {
    /// Extra trees to read and execute from (absolute).
    pub read_paths: Vec<PathBuf>,
    /// Extra trees to write (absolute).
    pub write_paths: Vec<PathBuf>,
    /// Never readable nor writable, even beneath an allowed tree (absolute).
    pub protected: Vec<PathBuf>,
    /// Whether TCP connect/bind stay allowed.
    pub network: bool,
}

impl SandboxPlan {
    /// Build a Landlock ruleset for one command, in the parent: opens the allowed paths and
    /// returns the ruleset fd to hand to [`confine`] (`None` when the kernel has no Landlock).
    /// Blocking (directory listings); run it off the async threads.
    ///
    /// # Errors
    /// A Landlock call failed.
    pub fn build_ruleset(
        &self,
        workspace: &Path,
        tmp: &Path,
    ) -> Result<Option<OwnedFd>, SandboxError> {
        let protected: Vec<PathBuf> = SYSTEM_PROTECTED
            .iter()
            .map(PathBuf::from)
            .chain(self.protected.iter().cloned())
            .map(|p| canonical(&p))
            .collect();
        let mut budget = MAX_SPLIT_ENTRIES;
        let mut alias_budget = MAX_ALIAS_ENTRIES;
        let aliases = protected_ids(&protected, &mut alias_budget);
        let split = |roots: &mut dyn Iterator<Item = PathBuf>, budget: &mut usize| {
            let mut out = Vec::new();
            for r in roots {
                allow_except(&canonical(&r), &protected, &aliases, &mut out, budget);
            }
            out
        };
        let read = split(
            &mut SYSTEM_READ_EXEC
                .iter()
                .map(PathBuf::from)
                .chain(self.read_paths.iter().cloned()),
            &mut budget,
        );
        let read_only = split(&mut SYSTEM_READ_ONLY.iter().map(PathBuf::from), &mut budget);
        let devices = split(&mut DEVICES_RW.iter().map(PathBuf::from), &mut budget);
        let write = split(
            &mut [workspace.to_path_buf(), tmp.to_path_buf()]
                .into_iter()
                .chain(self.write_paths.iter().cloned()),
            &mut budget,
        );

        let abi = TARGET_ABI;
        let build = || -> Result<Option<OwnedFd>, landlock::RulesetError> {
            let mut rs = Ruleset::default().handle_access(AccessFs::from_all(abi))?;
            if !self.network {
                rs = rs.handle_access(AccessNet::from_all(abi))?;
            }
            let created = rs
                .scope(Scope::from_all(abi))?
                .create()?
                .add_rules(path_beneath_rules(&read, AccessFs::from_read(abi)))?
                .add_rules(path_beneath_rules(
                    &read_only,
                    AccessFs::ReadFile | AccessFs::ReadDir,
                ))?
                .add_rules(path_beneath_rules(
                    &devices,
                    AccessFs::ReadFile
                        | AccessFs::WriteFile
                        | AccessFs::Truncate
                        | AccessFs::IoctlDev,
                ))?
                .add_rules(path_beneath_rules(&write, AccessFs::from_all(abi)))?;
            Ok(created.into())
        };
        build().map_err(SandboxError)
    }
}

impl SandboxPlan {
    /// Whether a protected path lies beneath the workspace, the temp dir or a write path. The
    /// ruleset then allows the entries of that tree one by one, as they are when it is built,
    /// so it must be rebuilt for each command (files created later would be out of reach).
    pub fn splits_writable(&self, workspace: &Path, tmp: &Path) -> bool {
        let roots: Vec<PathBuf> = [workspace.to_path_buf(), tmp.to_path_buf()]
            .into_iter()
            .chain(self.write_paths.iter().cloned())
            .map(|p| canonical(&p))
            .collect();
        SYSTEM_PROTECTED
            .iter()
            .map(PathBuf::from)
            .chain(self.protected.iter().cloned())
            .map(|p| canonical(&p))
            .any(|p| roots.iter().any(|r| p.starts_with(r)))
    }
}

/// The Landlock ruleset could not be built.
#[derive(Debug, thiserror::Error)]
#[error("landlock: {0}")]
pub struct SandboxError(#[from] pub landlock::RulesetError);

/// Device and inode of what could be a protected path under another name: each protected path,
/// and the files with several links inside protected directories (a bounded walk).
fn protected_ids(
    protected: &[PathBuf],
    budget: &mut usize,
) -> std::collections::HashSet<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut ids = std::collections::HashSet::new();
    for p in protected {
        let Ok(m) = std::fs::metadata(p) else {
            continue;
        };
        ids.insert((m.dev(), m.ino()));
        if !m.is_dir() {
            continue;
        }
        let mut stack = vec![p.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                if *budget == 0 {
                    return ids;
                }
                *budget -= 1;
                let Ok(m) = e.metadata() else { continue };
                if m.is_dir() {
                    stack.push(e.path());
                } else if m.is_file() && m.nlink() > 1 {
                    ids.insert((m.dev(), m.ino()));
                }
            }
        }
    }
    ids
}

/// Push onto `out` the paths that together allow `root` minus every protected path: `root`
/// itself when nothing protected lies beneath it, otherwise (recursively) its entries. Symbolic
/// links inside a split directory are skipped: Landlock checks the path they resolve to, which
/// is allowed or not on its own. An entry that is a protected object under another name (its
/// device and inode in `aliases`: a hard link, a bind mount) gets no rule: Landlock ties a rule
/// to the inode, so it would open the protected path itself.
fn allow_except(
    root: &Path,
    protected: &[PathBuf],
    aliases: &std::collections::HashSet<(u64, u64)>,
    out: &mut Vec<PathBuf>,
    budget: &mut usize,
) {
    use std::os::unix::fs::MetadataExt;
    if protected.iter().any(|p| root.starts_with(p)) {
        return;
    }
    if !protected.iter().any(|p| p.starts_with(root)) {
        let alias = std::fs::metadata(root).is_ok_and(|m| aliases.contains(&(m.dev(), m.ino())));
        if !alias {
            out.push(root.to_path_buf());
        }
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        if entry.file_type().is_ok_and(|t| t.is_symlink()) {
            continue;
        }
        allow_except(&entry.path(), protected, aliases, out, budget);
    }
}

/// `p` with symbolic links resolved as far as it exists (the rest appended), so prefix tests
/// compare like with like. Landlock itself works on the opened files, not these strings.
fn canonical(p: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    match (p.parent(), p.file_name()) {
        (Some(parent), Some(name)) if parent != p => canonical(parent).join(name),
        _ => p.to_path_buf(),
    }
}

/// Whether `p` is absolute and free of `..` (config validation).
pub fn is_clean_absolute(p: &Path) -> bool {
    p.is_absolute()
        && !p.components().any(|c| matches!(c, Component::ParentDir))
        && !p.as_os_str().as_bytes().contains(&0)
}

/// The daemon's private temp dir (`TMPDIR` of commands), mode 0700, removed on drop.
#[derive(Debug)]
pub struct PrivateTmp {
    path: PathBuf,
}

impl PrivateTmp {
    /// Create a fresh `clawft-exec-<pid>-<random>` directory beneath `base`.
    ///
    /// # Errors
    /// The directory cannot be created.
    pub fn create_in(base: &Path) -> io::Result<Self> {
        crate::types::private_dir::create(base, "clawft-exec").map(|path| Self { path })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PrivateTmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Whether a variable name looks like it holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_uppercase();
    SECRET_NAME_PARTS.iter().any(|p| upper.contains(p))
}

/// The environment of a command, from the daemon's environment `source`: the base names
/// (`PATH`, `LANG`, `LC_*`, `TZ`, `TERM`, `USER`, `LOGNAME`) and `passthrough`, minus any name
/// that looks secret and any value containing one of `secrets` (or equal to it, for secrets
/// shorter than 4 bytes); then `TMPDIR` = `tmp`. `PATH` defaults to [`DEFAULT_PATH`]. `HOME` is
/// added per call (it is the workspace).
pub fn scrub_env(
    source: &[(OsString, OsString)],
    passthrough: &[String],
    secrets: &[String],
    tmp: &Path,
) -> Vec<(OsString, OsString)> {
    let leaks = |value: &[u8]| {
        secrets.iter().any(|s| {
            let s = s.as_bytes();
            !s.is_empty()
                && if s.len() < 4 {
                    value == s
                } else {
                    value.windows(s.len()).any(|w| w == s)
                }
        })
    };
    let mut env: Vec<(OsString, OsString)> = source
        .iter()
        .filter(|(name, value)| {
            let Some(name) = name.to_str() else {
                return false;
            };
            let wanted = BASE_ENV.contains(&name)
                || name.starts_with("LC_")
                || passthrough.iter().any(|p| p == name);
            wanted
                && !is_secret_name(name)
                && !matches!(name, "HOME" | "TMPDIR")
                && !leaks(value.as_bytes())
        })
        .cloned()
        .collect();
    if !env.iter().any(|(n, _)| n == "PATH") {
        env.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    env.push(("TMPDIR".into(), tmp.as_os_str().to_owned()));
    env
}

/// `struct __user_cap_header_struct` (linux/capability.h).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct` (linux/capability.h).
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit capability sets as two `CapData`.
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// Capability numbers tried when emptying the bounding set (the kernel knows about 41 today).
const MAX_CAP: libc::c_ulong = 63;

/// Install the child-side half of the sandbox on `cmd`: in the child, after `fork` and before
/// `exec`, set no-new-privs, empty the capability sets when `drop_caps`, and restrict the
/// process with the Landlock ruleset `ruleset` (a fd from [`SandboxPlan::build_ruleset`],
/// which the caller keeps open until `spawn` returns and then closes).
///
/// If any step fails the command does not run (`spawn` returns the error): the sandbox fails
/// closed.
#[allow(unsafe_code)]
pub fn confine(cmd: &mut tokio::process::Command, ruleset: Option<RawFd>, drop_caps: bool) {
    let fd = ruleset.unwrap_or(-1);
    // SAFETY: the closure runs in the child forked from a multi-threaded parent, where only
    // async-signal-safe operations are allowed: `confine_now` makes raw syscalls only. `fd` is
    // a valid ruleset fd in the child because the parent keeps it open until spawn returns; it
    // is O_CLOEXEC, so the exec'd program does not inherit it.
    unsafe {
        cmd.pre_exec(move || confine_now(fd, drop_caps));
    }
}

/// The child-side half of the sandbox, applied to the calling process now: no-new-privs, empty
/// capability sets when `drop_caps`, and the Landlock ruleset `ruleset` (negative: none).
///
/// # Safety
/// Async-signal-safe (raw syscalls on plain values and stack structs: no allocation, no locks,
/// no panics), for use between `fork` and `exec`. `ruleset` must be a Landlock ruleset fd or
/// negative.
///
/// # Errors
/// A step failed; the caller must not exec the command.
#[allow(unsafe_code)]
pub unsafe fn confine_now(ruleset: RawFd, drop_caps: bool) -> io::Result<()> {
    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
        return Err(io::Error::last_os_error());
    }
    if drop_caps {
        // Needs CAP_SETPCAP, held only by privileged daemons: there is nothing to drop
        // otherwise, so EPERM/EINVAL are fine.
        for cap in 0..=MAX_CAP {
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        if libc::syscall(libc::SYS_capset, std::ptr::from_ref(&header), data.as_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    if ruleset >= 0 && libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0) != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn allow_except_leaves_out_protected_paths_and_their_parents_only() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("a/secret/deep")).unwrap();
        std::fs::create_dir_all(root.join("a/public")).unwrap();
        std::fs::write(root.join("a/file"), "x").unwrap();
        std::fs::create_dir_all(root.join("b")).unwrap();
        std::os::unix::fs::symlink(root.join("a/secret"), root.join("a/link")).unwrap();
        let mut out = Vec::new();
        let mut budget = 100;
        let none = std::collections::HashSet::new();
        allow_except(
            &root,
            &[root.join("a/secret")],
            &none,
            &mut out,
            &mut budget,
        );
        out.sort();
        assert_eq!(
            out,
            vec![root.join("a/file"), root.join("a/public"), root.join("b")]
        );
        let mut out = Vec::new();
        allow_except(
            &root.join("a/secret/deep"),
            &[root.join("a/secret")],
            &none,
            &mut out,
            &mut budget,
        );
        assert!(out.is_empty());
        // A hard link to a protected file next to it gets no rule (the rule would be the
        // protected file's own).
        std::fs::write(root.join("a/secret/key"), "k").unwrap();
        std::fs::hard_link(root.join("a/secret/key"), root.join("a/key-link")).unwrap();
        let protected = [root.join("a/secret")];
        let ids = protected_ids(&protected, &mut budget);
        let mut out = Vec::new();
        allow_except(&root, &protected, &ids, &mut out, &mut budget);
        assert!(!out.contains(&root.join("a/key-link")), "{out:?}");
        assert!(out.contains(&root.join("a/file")), "{out:?}");
    }

    #[test]
    fn scrub_env_keeps_only_safe_names_and_values() {
        let src: Vec<(OsString, OsString)> = [
            ("PATH", "/usr/bin:/bin"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C"),
            ("FOO_TOKEN", "t0ps3cret-token"),
            ("API_KEY", "k3y"),
            ("my_password", "pw"),
            ("HOME", "/root"),
            ("TMPDIR", "/tmp"),
            ("LD_PRELOAD", "/x.so"),
            ("EXTRA", "fine"),
            ("TERM", "has-daemon-secret-inside"),
            ("USER", "bob"),
        ]
        .into_iter()
        .map(|(a, b)| (a.into(), b.into()))
        .collect();
        let env = scrub_env(
            &src,
            &["EXTRA".into(), "FOO_TOKEN".into()],
            &["daemon-secret".into()],
            Path::new("/private/tmp"),
        );
        let names: Vec<&str> = env.iter().map(|(n, _)| n.to_str().unwrap()).collect();
        assert_eq!(names, ["PATH", "LANG", "LC_ALL", "EXTRA", "USER", "TMPDIR"]);
        assert_eq!(env[5].1, "/private/tmp");
        let env = scrub_env(&[], &[], &[], Path::new("/t"));
        assert_eq!(env[0], ("PATH".into(), DEFAULT_PATH.into()));
    }

    #[test]
    fn probe_is_stable_and_consistent() {
        let s = probe();
        assert_eq!(s, probe());
        assert_eq!(s.fs_enforced, s.landlock_abi >= 1);
        assert_eq!(s.net_enforced, s.landlock_abi >= 4);
        println!("{}", s.summary());
    }

    #[test]
    fn private_tmp_is_0700_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let t = PrivateTmp::create_in(base.path()).unwrap();
        let p = t.path().to_path_buf();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::write(p.join("f"), "x").unwrap();
        drop(t);
        assert!(!p.exists());
    }
}
