//! The process runtime shared by `exec_shell` and `spawn` ([`ExecRuntime`]): the command gate,
//! spawning in the workspace inside the jail (own network and pid namespaces, cgroup limits)
//! and the sandbox with a scrubbed environment, the process group killed on every way out
//! (exit, timeout, cancellation, drop), output captured up to a cap.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::Semaphore;

use super::cgroup::{self, Cgroups, CommandCgroup, Events};
use super::jail::{self, ExecImage, JailSpec, NsSupport, ProxyAddr, Stacks, MAX_CGROUPS};
use super::{ExecSettings, NetworkMode};
use crate::tools::sandbox::{
    self, JailStatus, LimitKind, NetworkStatus, PrivateTmp, SandboxPlan, SandboxStatus,
};
use crate::tools::shell_policy::{Approver, CommandGate, ShellPolicy};
use crate::tools::{ToolContext, ToolError};

/// After the command exits and its group is killed, how long to wait for the pipes to reach
/// EOF (a process that left the group may still hold them) before returning what was read.
const DRAIN_GRACE: Duration = Duration::from_millis(500);
/// Read buffer for stdout/stderr.
const READ_CHUNK: usize = 16 * 1024;
/// The egress proxy as commands see it (the bridge in their network namespace), exported as
/// `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and their lowercase forms.
pub const PROXY_ADDR: &str = "127.0.0.1:3128";
/// `NO_PROXY`: the command's own loopback (its own network namespace: only what the command
/// itself listens on, never the host's) is reached directly.
const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// What the daemon hands the process tools besides their settings.
#[derive(Clone)]
pub struct ExecDeps {
    /// Paths commands must never read or write even beneath an allowed tree: the config file,
    /// the credentials directory, the store directory.
    pub protected_paths: Vec<PathBuf>,
    /// The daemon's secret values: an environment variable whose value contains one is never
    /// passed to commands.
    pub secrets: Vec<String>,
    /// The daemon's environment, from which the commands' environment is filtered.
    pub env: Vec<(OsString, OsString)>,
    /// Who approves commands in `ask` mode (none: such commands are denied).
    pub approver: Option<Arc<dyn Approver>>,
    /// Where the private temp dir is created (usually `std::env::temp_dir()`).
    pub tmp_base: PathBuf,
    /// The egress proxy's Unix socket (`crate::net::proxy::EgressProxy`), which commands reach
    /// through the bridge in their network namespace (`network = "proxy"`). `None`: no proxy;
    /// commands then have no network at all in proxy mode.
    pub proxy_socket: Option<PathBuf>,
    /// The running proxy behind `proxy_socket`, kept alive as long as this runtime (the daemon
    /// starts one per registry; tests may point `proxy_socket` at their own listener).
    pub proxy: Option<Arc<crate::net::proxy::EgressProxy>>,
}

/// State shared by `exec_shell` and `spawn` (one per daemon): settings, the command gate, the
/// sandbox plan and status, the private temp dir, the scrubbed environment and the spawn slots.
pub struct ExecRuntime {
    pub(super) settings: ExecSettings,
    pub(super) gate: CommandGate,
    pub(super) plan: SandboxPlan,
    pub(super) status: SandboxStatus,
    pub(super) tmp: PrivateTmp,
    /// Scrubbed once; `HOME` is added per call (it is the caller's workspace).
    pub(super) env: Vec<(OsString, OsString)>,
    /// Shared by every `spawn` call of every session (seed 000: max 5 concurrent).
    pub(super) spawn_slots: Arc<Semaphore>,
    /// The per-command jail: what the child sets up, and the runtime's cgroups.
    jail: Jail,
    /// Built Landlock rulesets by workspace.
    rulesets: RulesetCache,
    /// The egress proxy commands reach (dropped, and stopped, with the runtime).
    _proxy: Option<Arc<crate::net::proxy::EgressProxy>>,
}

/// How long a built Landlock ruleset is reused for commands in the same workspace. The
/// ruleset holds the allowed trees as they were when it was built: entries created since in a
/// directory that is split around a protected path (e.g. a new file directly in `/etc`) are
/// reachable once it is rebuilt; protected paths never are.
const RULESET_TTL: Duration = Duration::from_secs(30);
/// Workspaces whose ruleset is kept.
const RULESET_CACHE: usize = 16;

/// Built rulesets by workspace (only those whose writable trees need no splitting: the
/// workspace and the temp dir are then single rules, exact whatever is created in them).
#[derive(Default)]
struct RulesetCache {
    map: std::sync::Mutex<Vec<(PathBuf, Instant, Arc<OwnedFd>)>>,
    /// Tests measure the cost of building each time.
    #[cfg(test)]
    off: std::sync::atomic::AtomicBool,
}

impl RulesetCache {
    fn get(&self, ws: &Path) -> Option<Arc<OwnedFd>> {
        #[cfg(test)]
        if self.off.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let map = self.map.lock().ok()?;
        map.iter()
            .find(|(p, at, _)| p == ws && at.elapsed() < RULESET_TTL)
            .map(|(_, _, fd)| fd.clone())
    }

    fn put(&self, ws: PathBuf, fd: Arc<OwnedFd>) {
        let Ok(mut map) = self.map.lock() else {
            return;
        };
        map.retain(|(p, at, _)| *p != ws && at.elapsed() < RULESET_TTL);
        if map.len() >= RULESET_CACHE {
            map.remove(0);
        }
        map.push((ws, Instant::now(), fd));
    }
}

/// The jail as this runtime applies it.
struct Jail {
    /// What every command's child does (the cgroup files are filled in per command).
    spec: JailSpec,
    /// Per-command cgroups, when the daemon can create them.
    cgroups: Option<Arc<Cgroups>>,
    /// Namespaces (unavailable: `require_sandbox` refuses commands).
    ns: NsSupport,
    /// Whether commands get the proxy variables.
    proxy_env: bool,
    /// Whether anything has to run in the child (else no `pre_exec` from the jail).
    active: bool,
    /// B's and C's stacks (namespaces only).
    _stacks: Option<Stacks>,
}

/// What the jail enforces for `settings` with these namespaces, limits and proxy.
fn jail_status(
    settings: &ExecSettings,
    ns: NsSupport,
    (processes, memory): (LimitKind, LimitKind),
    proxy: bool,
) -> JailStatus {
    let network = match (settings.network, ns.available()) {
        (NetworkMode::Direct, _) => NetworkStatus::Direct,
        (NetworkMode::Proxy, true) if proxy => NetworkStatus::Proxy,
        (NetworkMode::Proxy, true) => NetworkStatus::ProxyUnavailable,
        (NetworkMode::Off, true) => NetworkStatus::Off,
        (_, false) if jail::seccomp::SUPPORTED => NetworkStatus::Seccomp,
        (_, false) => NetworkStatus::Unisolated,
    };
    // Without a pids cgroup, RLIMIT_NPROC counts only the command's own processes when it
    // has its own user namespace (Linux >= 5.14 counts per user namespace).
    let processes = match processes {
        LimitKind::None if ns.available() && ns.userns => LimitKind::Rlimit,
        k => k,
    };
    JailStatus {
        network,
        pid_namespace: ns.available(),
        namespace_errno: ns.errno,
        max_processes: settings.max_processes,
        processes: if settings.max_processes == 0 {
            LimitKind::None
        } else {
            processes
        },
        max_memory_mb: settings.max_memory_mb,
        memory: if settings.max_memory_mb == 0 {
            LimitKind::None
        } else {
            memory
        },
    }
}

/// What the exec sandbox and jail would enforce for `settings` in this process, without
/// creating anything (for `weft status` and `weft doctor`; the daemon's own runtime reports the
/// same through [`ExecRuntime::sandbox_status`]).
pub fn sandbox_status(settings: &ExecSettings) -> SandboxStatus {
    let kernel = sandbox::probe();
    let ns = jail::probe();
    let limits = cgroup::probe(settings.max_processes, settings.max_memory_mb);
    enforced(settings, kernel, jail_status(settings, ns, limits, true))
}

/// Start the once-per-process kernel probes (Landlock, and the namespaces, which fork a child
/// that creates them: ~1.3 ms) on a thread of their own, so that they overlap the store's
/// recovery instead of adding to the gateway's start. Whoever needs them first waits for them.
pub fn prewarm() {
    let _ = std::thread::Builder::new()
        .name("sandbox-probe".into())
        .spawn(|| {
            sandbox::probe();
            jail::probe();
        });
}

/// What is enforced for `settings`, given what the kernel supports and the jail's status.
fn enforced(settings: &ExecSettings, kernel: SandboxStatus, jail: JailStatus) -> SandboxStatus {
    SandboxStatus {
        landlock_abi: kernel.landlock_abi,
        fs_enforced: settings.sandbox && kernel.fs_enforced,
        net_enforced: settings.sandbox
            && settings.network == NetworkMode::Off
            && kernel.net_enforced,
        scoped: settings.sandbox && kernel.scoped,
        jail: Some(jail),
    }
}

impl ExecRuntime {
    /// Create the runtime: probes Landlock and namespaces (once per process), creates the
    /// private temp dir and the runtime's cgroups (when it can).
    ///
    /// # Errors
    /// The private temp dir cannot be created beneath `deps.tmp_base`, or the proxy socket path
    /// does not fit a Unix socket address.
    pub fn new(settings: ExecSettings, deps: ExecDeps) -> std::io::Result<Self> {
        Self::with_jail(settings, deps, jail::probe(), true)
    }

    /// [`ExecRuntime::new`] with the namespace support given and cgroups on or off (tests force
    /// the fallbacks).
    pub(super) fn with_jail(
        settings: ExecSettings,
        deps: ExecDeps,
        ns: NsSupport,
        cgroups: bool,
    ) -> std::io::Result<Self> {
        let tmp = PrivateTmp::create_in(&deps.tmp_base)?;
        let kernel = sandbox::probe();
        let cgroups = if cgroups {
            Cgroups::setup(settings.max_processes, settings.max_memory_mb).map(Arc::new)
        } else {
            None
        };
        let limits = cgroups
            .as_ref()
            .map_or((LimitKind::None, LimitKind::None), |c| c.kinds());
        let jail_status = jail_status(&settings, ns, limits, deps.proxy_socket.is_some());
        let network_ns = matches!(settings.network, NetworkMode::Proxy | NetworkMode::Off);
        let mut spec = JailSpec::new(ns, network_ns);
        spec.seccomp = jail_status.network == NetworkStatus::Seccomp;
        if jail_status.network == NetworkStatus::Proxy {
            if let Some(p) = &deps.proxy_socket {
                spec.proxy = Some(ProxyAddr::new(p)?);
            }
        }
        if jail_status.processes == LimitKind::Rlimit {
            spec.nproc = u64::from(settings.max_processes);
        }
        let stacks = if spec.execs() {
            let s = Stacks::new()?;
            spec.stacks = Some(s.tops());
            Some(s)
        } else {
            None
        };
        spec.confine = settings.sandbox;
        let jail = Jail {
            active: spec.ns_flags != 0 || spec.seccomp || cgroups.is_some(),
            proxy_env: spec.proxy.is_some(),
            spec,
            cgroups,
            ns,
            _stacks: stacks,
        };
        let status = enforced(&settings, kernel, jail_status);
        let env = sandbox::scrub_env(
            &deps.env,
            &settings.env_passthrough,
            &deps.secrets,
            tmp.path(),
        );
        let policy = ShellPolicy::new(
            settings.mode,
            &settings.deny_patterns,
            &settings.allow_commands,
        );
        Ok(Self {
            gate: CommandGate::new(policy, deps.approver, settings.approval_timeout),
            plan: SandboxPlan {
                read_paths: settings.read_paths.clone(),
                write_paths: settings.write_paths.clone(),
                protected: deps.protected_paths,
                network: settings.network != NetworkMode::Off,
            },
            status,
            tmp,
            env,
            spawn_slots: Arc::new(Semaphore::new(settings.max_concurrent_spawns)),
            settings,
            jail,
            rulesets: RulesetCache::default(),
            _proxy: deps.proxy,
        })
    }

    /// The command's Landlock ruleset (cached per workspace) and cgroup (an idle one when
    /// there is one); whatever must be built is built off the async threads.
    async fn prepare(
        &self,
        ws: &Path,
    ) -> Result<(Option<Arc<OwnedFd>>, Option<CommandCgroup>), ToolError> {
        let cached = if self.status.fs_enforced {
            self.rulesets.get(ws)
        } else {
            None
        };
        let reused = self.jail.cgroups.as_ref().and_then(Cgroups::reuse);
        let need_ruleset = self.status.fs_enforced && cached.is_none();
        let need_cgroup = self.jail.cgroups.is_some() && reused.is_none();
        if !need_ruleset && !need_cgroup {
            return Ok((cached, reused));
        }
        let plan = need_ruleset.then(|| self.plan.clone());
        let (tmp, root) = (self.tmp.path().to_path_buf(), ws.to_path_buf());
        let cgroups = if need_cgroup {
            self.jail.cgroups.clone()
        } else {
            None
        };
        let (built, made) = tokio::task::spawn_blocking(move || {
            let built = match plan {
                Some(plan) => {
                    let fd = plan.build_ruleset(&root, &tmp).map_err(|e| {
                        ToolError::ExecutionFailed(format!("could not prepare the sandbox: {e}"))
                    })?;
                    fd.map(|fd| (Arc::new(fd), !plan.splits_writable(&root, &tmp)))
                }
                None => None,
            };
            let made = match cgroups {
                Some(c) => Some(c.create().map_err(|e| {
                    ToolError::ExecutionFailed(format!(
                        "could not create the command's cgroup (its process and memory limits): {e}"
                    ))
                })?),
                None => None,
            };
            Ok::<_, ToolError>((built, made))
        })
        .await
        .map_err(|e| ToolError::ExecutionFailed(format!("sandbox setup task failed: {e}")))??;
        let ruleset = match built {
            Some((fd, cacheable)) => {
                if cacheable {
                    self.rulesets.put(ws.to_path_buf(), fd.clone());
                }
                Some(fd)
            }
            None => cached,
        };
        Ok((ruleset, made.or(reused)))
    }

    /// Build the ruleset for every command (the behaviour before the cache), for measurements.
    #[cfg(test)]
    pub(super) fn disable_ruleset_cache(&self) {
        self.rulesets
            .off
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The longest a call may take: the largest timeout plus an approval wait and cleanup.
    pub fn time_budget(&self) -> Duration {
        self.settings.max_timeout + self.settings.approval_timeout + Duration::from_secs(10)
    }

    /// What is enforced for commands (log it at start; show it in `weft status`).
    pub fn sandbox_status(&self) -> SandboxStatus {
        self.status
    }

    /// The settings.
    pub fn settings(&self) -> &ExecSettings {
        &self.settings
    }

    /// The private temp dir given to commands as `TMPDIR`.
    pub fn tmp_dir(&self) -> &Path {
        self.tmp.path()
    }

    pub(super) fn timeout(
        &self,
        requested: Option<f64>,
        default: Duration,
    ) -> Result<Duration, ToolError> {
        match requested {
            None => Ok(default.min(self.settings.max_timeout)),
            Some(t) if t.is_finite() && t > 0.0 => {
                let max = self.settings.max_timeout;
                Ok(if t >= max.as_secs_f64() {
                    max
                } else {
                    Duration::from_secs_f64(t)
                })
            }
            Some(t) => Err(ToolError::InvalidArgs(format!(
                "timeout must be a positive number of seconds (at most {}), got {t}",
                self.settings.max_timeout.as_secs()
            ))),
        }
    }

    /// Run `program args` under the sandbox until it exits, `timeout` passes or the call is
    /// cancelled. The process group is killed on every path out of this function.
    pub(super) async fn run(
        &self,
        ctx: &ToolContext,
        program: &OsStr,
        args: &[OsString],
        timeout: Duration,
    ) -> Result<Finished, ToolError> {
        self.run_with_env(ctx, program, args, timeout, &[]).await
    }

    /// [`Self::run`] with `extra` variables set in the command's environment (a custom tool's
    /// `env`), after the inherited ones and before the sandbox's own (`HOME`, the proxy).
    pub(super) async fn run_with_env(
        &self,
        ctx: &ToolContext,
        program: &OsStr,
        args: &[OsString],
        timeout: Duration,
        extra: &[(String, String)],
    ) -> Result<Finished, ToolError> {
        let Spawned {
            mut child,
            group,
            cgroup,
            started,
        } = self
            .spawn_sandboxed(ctx, program, args, extra, Stdio::null())
            .await?;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let cap = self.settings.max_output_bytes;
        let (mut out, mut err) = (Capture::new(cap), Capture::new(cap));
        let status = {
            let reading = async { tokio::join!(out.fill(stdout), err.fill(stderr)) };
            tokio::pin!(reading);
            let deadline = tokio::time::sleep(timeout);
            tokio::pin!(deadline);
            let mut read_all = false;
            let ended = loop {
                tokio::select! {
                    s = child.wait() => break s.map(Some).map_err(|e| ToolError::ExecutionFailed(format!("waiting for the command failed: {e}"))),
                    _ = &mut reading, if !read_all => read_all = true,
                    // Killed at its timeout: what it wrote before is still returned.
                    () = &mut deadline => break Ok(None),
                    () = ctx.cancel.cancelled() => break Err(ToolError::Cancelled),
                }
            };
            // Exited or not: nothing of this command outlives the call.
            drop(group);
            if !matches!(ended, Ok(Some(_))) {
                // The group kill covers the child too; this is in case it was not delivered.
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
            if ended.is_ok() && !read_all {
                // The pipes close with the group: keep what was still in them.
                let _ = tokio::time::timeout(DRAIN_GRACE, &mut reading).await;
            }
            ended?
        };
        let events = cgroup
            .as_ref()
            .map(CommandCgroup::events)
            .unwrap_or_default();
        if let Some(cg) = cgroup {
            drop(tokio::task::spawn_blocking(move || cg.finish()));
        }
        Ok(Finished {
            code: status.and_then(|s| s.code()),
            signal: match status {
                Some(s) => s.signal(),
                None => Some(libc::SIGKILL),
            },
            timed_out: status
                .is_none()
                .then(|| timeout.as_secs_f64().ceil() as u64),
            stdout: out,
            stderr: err,
            duration: started.elapsed(),
            events,
            max_processes: self.settings.max_processes,
            max_memory_mb: self.settings.max_memory_mb,
        })
    }

    /// Start `program args` in the sandbox, the jail and its own process group, exactly as
    /// every command is started (the one spawn path of `exec_shell`, `spawn`, custom tools and
    /// `process`), with `stdin` as given and stdout/stderr piped. The caller owns what comes
    /// back: dropping it kills the process group.
    pub(super) async fn spawn_sandboxed(
        &self,
        ctx: &ToolContext,
        program: &OsStr,
        args: &[OsString],
        extra: &[(String, String)],
        stdin: Stdio,
    ) -> Result<Spawned, ToolError> {
        self.spawn_in(
            ctx.workspace.root(),
            program,
            args,
            extra,
            (stdin, Stdio::piped()),
        )
        .await
    }

    /// Whether commands (and helpers) get network namespaces with the proxy bridged in.
    pub fn isolates_network(&self) -> bool {
        self.jail.proxy_env
    }

    /// Start a long-lived helper of the gateway (the browser) exactly as commands are
    /// started: `root` is its workspace (writable, its `HOME`), in the sandbox, the jail (its
    /// own network namespace, reaching out only through the proxy bridged in at
    /// [`PROXY_ADDR`]) and its own process group; stdin and stdout piped, stderr discarded.
    /// The caller kills the group when done.
    ///
    /// # Errors
    /// As for commands: the sandbox is required but missing, or the spawn failed.
    pub async fn spawn_helper(
        &self,
        root: &Path,
        program: &OsStr,
        args: &[OsString],
        extra: &[(String, String)],
    ) -> Result<tokio::process::Child, ToolError> {
        let s = self
            .spawn_in(root, program, args, extra, (Stdio::piped(), Stdio::null()))
            .await?;
        // The group is the caller's to kill; a cgroup (none for helpers without limits) is
        // left to the kernel's cleanup.
        std::mem::forget(s.group);
        Ok(s.child)
    }

    async fn spawn_in(
        &self,
        root: &Path,
        program: &OsStr,
        args: &[OsString],
        extra: &[(String, String)],
        (stdin, stderr): (Stdio, Stdio),
    ) -> Result<Spawned, ToolError> {
        if self.settings.require_sandbox && !self.status.fs_enforced {
            return Err(ToolError::PermissionDenied(format!(
                "commands are disabled: the exec sandbox is required but not enforced ({}); the operator must enable Landlock or set require_sandbox = false",
                self.status.summary()
            )));
        }
        if self.settings.require_sandbox
            && self.settings.network != NetworkMode::Direct
            && !self.jail.ns.available()
        {
            return Err(ToolError::PermissionDenied(format!(
                "commands are disabled: tools.exec.require_sandbox is set and commands cannot get their own network and pid namespaces ({}), so they would run with no network at all (seccomp) and processes that leave the process group could outlive them; the operator must allow user, network and pid namespaces (systemd: RestrictNamespaces=user net pid; Ubuntu: kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for weft; containers: --security-opt seccomp/apparmor) or set require_sandbox = false",
                self.jail.ns.reason()
            )));
        }
        let ws = root.to_path_buf();
        let (ruleset, cgroup) = self.prepare(&ws).await?;
        let mut env: Vec<(OsString, OsString)> = self.env.clone();
        let mut set = |name: &str, value: OsString| {
            env.retain(|(k, _)| k != name);
            env.push((name.into(), value));
        };
        for (k, v) in extra {
            set(k, v.into());
        }
        set("HOME", ws.clone().into_os_string());
        if self.jail.proxy_env {
            let url = format!("http://{PROXY_ADDR}");
            for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
                set(name, url.clone().into());
                set(&name.to_ascii_lowercase(), url.clone().into());
            }
            set("NO_PROXY", NO_PROXY.into());
            set("no_proxy", NO_PROXY.into());
        }
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .current_dir(&ws)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .process_group(0)
            .kill_on_drop(true);
        let ruleset_fd = ruleset.as_ref().map(AsRawFd::as_raw_fd);
        // Kept alive (and unchanged) until spawn returns: the child reads them.
        let mut image = None;
        if self.jail.active {
            let mut spec = self.jail.spec;
            if let Some(cg) = &cgroup {
                for (slot, fd) in spec.cgroup_procs.iter_mut().zip(cg.procs_fds()) {
                    *slot = fd;
                }
                spec.cgroups = cg.procs_fds().len().min(MAX_CGROUPS);
            }
            if spec.execs() {
                let mut img =
                    ExecImage::new(program, args, &env).map_err(|e| spawn_error(program, &e))?;
                spec.image = Some(img.raw());
                spec.ruleset = ruleset_fd.unwrap_or(-1);
                image = Some(img);
            }
            jail::install(&mut cmd, spec);
        }
        if self.settings.sandbox && !self.jail.spec.execs() {
            sandbox::confine(&mut cmd, ruleset_fd, true);
        }
        let started = Instant::now();
        let spawned = cmd.spawn();
        drop(ruleset);
        drop(image);
        let child = spawned.map_err(|e| spawn_error(program, &e))?;
        let group = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw)
            .map(GroupKiller);
        Ok(Spawned {
            child,
            group,
            cgroup,
            started,
        })
    }
}

/// A command just started by [`ExecRuntime::spawn_sandboxed`].
pub(super) struct Spawned {
    /// The spawned process (the jail's A when the jail is active), leader of its group.
    pub(super) child: tokio::process::Child,
    /// Kills the group when dropped.
    pub(super) group: Option<GroupKiller>,
    /// The command's cgroup (read its events, then `finish` it off the async threads).
    pub(super) cgroup: Option<CommandCgroup>,
    /// When it was started.
    pub(super) started: Instant,
}

fn spawn_error(program: &OsStr, e: &std::io::Error) -> ToolError {
    let p = program.to_string_lossy();
    match e.kind() {
        std::io::ErrorKind::NotFound => ToolError::ExecutionFailed(format!(
            "`{p}`: program not found (nor the workspace directory); check the name, or use an absolute path"
        )),
        _ if e.raw_os_error() == Some(libc::E2BIG) => ToolError::ExecutionFailed(format!(
            "`{p}`: the command line is too long for the OS (at most 128 KiB per argument); write the script to a file in the workspace and run that file instead"
        )),
        std::io::ErrorKind::PermissionDenied => ToolError::PermissionDenied(format!(
            "`{p}` may not be executed here: only programs under the system directories, the workspace and configured read_paths can run"
        )),
        _ => ToolError::ExecutionFailed(format!("could not start `{p}`: {e}")),
    }
}

/// Kills a process group with SIGKILL when dropped.
pub(super) struct GroupKiller(rustix::process::Pid);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        // ESRCH (the group is already gone) is the normal case.
        let _ = rustix::process::kill_process_group(self.0, rustix::process::Signal::KILL);
    }
}

/// Bytes read from one pipe, capped.
struct Capture {
    buf: Vec<u8>,
    cap: usize,
    truncated: bool,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Self {
            buf: Vec::new(),
            cap,
            truncated: false,
        }
    }

    /// Read until EOF or an error, keeping the first `cap` bytes and discarding the rest.
    async fn fill(&mut self, pipe: Option<impl AsyncRead + Unpin>) {
        let Some(mut pipe) = pipe else { return };
        let mut chunk = vec![0u8; READ_CHUNK];
        loop {
            match pipe.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let room = self.cap.saturating_sub(self.buf.len());
                    if n > room {
                        self.truncated = true;
                    }
                    self.buf.extend_from_slice(&chunk[..n.min(room)]);
                }
            }
        }
    }

    /// The text (invalid UTF-8 replaced; a character cut by the cap dropped).
    fn text(&self) -> String {
        let mut bytes = self.buf.as_slice();
        if self.truncated {
            if let Err(e) = std::str::from_utf8(bytes) {
                if e.error_len().is_none() {
                    bytes = &bytes[..e.valid_up_to()];
                }
            }
        }
        String::from_utf8_lossy(bytes).into_owned()
    }
}

/// A command that ran to its end.
pub(super) struct Finished {
    code: Option<i32>,
    signal: Option<i32>,
    /// Killed at its timeout (seconds): the output is what arrived before.
    timed_out: Option<u64>,
    stdout: Capture,
    stderr: Capture,
    duration: Duration,
    events: Events,
    max_processes: u32,
    max_memory_mb: u64,
}

impl Finished {
    /// `{exit_code, stdout, stderr, duration_ms}` plus `signal`, `stdout_truncated`,
    /// `stderr_truncated`, `timed_out` and `partial` when they apply.
    pub(super) fn to_json(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("exit_code".into(), json!(self.code.unwrap_or(-1)));
        m.insert("stdout".into(), json!(self.stdout.text()));
        m.insert("stderr".into(), json!(self.stderr.text()));
        m.insert(
            "duration_ms".into(),
            json!(u64::try_from(self.duration.as_millis()).unwrap_or(u64::MAX)),
        );
        if let Some(sig) = self.signal {
            m.insert("signal".into(), json!(sig));
        }
        if self.stdout.truncated {
            m.insert("stdout_truncated".into(), json!(true));
        }
        if self.stderr.truncated {
            m.insert("stderr_truncated".into(), json!(true));
        }
        let mut notes = Vec::new();
        if let Some(secs) = self.timed_out {
            m.insert("timed_out".into(), json!(true));
            m.insert("partial".into(), json!(true));
            notes.push(format!(
                "timed out: the command was killed after {secs}s; stdout and stderr are what it wrote before (give a larger timeout, or run it with the process tool)"
            ));
        }
        if self.events.oom_kills > 0 {
            m.insert("oom_killed".into(), json!(true));
            notes.push(format!(
                "out of memory: the command used more than its {} MiB (tools.exec.max_memory_mb) and the kernel killed it",
                self.max_memory_mb
            ));
        }
        if self.events.pids_max > 0 {
            m.insert("process_limit_reached".into(), json!(true));
            notes.push(format!(
                "process limit: the command reached {} processes and threads (tools.exec.max_processes); further forks failed",
                self.max_processes
            ));
        }
        if !notes.is_empty() {
            m.insert("note".into(), json!(notes.join("; ")));
        }
        m
    }
}

#[cfg(test)]
#[path = "runtime_tests.rs"]
mod tests;
