//! ⑥ The scheduling core: schedules (`at`, `every`, `cron` in an IANA zone) and their next
//! occurrence ([`schedule`]), the runs due after a downtime by catch-up policy with their
//! exactly-once run ids ([`catchup`]), and the jobs in the store with their limits, run records
//! and auto-pause ([`jobs`]). Pure and clock-free: every function is given `now`. It holds no
//! timer, starts no turn and sends nothing; the daemon does, through the same exactly-once path
//! as a user message (docs/architecture.md, "Scheduler: schedules and time zones").

pub mod catchup;
pub mod cron;
pub mod jobs;
pub mod runtime;
pub mod schedule;
pub mod settings;
pub mod shared;
pub mod tool;
pub use crate::types::tz;

pub use catchup::{CatchUp, Plan, Run, RunId};
pub use jobs::{Deliver, Job, JobError, JobPatch, JobStore, NewJob, Outcome, Payload, Target};
pub use runtime::Scheduler;
pub use schedule::{Compiled, Schedule, ScheduleError};
pub use settings::{HeartbeatFile, HeartbeatSettings, SchedulerFile, SchedulerSettings};
