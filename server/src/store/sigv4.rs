//! AWS Signature Version 4 by query string (S3 API reference,
//! "Authenticating Requests: Using Query Parameters") for URLs that carry
//! query parameters of their own and headers besides `host`: object_store
//! 0.12's `Signer::signed_url` signs a bare object URL and `host` alone, so
//! it cannot make an UploadPart URL (`partNumber`, `uploadId`) whose part
//! checksum the store enforces.

use std::time::Duration;

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The payload is not signed: the agent sends it after the URL is made.
const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";
const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// Who signs: an access key and, for temporary credentials, a session
/// token (which then travels in the URL).
pub struct Credentials<'a> {
    pub key_id: &'a str,
    pub secret_key: &'a str,
    pub token: Option<&'a str>,
}

/// What the URL is for.
pub struct Request<'a> {
    pub method: &'a str,
    /// Scheme, host and path (percent-encoded once, as S3 signs it), and
    /// any query of its own.
    pub url: &'a url::Url,
    /// Query parameters to add to the URL's own (`partNumber`, `uploadId`).
    pub query: &'a [(&'a str, &'a str)],
    /// Headers besides `host` that the request must then carry with
    /// exactly these values; names in lower case.
    pub headers: &'a [(&'a str, &'a str)],
}

/// `req.url` with the parameters of `req.query` and those of a SigV4
/// presigned URL for the S3 service in `region`, signed at `date`, valid
/// for `expires`.
pub fn presign(
    req: &Request<'_>,
    credentials: &Credentials<'_>,
    region: &str,
    date: DateTime<Utc>,
    expires: Duration,
) -> url::Url {
    let stamp = date.format("%Y%m%dT%H%M%SZ").to_string();
    let day = date.format("%Y%m%d").to_string();
    let scope = format!("{day}/{region}/s3/aws4_request");

    let mut headers: Vec<(String, String)> = vec![("host".into(), host(req.url))];
    headers.extend(
        req.headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string())),
    );
    headers.sort();
    let signed_headers = headers
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();

    let mut url = req.url.clone();
    {
        let mut q = url.query_pairs_mut();
        for (k, v) in req.query {
            q.append_pair(k, v);
        }
        q.append_pair("X-Amz-Algorithm", ALGORITHM)
            .append_pair(
                "X-Amz-Credential",
                &format!("{}/{scope}", credentials.key_id),
            )
            .append_pair("X-Amz-Date", &stamp)
            .append_pair("X-Amz-Expires", &expires.as_secs().to_string())
            .append_pair("X-Amz-SignedHeaders", &signed_headers);
        if let Some(token) = credentials.token {
            q.append_pair("X-Amz-Security-Token", token);
        }
    }
    // Every parameter but the signature, each name and value encoded and
    // the pairs sorted (by name, then value).
    let mut pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| (uri_encode(&k), uri_encode(&v)))
        .collect();
    pairs.sort();
    let canonical_query = pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");

    // S3 signs the path as sent, encoded once (other services twice).
    let canonical_request = format!(
        "{}\n{}\n{canonical_query}\n{canonical_headers}\n{signed_headers}\n{UNSIGNED_PAYLOAD}",
        req.method,
        url.path(),
    );
    let string_to_sign = format!(
        "{ALGORITHM}\n{stamp}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical_request.as_bytes()))
    );
    let key = [day.as_str(), region, "s3", "aws4_request"].iter().fold(
        format!("AWS4{}", credentials.secret_key).into_bytes(),
        |key, part| hmac(&key, part.as_bytes()),
    );
    let signature = hex::encode(hmac(&key, string_to_sign.as_bytes()));
    url.query_pairs_mut()
        .append_pair("X-Amz-Signature", &signature);
    url
}

/// The `host` header a client sends to `url`: the port only when it is
/// not the scheme's default.
fn host(url: &url::Url) -> String {
    url[url::Position::BeforeHost..url::Position::AfterPort].to_string()
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// SigV4's URI encoding: every byte but `A-Z a-z 0-9 - . _ ~` as `%XX`.
fn uri_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use object_store::signer::Signer;

    /// The credentials of AWS's own examples.
    const EXAMPLE: Credentials<'static> = Credentials {
        key_id: "AKIAIOSFODNN7EXAMPLE",
        secret_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        token: None,
    };

    fn param(url: &url::Url, name: &str) -> String {
        url.query_pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
            .unwrap_or_else(|| panic!("no {name} in {url}"))
    }

    /// `url` without the parameters of its signature.
    fn unsigned(url: &url::Url) -> url::Url {
        let mut bare = url.clone();
        bare.set_query(None);
        for (k, v) in url.query_pairs() {
            if !k.starts_with("X-Amz-") {
                bare.query_pairs_mut().append_pair(&k, &v);
            }
        }
        bare
    }

    /// AWS's worked example of a presigned URL (S3 API reference,
    /// "Authenticating Requests: Using Query Parameters"): GET /test.txt
    /// of `examplebucket` in us-east-1 at 20130524T000000Z for 86400 s.
    #[test]
    fn signs_aws_documented_example() {
        let url: url::Url = "https://examplebucket.s3.amazonaws.com/test.txt"
            .parse()
            .unwrap();
        let signed = presign(
            &Request {
                method: "GET",
                url: &url,
                query: &[],
                headers: &[],
            },
            &EXAMPLE,
            "us-east-1",
            Utc.with_ymd_and_hms(2013, 5, 24, 0, 0, 0).unwrap(),
            Duration::from_secs(86400),
        );
        assert_eq!(
            param(&signed, "X-Amz-Signature"),
            "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
        );
    }

    /// With no query and no header of its own, the URL object_store's
    /// `signed_url` makes for the same key, date and expiry: virtual-host
    /// and path style, a key that needs encoding, a session token.
    #[tokio::test]
    async fn matches_object_store_for_a_plain_object_url() {
        for (endpoint, token) in [
            (None, None),
            (Some("http://127.0.0.1:9000"), Some("SESSION/TOKEN+1")),
        ] {
            let mut b = object_store::aws::AmazonS3Builder::new()
                .with_bucket_name("results")
                .with_region("eu-west-2")
                .with_access_key_id(EXAMPLE.key_id)
                .with_secret_access_key(EXAMPLE.secret_key);
            if let Some(e) = endpoint {
                b = b.with_endpoint(e).with_allow_http(true);
            }
            if let Some(t) = token {
                b = b.with_token(t);
            }
            let s3 = b.build().unwrap();
            let path = object_store::path::Path::from("fleet a/jobs/1/out+put=.bin");
            for method in [reqwest::Method::GET, reqwest::Method::PUT] {
                let theirs = s3
                    .signed_url(method.clone(), &path, Duration::from_secs(900))
                    .await
                    .unwrap();
                let date = chrono::NaiveDateTime::parse_from_str(
                    &param(&theirs, "X-Amz-Date"),
                    "%Y%m%dT%H%M%SZ",
                )
                .unwrap()
                .and_utc();
                let bare = unsigned(&theirs);
                let ours = presign(
                    &Request {
                        method: method.as_str(),
                        url: &bare,
                        query: &[],
                        headers: &[],
                    },
                    &Credentials { token, ..EXAMPLE },
                    "eu-west-2",
                    date,
                    Duration::from_secs(900),
                );
                assert_eq!(
                    param(&ours, "X-Amz-Signature"),
                    param(&theirs, "X-Amz-Signature"),
                    "{method} {theirs}"
                );
                let sorted = |u: &url::Url| {
                    let mut v: Vec<_> = u.query_pairs().into_owned().collect();
                    v.sort();
                    v
                };
                assert_eq!(sorted(&ours), sorted(&theirs));
            }
        }
    }

    /// An UploadPart URL with the part's checksum as a signed header, path
    /// style on an endpoint with a port, with a session token, against the
    /// URL botocore 1.x's `S3SigV4QueryAuth` makes for the same request
    /// (the signer the AWS CLI and boto3 use; it reproduces the example
    /// above), with the clock fixed at 20130524T000000Z:
    ///
    /// ```python
    /// A.get_current_datetime = lambda: datetime.datetime(2013, 5, 24)
    /// req = AWSRequest(method="PUT", url=URL, headers={"x-amz-checksum-sha256": SUM})
    /// A.S3SigV4QueryAuth(Credentials(KEY, SECRET, "SESSION/TOKEN+1"), "s3",
    ///                    "eu-west-2", expires=900).add_auth(req)
    /// ```
    #[test]
    fn matches_botocore_for_an_upload_part_with_a_signed_checksum() {
        let url: url::Url = "http://127.0.0.1:9000/results/fleet-a/jobs/x%20y/1/out.bin"
            .parse()
            .unwrap();
        let signed = presign(
            &Request {
                method: "PUT",
                url: &url,
                query: &[("partNumber", "3"), ("uploadId", "abc+def=")],
                headers: &[(
                    "x-amz-checksum-sha256",
                    "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=",
                )],
            },
            &Credentials {
                token: Some("SESSION/TOKEN+1"),
                ..EXAMPLE
            },
            "eu-west-2",
            Utc.with_ymd_and_hms(2013, 5, 24, 0, 0, 0).unwrap(),
            Duration::from_secs(900),
        );
        assert_eq!(
            param(&signed, "X-Amz-SignedHeaders"),
            "host;x-amz-checksum-sha256"
        );
        assert_eq!(param(&signed, "uploadId"), "abc+def=");
        assert_eq!(
            param(&signed, "X-Amz-Signature"),
            "9e2d371c264066df3a1e7248f60d931fddc0bcb0a34f46538e8f5543beb1ce8e"
        );
        // And a HEAD that asks for the object's checksums (botocore, the
        // same way, no token, us-east-1, 60 s).
        let url: url::Url = "http://127.0.0.1:9000/results/k".parse().unwrap();
        let signed = presign(
            &Request {
                method: "HEAD",
                url: &url,
                query: &[],
                headers: &[("x-amz-checksum-mode", "ENABLED")],
            },
            &EXAMPLE,
            "us-east-1",
            Utc.with_ymd_and_hms(2013, 5, 24, 0, 0, 0).unwrap(),
            Duration::from_secs(60),
        );
        assert_eq!(
            param(&signed, "X-Amz-Signature"),
            "c94dad2a470b148b3bf32294cc3b073e128624bff45848746a9b797b01793c08"
        );
    }
}
