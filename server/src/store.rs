//! The object store results go to: a local directory by default, S3 (or any
//! S3-compatible service) with `s3://bucket/prefix`.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;

/// Opens `spec`: `s3://bucket[/prefix]` (credentials, region and a custom
/// endpoint from the usual `AWS_*` variables, e.g. `AWS_ENDPOINT_URL`,
/// `AWS_ALLOW_HTTP=true` for a local S3-compatible server), `file:///dir`,
/// or a plain directory path (made if missing).
pub fn open(spec: &str) -> anyhow::Result<Arc<dyn ObjectStore>> {
    if let Some(rest) = spec.strip_prefix("s3://") {
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
        let prefix = prefix.trim_matches('/');
        return Ok(if prefix.is_empty() {
            Arc::new(s3)
        } else {
            Arc::new(PrefixStore::new(s3, prefix.to_string()))
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
