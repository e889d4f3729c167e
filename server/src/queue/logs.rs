//! The `job_logs` table: an attempt's lines appended under a size cap (the
//! head and the tail kept, the cut marked), and read back in pages.
//!
//! Why a cap per attempt: a job that prints without end (`yes`, a runaway
//! debug loop) would otherwise fill PostgreSQL, and every reader of its log
//! with it. The first half of the cap keeps the head (how it started), the
//! second half a rolling tail (how it ended); between them one marker line
//! says how much was cut. Its counters live on the attempt's `job_attempts`
//! row, which each append locks, so batches of one attempt apply in order.

use flotilla_core::protocol::LogLine;
use sqlx::PgPool;
use uuid::Uuid;

use super::lease::{refused, LeaseKey, LeaseRefused};

/// The stream name of the marker line between an attempt's head and tail.
const CUT_STREAM: &str = "cut";

/// Appends `lines` to the log of the attempt `key` holds, keeping at most
/// `cap_bytes` of line text for the attempt. `batch` is the agent's number
/// for them (see `LogBatch::batch`): one at or below the attempt's highest
/// stored is a retry of a batch already stored, and changes nothing.
pub async fn append(
    db: &PgPool,
    key: LeaseKey,
    batch: u64,
    lines: &[LogLine],
    cap_bytes: u64,
) -> Result<(), LeaseRefused> {
    let batch = i64::try_from(batch)
        .map_err(|_| LeaseRefused::Invalid(format!("log batch number {batch} is too large")))?;
    let mut tx = db.begin().await?;
    let attempt: Option<AttemptLog> = sqlx::query_as(
        "SELECT a.attempt, a.log_bytes, a.log_tail_bytes, a.log_cut_lines, a.log_cut_bytes,
                a.log_cut_seq, a.log_batch
         FROM jobs j JOIN job_attempts a ON a.job_id = j.id AND a.attempt = j.attempt
         WHERE j.id = $1 AND j.lease_token = $2 AND j.agent_id = $3
           AND j.state IN ('leased', 'running')
         FOR UPDATE OF a",
    )
    .bind(key.job)
    .bind(key.token)
    .bind(key.agent)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(mut a) = attempt else {
        drop(tx);
        return Err(refused(db, key).await);
    };
    if batch > 0 && batch <= a.log_batch {
        // Stored already: the agent did not hear the answer and sent it again.
        return Ok(());
    }
    a.log_batch = a.log_batch.max(batch);
    let head_cap = (cap_bytes / 2) as i64;
    let tail_cap = cap_bytes as i64 - head_cap;

    // PostgreSQL text cannot hold NUL.
    let texts: Vec<(&str, String)> = lines
        .iter()
        .map(|l| (l.stream.as_str(), l.line.replace('\0', "\u{FFFD}")))
        .collect();
    // Lines go to the head until the first that does not fit; from then on
    // every line is tail, so the order of lines is kept.
    let mut split = 0;
    if a.log_cut_seq.is_none() {
        while split < texts.len() && a.log_bytes + texts[split].1.len() as i64 <= head_cap {
            a.log_bytes += texts[split].1.len() as i64;
            split += 1;
        }
    }
    let (head, mut tail) = texts.split_at(split);
    insert(&mut tx, key.job, a.attempt, head, false).await?;
    if !tail.is_empty() {
        if a.log_cut_seq.is_none() {
            let seq: i64 = sqlx::query_scalar(
                "INSERT INTO job_logs (job_id, attempt, stream, line) VALUES ($1, $2, $3, '')
                 RETURNING seq",
            )
            .bind(key.job)
            .bind(a.attempt)
            .bind(CUT_STREAM)
            .fetch_one(&mut *tx)
            .await?;
            a.log_cut_seq = Some(seq);
        }
        // Lines of this batch that the tail could not keep anyway are cut
        // before they are written.
        let mut kept = 0i64;
        let mut first_kept = tail.len();
        while first_kept > 0 && kept + tail[first_kept - 1].1.len() as i64 <= tail_cap {
            first_kept -= 1;
            kept += tail[first_kept].1.len() as i64;
        }
        for (_, text) in &tail[..first_kept] {
            a.log_cut_lines += 1;
            a.log_cut_bytes += text.len() as i64;
        }
        tail = &tail[first_kept..];
        insert(&mut tx, key.job, a.attempt, tail, true).await?;
        a.log_tail_bytes += kept;
        if a.log_tail_bytes > tail_cap {
            trim_tail(&mut tx, key.job, &mut a, tail_cap).await?;
        }
        sqlx::query("UPDATE job_logs SET line = $3 WHERE job_id = $1 AND seq = $2")
            .bind(key.job)
            .bind(a.log_cut_seq)
            .bind(cut_marker(&a, head_cap, tail_cap))
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query(
        "UPDATE job_attempts SET log_bytes = $3, log_tail_bytes = $4, log_cut_lines = $5,
                                 log_cut_bytes = $6, log_cut_seq = $7, log_batch = $8
         WHERE job_id = $1 AND attempt = $2",
    )
    .bind(key.job)
    .bind(a.attempt)
    .bind(a.log_bytes)
    .bind(a.log_tail_bytes)
    .bind(a.log_cut_lines)
    .bind(a.log_cut_bytes)
    .bind(a.log_cut_seq)
    .bind(a.log_batch)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// An attempt's log counters (`job_attempts`).
#[derive(sqlx::FromRow)]
struct AttemptLog {
    attempt: i32,
    /// Bytes in the head.
    log_bytes: i64,
    log_tail_bytes: i64,
    log_cut_lines: i64,
    log_cut_bytes: i64,
    /// The marker line, once the head is full.
    log_cut_seq: Option<i64>,
    /// The highest batch number stored (0: none numbered).
    log_batch: i64,
}

async fn insert(
    tx: &mut sqlx::PgConnection,
    job: Uuid,
    attempt: i32,
    lines: &[(&str, String)],
    tail: bool,
) -> Result<(), sqlx::Error> {
    if lines.is_empty() {
        return Ok(());
    }
    let streams: Vec<&str> = lines.iter().map(|(s, _)| *s).collect();
    let texts: Vec<&str> = lines.iter().map(|(_, t)| t.as_str()).collect();
    sqlx::query(
        "INSERT INTO job_logs (job_id, attempt, stream, line, tail)
         SELECT $1, $2, x.s, x.l, $5
         FROM unnest($3::text[], $4::text[]) WITH ORDINALITY AS x(s, l, n)
         ORDER BY x.n",
    )
    .bind(job)
    .bind(attempt)
    .bind(&streams)
    .bind(&texts)
    .bind(tail)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Deletes the oldest tail lines until the tail fits `tail_cap`, reading
/// only as many lines as it deletes (plus one chunk).
async fn trim_tail(
    tx: &mut sqlx::PgConnection,
    job: Uuid,
    a: &mut AttemptLog,
    tail_cap: i64,
) -> Result<(), sqlx::Error> {
    let mut after = a.log_cut_seq.unwrap_or(0);
    while a.log_tail_bytes > tail_cap {
        let rows: Vec<(i64, i32)> = sqlx::query_as(
            "SELECT seq, octet_length(line) FROM job_logs
             WHERE job_id = $1 AND seq > $2 AND attempt = $3 AND tail
             ORDER BY seq LIMIT 1000",
        )
        .bind(job)
        .bind(after)
        .bind(a.attempt)
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            break;
        }
        let mut last = after;
        for (seq, len) in rows {
            if a.log_tail_bytes <= tail_cap {
                break;
            }
            a.log_tail_bytes -= len as i64;
            a.log_cut_lines += 1;
            a.log_cut_bytes += len as i64;
            last = seq;
        }
        sqlx::query(
            "DELETE FROM job_logs WHERE job_id = $1 AND seq > $2 AND seq <= $3 AND attempt = $4
                                    AND tail",
        )
        .bind(job)
        .bind(after)
        .bind(last)
        .bind(a.attempt)
        .execute(&mut *tx)
        .await?;
        after = last;
    }
    Ok(())
}

fn cut_marker(a: &AttemptLog, head_cap: i64, tail_cap: i64) -> String {
    format!(
        "[flotilla] {} lines ({}) cut here: an attempt's log keeps its first {} and its last {}",
        a.log_cut_lines,
        human_bytes(a.log_cut_bytes),
        human_bytes(head_cap),
        human_bytes(tail_cap)
    )
}

fn human_bytes(n: i64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// One stored line.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LogRow {
    pub seq: i64,
    pub attempt: i32,
    pub stream: String,
    pub line: String,
}

/// Up to `limit` lines after `after_seq`, oldest first.
pub async fn page(
    db: &PgPool,
    job: Uuid,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<LogRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT seq, attempt, stream, line FROM job_logs WHERE job_id = $1 AND seq > $2
         ORDER BY seq LIMIT $3",
    )
    .bind(job)
    .bind(after_seq)
    .bind(limit)
    .fetch_all(db)
    .await
}

/// The last `limit` lines, oldest first, and whether earlier ones exist.
pub async fn last(db: &PgPool, job: Uuid, limit: i64) -> Result<(Vec<LogRow>, bool), sqlx::Error> {
    let mut rows: Vec<LogRow> = sqlx::query_as(
        "SELECT seq, attempt, stream, line FROM job_logs WHERE job_id = $1
         ORDER BY seq DESC LIMIT $2",
    )
    .bind(job)
    .bind(limit + 1)
    .fetch_all(db)
    .await?;
    let earlier = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    rows.reverse();
    Ok((rows, earlier))
}

/// The attempt of the last line at or before `seq` (to continue the
/// attempt headers of a page), if any.
pub async fn attempt_before(db: &PgPool, job: Uuid, seq: i64) -> Result<Option<i32>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT attempt FROM job_logs WHERE job_id = $1 AND seq <= $2 ORDER BY seq DESC LIMIT 1",
    )
    .bind(job)
    .bind(seq)
    .fetch_optional(db)
    .await
}

/// Renders lines as text, one per line: agent lines marked `[agent]`, and a
/// `--- attempt N ---` header where the attempt changes (and before the
/// first line of an attempt after the first). `prev_attempt` is the attempt
/// of the line before `rows` (`None` at the start of the log); returns the
/// attempt of the last line.
pub fn render(rows: &[LogRow], mut prev_attempt: Option<i32>, out: &mut String) -> Option<i32> {
    for r in rows {
        if prev_attempt != Some(r.attempt) {
            if prev_attempt.is_some() || r.attempt > 1 {
                out.push_str(&format!("--- attempt {} ---\n", r.attempt));
            }
            prev_attempt = Some(r.attempt);
        }
        if r.stream == "agent" {
            out.push_str("[agent] ");
        }
        out.push_str(&r.line);
        out.push('\n');
    }
    prev_attempt
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, attempt: i32, stream: &str, line: &str) -> LogRow {
        LogRow {
            seq,
            attempt,
            stream: stream.into(),
            line: line.into(),
        }
    }

    #[test]
    fn attempts_are_headed_and_agent_lines_marked() {
        let rows = [
            row(1, 1, "stdout", "a"),
            row(2, 2, "agent", "b"),
            row(3, 2, "stderr", "c"),
        ];
        let mut out = String::new();
        assert_eq!(render(&rows, None, &mut out), Some(2));
        assert_eq!(out, "a\n--- attempt 2 ---\n[agent] b\nc\n");
        // A page that continues attempt 2 gets no header; one that starts
        // the log at attempt 3 does.
        let mut out = String::new();
        render(&rows[2..], Some(2), &mut out);
        assert_eq!(out, "c\n");
        let mut out = String::new();
        render(&[row(9, 3, "stdout", "x")], None, &mut out);
        assert_eq!(out, "--- attempt 3 ---\nx\n");
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
