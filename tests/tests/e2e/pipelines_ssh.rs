//! Pipelines over ssh hosts and on `flotilla up`: the OCR example end to
//! end (PDFs split with pdftoppm on one host, OCR'd with tesseract on
//! another under `limit`, the text moved back), on two real sshd and on
//! the embedded default as the README shows it; and a cancel that reaches
//! a remote grandchild.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flotilla_e2e::procs::{server_on_shared, Agent};
use flotilla_e2e::sshd::Sshd;
use flotilla_e2e::up::{run, Up};
use flotilla_e2e::{binary, scratch};
use serde_json::json;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/ocr")
        .join(name)
}

/// Writes `docs` PDFs of two pages into `dir`; returns the expected lines
/// (`doc-K page P: WORDS`).
fn make_pdfs(dir: &Path, docs: u32) -> Vec<String> {
    run(
        Path::new("python3"),
        &[
            example("make-pdfs.py").to_str().unwrap(),
            dir.to_str().unwrap(),
            &docs.to_string(),
            "2",
        ],
    );
    std::fs::read_to_string(dir.join("expected.txt"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Each document's text holds the words of each of its pages.
fn check_text(text_dir: &Path, expected: &[String]) {
    for line in expected {
        let (doc, words) = line.split_once(" page ").unwrap();
        let words = words.split_once(": ").unwrap().1;
        let path = text_dir.join(format!("{doc}.txt"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for w in words.split(' ') {
            assert!(
                text.contains(w),
                "{}: `{w}` not in {text:?}",
                path.display()
            );
        }
    }
}

/// The host line's target: the fixture's key by the name
/// [`Sshd::install_for`] gave it in the agents' `--ssh-dir`.
fn ssh_host(s: &Sshd) -> String {
    format!(
        "ssh://{}@127.0.0.1:{} key {}",
        s.user(),
        s.port(),
        s.key_name()
    )
}

/// An `--ssh-dir` under `dir` from which agents reach `hosts`; the
/// agent arguments that give it.
fn ssh_dir(dir: &Path, hosts: &[&Sshd]) -> [String; 2] {
    let ssh = dir.join("ssh");
    for h in hosts {
        h.install_for(&ssh).expect("installing the fixture's keys");
    }
    ["--ssh-dir".into(), ssh.display().to_string()]
}

/// The OCR example's steps over two ssh hosts (each its own sshd and its
/// own tree), run by two real agents: the text comes back to the first
/// host, no page images are left on either, and at most 2 documents were
/// on the OCR host at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ocr_over_two_ssh_hosts_brings_back_the_known_words() {
    let scan = Sshd::start("scan").expect("sshd");
    let ocr = Sshd::start("ocr").expect("sshd");
    let (sh, oh) = (
        scan.home().display().to_string(),
        ocr.home().display().to_string(),
    );
    let expected = make_pdfs(&scan.home().join("pdf"), 4);
    let dir = scratch("e2e-pipeline-ocr-");
    let server = server_on_shared(dir.path(), 10_000).await;
    let ssh = ssh_dir(dir.path(), &[&scan, &ocr]);
    let ssh: Vec<&str> = ssh.iter().map(String::as_str).collect();
    let _a = Agent::start(&server, "ocr-agent-a", 4, &ssh).await;
    let _b = Agent::start(&server, "ocr-agent-b", 4, &ssh).await;
    let source = format!(
        "host scan = {}
host ocr = {}
items on scan: cd {sh}/pdf && ls *.pdf | sed 's/\\.pdf$//'
stage split on scan jobs 2 out {sh}/pages/{{id}}/: pdftoppm -r 100 -png {sh}/pdf/{{id}}.pdf {{out}}/page
limit 2 {{
    move pages to ocr:{oh}/ocr-in/{{id}}
    stage read on ocr jobs 2 out {oh}/ocr-out/{{id}}.txt consume: for p in {{in}}/page-*.png; do tesseract \"$p\" - 2>/dev/null; done > {{out}}
}}
move text to scan:{sh}/text/{{id}}.txt
",
        ssh_host(&scan),
        ssh_host(&ocr)
    );
    let api = server.api();
    let run = api
        .post(
            "/api/v1/pipelines",
            json!({"name": "ocr.pipeline", "source": source}),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut most_inside = 0;
    let mut view = serde_json::Value::Null;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(240) {
        view = api.get(&format!("/api/v1/pipelines/{run}?limit=1")).await;
        most_inside = most_inside.max(view["gates"][0]["inside"].as_u64().unwrap_or(0));
        if ["done", "failed", "cancelled"].contains(&view["state"].as_str().unwrap_or("")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(view["state"], "done", "{view:#}");
    // 0 would mean the gate was never seen occupied: sampling missed it.
    assert!(
        (1..=2).contains(&most_inside),
        "{most_inside} documents seen inside limit 2"
    );
    check_text(&scan.home().join("text"), &expected);
    for (host, sub) in [(&sh, "pages"), (&oh, "ocr-in"), (&oh, "ocr-out")] {
        let left: Vec<_> = std::fs::read_dir(Path::new(host).join(sub))
            .map(|rd| rd.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{host}/{sub} still holds {left:?}");
    }
}

/// `/proc/PID` gone, or a zombie waiting for its reaper.
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_or(true, |s| s.split(' ').nth(2) == Some("Z"))
}

/// Cancelling one item, then the run, whose stage runs on an ssh host
/// kills each remote process tree: a grandchild of the remote shell is gone
/// soon after, and the other item's is not touched by the item's cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_a_remote_grandchild() {
    let host = Sshd::start("cancel").expect("sshd");
    let home = host.home().display().to_string();
    let dir = scratch("e2e-pipeline-cancel-");
    let server = server_on_shared(dir.path(), 10_000).await;
    let ssh = ssh_dir(dir.path(), &[&host]);
    let ssh: Vec<&str> = ssh.iter().map(String::as_str).collect();
    let _a = Agent::start(&server, "cancel-agent", 2, &ssh).await;
    let source = format!(
        "host h = {}
items on h: printf 'one\\ntwo\\n'
stage wait on h jobs 2: sleep 300 & echo $! > {home}/{{id}}.pid; wait
",
        ssh_host(&host)
    );
    let api = server.api();
    let run = api
        .post(
            "/api/v1/pipelines",
            json!({"name": "cancel.pipeline", "source": source}),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let pid_of = |item: &str| host.home().join(format!("{item}.pid"));
    for item in ["one", "two"] {
        let p = pid_of(item);
        flotilla_e2e::eventually("the remote sleeps to start", Duration::from_secs(60), || {
            let p = p.clone();
            async move { std::fs::read_to_string(&p).is_ok_and(|s| s.trim().parse::<u32>().is_ok()) }
        })
        .await;
    }
    let pid = |item: &str| -> u32 {
        std::fs::read_to_string(pid_of(item))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (one, two) = (pid("one"), pid("two"));
    assert!(
        !gone(one) && !gone(two),
        "the remote sleeps are not running"
    );
    api.post(
        &format!("/api/v1/pipelines/{run}/items/one/cancel"),
        json!({}),
    )
    .await;
    flotilla_e2e::eventually(
        "item one's remote grandchild to be gone",
        Duration::from_secs(30),
        || async move { gone(one) },
    )
    .await;
    assert!(!gone(two), "cancelling item one killed item two's process");
    let view = api.get(&format!("/api/v1/pipelines/{run}")).await;
    assert_eq!(view["state"], "running", "{view:#}");
    assert_eq!(view["rows"][0]["state"], "cancelled", "{view:#}");
    api.post(&format!("/api/v1/pipelines/{run}/cancel"), json!({}))
        .await;
    flotilla_e2e::eventually(
        "item two's remote grandchild to be gone",
        Duration::from_secs(30),
        || async move { gone(two) },
    )
    .await;
    let view = api.get(&format!("/api/v1/pipelines/{run}")).await;
    assert_eq!(view["state"], "cancelled", "{view:#}");
}

/// The example as the README runs it: `flotilla up`, the PDFs made by
/// make-pdfs.py, `flotilla pipeline run examples/ocr/ocr.pipeline`.
#[test]
fn the_ocr_example_runs_on_flotilla_up() {
    // The example's own paths, as the README has them.
    let (pdf, work) = (
        Path::new("/tmp/flotilla-ocr-pdf"),
        Path::new("/tmp/flotilla-ocr"),
    );
    let _ = std::fs::remove_dir_all(pdf);
    let _ = std::fs::remove_dir_all(work);
    let expected = make_pdfs(pdf, 3);
    let dir = scratch("e2e-up-ocr-");
    let up = Up::start(dir.path(), 2);
    let flotilla = binary("flotilla");
    // The README runs the pipeline once `flotilla agents` lists local-1.
    let conn = up.conn();
    let mut agents = vec!["agents"];
    agents.extend(conn.iter().map(String::as_str));
    let started = std::time::Instant::now();
    while !run(&flotilla, &agents).contains("local-1") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "local-1 did not register"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut args = vec!["pipeline", "run"];
    let file = example("ocr.pipeline");
    args.push(file.to_str().unwrap());
    args.extend(conn.iter().map(String::as_str));
    let out = run(&flotilla, &args);
    assert!(out.contains("(done)"), "{out}");
    check_text(&work.join("text"), &expected);
    drop(up);
    let _ = std::fs::remove_dir_all(pdf);
    let _ = std::fs::remove_dir_all(work);
}
