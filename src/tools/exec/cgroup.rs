//! Per-command cgroups (parent side): a pids and a memory limit for each command, CPU grouping
//! of all commands, the limit events read after the command, and a last sweep that kills what
//! is left in the command's cgroup before it is removed.
//!
//! Where the daemon can create cgroups:
//! - **cgroup v1** (v1 or hybrid hosts): in the `pids`, `memory` and `cpu` hierarchies, beneath
//!   the daemon's own cgroup of each, when that directory is writable (a root daemon, or a tree
//!   delegated to its user). A runtime directory `clawft-exec-<pid>-<random>` holds one
//!   directory per command (`c<N>`) for pids and memory; every command joins the runtime
//!   directory of the cpu hierarchy, so all commands together compete for CPU as one group.
//! - **cgroup v2**: beneath the daemon's own cgroup when it is delegated to it (systemd
//!   `Delegate=`: `cgroup.subtree_control` writable, `pids`/`memory` in `cgroup.controllers`).
//!   v2 allows no processes in a cgroup that hands controllers down, so the daemon first moves
//!   itself (and its own children) into a leaf `clawft-daemon`; then it creates the runtime
//!   directory with pids, memory and cpu enabled, and one child per command.
//!
//! Otherwise there is no cgroup: the runtime falls back to `RLIMIT_NPROC` in the command's own
//! user namespace for processes, and to no memory limit (an address-space limit breaks JITs:
//! node cannot allocate 500 MB under `RLIMIT_AS` = 1 GiB, java does not start under 2 GiB).

use std::fs;
use std::io::{self, Write as _};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

pub(super) use crate::tools::sandbox::LimitKind;

const RUNTIME_PREFIX: &str = "clawft-exec-";
const DAEMON_LEAF: &str = "clawft-daemon";
/// How long the sweep of a command's cgroup keeps killing and retrying the removal.
const SWEEP_FOR: Duration = Duration::from_secs(5);

/// The cgroups of one runtime.
#[derive(Debug)]
pub(super) struct Cgroups {
    layout: Layout,
    max_processes: u32,
    max_memory_mb: u64,
    /// v1: the runtime directory of the cpu hierarchy, which every command joins.
    cpu_procs: Option<OwnedFd>,
    next: AtomicU64,
    /// Command cgroups whose command ended and left nothing behind: reused (a mkdir and rmdir
    /// of a memory cgroup cost more than the command `true`).
    idle: Mutex<Vec<Slot>>,
}

/// Command cgroups kept for reuse at most.
const MAX_IDLE: usize = 16;

#[derive(Debug)]
enum Layout {
    /// Runtime directories in each v1 hierarchy that could be used.
    V1 {
        pids: Option<PathBuf>,
        memory: Option<PathBuf>,
        cpu: Option<PathBuf>,
    },
    /// The v2 runtime directory and the controllers enabled beneath it.
    V2 {
        dir: PathBuf,
        pids: bool,
        memory: bool,
    },
}

impl Cgroups {
    /// Create the runtime's cgroup directories, if the daemon can (see the module docs).
    /// `None`: no cgroup at all.
    pub(super) fn setup(max_processes: u32, max_memory_mb: u64) -> Option<Self> {
        let name = format!(
            "{RUNTIME_PREFIX}{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        );
        let layout = setup_v2(&name, max_processes, max_memory_mb)
            .or_else(|| setup_v1(&name, max_processes, max_memory_mb))?;
        let cpu_procs = match &layout {
            Layout::V1 { cpu: Some(dir), .. } => open_procs(dir).ok(),
            _ => None,
        };
        Some(Self {
            layout,
            max_processes,
            max_memory_mb,
            cpu_procs,
            next: AtomicU64::new(0),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// What limits processes and memory with these cgroups.
    pub(super) fn kinds(&self) -> (LimitKind, LimitKind) {
        let kind = |used: bool, k: LimitKind| if used { k } else { LimitKind::None };
        match &self.layout {
            Layout::V1 { pids, memory, .. } => (
                kind(pids.is_some(), LimitKind::CgroupV1),
                kind(memory.is_some(), LimitKind::CgroupV1),
            ),
            Layout::V2 { pids, memory, .. } => (
                kind(*pids, LimitKind::CgroupV2),
                kind(*memory, LimitKind::CgroupV2),
            ),
        }
    }

    fn v2(&self) -> bool {
        matches!(self.layout, Layout::V2 { .. })
    }

    /// An idle command cgroup, if there is one (never blocks on the filesystem).
    pub(super) fn reuse(self: &Arc<Self>) -> Option<CommandCgroup> {
        let slot = self.idle.lock().ok()?.pop()?;
        Some(self.wrap(slot))
    }

    fn wrap(self: &Arc<Self>, slot: Slot) -> CommandCgroup {
        CommandCgroup {
            slot: Some(slot),
            owner: Arc::downgrade(self),
            shared_procs: self.cpu_procs.as_ref().map(AsRawFd::as_raw_fd),
            v2: self.v2(),
        }
    }

    /// A cgroup for one command, with its limits set: an idle one, or a new one. Blocking
    /// (cgroupfs writes).
    ///
    /// # Errors
    /// A directory or limit file could not be written.
    pub(super) fn create(self: &Arc<Self>) -> io::Result<CommandCgroup> {
        if let Some(c) = self.reuse() {
            return Ok(c);
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("c{n}");
        let mut slot = Slot::default();
        let bytes = self.max_memory_mb.saturating_mul(1024 * 1024);
        let made = (|| -> io::Result<()> {
            match &self.layout {
                Layout::V1 { pids, memory, .. } => {
                    if let Some(rt) = pids {
                        let dir = slot.make(&rt.join(&name))?;
                        write_file(&dir.join("pids.max"), &self.max_processes.to_string())?;
                        slot.pids_dir = Some(dir);
                    }
                    if let Some(rt) = memory {
                        let dir = slot.make(&rt.join(&name))?;
                        write_file(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
                        // With swap accounting, swap counts too (it must be >= the limit).
                        let _ = write_file(
                            &dir.join("memory.memsw.limit_in_bytes"),
                            &bytes.to_string(),
                        );
                        slot.memory_dir = Some(dir);
                    }
                }
                Layout::V2 { dir, pids, memory } => {
                    let d = slot.make(&dir.join(&name))?;
                    if *pids {
                        write_file(&d.join("pids.max"), &self.max_processes.to_string())?;
                        slot.pids_dir = Some(d.clone());
                    }
                    if *memory {
                        write_file(&d.join("memory.max"), &bytes.to_string())?;
                        // The limit is on memory as a whole, not RAM plus whatever swap there
                        // is; and an OOM kill ends the whole command, not one random process.
                        let _ = write_file(&d.join("memory.swap.max"), "0");
                        let _ = write_file(&d.join("memory.oom.group"), "1");
                        slot.memory_dir = Some(d);
                    }
                }
            }
            for d in &slot.dirs {
                slot.procs.push(open_procs(d)?);
            }
            Ok(())
        })();
        if let Err(e) = made {
            for d in &slot.dirs {
                let _ = fs::remove_dir(d);
            }
            return Err(e);
        }
        slot.base = slot.counters(self.v2());
        Ok(self.wrap(slot))
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        if let Ok(idle) = self.idle.get_mut() {
            for slot in idle.drain(..) {
                for d in &slot.dirs {
                    let _ = fs::remove_dir(d);
                }
            }
        }
        let dirs: Vec<&PathBuf> = match &self.layout {
            Layout::V1 { pids, memory, cpu } => [pids, memory, cpu].into_iter().flatten().collect(),
            Layout::V2 { dir, .. } => vec![dir],
        };
        for d in dirs {
            remove_tree(d);
        }
    }
}

/// The directories of one command cgroup and their open `cgroup.procs` files.
#[derive(Debug, Default)]
struct Slot {
    dirs: Vec<PathBuf>,
    procs: Vec<OwnedFd>,
    pids_dir: Option<PathBuf>,
    memory_dir: Option<PathBuf>,
    /// The counters when this use of the slot began.
    base: Events,
}

impl Slot {
    fn make(&mut self, dir: &Path) -> io::Result<PathBuf> {
        match fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        self.dirs.push(dir.to_path_buf());
        Ok(dir.to_path_buf())
    }

    /// The cumulative counters of the slot's cgroups.
    fn counters(&self, v2: bool) -> Events {
        let pids_max = self
            .pids_dir
            .as_ref()
            .and_then(|d| counter(&d.join("pids.events"), "max"))
            .unwrap_or(0);
        let oom_kills = self
            .memory_dir
            .as_ref()
            .and_then(|d| {
                let file = if v2 {
                    "memory.events"
                } else {
                    "memory.oom_control"
                };
                counter(&d.join(file), "oom_kill")
            })
            .unwrap_or(0);
        Events {
            oom_kills,
            pids_max,
        }
    }
}

/// The cgroup(s) of one command: joined by the command's first process before anything else
/// runs, read for limit events, swept at the end and then reused or removed.
#[derive(Debug)]
pub(super) struct CommandCgroup {
    slot: Option<Slot>,
    owner: Weak<Cgroups>,
    shared_procs: Option<RawFd>,
    v2: bool,
}

/// Limit events of one command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Events {
    /// Processes killed by the OOM killer because of the memory limit.
    pub oom_kills: u64,
    /// Forks refused because of the pids limit.
    pub pids_max: u64,
}

impl CommandCgroup {
    /// The `cgroup.procs` files the command's first process writes "0" into (valid while
    /// `self` and the runtime live).
    pub(super) fn procs_fds(&self) -> Vec<RawFd> {
        self.slot
            .iter()
            .flat_map(|s| s.procs.iter().map(AsRawFd::as_raw_fd))
            .chain(self.shared_procs)
            .collect()
    }

    /// What the limits did during this command.
    pub(super) fn events(&self) -> Events {
        let Some(slot) = &self.slot else {
            return Events::default();
        };
        let now = slot.counters(self.v2);
        Events {
            oom_kills: now.oom_kills.saturating_sub(slot.base.oom_kills),
            pids_max: now.pids_max.saturating_sub(slot.base.pids_max),
        }
    }

    /// Kill whatever is left in the command's cgroups; then keep them for the next command if
    /// they are empty, else a thread keeps killing and then removes them.
    pub(super) fn finish(mut self) {
        self.release();
    }

    fn release(&mut self) {
        let Some(mut slot) = self.slot.take() else {
            return;
        };
        let v2 = self.v2;
        if sweep_once(&slot.dirs, v2, false) {
            if let Some(owner) = self.owner.upgrade() {
                slot.base = slot.counters(v2);
                if let Ok(mut idle) = owner.idle.lock() {
                    if idle.len() < MAX_IDLE {
                        idle.push(slot);
                        return;
                    }
                }
            }
            for d in &slot.dirs {
                let _ = fs::remove_dir(d);
            }
            return;
        }
        let dirs = std::mem::take(&mut slot.dirs);
        drop(slot);
        let _ = std::thread::Builder::new()
            .name("exec-cgroup-sweep".into())
            .spawn(move || {
                let end = Instant::now() + SWEEP_FOR;
                while Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(20));
                    if sweep_once(&dirs, v2, true) {
                        return;
                    }
                }
                tracing::warn!(?dirs, "a command's cgroup could not be removed");
            });
    }
}

impl Drop for CommandCgroup {
    fn drop(&mut self) {
        self.release();
    }
}

/// One round: kill every process in `dirs` (and remove the directories when `remove`). True
/// when they were all empty (and, with `remove`, are gone).
fn sweep_once(dirs: &[PathBuf], v2: bool, remove: bool) -> bool {
    let mut all = true;
    for d in dirs {
        let Ok(list) = fs::read_to_string(d.join("cgroup.procs")) else {
            continue;
        };
        if !list.trim().is_empty() {
            all = false;
            if v2 && write_file(&d.join("cgroup.kill"), "1").is_ok() {
                // Kernel >= 5.14 kills the whole cgroup at once.
            } else {
                for pid in list.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                    }
                }
            }
        }
        if remove && fs::remove_dir(d).is_err() && d.exists() {
            all = false;
        }
    }
    all
}

/// Remove a runtime directory: its command directories first (killing what is left in them).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        let subs: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        let _ = sweep_once(&subs, is_v2_dir(dir), true);
    }
    let _ = fs::remove_dir(dir);
}

fn is_v2_dir(dir: &Path) -> bool {
    dir.join("cgroup.controllers").exists()
}

/// `key N` from a flat keyed file (`pids.events`, `memory.events`, `memory.oom_control`).
fn counter(file: &Path, key: &str) -> Option<u64> {
    let text = fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn write_file(p: &Path, value: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).open(p)?;
    f.write_all(value.as_bytes())
}

fn open_procs(dir: &Path) -> io::Result<OwnedFd> {
    let f = fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.procs"))?;
    Ok(OwnedFd::from(f))
}

fn writable(p: &Path) -> bool {
    rustix::fs::access(p, rustix::fs::Access::WRITE_OK).is_ok()
}

/// One line of `/proc/self/cgroup`: hierarchy id, controllers, path.
struct Membership {
    id: String,
    controllers: Vec<String>,
    path: String,
}

fn memberships() -> Vec<Membership> {
    let Ok(text) = fs::read_to_string("/proc/self/cgroup") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let id = it.next()?.to_string();
            let controllers = it
                .next()?
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            let path = it.next()?.to_string();
            Some(Membership {
                id,
                controllers,
                path,
            })
        })
        .collect()
}

/// A cgroup mount from `/proc/self/mountinfo`.
struct Mount {
    root: String,
    point: PathBuf,
    fstype: String,
    options: Vec<String>,
}

fn mounts() -> Vec<Mount> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            let fstype = (*r.first()?).to_string();
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(Mount {
                root: (*f.get(3)?).to_string(),
                point: PathBuf::from(*f.get(4)?),
                fstype,
                options: r.get(2)?.split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

/// The directory of `path` (a cgroup path) under `mount`.
fn dir_under(mount: &Mount, path: &str) -> Option<PathBuf> {
    let rel = if mount.root == "/" {
        path
    } else {
        path.strip_prefix(mount.root.as_str())?
    };
    Some(mount.point.join(rel.trim_start_matches('/')))
}

/// The daemon's own directory in the v1 hierarchy of `controller`.
fn v1_dir(controller: &str) -> Option<PathBuf> {
    let m = memberships()
        .into_iter()
        .find(|m| m.id != "0" && m.controllers.iter().any(|c| c == controller))?;
    let mount = mounts()
        .into_iter()
        .find(|mt| mt.fstype == "cgroup" && mt.options.iter().any(|o| o == controller))?;
    dir_under(&mount, &m.path).filter(|d| d.is_dir())
}

/// The daemon's own cgroup path in the v2 hierarchy.
fn v2_path() -> Option<String> {
    memberships()
        .into_iter()
        .find(|m| m.id == "0" && m.controllers.is_empty())
        .map(|m| m.path)
}

/// The daemon's own directory in the v2 hierarchy.
fn v2_dir() -> Option<PathBuf> {
    let path = v2_path()?;
    let mount = mounts().into_iter().find(|mt| mt.fstype == "cgroup2")?;
    dir_under(&mount, &path).filter(|d| d.is_dir())
}

/// The v1 runtime directories this daemon can create.
fn setup_v1(name: &str, max_processes: u32, max_memory_mb: u64) -> Option<Layout> {
    let make = |controller: &str, wanted: bool| -> Option<PathBuf> {
        if !wanted {
            return None;
        }
        let own = v1_dir(controller)?;
        if !writable(&own) {
            return None;
        }
        remove_stale(&own);
        let dir = own.join(name);
        fs::create_dir(&dir).ok()?;
        Some(dir)
    };
    let pids = make("pids", max_processes > 0);
    let memory = make("memory", max_memory_mb > 0);
    let cpu = make("cpu", true);
    (pids.is_some() || memory.is_some() || cpu.is_some()).then_some(Layout::V1 {
        pids,
        memory,
        cpu,
    })
}

/// Where v2 cgroups can be delegated from: the daemon's own cgroup, or its parent when the
/// daemon already sits in its `clawft-daemon` leaf (a second runtime after a reload).
fn v2_base() -> Option<(PathBuf, bool)> {
    let own = v2_dir()?;
    if own.file_name().is_some_and(|n| n == DAEMON_LEAF) {
        let parent = own.parent()?.to_path_buf();
        return Some((parent, true));
    }
    Some((own, false))
}

/// The controllers available at `base` among pids (if wanted), memory (if wanted) and cpu.
fn v2_wanted(base: &Path, max_processes: u32, max_memory_mb: u64) -> Vec<&'static str> {
    let available = fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
    let has = |c: &str| available.split_whitespace().any(|a| a == c);
    [
        ("pids", max_processes > 0),
        ("memory", max_memory_mb > 0),
        ("cpu", true),
    ]
    .into_iter()
    .filter(|(c, wanted)| *wanted && has(c))
    .map(|(c, _)| c)
    .collect()
}

/// Whether the daemon may manage the cgroup tree beneath `base`: it was delegated to it
/// (systemd `Delegate=`: writable by a non-root daemon at all only then, and marked with the
/// `trusted.delegate`/`user.delegate` attribute by systemd >= 251), or it is the root of the
/// daemon's cgroup namespace (a container's own tree). A root daemon in someone else's
/// cgroup (a systemd unit without `Delegate=`) leaves it alone.
fn delegated(base: &Path, own_path: &str) -> bool {
    if !writable(&base.join("cgroup.subtree_control")) {
        return false;
    }
    if !rustix::process::geteuid().is_root() || own_path == "/" {
        return true;
    }
    let mut buf = [0u8; 8];
    ["trusted.delegate", "user.delegate"].iter().any(|attr| {
        rustix::fs::getxattr(base, *attr, &mut buf).is_ok_and(|n| n > 0 && buf[0] == b'1')
    })
}

fn setup_v2(name: &str, max_processes: u32, max_memory_mb: u64) -> Option<Layout> {
    let (base, in_leaf) = v2_base()?;
    let mut wanted = v2_wanted(&base, max_processes, max_memory_mb);
    let pids = wanted.contains(&"pids");
    let memory = wanted.contains(&"memory");
    if !(pids || memory) || !delegated(&base, &v2_path().unwrap_or_default()) {
        return None;
    }
    if !in_leaf {
        // Only the daemon and its own children may be moved: never someone else's processes
        // (a shell that started `weft gateway` in the same cgroup).
        let me = std::process::id();
        let procs: Vec<u32> = fs::read_to_string(base.join("cgroup.procs"))
            .ok()?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if !procs.iter().all(|p| *p == me || parent_of(*p) == Some(me)) {
            return None;
        }
        let leaf = base.join(DAEMON_LEAF);
        match fs::create_dir(&leaf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(_) => return None,
        }
        for p in procs {
            if write_file(&leaf.join("cgroup.procs"), &p.to_string()).is_err() && p == me {
                return None;
            }
        }
    }
    let enable_of = |w: &[&str]| {
        w.iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut enable = enable_of(&wanted);
    if write_file(&base.join("cgroup.subtree_control"), &enable).is_err() {
        // The cpu controller cannot always be enabled (real-time processes); limits matter more.
        wanted.retain(|c| *c != "cpu");
        enable = enable_of(&wanted);
        write_file(&base.join("cgroup.subtree_control"), &enable).ok()?;
    }
    remove_stale(&base);
    let dir = base.join(name);
    fs::create_dir(&dir).ok()?;
    if write_file(&dir.join("cgroup.subtree_control"), &enable).is_err() {
        let _ = fs::remove_dir(&dir);
        return None;
    }
    Some(Layout::V2 { dir, pids, memory })
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Remove runtime directories left by daemons that are gone (crashed or killed).
fn remove_stale(own: &Path) {
    let Ok(entries) = fs::read_dir(own) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(RUNTIME_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove_tree(&e.path());
        }
    }
}

/// What would limit processes and memory, without creating anything (for `weft status`).
pub(super) fn probe(max_processes: u32, max_memory_mb: u64) -> (LimitKind, LimitKind) {
    if let Some((base, _)) = v2_base() {
        let wanted = v2_wanted(&base, max_processes, max_memory_mb);
        if delegated(&base, &v2_path().unwrap_or_default())
            && (wanted.contains(&"pids") || wanted.contains(&"memory"))
        {
            let k = |c| {
                if wanted.contains(&c) {
                    LimitKind::CgroupV2
                } else {
                    LimitKind::None
                }
            };
            return (k("pids"), k("memory"));
        }
    }
    let v1 = |c: &str, wanted: bool| {
        if wanted && v1_dir(c).is_some_and(|d| writable(&d)) {
            LimitKind::CgroupV1
        } else {
            LimitKind::None
        }
    };
    (
        v1("pids", max_processes > 0),
        v1("memory", max_memory_mb > 0),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn counters_are_read_from_keyed_files() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("memory.oom_control");
        fs::write(&f, "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n").unwrap();
        assert_eq!(counter(&f, "oom_kill"), Some(3));
        assert_eq!(counter(&f, "max"), None);
        let f = d.path().join("pids.events");
        fs::write(&f, "max 17\n").unwrap();
        assert_eq!(counter(&f, "max"), Some(17));
    }

    #[test]
    fn dirs_under_a_mount_follow_its_root() {
        let m = Mount {
            root: "/docker/abc".into(),
            point: PathBuf::from("/sys/fs/cgroup/pids"),
            fstype: "cgroup".into(),
            options: vec!["rw".into(), "pids".into()],
        };
        assert_eq!(
            dir_under(&m, "/docker/abc/x"),
            Some(PathBuf::from("/sys/fs/cgroup/pids/x"))
        );
        assert_eq!(dir_under(&m, "/other"), None);
    }
}
