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

/// The S3 client and key prefix of an `s3://bucket[/prefix]` store, `None`
/// for any other store.
fn s3_store(spec: &str) -> anyhow::Result<Option<(AmazonS3, String)>> {
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
    let s3 = builder
        .build()
        .with_context(|| format!("configuring S3 store `{spec}`"))?;
    Ok(Some((s3, prefix.trim_matches('/').to_string())))
}

/// Time-limited URLs for objects of an S3 store, so that agents fetch a
/// tile's inputs and its checkpoint from the store itself rather than
/// through the server (a tile's inputs are gigabytes; the server only
/// checks the lease and answers with a redirect).
#[derive(Debug)]
pub struct Presigner {
    s3: AmazonS3,
    prefix: String,
    valid_for: Duration,
}

impl Presigner {
    /// For `spec` when it is an S3 store, with URLs valid for `valid_for`;
    /// `None` for a local store (which the server keeps proxying).
    pub fn for_store(spec: &str, valid_for: Duration) -> anyhow::Result<Option<Presigner>> {
        Ok(s3_store(spec)?.map(|(s3, prefix)| Presigner {
            s3,
            prefix,
            valid_for,
        }))
    }

    /// A URL that GETs the object `key` (a key of the store as the server
    /// sees it, under its prefix) until it expires.
    pub async fn get_url(&self, key: &str) -> object_store::Result<url::Url> {
        use object_store::signer::Signer;
        let full = if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        };
        self.s3
            .signed_url(
                reqwest::Method::GET,
                &object_store::path::Path::from(full),
                self.valid_for,
            )
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

/// Streams an HTTP request body into `store` at `path` as a multipart upload
/// while hashing it; returns (size, sha256 hex). An error part way, or more
/// than `max_bytes`, aborts the upload so no partial object remains.
pub async fn stream_body(
    store: &dyn ObjectStore,
    path: &object_store::path::Path,
    body: axum::body::Body,
    max_bytes: u64,
) -> Result<(u64, String), StreamError> {
    use futures::StreamExt;
    use sha2::{Digest, Sha256};
    let mut writer = object_store::WriteMultipart::new(store.put_multipart(path).await?);
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut stream = body.into_data_stream();
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
        writer.write(&chunk);
    }
    writer.finish().await?;
    Ok((size, hex::encode(hasher.finalize())))
}
