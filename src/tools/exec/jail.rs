//! The per-command jail, set up in the child between `fork` and `exec` (raw syscalls only:
//! everything it needs, paths, maps, socket addresses, the seccomp program, is prepared in the
//! parent). What it gives each command:
//!
//! - **Its own network namespace** (`network = "proxy"` or `"off"`) with only a loopback
//!   interface: no route to the host, the LAN, cloud metadata or the internet, for TCP, UDP,
//!   DNS and ICMP alike. In proxy mode a bridge in the namespace listens on `127.0.0.1:3128`
//!   and relays each connection to the daemon's egress proxy (a Unix socket, which works
//!   across network namespaces).
//! - **Its own pid namespace**, so nothing it starts outlives it: when the command ends, the
//!   kernel kills every process left in the namespace (`setsid`, double forks and daemons
//!   included).
//! - **Its own user namespace** when the daemon is not privileged (the daemon's uid and gid
//!   mapped to themselves, so files keep their owner), which is what lets an unprivileged
//!   daemon create the other two.
//!
//! The processes, from the daemon down (all in the command's process group and cgroup):
//!
//! ```text
//! daemon ── A ── B (pid 1 of the new pid namespace) ── C = the command (pid 2)
//!                 └─ one relay per proxy connection (proxy mode)
//! ```
//!
//! - **A** is what the daemon spawned (`Command::spawn`, a fork of the daemon): it joins the
//!   command's cgroups, creates the namespaces, brings `lo` up, binds the bridge's socket and
//!   starts B. Once C has exec'd (or could not: A then returns the error, which `spawn`
//!   reports as before), it closes every file descriptor (so `spawn` returns, and the pipes
//!   reach EOF when the command's processes are gone) and waits; it exits as C did (the same
//!   exit code, or the same signal), so the tool result is unchanged.
//! - **B**, the namespace's init, starts C, closes everything but what it needs, reaps orphans,
//!   accepts bridge connections (forking one relay each), and when C ends reports C's wait
//!   status to A through a pipe and exits, which kills the rest of the namespace. B has
//!   `PR_SET_PDEATHSIG` = SIGKILL: if A is killed (timeout, `/stop`, a dropped call), B dies and
//!   the namespace with it, even if C left the process group.
//! - **C** applies the sandbox ([`crate::tools::sandbox::confine_now`]) and execs the command,
//!   searching `PATH` as `execvp` does.
//!
//! B and C share A's memory (`clone(CLONE_VM)`; C with vfork semantics, B suspended until C
//! has exec'd), so a command costs one copy of the daemon's page tables (A), as before the
//! jail, not three. They run on their own stacks ([`Stacks`]), read only data A prepared,
//! never read `errno` while another of them may write it (A and B share it), and use raw
//! system calls, not libc's `fork` (whose handlers would touch A's memory).
//!
//! When namespaces cannot be created (`RestrictNamespaces=`, AppArmor's user-namespace
//! restriction, a container), the runtime fails closed for the network: no fork, and a seccomp
//! filter refuses `socket()` for every family but `AF_UNIX` (and `io_uring_setup`, which can
//! create sockets without `socket()`), so there is no network at all and no proxy either.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::OnceLock;

use libc::{c_char, c_int, c_uint};

/// Where the bridge listens inside each command's network namespace.
pub(super) const PROXY_PORT: u16 = 3128;
/// Relay buffer (on the stack of the relay process).
const RELAY_BUF: usize = 16 * 1024;
/// Cgroup `cgroup.procs` files a command joins at most (v1: pids, memory, cpu).
pub(super) const MAX_CGROUPS: usize = 4;

/// Which namespaces the daemon can create, probed once per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct NsSupport {
    /// The `unshare` flags that worked (user, net and pid, or net and pid for a privileged
    /// daemon); 0 when none did.
    pub flags: c_int,
    /// Whether a user namespace is part of them (unprivileged daemon).
    pub userns: bool,
    /// Why namespaces are unavailable (an errno), when `flags` is 0.
    pub errno: i32,
}

impl NsSupport {
    /// No namespaces (as when `unshare` fails with EPERM).
    #[cfg(test)]
    pub const NONE: Self = Self {
        flags: 0,
        userns: false,
        errno: libc::EPERM,
    };

    /// Whether commands get their own namespaces.
    pub fn available(&self) -> bool {
        self.flags != 0
    }

    /// Why not, for the status line and errors.
    pub fn reason(&self) -> String {
        format!(
            "unshare(user, net, pid) failed: {}",
            io::Error::from_raw_os_error(self.errno)
        )
    }
}

/// A `/proc/self/{uid,gid}_map` line, prepared in the parent.
#[derive(Clone, Copy, Debug)]
pub(super) struct MapLine {
    buf: [u8; 48],
    len: usize,
}

impl MapLine {
    fn identity(id: u32) -> Self {
        let text = format!("{id} {id} 1\n");
        let mut buf = [0u8; 48];
        let len = text.len().min(buf.len());
        buf[..len].copy_from_slice(&text.as_bytes()[..len]);
        Self { buf, len }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// The daemon's own uid and gid, mapped to themselves in a new user namespace.
#[derive(Clone, Copy, Debug)]
pub(super) struct IdMaps {
    uid: MapLine,
    gid: MapLine,
}

impl IdMaps {
    fn of_self() -> Self {
        Self {
            uid: MapLine::identity(rustix::process::geteuid().as_raw()),
            gid: MapLine::identity(rustix::process::getegid().as_raw()),
        }
    }
}

/// The egress proxy's Unix socket address, prepared in the parent.
#[derive(Clone, Copy)]
pub(super) struct ProxyAddr {
    addr: libc::sockaddr_un,
    len: libc::socklen_t,
}

impl std::fmt::Debug for ProxyAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProxyAddr")
    }
}

impl ProxyAddr {
    /// The address of the socket at `path`.
    ///
    /// # Errors
    /// The path does not fit a `sockaddr_un` (107 bytes) or holds a NUL byte.
    pub fn new(path: &Path) -> io::Result<Self> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_os_str().as_bytes();
        // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
        #[allow(unsafe_code)]
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the egress proxy socket path {} is empty or longer than {} bytes",
                    path.display(),
                    addr.sun_path.len() - 1
                ),
            ));
        }
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
        Ok(Self {
            addr,
            len: libc::socklen_t::try_from(len).unwrap_or(libc::socklen_t::MAX),
        })
    }
}

/// What the jail does for one command; built in the parent, copied into the child.
#[derive(Clone, Copy, Debug)]
pub(super) struct JailSpec {
    /// `unshare` flags (0: no namespaces; the command is the spawned process itself).
    pub ns_flags: c_int,
    /// Identity maps, when a user namespace is created.
    pub maps: Option<IdMaps>,
    /// The proxy to bridge to (proxy mode, inside a network namespace).
    pub proxy: Option<ProxyAddr>,
    /// The no-namespace fallback: refuse every socket family but `AF_UNIX`.
    pub seccomp: bool,
    /// `RLIMIT_NPROC` (0: unchanged); only meaningful in a fresh user namespace.
    pub nproc: u64,
    /// `cgroup.procs` files to join (the first `cgroups` entries), kept open by the parent
    /// until `spawn` returns.
    pub cgroup_procs: [RawFd; MAX_CGROUPS],
    /// How many of `cgroup_procs` are used.
    pub cgroups: usize,
    /// What C execs (namespace path; the parent keeps the [`ExecImage`] alive until spawn
    /// returns).
    pub image: Option<RawImage>,
    /// The stacks of B and C (the runtime's [`Stacks`]).
    pub stacks: Option<StackTops>,
    /// The Landlock ruleset C applies (negative: none).
    pub ruleset: RawFd,
    /// Whether C applies the sandbox (no-new-privs, no capabilities, Landlock).
    pub confine: bool,
}

impl JailSpec {
    /// Namespaces as `support` allows for this network mode; no cgroups yet.
    pub fn new(support: NsSupport, network_ns: bool) -> Self {
        let mut flags = support.flags;
        if !network_ns {
            flags &= !libc::CLONE_NEWNET;
        }
        Self {
            ns_flags: flags,
            maps: support.userns.then(IdMaps::of_self),
            proxy: None,
            seccomp: false,
            nproc: 0,
            cgroup_procs: [-1; MAX_CGROUPS],
            cgroups: 0,
            image: None,
            stacks: None,
            ruleset: -1,
            confine: false,
        }
    }

    /// Whether the jail forks and execs the command itself (namespaces); otherwise the
    /// spawned process is the command and std execs it.
    pub fn execs(&self) -> bool {
        self.ns_flags != 0
    }
}

/// What C executes, prepared in the parent: every candidate path of the program (the `PATH`
/// search of `execvp`, with the command's own `PATH`), argv, envp, and the argv of the
/// `/bin/sh` fallback for files without a `#!` line (as `execvp` does).
pub(super) struct ExecImage {
    _strings: Vec<CString>,
    candidates: Vec<*const c_char>,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    sh_argv: Vec<*const c_char>,
}

// SAFETY: the pointers point into the CStrings the image owns (heap data that does not move
// when the image does); nothing mutates them through a shared reference.
#[allow(unsafe_code)]
unsafe impl Send for ExecImage {}

/// [`ExecImage`]'s pointers, copied into the child.
#[derive(Clone, Copy, Debug)]
pub(super) struct RawImage {
    candidates: *const *const c_char,
    n_candidates: usize,
    argv: *const *const c_char,
    envp: *const *const c_char,
    sh_argv: *mut *const c_char,
}

// SAFETY: plain pointers into an ExecImage that the parent keeps alive (and unchanged) until
// spawn returns; only the child, which has its own copy of the memory, dereferences them.
#[allow(unsafe_code)]
unsafe impl Send for RawImage {}
#[allow(unsafe_code)]
unsafe impl Sync for RawImage {}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a program name, argument or environment value contains a NUL byte",
        )
    })
}

impl ExecImage {
    /// The image of `program args` with environment `env`.
    ///
    /// # Errors
    /// A NUL byte in a string.
    pub fn new(
        program: &std::ffi::OsStr,
        args: &[std::ffi::OsString],
        env: &[(std::ffi::OsString, std::ffi::OsString)],
    ) -> io::Result<Self> {
        use std::os::unix::ffi::OsStrExt;
        let prog = program.as_bytes();
        let path = env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map_or(&b"/bin:/usr/bin"[..], |(_, v)| v.as_bytes());
        let candidates: Vec<CString> = if prog.contains(&b'/') {
            vec![cstring(prog)?]
        } else {
            path.split(|b| *b == b':')
                .map(|dir| {
                    let dir = if dir.is_empty() { &b"."[..] } else { dir };
                    let mut full = dir.to_vec();
                    full.push(b'/');
                    full.extend_from_slice(prog);
                    cstring(&full)
                })
                .collect::<io::Result<_>>()?
        };
        let argv: Vec<CString> = std::iter::once(Ok(cstring(prog)?))
            .chain(args.iter().map(|a| cstring(a.as_bytes())))
            .collect::<io::Result<_>>()?;
        let envp: Vec<CString> = env
            .iter()
            .map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                cstring(&kv)
            })
            .collect::<io::Result<_>>()?;
        let sh = cstring(b"/bin/sh")?;
        let ptrs = |v: &[CString]| -> Vec<*const c_char> {
            v.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        let mut sh_argv = vec![sh.as_ptr(), std::ptr::null()];
        sh_argv.extend(argv.iter().skip(1).map(|c| c.as_ptr()));
        sh_argv.push(std::ptr::null());
        let image = Self {
            candidates: candidates.iter().map(|c| c.as_ptr()).collect(),
            argv: ptrs(&argv),
            envp: ptrs(&envp),
            sh_argv,
            _strings: candidates
                .into_iter()
                .chain(argv)
                .chain(envp)
                .chain(std::iter::once(sh))
                .collect(),
        };
        Ok(image)
    }

    /// The pointers for the child.
    pub fn raw(&mut self) -> RawImage {
        RawImage {
            candidates: self.candidates.as_ptr(),
            n_candidates: self.candidates.len(),
            argv: self.argv.as_ptr(),
            envp: self.envp.as_ptr(),
            sh_argv: self.sh_argv.as_mut_ptr(),
        }
    }
}

/// Size of the stacks of B and C, and of the guard page below each.
const STACK: usize = 256 * 1024;
const GUARD: usize = 64 * 1024;

/// Two stacks (B's and C's) with a guard region below each, mapped once per runtime in the
/// daemon and never touched there: every A has its own copy-on-write copy, which its B and C
/// (sharing A's memory) run on.
pub(super) struct Stacks {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is only ever used by children (each with its own copy).
#[allow(unsafe_code)]
unsafe impl Send for Stacks {}
#[allow(unsafe_code)]
unsafe impl Sync for Stacks {}

/// The top addresses of B's and C's stacks.
#[derive(Clone, Copy, Debug)]
pub(super) struct StackTops {
    b: usize,
    c: usize,
}

impl Stacks {
    /// Map them.
    ///
    /// # Errors
    /// `mmap` or `mprotect` failed.
    #[allow(unsafe_code)]
    pub fn new() -> io::Result<Self> {
        let len = 2 * (GUARD + STACK);
        // SAFETY: a fresh private anonymous mapping; the guard regions are made inaccessible.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let me = Self { base, len };
            for guard in [0, GUARD + STACK] {
                if libc::mprotect(base.cast::<u8>().add(guard).cast(), GUARD, libc::PROT_NONE) != 0
                {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(me)
        }
    }

    /// Where B's and C's stacks start (they grow down).
    pub fn tops(&self) -> StackTops {
        let base = self.base as usize;
        StackTops {
            b: base + GUARD + STACK,
            c: base + 2 * (GUARD + STACK),
        }
    }
}

impl Drop for Stacks {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: our own mapping, unused in this process.
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

/// Probe once per process which namespaces can be created, by creating them in a forked child.
pub(super) fn probe() -> NsSupport {
    static SUPPORT: OnceLock<NsSupport> = OnceLock::new();
    *SUPPORT.get_or_init(|| {
        let base = libc::CLONE_NEWNET | libc::CLONE_NEWPID;
        let mut candidates = Vec::new();
        if privileged() {
            candidates.push((base, false));
        }
        candidates.push((base | libc::CLONE_NEWUSER, true));
        let mut errno = libc::EPERM;
        for (flags, userns) in candidates {
            let maps = userns.then(IdMaps::of_self);
            match try_namespaces(flags, maps) {
                Ok(()) => {
                    return NsSupport {
                        flags,
                        userns,
                        errno: 0,
                    }
                }
                Err(e) => errno = e,
            }
        }
        NsSupport {
            flags: 0,
            userns: false,
            errno,
        }
    })
}

/// Whether the daemon can create network and pid namespaces without a user namespace
/// (euid 0 with `CAP_SYS_ADMIN`).
fn privileged() -> bool {
    if !rustix::process::geteuid().is_root() {
        return false;
    }
    const CAP_SYS_ADMIN: u32 = 21;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// Fork a child that enters the namespaces and exits; Ok when it could, else the errno.
#[allow(unsafe_code)]
fn try_namespaces(flags: c_int, maps: Option<IdMaps>) -> Result<(), i32> {
    // SAFETY: the child of a possibly multi-threaded process only makes raw syscalls on data
    // prepared before the fork (enter_namespaces allocates nothing), then _exit()s.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return Err(errno());
        }
        if pid == 0 {
            let code = match enter_namespaces(flags, maps.as_ref()) {
                Ok(()) => 0,
                Err(e) => e.raw_os_error().unwrap_or(libc::EINVAL).clamp(1, 255),
            };
            libc::_exit(code);
        }
        let mut status = 0;
        loop {
            let r = libc::waitpid(pid, &mut status, 0);
            if r == pid {
                break;
            }
            if r < 0 && errno() != libc::EINTR {
                return Err(errno());
            }
        }
        if libc::WIFEXITED(status) {
            match libc::WEXITSTATUS(status) {
                0 => Ok(()),
                e => Err(e),
            }
        } else {
            Err(libc::EPERM)
        }
    }
}

/// Install the jail on `cmd` as a `pre_exec` closure. With namespaces the jail execs the
/// command itself (in C, after applying the sandbox given in `spec`); without, the spawned
/// process is the command and any other closure (the sandbox's) runs after this one.
#[allow(unsafe_code)]
pub(super) fn install(cmd: &mut tokio::process::Command, spec: JailSpec) {
    // SAFETY: the closure runs in the child forked from a multi-threaded parent. It makes raw
    // syscalls only, on `spec` (plain data copied into the closure), the memory it points to
    // (kept alive and unchanged by the parent until spawn returns: the exec image, the cgroup
    // and ruleset fds, the stacks) and stack values: no allocation, no locks, no panics.
    unsafe {
        cmd.pre_exec(move || enter(&spec));
    }
}

fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL)
}

fn check(r: c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A (the spawned process). Without namespaces it returns `Ok` and std execs the command in
/// this process; with them it never returns `Ok`: it returns the error that kept C from
/// running (std reports it to `spawn`), or waits and exits as C did.
#[allow(unsafe_code)]
unsafe fn enter(spec: &JailSpec) -> io::Result<()> {
    for &fd in &spec.cgroup_procs[..spec.cgroups.min(MAX_CGROUPS)] {
        // "0" moves the writing process.
        if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
            return Err(io::Error::last_os_error());
        }
    }
    if spec.ns_flags == 0 {
        if spec.seccomp {
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            seccomp::install()?;
        }
        return Ok(());
    }
    let (Some(_), Some(stacks)) = (spec.image, spec.stacks) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    enter_namespaces(spec.ns_flags, spec.maps.as_ref())?;
    // A and B are copies of the daemon's memory: no core dumps, no ptrace by the same uid.
    // (After the maps: a non-dumpable process's /proc/self files belong to root.)
    libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    if spec.nproc > 0 {
        let lim = libc::rlimit {
            rlim_cur: spec.nproc,
            rlim_max: spec.nproc,
        };
        check(libc::setrlimit(libc::RLIMIT_NPROC, &lim))?;
    }
    let listener = match spec.proxy {
        Some(_) => listen_bridge()?,
        None => -1,
    };
    let mut status = [-1; 2];
    check(libc::pipe2(status.as_mut_ptr(), libc::O_CLOEXEC))?;
    let mut report = [-1; 2];
    check(libc::pipe2(report.as_mut_ptr(), libc::O_CLOEXEC))?;
    // SIGCHLD stays blocked in B (it reads it from a signalfd); C unblocks it before exec.
    let mut chld: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut chld);
    libc::sigaddset(&mut chld, libc::SIGCHLD);
    let mut old: libc::sigset_t = std::mem::zeroed();
    libc::sigprocmask(libc::SIG_BLOCK, &chld, &mut old);
    // B shares this process's memory (no copy of the daemon's page tables): it reads `shared`
    // (which stays valid: this frame never returns while B may read it) and runs on its own
    // stack. C shares it too, with this process blocked in read() and B suspended (vfork).
    let mut shared = Shared {
        spec: *spec,
        listener,
        status_w: status[1],
        report_w: report[1],
        exec_errno: 0,
    };
    let b = libc::clone(
        b_main,
        stacks.b as *mut libc::c_void,
        libc::CLONE_VM | libc::SIGCHLD,
        std::ptr::from_mut(&mut shared).cast(),
    );
    if b < 0 {
        return Err(io::Error::last_os_error());
    }
    libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    libc::close(status[1]);
    libc::close(report[1]);
    // Wait until C has exec'd (or could not), before letting go of std's exec-error pipe.
    let mut buf = [0u8; 4];
    let n = read_full(report[0], &mut buf);
    let exec_errno = if n == 4 {
        c_int::from_ne_bytes(buf)
    } else {
        libc::EIO
    };
    if exec_errno != 0 {
        reap(b);
        return Err(io::Error::from_raw_os_error(exec_errno));
    }
    // Nothing of the daemon's (stdio, std's exec-error pipe, the listener) stays open here.
    let mut keep = [status[0]];
    close_all_except(&mut keep);
    wait_and_mirror(b, status[0])
}

/// What A hands B and C (on A's stack, shared through `CLONE_VM`).
#[repr(C)]
struct Shared {
    spec: JailSpec,
    listener: RawFd,
    status_w: RawFd,
    report_w: RawFd,
    /// Written by C when it cannot exec; read by B once C has exec'd or exited.
    exec_errno: c_int,
}

/// Read until `buf` is full or EOF/error; the bytes read.
#[allow(unsafe_code)]
unsafe fn read_full(fd: RawFd, buf: &mut [u8]) -> usize {
    let mut got = 0;
    let mut tries = 0;
    while got < buf.len() && tries < 1000 {
        tries += 1;
        let rest = &mut buf[got..];
        let n = libc::read(fd, rest.as_mut_ptr().cast(), rest.len());
        match usize::try_from(n) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(_) => {} // EINTR (errno is not read: B shares it)
        }
    }
    got
}

/// Wait for `pid` to end (retries on interruption, bounded; errno is not read: B shares it).
#[allow(unsafe_code)]
unsafe fn reap(pid: libc::pid_t) -> c_int {
    let mut st = 0;
    for _ in 0..1_000_000 {
        if libc::waitpid(pid, &mut st, 0) == pid {
            return st;
        }
    }
    st
}

/// Create the namespaces, write the identity maps, bring `lo` up (shared with the probe).
#[allow(unsafe_code)]
unsafe fn enter_namespaces(flags: c_int, maps: Option<&IdMaps>) -> io::Result<()> {
    check(libc::unshare(flags))?;
    if let Some(m) = maps {
        match write_file(c"/proc/self/setgroups", b"deny") {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            other => other?,
        }
        write_file(c"/proc/self/uid_map", m.uid.bytes())?;
        write_file(c"/proc/self/gid_map", m.gid.bytes())?;
    }
    if flags & libc::CLONE_NEWNET != 0 {
        loopback_up()?;
    }
    Ok(())
}

#[allow(unsafe_code)]
unsafe fn write_file(path: &CStr, data: &[u8]) -> io::Result<()> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = libc::write(fd, data.as_ptr().cast(), data.len());
    let err = io::Error::last_os_error();
    libc::close(fd);
    if usize::try_from(n).ok() == Some(data.len()) {
        Ok(())
    } else {
        Err(err)
    }
}

/// `ip link set lo up` in the current network namespace.
#[allow(unsafe_code)]
unsafe fn loopback_up() -> io::Result<()> {
    let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut ifr: libc::ifreq = std::mem::zeroed();
    for (d, s) in ifr.ifr_name.iter_mut().zip(b"lo") {
        *d = *s as libc::c_char;
    }
    let r = libc::ioctl(s, libc::SIOCGIFFLAGS, &mut ifr);
    let r = if r == 0 {
        ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        libc::ioctl(s, libc::SIOCSIFFLAGS, &ifr)
    } else {
        r
    };
    let err = io::Error::last_os_error();
    libc::close(s);
    if r == 0 {
        Ok(())
    } else {
        Err(err)
    }
}

/// The bridge's listening socket on `127.0.0.1:3128` in the command's network namespace.
#[allow(unsafe_code)]
unsafe fn listen_bridge() -> io::Result<RawFd> {
    let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    let one: c_int = 1;
    libc::setsockopt(
        s,
        libc::SOL_SOCKET,
        libc::SO_REUSEADDR,
        std::ptr::from_ref(&one).cast(),
        4,
    );
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: PROXY_PORT.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    if libc::bind(s, std::ptr::from_ref(&addr).cast(), len) != 0 || libc::listen(s, 128) != 0 {
        let e = io::Error::last_os_error();
        libc::close(s);
        return Err(e);
    }
    Ok(s)
}

/// Close every file descriptor but `keep` (negative entries ignored).
#[allow(unsafe_code)]
unsafe fn close_all_except(keep: &mut [RawFd]) {
    keep.sort_unstable();
    let mut lo: c_uint = 0;
    for &k in keep.iter() {
        let Ok(k) = c_uint::try_from(k) else {
            continue;
        };
        if k > lo {
            close_range(lo, k - 1);
        }
        lo = k + 1;
    }
    close_range(lo, c_uint::MAX);
}

#[allow(unsafe_code)]
unsafe fn close_range(lo: c_uint, hi: c_uint) {
    if libc::syscall(libc::SYS_close_range, lo, hi, 0) != 0 {
        // Linux < 5.9.
        for fd in lo..=hi.min(65_535) {
            libc::close(fd as c_int);
        }
    }
}

/// A: wait for B, then end as C ended (C's wait status comes from B through `status_r`; if B
/// died first, B's own status).
#[allow(unsafe_code)]
unsafe fn wait_and_mirror(b: libc::pid_t, status_r: RawFd) -> ! {
    let mut st = reap(b);
    let mut buf = [0u8; 4];
    if read_full(status_r, &mut buf) == 4 {
        st = c_int::from_ne_bytes(buf);
    }
    exit_like(st)
}

/// End this process with wait status `st`: the same exit code, or death by the same signal.
#[allow(unsafe_code)]
unsafe fn exit_like(st: c_int) -> ! {
    if libc::WIFSIGNALED(st) {
        let sig = libc::WTERMSIG(st);
        let nocore = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &nocore);
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), sig);
        libc::_exit(128 + sig);
    }
    if libc::WIFEXITED(st) {
        libc::_exit(libc::WEXITSTATUS(st));
    }
    libc::_exit(1)
}

/// B, pid 1 of the command's pid namespace (sharing A's memory): start C, tell A whether it
/// exec'd, then reap orphans, bridge proxy connections, and report C's end to A. Never
/// returns; reads no errno (A shares it).
extern "C" fn b_main(arg: *mut libc::c_void) -> c_int {
    #[allow(unsafe_code)]
    // SAFETY: `arg` is A's `Shared`, valid while B runs (see `enter`); raw syscalls only.
    unsafe {
        let shared = arg.cast::<Shared>();
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        // Copied now: once the report is written, A may be gone from the frame `shared` is in
        // (on failure) or never look at it again.
        let spec = (*shared).spec;
        let (listener, status_w, report_w) =
            ((*shared).listener, (*shared).status_w, (*shared).report_w);
        let Some(stacks) = spec.stacks else {
            libc::_exit(127);
        };
        (*shared).exec_errno = 0;
        let c = libc::clone(
            c_main,
            stacks.c as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            arg,
        );
        // C has exec'd or exited (vfork): A is blocked reading the report, so errno is ours.
        let exec_errno = if c < 0 {
            errno()
        } else {
            std::ptr::read_volatile(&raw const (*shared).exec_errno)
        };
        let report = exec_errno.to_ne_bytes();
        libc::write(report_w, report.as_ptr().cast(), report.len());
        if exec_errno != 0 {
            libc::_exit(127);
        }
        let mut keep = [listener, status_w];
        close_all_except(&mut keep);
        drop_capabilities();
        serve(c, &spec, listener, status_w)
    }
}

/// B's loop: reap, accept bridge connections, and when C ends report its status and exit
/// (which kills every process left in the namespace).
#[allow(unsafe_code)]
unsafe fn serve(c: libc::pid_t, spec: &JailSpec, listener: RawFd, status_w: RawFd) -> ! {
    let mut chld: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut chld);
    libc::sigaddset(&mut chld, libc::SIGCHLD);
    let sfd = libc::signalfd(-1, &chld, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sfd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: listener,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if sfd >= 0 {
            // An error (EINTR) just goes round again.
            libc::poll(fds.as_mut_ptr(), 2, -1);
            if fds[0].revents != 0 {
                let mut info = [0u8; 128];
                while libc::read(sfd, info.as_mut_ptr().cast(), info.len()) > 0 {}
            }
        } else {
            // No signalfd: no bridge either; just wait.
            fds[1].revents = 0;
        }
        loop {
            let mut st = 0;
            let flags = if sfd >= 0 { libc::WNOHANG } else { 0 };
            let r = libc::waitpid(-1, &mut st, flags);
            if r == c {
                let bytes = st.to_ne_bytes();
                libc::write(status_w, bytes.as_ptr().cast(), bytes.len());
                libc::_exit(0);
            }
            if r <= 0 {
                break;
            }
        }
        if fds[1].revents & libc::POLLIN != 0 {
            let conn = libc::accept4(
                listener,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            );
            if conn >= 0 {
                if let Some(addr) = spec.proxy {
                    // A plain fork by system call: its own copy of the memory, no atfork
                    // handlers, no libc state touched in A's shared memory.
                    let r = libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0);
                    if r == 0 {
                        libc::close(sfd);
                        libc::close(listener);
                        libc::close(status_w);
                        relay(conn, &addr);
                        libc::_exit(0);
                    }
                }
                libc::close(conn);
            }
        }
    }
}

/// C could not exec: leave the errno for B, exit.
#[allow(unsafe_code)]
unsafe fn exec_failed(shared: *mut Shared, e: c_int) -> ! {
    std::ptr::write_volatile(&raw mut (*shared).exec_errno, e.max(1));
    libc::_exit(127)
}

/// C (sharing A's memory, B suspended until it execs): the sandbox, then `exec` of the
/// command, trying each `PATH` candidate as `execvp` does. On failure it leaves the errno in
/// `Shared` for B and exits.
extern "C" fn c_main(arg: *mut libc::c_void) -> c_int {
    #[allow(unsafe_code)]
    // SAFETY: `arg` is A's `Shared`; the image pointers are valid in this memory (see
    // `RawImage`); raw syscalls only.
    unsafe {
        let shared = arg.cast::<Shared>();
        let spec = (*shared).spec;
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        if spec.confine {
            if let Err(e) = crate::tools::sandbox::confine_now(spec.ruleset, true) {
                exec_failed(shared, e.raw_os_error().unwrap_or(libc::EPERM));
            }
        }
        let Some(img) = spec.image else {
            exec_failed(shared, libc::EINVAL);
        };
        let mut err = libc::ENOENT;
        let mut eacces = false;
        for i in 0..img.n_candidates {
            let path = *img.candidates.add(i);
            libc::execve(path, img.argv, img.envp);
            let e = errno();
            match e {
                libc::ENOEXEC => {
                    // No `#!` line: run it with the shell, as execvp does.
                    *img.sh_argv.add(1) = path;
                    libc::execve(*img.sh_argv, img.sh_argv.cast_const(), img.envp);
                    exec_failed(shared, errno());
                }
                libc::EACCES => eacces = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                other => exec_failed(shared, other),
            }
            err = e;
        }
        exec_failed(shared, if eacces { libc::EACCES } else { err })
    }
}

/// Empty the capability sets of this process (B keeps none: it only accepts, forks and
/// relays bytes).
#[allow(unsafe_code)]
unsafe fn drop_capabilities() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    libc::syscall(libc::SYS_capset, std::ptr::from_ref(&header), data.as_ptr());
}

/// One proxy connection: relay bytes between the command's TCP connection and a fresh
/// connection to the egress proxy's Unix socket, half-closes included, until both sides end.
#[allow(unsafe_code)]
unsafe fn relay(conn: RawFd, addr: &ProxyAddr) {
    let up = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
    if up < 0 || libc::connect(up, std::ptr::from_ref(&addr.addr).cast(), addr.len) != 0 {
        return;
    }
    let mut buf = [0u8; RELAY_BUF];
    let ends = [conn, up];
    let mut open = [true, true];
    while open[0] || open[1] {
        let mut fds = [
            libc::pollfd {
                fd: if open[0] { conn } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if open[1] { up } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if libc::poll(fds.as_mut_ptr(), 2, -1) < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return;
        }
        for i in 0..2 {
            if fds[i].revents == 0 {
                continue;
            }
            let (from, to) = (ends[i], ends[1 - i]);
            let n = libc::read(from, buf.as_mut_ptr().cast(), buf.len());
            match usize::try_from(n) {
                Ok(0) => {
                    libc::shutdown(to, libc::SHUT_WR);
                    open[i] = false;
                }
                Ok(n) => {
                    if !send_all(to, &buf[..n]) {
                        return;
                    }
                }
                Err(_) if matches!(errno(), libc::EINTR | libc::EAGAIN) => {}
                Err(_) => {
                    libc::shutdown(to, libc::SHUT_WR);
                    open[i] = false;
                }
            }
        }
    }
}

#[allow(unsafe_code)]
unsafe fn send_all(fd: RawFd, mut data: &[u8]) -> bool {
    while !data.is_empty() {
        let n = libc::send(fd, data.as_ptr().cast(), data.len(), libc::MSG_NOSIGNAL);
        match usize::try_from(n) {
            Ok(n) => data = &data[n..],
            Err(_) if errno() == libc::EINTR => {}
            Err(_) => return false,
        }
    }
    true
}

/// The fallback filter: no socket of any family but `AF_UNIX`, no io_uring.
pub(super) mod seccomp {
    use std::io;

    /// `BPF_LD | BPF_W | BPF_ABS` (0x00 | 0x00 | 0x20).
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JEQ_K: u16 = 0x05 | 0x10;
    const BPF_JGE_K: u16 = 0x05 | 0x30;
    const BPF_RET_K: u16 = 0x06;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    const OFF_NR: u32 = 0;
    const OFF_ARCH: u32 = 4;
    /// `args[0]`, low 32 bits (little-endian).
    const OFF_ARG0: u32 = 16;
    /// x32 system calls (`__X32_SYSCALL_BIT`) are refused outright.
    const X32_BIT: u32 = 0x4000_0000;

    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xC000_003E;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xC000_00B7;

    /// Whether this build has the filter (x86_64 and aarch64).
    pub const SUPPORTED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64"));

    const fn stmt(code: u16, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        }
    }

    const fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
        libc::sock_filter { code, jt, jf, k }
    }

    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[allow(clippy::cast_sign_loss)]
    static FILTER: [libc::sock_filter; 14] = [
        stmt(BPF_LD_W_ABS, OFF_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0),
        // Another architecture's system calls (i386 compat): refused.
        stmt(BPF_RET_K, RET_ERRNO | libc::EPERM as u32),
        stmt(BPF_LD_W_ABS, OFF_NR),
        jump(BPF_JGE_K, X32_BIT, 0, 1),
        stmt(BPF_RET_K, RET_ERRNO | libc::ENOSYS as u32),
        jump(BPF_JEQ_K, libc::SYS_socket as u32, 3, 0),
        jump(BPF_JEQ_K, libc::SYS_io_uring_setup as u32, 1, 0),
        stmt(BPF_RET_K, RET_ALLOW),
        stmt(BPF_RET_K, RET_ERRNO | libc::EPERM as u32),
        stmt(BPF_LD_W_ABS, OFF_ARG0),
        jump(BPF_JEQ_K, libc::AF_UNIX as u32, 0, 1),
        stmt(BPF_RET_K, RET_ALLOW),
        stmt(BPF_RET_K, RET_ERRNO | libc::EAFNOSUPPORT as u32),
    ];

    /// Install the filter on the calling thread (no_new_privs must be set). Async-signal-safe.
    ///
    /// # Errors
    /// The kernel refused the filter, or this architecture has none.
    #[allow(unsafe_code)]
    pub unsafe fn install() -> io::Result<()> {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        {
            let prog = libc::sock_fprog {
                len: FILTER.len() as u16,
                filter: FILTER.as_ptr().cast_mut(),
            };
            if libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                std::ptr::from_ref(&prog),
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            Err(io::Error::from_raw_os_error(libc::ENOSYS))
        }
    }
}
