//! The jobs list (API and `/ui/jobs`): filters that return exactly their
//! jobs, cursor pages that walk every job once, retry, the job page's
//! attempts and downloads, cancel and drain from the dashboard's forms
//! (refused without the session's form token), an agent that stopped
//! answering, that the list reads an index on a large table, and that a
//! job is retried once, each of the two linking the other.

use std::collections::BTreeSet;
use std::time::Duration;

use flotilla_core::api::{JobList, JobView};
use flotilla_core::grid::TileId;
use flotilla_core::job::{CommandJob, JobSpec, JobState, TileJob};
use flotilla_e2e::api::Api;
use flotilla_e2e::procs::{server_on_shared, Agent, Server};
use flotilla_e2e::ui::Dashboard;
use flotilla_e2e::{eventually, scratch};
use flotilla_server::queue::read::{self, JobFilter, JobText};
use flotilla_server::queue::submit::{self, NewJob};
use serde_json::{json, Value};
use uuid::Uuid;

const AGENT: &str = "pages-agent";

/// A browser's view of the dashboard: one session's cookie.
struct Browser {
    ui: Dashboard,
}

impl Browser {
    async fn login(server: &Server, token: &str) -> Browser {
        Browser {
            ui: Dashboard::login_with(server, token).await,
        }
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        self.ui
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap()
    }

    /// A page's status and HTML, checked for inline script on the way.
    async fn page(&self, path: &str) -> (u16, String) {
        let r = self.get(path).await;
        let status = r.status().as_u16();
        let html = r.text().await.unwrap();
        for (i, _) in html.match_indices("<script") {
            let tag = &html[i..html[i..].find('>').map_or(html.len(), |e| i + e)];
            assert!(
                tag.contains("src=\"/ui/static/"),
                "{path}: inline script {tag}"
            );
        }
        (status, html)
    }

    /// Posts a form (`fields`, url-encoded); the status and `Location`.
    async fn post(&self, path: &str, fields: &[(&str, &str)]) -> (u16, String) {
        let r = self
            .ui
            .request(reqwest::Method::POST, path)
            .form(fields)
            .send()
            .await
            .unwrap();
        let location = r
            .headers()
            .get("location")
            .map(|l| l.to_str().unwrap().to_string())
            .unwrap_or_default();
        (r.status().as_u16(), location)
    }
}

/// The form token a page's forms carry.
fn csrf_of(html: &str) -> String {
    let at = html
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no form token on the page: {html}"))
        + "name=\"csrf\" value=\"".len();
    html[at..at + html[at..].find('"').unwrap()].to_string()
}

/// The jobs a page links, in order (`/ui/jobs/ID` links; the nav's
/// `/ui/jobs` has no id).
fn linked_jobs(html: &str) -> Vec<Uuid> {
    html.split("href=\"/ui/jobs/")
        .skip(1)
        .filter_map(|rest| rest.get(..36)?.parse().ok())
        .collect()
}

/// The `older →` link of a `/ui/jobs` page, unescaped.
fn older_link(html: &str) -> Option<String> {
    let end = html.find("\" rel=\"next\">older")?;
    let start = html[..end].rfind("href=\"")? + "href=\"".len();
    Some(html[start..end].replace("&amp;", "&").replace("&#38;", "&"))
}

/// The ids of a list answer.
fn ids(list: &Value) -> Vec<Uuid> {
    let list: JobList = serde_json::from_value(list.clone()).expect("a job list");
    list.jobs.iter().map(|j| j.id).collect()
}

async fn listed(api: &Api, query: &str) -> BTreeSet<Uuid> {
    ids(&api.get(&format!("/api/v1/jobs?limit=1000&{query}")).await)
        .into_iter()
        .collect()
}

fn set(ids: &[&str]) -> BTreeSet<Uuid> {
    ids.iter().map(|i| i.parse().unwrap()).collect()
}

async fn client(api: &Api, name: &str) -> Api {
    let v = api
        .post(
            "/api/v1/tokens",
            json!({"role": "client", "description": name}),
        )
        .await;
    api.with_token(v["token"].as_str().unwrap())
}

fn tile_job(x: i32) -> NewJob {
    NewJob {
        spec: JobSpec::Tile(TileJob {
            dataset: "d".into(),
            year: 2024,
            tile: TileId::from_cell(x, 0).unwrap(),
            checkpoint_sha256: "0".repeat(64),
            fetch_command: None,
        }),
        // No agent carries it: it stays queued.
        labels: [("zone".to_string(), "nowhere".to_string())].into(),
        priority: 0,
        max_attempts: 1,
        cost: 1,
        submitter: "tiles".into(),
        parent_id: None,
        child_index: None,
        owner: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_filtered_paged_retried_and_acted_on_from_the_dashboard() {
    let dir = scratch("e2e-jobs-pages-");
    let server = server_on_shared(dir.path(), 3_000).await;
    let admin = server.api();
    let alice = client(&admin, "alice").await;
    let bob = client(&admin, "bob").await;
    let mut agent = Agent::start(&server, AGENT, 4, &[]).await;

    // Several states, kinds and submitters.
    let flag = dir.path().join("second-time");
    let once = alice
        .submit(
            json!({"kind": "command", "max_attempts": 1, "command": format!(
                "if [ -e '{0}' ]; then echo second; else touch '{0}'; exit 4; fi",
                flag.display()
            )}),
        )
        .await;
    let twice = alice
        .submit(json!({"kind": "command", "command": "echo failing; exit 3", "max_attempts": 2}))
        .await;
    let made = alice
        .submit(json!({"kind": "command", "outputs": ["out/result.txt"],
                       "command": "mkdir -p out && printf 'the bytes\\nmarker-7f3a' > out/result.txt"}))
        .await;
    let b_ok = bob
        .submit(json!({"kind": "command", "command": "echo 100%done"}))
        .await;
    let b_sleep = bob
        .submit(json!({"kind": "command", "command": "sleep 300"}))
        .await;
    // Tile jobs, which only the server makes, straight into the queue: one
    // transaction, so they share a created_at (the cursor's tie-break).
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&server.opts.database_url)
        .await
        .unwrap();
    let tiles: Vec<String> = submit::submit(&db, &[tile_job(0), tile_job(1), tile_job(2)])
        .await
        .unwrap()
        .iter()
        .map(Uuid::to_string)
        .collect();
    for (id, want) in [
        (&once, JobState::Failed),
        (&twice, JobState::Failed),
        (&made, JobState::Succeeded),
        (&b_ok, JobState::Succeeded),
    ] {
        assert_eq!(
            admin.wait_final(id, Duration::from_secs(60)).await.state,
            want,
            "{id}"
        );
    }
    eventually("the sleep to run", Duration::from_secs(30), || async {
        admin.job(&b_sleep).await.state == JobState::Running
    })
    .await;

    // Filters: exactly their jobs, ANDed.
    let all: Vec<&str> = [&once, &twice, &made, &b_ok, &b_sleep]
        .into_iter()
        .map(String::as_str)
        .chain(tiles.iter().map(String::as_str))
        .collect();
    assert_eq!(listed(&admin, "").await, set(&all));
    assert_eq!(listed(&admin, "state=failed").await, set(&[&once, &twice]));
    assert_eq!(
        listed(&admin, "state=queued&kind=tile").await,
        set(&tiles.iter().map(String::as_str).collect::<Vec<_>>())
    );
    assert_eq!(listed(&admin, "kind=command").await, set(&all[..5]));
    assert_eq!(
        listed(&admin, "submitter=alice").await,
        set(&[&once, &twice, &made])
    );
    assert_eq!(
        listed(&admin, "submitter=bob&state=succeeded").await,
        set(&[&b_ok])
    );
    assert_eq!(
        listed(&admin, &format!("agent={AGENT}")).await,
        set(&all[..5])
    );
    assert_eq!(
        listed(&admin, &format!("agent={AGENT}&state=running")).await,
        set(&[&b_sleep])
    );
    assert!(listed(&admin, "agent=no-such-agent").await.is_empty());
    assert_eq!(
        listed(&admin, "q=MARKER-7F3A").await,
        set(&[&made]),
        "any case"
    );
    assert_eq!(listed(&admin, "q=%25").await, set(&[&b_ok]), "% is literal");
    let tail = &twice[twice.len() - 8..];
    assert_eq!(
        listed(&admin, &format!("q={tail}")).await,
        set(&[&twice]),
        "id tail"
    );
    assert_eq!(
        listed(&admin, &format!("q={}", &twice[..13])).await.len(),
        { all.iter().filter(|i| i.starts_with(&twice[..13])).count() },
        "id head"
    );
    assert_eq!(
        listed(&admin, &format!("q={once}")).await,
        set(&[&once]),
        "whole id"
    );
    // A client sees only its own, whatever it asks for.
    assert_eq!(listed(&alice, "").await, set(&[&once, &twice, &made]));
    assert!(listed(&alice, "submitter=bob").await.is_empty());
    for bad in [
        "state=lost",
        "kind=nope",
        "before=xyz",
        &format!("before={}", Uuid::nil()),
    ] {
        let (status, v) = admin
            .raw(reqwest::Method::GET, &format!("/api/v1/jobs?{bad}"), None)
            .await;
        assert_eq!(status, 400, "{bad}: {v}");
    }

    // The CLI: the same filters, JSON on request, a table otherwise.
    let cli = |args: &[&str]| {
        let mut all = vec!["--server".to_string(), server.url()];
        all.splice(0..0, args.iter().map(|a| a.to_string()));
        let token = server.admin_token.clone();
        async move {
            let out = tokio::process::Command::new(flotilla_e2e::binary("flotilla"))
                .args(&all)
                .env("FLOTILLA_TOKEN", token)
                .env("FLOTILLA_LOG", "warn")
                .kill_on_drop(true)
                .output()
                .await
                .unwrap();
            let (stdout, stderr) = (
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
            assert!(out.status.success(), "flotilla {all:?}: {stdout}{stderr}");
            (stdout, stderr)
        }
    };
    let (json_out, _) = cli(&[
        "jobs",
        "list",
        "--json",
        "--state",
        "failed",
        "--submitter",
        "alice",
    ])
    .await;
    let list: JobList = serde_json::from_str(&json_out).expect("--json prints a job list");
    assert_eq!(
        list.jobs.iter().map(|j| j.id).collect::<BTreeSet<_>>(),
        set(&[&once, &twice])
    );
    let (table, stderr) = cli(&["jobs", "list", "--limit", "2"]).await;
    assert!(table.starts_with("ID "), "{table}");
    assert_eq!(table.lines().count(), 3, "a header and 2 jobs: {table}");
    let next = stderr
        .split("--before ")
        .nth(1)
        .unwrap_or_else(|| panic!("the next page's cursor: {stderr}"))
        .trim()
        .to_string();
    let (older, _) = cli(&[
        "jobs", "list", "--json", "--limit", "1000", "--before", &next,
    ])
    .await;
    let older: JobList = serde_json::from_str(&older).unwrap();
    assert_eq!(older.jobs.len(), all.len() - 2, "the rest after the cursor");
    let (agents, _) = cli(&["agents", "--json"]).await;
    let agents: Value = serde_json::from_str(&agents).expect("agents --json");
    assert_eq!(agents["agents"][0]["name"], AGENT);
    let (tokens, _) = cli(&["tokens", "list", "--json"]).await;
    let tokens: Value = serde_json::from_str(&tokens).expect("tokens list --json");
    assert!(tokens["tokens"].as_array().unwrap().len() >= 3, "{tokens}");

    // Pages of 2 walk every job once, newest first; the last says so.
    let whole = ids(&admin.get("/api/v1/jobs?limit=1000").await);
    assert_eq!(whole.len(), all.len());
    let mut walked = Vec::new();
    let mut before: Option<Uuid> = None;
    loop {
        let path = match before {
            None => "/api/v1/jobs?limit=2".to_string(),
            Some(b) => format!("/api/v1/jobs?limit=2&before={b}"),
        };
        let page: JobList = serde_json::from_value(admin.get(&path).await).unwrap();
        assert!(page.jobs.len() <= 2);
        walked.extend(page.jobs.iter().map(|j| j.id));
        match page.next {
            Some(n) => {
                assert_eq!(Some(n), page.jobs.last().map(|j| j.id));
                before = Some(n);
            }
            None => break,
        }
        assert!(walked.len() <= all.len(), "pages never end: {walked:?}");
    }
    assert_eq!(walked, whole, "every job once, in the same order");
    let created: Vec<_> =
        serde_json::from_value::<JobList>(admin.get("/api/v1/jobs?limit=1000").await)
            .unwrap()
            .jobs
            .iter()
            .map(|j| (j.created_at, j.id))
            .collect();
    assert!(
        created.windows(2).all(|w| w[0] > w[1]),
        "newest first: {created:?}"
    );

    // A job's attempts: agent, times, durations, exit codes.
    let shown: JobView =
        serde_json::from_value(admin.get(&format!("/api/v1/jobs/{twice}")).await).unwrap();
    let attempts = shown.attempts.expect("attempts in a job's view");
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    for (i, a) in attempts.iter().enumerate() {
        assert_eq!(a.attempt as usize, i + 1);
        assert_eq!(a.agent.as_deref(), Some(AGENT));
        assert_eq!(a.exit_code, Some(3));
        assert_eq!(a.outcome.as_deref(), Some("failed"));
        assert!(
            a.duration_s.is_some_and(|d| (0.0..60.0).contains(&d)),
            "{a:?}"
        );
        assert!(a.started_at.is_some() && a.finished_at.is_some());
    }
    let listed_view = &admin.get("/api/v1/jobs?limit=1").await["jobs"][0];
    assert!(
        listed_view.get("attempts").is_none(),
        "lists leave attempts out"
    );

    // Retry: a failed job again as a new job that runs; only the owner or
    // an admin; only failed or cancelled command jobs.
    let (status, v) = bob
        .raw(
            reqwest::Method::POST,
            &format!("/api/v1/jobs/{once}/retry"),
            None,
        )
        .await;
    assert_eq!(status, 403, "{v}");
    let (status, v) = alice
        .raw(
            reqwest::Method::POST,
            &format!("/api/v1/jobs/{made}/retry"),
            None,
        )
        .await;
    assert_eq!(status, 409, "a succeeded job: {v}");
    let (status, v) = admin
        .raw(
            reqwest::Method::POST,
            &format!("/api/v1/jobs/{}/retry", tiles[0]),
            None,
        )
        .await;
    assert_eq!(status, 409, "a queued job: {v}");
    let (status, v) = alice
        .raw(
            reqwest::Method::POST,
            &format!("/api/v1/jobs/{once}/retry"),
            None,
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let again = v["id"].as_str().unwrap().to_string();
    assert_ne!(again, once);
    let done = alice.wait_final(&again, Duration::from_secs(60)).await;
    assert_eq!(done.state, JobState::Succeeded, "the retry ran: {done:?}");
    let old = alice.job(&once).await;
    assert_eq!(old.state, JobState::Failed, "the old job stays as it was");
    assert_eq!(
        (done.max_attempts, done.priority),
        (old.max_attempts, old.priority)
    );
    assert_eq!(
        command_of(&done.spec).map(|c| &c.command),
        command_of(&old.spec).map(|c| &c.command)
    );
    assert_eq!(done.submitter, "alice");

    // The dashboard's list: the filters and the older → links.
    let ui = Browser::login(&server, &server.admin_token).await;
    let (status, html) = ui.page("/ui/jobs?state=failed&submitter=alice").await;
    assert_eq!(status, 200);
    for label in [
        "for=\"f-state\"",
        "for=\"f-kind\"",
        "for=\"f-agent\"",
        "for=\"f-submitter\"",
        "for=\"f-q\"",
    ] {
        assert!(html.contains(label), "{label} labelled: {html}");
    }
    assert!(
        html.contains("<option value=\"failed\" selected>"),
        "the state kept"
    );
    let rows: BTreeSet<Uuid> = linked_jobs(&html).into_iter().collect();
    assert_eq!(rows, set(&[&once, &twice]), "{html}");
    assert!(
        html.contains(&twice[twice.len() - 8..]),
        "the id's tail shown"
    );
    // Times say their zone, as on every page.
    let created = admin.job(&twice).await.created_at;
    assert!(
        html.contains(&format!(
            "<td>{} UTC</td>",
            created.format("%Y-%m-%d %H:%M:%S")
        )),
        "{html}"
    );
    let (_, html) = ui.page("/ui/jobs?kind=tile").await;
    assert_eq!(
        linked_jobs(&html).into_iter().collect::<BTreeSet<_>>(),
        set(&tiles.iter().map(String::as_str).collect::<Vec<_>>())
    );
    let (status, html) = ui.page("/ui/jobs?state=lost").await;
    assert_eq!(status, 400);
    assert!(
        html.contains("unknown job state") || html.contains("lost"),
        "{html}"
    );
    // Every job once through the older → links, 3 a page.
    let whole = ids(&admin.get("/api/v1/jobs?limit=1000").await);
    let mut walked = Vec::new();
    let mut next = Some("/ui/jobs?limit=3".to_string());
    while let Some(path) = next {
        assert!(!path.contains("offset"), "{path}");
        let (status, html) = ui.page(&path).await;
        assert_eq!(status, 200, "{path}");
        walked.extend(linked_jobs(&html));
        next = older_link(&html);
        assert!(walked.len() <= whole.len(), "pages never end");
    }
    assert_eq!(walked, whole);

    // The job page: attempts with exit codes; the output as a download.
    let (_, html) = ui.page(&format!("/ui/jobs/{twice}")).await;
    assert!(html.contains("id=\"attempts\""), "{html}");
    let table = &html[html.find("id=\"attempts\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert_eq!(
        table.matches("<td>3</td>").count(),
        2,
        "two exit codes 3: {table}"
    );
    assert_eq!(table.matches("<td>failed</td>").count(), 2, "{table}");
    assert_eq!(table.matches(" s</td>").count(), 2, "durations: {table}");
    assert!(
        html.contains("action=\"/ui/jobs/") && html.contains("/retry\""),
        "a retry form"
    );
    let (_, html) = ui.page(&format!("/ui/jobs/{made}")).await;
    let link = format!("/ui/jobs/{made}/outputs/out/result.txt");
    assert!(html.contains(&format!("href=\"{link}\"")), "{html}");
    assert!(!html.contains("/retry\""), "no retry for a success");
    let r = ui.get(&link).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .contains("result.txt"));
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"the bytes\nmarker-7f3a");
    let alice_ui = Browser::login(&server, &alice.token).await;
    let bob_ui = Browser::login(&server, &bob.token).await;
    assert_eq!(
        alice_ui.get(&link).await.status(),
        200,
        "the owner downloads"
    );
    assert_eq!(
        bob_ui.get(&link).await.status(),
        403,
        "another client does not"
    );
    let (status, _) = bob_ui.page(&format!("/ui/jobs/{made}")).await;
    assert_eq!(status, 403, "nor sees its page");
    let (_, html) = bob_ui.page("/ui/jobs").await;
    assert_eq!(
        linked_jobs(&html).into_iter().collect::<BTreeSet<_>>(),
        set(&[&b_ok, &b_sleep]),
        "a client lists its own"
    );
    let anonymous = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = anonymous
        .get(format!("{}{link}", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "no session: to the login page");
    assert_eq!(
        ui.get(&format!("/ui/jobs/{made}/outputs/nope.txt"))
            .await
            .status(),
        404
    );

    // Cancel through the page's form: refused without the session's form
    // token (nothing changes), done with it.
    let page = format!("/ui/jobs/{b_sleep}");
    let (_, html) = ui.page(&page).await;
    assert!(
        html.contains(&format!("action=\"/ui/jobs/{b_sleep}/cancel\"")),
        "{html}"
    );
    let token = csrf_of(&html);
    let cancel = format!("/ui/jobs/{b_sleep}/cancel");
    let (status, _) = ui.post(&cancel, &[]).await;
    assert_eq!(status, 403, "no token");
    let (status, _) = ui.post(&cancel, &[("csrf", "0".repeat(64).as_str())]).await;
    assert_eq!(status, 403, "a wrong token");
    let (_, alice_html) = alice_ui.page("/ui/jobs").await;
    let (_, alice_agents) = alice_ui.page("/ui/agents").await;
    assert!(
        !alice_agents.contains("name=\"csrf\""),
        "a client sees no agent buttons"
    );
    let (_, alice_job) = alice_ui.page(&format!("/ui/jobs/{twice}")).await;
    let alice_token = csrf_of(&alice_job);
    assert_ne!(alice_token, token, "each session its own token");
    let (status, _) = ui.post(&cancel, &[("csrf", alice_token.as_str())]).await;
    assert_eq!(status, 403, "another session's token");
    assert!(alice_html.contains("Jobs"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = admin.job(&b_sleep).await;
    assert_eq!(still.state, JobState::Running, "nothing changed");
    assert!(!still.cancel_requested);
    let (status, location) = ui.post(&cancel, &[("csrf", token.as_str())]).await;
    assert_eq!((status, location.as_str()), (303, page.as_str()));
    assert_eq!(
        admin
            .wait_final(&b_sleep, Duration::from_secs(30))
            .await
            .state,
        JobState::Cancelled
    );

    // Drain through the agents page's form: admins only.
    let steer = format!("/ui/agents/{AGENT}/drain");
    let (status, _) = alice_ui
        .post(&steer, &[("csrf", alice_token.as_str())])
        .await;
    assert_eq!(status, 403, "a client may not");
    let (_, html) = ui.page("/ui/agents").await;
    assert!(html.contains(&format!("action=\"{steer}\"")), "{html}");
    let (status, _) = ui.post(&steer, &[]).await;
    assert_eq!(status, 403, "no token");
    let state = |v: Value| v["agents"][0]["state"].as_str().unwrap().to_string();
    assert_eq!(
        state(admin.get("/api/v1/agents").await),
        "active",
        "nothing changed"
    );
    let (status, location) = ui.post(&steer, &[("csrf", csrf_of(&html).as_str())]).await;
    assert_eq!((status, location.as_str()), (303, "/ui/agents"));
    let now = state(admin.get("/api/v1/agents").await);
    assert!(now == "draining" || now == "drained", "{now}");

    // An agent silent for three heartbeats stands out.
    let (_, html) = ui.page("/ui/agents").await;
    assert!(!html.contains("not answering"), "{html}");
    agent.kill().await;
    eventually(
        "the agent to stand out",
        Duration::from_secs(30),
        || async {
            let (_, html) = ui.page("/ui/agents").await;
            html.contains("class=\"stale\"") && html.contains("not answering since")
        },
    )
    .await;
    let (_, overview) = ui.page("/ui").await;
    assert!(overview.contains("not answering"), "the overview too");
}

/// The list's common paths read an index, not the table: with 200,000
/// jobs, the newest page, a later page, one state's and one owner's each
/// read at most a few thousand rows of it through an index, never the
/// table (without `jobs_newest_first` the first sorted all 200,000), and a
/// text search is cut short rather than run on.
#[tokio::test]
async fn the_job_list_reads_an_index_on_a_large_table() {
    let pg = flotilla_e2e::pg::shared().await;
    let name = flotilla_e2e::pg::fresh_database(pg).await;
    let db = flotilla_server::serve::connect(pg.connect_options(&name), Duration::from_secs(10))
        .await
        .unwrap();
    flotilla_server::serve::migrate(&db).await.unwrap();
    let owner = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO jobs (id, kind, spec, state, submitter, max_attempts, created_at, class_id,
                           lease_token, owner_token)
         SELECT gen_random_uuid(), CASE WHEN g % 3 = 0 THEN 'tile' ELSE 'command' END,
                jsonb_build_object('kind', 'command', 'command', 'echo ' || g),
                CASE WHEN g % 100 < 85 THEN 'succeeded' WHEN g % 100 < 90 THEN 'failed'
                     WHEN g % 100 < 99 THEN 'queued' ELSE 'running' END,
                's' || (g % 7), 3,
                -- ten jobs a second, as a bulk submission makes them
                now() - ((200000 - g) / 10) * interval '1 second', 0,
                CASE WHEN g % 100 = 99 THEN gen_random_uuid() END,
                CASE WHEN g % 5 = 0 THEN $1 END
         FROM generate_series(1, 200000) g",
    )
    .bind(owner)
    .execute(&db)
    .await
    .unwrap();
    sqlx::query("ANALYZE jobs").execute(&db).await.unwrap();
    let cursor: (chrono::DateTime<chrono::Utc>, Uuid) = sqlx::query_as(
        "SELECT created_at, id FROM jobs ORDER BY created_at DESC, id DESC OFFSET 5000 LIMIT 1",
    )
    .fetch_one(&db)
    .await
    .unwrap();

    /// Rows of `jobs` the plan read: what its scans of that table
    /// returned or filtered out (the small tables it joins, agents and job
    /// classes, may be scanned whole).
    fn jobs_rows_read(node: &Value) -> f64 {
        let n = |k: &str| node[k].as_f64().unwrap_or(0.0);
        let own = if node["Relation Name"] == "jobs" {
            n("Actual Rows") * n("Actual Loops").max(1.0) + n("Rows Removed by Filter")
        } else {
            0.0
        };
        own + node["Plans"]
            .as_array()
            .map_or(0.0, |p| p.iter().map(jobs_rows_read).sum())
    }
    fn scans_jobs(node: &Value) -> bool {
        (node["Node Type"] == "Seq Scan" && node["Relation Name"] == "jobs")
            || node["Plans"]
                .as_array()
                .is_some_and(|p| p.iter().any(scans_jobs))
    }
    let state = |s| JobFilter {
        state: Some(s),
        ..JobFilter::default()
    };
    let owned = JobFilter {
        owner: Some(owner),
        ..JobFilter::default()
    };
    for (what, filter, before) in [
        ("the newest page", JobFilter::default(), None),
        ("a later page", JobFilter::default(), Some(cursor)),
        ("failed jobs", state(JobState::Failed), None),
        ("failed jobs, later", state(JobState::Failed), Some(cursor)),
        ("running jobs", state(JobState::Running), None),
        ("a client's own", owned, None),
    ] {
        let plan: Vec<Value> = read::page_query(true, &filter, before, 101)
            .build_query_scalar()
            .fetch_all(&db)
            .await
            .unwrap();
        let text = serde_json::to_string_pretty(&plan).unwrap();
        let root = &plan[0][0]["Plan"];
        let rows = jobs_rows_read(root);
        assert!(
            !scans_jobs(root),
            "{what}: a scan of the jobs table:\n{text}"
        );
        // Running jobs are 1 % (2,000): the planner may read them all
        // through an index and sort them, which is fine; what must not
        // happen is reading a sizeable part of the 200,000.
        assert!(rows <= 2_500.0, "{what}: {rows} rows of jobs read:\n{text}");
    }
    let page = read::page(&db, &JobFilter::default(), Some(cursor), 100)
        .await
        .unwrap();
    assert_eq!(page.jobs.len(), 100);
    assert!(page.jobs.iter().all(|j| (j.created_at, j.id) < cursor));

    // A search that matches nothing walks every job: it is bounded by
    // read::WALK_TIMEOUT, and over 200,000 jobs ends well within it.
    let nothing = JobFilter {
        text: JobText::parse("no-such-command-anywhere").unwrap(),
        ..JobFilter::default()
    };
    let started = std::time::Instant::now();
    let page = read::page(&db, &nothing, None, 100).await.unwrap();
    assert!(page.jobs.is_empty() && page.next.is_none());
    assert!(
        started.elapsed() < read::WALK_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
}

fn command_of(spec: &JobSpec) -> Option<&CommandJob> {
    match spec {
        JobSpec::Command(c) => Some(c),
        _ => None,
    }
}

/// A job is retried once: of eight retries of it at once one queues the
/// work again and seven are refused naming that one; a later retry is
/// refused too. The API and the job pages link each to the other, and the
/// retried job's page offers no second Retry; the retry itself may be
/// retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_retried_once_and_each_links_the_other() {
    let dir = scratch("e2e-retry-once-");
    let server = server_on_shared(dir.path(), 10_000).await;
    let admin = server.api();
    // Registered, so that the retry's check finds an agent that could take
    // it; it never leases, so a job is cancelled while it waits.
    let _agent = flotilla_e2e::driven::Driven::register(
        &server,
        "retry-agent",
        &["command"],
        Duration::from_secs(10),
    )
    .await;
    let job = admin
        .submit(json!({"kind": "command", "command": "true"}))
        .await;
    admin
        .post(&format!("/api/v1/jobs/{job}/cancel"), json!({}))
        .await;
    assert_eq!(admin.job(&job).await.state, JobState::Cancelled);

    let mut tries = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (api, path) = (admin.clone(), format!("/api/v1/jobs/{job}/retry"));
        tries.spawn(async move { api.raw(reqwest::Method::POST, &path, Some(json!({}))).await });
    }
    let answers = tries.join_all().await;
    let made: Vec<String> = answers
        .iter()
        .filter(|(status, _)| *status == 201)
        .map(|(_, v)| v["id"].as_str().expect("an id").to_string())
        .collect();
    assert_eq!(made.len(), 1, "one retry of eight at once: {answers:?}");
    let retry = &made[0];
    for (status, v) in answers.iter().filter(|(status, _)| *status != 201) {
        assert_eq!(*status, 409, "{v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(retry.as_str()), "names the retry: {v}");
    }
    let (status, v) = admin
        .raw(
            reqwest::Method::POST,
            &format!("/api/v1/jobs/{job}/retry"),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 409, "a later retry: {v}");
    let queued: Value = admin.get("/api/v1/jobs?state=queued&limit=10").await;
    assert_eq!(
        queued["jobs"].as_array().map(Vec::len),
        Some(1),
        "the work queued once: {queued}"
    );

    let original: JobView =
        serde_json::from_value(admin.get(&format!("/api/v1/jobs/{job}")).await).unwrap();
    let copy: JobView =
        serde_json::from_value(admin.get(&format!("/api/v1/jobs/{retry}")).await).unwrap();
    assert_eq!(
        original.retried_as.map(|u| u.to_string()).as_deref(),
        Some(retry.as_str())
    );
    assert_eq!(original.retry_of, None);
    assert_eq!(
        copy.retry_of.map(|u| u.to_string()).as_deref(),
        Some(job.as_str())
    );
    assert_eq!(copy.retried_as, None);

    let ui = Browser::login(&server, &server.admin_token).await;
    let (_, html) = ui.page(&format!("/ui/jobs/{job}")).await;
    assert!(
        html.contains(&format!("id=\"retried-as\"><a href=\"/ui/jobs/{retry}\"")),
        "{html}"
    );
    assert!(!html.contains("/retry\""), "no second Retry: {html}");
    // The retry, cancelled too, may be retried in its turn.
    admin
        .post(&format!("/api/v1/jobs/{retry}/cancel"), json!({}))
        .await;
    let (_, html) = ui.page(&format!("/ui/jobs/{retry}")).await;
    assert!(
        html.contains(&format!("id=\"retry-of\"><a href=\"/ui/jobs/{job}\"")),
        "{html}"
    );
    assert!(
        html.contains(&format!("action=\"/ui/jobs/{retry}/retry\"")),
        "{html}"
    );
    // A Retry posted again from an old page (a double click) shows the
    // retry there is.
    let token = csrf_of(&html);
    let (status, location) = ui
        .post(
            &format!("/ui/jobs/{job}/retry"),
            &[("csrf", token.as_str())],
        )
        .await;
    assert_eq!((status, location), (303, format!("/ui/jobs/{retry}")));
}
