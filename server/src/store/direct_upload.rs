//! Outputs that agents upload to an S3 store themselves: a multipart upload
//! opened here with a presigned URL per part, and the completed object
//! checked against what the agent declared before anything is recorded.
//!
//! What is checked, and by whom:
//! - Each part's sha256 is signed into its URL as `x-amz-checksum-sha256`,
//!   so the agent cannot send another value; AWS S3 refuses a part whose
//!   bytes do not hash to it (`BadDigest`). moto 5 (the tests' store) does
//!   not: it takes the part.
//! - After completing, a HEAD with `x-amz-checksum-mode: ENABLED` reads
//!   the object's size and the composite checksum the store computed from
//!   the bytes it holds (sha256 over the parts' sha256s; AWS and moto
//!   both): the object is kept only if both are what the agent declared,
//!   else it is deleted. So the parts the store holds are those declared,
//!   on moto too.
//! - The whole file's sha256 is the agent's: the server never sees the
//!   bytes, and a sha256 cannot be composed from the parts'. The agent
//!   computes it in the same pass over the file as the parts'.

use base64::Engine;
use object_store::multipart::{MultipartStore, PartId};
use sha2::{Digest, Sha256};

use super::{sigv4, Presigner};

/// S3's smallest part but the last (S3 API reference, UploadPart: 5 MiB).
pub const MIN_PART_SIZE: u64 = 5 << 20;
/// S3's largest part (5 GiB).
pub const MAX_PART_SIZE: u64 = 5 << 30;
/// At most this many parts. S3 takes 10,000; the complete call lists each
/// part (about 130 bytes of JSON) within the server's 1 MiB limit on a JSON
/// body, so bigger outputs get bigger parts instead.
pub const MAX_PARTS: u64 = 4096;
/// 64 MiB: a tile's ~160 MB embedding in three parts, and 1,024 parts for
/// the largest output a job may upload (64 GiB).
pub const DEFAULT_PART_SIZE: u64 = 64 << 20;
/// How long the server's own HEAD URL is valid: it is used at once.
const HEAD_URL_VALID: std::time::Duration = std::time::Duration::from_secs(60);
/// The slowest upload a part URL must outlast: the agent's own limits on a
/// transfer (`TransferLimits`' defaults: 600 s plus the size at 1 MiB/s).
const SLOWEST_BASE_S: u64 = 600;
const SLOWEST_RATE: u64 = 1 << 20;
/// SigV4's longest validity (S3 API reference: `X-Amz-Expires` at most
/// 604,800 s, 7 days).
const LONGEST_VALID_S: u64 = 604_800;

/// The part size [`super::PART_SIZE_ENV`] gives, in MiB; `None` for 0 (no
/// direct uploads).
pub fn part_size_from_mib(v: &str) -> anyhow::Result<Option<u64>> {
    let mib: u64 = v
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("not a whole number of MiB"))?;
    if mib == 0 {
        return Ok(None);
    }
    let bytes = mib.saturating_mul(1 << 20);
    anyhow::ensure!(
        (MIN_PART_SIZE..=MAX_PART_SIZE).contains(&bytes),
        "a part is 5 to 5120 MiB (S3's limits), or 0 for no direct uploads"
    );
    Ok(Some(bytes))
}

/// How many parts of `part_size` make `size` bytes.
pub fn part_count(size: u64, part_size: u64) -> u64 {
    size.div_ceil(part_size.max(1))
}

/// A multipart upload the store holds open.
#[derive(Debug)]
pub struct OpenUpload {
    pub upload_id: String,
    /// Per part in order: its URL and the `x-amz-checksum-sha256` value
    /// signed into it.
    pub parts: Vec<(url::Url, String)>,
    /// How long the URLs stay valid.
    pub valid_for: std::time::Duration,
}

/// Why a direct upload was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// What the store holds is not what the agent declared; the object
    /// was deleted.
    #[error("{0}; the object was deleted")]
    Mismatch(String),
    #[error("the object store failed: {0}")]
    Store(#[from] object_store::Error),
    /// The HEAD that reads the object's size and checksum failed; the
    /// object was deleted, being unchecked.
    #[error("reading back the uploaded object failed: {0}")]
    Head(String),
}

impl Presigner {
    /// The part size for a direct upload of `size` bytes; `None`: the
    /// output goes through the server (direct uploads off, or an empty
    /// file, which a multipart upload cannot hold without a part).
    pub fn part_size_for(&self, size: u64) -> Option<u64> {
        let configured = self.part_size?;
        if size == 0 {
            return None;
        }
        // Whole MiB, so that a part count stays within MAX_PARTS.
        let least = size.div_ceil(MAX_PARTS).div_ceil(1 << 20) << 20;
        let part = configured.max(least);
        (part <= MAX_PART_SIZE).then_some(part)
    }

    /// How long the part URLs of an upload of `size` bytes stay valid: the
    /// presigning TTL, or as long as the agent may take over the upload if
    /// that is longer (a URL that expired midway would fail it), within
    /// SigV4's 7 days. A URL only lets its holder replace that one part of
    /// that open upload, whose lease-checked completion decides what counts.
    pub fn upload_valid_for(&self, size: u64) -> std::time::Duration {
        let slowest = SLOWEST_BASE_S + size / SLOWEST_RATE;
        std::time::Duration::from_secs(slowest.min(LONGEST_VALID_S)).max(self.valid_for)
    }

    /// Opens a multipart upload of `key` (`size` bytes) and signs one
    /// UploadPart URL per entry of `part_sha256`, each part's checksum
    /// signed in. If signing fails the upload is aborted again.
    pub async fn open_upload(
        &self,
        key: &str,
        size: u64,
        part_sha256: &[[u8; 32]],
    ) -> object_store::Result<OpenUpload> {
        let path = self.full_path(key);
        let valid_for = self.upload_valid_for(size);
        let upload_id = self.s3.create_multipart(&path).await?;
        match self
            .sign_parts(&path, &upload_id, part_sha256, valid_for)
            .await
        {
            Ok(parts) => Ok(OpenUpload {
                upload_id,
                parts,
                valid_for,
            }),
            Err(e) => {
                self.abort_logged(key, &upload_id).await;
                Err(e)
            }
        }
    }

    async fn sign_parts(
        &self,
        path: &object_store::path::Path,
        upload_id: &str,
        part_sha256: &[[u8; 32]],
        valid_for: std::time::Duration,
    ) -> object_store::Result<Vec<(url::Url, String)>> {
        let (base, region) = self.unsigned_url(reqwest::Method::PUT, path).await?;
        let credential = self.s3.credentials().get_credential().await?;
        let credentials = sigv4::Credentials {
            key_id: &credential.key_id,
            secret_key: &credential.secret_key,
            token: credential.token.as_deref(),
        };
        let now = chrono::Utc::now();
        Ok(part_sha256
            .iter()
            .enumerate()
            .map(|(i, sum)| {
                let checksum = base64::engine::general_purpose::STANDARD.encode(sum);
                let number = (i + 1).to_string();
                let url = sigv4::presign(
                    &sigv4::Request {
                        method: "PUT",
                        url: &base,
                        query: &[("partNumber", &number), ("uploadId", upload_id)],
                        headers: &[("x-amz-checksum-sha256", &checksum)],
                    },
                    &credentials,
                    &region,
                    now,
                    valid_for,
                );
                (url, checksum)
            })
            .collect())
    }

    /// The URL of `path` and the region to sign for, as object_store's own
    /// presigned URL has them (its endpoint, path or virtual-host style,
    /// requester-pays parameter), without that URL's signature.
    async fn unsigned_url(
        &self,
        method: reqwest::Method,
        path: &object_store::path::Path,
    ) -> object_store::Result<(url::Url, String)> {
        use object_store::signer::Signer;
        let signed = self.s3.signed_url(method, path, self.valid_for).await?;
        let mut region = None;
        let mut bare = signed.clone();
        bare.set_query(None);
        for (k, v) in signed.query_pairs() {
            if k == "X-Amz-Credential" {
                // KEY/DATE/REGION/s3/aws4_request
                region = v.rsplit('/').nth(2).map(str::to_string);
            } else if !k.starts_with("X-Amz-") {
                bare.query_pairs_mut().append_pair(&k, &v);
            }
        }
        if bare.query() == Some("") {
            bare.set_query(None);
        }
        let region = region.ok_or_else(|| object_store::Error::Generic {
            store: "S3",
            source: format!("a presigned URL without a credential scope: {signed}").into(),
        })?;
        Ok((bare, region))
    }

    /// Completes the upload of `key` from `parts` (each part's sha256 and
    /// the ETag the store gave it, in order) and keeps the object only if
    /// the store holds `size` bytes whose parts hash as declared. On any
    /// failure nothing is left at the key: an upload that did not complete
    /// is aborted, an object that does not match is deleted.
    pub async fn complete_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: &[([u8; 32], String)],
        size: u64,
    ) -> Result<(), UploadError> {
        let path = self.full_path(key);
        let ids = parts
            .iter()
            .map(|(sum, etag)| PartId {
                content_id: part_metadata(etag, sum),
            })
            .collect();
        let upload_id = upload_id.to_string();
        if let Err(e) = self.s3.complete_multipart(&path, &upload_id, ids).await {
            self.abort_logged(key, &upload_id).await;
            return Err(e.into());
        }
        let checked = match self.head_checksum(&path).await {
            Ok((held, checksum)) => check(size, parts, held, checksum.as_deref()),
            Err(e) => Err(UploadError::Head(e)),
        };
        if checked.is_err() {
            use object_store::ObjectStore;
            if let Err(e) = self.s3.delete(&path).await {
                tracing::error!(%key, error = %e, "deleting an upload that did not check out");
            }
        }
        checked
    }

    /// Drops an open upload's parts.
    pub async fn abort_upload(&self, key: &str, upload_id: &str) -> object_store::Result<()> {
        self.s3
            .abort_multipart(&self.full_path(key), &upload_id.to_string())
            .await
    }

    async fn abort_logged(&self, key: &str, upload_id: &str) {
        if let Err(e) = self.abort_upload(key, upload_id).await {
            tracing::warn!(%key, %upload_id, error = %e, "aborting a multipart upload");
        }
    }

    /// The object's size and its `x-amz-checksum-sha256` as the store
    /// reports them, by a HEAD that object_store cannot make (it does not
    /// ask for checksums).
    async fn head_checksum(
        &self,
        path: &object_store::path::Path,
    ) -> Result<(u64, Option<String>), String> {
        const MODE: (&str, &str) = ("x-amz-checksum-mode", "ENABLED");
        let (base, region) = self
            .unsigned_url(reqwest::Method::HEAD, path)
            .await
            .map_err(|e| e.to_string())?;
        let credential = self
            .s3
            .credentials()
            .get_credential()
            .await
            .map_err(|e| e.to_string())?;
        let url = sigv4::presign(
            &sigv4::Request {
                method: "HEAD",
                url: &base,
                query: &[],
                headers: &[MODE],
            },
            &sigv4::Credentials {
                key_id: &credential.key_id,
                secret_key: &credential.secret_key,
                token: credential.token.as_deref(),
            },
            &region,
            chrono::Utc::now(),
            HEAD_URL_VALID,
        );
        let resp = self
            .http
            .head(url)
            .header(MODE.0, MODE.1)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("HEAD answered {}", resp.status()));
        }
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let held = header("content-length")
            .and_then(|v| v.parse().ok())
            .ok_or("HEAD answered no content-length")?;
        Ok((held, header("x-amz-checksum-sha256")))
    }
}

/// Whether an object of `held` bytes with the store's composite
/// `checksum` is the upload of `size` bytes in `parts`.
fn check(
    size: u64,
    parts: &[([u8; 32], String)],
    held: u64,
    checksum: Option<&str>,
) -> Result<(), UploadError> {
    if held != size {
        return Err(UploadError::Mismatch(format!(
            "the store holds {held} bytes, not the {size} declared"
        )));
    }
    let Some(checksum) = checksum else {
        return Err(UploadError::Mismatch(
            "the store reports no SHA-256 checksum of the object, so its parts cannot be \
             checked (a store without S3's additional checksums cannot take direct uploads: \
             set FLOTILLA_OUTPUT_PART_MIB=0)"
                .into(),
        ));
    };
    // AWS writes the part count after the sum ("…=-3"); moto 5 does not.
    let (sum, count) = match checksum.split_once('-') {
        Some((sum, n)) => (sum, Some(n)),
        None => (checksum, None),
    };
    let expected = composite(parts.iter().map(|(s, _)| s));
    if sum != expected || count.is_some_and(|n| n != parts.len().to_string()) {
        return Err(UploadError::Mismatch(format!(
            "the parts the store holds do not have the sha256s declared (its checksum \
             {checksum}, expected {expected}-{})",
            parts.len()
        )));
    }
    Ok(())
}

/// S3's composite checksum of a multipart object: the sha256 of its parts'
/// sha256s in order, base64.
fn composite<'a>(parts: impl Iterator<Item = &'a [u8; 32]>) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

/// A part as object_store 0.12's complete call reads it when the client
/// keeps checksums (its `PartMetadata`, serialised by quick-xml: the ETag
/// and the base64 sha256). Anything else it takes for a bare ETag, which
/// the store then refuses, so the tests against moto would fail if this
/// format changed under us.
fn part_metadata(etag: &str, sha256: &[u8; 32]) -> String {
    let escaped = etag
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    format!(
        "<PartMetadata><e_tag>{escaped}</e_tag><checksum_sha256>{}</checksum_sha256></PartMetadata>",
        base64::engine::general_purpose::STANDARD.encode(sha256)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn presigner(part_size: Option<u64>) -> Presigner {
        Presigner {
            s3: object_store::aws::AmazonS3Builder::new()
                .with_bucket_name("b")
                .with_region("us-east-1")
                .build()
                .unwrap(),
            prefix: String::new(),
            valid_for: std::time::Duration::from_secs(900),
            part_size,
            http: reqwest::Client::new(),
        }
    }

    #[test]
    fn part_sizes_stay_within_s3_limits() {
        let p = presigner(Some(MIN_PART_SIZE));
        assert_eq!(p.part_size_for(0), None, "an empty file goes through");
        assert_eq!(p.part_size_for(12_000_000), Some(MIN_PART_SIZE));
        assert_eq!(part_count(12_000_000, MIN_PART_SIZE), 3);
        // 64 GiB in 5 MiB parts would be 13,108: parts grow to 16 MiB.
        let big = 64u64 << 30;
        let part = p.part_size_for(big).unwrap();
        assert_eq!(part, 16 << 20);
        assert!(part_count(big, part) <= MAX_PARTS);
        assert_eq!(presigner(None).part_size_for(1 << 30), None);
        assert_eq!(part_size_from_mib("0").unwrap(), None);
        assert_eq!(part_size_from_mib("64").unwrap(), Some(DEFAULT_PART_SIZE));
        assert!(part_size_from_mib("4").is_err());
        assert!(part_size_from_mib("5121").is_err());
        assert!(part_size_from_mib("x").is_err());
    }

    #[test]
    fn part_urls_outlast_the_slowest_upload_the_agent_allows() {
        let p = presigner(Some(DEFAULT_PART_SIZE));
        // 160 MB at 1 MiB/s is 752 s: the 900 s TTL covers it.
        assert_eq!(p.upload_valid_for(160_000_000).as_secs(), 900);
        assert_eq!(p.upload_valid_for(10 << 30).as_secs(), 600 + 10 * 1024);
        assert_eq!(p.upload_valid_for(64 << 30).as_secs(), 600 + 64 * 1024);
        assert_eq!(p.upload_valid_for(u64::MAX).as_secs(), 604_800);
    }

    #[test]
    fn checks_size_and_composite_checksum() {
        let a: [u8; 32] = Sha256::digest(b"a").into();
        let b: [u8; 32] = Sha256::digest(b"b").into();
        let parts = [(a, "\"1\"".to_string()), (b, "\"2\"".to_string())];
        let sum = composite([a, b].iter());
        assert!(check(2, &parts, 2, Some(&sum)).is_ok(), "moto's form");
        assert!(
            check(2, &parts, 2, Some(&format!("{sum}-2"))).is_ok(),
            "AWS's"
        );
        assert!(check(2, &parts, 2, Some(&format!("{sum}-3"))).is_err());
        assert!(check(3, &parts, 2, Some(&sum)).is_err(), "size");
        assert!(check(2, &parts, 2, None).is_err(), "no checksum");
        let swapped = composite([b, a].iter());
        assert!(check(2, &parts, 2, Some(&swapped)).is_err(), "order");
    }

    #[test]
    fn part_metadata_escapes_the_etag() {
        let m = part_metadata("\"a<b>&c\"", &[0; 32]);
        assert!(m.contains("<e_tag>\"a&lt;b&gt;&amp;c\"</e_tag>"), "{m}");
    }
}
