//! Bringing a started cluster to "ready" from outside its nodes, through their
//! HTTP API only: every node ready (`/readyz`: a live registry leader, every
//! region known), one demo tenant homed in each region (created once through
//! the admin API and kept in the secrets file), and every node knowing every
//! demo tenant's token before anyone is told the cluster is up.

use crate::layout::{write_json, NodePlan, Secrets, SECRETS_FILE};
use crate::limits::{PROBE_TIMEOUT_MS, READY_POLL_MS};
use crate::nodes::Nodes;
use crate::Error;
use keyhold_clusterfile::TenantEntry;
use keyhold_server::limits::DEMO_TENANT_REQUESTS_PER_SECOND;
use std::path::Path;
use std::time::{Duration, Instant};

/// Waits until every node answers `/readyz` with 200.
pub async fn wait_ready(nodes: &Nodes, deadline: Instant) -> Result<(), Error> {
    for plan in nodes.plans() {
        let url = format!("{}/readyz", plan.api_url());
        while !nodes.answers(&url).await {
            if Instant::now() > deadline {
                return Err(Error::Node(format!(
                    "node {} was not ready in time (the registry elects no leader, or \
                     misses a region); see {}",
                    plan.id,
                    plan.log_file.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(READY_POLL_MS)).await;
        }
    }
    Ok(())
}

/// Creates the demo tenants that do not exist yet, each through its home
/// region's first node, saving each token at once.
pub async fn demo_tenants(
    http: &reqwest::Client,
    plans: &[NodePlan],
    secrets: &mut Secrets,
    data_dir: &Path,
    deadline: Instant,
) -> Result<(), Error> {
    for plan in plans.iter().filter(|p| p.replica == 0) {
        let tenant_id = format!("demo-{}", plan.region);
        if secrets.tenants.iter().any(|t| t.tenant_id == tenant_id) {
            continue;
        }
        let body = serde_json::json!({
            "tenant_id": tenant_id,
            "home_region": plan.region,
            "requests_per_second": DEMO_TENANT_REQUESTS_PER_SECOND,
            "new_keys_per_second": DEMO_TENANT_REQUESTS_PER_SECOND,
        });
        let token = loop {
            let sent = http
                .post(format!("{}/admin/v1/tenants", plan.api_url()))
                .bearer_auth(&secrets.admin_token)
                .json(&body)
                .timeout(Duration::from_millis(PROBE_TIMEOUT_MS * 5))
                .send()
                .await;
            let failure = match sent {
                Ok(r) if r.status().as_u16() == 201 => {
                    let created: serde_json::Value = r.json().await.map_err(|e| {
                        Error::Node(format!("creating {tenant_id}: unreadable answer: {e}"))
                    })?;
                    match created["token"].as_str() {
                        Some(token) => break token.to_owned(),
                        None => format!("no token in {created}"),
                    }
                }
                // The registry may still be settling: retried until the deadline.
                Ok(r) if r.status().is_server_error() => format!("{}", r.status()),
                Ok(r) => {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    return Err(Error::Node(format!(
                        "cannot create demo tenant {tenant_id}: {status} {text} (if the data \
                         dir's secrets file lost its tokens, start from an empty --data-dir)"
                    )));
                }
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                return Err(Error::Node(format!(
                    "cannot create demo tenant {tenant_id}: {failure}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(READY_POLL_MS * 4)).await;
        };
        secrets.tenants.push(TenantEntry {
            tenant_id,
            home_region: plan.region.clone(),
            token,
        });
        write_json(&data_dir.join(SECRETS_FILE), secrets)?;
    }
    Ok(())
}

/// Waits until every node (each node of every region) accepts every demo
/// tenant's token (anything but 401 for a lookup of an order that does not exist).
pub async fn wait_tenants_known(
    http: &reqwest::Client,
    plans: &[NodePlan],
    tenants: &[TenantEntry],
    deadline: Instant,
) -> Result<(), Error> {
    for plan in plans {
        for tenant in tenants {
            loop {
                let sent = http
                    .get(format!("{}/v1/orders/ord_up_probe", plan.api_url()))
                    .bearer_auth(&tenant.token)
                    .timeout(Duration::from_millis(PROBE_TIMEOUT_MS))
                    .send()
                    .await;
                if matches!(&sent, Ok(r) if r.status().as_u16() != 401) {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(Error::Node(format!(
                        "node {} does not know tenant {} in time",
                        plan.id, tenant.tenant_id
                    )));
                }
                tokio::time::sleep(Duration::from_millis(READY_POLL_MS)).await;
            }
        }
    }
    Ok(())
}
