//! The object store results go to: a local directory by default, S3 (or any
//! S3-compatible service) with `s3://bucket/prefix`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;

pub mod direct_upload;
mod sigv4;
pub mod sweep;

/// Opens `spec`: `s3://bucket[/prefix]` (credentials, region and a custom
/// endpoint from the usual `AWS_*` variables, e.g. `AWS_ENDPOINT_URL`,
/// `AWS_ALLOW_HTTP=true` for a local S3-compatible server), `file:///dir`,
/// or a plain directory path (made if missing).
pub fn open(spec: &str) -> anyhow::Result<Arc<dyn ObjectStore>> {
    if let Some((s3, prefix)) = s3_store(spec)? {
        return Ok(if prefix.is_empty() {
            Arc::new(s3)
        } else {
            Arc::new(PrefixStore::new(s3, prefix))
        });
    }
    let dir = spec.strip_prefix("file://").unwrap_or(spec);
    anyhow::ensure!(
        !dir.contains("://"),
        "unsupported store URL `{spec}`: use a directory, file:///dir or s3://bucket/prefix"
    );
    let dir = Path::new(dir);
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating store directory {}", dir.display()))?;
    let store = LocalFileSystem::new_with_prefix(dir)
        .with_context(|| format!("opening store directory {}", dir.display()))?;
    Ok(Arc::new(store))
}

/// The directory of a local store spec (what [`open`] opens), `None` for
/// S3.
pub fn local_dir(spec: &str) -> Option<std::path::PathBuf> {
    if spec.starts_with("s3://") {
        return None;
    }
    let dir = spec.strip_prefix("file://").unwrap_or(spec);
    (!dir.contains("://")).then(|| std::path::PathBuf::from(dir))
}

/// The S3 client and key prefix of an `s3://bucket[/prefix]` store, `None`
/// for any other store.
fn s3_store(spec: &str) -> anyhow::Result<Option<(AmazonS3, String)>> {
    let Some((builder, prefix)) = s3_builder(spec)? else {
        return Ok(None);
    };
    let s3 = builder
        .build()
        .with_context(|| format!("configuring S3 store `{spec}`"))?;
    Ok(Some((s3, prefix)))
}

/// The S3 client's configuration and key prefix of an
/// `s3://bucket[/prefix]` store, `None` for any other store.
fn s3_builder(spec: &str) -> anyhow::Result<Option<(AmazonS3Builder, String)>> {
    let Some(rest) = spec.strip_prefix("s3://") else {
        return Ok(None);
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    anyhow::ensure!(!bucket.is_empty(), "store URL `{spec}` names no bucket");
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    // object_store reads AWS_ENDPOINT; accept the newer SDK name too.
    if let Ok(endpoint) = std::env::var("AWS_ENDPOINT_URL") {
        builder = builder.with_endpoint(endpoint);
    }
    Ok(Some((builder, prefix.trim_matches('/').to_string())))
}

/// Time-limited URLs for objects of an S3 store, so that agents fetch a
/// tile's inputs and its checkpoint from the store itself rather than
/// through the server (a tile's inputs are gigabytes; the server only
/// checks the lease and answers with a redirect), and upload their
/// outputs to it the same way ([`direct_upload`]).
#[derive(Debug)]
pub struct Presigner {
    /// Its own client of the store, configured to keep SHA-256 checksums
    /// of multipart uploads (`x-amz-checksum-algorithm`), which the
    /// server's main client does not ask for.
    s3: AmazonS3,
    prefix: String,
    valid_for: Duration,
    /// Of a direct output upload; `None`: outputs go through the server.
    part_size: Option<u64>,
    /// For the requests object_store cannot make: the HEAD that reads an
    /// uploaded object's checksum.
    http: reqwest::Client,
}

/// The environment variable that sets the part size of direct output
/// uploads, in MiB: 5 (S3's smallest) to 5120 (its largest); 0 sends
/// outputs through the server even with an S3 store.
pub const PART_SIZE_ENV: &str = "FLOTILLA_OUTPUT_PART_MIB";

impl Presigner {
    /// For `spec` when it is an S3 store, with URLs valid for `valid_for`;
    /// `None` for a local store (which the server keeps proxying). The
    /// part size of direct uploads comes from [`PART_SIZE_ENV`] (default
    /// [`direct_upload::DEFAULT_PART_SIZE`]).
    pub fn for_store(spec: &str, valid_for: Duration) -> anyhow::Result<Option<Presigner>> {
        let Some((builder, prefix)) = s3_builder(spec)? else {
            return Ok(None);
        };
        let s3 = builder
            .with_checksum_algorithm(object_store::aws::Checksum::SHA256)
            .build()
            .with_context(|| format!("configuring S3 store `{spec}`"))?;
        let part_size = match std::env::var(PART_SIZE_ENV) {
            Err(_) => Some(direct_upload::DEFAULT_PART_SIZE),
            Ok(v) => direct_upload::part_size_from_mib(&v)
                .with_context(|| format!("{PART_SIZE_ENV}={v}"))?,
        };
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build()
            .context("making the store's HTTP client")?;
        Ok(Some(Presigner {
            s3,
            prefix,
            valid_for,
            part_size,
            http,
        }))
    }

    /// The key under the bucket of `key`, a key of the store as the server
    /// sees it (under its prefix).
    fn full_path(&self, key: &str) -> object_store::path::Path {
        if self.prefix.is_empty() {
            object_store::path::Path::from(key)
        } else {
            object_store::path::Path::from(format!("{}/{key}", self.prefix))
        }
    }

    /// A URL that GETs the object `key` until it expires.
    pub async fn get_url(&self, key: &str) -> object_store::Result<url::Url> {
        use object_store::signer::Signer;
        self.s3
            .signed_url(reqwest::Method::GET, &self.full_path(key), self.valid_for)
            .await
    }
}

/// Why a streamed upload ([`stream_body`]) did not complete. In every case
/// the multipart upload was aborted, so nothing is left at the key.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("the upload was cut off after {after} bytes: {reason}")]
    CutOff { after: u64, reason: String },
    #[error("the upload is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("the object store failed: {0}")]
    Store(#[from] object_store::Error),
}

/// Parts of one streamed upload sent to the store at once: the body is
/// read no further while this many are on their way (object_store's parts
/// are 5 MiB, so one upload holds at most about 45 MiB). Without it a
/// store slower than the agent sending grew the server's memory by the
/// difference, up to the whole output.
const PARTS_IN_FLIGHT: usize = 8;

/// Streams an HTTP request body into `store` at `path` as a multipart upload
/// while hashing it; returns (size, sha256 hex). An error part way, or more
/// than `max_bytes`, aborts the upload so no partial object remains.
pub async fn stream_body(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    body: axum::body::Body,
    max_bytes: u64,
) -> Result<(u64, String), StreamError> {
    let writer = object_store::WriteMultipart::new(store.put_multipart(path).await?);
    stream_into(writer, body.into_data_stream(), max_bytes).await
}

/// [`stream_body`]'s loop, over any stream of chunks and any upload.
async fn stream_into<S, E>(
    mut writer: object_store::WriteMultipart,
    mut stream: S,
    max_bytes: u64,
) -> Result<(u64, String), StreamError>
where
    S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    use futures::StreamExt;
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                let _ = writer.abort().await;
                return Err(StreamError::CutOff {
                    after: size,
                    reason: e.to_string(),
                });
            }
        };
        size += chunk.len() as u64;
        if size > max_bytes {
            let _ = writer.abort().await;
            return Err(StreamError::TooLarge { limit: max_bytes });
        }
        hasher.update(&chunk);
        // The store's pace is the body's: no more than PARTS_IN_FLIGHT
        // parts wait on it before this chunk is taken in.
        if let Err(e) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
            let _ = writer.abort().await;
            return Err(e.into());
        }
        writer.write(&chunk);
    }
    writer.finish().await?;
    Ok((size, hex::encode(hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use object_store::{MultipartUpload, PutPayload, PutResult, UploadPart};
    use tokio::sync::Semaphore;

    use super::*;

    /// A store that takes a part only when the test lets it (a permit each).
    #[derive(Debug)]
    struct HeldUpload {
        gate: Arc<Semaphore>,
        parts: Arc<AtomicUsize>,
    }

    #[async_trait::async_trait]
    impl MultipartUpload for HeldUpload {
        fn put_part(&mut self, _data: PutPayload) -> UploadPart {
            self.parts.fetch_add(1, Ordering::SeqCst);
            let gate = self.gate.clone();
            Box::pin(async move {
                gate.acquire().await.expect("the gate stays open").forget();
                Ok(())
            })
        }
        async fn complete(&mut self) -> object_store::Result<PutResult> {
            Ok(PutResult {
                e_tag: None,
                version: None,
            })
        }
        async fn abort(&mut self) -> object_store::Result<()> {
            Ok(())
        }
    }

    /// While the store takes nothing, the body is read only as far as the
    /// parts in flight allow (it was read to its end, every part held in
    /// memory); once the store moves, the upload completes with the whole
    /// body's size and hash.
    #[tokio::test]
    async fn a_slow_store_holds_back_the_body() {
        let gate = Arc::new(Semaphore::new(0));
        let parts = Arc::new(AtomicUsize::new(0));
        let read = Arc::new(AtomicUsize::new(0));
        let upload = HeldUpload {
            gate: gate.clone(),
            parts: parts.clone(),
        };
        // Parts of 16 bytes, a chunk of 16 bytes each: one part a chunk.
        let writer = object_store::WriteMultipart::new_with_chunk_size(Box::new(upload), 16);
        let counted = read.clone();
        let body = futures::stream::iter(0..1000u32).map(move |i| {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::convert::Infallible>(bytes::Bytes::from(vec![i as u8; 16]))
        });
        use futures::StreamExt;
        let task = tokio::spawn(stream_into(writer, body, u64::MAX));
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let (taken, sent) = (read.load(Ordering::SeqCst), parts.load(Ordering::SeqCst));
        assert!(
            taken <= PARTS_IN_FLIGHT + 1 && sent <= PARTS_IN_FLIGHT,
            "{taken} chunks read, {sent} parts sent while the store took none"
        );
        gate.add_permits(2000);
        let (size, sha) = task.await.unwrap().unwrap();
        let mut all = Vec::new();
        for i in 0..1000u32 {
            all.extend_from_slice(&[i as u8; 16]);
        }
        use sha2::Digest;
        assert_eq!(
            (size, sha),
            (16_000, hex::encode(sha2::Sha256::digest(&all)))
        );
        assert_eq!(parts.load(Ordering::SeqCst), 1000);
    }
}
