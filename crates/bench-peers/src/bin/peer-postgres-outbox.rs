//! `peer-postgres-outbox`: serves the full PostgreSQL peer (see
//! `keyhold_bench_peers::pg_outbox`: an outbox row in each new order's
//! transaction, and its relay charging the payment provider at `--psp-url`)
//! until SIGTERM. Only parses arguments, connects, binds and starts the relay.

use anyhow::Context;
use clap::Parser;
use keyhold_bench_peers::pg::POOL_CONNECTIONS_DEFAULT;
use keyhold_bench_peers::pg_outbox::PgOutboxPeer;

#[derive(Parser)]
struct Args {
    /// Address to listen on, e.g. 127.0.0.1:7502.
    #[arg(long)]
    listen: String,
    /// e.g. "host=127.0.0.1 port=5432 user=bench dbname=outbox".
    #[arg(long)]
    database_url: String,
    /// Connections of the API's pool (the relay has its own).
    #[arg(long, default_value_t = POOL_CONNECTIONS_DEFAULT)]
    connections: usize,
    /// Origin of the payment provider the relay charges, e.g. the one of
    /// `keyhold fakepsp --listen 127.0.0.1:7440`: http://127.0.0.1:7440.
    #[arg(long)]
    psp_url: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let peer = PgOutboxPeer::connect(&args.database_url, args.connections, &args.psp_url)
        .await
        .context("cannot connect to PostgreSQL")?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let relay = peer.spawn_relay();
    let served = keyhold_bench_peers::serve(
        peer.router(),
        listener,
        keyhold_bench_peers::shutdown_signal(),
    )
    .await;
    // A batch in flight rolls back; its rows are delivered again next start.
    for worker in relay {
        worker.abort();
    }
    served?;
    Ok(())
}
