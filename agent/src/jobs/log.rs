//! A job's log: its processes' lines and the agent's own, batched to the server.

use std::future::Future;
use std::time::Duration;

use flotilla_core::protocol::{LeaseRef, LogBatch, LogLine, LogStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::server_api::{CallError, Delivery, JobCall, ServerApi};

/// Lines per request at most: well under the server's limit of 10,000 per
/// batch.
const BATCH_LINES: usize = 500;

/// JSON-encoded bytes per request at most: half the server's 1 MiB body
/// limit (`max_body_bytes`), so a server configured tighter still takes most
/// batches whole; one that refuses (413) gets the batch in halves. A line
/// of a process is at most 64 KiB (`process::MAX_LINE_BYTES`), 384 KiB once
/// every byte is a control character escaped as `\u00XX`: it fits alone.
const BATCH_BYTES: usize = 512 * 1024;

/// How long a line may wait for others to share its request: a log that
/// trickles still shows up in the dashboard within a fifth of a second.
const BATCH_WAIT: Duration = Duration::from_millis(200);

/// Lines buffered between the job and the forwarder. When full, the job
/// waits (a child process then blocks on its next write once its pipe
/// fills), so a slow server slows the job instead of growing memory.
const BUFFERED_LINES: usize = 1024;

/// Where log batches go: the server ([`ServerApi`]), or a fake in tests.
pub trait LogSink: Send + Sync + 'static {
    /// One delivery of `batch`, retried while the server is unreachable
    /// until `stop` fires.
    fn send(
        &self,
        job: Uuid,
        batch: &LogBatch,
        stop: &CancellationToken,
    ) -> impl Future<Output = Result<(), CallError>> + Send;
}

impl LogSink for ServerApi {
    async fn send(
        &self,
        job: Uuid,
        batch: &LogBatch,
        stop: &CancellationToken,
    ) -> Result<(), CallError> {
        self.job_call(job, JobCall::Log(batch), stop).await
    }
}

/// Where a job writes its log lines. Clones share one forwarder; the log is
/// closed when the last clone is dropped.
#[derive(Clone)]
pub struct JobLog {
    tx: mpsc::Sender<LogLine>,
}

/// The task that sends a job's log lines; [`Forwarder::finish`] waits until
/// every line written was delivered (or given up on).
pub struct Forwarder {
    task: JoinHandle<()>,
}

impl JobLog {
    /// Starts forwarding lines for the attempt `lease` to `sink`. Each
    /// batch is retried as `delivery` says; one that runs out of budget
    /// abandons the job (see [`Delivery`]).
    pub fn start<S: LogSink>(sink: S, lease: LeaseRef, delivery: Delivery) -> (JobLog, Forwarder) {
        let (tx, rx) = mpsc::channel(BUFFERED_LINES);
        let task = tokio::spawn(forward(sink, lease, rx, delivery));
        (JobLog { tx }, Forwarder { task })
    }

    /// Appends one line. A log whose forwarder has stopped drops it.
    pub async fn line(&self, line: LogLine) {
        let _ = self.tx.send(line).await;
    }

    /// Appends a line of the agent's own about the job (shown as `[agent] …`).
    pub async fn agent(&self, text: impl Into<String>) {
        self.line(agent_line(text)).await;
    }

    /// [`JobLog::agent`] for a blocking thread (the encoder's, the solver's).
    pub fn agent_blocking(&self, text: impl Into<String>) {
        let _ = self.tx.blocking_send(agent_line(text));
    }
}

fn agent_line(text: impl Into<String>) -> LogLine {
    LogLine {
        stream: LogStream::Agent,
        line: text.into(),
    }
}

impl Forwarder {
    /// Waits until the log is closed (every [`JobLog`] dropped) and its
    /// lines were sent.
    pub async fn finish(self) {
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "the log forwarder panicked; log lines lost");
        }
    }
}

/// Batches lines to the server: up to [`BATCH_LINES`] lines, [`BATCH_BYTES`]
/// encoded or [`BATCH_WAIT`], whichever comes first.
async fn forward<S: LogSink>(
    sink: S,
    lease: LeaseRef,
    mut rx: mpsc::Receiver<LogLine>,
    delivery: Delivery,
) {
    let job = lease.job_id;
    // The last batch number sent (see `LogBatch::batch`).
    let mut numbered = 0u64;
    let mut batch = Vec::new();
    let mut bytes = 0;
    // A line that did not fit in the last batch starts the next.
    let mut carried: Option<LogLine> = None;
    loop {
        let deadline = tokio::time::sleep(BATCH_WAIT);
        tokio::pin!(deadline);
        let mut closed = false;
        if let Some(l) = carried.take() {
            bytes += encoded_len(&l);
            batch.push(l);
        }
        while batch.len() < BATCH_LINES && bytes < BATCH_BYTES {
            tokio::select! {
                line = rx.recv() => match line {
                    Some(l) => {
                        let n = encoded_len(&l);
                        if bytes + n > BATCH_BYTES && !batch.is_empty() {
                            carried = Some(l);
                            break;
                        }
                        bytes += n;
                        batch.push(l);
                    }
                    None => { closed = true; break; }
                },
                _ = &mut deadline => break,
            }
        }
        if !batch.is_empty() {
            bytes = 0;
            let lines = std::mem::take(&mut batch);
            if let Err(e) = deliver(&sink, lease, lines, &delivery, &mut numbered).await {
                match e {
                    e if e.lease_gone() => {}
                    CallError::ShuttingDown => {
                        tracing::warn!(%job, "log lines not delivered: shutting down, and the lease has expired at the server")
                    }
                    CallError::OutOfBudget(_) => {
                        tracing::error!(%job, error = %e, "log lines not delivered; dropping the lease so the job is requeued");
                        delivery.abandon();
                    }
                    e => {
                        tracing::error!(%job, error = %e, "log lines refused; dropping the lease so the job is requeued");
                        delivery.abandon();
                    }
                }
                // Keep draining so the process is never blocked while it
                // is stopped.
                while rx.recv().await.is_some() {}
                return;
            }
        }
        if closed && carried.is_none() {
            return;
        }
    }
}

/// Sends `lines`, halving any request the server refuses as too large (a
/// single line too large is cut in two on a character boundary), so that
/// nothing is dropped for its size. Each request is numbered after
/// `numbered` (which it advances); its retries keep its number, so the
/// server stores a request whose answer was lost only once.
async fn deliver<S: LogSink>(
    sink: &S,
    lease: LeaseRef,
    lines: Vec<LogLine>,
    delivery: &Delivery,
    numbered: &mut u64,
) -> Result<(), CallError> {
    // Pieces still to send, the next one last.
    let mut pending = vec![split_long_lines(lines)];
    while let Some(lines) = pending.pop() {
        *numbered += 1;
        let batch = LogBatch {
            lease_token: lease.lease_token,
            batch: *numbered,
            lines,
        };
        let sent = delivery
            .retry(|stop| {
                let batch = &batch;
                async move { sink.send(lease.job_id, batch, &stop).await }
            })
            .await;
        match sent {
            Ok(()) => {}
            Err(e) if e.too_large() => {
                let mut first = batch.lines;
                let second = match first.len() {
                    0 => continue,
                    1 => match halve_line(&mut first[0]) {
                        Some(rest) => vec![rest],
                        // One character the server will not take.
                        None => return Err(e),
                    },
                    n => first.split_off(n / 2),
                };
                tracing::info!(job = %lease.job_id, lines = first.len() + second.len(),
                               "log batch refused as too large; sending it in halves");
                pending.push(second);
                pending.push(first);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Bytes `line` adds to a [`LogBatch`] as serde_json writes it: the object,
/// the escaped text and a separating comma.
fn encoded_len(line: &LogLine) -> usize {
    // `{"stream":"","line":""},`
    24 + line.stream.as_str().len() + escaped_len(&line.line)
}

/// Length of `text` inside a JSON string as serde_json escapes it: `"` and
/// `\` and the five short control escapes take 2 bytes, other control
/// characters 6 (`\u00XX`), everything else its UTF-8 bytes.
fn escaped_len(text: &str) -> usize {
    text.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum()
}

/// Cuts every line whose encoding alone passes [`BATCH_BYTES`] into pieces
/// that fit, on character boundaries (the agent's own lines have no length
/// limit).
fn split_long_lines(lines: Vec<LogLine>) -> Vec<LogLine> {
    let mut out = Vec::with_capacity(lines.len());
    for line in lines {
        if encoded_len(&line) <= BATCH_BYTES {
            out.push(line);
            continue;
        }
        let stream = line.stream;
        let room = BATCH_BYTES
            - encoded_len(&LogLine {
                stream,
                line: String::new(),
            });
        let (mut piece, mut used) = (String::new(), 0);
        for c in line.line.chars() {
            let n = escaped_len(c.encode_utf8(&mut [0; 4]));
            if used + n > room {
                let line = std::mem::take(&mut piece);
                out.push(LogLine { stream, line });
                used = 0;
            }
            piece.push(c);
            used += n;
        }
        out.push(LogLine {
            stream,
            line: piece,
        });
    }
    out
}

/// Cuts `line` in two on a character boundary near its middle, keeping the
/// first half and returning the second; `None` for a line of one character
/// or none.
fn halve_line(line: &mut LogLine) -> Option<LogLine> {
    let text = &line.line;
    let mut mid = text.len() / 2;
    while !text.is_char_boundary(mid) {
        mid += 1;
    }
    if mid == 0 || mid == text.len() {
        let first = text.chars().next()?.len_utf8();
        if first == text.len() {
            return None;
        }
        mid = first;
    }
    let rest = line.line.split_off(mid);
    Some(LogLine {
        stream: line.stream,
        line: rest,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A server that takes bodies up to `limit` JSON bytes (413 above), or
    /// that is unreachable.
    struct FakeSink {
        limit: usize,
        unreachable: bool,
        /// Batches taken, and the number refused as too large.
        taken: Mutex<(Vec<LogBatch>, usize)>,
    }

    impl FakeSink {
        fn new(limit: usize) -> Arc<Self> {
            Arc::new(FakeSink {
                limit,
                unreachable: false,
                taken: Mutex::new((vec![], 0)),
            })
        }

        fn lines(&self) -> Vec<String> {
            let taken = self.taken.lock().unwrap();
            taken
                .0
                .iter()
                .flat_map(|b| &b.lines)
                .map(|l| l.line.clone())
                .collect()
        }
    }

    impl LogSink for Arc<FakeSink> {
        async fn send(
            &self,
            _: Uuid,
            batch: &LogBatch,
            stop: &CancellationToken,
        ) -> Result<(), CallError> {
            if self.unreachable {
                stop.cancelled().await;
                return Err(CallError::ShuttingDown);
            }
            let size = serde_json::to_vec(batch).unwrap().len();
            let mut taken = self.taken.lock().unwrap();
            if size > self.limit {
                taken.1 += 1;
                return Err(CallError::Refused {
                    status: 413,
                    code: "payload_too_large".into(),
                    message: format!("{size} bytes"),
                });
            }
            taken.0.push(batch.clone());
            Ok(())
        }
    }

    fn lease() -> LeaseRef {
        LeaseRef {
            job_id: Uuid::new_v4(),
            lease_token: Uuid::new_v4(),
        }
    }

    fn stdout(line: String) -> LogLine {
        LogLine {
            stream: LogStream::Stdout,
            line,
        }
    }

    /// Writes `lines` to a log forwarded to `sink` and waits until it is
    /// delivered; returns whether the job was abandoned.
    async fn write_all(sink: &Arc<FakeSink>, lines: Vec<LogLine>, budget: Duration) -> bool {
        let delivery = Delivery::new(CancellationToken::new(), budget);
        let (log, forwarder) = JobLog::start(sink.clone(), lease(), delivery.clone());
        for l in lines {
            log.line(l).await;
        }
        drop(log);
        forwarder.finish().await;
        tokio::select! {
            biased;
            () = delivery.abandoned() => true,
            () = std::future::ready(()) => false,
        }
    }

    /// The server's own limit (`max_body_bytes`).
    const MIB: usize = 1 << 20;

    #[test]
    fn encoded_len_is_what_serde_json_writes() {
        let texts = [
            String::new(),
            "plain".into(),
            "\"quoted\" \\ back\tslash\r\n".into(),
            "\u{1}\u{1b}[31mred\u{1b}[0m\u{7f}\u{8}\u{c}".into(),
            "€ and 🦀".into(),
        ];
        for text in texts {
            for stream in [LogStream::Stdout, LogStream::Stderr, LogStream::Agent] {
                let line = LogLine {
                    stream,
                    line: text.clone(),
                };
                let json = serde_json::to_string(&line).unwrap();
                assert_eq!(encoded_len(&line), json.len() + 1, "{json}");
            }
        }
    }

    /// H1: 500 lines of 3,000 bytes were one 1.5 MB request, refused with
    /// 413 and dropped ("log lines lost").
    #[tokio::test]
    async fn long_lines_are_batched_under_the_servers_body_limit() {
        let sink = FakeSink::new(MIB);
        let lines: Vec<String> = (0..3000)
            .map(|i| format!("{i:04}{}", "x".repeat(2996)))
            .collect();
        let abandoned = write_all(
            &sink,
            lines.iter().cloned().map(stdout).collect(),
            Duration::from_secs(60),
        )
        .await;
        assert!(!abandoned);
        assert_eq!(sink.lines(), lines, "every line, in order");
        let taken = sink.taken.lock().unwrap();
        assert_eq!(taken.1, 0, "none refused");
        for b in &taken.0 {
            assert!(serde_json::to_vec(b).unwrap().len() <= BATCH_BYTES + 100);
        }
        // Numbered 1, 2, 3, … within the attempt: what lets the server
        // store a batch sent again (its answer lost) only once.
        let numbers: Vec<u64> = taken.0.iter().map(|b| b.batch).collect();
        assert_eq!(numbers, (1..=taken.0.len() as u64).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_line_of_64_kib_of_control_characters_goes_whole() {
        let sink = FakeSink::new(MIB);
        let worst = "\u{1}".repeat(crate::process::MAX_LINE_BYTES);
        let mut lines = vec![worst.clone(), worst.clone(), "after".into()];
        lines.insert(1, "\"\\".repeat(crate::process::MAX_LINE_BYTES / 2));
        let abandoned = write_all(
            &sink,
            lines.iter().cloned().map(stdout).collect(),
            Duration::from_secs(60),
        )
        .await;
        assert!(!abandoned);
        assert_eq!(sink.lines(), lines);
        assert_eq!(sink.taken.lock().unwrap().1, 0, "none refused");
    }

    #[tokio::test]
    async fn a_batch_refused_as_too_large_is_sent_in_halves_and_nothing_is_lost() {
        // A server configured far tighter than the agent's batches.
        let sink = FakeSink::new(10_000);
        let mut lines: Vec<String> = (0..400)
            .map(|i| format!("{i:03}{}", "y".repeat(997)))
            .collect();
        // One line alone larger than the limit: cut, its pieces in order.
        let long: String = (0..50_000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        lines.insert(200, long.clone());
        let abandoned = write_all(
            &sink,
            lines.iter().cloned().map(stdout).collect(),
            Duration::from_secs(60),
        )
        .await;
        assert!(!abandoned);
        let got = sink.lines();
        assert!(sink.taken.lock().unwrap().1 > 0, "the server refused some");
        assert_eq!(got[..200], lines[..200]);
        assert_eq!(got[got.len() - 200..], lines[201..]);
        assert_eq!(got[200..got.len() - 200].concat(), long);
        // The halves of a refused batch take numbers after it: rising, each
        // stored batch's its own (a refused one was never stored).
        let taken = sink.taken.lock().unwrap();
        assert!(taken.0.windows(2).all(|w| w[0].batch < w[1].batch));
        assert!(taken.0[0].batch >= 1);
    }

    #[test]
    fn an_agent_line_too_long_for_one_batch_is_cut_on_character_boundaries() {
        let long = "€\u{1}".repeat(BATCH_BYTES / 4);
        let pieces = split_long_lines(vec![LogLine {
            stream: LogStream::Agent,
            line: long.clone(),
        }]);
        assert!(pieces.len() >= 2);
        assert!(pieces.iter().all(|p| encoded_len(p) <= BATCH_BYTES));
        assert!(pieces.iter().all(|p| p.stream == LogStream::Agent));
        assert_eq!(
            pieces.iter().map(|p| p.line.as_str()).collect::<String>(),
            long
        );
    }

    /// H3: a log the server never takes was retried for ever, blocking the
    /// job's output once the channel filled; now the job is abandoned after
    /// the budget and its output drained.
    #[tokio::test(start_paused = true)]
    async fn a_log_the_server_never_takes_abandons_the_job_after_the_budget() {
        let sink = Arc::new(FakeSink {
            limit: MIB,
            unreachable: true,
            taken: Mutex::new((vec![], 0)),
        });
        let t0 = tokio::time::Instant::now();
        let budget = Duration::from_secs(600);
        let lines = (0..5000).map(|i| stdout(format!("line {i}"))).collect();
        assert!(write_all(&sink, lines, budget).await, "abandoned");
        let took = t0.elapsed();
        assert!(
            took >= budget && took < budget + Duration::from_secs(1),
            "{took:?}"
        );
    }
}
