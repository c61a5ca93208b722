//! Token accounting and cost budgets: the [`UsageLedger`] prices each LLM call, keeps today's
//! and this month's spend in memory (loaded from the store at start), refuses a turn once a
//! budget is reached, and writes each turn's counters in the store batch that ends the turn.
//!
//! Days and months are UTC. It never flushes the store: a turn's counters ride the turn's own
//! flush, and calls recorded outside a turn ([`UsageLedger::record`]) ride the next one.
//!
//! In cluster mode the ledger is given the cluster's counters ([`super::shared_usage`]) when
//! it is made ([`UsageLedger::sharing`]): budgets then count the whole cluster's spend.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::shared_usage::SharedUsage;
use crate::config::usage::UsageConfig;
use crate::llm::{ChatRequest, ChatResponse, Usage};
use crate::store::kv::Op;
use crate::store::usage::{day_of, month_start, UsageRow};
use crate::store::{Store, StoreError};
use crate::types::session_key::agent_of;
use crate::types::{MutexExt, RwLockExt};

/// The LLM calls of one turn answered by one model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallTally {
    /// Model that answered.
    pub model: String,
    /// Calls.
    pub calls: u64,
    /// Calls whose usage was estimated (the provider reported none).
    pub estimated_calls: u64,
    /// Tokens.
    pub usage: Usage,
    /// US dollars.
    pub cost_usd: f64,
}

/// A turn refused (or stopped) because a budget is reached.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// The budget's config key (`budgets.daily_usd`…), also the metric label.
    pub budget: &'static str,
    /// What the user is told.
    pub text: String,
}

/// Spend of today as `/status` shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UsageSnapshot {
    /// This session, today.
    pub session: UsageRow,
    /// All sessions, today.
    pub today: UsageRow,
    /// All sessions, this month.
    pub month: UsageRow,
}

/// How long the other gateways' counters are used before they are read again (2 s): the
/// staleness of a cluster-wide budget check, besides the others' own publication delay.
pub const SHARED_USAGE_FRESH: Duration = Duration::from_secs(2);

#[derive(Clone, Default)]
struct State {
    day: String,
    month_start: String,
    month: UsageRow,
    today: UsageRow,
    sessions: HashMap<String, UsageRow>,
    users: HashMap<String, UsageRow>,
    /// Today's and this month's spend of each agent.
    agents_today: HashMap<String, UsageRow>,
    agents_month: HashMap<String, UsageRow>,
    /// The chat user of each session's running turn, for the checks between its LLM calls.
    users_of: HashMap<String, String>,
    /// Models already warned about having no price.
    unpriced: HashSet<String>,
}

impl State {
    /// Start a new day (and month) when `now_ms` is past the current one.
    fn roll(&mut self, now_ms: u64) {
        let day = day_of(now_ms);
        if day == self.day {
            return;
        }
        let ms = month_start(&day);
        if ms != self.month_start {
            self.month = UsageRow::default();
            self.agents_month.clear();
            self.month_start = ms;
        }
        self.today = UsageRow::default();
        self.sessions.clear();
        self.users.clear();
        self.agents_today.clear();
        self.day = day;
    }

    fn add(&mut self, r: &UsageRow) {
        if r.day != self.day {
            // A turn that began before midnight and ends after is counted on the day it ends:
            // rows carry that day, so only the month total is touched for older days.
            if r.day.starts_with(self.month_start.get(..7).unwrap_or("")) {
                self.month.add(r);
                self.agent_month(&r.session).add(r);
            }
            return;
        }
        self.month.add(r);
        self.agent_month(&r.session).add(r);
        self.today.add(r);
        self.agents_today
            .entry(agent_of(&r.session).to_string())
            .or_default()
            .add(r);
        self.sessions.entry(r.session.clone()).or_default().add(r);
        if !r.user.is_empty() {
            self.users.entry(r.user.clone()).or_default().add(r);
        }
    }
}

impl State {
    fn agent_month(&mut self, session: &str) -> &mut UsageRow {
        self.agents_month
            .entry(agent_of(session).to_string())
            .or_default()
    }
}

/// Prices, budgets and today's spend. One per daemon, shared by every turn.
pub struct UsageLedger {
    store: Store,
    /// Replaced on a config reload.
    config: std::sync::RwLock<UsageConfig>,
    state: Mutex<State>,
    /// The other gateways' usage (cluster mode).
    shared: Option<SharedUsage>,
    /// Their counters as last read, and when.
    remote: Mutex<Option<(Instant, String, Vec<UsageRow>)>>,
}

fn usd(x: f64) -> String {
    if x >= 0.1 || x == 0.0 {
        format!("US${x:.2}")
    } else {
        format!("US${x:.4}")
    }
}

fn estimated(req: &ChatRequest, resp: &ChatResponse) -> Usage {
    let output = crate::llm::tokens::of_text(&resp.content)
        + resp
            .tool_calls
            .iter()
            .map(|c| {
                crate::llm::tokens::of_text(&c.name) + crate::llm::tokens::of_text(&c.arguments)
            })
            .sum::<u64>();
    Usage {
        input_tokens: crate::llm::tokens::of_request(req),
        output_tokens: output,
        cached_tokens: 0,
        estimated: true,
    }
}

impl UsageLedger {
    /// A ledger over `store`, with this month's spend loaded from it.
    ///
    /// # Errors
    /// The store cannot be read.
    pub fn load(store: Store, config: UsageConfig) -> Result<Self, StoreError> {
        Self::load_at(store, config, clawft_channel_core::now_ms())
    }

    /// [`UsageLedger::load`] as of `now_ms` (tests).
    ///
    /// # Errors
    /// The store cannot be read.
    pub fn load_at(store: Store, config: UsageConfig, now_ms: u64) -> Result<Self, StoreError> {
        let mut st = State::default();
        st.roll(now_ms);
        for r in store.usage_rows(&st.month_start)? {
            st.add(&r);
        }
        Ok(Self {
            store,
            config: std::sync::RwLock::new(config),
            state: Mutex::new(st),
            shared: None,
            remote: Mutex::new(None),
        })
    }

    /// This ledger counting the other gateways' usage against the budgets too, and
    /// publishing this one's through `shared` (cluster mode), given before it is used.
    #[must_use]
    pub fn sharing(mut self, shared: Option<SharedUsage>) -> Self {
        let Some(sh) = shared else {
            return self;
        };
        let day = day_of(clawft_channel_core::now_ms());
        // This gateway's counters of today, once; each turn then adds its own rows.
        match self.store.usage_rows(&day) {
            Ok(mut mine) => {
                mine.retain(|r| r.day == day);
                sh.publish(&day, &mine);
            }
            Err(e) => tracing::warn!(error = %e, "this node's usage not published"),
        }
        self.shared = Some(sh);
        self
    }

    /// The other gateways' counters of this month (cluster mode), read again when older than
    /// [`SHARED_USAGE_FRESH`]; the last ones read when they cannot be.
    fn remote_rows(&self, now_ms: u64) -> Option<Vec<UsageRow>> {
        let sh = self.shared.as_ref()?;
        let since = month_start(&day_of(now_ms));
        {
            let r = self.remote.locked();
            if let Some((at, s, rows)) = r.as_ref() {
                if *s == since && at.elapsed() < SHARED_USAGE_FRESH {
                    return Some(rows.clone());
                }
            }
        }
        match sh.others(&since) {
            Ok(rows) => {
                *self.remote.locked() = Some((Instant::now(), since, rows.clone()));
                Some(rows)
            }
            Err(e) => {
                tracing::warn!(error = %e, "the other nodes' usage cannot be read; using the last read");
                self.remote
                    .locked()
                    .as_ref()
                    .filter(|(_, s, _)| *s == since)
                    .map(|(_, _, rows)| rows.clone())
            }
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    /// The usage of one call: as reported, or estimated ([`crate::llm::tokens`]) when the
    /// provider reported none.
    pub fn usage_of(req: &ChatRequest, resp: &ChatResponse) -> Usage {
        if resp.usage.is_empty() {
            estimated(req, resp)
        } else {
            resp.usage
        }
    }

    /// US dollars of `u` on `model`; 0 (with a one-time warning) when the model has no price.
    pub fn cost(&self, model: &str, u: &Usage) -> f64 {
        let price = self.config.read_locked().price(model);
        let Some(p) = price else {
            if !u.is_empty() && self.state().unpriced.insert(model.to_string()) {
                tracing::warn!(
                    model,
                    "no price for this model: budgets in US dollars cannot count its calls (token budgets still do); set prices.\"{model}\" = {{ input = …, output = … }}"
                );
            }
            return 0.0;
        };
        let cached = u.cached_tokens.min(u.input_tokens);
        let uncached = u.input_tokens - cached;
        (uncached as f64 * p.input + cached as f64 * p.cached + u.output_tokens as f64 * p.output)
            / 1_000_000.0
    }

    /// US dollars of a media call (speech, images) at the price table's entry for its model;
    /// 0 (with a one-time warning) when the model has no price.
    pub fn media_cost(&self, used: &crate::tools::MediaUse) -> f64 {
        let Some(p) = self.config.read_locked().price(&used.model) else {
            if self.state().unpriced.insert(used.model.clone()) {
                tracing::warn!(
                    model = %used.model,
                    "no price for this speech or image model: budgets in US dollars cannot count its calls; set prices.\"{}\" = {{ characters = …, audio_minute = …, image = … }}",
                    used.model
                );
            }
            return 0.0;
        };
        (used.chars as f64 * p.characters) / 1_000_000.0
            + used.seconds / 60.0 * p.audio_minute
            + used.images as f64 * p.image
    }

    /// Add media calls (speech, images) to a turn's tallies: one call each, no tokens.
    pub fn tally_media(&self, tallies: &mut Vec<CallTally>, used: &[crate::tools::MediaUse]) {
        for u in used {
            let cost = self.media_cost(u);
            match tallies.iter_mut().find(|t| t.model == u.model) {
                Some(t) => {
                    t.calls += 1;
                    t.cost_usd += cost;
                }
                None => tallies.push(CallTally {
                    model: u.model.clone(),
                    calls: 1,
                    cost_usd: cost,
                    ..CallTally::default()
                }),
            }
        }
    }

    /// Add one call to a turn's tallies.
    pub fn tally(&self, tallies: &mut Vec<CallTally>, model: &str, u: &Usage) {
        let cost = self.cost(model, u);
        let i = match tallies.iter().position(|t| t.model == model) {
            Some(i) => i,
            None => {
                tallies.push(CallTally {
                    model: model.to_string(),
                    ..CallTally::default()
                });
                tallies.len() - 1
            }
        };
        let t = &mut tallies[i];
        t.calls += 1;
        t.estimated_calls += u64::from(u.estimated);
        t.usage.add(u);
        t.cost_usd += cost;
    }

    /// Whether a turn of `session` for `user` may go on, given the `turn` tallies it has not
    /// recorded yet. Remembers `user` as the session's for [`UsageLedger::check_running`].
    /// A refusal is logged and counted (`clawft_budget_refusals_total`).
    ///
    /// # Errors
    /// The first budget reached.
    pub fn admit(&self, session: &str, user: &str, turn: &[CallTally]) -> Result<(), Refusal> {
        self.admit_at(session, user, turn, clawft_channel_core::now_ms())
    }

    /// The first of `session`'s agent's own budgets (`agents.NAME.budgets`) reached, with
    /// `with` adding the running turn's spend.
    fn agent_refusal(
        &self,
        st: &State,
        session: &str,
        with: &dyn Fn(Option<&UsageRow>) -> UsageRow,
    ) -> Option<(&'static str, String)> {
        let agent = agent_of(session);
        let b = self.config.read_locked().agents.get(agent).cloned()?;
        let day = with(st.agents_today.get(agent));
        let month = with(st.agents_month.get(agent));
        let checks = [
            (
                b.daily_usd,
                b.daily_tokens,
                &day,
                "daily",
                "resets at 00:00 UTC",
            ),
            (
                b.monthly_usd,
                b.monthly_tokens,
                &month,
                "monthly",
                "resets on the 1st of the month at 00:00 UTC",
            ),
        ];
        for (usd_limit, tokens, spent, period, resets) in checks {
            if let Some(l) = usd_limit.filter(|l| spent.cost_usd >= *l) {
                let label = if period == "daily" {
                    "agents.budgets.daily_usd"
                } else {
                    "agents.budgets.monthly_usd"
                };
                return Some((
                    label,
                    format!(
                        "This assistant reached its {period} budget ({} of {}, {resets}). The operator can raise agents.{agent}.budgets.{period}_usd.",
                        usd(spent.cost_usd),
                        usd(l)
                    ),
                ));
            }
            if let Some(l) = tokens.filter(|l| spent.tokens() >= *l) {
                let label = if period == "daily" {
                    "agents.budgets.daily_tokens"
                } else {
                    "agents.budgets.monthly_tokens"
                };
                return Some((
                    label,
                    format!(
                        "This assistant reached its {period} token budget ({} of {l} tokens, {resets}). The operator can raise agents.{agent}.budgets.{period}_tokens.",
                        spent.tokens()
                    ),
                ));
            }
        }
        None
    }

    /// [`UsageLedger::admit`] as of `now_ms`.
    ///
    /// # Errors
    /// The first budget reached.
    pub fn admit_at(
        &self,
        session: &str,
        user: &str,
        turn: &[CallTally],
        now_ms: u64,
    ) -> Result<(), Refusal> {
        // The other gateways' counters matter only to a budget: without one, no NATS round
        // trip (and no copy of the counters) on a turn's way in.
        let remote = if self.any_budget() {
            self.remote_rows(now_ms)
        } else {
            None
        };
        let mut st = self.state();
        st.roll(now_ms);
        if !user.is_empty() {
            st.users_of.insert(session.to_string(), user.to_string());
        }
        // Cluster mode: this gateway's counters plus the other gateways'.
        let merged;
        let view: &State = match remote {
            Some(rows) => {
                let mut m = (*st).clone();
                for r in &rows {
                    m.add(r);
                }
                merged = m;
                &merged
            }
            None => &st,
        };
        let mut pending = UsageRow::default();
        for t in turn {
            pending.input_tokens += t.usage.input_tokens;
            pending.output_tokens += t.usage.output_tokens;
            pending.cost_usd += t.cost_usd;
        }
        let with = |r: Option<&UsageRow>| {
            let mut r = r.cloned().unwrap_or_default();
            r.add(&pending);
            r
        };
        let b = self.budgets();
        let s = with(view.sessions.get(session));
        let u = with(view.users.get(user).filter(|_| !user.is_empty()));
        let d = with(Some(&view.today));
        let m = with(Some(&view.month));
        const DAY: &str = "resets at 00:00 UTC";
        const MONTH: &str = "resets on the 1st of the month at 00:00 UTC";
        let usd_checks = [
            (
                b.per_session_daily_usd,
                &s,
                "budgets.per_session_daily_usd",
                "This conversation reached its daily budget",
                DAY,
            ),
            (
                b.per_user_daily_usd.filter(|_| !user.is_empty()),
                &u,
                "budgets.per_user_daily_usd",
                "You reached your daily budget",
                DAY,
            ),
            (
                b.daily_usd,
                &d,
                "budgets.daily_usd",
                "This assistant reached its daily budget",
                DAY,
            ),
            (
                b.monthly_usd,
                &m,
                "budgets.monthly_usd",
                "This assistant reached its monthly budget",
                MONTH,
            ),
        ];
        let token_checks = [
            (
                b.per_session_daily_tokens,
                &s,
                "budgets.per_session_daily_tokens",
                "This conversation reached its daily token budget",
                DAY,
            ),
            (
                b.per_user_daily_tokens.filter(|_| !user.is_empty()),
                &u,
                "budgets.per_user_daily_tokens",
                "You reached your daily token budget",
                DAY,
            ),
            (
                b.daily_tokens,
                &d,
                "budgets.daily_tokens",
                "This assistant reached its daily token budget",
                DAY,
            ),
            (
                b.monthly_tokens,
                &m,
                "budgets.monthly_tokens",
                "This assistant reached its monthly token budget",
                MONTH,
            ),
        ];
        let mut refusal = None;
        for (limit, spent, key, what, resets) in usd_checks {
            if let Some(l) = limit.filter(|l| spent.cost_usd >= *l) {
                refusal = Some((
                    key,
                    format!(
                        "{what} ({} of {}, {resets}). The operator can raise {key}.",
                        usd(spent.cost_usd),
                        usd(l)
                    ),
                ));
                break;
            }
        }
        if refusal.is_none() {
            for (limit, spent, key, what, resets) in token_checks {
                if let Some(l) = limit.filter(|l| spent.tokens() >= *l) {
                    refusal = Some((
                        key,
                        format!(
                            "{what} ({} of {l} tokens, {resets}). The operator can raise {key}.",
                            spent.tokens()
                        ),
                    ));
                    break;
                }
            }
        }
        if refusal.is_none() {
            refusal = self.agent_refusal(view, session, &with);
        }
        if refusal.is_some() && turn.is_empty() {
            // Refused before it started: no turn of this session runs for this user.
            st.users_of.remove(session);
        }
        drop(st);
        let Some((budget, text)) = refusal else {
            return Ok(());
        };
        tracing::warn!(budget, session, "budget reached: turn refused");
        crate::metrics::inc("clawft_budget_refusals_total", &[("budget", budget)], 1);
        Err(Refusal { budget, text })
    }

    /// [`UsageLedger::admit`] between the LLM calls of a running turn, for the user its turn
    /// started with.
    ///
    /// # Errors
    /// The first budget reached.
    pub fn check_running(&self, session: &str, turn: &[CallTally]) -> Result<(), Refusal> {
        let user = self
            .state()
            .users_of
            .get(session)
            .cloned()
            .unwrap_or_default();
        self.admit(session, &user, turn)
    }

    fn rows(&self, session: &str, user: &str, turn: &[CallTally], now_ms: u64) -> Vec<UsageRow> {
        let day = day_of(now_ms);
        turn.iter()
            .map(|t| UsageRow {
                day: day.clone(),
                session: session.to_string(),
                user: user.to_string(),
                model: t.model.clone(),
                calls: t.calls,
                input_tokens: t.usage.input_tokens,
                output_tokens: t.usage.output_tokens,
                cached_tokens: t.usage.cached_tokens,
                estimated_calls: t.estimated_calls,
                cost_usd: t.cost_usd,
            })
            .collect()
    }

    fn commit(&self, rows: &[UsageRow], now_ms: u64) {
        let mut st = self.state();
        st.roll(now_ms);
        for r in rows {
            st.add(r);
        }
        let day = st.day.clone();
        drop(st);
        if let Some(sh) = &self.shared {
            sh.add(&day, rows);
        }
        for r in rows {
            let micro = (r.cost_usd * 1_000_000.0).round();
            if micro >= 1.0 {
                crate::metrics::inc(
                    "clawft_llm_cost_microusd_total",
                    &[("model", &r.model)],
                    micro as u64,
                );
            }
        }
    }

    /// End a turn: `write` gets the store ops of the turn's counters to put in the batch that
    /// ends the turn; today's totals are then updated (whether or not the write succeeded:
    /// the money was spent).
    ///
    /// # Errors
    /// What `write` returned.
    pub fn finish_turn(
        &self,
        session: &str,
        user: &str,
        turn: &[CallTally],
        write: impl FnOnce(Vec<Op>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let now = clawft_channel_core::now_ms();
        let rows = self.rows(session, user, turn, now);
        let ops = match self.store.usage_ops(&rows) {
            Ok(ops) => ops,
            Err(e) => {
                tracing::error!(error = %e, "could not read the usage counters; this turn's usage is not stored");
                Vec::new()
            }
        };
        let r = write(ops);
        self.commit(&rows, now);
        self.state().users_of.remove(session);
        r
    }

    /// Record calls made outside a turn's own loop (memory flush, summaries, subagents):
    /// stored now (not flushed) and counted against today's budgets.
    ///
    /// # Errors
    /// The store write failed (the spend is still counted in memory).
    pub fn record(&self, session: &str, user: &str, turn: &[CallTally]) -> Result<(), StoreError> {
        let now = clawft_channel_core::now_ms();
        let rows = self.rows(session, user, turn, now);
        let r = self.store.record_usage(&rows);
        self.commit(&rows, now);
        r
    }

    /// Today's spend of `session`, of everyone today and this month.
    pub fn snapshot(&self, session: &str) -> UsageSnapshot {
        let mut st = self.state();
        st.roll(clawft_channel_core::now_ms());
        UsageSnapshot {
            session: st.sessions.get(session).cloned().unwrap_or_default(),
            today: st.today.clone(),
            month: st.month.clone(),
        }
    }

    /// Today's spend of the chat user `user` (`channel:sender`) over all their sessions.
    pub fn user_today(&self, user: &str) -> UsageRow {
        let mut st = self.state();
        st.roll(clawft_channel_core::now_ms());
        st.users.get(user).cloned().unwrap_or_default()
    }

    /// The configured budgets and prices.
    pub fn config(&self) -> UsageConfig {
        self.config.read_locked().clone()
    }

    /// Whether any budget is set (`budgets.*` or an agent's own).
    fn any_budget(&self) -> bool {
        let c = self.config.read_locked();
        !c.budgets.is_empty() || c.agents.values().any(|b| !b.is_empty())
    }

    fn budgets(&self) -> crate::config::usage::Budgets {
        self.config.read_locked().budgets.clone()
    }

    /// Use new prices and budgets from now on (config reload).
    pub fn set_config(&self, c: UsageConfig) {
        *self.config.write_locked() = c;
    }

    /// The `/status` lines about usage.
    pub fn status_text(&self, session: &str) -> String {
        let s = self.snapshot(session);
        let mut out = format!(
            "today (UTC): this conversation {} tokens in ({} cached), {} out, {}{}; all conversations {}",
            s.session.input_tokens,
            s.session.cached_tokens,
            s.session.output_tokens,
            usd(s.session.cost_usd),
            if s.session.estimated_calls > 0 { " (partly estimated)" } else { "" },
            usd(s.today.cost_usd),
        );
        let b = self.budgets();
        if let Some(l) = b.daily_usd {
            out.push_str(&format!(
                ", {} left of the daily budget {}",
                usd((l - s.today.cost_usd).max(0.0)),
                usd(l)
            ));
        }
        if let Some(l) = b.per_session_daily_usd {
            out.push_str(&format!(
                ", this conversation {} left of {}",
                usd((l - s.session.cost_usd).max(0.0)),
                usd(l)
            ));
        }
        if let Some(l) = b.monthly_usd {
            out.push_str(&format!(
                ", {} left of the monthly budget {}",
                usd((l - s.month.cost_usd).max(0.0)),
                usd(l)
            ));
        }
        if let Some(l) = b.daily_tokens {
            out.push_str(&format!(
                ", {} tokens left today",
                l.saturating_sub(s.today.tokens())
            ));
        }
        out
    }
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;
