//! TLS end to end (reliability review H6, L3): `flotilla serve --tls-cert
//! --tls-key` with an agent and the CLI that trust its CA by `--ca-file`,
//! the CLI without it told what to do, plain HTTP to the TLS port refused,
//! a TLS handshake that never comes timed out, the dashboard's cookie
//! `Secure`; addresses refused without TLS; PostgreSQL over TLS with
//! `sslmode=verify-full` and a wrong CA refused at once.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use flotilla_core::job::JobState;
use flotilla_e2e::procs::{opts_on_shared, Agent, Server, ServerOpts, TlsFiles};
use flotilla_e2e::{binary, scratch};
use flotilla_server::embedded_pg::auth::OWNER;
use flotilla_server::embedded_pg::EmbeddedPostgres;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// A CA, and a certificate it signed for `localhost` and 127.0.0.1.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Pki {
    /// Writes `ca.pem`, `server.pem` and `server.key` under `dir/name`.
    fn make(dir: &Path, name: &str) -> Pki {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("flotilla test CA {name}"));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
        leaf.distinguished_name
            .push(DnType::CommonName, "localhost");
        leaf.subject_alt_names = vec![
            SanType::DnsName("localhost".try_into().unwrap()),
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        ];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = leaf.signed_by(&key, &ca_cert, &ca_key).unwrap();
        let pki = Pki {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        };
        std::fs::write(&pki.ca, ca_cert.pem()).unwrap();
        std::fs::write(&pki.cert, cert.pem()).unwrap();
        flotilla_e2e::procs::write_private(&pki.key, &key.serialize_pem());
        pki
    }

    fn files(&self) -> TlsFiles {
        TlsFiles {
            cert: self.cert.clone(),
            key: self.key.clone(),
            ca: self.ca.clone(),
        }
    }
}

/// Runs `flotilla ARGS` (with `env`) to its end, within `limit`.
async fn flotilla(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let run = Command::new(binary("flotilla"))
        .args(args)
        .envs(env.iter().copied())
        .env("FLOTILLA_LOG", "warn")
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(limit, run)
        .await
        .unwrap_or_else(|_| panic!("flotilla {args:?} did not end within {limit:?}"))
        .expect("running flotilla")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A dashboard login; returns its `Set-Cookie`.
async fn login(url: &str, http: &reqwest::Client, token: &str, forwarded_https: bool) -> String {
    let mut req = http
        .post(format!("{url}/ui/login"))
        .form(&[("token", token)]);
    if forwarded_https {
        req = req.header("x-forwarded-proto", "https");
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 303);
    r.headers()["set-cookie"].to_str().unwrap().to_string()
}

/// An agent that trusts the server's CA runs a job over HTTPS; the CLI
/// lists it with `--ca-file` and, without it, says what to do; plain HTTP
/// to the TLS port gets no answer; a client that opens a connection and
/// never starts the handshake is dropped after the header-read timeout; a
/// dashboard login sets a `Secure` cookie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_and_the_cli_work_over_https() {
    let dir = scratch("e2e-tls-");
    let pki = Pki::make(dir.path(), "pki");
    let mut opts = opts_on_shared(dir.path(), 5_000).await;
    opts.env
        .push(("FLOTILLA_HEADER_READ_TIMEOUT_MS".into(), "1000".into()));
    let server = Server::start_tls(dir.path(), opts, pki.files()).await;
    let url = server.url();
    assert!(url.starts_with("https://"), "{url}");
    let api = server.api();

    // The agent is given --ca-file (procs::Agent::start).
    let _agent = Agent::start(&server, "tls-agent", 1, &[]).await;
    let id = api
        .submit(json!({"kind": "command", "command": "echo over-tls"}))
        .await;
    let job = api.wait_final(&id, Duration::from_secs(60)).await;
    assert_eq!(job.state, JobState::Succeeded, "{:?}", job.error);

    let ca = pki.ca.to_str().unwrap();
    let token = server.admin_token.as_str();
    let limit = Duration::from_secs(30);
    let listed = flotilla(
        &["jobs", "list", "--server", &url, "--ca-file", ca],
        &[("FLOTILLA_TOKEN", token)],
        limit,
    )
    .await;
    assert!(listed.status.success(), "{}", text(&listed));
    assert!(text(&listed).contains(&id), "{}", text(&listed));

    let untrusting = flotilla(
        &["jobs", "list", "--server", &url],
        &[("FLOTILLA_TOKEN", token)],
        limit,
    )
    .await;
    assert!(!untrusting.status.success(), "{}", text(&untrusting));
    let said = text(&untrusting);
    for what in ["UnknownIssuer", "not signed by a CA", "--ca-file"] {
        assert!(said.contains(what), "no `{what}` in: {said}");
    }

    // An agent without the CA retries, saying why and what to do.
    let token_file = dir.path().join("untrusting.token");
    flotilla_e2e::procs::write_private(&token_file, &api.agent_token("untrusting").await);
    let mut agent = Command::new(binary("flotilla-agent"))
        .args(["--server", &url, "--name", "untrusting"])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--workdir")
        .arg(dir.path().join("untrusting"))
        .env("FLOTILLA_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(agent.stderr.take().unwrap()).lines();
    let warned = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("UnknownIssuer") {
                return line;
            }
        }
        panic!("the agent ended without a word about the certificate");
    })
    .await
    .expect("the agent says why it cannot reach the server");
    assert!(warned.contains("--ca-file"), "{warned}");
    agent.kill().await.unwrap();

    // Plain HTTP to the TLS port: the handshake fails, no HTTP answer.
    let plain_url = format!("http://{}", server.addr);
    let plain = reqwest::Client::new()
        .get(format!("{plain_url}/healthz"))
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP got an answer: {plain:?}");
    let plain_cli = flotilla(
        &["jobs", "list", "--server", &plain_url],
        &[("FLOTILLA_TOKEN", token)],
        limit,
    )
    .await;
    assert!(!plain_cli.status.success(), "{}", text(&plain_cli));
    assert!(
        text(&plain_cli).contains("https://"),
        "{}",
        text(&plain_cli)
    );

    // A connection that never starts its handshake holds its slot for the
    // header-read timeout (1 s here), then the server closes it.
    let mut idle = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let opened = Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read(&mut idle, &mut buf),
    )
    .await
    .expect("the server closes a connection that never handshakes");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "the server sent something: {read:?}"
    );
    assert!(opened.elapsed() >= Duration::from_millis(900));

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&pki.ca).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let cookie = login(&url, &http, token, false).await;
    assert!(cookie.contains("; Secure"), "{cookie}");
}

/// On plain HTTP the proxy's `X-Forwarded-Proto` counts only with
/// `--behind-tls-proxy`: anyone can send that header to a server no proxy
/// fronts (dashboard.rs shows the cookie Secure behind a proxy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forwarded_proto_header_counts_only_behind_a_proxy() {
    let dir = scratch("e2e-tls-noproxy-");
    let server = Server::start(dir.path(), opts_on_shared(dir.path(), 5_000).await).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let cookie = login(&server.url(), &http, &server.admin_token, true).await;
    assert!(!cookie.contains("Secure"), "{cookie}");
}

/// A non-loopback address without TLS, and a login-free dashboard on one,
/// are refused before anything starts, with what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exposed_addresses_need_tls_and_a_login() {
    let dir = scratch("e2e-tls-refuse-");
    let pki = Pki::make(dir.path(), "pki");
    let store = dir.path().join("store");
    // Nothing listens there: a server that got as far as connecting would
    // retry it for a minute, past the limit below.
    let env = [(
        "FLOTILLA_DATABASE_URL",
        "postgres://flotilla@127.0.0.1:1/flotilla",
    )];
    let limit = Duration::from_secs(20);
    let serve = [
        "serve",
        "--listen",
        "0.0.0.0:0",
        "--store",
        store.to_str().unwrap(),
    ];

    let out = flotilla(&serve, &env, limit).await;
    assert!(!out.status.success());
    let said = text(&out);
    for what in [
        "refusing to listen on 0.0.0.0:0 without TLS",
        "--tls-cert",
        "--behind-tls-proxy",
    ] {
        assert!(said.contains(what), "no `{what}` in: {said}");
    }

    let tls = [
        "--tls-cert",
        pki.cert.to_str().unwrap(),
        "--tls-key",
        pki.key.to_str().unwrap(),
        "--no-dashboard-login",
    ];
    let out = flotilla(&[&serve[..], &tls[..]].concat(), &env, limit).await;
    assert!(!out.status.success());
    assert!(
        text(&out).contains("refusing --no-dashboard-login on 0.0.0.0:0"),
        "{}",
        text(&out)
    );
}

/// Runs `pg_ctl ARGS` on the cluster in `data` as the user it runs as
/// (`postgres` when we are root, as in `EmbeddedPostgres`).
async fn pg_ctl(data: &Path, args: &[&str]) {
    let bin = flotilla_server::embedded_pg::find_bin_dir().unwrap();
    let mut cmd = if nix::unistd::geteuid().is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join("pg_ctl"));
        c
    } else {
        Command::new(bin.join("pg_ctl"))
    };
    let out = cmd
        .arg("-D")
        .arg(data)
        .args(args)
        .env("LC_ALL", "C")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "pg_ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A PostgreSQL that takes TLS connections only (`hostssl`), with a
/// certificate of our own CA: `flotilla serve` works with
/// `sslmode=verify-full&sslrootcert=CA`, `sslmode=require` connects, and a
/// wrong CA is refused at once with what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_verifies_its_certificate() {
    use sqlx::Connection;
    use std::os::unix::fs::MetadataExt;

    let dir = scratch("e2e-pg-tls-");
    let cluster = dir.path().join("pgc");
    let pg = EmbeddedPostgres::start(&cluster).await.unwrap();
    pg.ensure_database("flotilla").await.unwrap();
    pg.stop_now().await.unwrap();

    // The cluster's certificate and key, owned by its user (the key 0600,
    // or PostgreSQL refuses it), and TLS-only TCP logins on loopback.
    let pki = Pki::make(dir.path(), "pki");
    let wrong = Pki::make(dir.path(), "wrong");
    let data = cluster.join("pg");
    let owner = std::fs::metadata(&data).unwrap();
    for (from, to) in [(&pki.cert, "server.crt"), (&pki.key, "server.key")] {
        let to = data.join(to);
        std::fs::copy(from, &to).unwrap();
        std::os::unix::fs::chown(&to, Some(owner.uid()), Some(owner.gid())).unwrap();
    }
    let append = |file: &str, text: &str| {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join(file))
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    };
    append(
        "postgresql.conf",
        "\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
    );
    append(
        "pg_hba.conf",
        "hostssl all all 127.0.0.1/32 scram-sha-256\n",
    );
    let port = flotilla_e2e::procs::free_addr().port();
    let opts = format!(
        "-k {} -c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_permissions=0700",
        pg.socket_dir().display()
    );
    let log = cluster.join("run").join("tls.log");
    pg_ctl(
        &data,
        &["-l", log.to_str().unwrap(), "-w", "-o", &opts, "start"],
    )
    .await;

    let password = std::fs::read_to_string(pg.password_file(OWNER)).unwrap();
    let url = |query: &str| {
        format!(
            "postgres://{OWNER}:{}@localhost:{port}/flotilla?{query}",
            password.trim()
        )
    };
    let verify_full = url(&format!(
        "sslmode=verify-full&sslrootcert={}",
        pki.ca.display()
    ));

    // The connection is TLS (and without it there is no login at all).
    let mut conn = sqlx::PgConnection::connect(&verify_full).await.unwrap();
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert!(ssl);
    conn.close().await.unwrap();
    let require = sqlx::PgConnection::connect(&url("sslmode=require")).await;
    require
        .expect("sslmode=require connects")
        .close()
        .await
        .unwrap();
    let plain = sqlx::PgConnection::connect(&url("sslmode=disable")).await;
    assert!(plain.is_err(), "a login without TLS was let in");

    let server = Server::start(
        dir.path(),
        ServerOpts {
            database_url: verify_full,
            store: dir.path().join("store").to_string_lossy().into_owned(),
            listen: "127.0.0.1:0".parse().unwrap(),
            lease_ttl_ms: 5_000,
            backoff_base_ms: 200,
            env: Vec::new(),
        },
    )
    .await;
    let api = server.api();
    let id = api
        .submit(json!({"kind": "command", "command": "true"}))
        .await;
    assert_eq!(api.job(&id).await.state, JobState::Queued);
    drop(server);

    let wrong_url = url(&format!(
        "sslmode=verify-full&sslrootcert={}",
        wrong.ca.display()
    ));
    let store = dir.path().join("store");
    let started = Instant::now();
    let out = flotilla(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--store",
            store.to_str().unwrap(),
        ],
        &[("FLOTILLA_DATABASE_URL", &wrong_url)],
        Duration::from_secs(30),
    )
    .await;
    assert!(!out.status.success());
    // At once: a certificate is not retried like an unreachable database.
    assert!(started.elapsed() < Duration::from_secs(15));
    let said = text(&out);
    for what in ["UnknownIssuer", "certificate was refused", "sslrootcert"] {
        assert!(said.contains(what), "no `{what}` in: {said}");
    }
    assert!(!said.contains(password.trim()), "the password was shown");

    pg.stop_now().await.unwrap();
}
