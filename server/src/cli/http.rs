//! The HTTP client of the client commands: where the server is (`--server`,
//! or the URL `flotilla up` wrote), the API token, and typed calls that
//! turn the error envelope into a message.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use flotilla_core::api::ErrorBody;
use serde::de::DeserializeOwned;

/// Where the server is and who we are. Defaults find a local `flotilla up`
/// started in the current directory.
#[derive(Args, Clone)]
pub struct Conn {
    /// Server URL [default: from ./flotilla-data/server.url, else
    /// http://127.0.0.1:8470]
    #[arg(long, env = "FLOTILLA_SERVER", global = true)]
    pub server: Option<String>,
    /// API token [default: the contents of --token-file]. On the command
    /// line it is visible to every user of the machine (`ps`): prefer
    /// --token-file or FLOTILLA_TOKEN
    #[arg(long, env = "FLOTILLA_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the API token [default: ./flotilla-data/admin.token]
    #[arg(long, env = "FLOTILLA_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// CA certificate(s) (PEM) to trust for an https:// server besides the
    /// public ones: the server's own CA, or its self-signed certificate.
    #[arg(long, env = "FLOTILLA_CA_FILE", global = true)]
    pub ca_file: Option<PathBuf>,
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Conn {
    pub fn client(&self) -> anyhow::Result<Client> {
        let base = match &self.server {
            Some(s) => s.clone(),
            None => std::fs::read_to_string("flotilla-data/server.url")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "http://127.0.0.1:8470".to_string()),
        };
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => {
                if given_in_argv(t, std::env::var("FLOTILLA_TOKEN").ok().as_deref()) {
                    eprintln!(
                        "flotilla: warning: a token given with --token is visible to every \
                         user of this machine in the process list; use --token-file FILE or \
                         FLOTILLA_TOKEN"
                    );
                }
                t.clone()
            }
            (None, Some(f)) => std::fs::read_to_string(f)
                .with_context(|| format!("reading token file {}", f.display()))?
                .trim()
                .to_string(),
            (None, None) => std::fs::read_to_string("flotilla-data/admin.token")
                .map(|s| s.trim().to_string())
                .map_err(|_| {
                    anyhow::anyhow!(
                        "no API token: pass --token or --token-file, set FLOTILLA_TOKEN, \
                         or run from the directory where `flotilla up` wrote flotilla-data/"
                    )
                })?,
        };
        let mut http = reqwest::Client::builder().timeout(Duration::from_secs(120));
        if let Some(ca) = &self.ca_file {
            for root in read_ca_file(ca)? {
                http = http.add_root_certificate(root);
            }
        }
        Ok(Client {
            http: http.build()?,
            base: base.trim_end_matches('/').to_string(),
            token,
        })
    }
}

/// Whether `--token`'s value came from the command line rather than from
/// FLOTILLA_TOKEN (clap takes the flag first, the variable when no flag).
fn given_in_argv(token: &str, env: Option<&str>) -> bool {
    env != Some(token)
}

/// The certificates of a `--ca-file`.
fn read_ca_file(path: &Path) -> anyhow::Result<Vec<reqwest::Certificate>> {
    let pem =
        std::fs::read(path).with_context(|| format!("reading --ca-file {}", path.display()))?;
    let roots = reqwest::Certificate::from_pem_bundle(&pem)
        .with_context(|| format!("reading the certificates in --ca-file {}", path.display()))?;
    anyhow::ensure!(
        !roots.is_empty(),
        "--ca-file {} holds no certificate (a PEM `BEGIN CERTIFICATE` block)",
        path.display()
    );
    Ok(roots)
}

impl Client {
    /// Why a request reached no answer: every cause, and what to do about
    /// a TLS failure.
    fn unreachable(&self, e: reqwest::Error) -> anyhow::Error {
        let why = flotilla_core::tls::chain(&e);
        match flotilla_core::tls::classify(&why, &self.base) {
            Some(failure) => anyhow::anyhow!(
                "cannot reach the server at {}: {why}; {}",
                self.base,
                failure.advice()
            ),
            None => anyhow::anyhow!(
                "cannot reach the server at {}; is it running? ({why})",
                self.base
            ),
        }
    }

    async fn send<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder) -> anyhow::Result<T> {
        let resp = req
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let status = resp.status();
        let bytes = resp.bytes().await?;
        if !status.is_success() {
            match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(e) => bail!("{} ({}): {}", status, e.error.code, e.error.message),
                Err(_) => bail!("{}: {}", status, String::from_utf8_lossy(&bytes)),
            }
        }
        serde_json::from_slice(&bytes).context("unexpected answer from the server")
    }

    /// One page of a job's log ([`flotilla_core::api::logs`]): its text,
    /// the `after` of the next page, and whether more lines may follow at
    /// once.
    pub async fn log_page(&self, job: &str, after: i64) -> anyhow::Result<(String, i64, bool)> {
        use flotilla_core::api::logs::{LOG_MORE_HEADER, LOG_NEXT_HEADER};
        let resp = self
            .http
            .get(format!("{}/api/v1/jobs/{job}/log?after={after}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let status = resp.status();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let next = header(LOG_NEXT_HEADER).and_then(|v| v.parse().ok());
        let more = header(LOG_MORE_HEADER).is_some_and(|v| v == "true");
        let text = resp.text().await?;
        if !status.is_success() {
            bail!("{status}: {text}");
        }
        let next = next
            .context("the server's log page has no next position; is it older than this client?")?;
        Ok((text, next, more))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    /// Sends a raw body (a checkpoint, a manifest) with `method`.
    pub async fn send_bytes<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Vec<u8>,
        content_type: &str,
    ) -> anyhow::Result<T> {
        self.send(
            self.http
                .request(method, format!("{}{path}", self.base))
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body),
        )
        .await
    }

    pub async fn post<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body))
            .await
    }
}
