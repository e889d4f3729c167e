//! An output uploaded to the object store itself, in parts to presigned URLs the server hands out.
//!
//! The agent asks the server for terms (the part size, or none: then the
//! output goes to the server as before), hashes the file whole and per part
//! in one pass, has the server open a multipart upload with one URL per
//! part (each part's sha256 signed in), `PUT`s the parts without the
//! server's token, a few at once, each retried a few times, and asks the
//! server to complete the upload, which it records only if the store holds
//! what was declared. On a failure after the upload was opened it asks the
//! server to abort it, so that the store drops the parts.

use std::path::Path;
use std::time::Duration;

use flotilla_core::api::OutputView;
use flotilla_core::protocol::{
    paths, Ack, LeaseRef, OutputUpload, OutputUploadAbort, OutputUploadAsk, OutputUploadComplete,
    OutputUploadStart, OutputUploadTerms, PartUrl, UploadedPart,
};

use super::{watched_body, CallError, ServerApi, Watch};
use crate::backoff::Backoff;

/// Parts in flight at once: enough to keep a link to the store busy while
/// one part waits on its answer, few enough that a fleet of agents opens
/// few connections each (a tile's ~160 MB output is three 64 MiB parts).
const PARALLEL_PARTS: usize = 4;
/// Tries per part before the upload fails (a part is idempotent: sending
/// it again replaces it).
const PART_TRIES: u32 = 3;

/// The file's size and sha256, and each part's sha256, in lower-case hex.
struct FileSums {
    size: u64,
    sha256: String,
    parts: Vec<String>,
}

impl ServerApi {
    /// The part size the server offers for a direct upload of `name`,
    /// `None` when it takes the output only itself (including a server
    /// that predates direct uploads and has no such route). Refused as the
    /// upload would be: the lease gone, an undeclared output.
    pub(super) async fn direct_terms(
        &self,
        lease: LeaseRef,
        name: &str,
        size: u64,
    ) -> Result<Option<u64>, CallError> {
        let ask = OutputUploadAsk {
            lease_token: lease.lease_token,
            name: name.to_string(),
            size,
        };
        let path = paths::job(lease.job_id, "output-uploads/terms");
        match self
            .json_within(&path, &ask, &format!("uploading {name}"))
            .await
        {
            Ok(OutputUploadTerms { part_size }) => Ok(part_size),
            Err(CallError::Refused {
                status: 404 | 405,
                message,
                ..
            }) if message.contains("no such route") || message.contains("does not take") => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Uploads `file` (`len` bytes) to the store in parts of `part_size`.
    pub(super) async fn upload_direct(
        &self,
        lease: LeaseRef,
        name: &str,
        file: &Path,
        len: u64,
        part_size: u64,
    ) -> Result<OutputView, CallError> {
        let started = tokio::time::Instant::now();
        let deadline = started + self.transfer.total(Some(len));
        let sums = {
            let file = file.to_path_buf();
            tokio::task::spawn_blocking(move || hash_file(&file, part_size))
                .await
                .map_err(|e| {
                    CallError::Unreachable(format!("hashing {name}: the task failed: {e}"))
                })?
        }
        .map_err(|source| CallError::Local {
            what: "cannot read",
            path: file.to_path_buf(),
            source,
        })?;
        if sums.size != len {
            return Err(CallError::Unreachable(format!(
                "uploading {name}: the file changed while it was read ({len} bytes, then {})",
                sums.size
            )));
        }
        let start = OutputUploadStart {
            lease_token: lease.lease_token,
            name: name.to_string(),
            size: sums.size,
            sha256: sums.sha256.clone(),
            part_size,
            part_sha256: sums.parts.clone(),
        };
        let path = paths::job(lease.job_id, "output-uploads");
        let upload: OutputUpload = self
            .json_within(&path, &start, &format!("uploading {name}"))
            .await?;
        if upload.parts.len() != sums.parts.len() {
            let e = CallError::Refused {
                status: 200,
                code: "bad_answer".into(),
                message: format!(
                    "uploading {name}: the server gave {} part URLs for {} parts",
                    upload.parts.len(),
                    sums.parts.len()
                ),
            };
            self.abort_direct(lease, name, &upload.upload_id).await;
            return Err(e);
        }
        match self
            .complete_direct(lease, name, file, &sums, &upload, started, deadline)
            .await
        {
            Ok(view) => Ok(view),
            Err(e) => {
                self.abort_direct(lease, name, &upload.upload_id).await;
                Err(e)
            }
        }
    }

    /// PUTs every part, then has the server complete the upload.
    #[allow(clippy::too_many_arguments)]
    async fn complete_direct(
        &self,
        lease: LeaseRef,
        name: &str,
        file: &Path,
        sums: &FileSums,
        upload: &OutputUpload,
        started: tokio::time::Instant,
        deadline: tokio::time::Instant,
    ) -> Result<OutputView, CallError> {
        use futures::{StreamExt, TryStreamExt};
        let of = upload.parts.len();
        // Made here, run below a few at a time (an async fn does nothing
        // until polled).
        let puts: Vec<_> = upload
            .parts
            .iter()
            .enumerate()
            .map(|(i, part)| {
                let offset = i as u64 * upload.part_size;
                let part_len = upload.part_size.min(sums.size - offset);
                let watch = Watch {
                    what: format!("uploading {name}: part {} of {of}", i + 1),
                    peer: "the store",
                    len: Some(part_len),
                    started,
                    deadline,
                };
                self.put_part(part, file, offset, watch)
            })
            .collect();
        let etags: Vec<String> = futures::stream::iter(puts)
            .buffered(PARALLEL_PARTS)
            .try_collect()
            .await?;
        let complete = OutputUploadComplete {
            lease_token: lease.lease_token,
            name: name.to_string(),
            upload_id: upload.upload_id.clone(),
            size: sums.size,
            sha256: sums.sha256.clone(),
            parts: upload
                .parts
                .iter()
                .zip(etags)
                .zip(&sums.parts)
                .map(|((p, etag), sha256)| UploadedPart {
                    number: p.number,
                    etag,
                    sha256: sha256.clone(),
                })
                .collect(),
        };
        let path = paths::job(lease.job_id, "output-uploads/complete");
        // The store may take minutes to assemble a big upload (S3 API
        // reference, CompleteMultipartUpload), so this waits as long as
        // a transfer's base allowance.
        self.once(&path, &complete, self.transfer.base)
            .await
            .map_err(|e| named(name, "completing the upload", e))
    }

    /// One part to its URL, tried up to [`PART_TRIES`] times while the
    /// store is unreachable or failing; its ETag.
    async fn put_part(
        &self,
        part: &PartUrl,
        file: &Path,
        offset: u64,
        watch: Watch,
    ) -> Result<String, CallError> {
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
        let mut tries = 1;
        loop {
            match self.put_part_once(part, file, offset, &watch).await {
                Err(CallError::Unreachable(why))
                    if tries < PART_TRIES && tokio::time::Instant::now() < watch.deadline =>
                {
                    tracing::warn!(what = %watch.what, %why, tries, "retrying a part");
                    tokio::time::sleep(backoff.next_delay()).await;
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    async fn put_part_once(
        &self,
        part: &PartUrl,
        file: &Path,
        offset: u64,
        watch: &Watch,
    ) -> Result<String, CallError> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let len = watch.len.expect("a part's length is known");
        let local = |source| CallError::Local {
            what: "cannot read",
            path: file.to_path_buf(),
            source,
        };
        let mut f = tokio::fs::File::open(file).await.map_err(local)?;
        f.seek(std::io::SeekFrom::Start(offset))
            .await
            .map_err(local)?;
        let (body, progress) = watched_body(f.take(len));
        let mut req = self
            .store
            .put(&part.url)
            .header(reqwest::header::CONTENT_LENGTH, len)
            .body(body);
        for (k, v) in &part.headers {
            req = req.header(k, v);
        }
        let send = async {
            let resp = req
                .send()
                .await
                .map_err(|e| CallError::Unreachable(format!("{}: {e}", watch.what)))?;
            let status = resp.status();
            let etag = resp
                .headers()
                .get(reqwest::header::ETAG)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let mut body = resp.text().await.unwrap_or_default();
            // The store's error document; its first lines say what.
            flotilla_core::text::truncate_on_char_boundary(&mut body, 512);
            let said = || format!("{}: the store answered {status}: {body}", watch.what);
            if status.is_server_error() {
                return Err(CallError::Unreachable(said()));
            }
            if !status.is_success() {
                return Err(CallError::Refused {
                    status: status.as_u16(),
                    code: "store_refused".into(),
                    message: said(),
                });
            }
            etag.ok_or_else(|| CallError::Refused {
                status: status.as_u16(),
                code: "bad_answer".into(),
                message: format!("{}: the store answered no ETag", watch.what),
            })
        };
        self.watched(send, &progress, watch).await
    }

    /// Asks the server to abort the upload; one try, since the store also
    /// drops an upload left open (given a lifecycle rule) and the job's
    /// next attempt uploads under another key anyway.
    async fn abort_direct(&self, lease: LeaseRef, name: &str, upload_id: &str) {
        let abort = OutputUploadAbort {
            lease_token: lease.lease_token,
            name: name.to_string(),
            upload_id: upload_id.to_string(),
        };
        let path = paths::job(lease.job_id, "output-uploads/abort");
        if let Err(e) = self
            .json_within::<_, Ack>(&path, &abort, &format!("aborting the upload of {name}"))
            .await
        {
            tracing::warn!(%name, %upload_id, error = %e, "could not abort a direct upload");
        }
    }

    /// One JSON call that must be answered within [`TransferLimits::stall`]
    /// (the server answers these within milliseconds when it is well).
    async fn json_within<B: serde::Serialize, T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        what: &str,
    ) -> Result<T, CallError> {
        let stall = self.transfer.stall;
        match tokio::time::timeout(stall, self.once(path, body, stall * 2)).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Unreachable(format!(
                "{what}: stalled, the server did not answer for {}s",
                stall.as_secs()
            ))),
        }
    }
}

/// `e` with the output and the step that failed in its message.
fn named(name: &str, step: &str, e: CallError) -> CallError {
    match e {
        CallError::Refused {
            status,
            code,
            message,
        } => CallError::Refused {
            status,
            code,
            message: format!("uploading {name}: {step}: {message}"),
        },
        CallError::Unreachable(why) => {
            CallError::Unreachable(format!("uploading {name}: {step}: {why}"))
        }
        other => other,
    }
}

/// Reads `path` once: its size and sha256, and the sha256 of each
/// `part_size` piece of it.
fn hash_file(path: &Path, part_size: u64) -> std::io::Result<FileSums> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut whole, mut part) = (Sha256::new(), Sha256::new());
    let (mut size, mut in_part) = (0u64, 0u64);
    let mut parts = Vec::new();
    loop {
        let want = (part_size - in_part).min(buf.len() as u64) as usize;
        let n = match f.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        whole.update(&buf[..n]);
        part.update(&buf[..n]);
        size += n as u64;
        in_part += n as u64;
        if in_part == part_size {
            parts.push(hex::encode(std::mem::take(&mut part).finalize()));
            in_part = 0;
        }
    }
    if in_part > 0 {
        parts.push(hex::encode(part.finalize()));
    }
    Ok(FileSums {
        size,
        sha256: hex::encode(whole.finalize()),
        parts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server_api::TransferLimits;
    use sha2::{Digest, Sha256};
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What the stub store does with a part's PUT.
    #[derive(Clone, Copy, PartialEq)]
    enum Part {
        /// Takes it, answering an ETag.
        Take,
        /// 403, as a store does to an expired URL.
        Refuse,
        /// Reads nothing of it.
        Stall,
    }

    /// One request the stub saw: method, path, headers (lower-case names),
    /// body (unread for a stalled part).
    type Seen = (String, String, Vec<(String, String)>, Vec<u8>);

    /// A stub of the server and the store in one, on loopback: answers the
    /// direct-upload calls (parts of `part_size`, each URL back to itself)
    /// and treats part PUTs as `part` says; its URL and what it saw.
    async fn stub(part_size: u64, part: Part) -> (String, Arc<Mutex<Vec<Seen>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (url, log) = (base.clone(), seen.clone());
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = listener.accept().await.unwrap();
                let (url, log) = (url.clone(), log.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    while !head.ends_with(b"\r\n\r\n") {
                        let mut b = [0u8; 1];
                        if conn.read(&mut b).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(b[0]);
                    }
                    let head = String::from_utf8(head).unwrap();
                    let mut lines = head.lines();
                    let first: Vec<&str> = lines.next().unwrap().split(' ').collect();
                    let (method, path) = (first[0].to_string(), first[1].to_string());
                    let headers: Vec<(String, String)> = lines
                        .filter_map(|l| l.split_once(": "))
                        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
                        .collect();
                    let len: usize = headers
                        .iter()
                        .find(|(k, _)| k == "content-length")
                        .map_or(0, |(_, v)| v.parse().unwrap());
                    let is_part = path.starts_with("/part/");
                    if is_part && part == Part::Stall {
                        log.lock()
                            .unwrap()
                            .push((method, path, headers, Vec::new()));
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        return;
                    }
                    let mut body = vec![0u8; len];
                    conn.read_exact(&mut body).await.unwrap();
                    let (status, extra, reply) = if is_part && part == Part::Refuse {
                        (
                            "403 Forbidden",
                            String::new(),
                            "<Error>expired</Error>".to_string(),
                        )
                    } else if is_part {
                        let etag = format!("ETag: \"{}\"\r\n", &path[6..]);
                        ("200 OK", etag, String::new())
                    } else if path.ends_with("/output-uploads/terms") {
                        (
                            "200 OK",
                            String::new(),
                            format!(r#"{{"part_size":{part_size}}}"#),
                        )
                    } else if path.ends_with("/output-uploads") {
                        let start: OutputUploadStart = serde_json::from_slice(&body).unwrap();
                        let parts: Vec<_> = (1..=start.part_sha256.len())
                            .map(|n| serde_json::json!({"number": n, "url": format!("{url}/part/{n}"),
                                                        "headers": {"x-amz-checksum-sha256": format!("sum{n}")}}))
                            .collect();
                        let up = serde_json::json!({"upload_id": "u1", "part_size": part_size,
                                                    "parts": parts, "expires_in_s": 900});
                        ("200 OK", String::new(), up.to_string())
                    } else if path.ends_with("/output-uploads/complete") {
                        let c: OutputUploadComplete = serde_json::from_slice(&body).unwrap();
                        let view = serde_json::json!({"name": c.name, "key": "k", "size": c.size,
                                                      "sha256": c.sha256});
                        ("200 OK", String::new(), view.to_string())
                    } else {
                        ("200 OK", String::new(), r#"{"ok":true}"#.to_string())
                    };
                    log.lock().unwrap().push((method, path, headers, body));
                    let answer = format!(
                        "HTTP/1.1 {status}\r\n{extra}Content-Type: application/json\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                        reply.len()
                    );
                    let _ = conn.write_all(answer.as_bytes()).await;
                });
            }
        });
        (base, seen)
    }

    fn lease() -> LeaseRef {
        LeaseRef {
            job_id: uuid::Uuid::new_v4(),
            lease_token: uuid::Uuid::new_v4(),
        }
    }

    fn api(url: &str) -> ServerApi {
        ServerApi::new(url, "secret-token")
            .unwrap()
            .with_transfer_limits(TransferLimits {
                stall: Duration::from_millis(300),
                ..TransferLimits::default()
            })
    }

    fn paths(seen: &Mutex<Vec<Seen>>) -> Vec<String> {
        let seen = seen.lock().unwrap();
        let mut p: Vec<String> = seen
            .iter()
            .map(|(m, p, _, _)| {
                let tail = p.rsplit_once("/jobs/").map_or(p.as_str(), |(_, t)| t);
                let tail = tail.split_once('/').map_or(tail, |(_, a)| a);
                format!("{m} {tail}")
            })
            .collect();
        p.sort();
        p
    }

    /// Parts go to their URLs with their signed headers and none of the
    /// server's (token, instance), and come back together: the complete
    /// call lists each part's ETag and sha256 in order.
    #[tokio::test]
    async fn a_direct_upload_puts_each_part_to_its_url_without_the_token() {
        let (url, seen) = stub(1000, Part::Take).await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("out.bin");
        let data: Vec<u8> = (0..2500u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&file, &data).unwrap();
        let view = api(&url).upload(lease(), "out.bin", &file).await.unwrap();
        assert_eq!(view.size, 2500);
        assert_eq!(view.sha256, hex::encode(Sha256::digest(&data)));
        let seen = seen.lock().unwrap();
        let mut parts: Vec<_> = seen.iter().filter(|s| s.1.starts_with("/part/")).collect();
        parts.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(parts.len(), 3);
        for (i, (method, path, headers, body)) in parts.iter().enumerate() {
            assert_eq!(
                (method.as_str(), path.as_str()),
                ("PUT", &*format!("/part/{}", i + 1))
            );
            let start = i * 1000;
            assert_eq!(body.as_slice(), &data[start..(start + 1000).min(2500)]);
            let has = |k: &str| {
                headers
                    .iter()
                    .find(|(h, _)| h == k)
                    .map(|(_, v)| v.as_str())
            };
            assert_eq!(
                has("x-amz-checksum-sha256"),
                Some(&*format!("sum{}", i + 1))
            );
            assert_eq!(has("authorization"), None, "no token to the store");
            assert_eq!(has(flotilla_core::protocol::INSTANCE_HEADER), None);
        }
        let complete = seen
            .iter()
            .find(|s| s.1.ends_with("/output-uploads/complete"))
            .unwrap();
        let c: OutputUploadComplete = serde_json::from_slice(&complete.3).unwrap();
        let etags: Vec<_> = c.parts.iter().map(|p| p.etag.as_str()).collect();
        assert_eq!(etags, ["\"1\"", "\"2\"", "\"3\""]);
        let sums: Vec<_> = c.parts.iter().map(|p| p.sha256.clone()).collect();
        let want: Vec<_> = data
            .chunks(1000)
            .map(|c| hex::encode(Sha256::digest(c)))
            .collect();
        assert_eq!(sums, want);
    }

    /// A part the store refuses fails the upload at once (no retry: it
    /// would be refused again), naming the output and the part; the upload
    /// is aborted.
    #[tokio::test]
    async fn a_refused_part_fails_the_upload_and_aborts_it() {
        let (url, seen) = stub(1 << 20, Part::Refuse).await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("out.bin");
        std::fs::write(&file, vec![1u8; 100]).unwrap();
        let e = api(&url)
            .upload(lease(), "out.bin", &file)
            .await
            .unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, CallError::Refused { status: 403, .. }), "{e:?}");
        assert!(
            msg.contains("out.bin") && msg.contains("part 1 of 1"),
            "{msg}"
        );
        assert!(!e.lease_gone(), "the store's 403 is not the lease's");
        assert_eq!(
            paths(&seen),
            [
                "POST output-uploads",
                "POST output-uploads/abort",
                "POST output-uploads/terms",
                "PUT part/1"
            ]
        );
    }

    /// A part the store stops taking fails within the stall limit, each of
    /// its tries; the upload is aborted.
    #[tokio::test]
    async fn a_stalled_part_fails_after_its_tries_and_aborts_the_upload() {
        // More than loopback's socket buffers take without a reader.
        let (url, seen) = stub(64 << 20, Part::Stall).await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("out.bin");
        std::fs::write(&file, vec![7u8; 64 << 20]).unwrap();
        let start = std::time::Instant::now();
        let e = api(&url)
            .upload(lease(), "out.bin", &file)
            .await
            .unwrap_err();
        let took = start.elapsed();
        assert!(matches!(e, CallError::Unreachable(_)), "retryable: {e:?}");
        assert!(e.to_string().contains("part 1 of 1: stalled"), "{e}");
        // Three tries of 0.3 s and back-offs of 0.5 and 1 s between.
        assert!(took < Duration::from_secs(10), "took {took:?}");
        let p = paths(&seen);
        assert_eq!(
            p.iter().filter(|p| p.starts_with("PUT")).count(),
            PART_TRIES as usize
        );
        assert!(
            p.contains(&"POST output-uploads/abort".to_string()),
            "{p:?}"
        );
    }

    #[test]
    fn hashes_whole_and_per_part_in_one_pass() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..(3 << 20) + 17).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let part = 1 << 20;
        let sums = hash_file(&path, part).unwrap();
        assert_eq!(sums.size, data.len() as u64);
        assert_eq!(sums.sha256, hex::encode(Sha256::digest(&data)));
        let want: Vec<String> = data
            .chunks(part as usize)
            .map(|c| hex::encode(Sha256::digest(c)))
            .collect();
        assert_eq!(sums.parts, want);
        assert_eq!(sums.parts.len(), 4);
        // A file of exactly two parts has two, not a third empty one.
        std::fs::write(&path, &data[..2 << 20]).unwrap();
        assert_eq!(hash_file(&path, part).unwrap().parts.len(), 2);
    }
}
