//! The `keyhold` binary: parses the command line, sets up tracing, and calls into
//! the libraries. No logic lives here beyond turning arguments into configs.

mod cmd_admin;
mod cmd_chaos;
mod cmd_drill;
mod cmd_fingerprint;
mod limits;
mod log_summary;

use anyhow::Context;
use clap::{Parser, Subcommand};
use keyhold_server::config::Downstream;
use keyhold_server::{parse_duration, Config};
use keyhold_up::UpConfig;
use serde_json::json;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// jemalloc as the process allocator. glibc's malloc keeps memory freed by one
/// thread in that thread's arena, and a node frees much of what it allocates on
/// other threads (sled's tree nodes, freed through crossbeam-epoch by whichever
/// thread collects): with 1 MiB import commands jemalloc held a quarter to a
/// half less RSS than glibc; with the server's 128 KiB ones the two hold about
/// the same (docs/benchmarks.md, "Memory with the stored data"). Its options
/// are built in from `.cargo/config.toml`: freed pages go back to the OS
/// within about a second (tests/allocator.rs).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "keyhold",
    version,
    about = "Safe retries for multi-region APIs"
)]
struct Cli {
    /// How log lines on stderr look: `text` (colours only on a terminal) or
    /// `json` (one object per line, for log shippers).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The log filter when `RUST_LOG` is unset: keyhold at info, libraries only
/// when something is wrong. openraft reports every failed vote while the
/// registry's members start one after another, which is expected at start-up
/// and says nothing an operator can act on; its errors still show.
const LOG_FILTER_DEFAULT: &str =
    "info,openraft=error,sled=warn,hyper=warn,hyper_util=warn,reqwest=warn,h2=warn,tower=warn,tower_http=warn";

#[derive(Subcommand)]
enum Command {
    /// Run one node from a TOML config file.
    Serve {
        /// The node's TOML config file (docs/operations.md lists its keys).
        #[arg(long)]
        config: PathBuf,
    },
    /// Run a whole local cluster in the foreground and write DIR/cluster.json.
    Up(UpArgs),
    /// Run the fake payment provider (honours Idempotency-Key; can lose answers).
    Fakepsp {
        /// Address to listen on, e.g. 127.0.0.1:7440.
        #[arg(long)]
        listen: String,
        /// Where charges are stored.
        #[arg(long, default_value = "./fakepsp-data")]
        data_dir: PathBuf,
        /// Probability (0 to 1) that an answer is lost after the charge committed.
        #[arg(long, default_value_t = 0.0)]
        drop_response_rate: f64,
        /// Probability (0 to 1) that a charge is declined.
        #[arg(long, default_value_t = 0.0)]
        decline_rate: f64,
        /// Probability (0 to 1) that a retry of a committed charge is refused
        /// (400) instead of replayed.
        #[arg(long, default_value_t = 0.0)]
        refuse_replay_rate: f64,
    },
    /// Send a mix of new, replayed, conflicting and concurrent duplicate orders
    /// and report latencies.
    Loadgen(LoadgenArgs),
    /// Seeded chaos runs: local clusters, client traffic and faults from one
    /// seed each, judged by the history checker.
    Chaos(cmd_chaos::ChaosArgs),
    /// A region failover drill on a cluster started by `keyhold up`: steady
    /// traffic, the fault, the failover, the return, the reconciliation, and
    /// a report; fails on any unlisted loss or duplicate.
    Drill(cmd_drill::DrillArgs),
    /// Tenant administration through any node's admin API.
    Tenant {
        #[command(subcommand)]
        action: TenantAction,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Whole-region administration: an unplanned failover.
    Region {
        #[command(subcommand)]
        action: RegionAction,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The cluster as a node sees it: registry leader, regions, nodes.
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Moves and failovers: list them, or show one with its progress and result.
    Operation {
        #[command(subcommand)]
        action: OperationAction,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Re-publish kept outbox events of every region (consumers skip what
    /// they processed, so nothing takes effect twice).
    Outbox {
        #[command(subcommand)]
        action: OutboxAction,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Membership: add a node started with `start = "join"`, or remove one.
    Node {
        #[command(subcommand)]
        action: NodeAction,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Faults for drills on a cluster started by `keyhold up`, through its
    /// control API: kill, start, isolate and heal nodes and regions.
    Control {
        #[command(subcommand)]
        action: ControlAction,
        /// The cluster.json `keyhold up` wrote: it names the control API and
        /// holds the admin token that opens it.
        #[arg(long, global = true, default_value = "data/cluster.json")]
        cluster: PathBuf,
    },
    /// Print the RFC 8785 canonical form of a JSON document.
    Canonicalize {
        /// Input file; `-` or nothing reads standard input.
        file: Option<PathBuf>,
    },
    /// Print the request fingerprint of a JSON body under a spec.
    Fingerprint {
        /// `orders` (built in) or a spec file.
        #[arg(long)]
        spec: String,
        /// Print the keyed form using the secret in this environment variable.
        #[arg(long)]
        hmac_key_env: Option<String>,
        /// Input file; `-` or nothing reads standard input.
        file: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct UpArgs {
    /// The cluster's directory: stores, logs, secrets and cluster.json. An
    /// existing one is resumed (same --base-port, --regions and
    /// --nodes-per-region).
    #[arg(long)]
    data_dir: PathBuf,
    /// First of the 50 ports the cluster uses on 127.0.0.1 (node APIs from
    /// here, Raft +10, proxies +20 and +30, payment provider +40, control +41).
    #[arg(long)]
    base_port: u16,
    /// Comma-separated region names.
    #[arg(long, default_value = "a,b,c", value_delimiter = ',')]
    regions: Vec<String>,
    /// How long responses are replayed, e.g. 48h.
    #[arg(long, value_parser = duration)]
    response_ttl: Option<Duration>,
    /// How long client_order_id markers block duplicates, e.g. 30d.
    #[arg(long, value_parser = duration)]
    marker_ttl: Option<Duration>,
    /// How long consumers remember processed events, e.g. 35d.
    #[arg(long, value_parser = duration)]
    processed_ttl: Option<Duration>,
    /// How long the payment provider remembers an Idempotency-Key, e.g. 40d;
    /// unset: forever (the bundled fake provider keeps every key).
    #[arg(long, value_parser = duration)]
    psp_key_retention: Option<Duration>,
    /// Fail a region over to its standby on its own once none of its nodes
    /// has been ready this long (at least 2s; unset: by hand only).
    #[arg(long, value_parser = duration)]
    auto_failover_after: Option<Duration>,
    /// A region acknowledges a write only while its standby has confirmed
    /// every command older than this (what a failover can lose), e.g. 1s (the
    /// default) to 60s; a standby silent that long plus 3 s is recorded lost
    /// and the region runs unprotected until it is back.
    #[arg(long, value_parser = duration)]
    max_standby_lag: Option<Duration>,
    /// Probability (0 to 1) that the fake payment provider loses an answer.
    #[arg(long, default_value_t = 0.0)]
    psp_drop_response_rate: f64,
    /// Probability (0 to 1) that the fake payment provider declines a charge.
    #[arg(long, default_value_t = 0.0)]
    psp_decline_rate: f64,
    /// Simulated round trip between regions, e.g. 50ms, added by the proxies
    /// through which nodes reach other regions (clients reach their region
    /// directly); default none.
    #[arg(long, value_parser = duration)]
    inter_region_rtt: Option<Duration>,
    /// Nodes per region, 1 to 3: each region's store is replicated to that
    /// many node processes (a majority must hold a write before it is answered).
    #[arg(long, default_value_t = 1)]
    nodes_per_region: usize,
    /// Each region's standby region, e.g. a=b,b=c,c=a: the standby's nodes keep
    /// a streamed copy of the region's store. Default: the next region in
    /// --regions, cyclically (none with one region).
    #[arg(long, value_delimiter = ',')]
    standby: Vec<String>,
    /// Serve this folder (wasm/site, built by wasm/build.sh) at /demo instead
    /// of the demo compiled into the binary (for working on the page).
    #[arg(long)]
    demo_dir: Option<PathBuf>,
    /// Whether the nodes deliver their outbox events (inventory, payments).
    #[arg(long, value_enum, default_value_t = DownstreamArg::On)]
    downstream: DownstreamArg,
}

/// `keyhold up --downstream`: the nodes' `downstream` setting.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DownstreamArg {
    /// Every region's relays deliver its events (the default).
    On,
    /// Ingest only: orders write their events, no relay delivers them; they
    /// stay in the outbox (for benchmarks of the write path alone).
    Off,
}

impl UpArgs {
    /// `keyhold` is the binary every node runs (this one), logging as `up` does.
    fn into_config(self, keyhold: PathBuf, log: LogFormat) -> UpConfig {
        let a = self;
        let format = match log {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        };
        UpConfig {
            keyhold,
            node_args: vec!["--log-format".into(), format.into()],
            data_dir: a.data_dir,
            base_port: a.base_port,
            regions: a.regions,
            response_ttl: a.response_ttl,
            marker_ttl: a.marker_ttl,
            processed_ttl: a.processed_ttl,
            psp_key_retention: a.psp_key_retention,
            auto_failover_after: a.auto_failover_after,
            max_standby_lag: a.max_standby_lag,
            psp_drop_response_rate: a.psp_drop_response_rate,
            psp_decline_rate: a.psp_decline_rate,
            demo_dir: a.demo_dir,
            inter_region_rtt: a.inter_region_rtt,
            nodes_per_region: a.nodes_per_region,
            standby: a.standby,
            downstream: match a.downstream {
                DownstreamArg::On => Downstream::On,
                DownstreamArg::Off => Downstream::Off,
            },
        }
    }
}

#[derive(clap::Args)]
struct AdminArgs {
    /// Origin of any node, e.g. http://127.0.0.1:7400. Without it: the first
    /// region's node of --cluster, else $KEYHOLD_URL, else
    /// http://127.0.0.1:7400.
    #[arg(long, global = true)]
    url: Option<String>,
    /// A cluster.json written by `keyhold up`: its first region's node is
    /// the default --url, and its admin token the default --admin-token.
    #[arg(long, global = true)]
    cluster: Option<PathBuf>,
    /// The admin token (or set KEYHOLD_ADMIN_TOKEN).
    #[arg(
        long,
        global = true,
        env = "KEYHOLD_ADMIN_TOKEN",
        hide_env_values = true
    )]
    admin_token: Option<String>,
}

#[derive(Subcommand)]
enum TenantAction {
    /// Create a tenant homed in a region; prints its token once.
    Create {
        /// The new tenant's id (letters, digits, `-` and `_`).
        #[arg(long)]
        id: String,
        /// The region that executes the tenant's requests.
        #[arg(long)]
        home: String,
        /// `zone` (default) or `region`: with `region` every answer waits until
        /// the home region's standby holds the command too.
        #[arg(long, value_parser = ["zone", "region"])]
        survival: Option<String>,
    },
    /// Show a tenant's home, epoch and state.
    Show {
        /// The tenant's id.
        #[arg(long)]
        id: String,
    },
    /// Move a tenant to another home region and follow the move to its end.
    Move {
        /// The tenant's id.
        #[arg(long)]
        id: String,
        /// The region to become its home.
        #[arg(long)]
        to: String,
    },
    /// Issue a new token (printed once); the old one keeps working for the
    /// grace period (default 24h, at most 7d), then is refused.
    RotateToken {
        /// The tenant's id.
        #[arg(long)]
        id: String,
        /// How long the old token keeps working, e.g. 1h; 0s ends it at once.
        #[arg(long, value_parser = duration)]
        grace: Option<Duration>,
    },
    /// Change a tenant's rate limits (either or both).
    SetLimits {
        /// The tenant's id.
        #[arg(long)]
        id: String,
        /// Requests a second the tenant may send (all kinds); unchanged if absent.
        #[arg(long)]
        requests_per_second: Option<u32>,
        /// New idempotency keys a second (first attempts); unchanged if absent.
        #[arg(long)]
        new_keys_per_second: Option<u32>,
    },
    /// Delete a tenant: its tokens stop working, every region erases its
    /// records, markers, orders and undelivered events; the id is never reused.
    Delete {
        /// The tenant's id.
        #[arg(long)]
        id: String,
    },
    /// List every tenant the registry holds, with its home and state.
    List,
}

#[derive(Subcommand)]
enum OperationAction {
    /// List every move and failover, running and ended.
    List,
    /// Show one operation: its state, progress, and a failover's result.
    Show {
        /// The operation's id (`op_…`, as `tenant move` and `region failover` print).
        #[arg(long)]
        id: String,
    },
}

#[derive(Subcommand)]
enum OutboxAction {
    /// Re-publish every kept event, or those after --since, in every region.
    Replay {
        /// Only events that occurred after this time (RFC 3339, e.g.
        /// 2026-12-07T14:00:00Z); default: every kept event.
        #[arg(long)]
        since: Option<String>,
    },
}

#[derive(Subcommand)]
enum NodeAction {
    /// Add a node (started with `start = "join"`) to the registry and its
    /// region's group, and wait until it votes in both.
    Add {
        /// The new node's id: never used before in this cluster.
        #[arg(long)]
        id: u64,
        /// The node's region.
        #[arg(long)]
        region: String,
        /// Where the other nodes reach its API (host:port).
        #[arg(long)]
        api_addr: String,
        /// Where the other nodes reach its Raft listener (host:port).
        #[arg(long)]
        raft_addr: String,
    },
    /// Take a node out of its region's group and the registry (refused for a
    /// group's last voter).
    Remove {
        /// The node's id.
        #[arg(long)]
        id: u64,
    },
}

#[derive(Subcommand)]
enum ControlAction {
    /// SIGKILL a node (`keyhold up` reaps it; `start` brings it back).
    Kill {
        /// The node's id (cluster.json's `nodes`).
        #[arg(long)]
        node: u64,
    },
    /// Start a killed node again on its data dir and ports.
    Start {
        /// The node's id.
        #[arg(long)]
        node: u64,
    },
    /// Cut a node, or a whole region, off from every other node; clients
    /// still reach it.
    Isolate {
        #[command(flatten)]
        target: ControlTarget,
    },
    /// End an isolation.
    Heal {
        #[command(flatten)]
        target: ControlTarget,
    },
}

/// One node or one region, exactly one of the two.
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
struct ControlTarget {
    /// A node's id.
    #[arg(long)]
    node: Option<u64>,
    /// A region's name.
    #[arg(long)]
    region: Option<String>,
}

impl ControlTarget {
    /// The control API's path for `verb` on this target.
    fn path(&self, verb: &str) -> String {
        match self.node {
            Some(id) => format!("/v1/nodes/{id}/{verb}"),
            None => {
                let region = self.region.as_deref();
                format!(
                    "/v1/regions/{}/{verb}",
                    region.expect("clap requires --node or --region")
                )
            }
        }
    }
}

#[derive(Subcommand)]
enum RegionAction {
    /// Show the region's reconciliation report after a failover from it:
    /// its state and the orphans (what it executed that the failover lost).
    Reconciliation {
        /// The region that returned after a failover.
        #[arg(long)]
        region: String,
    },
    /// Fail a lost region over to its standby (or --to, which must hold a
    /// copy): its tenants move there with what the copy held, and the loss is
    /// estimated. Refused while the region is healthy unless --force.
    Failover {
        /// The lost region to fail over.
        #[arg(long)]
        region: String,
        /// The region to fail over to (it must hold a copy); default: the
        /// region's standby.
        #[arg(long)]
        to: Option<String>,
        /// Fail over a region that still answers (a drill, or a region that
        /// is up but must be given up).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
enum ClusterAction {
    /// Print the cluster view of the node at --url.
    Status,
}

/// One call of `keyhold up`'s control API, named by cluster.json.
fn control(cluster: &std::path::Path, action: ControlAction) -> anyhow::Result<()> {
    let file = keyhold_up::ClusterFile::read(cluster)
        .with_context(|| format!("cannot read --cluster {}", cluster.display()))?;
    let path = match &action {
        ControlAction::Kill { node } => format!("/v1/nodes/{node}/kill"),
        ControlAction::Start { node } => format!("/v1/nodes/{node}/start"),
        ControlAction::Isolate { target } => target.path("isolate"),
        ControlAction::Heal { target } => target.path("heal"),
    };
    let admin = cmd_admin::Admin::new(&file.control_url, file.admin_token)?;
    runtime()?.block_on(admin.post(&path, &json!({})))
}

fn admin_call(
    args: AdminArgs,
    f: impl AsyncFnOnce(cmd_admin::Admin) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let (url, token) = admin_target(args, std::env::var(URL_ENV).ok())?;
    let admin = cmd_admin::Admin::new(&url, token)?;
    runtime()?.block_on(f(admin))
}

/// The environment variable that gives the admin commands' default `--url`.
const URL_ENV: &str = "KEYHOLD_URL";
/// The admin commands' `--url` when nothing else gives one (`keyhold up
/// --base-port 7400`'s first node, and deploy/local/a.toml's).
const URL_DEFAULT: &str = "http://127.0.0.1:7400";

/// The node and the admin token an admin command uses: `--url`, else the
/// first region of `--cluster`, else `env_url` ($KEYHOLD_URL), else
/// `URL_DEFAULT`; `--admin-token` ($KEYHOLD_ADMIN_TOKEN), else `--cluster`'s.
/// What is given on the command line wins over the environment.
fn admin_target(args: AdminArgs, env_url: Option<String>) -> anyhow::Result<(String, String)> {
    let file = match &args.cluster {
        Some(path) => Some(
            keyhold_up::ClusterFile::read(path)
                .with_context(|| format!("cannot read --cluster {}", path.display()))?,
        ),
        None => None,
    };
    let url = args
        .url
        .or_else(|| Some(file.as_ref()?.regions.first()?.api_url.clone()))
        .or(env_url)
        .unwrap_or_else(|| URL_DEFAULT.to_owned());
    let token = args
        .admin_token
        .or_else(|| file.map(|f| f.admin_token))
        .context("give --admin-token, set KEYHOLD_ADMIN_TOKEN, or give --cluster")?;
    Ok((url, token))
}

fn duration(text: &str) -> Result<Duration, String> {
    parse_duration(text)
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(LOG_FILTER_DEFAULT));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // Repeated WARN and ERROR lines (a retried error) are written once an
    // interval and summarised (log_summary.rs).
    let repeats = log_summary::Repeats::default();
    let summary = log_summary::SummaryLayer {
        repeats: repeats.clone(),
    };
    match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .finish()
            .with(summary)
            .init(),
        // Colour codes only help a person at a terminal; in a file or a pipe
        // they are noise that breaks grep.
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .finish()
            .with(summary)
            .init(),
    }
    repeats.spawn_summaries();
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("shutting down");
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log = cli.log_format;
    let result = match cli.command {
        Command::Canonicalize { file } => cmd_fingerprint::canonicalize(file.as_deref()),
        Command::Fingerprint {
            spec,
            hmac_key_env,
            file,
        } => cmd_fingerprint::fingerprint(&spec, file.as_deref(), hmac_key_env.as_deref()),
        Command::Serve { config } => serve(config, log),
        Command::Tenant { action, admin } => admin_call(admin, async move |a| match action {
            TenantAction::Create { id, home, survival } => {
                a.create_tenant(&id, &home, survival.as_deref()).await
            }
            TenantAction::Show { id } => a.get(&format!("/admin/v1/tenants/{id}")).await,
            TenantAction::Move { id, to } => a.move_tenant(&id, &to).await,
            TenantAction::RotateToken { id, grace } => a.rotate_token(&id, grace).await,
            TenantAction::SetLimits {
                id,
                requests_per_second,
                new_keys_per_second,
            } => {
                a.set_limits(&id, requests_per_second, new_keys_per_second)
                    .await
            }
            TenantAction::Delete { id } => a.delete_tenant(&id).await,
            TenantAction::List => a.get("/admin/v1/tenants").await,
        }),
        Command::Region { action, admin } => admin_call(admin, async move |a| match action {
            RegionAction::Failover { region, to, force } => {
                a.fail_over(&region, to.as_deref(), force).await
            }
            RegionAction::Reconciliation { region } => {
                a.get(&format!("/admin/v1/regions/{region}/reconciliation"))
                    .await
            }
        }),
        Command::Operation { action, admin } => admin_call(admin, async move |a| match action {
            OperationAction::List => a.get("/admin/v1/operations").await,
            OperationAction::Show { id } => a.get(&format!("/admin/v1/operations/{id}")).await,
        }),
        Command::Outbox {
            action: OutboxAction::Replay { since },
            admin,
        } => admin_call(admin, async move |a| a.replay(since.as_deref()).await),
        Command::Node { action, admin } => admin_call(admin, async move |a| match action {
            NodeAction::Add {
                id,
                region,
                api_addr,
                raft_addr,
            } => a.add_node(id, &region, &api_addr, &raft_addr).await,
            NodeAction::Remove { id } => {
                a.post(&format!("/admin/v1/nodes/{id}/remove"), &json!({}))
                    .await
            }
        }),
        Command::Control { action, cluster } => control(&cluster, action),
        Command::Cluster {
            action: ClusterAction::Status,
            admin,
        } => admin_call(admin, async move |a| a.get("/admin/v1/cluster").await),
        Command::Loadgen(args) => loadgen(args),
        Command::Chaos(args) => cmd_chaos::run(args),
        Command::Drill(args) => cmd_drill::run(args),
        Command::Up(args) => up(args, log),
        Command::Fakepsp {
            listen,
            data_dir,
            drop_response_rate,
            decline_rate,
            refuse_replay_rate,
        } => fakepsp(
            log,
            listen,
            keyhold_fakepsp::PspConfig {
                data_dir,
                drop_response_rate,
                decline_rate,
                refuse_replay_rate,
            },
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn serve(path: PathBuf, log: LogFormat) -> anyhow::Result<()> {
    // Started by `keyhold up`: die with it (a no-op otherwise).
    keyhold_up::follow_supervisor()?;
    init_tracing(log);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    let mut config = Config::from_toml(&text).with_context(|| format!("in {}", path.display()))?;
    config
        .take_from_host(&keyhold_server::config::Host::current()?)
        .with_context(|| format!("in {}", path.display()))?;
    config.validate()?;
    runtime()?.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        keyhold_server::run(config, listener, shutdown_signal()).await?;
        Ok(())
    })
}

fn up(args: UpArgs, log: LogFormat) -> anyhow::Result<()> {
    init_tracing(log);
    let keyhold = std::env::current_exe().context("cannot find the keyhold binary")?;
    let config = args.into_config(keyhold, log);
    runtime()?.block_on(async move {
        keyhold_up::run(config, shutdown_signal()).await?;
        Ok(())
    })
}

#[derive(clap::Args)]
struct LoadgenArgs {
    /// Origin of a node, e.g. http://127.0.0.1:7400.
    #[arg(long)]
    target: String,
    /// A tenant's bearer token.
    #[arg(long)]
    token: String,
    /// Weights of the request kinds: new, replay, conflict, dup (concurrent
    /// duplicates in groups of 4).
    #[arg(long, default_value = "new=90,replay=5,conflict=5")]
    mix: String,
    /// Clients sending at once, each waiting for its answer before the next.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// How long to send, e.g. 30s.
    #[arg(long, value_parser = duration, default_value = "10s")]
    duration: Duration,
    /// Requests per second across all clients (open loop); closed loop without.
    #[arg(long)]
    rate: Option<f64>,
    /// Also write the JSON report to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// No live progress bar on stderr.
    #[arg(long)]
    quiet: bool,
    /// Record every request and afterwards check the history against the final
    /// state with the history checker (orders lost, changed or duplicated,
    /// replays that differ); exits non-zero on any violation.
    #[arg(long)]
    verify: bool,
    /// With --verify: the admin token (or KEYHOLD_ADMIN_TOKEN), so that
    /// inventory reservations are checked too (needs --psp-url).
    #[arg(long, env = "KEYHOLD_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// With --verify: the payment provider's origin, so that charges are
    /// checked too (needs --admin-token).
    #[arg(long)]
    psp_url: Option<String>,
}

fn loadgen(args: LoadgenArgs) -> anyhow::Result<()> {
    let load = keyhold_loadgen::Load {
        target: args.target.trim_end_matches('/').to_owned(),
        token: args.token,
        mix: keyhold_loadgen::Mix::parse(&args.mix)?,
        concurrency: args.concurrency,
        duration: args.duration,
        rate: args.rate,
        progress: !args.quiet,
        verify: args.verify,
        admin_token: args.admin_token,
        psp_url: args.psp_url.map(|u| u.trim_end_matches('/').to_owned()),
    };
    let report = runtime()?.block_on(keyhold_loadgen::run(load))?;
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(path) = args.out {
        std::fs::write(&path, &json).with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!("{json}");
    if let Some(verdict) = &report.verify {
        eprintln!("{}", verdict.summary());
        if !verdict.ok {
            anyhow::bail!("verify: {} violations", verdict.violations.len());
        }
    }
    Ok(())
}

fn fakepsp(
    log: LogFormat,
    listen: String,
    config: keyhold_fakepsp::PspConfig,
) -> anyhow::Result<()> {
    init_tracing(log);
    runtime()?.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        keyhold_fakepsp::run(config, listener, shutdown_signal()).await?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every option and argument of every command says what it is in
    /// `--help` (issue 44: many had no description).
    #[test]
    fn every_option_is_described() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} --{id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "keyhold", &mut missing);
        assert!(
            missing.is_empty(),
            "options without a description: {missing:#?}"
        );
    }

    /// README.md's code map names every command of the binary, and no other
    /// (issue 44: `drill` and `region` were missing from it).
    #[test]
    fn the_readme_lists_every_command() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"),
        )
        .expect("README.md");
        let start = readme
            .find("- `crates/cli` — the `keyhold` binary:")
            .expect("the crates/cli entry of the code map");
        let entry = &readme[start..];
        // The names up to the first parenthesis: what follows explains them.
        let entry = &entry[..entry
            .find(" (")
            .expect("the list ends before a parenthesis")];
        let listed: std::collections::BTreeSet<String> = entry
            .split('`')
            .skip(5)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        let commands: std::collections::BTreeSet<String> = Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_owned())
            .filter(|name| name != "help")
            .collect();
        assert_eq!(listed, commands, "README.md's crates/cli entry: {entry}");
    }

    /// `--url` beats `--cluster`, which beats $KEYHOLD_URL, which beats the
    /// default; the token comes from `--cluster` when not given.
    #[test]
    fn the_admin_target_comes_from_the_command_line_then_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.json");
        let file = keyhold_up::ClusterFile {
            admin_token: "kh_file".into(),
            regions: vec![keyhold_up::RegionEntry {
                name: "a".into(),
                api_url: "http://127.0.0.1:1".into(),
            }],
            psp_url: String::new(),
            control_url: String::new(),
            tenants: Vec::new(),
            nodes: Vec::new(),
            max_standby_lag_ms: 1_000,
        };
        std::fs::write(&path, serde_json::to_vec(&file).unwrap()).unwrap();
        let args = |url: Option<&str>, cluster: bool, token: Option<&str>| super::AdminArgs {
            url: url.map(str::to_owned),
            cluster: cluster.then(|| path.clone()),
            admin_token: token.map(str::to_owned),
        };
        let env = || Some("http://127.0.0.1:2".to_owned());
        let target = |a, e| super::admin_target(a, e).unwrap();
        assert_eq!(
            target(args(Some("http://u"), true, Some("kh_t")), env()),
            ("http://u".into(), "kh_t".into())
        );
        assert_eq!(
            target(args(None, true, None), env()),
            ("http://127.0.0.1:1".into(), "kh_file".into())
        );
        assert_eq!(
            target(args(None, false, Some("kh_t")), env()),
            ("http://127.0.0.1:2".into(), "kh_t".into())
        );
        assert_eq!(
            target(args(None, false, Some("kh_t")), None),
            (super::URL_DEFAULT.into(), "kh_t".into())
        );
        assert!(super::admin_target(args(None, false, None), None).is_err());
    }
}
