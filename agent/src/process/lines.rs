//! Reading a child's output pipes as lines of bounded length.

use std::io;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{LogLine, Stream, MAX_LINE_BYTES};

/// Reads one pipe to its end, sending each line. Stops early only when
/// `stop` fires and the pipe has nothing more to read right now.
pub(super) async fn pump<R: AsyncRead + Unpin>(
    pipe: R,
    stream: Stream,
    log: mpsc::Sender<LogLine>,
    stop: CancellationToken,
) {
    let mut reader = BufReader::with_capacity(MAX_LINE_BYTES, pipe);
    let mut line = Vec::new();
    let mut delivering = true;
    loop {
        let segment = tokio::select! {
            // Data already in the pipe is read before `stop` is looked at.
            biased;
            s = read_segment(&mut reader, &mut line, MAX_LINE_BYTES) => s,
            _ = stop.cancelled() => Ok(Segment::End),
        };
        let rest = match segment {
            Ok(Segment::Line) => None,
            Ok(Segment::Full) => Some(split_off_incomplete_char(&mut line)),
            Ok(Segment::End) => {
                if !line.is_empty() {
                    send(&log, stream, &mut line, &mut delivering).await;
                }
                return;
            }
            Err(e) => {
                tracing::warn!(?stream, "reading the child's output: {e}");
                if !line.is_empty() {
                    send(&log, stream, &mut line, &mut delivering).await;
                }
                return;
            }
        };
        send(&log, stream, &mut line, &mut delivering).await;
        if let Some(rest) = rest {
            line = rest;
        }
    }
}

/// Sends `line` (and clears it) unless the receiver has gone; after that
/// output is only drained.
async fn send(
    log: &mpsc::Sender<LogLine>,
    stream: Stream,
    line: &mut Vec<u8>,
    delivering: &mut bool,
) {
    let bytes = std::mem::take(line);
    if !*delivering {
        return;
    }
    let text = String::from_utf8(bytes)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    if log.send(LogLine { stream, line: text }).await.is_err() {
        *delivering = false;
    }
}

/// How [`read_segment`] stopped.
#[derive(Debug, PartialEq, Eq)]
enum Segment {
    /// A line ended; its terminator is not in the buffer.
    Line,
    /// The buffer reached the maximum and the line goes on.
    Full,
    /// End of input; the buffer may hold a last, unterminated line.
    End,
}

/// Appends to `line` until a `\n` (consumed, not appended; a `\r` before it
/// is removed), `max` bytes, or the end of input. Cancel-safe: bytes are
/// consumed from the reader only as they are appended to `line`, which the
/// caller owns, so a cancelled call loses nothing.
async fn read_segment<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> io::Result<Segment> {
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(Segment::End);
        }
        let room = max.saturating_sub(line.len());
        // One byte beyond the room: a line of exactly `max` bytes whose `\n`
        // is next ends here, rather than being followed by an empty line.
        let window = &buf[..buf.len().min(room + 1)];
        if let Some(i) = window.iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&buf[..i]);
            reader.consume(i + 1);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Segment::Line);
        }
        if room == 0 {
            return Ok(Segment::Full);
        }
        let n = window.len().min(room);
        line.extend_from_slice(&buf[..n]);
        reader.consume(n);
    }
}

/// Removes and returns the bytes at the end of `bytes` that start a UTF-8
/// character without finishing it, so a long line split at [`MAX_LINE_BYTES`]
/// does not turn one character into two replacement characters.
fn split_off_incomplete_char(bytes: &mut Vec<u8>) -> Vec<u8> {
    let len = bytes.len();
    for back in 1..=len.min(3) {
        let b = bytes[len - back];
        if b & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: the character started earlier
        }
        let needed = match b {
            0xF0..=0xF7 => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        return if needed > back {
            bytes.split_off(len - back)
        } else {
            Vec::new()
        };
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn segments(input: &[u8], max: usize) -> Vec<(Segment, Vec<u8>)> {
        let mut reader = input;
        let mut out = Vec::new();
        loop {
            let mut line = Vec::new();
            let s = read_segment(&mut reader, &mut line, max)
                .await
                .expect("reading a slice");
            let end = s == Segment::End;
            out.push((s, line));
            if end {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn splits_lines_and_strips_terminators() {
        let got = segments(b"a\r\nbb\n\nlast", 10).await;
        let lines: Vec<_> = got.iter().map(|(_, l)| l.as_slice()).collect();
        assert_eq!(lines, [&b"a"[..], b"bb", b"", b"last"]);
        assert_eq!(got.last().map(|(s, _)| s), Some(&Segment::End));
    }

    #[tokio::test]
    async fn long_line_is_cut_at_max_and_exact_fit_has_no_empty_tail() {
        let got = segments(b"abcdefg\nabcd\n", 4).await;
        let seen: Vec<_> = got.iter().map(|(s, l)| (s, l.as_slice())).collect();
        assert_eq!(
            seen,
            [
                (&Segment::Full, &b"abcd"[..]),
                (&Segment::Line, b"efg"),
                (&Segment::Line, b"abcd"),
                (&Segment::End, b""),
            ]
        );
    }

    #[test]
    fn incomplete_character_is_carried_over() {
        let mut v = "ab€".as_bytes().to_vec(); // € is E2 82 AC
        v.truncate(4); // "ab" + E2 82
        assert_eq!(split_off_incomplete_char(&mut v), [0xE2, 0x82]);
        assert_eq!(v, b"ab");

        let mut whole = "ab€".as_bytes().to_vec();
        assert!(split_off_incomplete_char(&mut whole).is_empty());
        assert_eq!(whole, "ab€".as_bytes());

        let mut invalid = vec![b'a', 0xFF];
        assert!(split_off_incomplete_char(&mut invalid).is_empty());
    }
}
