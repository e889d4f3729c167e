//! Exponential back-off between retries: doubles from a first delay up to a cap.

use std::time::Duration;

/// The delays to wait between failed tries: `first`, then twice the last,
/// never more than `max`. [`Backoff::reset`] after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            next: first.min(max),
        }
    }

    /// The delay to wait now; the following one is twice as long, up to the
    /// cap.
    pub fn next_delay(&mut self) -> Duration {
        let now = self.next;
        self.next = (now * 2).min(self.max);
        now
    }

    /// Back to the first delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.first.min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
        let got: Vec<u64> = (0..5).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(got, [100, 200, 400, 700, 700]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }
}
