//! The cluster a drill runs on, as `keyhold up` describes it in
//! `cluster.json` (contract sections 9 and 10), and the calls the drill makes
//! to it: the control API (kill, start, isolate, heal), the admin API
//! (cluster view, failover, operations, reconciliation) and the fake payment
//! provider's charges.

use crate::limits::REQUEST_TIMEOUT_MS;
use crate::Error;
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
pub struct RegionEntry {
    pub name: String,
    pub api_url: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TenantEntry {
    pub tenant_id: String,
    pub home_region: String,
    pub token: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct NodeEntry {
    pub node_id: u64,
    pub region: String,
    pub api_url: String,
}

/// `cluster.json`, the parts a drill uses.
#[derive(Debug, Clone, Deserialize)]
pub struct ClusterFile {
    pub admin_token: String,
    pub regions: Vec<RegionEntry>,
    pub psp_url: String,
    pub control_url: String,
    pub tenants: Vec<TenantEntry>,
    pub nodes: Vec<NodeEntry>,
}

impl ClusterFile {
    pub fn read(path: &Path) -> Result<ClusterFile, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Invalid(format!("cannot read {}: {e}", path.display())))?;
        serde_json::from_str(&text)
            .map_err(|e| Error::Invalid(format!("{} is not a cluster.json: {e}", path.display())))
    }

    /// The API origin of a node of `region`, from the region list.
    pub fn region_url(&self, region: &str) -> Option<&str> {
        self.regions
            .iter()
            .find(|r| r.name == region)
            .map(|r| r.api_url.as_str())
    }
}

/// An HTTP client bound to one cluster.
#[derive(Clone)]
pub struct Calls {
    pub http: reqwest::Client,
    pub file: ClusterFile,
}

/// An answer read whole: status and JSON body (null when not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Calls {
    pub fn new(file: ClusterFile) -> Result<Calls, Error> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(REQUEST_TIMEOUT_MS))
            .pool_max_idle_per_host(64)
            .build()?;
        Ok(Calls { http, file })
    }

    async fn read(request: reqwest::RequestBuilder) -> Result<Answer, reqwest::Error> {
        let response = request.send().await?;
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        Ok(Answer { status, body })
    }

    /// A control API call (`POST /v1/...` on `up`'s control origin); 200 or an
    /// error.
    pub async fn control(&self, path: &str) -> Result<(), Error> {
        let url = format!("{}{path}", self.file.control_url);
        let answer = Self::read(
            self.http
                .post(&url)
                .bearer_auth(&self.file.admin_token)
                .timeout(Duration::from_secs(60)),
        )
        .await?;
        if answer.status != 200 {
            return Err(Error::Cluster(format!(
                "control {path} answered {}: {}",
                answer.status, answer.body
            )));
        }
        Ok(())
    }

    /// `GET` of an admin path through the node at `origin`.
    pub async fn admin_get(&self, origin: &str, path: &str) -> Result<Answer, reqwest::Error> {
        Self::read(
            self.http
                .get(format!("{origin}{path}"))
                .bearer_auth(&self.file.admin_token),
        )
        .await
    }

    /// `POST` of a JSON body to an admin path through the node at `origin`.
    pub async fn admin_post(
        &self,
        origin: &str,
        path: &str,
        body: &Value,
    ) -> Result<Answer, reqwest::Error> {
        Self::read(
            self.http
                .post(format!("{origin}{path}"))
                .bearer_auth(&self.file.admin_token)
                .json(body),
        )
        .await
    }

    /// `GET /v1/orders?client_order_id=X` for a tenant through `origin`.
    pub async fn find_order(
        &self,
        origin: &str,
        token: &str,
        client_order_id: &str,
    ) -> Result<Answer, reqwest::Error> {
        Self::read(
            self.http
                .get(format!("{origin}/v1/orders"))
                .query(&[("client_order_id", client_order_id)])
                .bearer_auth(token),
        )
        .await
    }

    /// Every charge the fake payment provider made: `(order_id, status)`.
    pub async fn charges(&self) -> Result<Vec<(String, String)>, Error> {
        let answer = Self::read(self.http.get(format!("{}/v1/charges", self.file.psp_url))).await?;
        let data = answer.body["data"]
            .as_array()
            .ok_or_else(|| Error::Cluster(format!("charges are not a listing: {}", answer.body)))?;
        Ok(data
            .iter()
            .filter_map(|c| {
                Some((
                    c["order_id"].as_str()?.to_owned(),
                    c["status"].as_str().unwrap_or("").to_owned(),
                ))
            })
            .collect())
    }
}
