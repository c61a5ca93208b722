//! [`ResilientModel`]: retries with exponential backoff and full jitter on retryable errors
//! (honouring `Retry-After`), never on auth/4xx errors, then fails over to the next provider.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::{ChatModel, ChatRequest, ChatResponse, DynModel, LlmError, StreamEvent};

/// How hard to retry one provider.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts per provider, the first included (>= 1).
    pub max_attempts: u32,
    /// Backoff before the second attempt; doubles after each.
    pub base_delay: Duration,
    /// Longest backoff, and the longest `Retry-After` honoured (beyond it, fail over).
    pub max_delay: Duration,
    /// A refused connection is not retried (the local default: nothing runs there, and the
    /// user is told at once what to configure).
    pub fail_fast_refused: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            fail_fast_refused: false,
        }
    }
}

/// A fallback chain of providers with per-provider retries.
pub struct ResilientModel {
    models: Vec<DynModel>,
    policy: RetryPolicy,
    /// Each model's configured default model name (for a request that names none).
    defaults: Vec<String>,
    health: super::health::ProviderHealth,
}

impl ResilientModel {
    /// Try `models` in order, each with `policy`.
    pub fn new(models: Vec<DynModel>, policy: RetryPolicy) -> Self {
        let defaults = vec![String::new(); models.len()];
        Self {
            models,
            policy,
            defaults,
            health: super::health::ProviderHealth::default(),
        }
    }

    /// Record each call's outcome in `health`; `defaults` are the models' configured model
    /// names, in order.
    #[must_use]
    pub fn with_health(
        mut self,
        health: super::health::ProviderHealth,
        defaults: Vec<String>,
    ) -> Self {
        self.health = health;
        self.defaults = defaults;
        self
    }

    fn model_of<'a>(&'a self, i: usize, req: &'a ChatRequest) -> &'a str {
        if req.model.is_empty() {
            self.defaults.get(i).map_or("", String::as_str)
        } else {
            &req.model
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .policy
            .base_delay
            .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)))
            .min(self.policy.max_delay);
        // Full jitter: uniform in [exp/2, exp] keeps a floor so retries are not immediate.
        let half = exp / 2;
        half + Duration::from_secs_f64(half.as_secs_f64() * fastrand::f64())
    }
}

#[async_trait]
impl ChatModel for ResilientModel {
    fn name(&self) -> &str {
        self.models.first().map_or("none", |m| m.name())
    }

    fn health(&self) -> Option<super::health::ProviderHealth> {
        Some(self.health.clone())
    }

    async fn complete(
        &self,
        req: &ChatRequest,
        stream: Option<&mpsc::Sender<StreamEvent>>,
    ) -> Result<ChatResponse, LlmError> {
        let mut last = LlmError::InvalidResponse {
            provider: "none".into(),
            detail: "no LLM provider configured".into(),
        };
        for (i, model) in self.models.iter().enumerate() {
            let mut attempt = 0;
            loop {
                attempt += 1;
                // Forward deltas, remembering whether any reached the user: an attempt that
                // already streamed text is not retried (the text would appear twice).
                let streamed = Arc::new(AtomicBool::new(false));
                let result = match stream {
                    None => model.complete(req, None).await,
                    Some(outer) => {
                        let (tx, mut rx) = mpsc::channel::<StreamEvent>(64);
                        let flag = streamed.clone();
                        let outer = outer.clone();
                        let fwd = async move {
                            while let Some(ev) = rx.recv().await {
                                flag.store(true, Ordering::Relaxed);
                                let _ = outer.send(ev).await;
                            }
                        };
                        let (r, ()) = tokio::join!(
                            async move {
                                let r = model.complete(req, Some(&tx)).await;
                                drop(tx);
                                r
                            },
                            fwd
                        );
                        r
                    }
                };
                let now = clawft_channel_core::now_ms();
                let err = match result {
                    Ok(r) => {
                        self.health
                            .success(model.name(), self.model_of(i, req), now);
                        return Ok(r);
                    }
                    Err(e) => e,
                };
                if matches!(err, LlmError::Cancelled) {
                    return Err(err);
                }
                self.health
                    .failure(model.name(), self.model_of(i, req), &err, now);
                // Every failed attempt, retried or not, by the provider that failed.
                crate::metrics::inc(
                    "clawft_llm_errors_total",
                    &[("provider", model.name()), ("kind", err.kind())],
                    1,
                );
                let can_retry = err.is_retryable()
                    && !(self.policy.fail_fast_refused && err.is_refused())
                    && attempt < self.policy.max_attempts.max(1)
                    && !streamed.load(Ordering::Relaxed);
                let wait = match err.retry_after() {
                    Some(d) if d > self.policy.max_delay => None,
                    Some(d) => Some(d),
                    None => Some(self.backoff(attempt)),
                };
                match (can_retry, wait) {
                    (true, Some(wait)) => {
                        tracing::warn!(provider = model.name(), attempt, error = %err, wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX), "llm call failed, retrying");
                        tokio::time::sleep(wait).await;
                    }
                    _ => {
                        // With one provider the turn reports the failure (once); with a
                        // fallback list this line says which provider failed over.
                        if self.models.len() > 1 {
                            tracing::warn!(provider = model.name(), attempt, error = %err, "llm provider failed");
                        } else {
                            tracing::debug!(provider = model.name(), attempt, error = %err, "llm provider failed");
                        }
                        if streamed.load(Ordering::Relaxed) {
                            return Err(err);
                        }
                        last = err;
                        break;
                    }
                }
            }
            if !last.allows_failover() {
                break;
            }
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;
    use crate::llm::Usage;

    struct Scripted {
        name: &'static str,
        results: Mutex<VecDeque<Result<ChatResponse, LlmError>>>,
        calls: Mutex<u32>,
    }

    impl Scripted {
        fn new(name: &'static str, r: Vec<Result<ChatResponse, LlmError>>) -> Arc<Self> {
            Arc::new(Self {
                name,
                results: Mutex::new(r.into()),
                calls: Mutex::new(0),
            })
        }
        fn calls(&self) -> u32 {
            *self.calls.lock().unwrap()
        }
    }

    #[async_trait]
    impl ChatModel for Scripted {
        fn name(&self) -> &str {
            self.name
        }
        async fn complete(
            &self,
            _req: &ChatRequest,
            _s: Option<&mpsc::Sender<StreamEvent>>,
        ) -> Result<ChatResponse, LlmError> {
            *self.calls.lock().unwrap() += 1;
            self.results
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or_else(|| Ok(text("default")))
        }
    }

    fn text(t: &str) -> ChatResponse {
        ChatResponse {
            content: t.into(),
            tool_calls: vec![],
            finish_reason: None,
            usage: Usage::default(),
            model: String::new(),
        }
    }

    fn req() -> ChatRequest {
        ChatRequest {
            model: String::new(),
            messages: vec![],
            tools: Vec::new().into(),
            max_tokens: None,
            temperature: None,
        }
    }

    fn err(status: u16, after: Option<u64>) -> LlmError {
        LlmError::from_status("p", status, "x", after.map(Duration::from_secs))
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limit_then_success_honours_retry_after() {
        let a = Scripted::new("a", vec![Err(err(429, Some(7))), Ok(text("ok"))]);
        let m = ResilientModel::new(vec![a.clone()], RetryPolicy::default());
        let t0 = tokio::time::Instant::now();
        let r = m.complete(&req(), None).await.unwrap();
        assert_eq!(r.content, "ok");
        assert_eq!(a.calls(), 2);
        assert!(t0.elapsed() >= Duration::from_secs(7));
    }

    #[tokio::test(start_paused = true)]
    async fn auth_error_is_not_retried_but_fails_over() {
        let a = Scripted::new("a", vec![Err(err(401, None))]);
        let b = Scripted::new("b", vec![Ok(text("from b"))]);
        let m = ResilientModel::new(vec![a.clone(), b.clone()], RetryPolicy::default());
        assert_eq!(m.complete(&req(), None).await.unwrap().content, "from b");
        assert_eq!((a.calls(), b.calls()), (1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_bounded_and_the_last_error_is_returned() {
        let a = Scripted::new("a", (0..10).map(|_| Err(err(503, None))).collect());
        let m = ResilientModel::new(
            vec![a.clone()],
            RetryPolicy {
                max_attempts: 3,
                ..RetryPolicy::default()
            },
        );
        let e = m.complete(&req(), None).await.unwrap_err();
        assert_eq!(e.kind(), "server");
        assert_eq!(a.calls(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn too_long_retry_after_fails_over_at_once() {
        let a = Scripted::new("a", vec![Err(err(429, Some(3600)))]);
        let b = Scripted::new("b", vec![Ok(text("b"))]);
        let m = ResilientModel::new(vec![a.clone(), b], RetryPolicy::default());
        let t0 = tokio::time::Instant::now();
        assert_eq!(m.complete(&req(), None).await.unwrap().content, "b");
        assert!(t0.elapsed() < Duration::from_secs(1));
        assert_eq!(a.calls(), 1);
    }
}
