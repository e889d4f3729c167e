//! # flotilla-agent
//!
//! # Layout
//!
//! - [`process`]: runs one shell command in its own process group, streams its
//!   output lines, enforces timeout and cancellation on the whole tree.
//! - [`health`]: the host health report sent with every heartbeat.

pub mod health;
pub mod process;
