//! `keyhold chaos`: runs seeds one after another against local clusters that
//! this same binary starts with `keyhold up`, prints one line per seed (the
//! seed first, so any run can be repeated), writes `summary.json` in the output
//! directory, and fails if any seed failed.

use anyhow::Context;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ChaosArgs {
    /// How many seeds to run.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// The first seed; seeds run from here upwards.
    #[arg(long, default_value_t = 1)]
    from: u64,
    /// Where each seed's directory (`seed-<n>`) goes; failing seeds are kept.
    #[arg(long, default_value = "chaos-runs")]
    out: PathBuf,
    /// Keep the directories of passing seeds too.
    #[arg(long)]
    keep: bool,
}

pub fn run(args: ChaosArgs) -> anyhow::Result<()> {
    let keyhold = std::env::current_exe().context("cannot find the keyhold binary")?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let options = keyhold_chaos::Options {
        keyhold,
        out_dir: args.out.clone(),
        keep_passing: args.keep,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut reports = Vec::new();
    let last = args.from.saturating_add(args.seeds);
    for seed in args.from..last {
        println!("seed {seed}: running");
        let report = runtime.block_on(keyhold_chaos::run_seed(seed, &options));
        println!("{}", report.line());
        reports.push(report);
    }
    let failed: Vec<u64> = reports.iter().filter(|r| !r.ok).map(|r| r.seed).collect();
    let summary = serde_json::json!({
        "seeds": reports.len(),
        "failed": failed,
        "requests": reports.iter().map(|r| r.requests).sum::<u64>(),
        "elapsed_ms": reports.iter().map(|r| r.elapsed_ms).sum::<u64>(),
        "reports": reports,
    });
    let path = args.out.join("summary.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&summary)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!(
        "chaos: {} seeds, {} failed {:?}, {} requests; summary in {}",
        reports.len(),
        failed.len(),
        failed,
        summary["requests"],
        path.display()
    );
    if !failed.is_empty() {
        anyhow::bail!("seeds {failed:?} failed");
    }
    Ok(())
}
