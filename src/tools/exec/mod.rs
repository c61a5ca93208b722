//! Process tools: `exec_shell` (a `sh -c` command line) and `spawn` (a program with arguments,
//! at most 5 at once). Both vet the command with the [`CommandGate`] (denylist, allowlist or
//! human approval: a speed bump), then run it in the workspace directory, in its own process
//! group, inside the [`sandbox`](super::sandbox) (the boundary) and its own jail (network and
//! pid namespaces, a cgroup with process and memory limits), with a scrubbed environment, stdin
//! closed and stdout/stderr captured up to a cap.
//!
//! Every exit path kills the whole process group with SIGKILL: timeout, cancellation, the
//! call's future being dropped (the registry's own timeout) and normal exit (background jobs do
//! not outlive the call, and a grandchild holding the pipes open cannot make it hang).
//! Tools never decide what reaches the model beyond their result: the registry scrubs secrets
//! and truncates to 64 KiB.
//!
//! - [`settings`]: `tools.exec` ([`ExecFile`]) and its validated form ([`ExecSettings`]).
//! - [`runtime`]: [`ExecRuntime`]: spawning in the sandbox, process groups, timeouts, output
//!   capture.
//! - [`tools`]: the `exec_shell` and `spawn` tools over the runtime.
//! - [`process`]: the `process` tool (background commands, same spawn path) and the daemon's
//!   [`process::ProcessTable`].
//! - `jail` (private): the child side of the jail: namespaces, the init and its bridge to the
//!   egress proxy, the exec, the seccomp fallback, the namespace probe.
//! - `cgroup` (private): per-command cgroups (v1 or delegated v2), their limits and events.

mod cgroup;
pub mod custom;
mod jail;
pub mod process;
pub mod runtime;
pub mod settings;
pub mod tools;

#[cfg(test)]
mod test_support;

pub use runtime::{prewarm, sandbox_status, ExecDeps, ExecRuntime, PROXY_ADDR};
pub use settings::{
    ExecFile, ExecSettings, NetworkMode, NetworkSetting, DEFAULT_APPROVAL_TIMEOUT_SECS,
    DEFAULT_BACKGROUND_IDLE_SECS, DEFAULT_MAX_BACKGROUND_PROCESSES, DEFAULT_MAX_CONCURRENT_SPAWNS,
    DEFAULT_MAX_MEMORY_MB, DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_PROCESSES,
    DEFAULT_MAX_TIMEOUT_SECS, DEFAULT_SPAWN_TIMEOUT_SECS, DEFAULT_TIMEOUT_SECS,
};
pub use tools::{ExecShell, ExecShellArgs, Spawn, SpawnArgs};
