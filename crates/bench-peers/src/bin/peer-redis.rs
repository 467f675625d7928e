//! `peer-redis`: serves the Redis peer (see `keyhold_bench_peers::redis_peer`)
//! until SIGTERM. Only parses arguments, connects and binds.

use anyhow::Context;
use clap::Parser;
use keyhold_bench_peers::redis_peer::RedisPeer;

#[derive(Parser)]
struct Args {
    /// Address to listen on, e.g. 127.0.0.1:7501.
    #[arg(long)]
    listen: String,
    /// e.g. redis://127.0.0.1:6379/
    #[arg(long)]
    redis_url: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let peer = RedisPeer::connect(&args.redis_url)
        .await
        .context("cannot connect to Redis")?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    keyhold_bench_peers::serve(
        peer.router(),
        listener,
        keyhold_bench_peers::shutdown_signal(),
    )
    .await?;
    Ok(())
}
