//! The price table (`prices`) and the spending limits (`budgets`): raw file shapes, the
//! resolved [`UsageConfig`], and the built-in prices of well-known models.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::ConfigError;

/// `prices."MODEL"`: USD per million tokens.
#[derive(Debug, Default, Clone, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PriceFile {
    /// Prompt tokens not served from the provider's cache.
    pub input: Option<f64>,
    /// Prompt tokens served from the cache (default: the input price).
    pub cached: Option<f64>,
    /// Completion tokens.
    pub output: Option<f64>,
    /// Speech: USD per million characters spoken (`tts-1`: 15).
    pub characters: Option<f64>,
    /// Speech: USD per minute of audio made.
    pub audio_minute: Option<f64>,
    /// Images: USD per image made (`dall-e-3` 1024x1024: 0.04).
    pub image: Option<f64>,
}

/// `budgets`: limits after which turns are refused. Days and months are UTC.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetsFile {
    /// USD spent per UTC day, all sessions.
    pub daily_usd: Option<f64>,
    /// USD spent per UTC calendar month, all sessions.
    pub monthly_usd: Option<f64>,
    /// USD spent per UTC day by one session.
    pub per_session_daily_usd: Option<f64>,
    /// USD spent per UTC day by one chat user (sender), all their sessions.
    pub per_user_daily_usd: Option<f64>,
    /// Tokens (input + output) per UTC day, all sessions.
    pub daily_tokens: Option<u64>,
    /// Tokens per UTC calendar month, all sessions.
    pub monthly_tokens: Option<u64>,
    /// Tokens per UTC day by one session.
    pub per_session_daily_tokens: Option<u64>,
    /// Tokens per UTC day by one chat user.
    pub per_user_daily_tokens: Option<u64>,
}

impl BudgetsFile {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// `agents.NAME.budgets` (and `agents.defaults.budgets`, each agent's own): limits of one
/// agent's spend, all its conversations and subagents together. Days and months are UTC.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentBudgetsFile {
    /// USD this agent may spend per UTC day.
    pub daily_usd: Option<f64>,
    /// USD this agent may spend per UTC calendar month.
    pub monthly_usd: Option<f64>,
    /// Tokens (input + output) this agent may use per UTC day.
    pub daily_tokens: Option<u64>,
    /// Tokens this agent may use per UTC calendar month.
    pub monthly_tokens: Option<u64>,
}

impl AgentBudgetsFile {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Check the limits (a negative one is refused), naming `key`.
    ///
    /// # Errors
    /// A negative USD limit.
    pub fn check(&self, key: &str) -> Result<(), ConfigError> {
        for (k, v) in [
            ("daily_usd", self.daily_usd),
            ("monthly_usd", self.monthly_usd),
        ] {
            if v.is_some_and(|v| v.is_nan() || v < 0.0) {
                return Err(ConfigError::Invalid {
                    key: format!("{key}.{k}"),
                    detail: "expected a number of US dollars, 0 or more".into(),
                });
            }
        }
        Ok(())
    }
}

/// A model's prices, USD per million tokens (and per speech and image unit).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Price {
    /// Uncached prompt tokens.
    pub input: f64,
    /// Cached prompt tokens.
    pub cached: f64,
    /// Completion tokens.
    pub output: f64,
    /// USD per million characters spoken.
    pub characters: f64,
    /// USD per minute of audio made.
    pub audio_minute: f64,
    /// USD per image made.
    pub image: f64,
}

/// The resolved budgets (`None`: no limit): the file's, with the USD limits checked.
pub type Budgets = BudgetsFile;

/// Prices and budgets.
#[derive(Clone, Debug, PartialEq)]
pub struct UsageConfig {
    /// Model name or prefix → price; the longest matching prefix wins.
    pub prices: BTreeMap<String, Price>,
    /// Limits.
    pub budgets: Budgets,
    /// Each agent's own limits, by agent name (only agents that set some).
    pub agents: BTreeMap<String, AgentBudgetsFile>,
}

impl Default for UsageConfig {
    fn default() -> Self {
        Self {
            prices: default_prices(),
            budgets: Budgets::default(),
            agents: BTreeMap::new(),
        }
    }
}

impl UsageConfig {
    /// The price of `model`: an exact entry, else the longest entry that prefixes it (after
    /// dropping a `vendor/` routing prefix such as OpenRouter's `openai/gpt-4o`).
    pub fn price(&self, model: &str) -> Option<Price> {
        let bare = model.rsplit('/').next().unwrap_or(model);
        for m in [model, bare] {
            if let Some(p) = self.prices.get(m) {
                return Some(*p);
            }
        }
        [model, bare]
            .iter()
            .flat_map(|m| {
                self.prices
                    .iter()
                    .filter(move |(k, _)| m.starts_with(k.as_str()))
            })
            .max_by_key(|(k, _)| k.len())
            .map(|(_, p)| *p)
    }
}

/// Built-in prices (USD per million tokens: input, cached input, output), as the providers'
/// public price pages listed them on 2025-06-01. `prices` in the config overrides them.
const DEFAULT_PRICES: &[(&str, f64, f64, f64)] = &[
    ("gpt-4o", 2.5, 1.25, 10.0),
    ("gpt-4o-mini", 0.15, 0.075, 0.6),
    ("gpt-4.1", 2.0, 0.5, 8.0),
    ("gpt-4.1-mini", 0.4, 0.1, 1.6),
    ("gpt-4.1-nano", 0.1, 0.025, 0.4),
    ("o3", 2.0, 0.5, 8.0),
    ("o3-mini", 1.1, 0.55, 4.4),
    ("o4-mini", 1.1, 0.275, 4.4),
    ("claude-opus-4", 15.0, 1.5, 75.0),
    ("claude-sonnet-4", 3.0, 0.3, 15.0),
    ("claude-3-7-sonnet", 3.0, 0.3, 15.0),
    ("claude-3-5-sonnet", 3.0, 0.3, 15.0),
    ("claude-3-5-haiku", 0.8, 0.08, 4.0),
    ("claude-haiku-4", 1.0, 0.1, 5.0),
    ("claude-3-haiku", 0.25, 0.03, 1.25),
];

/// Built-in prices of speech and image models (USD per million characters, per minute of
/// audio, per image), from the same price pages; `gpt-image-1` at its medium quality
/// 1024x1024 price.
const DEFAULT_MEDIA_PRICES: &[(&str, f64, f64, f64)] = &[
    ("tts-1", 15.0, 0.0, 0.0),
    ("tts-1-hd", 30.0, 0.0, 0.0),
    ("gpt-4o-mini-tts", 0.0, 0.015, 0.0),
    ("dall-e-2", 0.0, 0.0, 0.02),
    ("dall-e-3", 0.0, 0.0, 0.04),
    ("gpt-image-1", 0.0, 0.0, 0.042),
    ("espeak-ng", 0.0, 0.0, 0.0),
];

fn default_prices() -> BTreeMap<String, Price> {
    let tokens = DEFAULT_PRICES.iter().map(|(m, input, cached, output)| {
        (
            (*m).to_string(),
            Price {
                input: *input,
                cached: *cached,
                output: *output,
                ..Price::default()
            },
        )
    });
    let media = DEFAULT_MEDIA_PRICES
        .iter()
        .map(|(m, characters, audio_minute, image)| {
            (
                (*m).to_string(),
                Price {
                    characters: *characters,
                    audio_minute: *audio_minute,
                    image: *image,
                    ..Price::default()
                },
            )
        });
    tokens.chain(media).collect()
}

fn check_usd(key: &str, v: Option<f64>) -> Result<Option<f64>, ConfigError> {
    match v {
        Some(x) if !x.is_finite() || x < 0.0 => Err(ConfigError::Invalid {
            key: key.into(),
            detail: format!("expected a number of US dollars >= 0, got {x}"),
        }),
        v => Ok(v),
    }
}

/// Resolve `prices` (over the built-in defaults) and `budgets`.
///
/// # Errors
/// A negative or non-finite price or budget, named by its key.
pub fn resolve_usage(
    prices: &BTreeMap<String, PriceFile>,
    budgets: &BudgetsFile,
) -> Result<UsageConfig, ConfigError> {
    let mut table = default_prices();
    for (model, p) in prices {
        let key = |f: &str| format!("prices.\"{model}\".{f}");
        let characters = check_usd(&key("characters"), p.characters)?;
        let audio_minute = check_usd(&key("audio_minute"), p.audio_minute)?;
        let image = check_usd(&key("image"), p.image)?;
        // A speech or image model has no token prices.
        let media = characters.is_some() || audio_minute.is_some() || image.is_some();
        let required = |f: &str, v: Option<f64>| -> Result<f64, ConfigError> {
            match check_usd(&key(f), v)? {
                Some(v) => Ok(v),
                None if media => Ok(0.0),
                None => Err(ConfigError::Invalid {
                    key: key(f),
                    detail: format!("the {f} price (USD per million tokens) is required"),
                }),
            }
        };
        let input = required("input", p.input)?;
        let output = required("output", p.output)?;
        let cached = check_usd(&key("cached"), p.cached)?.unwrap_or(input);
        table.insert(
            model.clone(),
            Price {
                input,
                cached,
                output,
                characters: characters.unwrap_or(0.0),
                audio_minute: audio_minute.unwrap_or(0.0),
                image: image.unwrap_or(0.0),
            },
        );
    }
    for (key, usd) in [
        ("budgets.daily_usd", budgets.daily_usd),
        ("budgets.monthly_usd", budgets.monthly_usd),
        (
            "budgets.per_session_daily_usd",
            budgets.per_session_daily_usd,
        ),
        ("budgets.per_user_daily_usd", budgets.per_user_daily_usd),
    ] {
        check_usd(key, usd)?;
    }
    Ok(UsageConfig {
        prices: table,
        budgets: budgets.clone(),
        agents: BTreeMap::new(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn longest_prefix_wins_and_vendor_prefix_is_dropped() {
        let c = UsageConfig::default();
        assert_eq!(
            c.price("gpt-4o-mini-2024-07-18").map(|p| p.input),
            Some(0.15)
        );
        assert_eq!(c.price("gpt-4o-2024-08-06").map(|p| p.input), Some(2.5));
        assert_eq!(c.price("openai/gpt-4o").map(|p| p.output), Some(10.0));
        assert_eq!(c.price("llama3.2"), None);
    }

    #[test]
    fn negative_prices_and_budgets_are_refused_with_the_key() {
        let mut prices = BTreeMap::new();
        prices.insert(
            "m".to_string(),
            PriceFile {
                input: Some(-1.0),
                output: Some(1.0),
                ..PriceFile::default()
            },
        );
        let e = resolve_usage(&prices, &BudgetsFile::default()).unwrap_err();
        assert!(e.to_string().contains("prices.\"m\".input"), "{e}");
        let e = resolve_usage(
            &BTreeMap::new(),
            &BudgetsFile {
                daily_usd: Some(-5.0),
                ..BudgetsFile::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("budgets.daily_usd"), "{e}");
        let mut prices = BTreeMap::new();
        prices.insert(
            "m".to_string(),
            PriceFile {
                input: Some(1.0),
                output: Some(4.0),
                ..PriceFile::default()
            },
        );
        let c = resolve_usage(&prices, &BudgetsFile::default()).unwrap();
        assert_eq!(
            c.price("m"),
            Some(Price {
                input: 1.0,
                cached: 1.0,
                output: 4.0,
                ..Price::default()
            })
        );
    }
}
