//! Help texts: examples for each command and the environment variables `weft` reads, attached
//! to the clap command tree with `after_help` (at run time, so the command definitions stay
//! as they are).

use clap::Command;

/// The environment variables, shown after the top-level help.
pub const ENVIRONMENT: &str = "\
Environment:
  OPENAI_API_KEY        OpenAI key, used when the config file has no providers
                        (OPENAI_BASE_URL: another OpenAI-compatible server)
  ANTHROPIC_API_KEY     Anthropic key, likewise (ANTHROPIC_BASE_URL)
  OPENROUTER_API_KEY    OpenRouter key, likewise
  CLAWFT_HOME           State directory: config, store, workspace (default ~/.clawft)
  CLAWFT_<SECTION>__<KEY>
                        Override one config key, e.g. CLAWFT_AGENTS__DEFAULTS__MODEL=gpt-4o
                        or CLAWFT_CHANNELS__HTTP__BIND=127.0.0.1:8080 (`weft config show`
                        says which value came from where)
  RUST_LOG              Log filter, e.g. debug or clawft=debug (default: warn; info for
                        `weft gateway`)
  NO_COLOR              Any non-empty value: no colour in logs (`--color always` overrides)";

/// Examples of the top-level help.
const TOP: &str = "\
Examples:
  weft onboard                      write ~/.clawft/config.toml and the workspace
  OPENAI_API_KEY=sk-... weft agent -m \"hello\"
  weft agent                        chat on the terminal (Ctrl-D ends)
  weft gateway                      run the channels and the HTTP API
  weft config check                 validate the configuration
  weft config show                  each value and where it came from
  weft service install              run the gateway as a systemd user service
  weft logs -f                      follow the service's log
  weft completions bash > ~/.local/share/bash-completion/completions/weft";

/// Per subcommand: its examples.
const EXAMPLES: &[(&str, &str)] = &[
    (
        "agent",
        "Examples:\n  weft agent -m \"what is in my workspace?\"\n  echo \"summarise this\" | weft agent\n  weft agent -s work          a separate conversation named `work`",
    ),
    (
        "onboard",
        "Examples:\n  weft onboard\n  CLAWFT_HOME=/srv/clawft weft onboard\n  weft onboard --force       rewrite the config (the old one is kept as a backup)",
    ),
    (
        "gateway",
        "Examples:\n  weft gateway\n  RUST_LOG=debug weft gateway\n  weft --log-format json gateway\n\nOutside systemd the log also goes to ~/.clawft/logs/gateway.log (10 MiB, then gateway.log.1), which `weft logs` reads.",
    ),
    (
        "service",
        "Examples:\n  weft service install\n  weft service status\n  weft logs -f",
    ),
    (
        "status",
        "Examples:\n  weft status\n  weft --config /etc/clawft/config.toml status",
    ),
    (
        "sessions",
        "Examples:\n  weft sessions list\n  weft sessions show cli:default\n  weft sessions clear http:my-chat",
    ),
    (
        "usage",
        "Examples:\n  weft usage\n  weft usage --by model --days 7\n  weft usage --json",
    ),
    ("doctor", "Examples:\n  weft doctor\n  weft doctor --json"),
    (
        "send",
        "Examples:\n  weft send telegram 123456789 \"backup finished\"",
    ),
    (
        "store",
        "Examples:\n  weft store check\n  weft store backup /var/backups/clawft-store.jsonl",
    ),
    (
        "cron",
        "Examples:\n  weft cron list\n  weft cron add --name digest --cron \"0 8 * * 1-5\" --tz Europe/Berlin \\\n      --message \"summarise my inbox\" --channel telegram --chat 123456789\n  weft cron add --name stretch --every 2h --text --message \"stand up and stretch\" \\\n      --channel http --chat me\n  weft cron pause 0192f0c4-...\n  weft cron runs 0192f0c4-...",
    ),
    (
        "pairing",
        "Examples:\n  weft pairing list\n  weft pairing approve 4F7K2Q",
    ),
    (
        "node",
        "Examples:\n  weft node --gateway wss://gateway.example.com --name homeserver --workspace ~/weft-node\n  weft node --gateway wss://gateway.example.com --offer info,read,list\n  weft node    # with a [node] section in the configuration\n\nThe gateway's operator approves the node with `weft nodes approve ID` (docs/nodes.md).",
    ),
    (
        "nodes",
        "Examples:\n  weft nodes list\n  weft nodes approve 3f9c0a1b2c3d4e5f\n  weft nodes revoke homeserver",
    ),
    (
        "approvals",
        "Examples:\n  weft approvals list\n  weft approvals approve 3fa9c2d1\n  weft approvals approve 3fa9c2d1 --always\n  weft approvals deny 3fa9c2d1",
    ),
    (
        "mcp",
        "Examples:\n  weft mcp list\n  weft mcp restart everything",
    ),
    (
        "tools",
        "Examples:\n  weft tools list\n  weft tools call read_file --args '{\"path\": \"notes.md\"}'",
    ),
    ("skills", "Examples:\n  weft skills list"),
    (
        "memory",
        "Examples:\n  weft memory search dentist appointment\n  weft memory search --user telegram:42 allergies\n  weft memory reindex",
    ),
    (
        "config",
        "Examples:\n  weft config check\n  weft config show\n  CLAWFT_AGENTS__DEFAULTS__MODEL=gpt-4o weft config show",
    ),
    (
        "logs",
        "Examples:\n  weft logs\n  weft logs -f\n  weft logs -n 200\n  weft logs --print-command",
    ),
    (
        "completions",
        "Examples:\n  weft completions bash > ~/.local/share/bash-completion/completions/weft\n  weft completions zsh > \"${fpath[1]}/_weft\"\n  weft completions fish > ~/.config/fish/completions/weft.fish",
    ),
];

/// `cmd` (the `weft` command) with the examples and the environment variables attached.
pub fn decorate(cmd: Command) -> Command {
    let mut cmd = cmd.after_help(format!("{TOP}\n\n{ENVIRONMENT}"));
    for (name, text) in EXAMPLES {
        if cmd.find_subcommand(name).is_some() {
            cmd = cmd.mut_subcommand(*name, |c| c.after_help(*text));
        }
    }
    cmd
}
