//! Downloads and uploads against a stub HTTP server that stalls: they fail
//! within the stall limit, as retryable, and leave no temporary file.

use std::path::Path;
use std::time::{Duration, Instant};

use flotilla_agent::server_api::{CallError, ServerApi, TransferLimits};
use flotilla_core::protocol::LeaseRef;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use uuid::Uuid;

const STALL: Duration = Duration::from_secs(1);

/// What the stub does after reading a request's headers.
#[derive(Clone, Copy)]
enum Stub {
    /// Answers nothing.
    Silent,
    /// Sends headers for 1,000 bytes, then 10 of them, then nothing.
    StallBody,
    /// Reads nothing more (an upload's body backs up).
    StopReading,
}

/// A server on loopback that treats every connection as `stub` says and
/// keeps it open; its URL.
async fn stub(stub: Stub) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                // The request's headers (a few hundred bytes, in one read).
                let mut buf = vec![0u8; 16 * 1024];
                let _ = conn.read(&mut buf).await;
                if let Stub::StallBody = stub {
                    let _ = conn
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789")
                        .await;
                }
                // Hold the connection open, doing nothing more.
                tokio::time::sleep(Duration::from_secs(3600)).await;
                drop(conn);
            });
        }
    });
    format!("http://{addr}")
}

fn api(url: &str) -> ServerApi {
    ServerApi::new(url, "token")
        .unwrap()
        .with_transfer_limits(TransferLimits {
            stall: STALL,
            ..TransferLimits::default()
        })
}

fn lease() -> LeaseRef {
    LeaseRef {
        job_id: Uuid::new_v4(),
        lease_token: Uuid::new_v4(),
    }
}

fn files_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// A retryable failure that says it stalled, within the stall limit and
/// a little.
fn assert_stalled(r: Result<impl std::fmt::Debug, CallError>, took: Duration) {
    let e = r.expect_err("a stalled transfer fails");
    assert!(matches!(e, CallError::Unreachable(_)), "retryable: {e:?}");
    assert!(!e.is_permanent());
    assert!(e.to_string().contains("stalled"), "{e}");
    assert!(took >= STALL && took < STALL * 5, "took {took:?}");
}

/// M11: a download whose body stops coming held its job (and, for a
/// checkpoint, the encoder lock) for as long as the connection stayed open.
#[tokio::test]
async fn a_download_whose_body_stalls_fails_within_the_stall_limit_and_leaves_no_part_file() {
    let url = stub(Stub::StallBody).await;
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let r = api(&url)
        .download(lease(), "checkpoint", &dir.path().join("ckpt"))
        .await;
    assert_stalled(r, start.elapsed());
    assert!(
        files_in(dir.path()).is_empty(),
        "{:?}",
        files_in(dir.path())
    );
}

#[tokio::test]
async fn a_download_that_gets_no_answer_fails_within_the_stall_limit() {
    let url = stub(Stub::Silent).await;
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let r = api(&url)
        .download(lease(), "inputs/bands.npy", &dir.path().join("bands.npy"))
        .await;
    assert_stalled(r, start.elapsed());
}

/// M10: a download stopped with its job (the future dropped) left its
/// `.part-*` file behind.
#[tokio::test]
async fn a_download_dropped_midway_leaves_no_part_file() {
    let url = stub(Stub::StallBody).await;
    let dir = tempfile::tempdir().unwrap();
    let api = ServerApi::new(&url, "token").unwrap();
    let dest = dir.path().join("ckpt");
    let download = api.download(lease(), "checkpoint", &dest);
    let r = tokio::time::timeout(Duration::from_millis(500), download).await;
    assert!(r.is_err(), "still downloading when dropped");
    assert!(
        files_in(dir.path()).is_empty(),
        "{:?}",
        files_in(dir.path())
    );
}

#[tokio::test]
async fn an_upload_the_server_stops_taking_fails_within_the_stall_limit() {
    let url = stub(Stub::StopReading).await;
    let dir = tempfile::tempdir().unwrap();
    // More than loopback's socket buffers take without a reader.
    let file = dir.path().join("out.bin");
    std::fs::write(&file, vec![7u8; 64 << 20]).unwrap();
    let start = Instant::now();
    let r = api(&url).upload(lease(), "out.bin", &file).await;
    assert_stalled(r, start.elapsed());
}
