#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::config::usage::{resolve_usage, BudgetsFile, PriceFile};

const DAY_MS: u64 = 86_400_000;

fn config(budgets: BudgetsFile) -> UsageConfig {
    let mut prices = std::collections::BTreeMap::new();
    prices.insert(
        "m".to_string(),
        PriceFile {
            input: Some(1.0),
            cached: Some(0.5),
            output: Some(2.0),
            ..PriceFile::default()
        },
    );
    resolve_usage(&prices, &budgets).unwrap()
}

fn tokens(input: u64, cached: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cached_tokens: cached,
        estimated: false,
    }
}

#[test]
fn cost_uses_the_cached_price_for_cached_tokens() {
    let l = UsageLedger::load(Store::memory(), config(BudgetsFile::default())).unwrap();
    // 600k uncached at $1, 400k cached at $0.5, 1M output at $2.
    let c = l.cost("m", &tokens(1_000_000, 400_000, 1_000_000));
    assert!((c - 2.8).abs() < 1e-9, "{c}");
    assert_eq!(l.cost("unknown-model", &tokens(10, 0, 10)), 0.0);
}

#[test]
fn a_day_budget_refuses_until_the_next_utc_day_and_the_month_budget_keeps_counting() {
    let store = Store::memory();
    let l = UsageLedger::load(
        store.clone(),
        config(BudgetsFile {
            daily_usd: Some(1.0),
            monthly_usd: Some(1.5),
            ..BudgetsFile::default()
        }),
    )
    .unwrap();
    let mut turn = Vec::new();
    l.tally(&mut turn, "m", &tokens(500_000, 0, 0)); // $0.50
    assert_eq!(l.admit("s1", "alice", &[]), Ok(()));
    // Between calls: what the running turn spent counts.
    l.tally(&mut turn, "m", &tokens(500_000, 0, 0)); // $1.00 in all
    let r = l.check_running("s1", &turn).unwrap_err();
    assert_eq!(r.budget, "budgets.daily_usd");
    assert!(r.text.contains("US$1.00 of US$1.00"), "{}", r.text);
    let key = crate::types::SessionKey::parse("http:s1").unwrap();
    l.finish_turn("http:s1", "alice", &turn, |ops| {
        store.finish_turn_with(&key, None, &[], None, ops)
    })
    .unwrap();
    let now = clawft_channel_core::now_ms();
    let r = l.admit_at("s2", "bob", &[], now).unwrap_err();
    assert_eq!(r.budget, "budgets.daily_usd");
    // A new day: the daily budget is fresh, the month still holds $1.00 (when it is the same
    // month), and a restart reloads the same from the store.
    let tomorrow = now + DAY_MS;
    let same_month = day_of(now).get(..7) == day_of(tomorrow).get(..7);
    assert_eq!(l.admit_at("s2", "bob", &[], tomorrow), Ok(()));
    let reloaded = UsageLedger::load_at(store.clone(), l.config(), now).unwrap();
    assert_eq!(
        reloaded.admit_at("s3", "", &[], now).unwrap_err().budget,
        "budgets.daily_usd"
    );
    let next = UsageLedger::load_at(store, l.config(), tomorrow).unwrap();
    let mut half = Vec::new();
    next.tally(&mut half, "m", &tokens(500_000, 0, 0));
    let r = next.admit_at("s3", "", &half, tomorrow);
    if same_month {
        assert_eq!(r.unwrap_err().budget, "budgets.monthly_usd");
    } else {
        assert_eq!(r, Ok(()));
    }
}

#[test]
fn per_session_per_user_and_token_budgets() {
    let l = UsageLedger::load(
        Store::memory(),
        config(BudgetsFile {
            per_session_daily_usd: Some(0.5),
            per_user_daily_tokens: Some(1_500_000),
            ..BudgetsFile::default()
        }),
    )
    .unwrap();
    let mut turn = Vec::new();
    l.tally(&mut turn, "m", &tokens(500_000, 0, 0));
    l.finish_turn("s1", "alice", &turn, |_| Ok(())).unwrap();
    let r = l.admit("s1", "alice", &[]).unwrap_err();
    assert_eq!(r.budget, "budgets.per_session_daily_usd");
    assert!(r
        .text
        .starts_with("This conversation reached its daily budget"));
    assert_eq!(l.admit("s2", "alice", &[]), Ok(()));
    let mut big = Vec::new();
    l.tally(&mut big, "unpriced", &tokens(1_000_000, 0, 0));
    l.finish_turn("s2", "alice", &big, |_| Ok(())).unwrap();
    let r = l.admit("s3", "alice", &[]).unwrap_err();
    assert_eq!(r.budget, "budgets.per_user_daily_tokens");
    assert!(r.text.contains("1500000 of 1500000 tokens"), "{}", r.text);
    assert_eq!(l.admit("s3", "bob", &[]), Ok(()));
}

#[test]
fn an_agents_own_budget_refuses_its_conversations_only_and_survives_a_reload() {
    let store = Store::memory();
    let mut cfg = config(BudgetsFile::default());
    cfg.agents.insert(
        "work".into(),
        crate::config::usage::AgentBudgetsFile {
            daily_tokens: Some(1000),
            ..Default::default()
        },
    );
    let l = UsageLedger::load(store.clone(), cfg.clone()).unwrap();
    let mut turn = Vec::new();
    l.tally(&mut turn, "m", &tokens(1500, 0, 0));
    let key = crate::types::SessionKey::parse("@work:telegram:1").unwrap();
    l.finish_turn(key.as_str(), "alice", &turn, |ops| {
        store.finish_turn_with(&key, None, &[], None, ops)
    })
    .unwrap();
    // Another conversation of the same agent is refused; the default agent's is not.
    let r = l.admit("@work:telegram:2", "bob", &[]).unwrap_err();
    assert_eq!(r.budget, "agents.budgets.daily_tokens");
    assert!(
        r.text.contains("agents.work.budgets.daily_tokens"),
        "{}",
        r.text
    );
    assert_eq!(l.admit("telegram:2", "bob", &[]), Ok(()));
    // A restart counts the same from the store.
    let again = UsageLedger::load(store, cfg).unwrap();
    assert!(again.admit("@work:slack:C1", "", &[]).is_err());
}
