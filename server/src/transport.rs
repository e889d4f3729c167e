//! How clients reach the server — plain HTTP, TLS served here, or TLS ended
//! by a proxy in front — which of those an address may be served with, and
//! the rustls acceptor for TLS served here.
//!
//! The rule (reliability review H6, L3): API tokens and dashboard sessions
//! never cross a network in cleartext, so an address other machines can
//! reach is served with TLS, or the operator says a proxy terminates it;
//! and a dashboard without a login is served on loopback only.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;

/// What carries requests to the server, and so which requests came over
/// HTTPS (dashboard cookies are `Secure` for those).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// Plain HTTP, on loopback (or wherever a test puts it): no request
    /// counts as HTTPS, whatever its headers claim.
    #[default]
    Plain,
    /// TLS served here (`--tls-cert`, `--tls-key`): every request came over
    /// HTTPS.
    Tls,
    /// Plain HTTP from a proxy that terminates TLS (`--behind-tls-proxy`):
    /// a request came over HTTPS when the proxy says so
    /// (`X-Forwarded-Proto: https`).
    Proxy,
}

/// An address the server will not be served on as asked.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ExposureError {
    #[error(
        "refusing to listen on {0} without TLS: API tokens and dashboard sessions would cross \
         the network in cleartext. Serve TLS with `flotilla serve --tls-cert CERT.pem --tls-key \
         KEY.pem`; or, if a proxy in front terminates TLS and only it reaches this port, say so \
         with --behind-tls-proxy (FLOTILLA_BEHIND_TLS_PROXY=true); or listen on a loopback \
         address such as 127.0.0.1:8470"
    )]
    Cleartext(SocketAddr),
    #[error(
        "refusing --no-dashboard-login on {0}: it shows every dashboard page (job specs with \
         their environment, logs) to anyone who can reach the port. Sign in to the dashboard \
         with a client or admin token instead (drop --no-dashboard-login), or listen on a \
         loopback address such as 127.0.0.1:8470"
    )]
    OpenDashboard(SocketAddr),
}

/// The transport for serving on `listen` with TLS here (`tls`) or behind a
/// TLS proxy (`behind_proxy`), or why not: an address other machines can
/// reach needs one of the two, and takes no login-free dashboard.
pub fn transport_for(
    listen: SocketAddr,
    tls: bool,
    behind_proxy: bool,
    dashboard_open: bool,
) -> Result<Transport, ExposureError> {
    // A proxy may re-encrypt to a server that serves TLS itself; then
    // every request came over HTTPS, as with no proxy.
    let transport = if tls {
        Transport::Tls
    } else if behind_proxy {
        Transport::Proxy
    } else {
        Transport::Plain
    };
    if !listen.ip().to_canonical().is_loopback() {
        if dashboard_open {
            return Err(ExposureError::OpenDashboard(listen));
        }
        if transport == Transport::Plain {
            return Err(ExposureError::Cleartext(listen));
        }
    }
    Ok(transport)
}

/// A TLS acceptor with the certificate chain in `cert` and the private key
/// in `key` (PEM files), for HTTP/1.1 (the only protocol served).
pub fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading the TLS certificate {}", cert.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "{} holds no certificate (a PEM `BEGIN CERTIFICATE` block: the server's, then any \
         intermediate CA's)",
        cert.display()
    );
    let private = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the TLS private key {} (PEM)", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("setting up TLS")?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .with_context(|| {
            format!(
                "the key in {} does not fit the certificate in {}",
                key.display(),
                cert.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("a valid address")
    }

    #[test]
    fn loopback_may_be_plain_and_open() {
        for a in ["127.0.0.1:8470", "[::1]:8470", "[::ffff:127.0.0.1]:0"] {
            assert_eq!(
                transport_for(addr(a), false, false, true),
                Ok(Transport::Plain),
                "{a}"
            );
        }
    }

    #[test]
    fn other_addresses_need_tls_or_a_proxy() {
        for a in ["0.0.0.0:8470", "[::]:8470", "10.0.0.5:8470"] {
            let a = addr(a);
            assert_eq!(
                transport_for(a, false, false, false),
                Err(ExposureError::Cleartext(a))
            );
            assert_eq!(transport_for(a, true, false, false), Ok(Transport::Tls));
            assert_eq!(transport_for(a, false, true, false), Ok(Transport::Proxy));
            assert_eq!(transport_for(a, true, true, false), Ok(Transport::Tls));
        }
    }

    #[test]
    fn an_open_dashboard_stays_on_loopback_whatever_the_transport() {
        let a = addr("0.0.0.0:8470");
        for (tls, proxy) in [(false, false), (true, false), (false, true)] {
            assert_eq!(
                transport_for(a, tls, proxy, true),
                Err(ExposureError::OpenDashboard(a))
            );
        }
    }

    #[test]
    fn the_refusal_says_what_to_do() {
        let text = ExposureError::Cleartext(addr("0.0.0.0:8470")).to_string();
        for flag in ["--tls-cert", "--tls-key", "--behind-tls-proxy", "127.0.0.1"] {
            assert!(text.contains(flag), "{text}");
        }
    }
}
