//! The `weft` command line: one file per subcommand.

pub mod agent;
pub mod agents;
pub mod approvals;
pub mod client;
pub mod cluster;
pub mod completions;
pub mod config_cmd;
pub mod control;
pub mod cron;
pub mod dashboard;
pub mod doctor;
pub mod gateway;
pub mod help;
pub mod human;
pub mod logs;
pub mod mcp;
pub mod memory;
pub mod node;
pub mod onboard;
pub mod pairing;
pub mod service;
pub mod sessions;
pub mod status;
pub mod store;
pub mod terminal;
pub mod tools;
pub mod usage;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::telemetry::LogFormat;

/// weft: an agent gateway connecting chat channels to LLM agents that act through tools.
#[derive(Debug, Parser)]
#[command(name = "weft", version, about)]
pub struct Cli {
    /// Configuration file (default: ~/.clawft/config.toml or config.json).
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Colour in log lines: auto (only when stderr is a terminal and NO_COLOR is unset),
    /// always or never.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "auto",
        value_name = "WHEN"
    )]
    pub color: crate::telemetry::ColorChoice,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a commented default config and create the workspace.
    Onboard {
        /// Overwrite an existing config file.
        #[arg(long)]
        force: bool,
    },
    /// Talk to the agent: one message with -m, or an interactive chat on the terminal.
    Agent {
        /// Send this one message, print the reply and exit.
        #[arg(short, long, value_parser = non_blank_message)]
        message: Option<String>,
        /// Conversation to use (default: `default`).
        #[arg(short, long, default_value = "default")]
        session: String,
        /// The agent to talk to (`main`, or a name of `agents.NAME`; `weft agents list`).
        #[arg(long)]
        agent: Option<String>,
    },
    /// The agents of this configuration and the bindings that choose them.
    Agents {
        /// What to do.
        #[command(subcommand)]
        action: agents::AgentsAction,
    },
    /// Run the daemon: all enabled channels and the HTTP API, until SIGINT/SIGTERM.
    Gateway,
    /// Install, remove or inspect the systemd unit (user unit; --system for the system one).
    Service {
        /// What to do.
        #[command(subcommand)]
        action: service::ServiceAction,
    },
    /// Show configuration, store, providers, channels and sessions (text; JSON with --json).
    Status {
        /// Print JSON (what the text shows, and more).
        #[arg(long)]
        json: bool,
    },
    /// List, show or clear stored conversations.
    Sessions {
        /// What to do.
        #[command(subcommand)]
        action: SessionsAction,
    },
    /// Tokens and spend (US dollars, from the price table) per UTC day, session, model or user.
    Usage {
        /// How to group the rows.
        #[arg(long, value_enum, default_value = "day")]
        by: usage::UsageBy,
        /// How many UTC days back, today included.
        #[arg(long, default_value_t = 30)]
        days: u64,
        /// One chat's life day by day: its turns, and the input tokens and cost per turn.
        #[arg(long, value_name = "KEY")]
        session: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check the setup (config, credentials, providers, channel tokens, MCP servers, store,
    /// sandbox, permissions, HTTP bind): ok / warn / fail with the fix. Exit 1 on a failure.
    Doctor {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run this machine as a node of a gateway elsewhere: the agent there can then run
    /// commands and use files in this node's workspace (after the gateway's operator approves
    /// it with `weft nodes approve`).
    Node {
        /// The gateway's address: wss://HOST[:PORT] (ws://127.0.0.1:PORT on the same machine);
        /// default: node.gateway of the configuration.
        #[arg(long, value_name = "URL")]
        gateway: Option<String>,
        /// This node's name (default: the host name).
        #[arg(long)]
        name: Option<String>,
        /// The workspace the gateway's agent works in (default: agent.workspace).
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// What to offer, comma-separated: info, read, write, list, run, notify (default: all;
        /// notify when notify-send is installed).
        #[arg(long, value_delimiter = ',')]
        offer: Vec<String>,
        /// Where the node's key lives (default: ~/.clawft/node).
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// The gateway's key fingerprint (SHA256:..., from `weft nodes list` there) to trust;
        /// default: the key of the gateway that approves this node, pinned at pairing.
        #[arg(long, value_name = "FINGERPRINT")]
        gateway_key: Option<String>,
        /// PEM file of the authority (or self-signed certificate) of a wss:// gateway,
        /// trusted instead of the public web roots.
        #[arg(long, value_name = "FILE")]
        gateway_ca: Option<PathBuf>,
    },
    /// Cluster mode: nodes, partitions and connection leases (`[cluster]`, docs/cluster.md).
    Cluster {
        /// What to show.
        #[command(subcommand)]
        action: cluster::ClusterAction,
    },
    /// Pair, deny or revoke nodes (machines running `weft node`).
    Nodes {
        /// What to do.
        #[command(subcommand)]
        action: node::NodesAction,
    },
    /// Send a message to a chat through the running gateway (for scripts and cron jobs).
    Send {
        /// Channel id: telegram, discord, slack, http, or `<platform>.NAME` for bot account NAME
        /// (e.g. telegram.work).
        channel: String,
        /// Chat id on that channel.
        chat_id: String,
        /// Message text (Markdown).
        text: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check, back up or restore the store.
    Store {
        /// What to do.
        #[command(subcommand)]
        action: store::StoreAction,
    },
    /// Scheduled jobs: list, add, remove, run, pause, resume, runs (through the running
    /// gateway).
    Cron {
        /// What to do.
        #[command(subcommand)]
        action: cron::CronAction,
    },
    /// Tool calls waiting for a person's approval: list them, approve or deny one (through the
    /// running gateway).
    Approvals {
        /// What to do.
        #[command(subcommand)]
        action: approvals::ApprovalsAction,
    },
    /// Print a one-time login link to the control UI of the running gateway (and open it in
    /// the desktop's browser when there is one), or end every UI session.
    Dashboard {
        /// The link grants a read-only session (pages, no changes).
        #[arg(long)]
        read_only: bool,
        /// Only print the link.
        #[arg(long)]
        no_open: bool,
        /// End every control UI session and unused link instead.
        #[arg(long)]
        revoke_all: bool,
    },
    /// Admit unknown senders who asked with a pairing code.
    Pairing {
        /// What to do.
        #[command(subcommand)]
        action: PairingAction,
    },
    /// MCP servers: their state, or restart one that failed.
    Mcp {
        /// What to do.
        #[command(subcommand)]
        action: McpAction,
    },
    /// Serve the built-in tools (with the configured policy and workspace) over MCP on stdio.
    McpServer,
    /// List the skills (workspace `skills/NAME/SKILL.md` and `~/.clawft/skills`).
    Skills {
        /// What to do.
        #[command(subcommand)]
        action: SkillsAction,
    },
    /// Search the memory documents as the agent does, or rebuild their index.
    Memory {
        /// What to do.
        #[command(subcommand)]
        action: memory::MemoryAction,
    },
    /// List the built-in tools, or run one tool call with the configured policy.
    Tools {
        /// What to do.
        #[command(subcommand)]
        action: tools::ToolsAction,
    },
    /// Show the effective configuration and where each value came from, or check it.
    Config {
        /// What to do.
        #[command(subcommand)]
        action: config_cmd::ConfigAction,
    },
    /// Show the gateway's log: the service's journal, or ~/.clawft/logs/gateway.log.
    Logs {
        /// Keep printing new lines as they come.
        #[arg(short, long)]
        follow: bool,
        /// How many recent lines to show.
        #[arg(short = 'n', long, default_value_t = 50)]
        lines: u32,
        /// The system unit's journal (`weft service install --system`).
        #[arg(long)]
        system: bool,
        /// Print the command that shows the log instead of running it.
        #[arg(long)]
        print_command: bool,
    },
    /// Print a shell completion script (bash, zsh or fish) on stdout.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: completions::Shell,
    },
}

/// Parse the command line with the help pages' examples and environment variables attached
/// ([`help::decorate`]); exits with clap's message on a usage error, as `Cli::parse` does.
pub fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let matches = help::decorate(Cli::command()).get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// `weft mcp` actions.
#[derive(Debug, Subcommand)]
pub enum McpAction {
    /// Each configured server: connecting / connected (tools) / reconnecting / failed.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Reconnect a server (after it failed), through the running gateway.
    Restart {
        /// Server name (`tools.mcp_servers.NAME`).
        name: String,
    },
}

/// `weft skills` actions.
#[derive(Debug, Subcommand)]
pub enum SkillsAction {
    /// Name, source, description and exposed tools of every skill (a table; JSON with --json).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `weft pairing` actions.
#[derive(Debug, Subcommand)]
pub enum PairingAction {
    /// Pending codes and paired senders.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Admit the sender who received this code.
    Approve {
        /// The code the sender got in their chat.
        code: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a paired sender.
    Revoke {
        /// `channel:user_id`, as `weft pairing list` shows it.
        who: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `weft sessions` actions.
#[derive(Debug, Subcommand)]
pub enum SessionsAction {
    /// List stored sessions (a table; JSON with --json).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print one session's transcript (text; JSON with --json).
    Show {
        /// Session key, e.g. `http:my-chat` or `cli:default`.
        key: String,
        /// Print JSON (messages as stored, usage).
        #[arg(long)]
        json: bool,
    },
    /// Delete one session's transcript.
    Clear {
        /// Session key.
        key: String,
        /// Print JSON (`{"cleared": true|false}`).
        #[arg(long)]
        json: bool,
    },
}

/// Open the configured workspace (with the daemon's protected paths refused to the file tools),
/// or say which directory could not be opened.
///
/// # Errors
/// The directory cannot be created or opened.
pub fn open_workspace(config: &crate::config::Config) -> Result<crate::tools::Workspace, CliError> {
    crate::tools::Workspace::open(&config.agent.workspace)
        .map(|ws| {
            ws.with_protected(&crate::daemon::protected_paths(config))
                .with_users_dir(crate::daemon::build::users_dir(config))
        })
        .map_err(|e| {
            CliError::Failed(format!(
                "cannot open the workspace {}: {e}",
                config.agent.workspace.display()
            ))
        })
}

/// `-m`/`--message` must have something to send: an empty or blank message is refused by the
/// argument parser (exit 2), never sent to the model.
///
/// # Errors
/// The message is empty or only whitespace.
pub fn non_blank_message(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        Err(
            "the message is empty: give the text to send, e.g. `weft agent -m \"hello\"`, \
             or run `weft agent` without -m for an interactive chat"
                .to_string(),
        )
    } else {
        Ok(s.to_string())
    }
}

impl Command {
    /// Whether the command only prints (it writes to no child process and no socket of its
    /// own): such a command piped into `head` should end quietly when the pipe closes, as
    /// `cat` does, instead of panicking on "failed printing to stdout: Broken pipe".
    pub fn prints_only(&self) -> bool {
        matches!(
            self,
            Command::Config { .. }
                | Command::Completions { .. }
                | Command::Status { .. }
                | Command::Sessions { .. }
                | Command::Agents { .. }
                | Command::Usage { .. }
                | Command::Skills { .. }
                | Command::Memory { .. }
                | Command::Logs { .. }
        )
    }
}

/// Let a closed stdout end the process (the default `SIGPIPE` action) instead of an error on
/// every write, which `println!` turns into a panic. Rust starts programs with `SIGPIPE`
/// ignored, which the daemon needs (a child's closed pipe must not kill it): call this only
/// for [`Command::prints_only`] commands.
pub fn end_on_closed_stdout() {
    #[allow(unsafe_code)]
    // SAFETY: called at start-up before any thread is spawned; `signal` with `SIG_DFL` installs
    // no handler of ours, only restores the kernel's default action for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// A failure reported to the user with a clear message; the variant decides the exit code
/// ([`CliError::code`]), never the message text.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command failed: exit 1.
    #[error("{0}")]
    Failed(String),
    /// The gateway refused to start because of the store (damaged with
    /// `store.on_corruption = "fail"`, or written by a newer weft): exit
    /// [`gateway::STORE_REFUSED_EXIT`] (`EX_CONFIG`), which the systemd units list in
    /// `RestartPreventExitStatus=` so they do not restart-loop on it.
    #[error("{0}")]
    StoreRefused(String),
}

impl CliError {
    /// Wrap any displayable error as a plain failure.
    pub fn msg(e: impl std::fmt::Display) -> Self {
        Self::Failed(e.to_string())
    }

    /// The process exit code for this error.
    #[must_use]
    pub fn code(&self) -> u8 {
        match self {
            Self::Failed(_) => 1,
            Self::StoreRefused(_) => gateway::STORE_REFUSED_EXIT,
        }
    }
}
