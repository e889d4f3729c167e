//! The dashboard needs a login, shows agents and jobs once logged in, and
//! `/metrics` exposes the queue to Prometheus.

use std::time::Duration;

use flotilla_core::job::JobState;
use flotilla_e2e::procs::{server_on_shared, Agent};
use flotilla_e2e::scratch;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_requires_login_and_metrics_report_the_queue() {
    let dir = scratch("e2e-ui-");
    let server = server_on_shared(dir.path(), 5_000).await;
    let api = server.api();
    let _agent = Agent::start(&server, "ui-agent", 1, &[]).await;
    let id = api
        .submit(
            json!({"kind": "command", "command": "echo 'line <one>'; exit 3", "max_attempts": 1}),
        )
        .await;
    assert_eq!(
        api.wait_final(&id, Duration::from_secs(30)).await.state,
        JobState::Failed
    );

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let url = server.url();
    // Without a session: sent to the login page.
    let r = http.get(format!("{url}/ui")).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/ui/login");
    // A wrong token is refused.
    let r = http
        .post(format!("{url}/ui/login"))
        .form(&[("token", "flt_wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // The admin token logs in.
    let r = http
        .post(format!("{url}/ui/login"))
        .form(&[("token", server.admin_token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert!(r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .contains("HttpOnly"));
    let page = http
        .get(format!("{url}/ui"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("ui-agent"), "agent listed");
    // The agent's tile encoder backend, and (where it is not CUDA) why not.
    let backend = ["cuda", "onednn", "cpu"]
        .into_iter()
        .find(|b| html.contains(&format!(">{b}</td>")))
        .unwrap_or_else(|| panic!("no encoder backend shown: {html}"));
    if backend != "cuda" {
        assert!(
            html.contains("title=\"not used here: cuda: "),
            "why CUDA is not used: {html}"
        );
    }
    assert!(html.contains(&format!("/ui/jobs/{id}")), "job linked");
    assert!(html.contains("failed 1"), "state counts shown");
    let job_page = http
        .get(format!("{url}/ui/jobs/{id}"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        job_page.contains("line &#60;one&#62;") || job_page.contains("line &lt;one&gt;"),
        "log shown, escaped"
    );

    // Prometheus: needs a token, then reports counts from the tables.
    let r = http.get(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let text = http
        .get(format!("{url}/metrics"))
        .bearer_auth(&server.admin_token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("flotilla_jobs{kind=\"command\",state=\"failed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("flotilla_job_attempts_total{outcome=\"failed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("flotilla_agent_up{agent=\"ui-agent\""),
        "{text}"
    );
}
