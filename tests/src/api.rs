//! A small REST client for tests: raw access (status + JSON) so that tests
//! can check error answers too.

use std::time::Duration;

use flotilla_core::api::JobView;
use serde_json::Value;

#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub token: String,
    pub http: reqwest::Client,
    /// Set for a client acting as one agent process: sent in the
    /// `flotilla-agent-instance` header, and what its `register` body
    /// must carry as `instance`.
    pub instance: Option<String>,
}

impl Api {
    pub fn new(base: &str, token: &str) -> Self {
        Api {
            base: base.to_string(),
            token: token.to_string(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("building an HTTP client"),
            instance: None,
        }
    }

    pub fn with_token(&self, token: &str) -> Self {
        Api {
            token: token.to_string(),
            instance: None,
            ..self.clone()
        }
    }

    /// A client acting as one agent process with an agent token: a fresh
    /// instance id, sent with every call (put it in `register`'s body with
    /// [`Api::instance`]).
    pub fn agent_process(&self, token: &str) -> Self {
        Api {
            token: token.to_string(),
            instance: Some(uuid::Uuid::new_v4().to_string()),
            ..self.clone()
        }
    }

    /// The same client (base, token, agent instance) on new connections:
    /// for after a server restart, whose old keep-alive connections are
    /// dead.
    pub fn reconnected(&self) -> Self {
        Api {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("building an HTTP client"),
            ..self.clone()
        }
    }

    /// This agent process's instance id (see [`Api::agent_process`]).
    pub fn instance(&self) -> &str {
        self.instance
            .as_deref()
            .expect("an agent process client (Api::agent_process)")
    }

    /// Sends and returns (status, body as JSON or as a string value).
    pub async fn raw(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(instance) = &self.instance {
            req = req.header(flotilla_core::protocol::INSTANCE_HEADER, instance);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request reaches the server");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("reading the body");
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, v)
    }

    /// `PUT path` with `bytes` as the body (a checkpoint upload): status
    /// and body text.
    pub async fn put_bytes(&self, path: &str, bytes: Vec<u8>) -> (u16, String) {
        let resp = self
            .http
            .put(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .body(bytes)
            .send()
            .await
            .unwrap_or_else(|e| panic!("PUT {path}: {e}"));
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap_or_default())
    }

    /// `GET /metrics` with this client's token, which must answer 200: the
    /// Prometheus exposition text.
    pub async fn metrics(&self) -> String {
        let (status, v) = self.raw(reqwest::Method::GET, "/metrics", None).await;
        assert_eq!(status, 200, "/metrics: {v}");
        v.as_str().expect("the exposition is text").to_string()
    }

    pub async fn get(&self, path: &str) -> Value {
        let (s, v) = self.raw(reqwest::Method::GET, path, None).await;
        assert!((200..300).contains(&s), "GET {path}: {s} {v}");
        v
    }

    pub async fn post(&self, path: &str, body: Value) -> Value {
        let (s, v) = self.raw(reqwest::Method::POST, path, Some(body)).await;
        assert!((200..300).contains(&s), "POST {path}: {s} {v}");
        v
    }

    /// Submits a command job; returns its id.
    pub async fn submit(&self, body: Value) -> String {
        let v = self.post("/api/v1/jobs", body).await;
        v["id"].as_str().expect("submit answers an id").to_string()
    }

    pub async fn job(&self, id: &str) -> JobView {
        serde_json::from_value(self.get(&format!("/api/v1/jobs/{id}")).await)
            .expect("job view parses")
    }

    /// Waits until the job is in a final state.
    pub async fn wait_final(&self, id: &str, timeout: Duration) -> JobView {
        let start = std::time::Instant::now();
        loop {
            let j = self.job(id).await;
            if j.state.is_final() {
                return j;
            }
            assert!(
                start.elapsed() < timeout,
                "job {id} still {} after {timeout:?}",
                j.state
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Makes an agent token for `name`.
    pub async fn agent_token(&self, name: &str) -> String {
        let v = self
            .post(
                "/api/v1/tokens",
                serde_json::json!({"role": "agent", "agent_name": name}),
            )
            .await;
        v["token"].as_str().expect("token in answer").to_string()
    }
}
