//! The `channels` scenario: the gateway with Telegram, Discord and Slack connected to the
//! platform fakes of the channel crates (their `testing` feature, enabled by this crate's
//! `platform-fakes` feature). Without the feature the scenario prints its figures as missing.

use crate::Ctx;

#[cfg(not(feature = "platform-fakes"))]
pub async fn channels(ctx: &mut Ctx) -> Result<(), String> {
    let note = "not measured: build weft-bench with --features platform-fakes";
    ctx.report.add(
        "start_to_ready_all_channels_median",
        None,
        "ms",
        Some(10.0),
        "<=",
        None,
        note,
    );
    ctx.report.add(
        "idle_rss_all_channels",
        None,
        "MiB",
        Some(8.0),
        "<=",
        None,
        note,
    );
    Ok(())
}

#[cfg(feature = "platform-fakes")]
pub async fn channels(ctx: &mut Ctx) -> Result<(), String> {
    use std::time::{Duration, Instant};

    use clawft_channel_discord::fake::{FakeDiscord, FAKE_TOKEN};
    use clawft_channel_slack::fake::{FakeSlack, APP_TOKEN, BOT_TOKEN};
    use clawft_channel_telegram::fake::FakeTelegram;
    use serde_json::{json, Value};

    use crate::gateway::Home;
    use crate::http::Client;

    let tg = FakeTelegram::start().await;
    let dc = FakeDiscord::start().await;
    let sl = FakeSlack::start().await;
    let extra = json!({
        "telegram": { "token": FakeTelegram::TOKEN, "api_url": tg.api_url(), "allow_from": [111] },
        "discord": { "token": FAKE_TOKEN, "proxy": dc.base_url(), "allow_from": ["111"] },
        "slack": { "token": BOT_TOKEN, "app_token": APP_TOKEN, "api_url": sl.api_url(), "allow_from": ["U111"] },
    });
    let n = ctx.n(2, 5);
    let mut home = Home::new("channels", &ctx.llm.base_url(), Some(extra))?;
    let mut starts = Vec::new();
    let mut connects = Vec::new();
    let mut rss = Vec::new();
    let mut states = String::new();
    for _ in 0..n {
        let (h, gw) = ctx.start_gateway(home).await?;
        home = h;
        starts.push(crate::ms(gw.start_to_ready));
        // Connected: every platform adapter reports `connected...` in /readyz.
        let mut c = Client::new(home.addr(), Duration::from_secs(10));
        let t0 = Instant::now();
        let connected = loop {
            if let Ok((200, body)) = c.request("GET", "/readyz", None).await {
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let ch = &v["channels"];
                states = ch.to_string();
                if ["telegram", "discord", "slack"]
                    .iter()
                    .all(|k| ch[*k].as_str().is_some_and(|s| s.starts_with("connected")))
                {
                    break true;
                }
            }
            if t0.elapsed() > Duration::from_secs(10) {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        if !connected {
            return Err(format!("channels not connected within 10 s: {states}"));
        }
        connects.push(crate::ms(gw.start_to_ready + t0.elapsed()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss.push(gw.rss()? as f64 / crate::MIB);
        drop(gw);
    }
    ctx.report.add(
        "start_to_ready_all_channels_median",
        crate::median_f(&mut starts),
        "ms",
        Some(10.0),
        "<=",
        Some(n),
        "spawn -> first 200 from /healthz, with Telegram, Discord and Slack configured (local fakes)",
    );
    ctx.report.add(
        "start_to_connected_all_channels_median",
        crate::median_f(&mut connects),
        "ms",
        None,
        "<=",
        Some(n),
        format!("spawn -> /readyz shows all three adapters connected: {states}"),
    );
    ctx.report.add(
        "idle_rss_all_channels",
        crate::median_f(&mut rss),
        "MiB",
        Some(8.0),
        "<=",
        Some(n),
        "VmRSS 1 s after all adapters connected to the local fakes (median)",
    );
    Ok(())
}
