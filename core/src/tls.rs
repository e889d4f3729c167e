//! What an agent or the CLI says when it cannot reach the server: the whole
//! chain of causes (an HTTP client's top error, "error sending request",
//! hides the one that matters) and, for a TLS failure, what to do about it.
//!
//! Both clients trust the public web roots plus the CA given with
//! `--ca-file` (`FLOTILLA_CA_FILE`); the advice below names that flag.

use std::error::Error;

/// Why a TLS connection to the server failed, as far as the client can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFailure {
    /// The server's certificate chains to no CA this client trusts: a
    /// self-signed certificate or a private CA not given with `--ca-file`,
    /// or the wrong file given.
    UntrustedIssuer,
    /// The certificate is valid but made for another host name.
    WrongName,
    /// The certificate has expired or is not valid yet.
    OutsideDates,
    /// Some other certificate problem (revoked, wrong usage, malformed).
    BadCertificate,
    /// The server answered the TLS handshake with something that is not
    /// TLS: it serves plain HTTP on that port.
    NotTls,
    /// A plain-HTTP request got no HTTP answer: the server may serve HTTPS
    /// on that port.
    MaybeTls,
}

impl TlsFailure {
    /// What the person running the client should do.
    pub fn advice(self) -> &'static str {
        match self {
            TlsFailure::UntrustedIssuer => {
                "the server's TLS certificate is not signed by a CA this client trusts. If the \
                 server uses a self-signed certificate or a private CA, give that CA's certificate \
                 (PEM) with --ca-file (or FLOTILLA_CA_FILE); if you gave one, it is not the CA \
                 that signed the server's certificate"
            }
            TlsFailure::WrongName => {
                "the server's TLS certificate is not made for the host name in the server URL; \
                 use the name the certificate names, or remake the certificate with this name \
                 among its subject alternative names"
            }
            TlsFailure::OutsideDates => {
                "the server's TLS certificate has expired or is not valid yet; renew it, or check \
                 this machine's clock"
            }
            TlsFailure::BadCertificate => {
                "the server's TLS certificate was refused; check it with \
                 `openssl s_client -connect HOST:PORT -CAfile CA.pem`"
            }
            TlsFailure::NotTls => {
                "the server does not speak TLS on that port: use an http:// URL, or start the \
                 server with --tls-cert and --tls-key"
            }
            TlsFailure::MaybeTls => {
                "the server gave no HTTP answer; if it serves HTTPS (--tls-cert), the URL must \
                 start with https://"
            }
        }
    }
}

/// `err` and every cause under it, joined by ": " (a cause that repeats
/// the message above it is left out).
pub fn chain(err: &(dyn Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.last().is_some_and(|last| last.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

/// The TLS failure a chain of causes (as [`chain`] writes it) shows, for a
/// request to `url`. rustls names certificate errors by their variant
/// (`invalid peer certificate: UnknownIssuer`), which is what is matched.
pub fn classify(chain: &str, url: &str) -> Option<TlsFailure> {
    let text = chain.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
    if has(&[
        "unknownissuer",
        "unknown issuer",
        "selfsigned",
        "self-signed",
    ]) {
        Some(TlsFailure::UntrustedIssuer)
    } else if has(&["notvalidforname", "not valid for name"]) {
        Some(TlsFailure::WrongName)
    } else if has(&["expired", "notvalidyet", "not valid yet"]) {
        Some(TlsFailure::OutsideDates)
    } else if has(&["invalid peer certificate", "certificate verify failed"]) {
        Some(TlsFailure::BadCertificate)
    } else if has(&["invalidcontenttype", "corrupt message"]) {
        Some(TlsFailure::NotTls)
    } else if url.starts_with("http://")
        && has(&[
            "connection closed before message completed",
            "invalid http version",
        ])
    {
        Some(TlsFailure::MaybeTls)
    } else {
        None
    }
}

/// [`chain`] of `err`, with the advice for a TLS failure after it.
pub fn explain(err: &(dyn Error + 'static), url: &str) -> String {
    let chain = chain(err);
    match classify(&chain, url) {
        Some(failure) => format!("{chain}; {}", failure.advice()),
        None => chain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn Error + 'static))
        }
    }

    /// The shape of reqwest's error for a server whose CA is unknown.
    fn unknown_issuer() -> Layer {
        Layer(
            "error sending request for url (https://flotilla:8470/api/v1/jobs)",
            Some(Box::new(Layer(
                "client error (Connect)",
                Some(Box::new(Layer(
                    "invalid peer certificate: UnknownIssuer",
                    None,
                ))),
            ))),
        )
    }

    #[test]
    fn the_chain_shows_the_cause_and_the_advice_names_the_flag() {
        let e = unknown_issuer();
        let text = explain(&e, "https://flotilla:8470");
        assert!(text.starts_with(
            "error sending request for url (https://flotilla:8470/api/v1/jobs): \
             client error (Connect): invalid peer certificate: UnknownIssuer; "
        ));
        assert!(text.contains("--ca-file"), "{text}");
    }

    #[test]
    fn certificate_failures_are_told_apart() {
        let url = "https://h:1";
        let cases = [
            (
                "invalid peer certificate: UnknownIssuer",
                TlsFailure::UntrustedIssuer,
            ),
            (
                "invalid peer certificate: NotValidForNameContext { expected: DnsName(\"h\") }",
                TlsFailure::WrongName,
            ),
            (
                "invalid peer certificate: Expired",
                TlsFailure::OutsideDates,
            ),
            (
                "invalid peer certificate: InvalidPurpose",
                TlsFailure::BadCertificate,
            ),
            (
                "received corrupt message of type InvalidContentType",
                TlsFailure::NotTls,
            ),
        ];
        for (chain, want) in cases {
            assert_eq!(classify(chain, url), Some(want), "{chain}");
        }
        assert_eq!(
            classify("connection closed before message completed", "http://h:1"),
            Some(TlsFailure::MaybeTls)
        );
        assert_eq!(classify("Connection refused (os error 111)", url), None);
    }

    #[test]
    fn a_repeated_message_is_written_once() {
        let e = Layer(
            "tcp connect error: Connection refused",
            Some(Box::new(Layer("Connection refused", None))),
        );
        assert_eq!(chain(&e), "tcp connect error: Connection refused");
    }
}
