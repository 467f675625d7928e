//! The cluster a drill runs on, as `keyhold up` describes it in
//! `cluster.json` (contract sections 9 and 10), and the calls the drill makes
//! to it: the control API (kill, start, isolate, heal), the admin API
//! (cluster view, failover, operations, reconciliation) and the fake payment
//! provider's charges. The file's own type is `keyhold_clusterfile`'s,
//! shared with `keyhold up`, which writes it.

use crate::limits::REQUEST_TIMEOUT_MS;
use crate::Error;
pub use keyhold_clusterfile::{ClusterFile, TenantEntry};
use serde_json::Value;
use std::time::Duration;

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
