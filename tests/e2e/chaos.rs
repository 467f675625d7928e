//! Seeded chaos in CI: `keyhold chaos` runs two seeds (each a local cluster
//! through `keyhold up`, client traffic and faults from the seed, judged by
//! the history checker) and must pass both. A failing seed's directory (plan,
//! history, final state, verdict, logs) is kept and named in the output.

use std::process::Command;

const KEYHOLD: &str = env!("CARGO_BIN_EXE_keyhold");
/// Seeds CI runs: few, so the suite stays short; `scripts/chaos` runs many.
/// Seeds 1 and 2 take about 16 s each and between them plan every fault kind:
/// a region isolated and healed, a node killed and started through `up`'s
/// control API, the whole cluster killed twice, two moves and an outbox replay.
const FROM: u64 = 1;
const SEEDS: u64 = 2;

#[test]
fn two_chaos_seeds_pass_the_checker() {
    let out = tempfile::Builder::new()
        .prefix("keyhold-chaos-")
        .tempdir()
        .expect("tempdir");
    // Kept outside the tempdir on failure, so the evidence survives the test.
    let runs = std::env::temp_dir().join(format!("keyhold-chaos-ci-{}", std::process::id()));
    let output = Command::new(KEYHOLD)
        .args([
            "chaos",
            "--seeds",
            &SEEDS.to_string(),
            "--from",
            &FROM.to_string(),
            "--out",
        ])
        .arg(&runs)
        .current_dir(out.path())
        .output()
        .expect("run keyhold chaos");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "keyhold chaos failed; its runs are in {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        runs.display()
    );
    for seed in FROM..FROM + SEEDS {
        assert!(
            stdout.contains(&format!("seed {seed}: ok")),
            "seed {seed} did not report ok:\n{stdout}"
        );
    }
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(runs.join("summary.json")).expect("summary.json"))
            .expect("summary is JSON");
    assert_eq!(summary["seeds"], SEEDS);
    assert!(summary["requests"].as_u64().unwrap() > 100, "{summary}");
    let _ = std::fs::remove_dir_all(&runs);
}
