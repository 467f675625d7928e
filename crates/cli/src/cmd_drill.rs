//! `keyhold drill`: a region failover drill on a cluster started by `keyhold
//! up` (the work is in `keyhold-drill`); prints the report as a table, writes
//! it as JSON on request, and fails when the drill does.

use anyhow::Context;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct DrillArgs {
    /// The cluster's `cluster.json` (written by `keyhold up` in its data dir).
    #[arg(long)]
    cluster: PathBuf,
    /// The region to lose and fail over (to its standby).
    #[arg(long)]
    region: String,
    /// `kill` every node of the region, or `isolate` it.
    #[arg(long, default_value = "kill")]
    fault: String,
    /// Orders per second, over all regions, for the region's tenants.
    #[arg(long, default_value_t = 50.0)]
    rate: f64,
    /// Steady traffic before the fault, e.g. 10s.
    #[arg(long, value_parser = crate::duration, default_value = "10s")]
    duration: Duration,
    /// Let the cluster fail the region over by itself (a cluster started with
    /// `keyhold up --auto-failover-after`) instead of asking for it; the drill
    /// waits for the cluster's failover and reports its phases alike.
    #[arg(long)]
    auto: bool,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
}

pub fn run(args: DrillArgs) -> anyhow::Result<()> {
    let drill = keyhold_drill::Drill {
        cluster_file: args.cluster,
        region: args.region,
        fault: keyhold_drill::Fault::parse(&args.fault)?,
        trigger: if args.auto {
            keyhold_drill::Trigger::Automatic
        } else {
            keyhold_drill::Trigger::Request
        },
        rate: args.rate,
        duration: args.duration,
        progress: !args.quiet,
    };
    let report = crate::runtime()?.block_on(keyhold_drill::run(drill))?;
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    print!("{}", report.table());
    if !report.passed {
        anyhow::bail!("the drill failed: {}", report.failures.join("; "));
    }
    Ok(())
}
