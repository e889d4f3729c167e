//! A network namespace joined to the host by a veth pair, and a partition of it: `ip` and `nft`, undone on drop.
//!
//! The partition drops packets silently in both directions (an nft `netdev`
//! ingress chain on each end of the pair), as a cut cable or a dead switch
//! would: the agent inside sees its requests time out, not refused, and the
//! servers' replies vanish. Names carry the test's pid, so parallel runs do
//! not meet; the guard removes the table, the pair and the namespace even
//! when the test panics.

use std::net::Ipv4Addr;
use std::process::Command;

/// The namespace, its veth pair and addresses.
pub struct Netns {
    /// `ip netns` name of the namespace.
    pub name: String,
    /// The host's end of the pair (in the root namespace).
    host_if: String,
    /// The namespace's end.
    ns_if: String,
    /// The host end's address: the servers listen here, so the agent in the
    /// namespace reaches them over the pair and the others over loopback
    /// routing.
    pub host_ip: Ipv4Addr,
    /// The nft table (netdev family) in both namespaces while partitioned.
    table: String,
    partitioned: bool,
}

/// Runs `ip`/`nft` with `args`; panics with its output if it fails.
fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program} {args:?}: {e} (is it installed?)"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `program args`, ignoring the outcome (for clean-up).
fn try_run(program: &str, args: &[&str]) {
    let _ = Command::new(program).args(args).output();
}

impl Netns {
    /// Makes `flc<pid>` with a /30 of 10.0.0.0/8 chosen by the pid (host
    /// end .1, namespace end .2), both ends up, loopback up inside.
    pub fn make() -> Netns {
        let pid = std::process::id();
        // 14 characters at most: interface names are limited to 15.
        let name = format!("flc{pid}");
        let ip = Ipv4Addr::new(
            10,
            64 + ((pid >> 14) % 128) as u8,
            ((pid >> 6) % 256) as u8,
            ((pid % 64) * 4) as u8,
        );
        let [a, b, c, d] = ip.octets();
        let host_ip = Ipv4Addr::new(a, b, c, d + 1);
        let ns_ip = Ipv4Addr::new(a, b, c, d + 2);
        let ns = Netns {
            host_if: format!("{name}h"),
            ns_if: format!("{name}n"),
            table: format!("flchaos{pid}"),
            name,
            host_ip,
            partitioned: false,
        };
        // Built up step by step: a failure part-way still leaves a guard
        // that removes what was made.
        run("ip", &["netns", "add", &ns.name]);
        run(
            "ip",
            &[
                "link",
                "add",
                &ns.host_if,
                "type",
                "veth",
                "peer",
                "name",
                &ns.ns_if,
            ],
        );
        run("ip", &["link", "set", &ns.ns_if, "netns", &ns.name]);
        run(
            "ip",
            &["addr", "add", &format!("{host_ip}/30"), "dev", &ns.host_if],
        );
        run("ip", &["link", "set", &ns.host_if, "up"]);
        ns.exec(
            "ip",
            &["addr", "add", &format!("{ns_ip}/30"), "dev", &ns.ns_if],
        );
        ns.exec("ip", &["link", "set", &ns.ns_if, "up"]);
        ns.exec("ip", &["link", "set", "lo", "up"]);
        ns
    }

    /// Runs `program args` inside the namespace.
    fn exec(&self, program: &str, args: &[&str]) {
        let mut all = vec!["netns", "exec", &self.name, program];
        all.extend_from_slice(args);
        run("ip", &all);
    }

    /// The ingress-drop chain for `dev`, as `nft` arguments after the
    /// table is made.
    fn drop_chain(&self, dev: &str) -> [String; 5] {
        [
            "add".into(),
            "chain".into(),
            "netdev".into(),
            self.table.clone(),
            format!(
                "drop_all {{ type filter hook ingress device \"{dev}\" priority 0; policy drop; }}"
            ),
        ]
    }

    /// Cuts the namespace off: from here nothing crosses the pair.
    pub fn partition(&mut self) {
        assert!(!self.partitioned, "already partitioned");
        self.partitioned = true;
        let add_table = ["add", "table", "netdev", self.table.as_str()];
        run("nft", &add_table);
        let chain = self.drop_chain(&self.host_if);
        run("nft", &chain.each_ref().map(String::as_str));
        self.exec("nft", &add_table);
        let chain = self.drop_chain(&self.ns_if);
        self.exec("nft", &chain.each_ref().map(String::as_str));
    }

    /// Joins it again.
    pub fn heal(&mut self) {
        assert!(self.partitioned, "not partitioned");
        run("nft", &["delete", "table", "netdev", &self.table]);
        self.exec("nft", &["delete", "table", "netdev", &self.table]);
        self.partitioned = false;
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Each step on its own: one that fails (never made) must not stop
        // the others. The namespace's end, its table and the pair go with
        // the namespace.
        try_run("nft", &["delete", "table", "netdev", &self.table]);
        try_run(
            "ip",
            &[
                "netns",
                "exec",
                &self.name,
                "nft",
                "delete",
                "table",
                "netdev",
                &self.table,
            ],
        );
        try_run("ip", &["link", "del", &self.host_if]);
        try_run("ip", &["netns", "del", &self.name]);
    }
}
