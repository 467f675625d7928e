//! Bringing a started cluster to "ready" from outside its nodes, through their
//! HTTP API only: every node ready (`/readyz`: a live registry leader, every
//! region known), one demo tenant homed in each region (created once through
//! the admin API and kept in the secrets file), and every node knowing every
//! live demo tenant's token before anyone is told the cluster is up.
//!
//! The registry, not the secrets file, says which demo tenants are live: an
//! operator may have rotated a demo tenant's token (the token up kept no longer
//! works) or deleted the tenant since up created it, and a restart must resume
//! the cluster all the same (contract section 11), so those are left out of
//! what `up` publishes, each with a line saying why.

use crate::layout::{write_json, NodePlan, Secrets, SECRETS_FILE};
use crate::limits::{PROBE_TIMEOUT_MS, READY_POLL_MS};
use crate::nodes::Nodes;
use crate::Error;
use keyhold_clusterfile::TenantEntry;
use keyhold_server::limits::DEMO_TENANT_REQUESTS_PER_SECOND;
use std::path::Path;
use std::time::{Duration, Instant};

/// Waits until every node answers `/readyz` with 200; on timeout the error
/// quotes the node's last answer, which names what it still lacks.
pub async fn wait_ready(nodes: &Nodes, deadline: Instant) -> Result<(), Error> {
    for plan in nodes.plans() {
        let url = format!("{}/readyz", plan.api_url());
        loop {
            let last = match nodes.probe(&url).await {
                Ok((200, _)) => break,
                Ok((status, body)) => format!("{status} {body}"),
                Err(e) => e,
            };
            if Instant::now() > deadline {
                return Err(Error::Node(format!(
                    "node {} (region {}) was not ready in time: waited for GET {url} to \
                     answer 200 (a registry leader, every region known, the region \
                     lease held); its last answer: {last}; see {}",
                    plan.id,
                    plan.region,
                    plan.log_file.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(READY_POLL_MS)).await;
        }
    }
    Ok(())
}

/// One tenant as the registry records it (`GET /admin/v1/tenants`).
#[derive(Debug, Clone)]
pub struct RegistryTenant {
    pub tenant_id: String,
    pub home_region: String,
    pub deleted: bool,
    /// The tenant's token was rotated at least once (it has a previous token).
    pub rotated: bool,
}

/// The registry's tenants, read through `plan`'s node (retried until the
/// deadline while the registry settles).
pub async fn registry_tenants(
    http: &reqwest::Client,
    plan: &NodePlan,
    admin_token: &str,
    deadline: Instant,
) -> Result<Vec<RegistryTenant>, Error> {
    let url = format!("{}/admin/v1/tenants", plan.api_url());
    loop {
        let sent = http
            .get(&url)
            .bearer_auth(admin_token)
            .timeout(Duration::from_millis(PROBE_TIMEOUT_MS))
            .send()
            .await;
        let failure = match sent {
            Ok(r) if r.status().is_success() => {
                let body: serde_json::Value = r
                    .json()
                    .await
                    .map_err(|e| Error::Node(format!("GET {url}: unreadable answer: {e}")))?;
                return Ok(parse_tenants(&body));
            }
            Ok(r) => format!("{}", r.status()),
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            return Err(Error::Node(format!(
                "node {} did not list the registry's tenants in time: waited for GET {url} \
                 to answer 200; its last answer: {failure}",
                plan.id
            )));
        }
        tokio::time::sleep(Duration::from_millis(READY_POLL_MS)).await;
    }
}

fn parse_tenants(body: &serde_json::Value) -> Vec<RegistryTenant> {
    let empty = Vec::new();
    body["data"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter_map(|t| {
            Some(RegistryTenant {
                tenant_id: t["tenant_id"].as_str()?.to_owned(),
                home_region: t["home_region"].as_str()?.to_owned(),
                deleted: t["state"] == "deleted",
                rotated: !t["previous_token_valid_until"].is_null(),
            })
        })
        .collect()
}

/// The demo tenants of the secrets file that the registry still has live and
/// whose token `up` holds is still theirs, each with the home the registry
/// records (a move or failover may have changed it). Each one left out is
/// logged with the reason.
pub fn live_demo_tenants(secrets: &Secrets, registry: &[RegistryTenant]) -> Vec<TenantEntry> {
    let mut live = Vec::new();
    for kept in &secrets.tenants {
        let Some(record) = registry.iter().find(|r| r.tenant_id == kept.tenant_id) else {
            tracing::warn!(
                tenant = %kept.tenant_id,
                "demo tenant unknown to the registry; left out of cluster.json"
            );
            continue;
        };
        if record.deleted {
            tracing::info!(
                tenant = %kept.tenant_id,
                "demo tenant was deleted; left out of cluster.json (its id is never given out again)"
            );
            continue;
        }
        if record.rotated {
            // up never rotates: a previous token means the one up holds was
            // replaced, and the new one was shown only to whoever rotated it.
            tracing::info!(
                tenant = %kept.tenant_id,
                "demo tenant's token was rotated; left out of cluster.json (its new token \
                 was shown only to whoever rotated it)"
            );
            continue;
        }
        live.push(TenantEntry {
            tenant_id: kept.tenant_id.clone(),
            home_region: record.home_region.clone(),
            token: kept.token.clone(),
        });
    }
    live
}

/// Creates the demo tenants the registry has never had (deleted ones count as
/// had: their ids are never given out again), each through its home region's
/// first node, saving each token at once.
pub async fn demo_tenants(
    http: &reqwest::Client,
    plans: &[NodePlan],
    secrets: &mut Secrets,
    registry: &mut Vec<RegistryTenant>,
    data_dir: &Path,
    deadline: Instant,
) -> Result<(), Error> {
    for plan in plans.iter().filter(|p| p.replica == 0) {
        let tenant_id = format!("demo-{}", plan.region);
        if registry.iter().any(|t| t.tenant_id == tenant_id) {
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
        secrets.tenants.retain(|t| t.tenant_id != tenant_id);
        secrets.tenants.push(TenantEntry {
            tenant_id: tenant_id.clone(),
            home_region: plan.region.clone(),
            token,
        });
        write_json(&data_dir.join(SECRETS_FILE), secrets)?;
        registry.push(RegistryTenant {
            tenant_id,
            home_region: plan.region.clone(),
            deleted: false,
            rotated: false,
        });
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
                let last = match &sent {
                    Ok(r) if r.status().as_u16() != 401 => break,
                    Ok(r) => r.status().to_string(),
                    Err(e) => e.to_string(),
                };
                if Instant::now() > deadline {
                    return Err(Error::Node(format!(
                        "node {} (region {}) does not know demo tenant {} in time: waited \
                         for its registry replica to accept the tenant's token (GET \
                         /v1/orders/ord_up_probe answering anything but 401); its last \
                         answer: {last}; see {}",
                        plan.id,
                        plan.region,
                        tenant.tenant_id,
                        plan.log_file.display()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(READY_POLL_MS)).await;
            }
        }
    }
    Ok(())
}
