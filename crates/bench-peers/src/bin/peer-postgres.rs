//! `peer-postgres`: serves the PostgreSQL peer (see `keyhold_bench_peers::pg`)
//! until SIGTERM. Only parses arguments, connects and binds.

use anyhow::Context;
use clap::Parser;
use keyhold_bench_peers::pg::{PgPeer, POOL_CONNECTIONS_DEFAULT};

#[derive(Parser)]
struct Args {
    /// Address to listen on, e.g. 127.0.0.1:7500.
    #[arg(long)]
    listen: String,
    /// e.g. "host=127.0.0.1 port=5432 user=bench dbname=postgres".
    #[arg(long)]
    database_url: String,
    #[arg(long, default_value_t = POOL_CONNECTIONS_DEFAULT)]
    connections: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let peer = PgPeer::connect(&args.database_url, args.connections)
        .await
        .context("cannot connect to PostgreSQL")?;
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
