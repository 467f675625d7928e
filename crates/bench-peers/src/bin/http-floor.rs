//! `http-floor`: serves the fixed 200-byte answer (see
//! `keyhold_bench_peers::floor`) until SIGTERM.

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// Address to listen on, e.g. 127.0.0.1:7502.
    #[arg(long)]
    listen: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    keyhold_bench_peers::serve(
        keyhold_bench_peers::floor::router(),
        listener,
        keyhold_bench_peers::shutdown_signal(),
    )
    .await?;
    Ok(())
}
