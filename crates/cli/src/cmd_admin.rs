//! `keyhold tenant create|show|list|move|rotate-token|set-limits|delete`,
//! `keyhold region failover|reconciliation`, `keyhold cluster status`,
//! `keyhold operation list|show`, `keyhold outbox replay`, `keyhold node
//! add|remove`, and the calls of `keyhold control` (up's control API): the
//! admin API from the command line. Any node answers (admin calls act through
//! the registry); a move or a failover is followed to its end with a progress
//! bar, a node's addition until it votes.

use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::time::Duration;

/// How often a move's or failover's operation is polled, and for how long at most.
const MOVE_POLL_MS: u64 = 200;
const MOVE_WAIT_S_MAX: u64 = 3_600;
/// How long `node add` keeps asking while the node catches up (each call
/// waits up to 5 s on the groups itself).
const NODE_ADD_WAIT_S_MAX: u64 = 1_800;

pub struct Admin {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Admin {
    pub fn new(url: &str, token: String) -> anyhow::Result<Admin> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Admin {
            base: url.trim_end_matches('/').to_owned(),
            token,
            http,
        })
    }

    async fn call(&self, request: reqwest::RequestBuilder) -> anyhow::Result<(u16, Value)> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .with_context(|| format!("cannot reach {}", self.base))?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status >= 400 {
            let title = body["title"].as_str().unwrap_or("error");
            let detail = body["detail"].as_str().unwrap_or("");
            bail!(
                "{status} {title}{}{detail}",
                if detail.is_empty() { "" } else { ": " }
            );
        }
        Ok((status, body))
    }

    pub async fn create_tenant(
        &self,
        id: &str,
        home: &str,
        survival: Option<&str>,
    ) -> anyhow::Result<()> {
        let url = format!("{}/admin/v1/tenants", self.base);
        let mut body = json!({"tenant_id": id, "home_region": home});
        if let Some(survival) = survival {
            body["survival"] = survival.into();
        }
        let (_, tenant) = self.call(self.http.post(url).json(&body)).await?;
        println!("{}", serde_json::to_string_pretty(&tenant)?);
        eprintln!("the token is shown only this once: keep it");
        Ok(())
    }

    /// A new token (printed once); the old one works for `grace` more.
    pub async fn rotate_token(&self, id: &str, grace: Option<Duration>) -> anyhow::Result<()> {
        let url = format!("{}/admin/v1/tenants/{id}/token", self.base);
        let body = match grace {
            Some(g) => json!({"grace_seconds": g.as_secs()}),
            None => json!({}),
        };
        let (_, tenant) = self.call(self.http.post(url).json(&body)).await?;
        println!("{}", serde_json::to_string_pretty(&tenant)?);
        eprintln!(
            "the new token is shown only this once; the old one works until {}",
            tenant["previous_token_valid_until"]
                .as_str()
                .unwrap_or("now")
        );
        Ok(())
    }

    pub async fn set_limits(
        &self,
        id: &str,
        requests_per_second: Option<u32>,
        new_keys_per_second: Option<u32>,
    ) -> anyhow::Result<()> {
        if requests_per_second.is_none() && new_keys_per_second.is_none() {
            bail!("give --requests-per-second, --new-keys-per-second or both");
        }
        let mut body = json!({});
        if let Some(n) = requests_per_second {
            body["requests_per_second"] = n.into();
        }
        if let Some(n) = new_keys_per_second {
            body["new_keys_per_second"] = n.into();
        }
        let url = format!("{}/admin/v1/tenants/{id}/limits", self.base);
        let (_, tenant) = self.call(self.http.put(url).json(&body)).await?;
        println!("{}", serde_json::to_string_pretty(&tenant)?);
        Ok(())
    }

    pub async fn delete_tenant(&self, id: &str) -> anyhow::Result<()> {
        let url = format!("{}/admin/v1/tenants/{id}", self.base);
        let (_, tenant) = self.call(self.http.delete(url)).await?;
        println!("{}", serde_json::to_string_pretty(&tenant)?);
        eprintln!("tenant {id} deleted: its tokens no longer work; every region erases its data");
        Ok(())
    }

    /// `GET path`, the answer printed.
    pub async fn get(&self, path: &str) -> anyhow::Result<()> {
        let url = format!("{}{path}", self.base);
        let (_, body) = self.call(self.http.get(url)).await?;
        println!("{}", serde_json::to_string_pretty(&body)?);
        Ok(())
    }

    /// `POST path` with a JSON body, the answer printed.
    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<()> {
        let url = format!("{}{path}", self.base);
        let (_, answer) = self.call(self.http.post(url).json(body)).await?;
        println!("{}", serde_json::to_string_pretty(&answer)?);
        Ok(())
    }

    /// `POST /admin/v1/outbox/replay`, of every kept event or those after
    /// `since`.
    pub async fn replay(&self, since: Option<&str>) -> anyhow::Result<()> {
        let body = match since {
            Some(since) => json!({ "since": since }),
            None => json!({}),
        };
        self.post("/admin/v1/outbox/replay", &body).await
    }

    /// `POST /admin/v1/nodes` until the node votes in both groups (200):
    /// a 202 means it is still catching up, and the call is idempotent.
    pub async fn add_node(
        &self,
        id: u64,
        region: &str,
        api_addr: &str,
        raft_addr: &str,
    ) -> anyhow::Result<()> {
        let url = format!("{}/admin/v1/nodes", self.base);
        let body =
            json!({"node_id": id, "region": region, "api_addr": api_addr, "raft_addr": raft_addr});
        let deadline = std::time::Instant::now() + Duration::from_secs(NODE_ADD_WAIT_S_MAX);
        loop {
            let (status, answer) = self.call(self.http.post(&url).json(&body)).await?;
            if status == 200 {
                println!("{}", serde_json::to_string_pretty(&answer)?);
                return Ok(());
            }
            eprintln!(
                "node {id} catching up: registry {}, region group {}",
                answer["registry"], answer["region_group"]
            );
            if std::time::Instant::now() > deadline {
                bail!("node {id} still catching up after {NODE_ADD_WAIT_S_MAX} s");
            }
            tokio::time::sleep(Duration::from_millis(MOVE_POLL_MS)).await;
        }
    }

    /// Starts the move and follows its operation until done or failed.
    pub async fn move_tenant(&self, id: &str, to: &str) -> anyhow::Result<()> {
        let url = format!("{}/admin/v1/tenants/{id}/move", self.base);
        let (_, started) = self
            .call(self.http.post(url).json(&json!({"to": to})))
            .await?;
        self.follow(&started, format!("{id} -> {to}")).await
    }

    /// Fails `region` over (to its standby unless `to` names it) and follows
    /// the operation until done or failed; prints the result (the copy's
    /// position and the estimated loss).
    pub async fn fail_over(
        &self,
        region: &str,
        to: Option<&str>,
        force: bool,
    ) -> anyhow::Result<()> {
        let url = format!("{}/admin/v1/regions/{region}/failover", self.base);
        let mut body = json!({ "force": force });
        if let Some(to) = to {
            body["to"] = json!(to);
        }
        let started = match self.call(self.http.post(url).json(&body)).await {
            Ok((_, started)) => started,
            // The API's refusal names its body field; here the flag does that.
            Err(e) => bail!("{}", cli_wording(&e.to_string())),
        };
        self.follow(&started, format!("{region} failover")).await
    }

    /// Polls the operation `started` names, with a progress bar, until it is
    /// done (printed) or failed (an error).
    async fn follow(&self, started: &Value, label: String) -> anyhow::Result<()> {
        let op = started["operation_id"]
            .as_str()
            .context("the answer names no operation")?
            .to_owned();
        let bar = indicatif::ProgressBar::new(1000);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg:>12} [{bar:40}] {percent:>3}% {elapsed}")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(label);
        let url = format!("{}/admin/v1/operations/{op}", self.base);
        let deadline = std::time::Instant::now() + Duration::from_secs(MOVE_WAIT_S_MAX);
        loop {
            let (_, status) = self.call(self.http.get(&url)).await?;
            let progress = status["progress"].as_f64().unwrap_or(0.0);
            bar.set_position((progress * 1000.0) as u64);
            match status["state"].as_str() {
                Some("done") => {
                    bar.finish_with_message("done");
                    println!("{}", serde_json::to_string_pretty(&status)?);
                    return Ok(());
                }
                Some("failed") => {
                    bar.abandon_with_message("failed");
                    bail!(
                        "operation {op} failed: {}",
                        status["error"].as_str().unwrap_or("no reason given")
                    );
                }
                _ => {}
            }
            if std::time::Instant::now() > deadline {
                bail!("operation {op} still running after {MOVE_WAIT_S_MAX} s");
            }
            tokio::time::sleep(Duration::from_millis(MOVE_POLL_MS)).await;
        }
    }
}

/// A refusal of the admin API in the CLI's words: `send "force": true` (the
/// API body's field) becomes `add --force`.
fn cli_wording(refusal: &str) -> String {
    refusal.replace("send \"force\": true", "add --force")
}
