//! The processes under chaos: server replicas on fixed addresses, agents that know every server, a PKI for TLS.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use flotilla_e2e::procs::{write_private, Server, TlsFiles};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use tokio::process::{Child, Command};

/// A CA and a server certificate for `ip` (every replica shares it: they
/// listen on one address, on different ports).
pub fn make_pki(dir: &Path, ip: Ipv4Addr) -> TlsFiles {
    std::fs::create_dir_all(dir).expect("pki dir");
    let ca_key = KeyPair::generate().expect("a CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "flotilla chaos CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).expect("self-signing the CA");
    let key = KeyPair::generate().expect("a server key");
    let mut leaf = CertificateParams::new(Vec::<String>::new()).expect("leaf params");
    leaf.distinguished_name
        .push(DnType::CommonName, ip.to_string());
    leaf.subject_alt_names = vec![SanType::IpAddress(IpAddr::V4(ip))];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = leaf
        .signed_by(&key, &ca_cert, &ca_key)
        .expect("signing the server certificate");
    let files = TlsFiles {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    };
    std::fs::write(&files.ca, ca_cert.pem()).expect("writing ca.pem");
    std::fs::write(&files.cert, cert.pem()).expect("writing server.pem");
    write_private(&files.key, &key.serialize_pem());
    files
}

/// A free port on `ip` (bound then released), for a replica that restarts
/// on the same address.
pub fn free_addr_on(ip: Ipv4Addr) -> SocketAddr {
    let l = std::net::TcpListener::bind((ip, 0)).expect("binding port 0 on the veth address");
    l.local_addr().expect("local addr")
}

/// One `flotilla-agent`, possibly inside a network namespace, restartable
/// under the same name and token.
pub struct ChaosAgent {
    pub name: String,
    /// `ip netns` name to run in, or none.
    pub netns: Option<String>,
    servers: String,
    ca: PathBuf,
    token_file: PathBuf,
    workdir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// How many times it was started (1 for the first).
    pub starts: u32,
}

impl ChaosAgent {
    /// Makes its token with `server`'s admin API, then starts it.
    pub async fn start(
        dir: &Path,
        server: &Server,
        servers: &[String],
        name: &str,
        netns: Option<String>,
    ) -> ChaosAgent {
        let token = server.api().agent_token(name).await;
        let workdir = dir.join("agents").join(name);
        std::fs::create_dir_all(&workdir).expect("agent workdir");
        let token_file = dir.join("agents").join(format!("{name}.token"));
        write_private(&token_file, &token);
        let mut agent = ChaosAgent {
            name: name.to_string(),
            netns,
            servers: servers.join(","),
            ca: server
                .tls
                .as_ref()
                .expect("the servers serve TLS")
                .ca
                .clone(),
            token_file,
            workdir,
            log: dir.join("logs").join(format!("{name}.log")),
            child: None,
            starts: 0,
        };
        agent.spawn();
        agent
    }

    /// Starts the process (the previous one must be dead).
    pub fn spawn(&mut self) {
        let bin = flotilla_e2e::binary("flotilla-agent");
        let mut cmd = match &self.netns {
            Some(ns) => {
                // `ip netns exec` execs the agent: the child's pid is the
                // agent's, so SIGKILL reaches it and nothing else.
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        std::fs::create_dir_all(self.log.parent().expect("logs dir")).expect("logs dir");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("agent log file");
        let child = cmd
            .arg("--server")
            .arg(&self.servers)
            .arg("--ca-file")
            .arg(&self.ca)
            .arg("--token-file")
            .arg(&self.token_file)
            .arg("--name")
            .arg(&self.name)
            .arg("--capacity")
            .arg("2")
            .arg("--workdir")
            .arg(&self.workdir)
            .arg("--kill-grace-s")
            .arg("2")
            .env("FLOTILLA_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("spawning flotilla-agent");
        self.child = Some(child);
        self.starts += 1;
    }

    /// SIGKILL, as a crash would, and reap it.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Whether the process is still running (it should never exit by itself).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }
}
