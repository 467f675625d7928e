//! keyhold's history checker, in the spirit of Jepsen's checkers: clients record
//! every request and its fate ([`history`]), the reader fetches the cluster's
//! final state through its APIs ([`read`]), and the pure analysis
//! ([`analysis::check`]) turns both into a [`Verdict`]: acknowledged orders lost
//! or changed, duplicates, replays that differ, wrong answers, charges and
//! reservations other than one per effect, claims completed by fenced owners.
//!
//! The analysis knows nothing of HTTP, so every violation kind is tested on
//! purpose-built histories (tests/violations.rs); `keyhold loadgen --verify` and
//! `keyhold chaos` use the whole pipeline.

pub mod analysis;
pub mod history;
pub mod limits;
pub mod read;
pub mod state;
pub mod verdict;

pub use analysis::check;
pub use history::{History, Op, Outcome, Recorder, Request, Sender};
pub use read::{ReadOptions, Target};
pub use state::FinalState;
pub use verdict::{Kind, Verdict, Violation};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("http client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("checker target: {0}")]
    Target(String),
    #[error("cannot read the final state: {0}")]
    Read(String),
}

/// Reads the final state for `history` and judges it.
pub async fn read_and_check(
    target: &Target,
    history: &History,
    options: ReadOptions,
) -> Result<(FinalState, Verdict), Error> {
    let state = read::read(target, history, options).await?;
    let verdict = check(history, &state);
    Ok((state, verdict))
}
