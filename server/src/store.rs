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
