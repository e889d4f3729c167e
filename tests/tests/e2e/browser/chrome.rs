//! Chromium under chromedriver for the browser tests: start, open pages,
//! run scripts, click, resize, screenshot, read the console, press Tab.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::{Client, ClientBuilder, Locator};
use flotilla_e2e::procs::free_addr;
use serde_json::{json, Value};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// A desktop window, and a phone's width (an iPhone 12–15 is 390 CSS px).
pub const DESKTOP: (u32, u32) = (1280, 800);
pub const PHONE: (u32, u32) = (390, 844);
/// The WebDriver code of the Tab key.
const TAB: char = '\u{e004}';

/// Chromium under chromedriver, in a process group of its own that is
/// killed when this is dropped (chromedriver's browser would outlive it).
pub struct Browser {
    pub client: Client,
    driver_url: String,
    driver: tokio::process::Child,
    base: String,
    pub shots: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(pid) = self.driver.id() {
            // The group holds chromedriver and the browser it started.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Browser {
    pub async fn start(base: &str, shots: PathBuf) -> Browser {
        for bin in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(bin).is_file(),
                "{bin} is missing: the browser tests drive Debian's Chromium through \
                 chromedriver; run scripts/setup-debian.sh --test (it installs the \
                 chromium and chromium-driver packages)"
            );
        }
        std::fs::create_dir_all(&shots).expect("making the screenshot directory");
        let port = free_addr().port();
        let driver = tokio::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("spawning chromedriver");
        let driver_url = format!("http://127.0.0.1:{port}");
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                // Root in a container: no sandbox; a small /dev/shm.
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                         "--disable-gpu", "--hide-scrollbars",
                         format!("--window-size={},{}", DESKTOP.0, DESKTOP.1)],
            },
            "goog:loggingPrefs": { "browser": "ALL" },
        });
        let caps = caps.as_object().expect("an object").clone();
        let start = Instant::now();
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&driver_url)
                .await
            {
                Ok(c) => break c,
                Err(_) if start.elapsed() < Duration::from_secs(60) => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => panic!("chromedriver did not start Chromium within 60 s: {e}"),
            }
        };
        Browser {
            client,
            driver_url,
            driver,
            base: base.to_string(),
            shots,
        }
    }

    /// Opens `path` and waits for the document to load.
    pub async fn open(&self, path: &str) {
        self.client
            .goto(&format!("{}{path}", self.base))
            .await
            .unwrap_or_else(|e| panic!("opening {path}: {e}"));
        self.wait_js(
            &format!("{path} to load"),
            "return document.readyState === 'complete'",
        )
        .await;
    }

    pub async fn js(&self, script: &str) -> Value {
        self.client
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("running {script}: {e}"))
    }

    /// Waits until `script` returns true.
    pub async fn wait_js(&self, what: &str, script: &str) {
        let start = Instant::now();
        loop {
            if self.js(script).await == Value::Bool(true) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "timed out after 30 s waiting for {what} ({script})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn text(&self, css: &str) -> String {
        let script = format!(
            "const e = document.querySelector({}); return e ? e.textContent.trim() : null",
            json!(css)
        );
        match self.js(&script).await {
            Value::String(s) => s,
            v => panic!("no {css} on the page ({v})"),
        }
    }

    pub async fn path(&self) -> String {
        self.client
            .current_url()
            .await
            .expect("the URL")
            .path()
            .to_string()
    }

    pub async fn click(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"))
            .click()
            .await
            .unwrap_or_else(|e| panic!("clicking {css}: {e}"));
    }

    pub async fn resize(&self, (w, h): (u32, u32)) {
        self.client
            .set_window_size(w, h)
            .await
            .expect("resizing the window");
    }

    /// Saves the page as `NAME.png`; returns its path.
    pub async fn shot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("a screenshot");
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("writing a screenshot");
        path
    }

    /// The browser's console since the last call (chromedriver's log,
    /// which holds CSP violations, script errors and failed loads): the
    /// errors, with `context` in the panic.
    pub async fn console_errors(&self, context: &str) -> Vec<String> {
        let session = self
            .client
            .session_id()
            .await
            .expect("a session")
            .expect("a session id");
        let r = reqwest::Client::new()
            .post(format!("{}/session/{session}/se/log", self.driver_url))
            .json(&json!({"type": "browser"}))
            .send()
            .await
            .expect("reading the browser log");
        let v: Value = r.json().await.expect("the browser log is JSON");
        let entries = v["value"]
            .as_array()
            .unwrap_or_else(|| panic!("{context}: no browser log: {v}"));
        entries
            .iter()
            .filter(|e| {
                e["level"] == "SEVERE"
                    || e["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("Content Security Policy"))
            })
            .map(|e| format!("{context}: {}", e["message"]))
            .collect()
    }

    pub async fn assert_clean_console(&self, context: &str) {
        let errors = self.console_errors(context).await;
        assert!(errors.is_empty(), "console errors: {errors:#?}");
    }

    /// Presses Tab `n` times from the top of the page; what each stop is
    /// (`TAG href-or-text`).
    pub async fn tab_stops(&self, n: usize) -> Vec<String> {
        self.js("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0)")
            .await;
        let mut stops = Vec::new();
        for _ in 0..n {
            let keys = KeyActions::new("keyboard".into())
                .then(KeyAction::Down { value: TAB })
                .then(KeyAction::Up { value: TAB });
            self.client
                .perform_actions(keys)
                .await
                .expect("pressing Tab");
            let v = self
                .js("const e = document.activeElement; \
                     return e.tagName + ' ' + (e.getAttribute('href') || e.textContent.trim())")
                .await;
            stops.push(v.as_str().unwrap_or_default().to_string());
        }
        stops
    }
}

/// The screenshots' directory: `target/browser-screenshots`.
pub fn screenshot_dir() -> PathBuf {
    flotilla_e2e::bin_dir()
        .parent()
        .expect("target/debug has a parent")
        .join("browser-screenshots")
}
