//! The ROI pages against a real server and agent: `GET /api/v1/rois` and its
//! paging, the list page, and an ROI page whose tile map has one rect per
//! tile coloured as the API counts, each linked to its tile's job, over a
//! labelled graticule, kept live by a state stream.

use std::collections::HashMap;
use std::time::Duration;

use flotilla_e2e::procs::{server_on_shared, Agent, Server};
use flotilla_e2e::scratch;
use flotilla_e2e::tiles;
use flotilla_e2e::ui::Dashboard;
use serde_json::{json, Value};

const YEAR: i32 = 2024;
const DATASET: &str = "synth";

fn roi(name: &str, bbox: [f64; 4]) -> Value {
    json!({ "name": name, "year": YEAR, "dataset": DATASET, "bbox": bbox })
}

/// One `<a>…<rect>…</a>` of the tile map.
#[derive(Debug)]
struct MapTile {
    href: Option<String>,
    class: String,
    /// From the rect's `<title>`: `grid_X_Y: state`.
    name: String,
    title_state: String,
}

/// The text between `start` and the next `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = text.find(start)? + start.len();
    let len = text[from..].find(end)?;
    Some(&text[from..from + len])
}

/// The tile map's SVG, its tiles in document order, and its graticule's
/// (line count, labels).
fn read_map(html: &str) -> (String, Vec<MapTile>, usize, Vec<String>) {
    let svg = between(html, "<svg id=\"tilemap\"", "</svg>")
        .unwrap_or_else(|| panic!("no tile map: {html}"))
        .to_string();
    let mut tiles = Vec::new();
    for piece in svg.split("<a").skip(1) {
        let a = &piece[..piece.find("</a>").expect("every <a> is closed")];
        let open = &a[..a.find('>').unwrap()];
        let rect = between(a, "<rect", ">").expect("a tile's <a> holds a rect");
        let title = between(a, "<title>", "</title>").expect("a tile has a title");
        let (name, state) = title.split_once(": ").expect("title is NAME: STATE");
        tiles.push(MapTile {
            href: between(open, "href=\"", "\"").map(str::to_string),
            class: between(rect, "class=\"", "\"").unwrap().to_string(),
            name: name.to_string(),
            title_state: state.to_string(),
        });
    }
    let lines = svg.matches("<line class=\"grat\"").count();
    let labels = svg
        .split("<text class=\"grat-label\"")
        .skip(1)
        .map(|t| between(t, ">", "</text>").unwrap().to_string())
        .collect();
    (svg, tiles, lines, labels)
}

/// An ROI page's event stream, read event by event.
struct States {
    resp: reqwest::Response,
    /// Bytes read and not yet taken as an event.
    buf: Vec<u8>,
}

impl States {
    async fn open(ui: &Dashboard, id: &str) -> States {
        let resp = ui
            .request(reqwest::Method::GET, &format!("/ui/rois/{id}/events"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        States {
            resp,
            buf: Vec::new(),
        }
    }

    /// The next `state` event's data, as JSON.
    async fn next(&mut self) -> Value {
        tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                // Events end with a blank line (axum writes `\n`).
                if let Some(at) = self.buf.windows(2).position(|w| w == b"\n\n") {
                    let event: Vec<u8> = self.buf.drain(..at + 2).collect();
                    let event = String::from_utf8(event).expect("events are UTF-8");
                    if let Some(data) = between(&event, "event: state\ndata: ", "\n") {
                        return serde_json::from_str(data).unwrap();
                    }
                    continue;
                }
                let chunk = self
                    .resp
                    .chunk()
                    .await
                    .unwrap()
                    .expect("the stream stays open");
                self.buf.extend_from_slice(&chunk);
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no state event; read {}",
                String::from_utf8_lossy(&self.buf)
            )
        })
    }
}

/// Tile name → the job that makes it, from the job list.
async fn jobs_by_tile(server: &Server) -> HashMap<String, (String, String)> {
    let jobs = server.api().get("/api/v1/jobs?limit=1000").await;
    jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["kind"] == "tile")
        .map(|j| {
            (
                j["spec"]["tile"].as_str().unwrap().to_string(),
                (
                    j["id"].as_str().unwrap().to_string(),
                    j["state"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

/// Checks an ROI page's map against the API's counts and the jobs; returns
/// the map's tiles.
fn check_map(html: &str, view: &Value, jobs: &HashMap<String, (String, String)>) -> Vec<MapTile> {
    let (svg, tiles, _, _) = read_map(html);
    for state in ["missing", "queued", "running", "done", "failed"] {
        let class = format!("class=\"t-{state}\"");
        assert_eq!(
            svg.matches(&class).count() as i64,
            view["tiles"][state].as_i64().unwrap(),
            "{state}: API {view}; map {svg}"
        );
    }
    for t in &tiles {
        assert_eq!(t.class, format!("t-{}", t.title_state), "{t:?}");
        if t.class == "t-missing" {
            assert_eq!(t.href, None, "{t:?}");
            continue;
        }
        let (job, _) = jobs
            .get(&t.name)
            .unwrap_or_else(|| panic!("no job for {t:?}"));
        assert_eq!(
            t.href.as_deref(),
            Some(&*format!("/ui/jobs/{job}")),
            "{t:?}"
        );
    }
    tiles
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roi_list_and_tile_map_follow_the_tiles() {
    let dir = scratch("e2e-roi-pages-");
    let server = server_on_shared(dir.path(), 5_000).await;
    let api = server.api();
    let ui = Dashboard::login(&server).await;
    let ckpt = tiles::synth_ckpt(dir.path(), tiles::TINY, 7);
    tiles::register_dataset(&server, DATASET, &ckpt).await;
    // A 3 × 2 block at 0–0.3°E, 52.0–52.2°N; every tile has inputs but one.
    let no_inputs = "grid_0.25_52.15";
    for (i, t) in [
        "grid_0.05_52.05",
        "grid_0.15_52.05",
        "grid_0.25_52.05",
        "grid_0.05_52.15",
        "grid_0.15_52.15",
    ]
    .iter()
    .enumerate()
    {
        tiles::synth_inputs(&server, t, 32, i as u64, &[YEAR]);
    }

    // The first ROI, two tiles, queued: no agent yet.
    let first = api
        .post("/api/v1/rois", roi("first", [0.01, 52.01, 0.19, 52.09]))
        .await;
    assert_eq!(first["submitted"], 2, "{first}");
    let first_id = first["id"].as_str().unwrap().to_string();
    let view = api.get(&format!("/api/v1/rois/{first_id}")).await;
    assert_eq!(view["tiles"]["queued"], 2, "{view}");
    let html = ui.page(&format!("/ui/rois/{first_id}")).await;
    let queued = check_map(&html, &view, &jobs_by_tile(&server).await);
    assert_eq!(queued.len(), 2);
    // Its stream: every tile at first, then what changes once an agent
    // takes them, until both are done.
    let mut live = States::open(&ui, &first_id).await;
    let ev = live.next().await;
    assert_eq!(ev["tiles"]["all"], "qq", "{ev}");
    assert_eq!(ev["head"]["state"], "queued", "{ev}");
    assert_eq!(ev["head"]["counts"], view["tiles"], "{ev}");
    let _agent = Agent::start(&server, "roi-pages", 2, &[]).await;
    let mut letters = ['q', 'q'];
    let mut changes = 0;
    while letters != ['d', 'd'] {
        let ev = live.next().await;
        assert!(
            ev["tiles"].get("all").is_none(),
            "only changes after the first: {ev}"
        );
        for c in ev["tiles"]["changed"].as_array().into_iter().flatten() {
            let i = c[0].as_u64().unwrap() as usize;
            letters[i] = c[1].as_str().unwrap().chars().next().unwrap();
            changes += 1;
        }
        let done = letters.iter().filter(|l| **l == 'd').count();
        assert_eq!(ev["head"]["counts"]["done"], done, "{ev}");
    }
    assert!(changes >= 2);
    tiles::wait_roi(
        &server,
        &first_id,
        Duration::from_secs(180),
        Duration::from_millis(200),
    )
    .await;

    // The second ROI covers the first's two tiles (done: no new job), three
    // more, and one without inputs, which fails.
    let mut second_request = roi("second", [0.01, 52.01, 0.29, 52.19]);
    second_request["priority"] = json!(7);
    let second = api.post("/api/v1/rois", second_request).await;
    assert_eq!(second["total"], 6, "{second}");
    assert_eq!(second["present"], 2, "{second}");
    assert_eq!(second["submitted"], 4, "{second}");
    let second_id = second["id"].as_str().unwrap().to_string();
    tiles::wait_roi(
        &server,
        &second_id,
        Duration::from_secs(180),
        Duration::from_millis(200),
    )
    .await;
    let view = api.get(&format!("/api/v1/rois/{second_id}")).await;
    assert_eq!(
        view["tiles"],
        json!({ "missing": 0, "queued": 0, "running": 0, "done": 5, "failed": 1 }),
        "{view}"
    );

    // The list, newest first, and its paging.
    let all = api.get("/api/v1/rois").await;
    let names: Vec<&str> = all["rois"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["second", "first"], "{all}");
    assert_eq!(all["next"], Value::Null, "{all}");
    assert_eq!(all["rois"][0]["tiles"], view["tiles"], "{all}");
    assert_eq!(all["rois"][0]["state"], "failed", "{all}");
    assert_eq!(all["rois"][1]["state"], "done", "{all}");
    let one = api.get("/api/v1/rois?limit=1").await;
    assert_eq!(one["rois"].as_array().unwrap().len(), 1, "{one}");
    assert_eq!(one["rois"][0]["id"], second_id.as_str(), "{one}");
    assert_eq!(one["next"], second_id.as_str(), "{one}");
    let two = api
        .get(&format!("/api/v1/rois?limit=1&before={second_id}"))
        .await;
    assert_eq!(two["rois"].as_array().unwrap().len(), 1, "{two}");
    assert_eq!(two["rois"][0]["id"], first_id.as_str(), "{two}");
    assert_eq!(two["next"], Value::Null, "{two}");
    let (status, _) = api
        .raw(reqwest::Method::GET, "/api/v1/rois?limit=nope", None)
        .await;
    assert_eq!(status, 400);

    // The list page links both, with their progress.
    let list = ui.page("/ui/rois").await;
    assert!(
        list.contains(&format!("<a href=\"/ui/rois/{second_id}\">second</a>")),
        "{list}"
    );
    assert!(
        list.contains(&format!("<a href=\"/ui/rois/{first_id}\">first</a>")),
        "{list}"
    );
    assert!(list.contains("<progress value=\"5\" max=\"6\""), "{list}");
    assert!(list.contains("<progress value=\"2\" max=\"2\""), "{list}");
    assert!(
        list.contains("<a href=\"/ui/rois\">ROIs</a>"),
        "the nav links the list"
    );

    // The second ROI's page: the map agrees with the API and the jobs.
    let html = ui.page(&format!("/ui/rois/{second_id}")).await;
    let jobs = jobs_by_tile(&server).await;
    assert_eq!(jobs[no_inputs].1, "failed", "{jobs:?}");
    let map = check_map(&html, &view, &jobs);
    let names: Vec<&str> = map.iter().map(|t| t.name.as_str()).collect();
    // South row first, west to east (the TileSet's order).
    assert_eq!(
        names,
        [
            "grid_0.05_52.05",
            "grid_0.15_52.05",
            "grid_0.25_52.05",
            "grid_0.05_52.15",
            "grid_0.15_52.15",
            "grid_0.25_52.15"
        ]
    );
    assert_eq!(map[5].class, "t-failed");
    // The first ROI's tiles link the first ROI's jobs, which made them.
    assert!(map[..2].iter().all(|t| t.class == "t-done"), "{map:?}");
    let (_, _, lines, labels) = read_map(&html);
    assert_eq!(
        labels,
        ["0.0°", "0.1°E", "0.2°E", "0.3°E", "52.0°N", "52.1°N", "52.2°N"]
    );
    assert_eq!(lines, labels.len());
    // Counts, progress and an ETA are on the page; the agent has a bar.
    for (state, n) in [("done", 5), ("failed", 1), ("missing", 0)] {
        assert!(
            html.contains(&format!("<td id=\"count-{state}\">{n}</td>")),
            "{state}: {html}"
        );
    }
    assert!(
        html.contains("<progress id=\"roi-progress\" value=\"5\" max=\"6\""),
        "{html}"
    );
    assert!(
        html.contains("<span id=\"roi-eta\">nothing queued or running</span>"),
        "{html}"
    );
    assert!(html.contains("<g data-agent=\"roi-pages\">"), "{html}");
    // No inline script: every script element has a src.
    assert!(
        html.contains("<script src=\"/ui/static/roi.js\"></script>"),
        "{html}"
    );
    for piece in html.split("<script").skip(1) {
        assert!(piece.starts_with(" src="), "inline script: <script{piece}");
    }
    // Requests without a session.
    let anon = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let js = anon
        .get(format!("{}/ui/static/roi.js", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(js.status(), 200);

    // A tile's link that the live map uses leads to its job.
    let r = ui
        .request(
            reqwest::Method::GET,
            &format!("/ui/rois/{second_id}/tiles/{no_inputs}"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(
        r.headers()["location"],
        format!("/ui/jobs/{}", jobs[no_inputs].0)
    );
    let r = ui
        .request(
            reqwest::Method::GET,
            &format!("/ui/rois/{second_id}/tiles/grid_5.05_5.05"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "a tile outside the ROI");

    // A tile job's page says which ROI made it, and the phases its agent
    // reported. The failed one made by the second ROI links that ROI.
    let done_job = &jobs["grid_0.05_52.05"].0;
    let html = ui.page(&format!("/ui/jobs/{done_job}")).await;
    let part_of = between(&html, "<td colspan=\"3\" id=\"part-of\">", "</td>")
        .unwrap_or_else(|| panic!("no Part of: {html}"));
    assert_eq!(
        part_of,
        format!("<a href=\"/ui/rois/{first_id}\">ROI first (tile grid_0.05_52.05)</a>")
    );
    let phases = between(&html, "<td colspan=\"3\" id=\"phases\">", "</td>")
        .unwrap_or_else(|| panic!("no phases: {html}"));
    for phase in ["fetch ", "encode ", "upload "] {
        assert!(phases.contains(phase), "{phases}");
    }
    let html = ui.page(&format!("/ui/jobs/{}", jobs[no_inputs].0)).await;
    assert!(
        html.contains(&format!(
            "<a href=\"/ui/rois/{second_id}\">ROI second (tile {no_inputs})</a>"
        )),
        "{html}"
    );

    // The live stream's first state: the counts and every tile's letter in
    // map order.
    let ev = States::open(&ui, &second_id).await.next().await;
    assert_eq!(ev["head"]["counts"], view["tiles"], "{ev}");
    assert_eq!(ev["head"]["state"], "failed", "{ev}");
    assert_eq!(ev["tiles"]["all"], "dddddf", "{ev}");

    // Without a session: the login page, and no stream.
    let r = anon
        .get(format!("{}/ui/rois/{second_id}", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let r = anon
        .get(format!("{}/ui/rois/{second_id}/events", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // An unknown ROI is a page, not JSON.
    let r = ui
        .request(
            reqwest::Method::GET,
            &format!("/ui/rois/{}", uuid::Uuid::new_v4()),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("<html"), "an HTML 404");

    // By name. The first region again under its name is another ROI (its
    // tiles are done: nothing to submit); the list of one name has both,
    // newest first, and `roi show NAME` shows the newest and says there are
    // more. An id still works, and a name that is no ROI is an error that
    // says what to run.
    let again = api
        .post("/api/v1/rois", roi("first", [0.01, 52.01, 0.19, 52.09]))
        .await;
    assert_eq!(again["submitted"], 0, "{again}");
    let again_id = again["id"].as_str().unwrap().to_string();
    let named = api.get("/api/v1/rois?name=first").await;
    let ids: Vec<&str> = named["rois"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [again_id.as_str(), first_id.as_str()], "{named}");
    let one = api.get("/api/v1/rois?name=first&limit=1").await;
    assert_eq!(one["next"], again_id.as_str(), "{one}");
    let rest = api
        .get(&format!(
            "/api/v1/rois?name=first&limit=1&before={again_id}"
        ))
        .await;
    assert_eq!(rest["rois"][0]["id"], first_id.as_str(), "{rest}");
    assert_eq!(rest["next"], Value::Null, "{rest}");
    let none = api.get("/api/v1/rois?name=fir").await;
    assert_eq!(none, json!({"rois": [], "next": null}));

    let (out, err) = server.cli(&["roi", "show", "second"]).await.unwrap();
    let shown: Value = serde_json::from_str(&out).expect("roi show: JSON");
    assert_eq!(shown["id"], second_id.as_str(), "{shown}");
    assert_eq!(err, "", "one ROI of that name: nothing on stderr");
    let (out, err) = server.cli(&["roi", "show", "first"]).await.unwrap();
    let shown: Value = serde_json::from_str(&out).expect("roi show: JSON");
    assert_eq!(shown["id"], again_id.as_str(), "the newest: {shown}");
    assert!(
        err.contains("several ROIs are named \"first\"") && err.contains(&again_id),
        "{err}"
    );
    let (out, _) = server.cli(&["roi", "show", &first_id]).await.unwrap();
    let shown: Value = serde_json::from_str(&out).expect("roi show: JSON");
    assert_eq!(shown["id"], first_id.as_str(), "{shown}");
    let (out, _) = server
        .cli(&["roi", "list", "--name", "first"])
        .await
        .unwrap();
    assert_eq!(out.lines().count(), 3, "a header and two ROIs: {out}");
    let err = server.cli(&["roi", "show", "nobody"]).await.unwrap_err();
    assert!(
        err.contains("no ROI is named \"nobody\"") && err.contains("flotilla roi list"),
        "{err}"
    );

    // Submit again from the page (browser review of 3877596, M3): offered
    // where a tile is missing or failed, not on a done ROI; it makes a new
    // ROI of the same region, queueing the failed tile, and shows it.
    let done_page = ui.page(&format!("/ui/rois/{first_id}")).await;
    assert!(!done_page.contains("id=\"roi-again\""), "{done_page}");
    let failed_page = ui.page(&format!("/ui/rois/{second_id}")).await;
    let form = between(&failed_page, "id=\"roi-again\">", "</form>")
        .unwrap_or_else(|| panic!("no Submit again: {failed_page}"));
    let token = between(form, "name=\"csrf\" value=\"", "\"").expect("a form token");
    let r = ui
        .request(
            reqwest::Method::POST,
            &format!("/ui/rois/{second_id}/again"),
        )
        .form(&[("csrf", token)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let to = r.headers()["location"].to_str().unwrap().to_string();
    let new_id = to.strip_prefix("/ui/rois/").expect("to the new ROI's page");
    assert_ne!(new_id, second_id);
    let new = api.get(&format!("/api/v1/rois/{new_id}")).await;
    assert_eq!(new["name"], "second", "{new}");
    assert_eq!(new["submitted"], 1, "the failed tile again: {new}");
    assert_eq!(new["total"], 6, "{new}");
    // At the priority the second was submitted with, not 0.
    assert_eq!(new["priority"], 7, "{new}");
    // Its one job is the newest tile job (lists are newest first).
    let newest = api.get("/api/v1/jobs?kind=tile&limit=1").await;
    assert_eq!(newest["jobs"][0]["priority"], 7, "{newest}");
    let new_page = ui.page(&format!("/ui/rois/{new_id}")).await;
    assert!(
        new_page.contains("priority <span id=\"roi-priority\">7</span>"),
        "{new_page}"
    );
}
