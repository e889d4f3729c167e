//! The agent page and its JSON form against a real server and agent: after
//! heartbeats, two tiles and two commands, `/ui/agents/{name}` draws one
//! chart point per kept sample (the same samples
//! `GET /api/v1/agents/{name}/health` returns, spaced by the server's
//! sample interval), tiles per hour that add up to the tiles done, and
//! durations for each kind that ran; an unknown agent is the dashboard's
//! 404, no login is a redirect, and a killed agent is "not answering".
//! Also measures what keeping a sample costs a heartbeat, with a week of
//! samples in the table, against the heartbeat's own update.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use flotilla_core::job::JobState;
use flotilla_e2e::procs::{opts_on_shared, Agent, Server};
use flotilla_e2e::ui::Dashboard;
use flotilla_e2e::{eventually, scratch, tiles};
use serde_json::{json, Value};

const AGENT: &str = "page-agent";
/// The sample interval the server is given; heartbeats come every 500 ms
/// (a third of the 1.5 s lease TTL), so about every other one is kept.
const SAMPLE_MS: i64 = 700;

/// A page's status and HTML; pages carry no inline script.
async fn page(ui: &Dashboard, path: &str) -> (u16, String) {
    let (status, html) = ui.get(path).await;
    assert!(!html.contains("<script>"), "{path}: inline script");
    (status, html)
}

/// The text between `start` and the next `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = text.find(start)? + start.len();
    let len = text[from..].find(end)?;
    Some(&text[from..from + len])
}

/// The agent page's own forms steer the agent and come back to the page:
/// drain (the API then shows it draining or, idle, drained), then resume.
async fn steer_from_the_page(server: &Server, ui: &Dashboard, html: &str) {
    let mut html = html.to_string();
    for (action, want) in [
        ("drain", ["draining", "drained"]),
        ("resume", ["active", "active"]),
    ] {
        let form = format!("action=\"/ui/agents/{AGENT}/{action}?to=agent\"");
        let at = html
            .find(&form)
            .unwrap_or_else(|| panic!("no {action} form on the agent page: {html}"));
        let csrf = between(&html[at..], "name=\"csrf\" value=\"", "\"").expect("the form's csrf");
        let r = ui
            .request(
                reqwest::Method::POST,
                &format!("/ui/agents/{AGENT}/{action}?to=agent"),
            )
            .form(&[("csrf", csrf)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 303, "{action} from the agent page");
        assert_eq!(r.headers()["location"], format!("/ui/agents/{AGENT}"));
        let agents = server.api().get("/api/v1/agents").await;
        let state = agents["agents"]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["name"] == AGENT))
            .map(|a| a["state"].as_str().unwrap_or("").to_string())
            .unwrap_or_default();
        assert!(want.contains(&state.as_str()), "after {action}: {state}");
        html = page(ui, &format!("/ui/agents/{AGENT}")).await.1;
    }
}

/// One chart's SVG, by id.
fn chart<'a>(html: &'a str, id: &str) -> &'a str {
    between(
        html,
        &format!("<figure class=\"chart\" id=\"chart-{id}\">"),
        "</figure>",
    )
    .unwrap_or_else(|| panic!("no chart {id}: {html}"))
}

/// The values of a series' polylines in a chart (every run of it), checked
/// against their points: one `x,y` pair per value, inside the viewBox.
fn series_values(svg: &str, series: &str) -> Vec<f64> {
    let mut values = Vec::new();
    for line in svg.split("<polyline").skip(1) {
        let line = &line[..line.find("/>").expect("polylines are closed")];
        if !line.contains(&format!("data-series=\"{series}\"")) {
            continue;
        }
        let points: Vec<(f64, f64)> = between(line, "points=\"", "\"")
            .unwrap()
            .split(' ')
            .map(|p| {
                let (x, y) = p.split_once(',').expect("x,y");
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect();
        for (x, y) in &points {
            assert!(
                (0.0..=600.0).contains(x) && (0.0..=220.0).contains(y),
                "{line}"
            );
        }
        let vs: Vec<f64> = between(line, "data-values=\"", "\"")
            .unwrap()
            .split(' ')
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(points.len(), vs.len(), "{line}");
        values.extend(vs);
    }
    values
}

async fn samples(server: &Server, query: &str) -> Vec<Value> {
    let v = server
        .api()
        .get(&format!("/api/v1/agents/{AGENT}/health{query}"))
        .await;
    v["samples"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_page_charts_its_health_work_and_silence() {
    let dir = scratch("e2e-agent-page-");
    let mut opts = opts_on_shared(dir.path(), 1_500).await;
    opts.env.push((
        "FLOTILLA_HEALTH_SAMPLE_INTERVAL_MS".into(),
        SAMPLE_MS.to_string(),
    ));
    let server = Server::start(dir.path(), opts).await;
    let api = server.api();
    let ckpt = tiles::synth_ckpt(dir.path(), tiles::TINY, 3);
    tiles::register_dataset(&server, "synth", &ckpt).await;
    for (i, t) in ["grid_0.05_52.05", "grid_0.15_52.05"].iter().enumerate() {
        tiles::synth_inputs(&server, t, 24, i as u64, &[2024]);
    }
    let mut agent = Agent::start(&server, AGENT, 2, &[]).await;
    let roi = api
        .post(
            "/api/v1/rois",
            json!({"name": "two", "year": 2024, "dataset": "synth",
                   "bbox": [0.01, 52.01, 0.19, 52.09]}),
        )
        .await;
    assert_eq!(roi["submitted"], 2, "{roi}");
    let commands = [
        api.submit(json!({"kind": "command", "command": "sleep 0.2"}))
            .await,
        api.submit(json!({"kind": "command", "command": "sleep 0.3"}))
            .await,
    ];
    for id in &commands {
        let j = api.wait_final(id, Duration::from_secs(30)).await;
        assert_eq!(j.state, JobState::Succeeded, "{j:?}");
    }
    tiles::wait_roi(
        &server,
        roi["id"].as_str().unwrap(),
        Duration::from_secs(30),
        Duration::from_millis(200),
    )
    .await;
    eventually("five health samples", Duration::from_secs(15), || async {
        samples(&server, "").await.len() >= 5
    })
    .await;

    // The JSON form: the samples, spaced by the interval, with the numbers.
    let kept = samples(&server, "").await;
    let times: Vec<DateTime<Utc>> = kept
        .iter()
        .map(|s| s["at"].as_str().unwrap().parse().unwrap())
        .collect();
    for w in times.windows(2) {
        let gap = (w[1] - w[0]).num_milliseconds();
        assert!(gap >= SAMPLE_MS, "samples {gap} ms apart: {kept:?}");
    }
    let last = kept.last().unwrap();
    assert!(last["memory_total_bytes"].as_u64().unwrap() > 0, "{last}");
    assert!(last["open_fds"].as_u64().unwrap() > 0, "{last}");
    assert!(
        last["cpu_busy"]
            .as_f64()
            .is_some_and(|b| (0.0..=1.0).contains(&b)),
        "the agent measures host CPU between heartbeats: {last}"
    );
    // Paging: `since` is exclusive, `next_since` continues.
    let first_two = api
        .get(&format!(
            "/api/v1/agents/{AGENT}/health?limit=2&since={}",
            urlencode(&(times[0] - chrono::Duration::seconds(1)).to_rfc3339())
        ))
        .await;
    assert_eq!(
        first_two["samples"].as_array().unwrap().len(),
        2,
        "{first_two}"
    );
    let next: DateTime<Utc> = first_two["next_since"].as_str().unwrap().parse().unwrap();
    assert_eq!(next, times[1]);
    let rest = samples(
        &server,
        &format!("?since={}", urlencode(&next.to_rfc3339())),
    )
    .await;
    assert_eq!(
        rest.first().map(|s| s["at"].clone()),
        kept.get(2).map(|s| s["at"].clone())
    );
    // Errors in the API's shape.
    let (status, body) = api
        .raw(reqwest::Method::GET, "/api/v1/agents/nobody/health", None)
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"].is_object() || body["error"].is_string(),
        "{body}"
    );
    let (status, body) = api
        .raw(
            reqwest::Method::GET,
            &format!("/api/v1/agents/{AGENT}/health?since=yesterday"),
            None,
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("since"), "{body}");

    // Not logged in: to the login page.
    let anon = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let r = anon
        .get(format!("{}/ui/agents/{AGENT}", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/ui/login");

    // The page: one point per sample. A sample may land between the page
    // and the API call; read until both agree.
    let ui = Dashboard::login(&server).await;
    let mut agreed = false;
    let mut html = String::new();
    for _ in 0..10 {
        let before = samples(&server, "").await;
        let (status, h) = page(&ui, &format!("/ui/agents/{AGENT}")).await;
        assert_eq!(status, 200, "{h}");
        let after = samples(&server, "").await;
        html = h;
        if before.len() != after.len() {
            continue;
        }
        let mem = series_values(chart(&html, "memory"), "used");
        assert_eq!(mem.len(), after.len(), "memory points vs samples");
        for (v, s) in mem.iter().zip(&after) {
            let used = s["memory_used_bytes"].as_f64().unwrap() / (1u64 << 30) as f64;
            assert!((v - used).abs() < 0.001, "{v} GiB vs {s}");
        }
        let with_cpu = after.iter().filter(|s| s["cpu_busy"].is_number()).count();
        assert_eq!(series_values(chart(&html, "cpu"), "cpu").len(), with_cpu);
        assert_eq!(
            series_values(chart(&html, "disk"), "disk").len(),
            after.len()
        );
        assert_eq!(series_values(chart(&html, "fds"), "fds").len(), after.len());
        assert_eq!(
            series_values(chart(&html, "load"), "load").len(),
            after.len()
        );
        agreed = true;
        break;
    }
    assert!(agreed, "the samples kept changing under the page");
    // The agent and its jobs link to each other (browser review of
    // 3877596, M1): its page to the jobs list filtered by it, a job's page
    // and the list to it.
    assert!(
        html.contains(&format!(
            "href=\"/ui/jobs?agent={AGENT}\" id=\"agent-jobs\""
        )),
        "{html}"
    );
    let (status, list) = page(&ui, &format!("/ui/jobs?agent={AGENT}")).await;
    assert_eq!(status, 200, "{list}");
    let agent_link = format!("<a href=\"/ui/agents/{AGENT}\">{AGENT}</a>");
    assert!(
        list.contains(&commands[0][commands[0].len() - 8..]),
        "{list}"
    );
    assert!(list.contains(&agent_link), "{list}");
    let (status, job) = page(&ui, &format!("/ui/jobs/{}", commands[0])).await;
    assert_eq!(status, 200, "{job}");
    assert_eq!(
        job.matches(&agent_link).count(),
        2,
        "the agent cell and the attempt's: {job}"
    );
    // Each chart is labelled and described for screen readers.
    for id in ["cpu", "memory", "disk", "fds", "load", "tiles"] {
        let c = chart(&html, id);
        assert!(
            c.contains(&format!("aria-labelledby=\"{id}-title {id}-desc\"")),
            "{c}"
        );
        let desc = between(c, &format!("<desc id=\"{id}-desc\">"), "</desc>").unwrap();
        assert!(!desc.is_empty(), "{id}: empty description");
        assert!(c.contains("class=\"ylabel\""), "{id}: no axis label");
    }
    assert!(
        between(
            chart(&html, "memory"),
            "<desc id=\"memory-desc\">",
            "</desc>"
        )
        .unwrap()
        .contains("samples, low"),
        "{html}"
    );
    // Tiles per hour: 12 five-minute buckets whose counts add up to 2.
    let per_hour = series_values(chart(&html, "tiles"), "tiles");
    assert_eq!(per_hour.len(), 12);
    let tiles_done: f64 = per_hour.iter().map(|v| v * 300.0 / 3600.0).sum();
    assert!((tiles_done - 2.0).abs() < 1e-6, "{per_hour:?}");
    // Durations per kind that ran: two attempts each.
    for kind in ["command", "tile"] {
        let row = between(&html, &format!("<tr data-kind=\"{kind}\">"), "</tr>")
            .unwrap_or_else(|| panic!("no {kind} durations: {html}"));
        assert!(row.contains("<td>2</td>"), "{row}");
    }
    assert!(html.contains("id=\"encoder-backend\""), "{html}");
    assert!(!html.contains("id=\"silence\""), "a live agent: {html}");
    // The profile the agent reported at registration, not a placeholder.
    let profile = between(&html, "<dd id=\"encoder-profile\">", "</dd>").expect("a profile line");
    assert!(
        !profile.is_empty() && !profile.contains("not reported"),
        "encoder profile: {profile}"
    );
    // Ending with what computes (this build's agent runs onednn, or cuda
    // where a GPU answers): the library and its ISA, or the GPU.
    assert!(
        profile.contains("; oneDNN ") || profile.contains("; GPU "),
        "encoder profile without its library: {profile}"
    );
    steer_from_the_page(&server, &ui, &html).await;
    // The day: 24 hourly buckets, the same samples.
    let (status, day) = page(&ui, &format!("/ui/agents/{AGENT}?window=day")).await;
    assert_eq!(status, 200);
    assert_eq!(series_values(chart(&day, "tiles"), "tiles").len(), 24);
    assert!(day.contains("last day"), "{day}");
    // Linked from the fleet and the overview.
    let link = format!("href=\"/ui/agents/{AGENT}\"");
    assert!(page(&ui, "/ui/agents").await.1.contains(&link));
    assert!(page(&ui, "/ui").await.1.contains(&link));
    // An unknown agent: the dashboard's 404 page.
    let (status, missing) = page(&ui, "/ui/agents/nobody").await;
    assert_eq!(status, 404);
    assert!(missing.contains("No such page"), "{missing}");

    measure_sampling_cost(&server).await;

    // Killed: the page says since when it stopped answering.
    agent.kill().await;
    let start = Instant::now();
    let silent = loop {
        let (_, h) = page(&ui, &format!("/ui/agents/{AGENT}")).await;
        if h.contains("id=\"silence\"") {
            break h;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still answering: {h}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let said = between(&silent, "id=\"silence\" role=\"alert\">", "</p>").unwrap();
    assert!(said.starts_with("not answering since 20"), "{said}");
}

fn urlencode(s: &str) -> String {
    s.replace('+', "%2B").replace(':', "%3A")
}

/// What [`flotilla_server::agent_health::record`] costs a heartbeat with a
/// week of samples (at 30 s) in the table, against the heartbeat's own
/// `agents::touch` in the same run: printed, not judged (a slow shared
/// machine would fail any fixed bound), except that it must not be an
/// order of magnitude above the update it rides along.
async fn measure_sampling_cost(server: &Server) {
    use flotilla_server::state::HealthSampling;
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&server.opts.database_url)
        .await
        .unwrap();
    // Another agent, so the page's agent keeps its own samples.
    let id = uuid::Uuid::new_v4();
    sqlx::query("INSERT INTO agents (id, name, capacity) VALUES ($1, 'bench-agent', 1)")
        .bind(id)
        .execute(&db)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO agent_health_samples (agent_id, at, memory_used_bytes, memory_total_bytes)
         SELECT $1, now() - i * interval '30 seconds', 1, 2 FROM generate_series(1, 20160) i",
    )
    .bind(id)
    .execute(&db)
    .await
    .unwrap();
    sqlx::query("ANALYZE agent_health_samples")
        .execute(&db)
        .await
        .unwrap();
    let health = flotilla_core::health::HostHealth {
        memory_total_bytes: 2,
        ..Default::default()
    };
    const N: usize = 200;
    let time = |d: Vec<Duration>| {
        let mut d = d;
        d.sort();
        d[d.len() / 2]
    };
    let mut touch = Vec::new();
    let mut skip = Vec::new();
    let mut keep = Vec::new();
    let every = HealthSampling {
        interval: Duration::from_millis(1),
        window: Duration::from_secs(7 * 24 * 3600),
    };
    let rarely = HealthSampling {
        interval: Duration::from_secs(3600),
        ..every
    };
    for _ in 0..N {
        let t = Instant::now();
        flotilla_server::agents::touch(&db, id, &health)
            .await
            .unwrap();
        touch.push(t.elapsed());
        let t = Instant::now();
        flotilla_server::agent_health::record(&db, id, &health, rarely)
            .await
            .unwrap();
        skip.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(2)).await;
        let t = Instant::now();
        let kept = flotilla_server::agent_health::record(&db, id, &health, every)
            .await
            .unwrap();
        keep.push(t.elapsed());
        assert!(
            kept,
            "a sample 2 ms after the last is kept at a 1 ms interval"
        );
    }
    let (touch, skip, keep) = (time(touch), time(skip), time(keep));
    println!(
        "heartbeat sampling, a week of samples kept, median of {N}: agents::touch {touch:?}; \
         record skipped (too soon) {skip:?} ({:.2}x touch); record kept + old deleted {keep:?} \
         ({:.2}x touch)",
        skip.as_secs_f64() / touch.as_secs_f64(),
        keep.as_secs_f64() / touch.as_secs_f64(),
    );
    assert!(
        keep < touch * 10 + Duration::from_millis(5),
        "{keep:?} vs {touch:?}"
    );
    // Old samples went as new ones came: the window holds.
    let oldest: DateTime<Utc> =
        sqlx::query_scalar("SELECT min(at) FROM agent_health_samples WHERE agent_id = $1")
            .bind(id)
            .fetch_one(&db)
            .await
            .unwrap();
    assert!(Utc::now() - oldest <= chrono::Duration::days(7), "{oldest}");
}
