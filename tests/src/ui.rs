//! A logged-in dashboard client for tests of the `/ui` pages: it logs in
//! through the login form with the server's admin token and sends the
//! session cookie with every request; redirects are not followed, so a
//! test sees them.

use std::time::Duration;

use crate::procs::Server;

/// A clone is the same session (the same cookie and HTTP client), for
/// tasks that send requests of their own, such as a tab's background poll.
#[derive(Clone)]
pub struct Dashboard {
    http: reqwest::Client,
    cookie: String,
    base: String,
}

impl Dashboard {
    /// Logs in with the server's admin token.
    pub async fn login(server: &Server) -> Dashboard {
        Dashboard::login_with(server, &server.admin_token).await
    }

    /// Logs in with `token`; panics when the login is refused.
    pub async fn login_with(server: &Server, token: &str) -> Dashboard {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(60))
            .build()
            .expect("an HTTP client");
        let r = http
            .post(format!("{}/ui/login", server.url()))
            .form(&[("token", token)])
            .send()
            .await
            .expect("the login form answers");
        let cookie = r
            .headers()
            .get("set-cookie")
            .unwrap_or_else(|| panic!("login refused: {}", r.status()))
            .to_str()
            .expect("an ASCII cookie")
            .split(';')
            .next()
            .expect("a cookie")
            .to_string();
        Dashboard {
            http,
            cookie,
            base: server.url(),
        }
    }

    /// The session cookie, `name=value`.
    pub fn cookie(&self) -> &str {
        &self.cookie
    }

    /// A request to `path` with the session cookie, to send as it is or
    /// with a form or headers added.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
    }

    /// `GET path`: status and body.
    pub async fn get(&self, path: &str) -> (u16, String) {
        let r = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_default())
    }

    /// `GET path`, which must answer 200: its body.
    pub async fn page(&self, path: &str) -> String {
        let (status, body) = self.get(path).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }
}
