//! `bench-charts`: draws the PNG charts of `scripts/bench` from its results
//! (one JSON object per line: system, kind, clients, per_second, p50_us,
//! p99_us): throughput against concurrency, and p50/p99 latency against
//! concurrency, one panel per request kind and one line per system (keyhold
//! ingest only and the full PostgreSQL peer run new orders only).

use anyhow::Context;
use clap::Parser;
use plotters::prelude::*;
use serde::Deserialize;
use std::path::PathBuf;

/// Kinds drawn, in panel order.
const KINDS: [&str; 3] = ["new", "replay", "dup"];
/// Chart size in pixels.
const WIDTH_PX: u32 = 1500;
const HEIGHT_PX: u32 = 520;

#[derive(Parser)]
struct Args {
    /// results.jsonl written by scripts/bench.
    #[arg(long)]
    results: PathBuf,
    /// Directory the PNGs are written to (docs/img).
    #[arg(long)]
    out_dir: PathBuf,
    /// A TrueType font for the labels (text is drawn without a system font
    /// library, so a file is needed).
    #[arg(
        long,
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    font: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
struct Row {
    system: String,
    kind: String,
    clients: u32,
    per_second: f64,
    p50_us: Option<u64>,
    p99_us: Option<u64>,
}

fn color(system: &str) -> RGBColor {
    match system {
        "keyhold" => RGBColor(0x1f, 0x77, 0xb4),
        "postgres" => RGBColor(0x2c, 0xa0, 0x2c),
        "redis" => RGBColor(0xd6, 0x27, 0x28),
        // The variants in lighter or darker shades of their system's colour.
        "keyhold-ingest" => RGBColor(0x9e, 0xc9, 0xe8),
        "postgres-outbox" => RGBColor(0x1a, 0x5e, 0x1a),
        _ => RGBColor(0x7f, 0x7f, 0x7f),
    }
}

/// The systems in a stable order, the floor last.
fn systems(rows: &[Row]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in [
        "keyhold",
        "keyhold-ingest",
        "postgres",
        "postgres-outbox",
        "redis",
        "floor",
    ] {
        if rows.iter().any(|r| r.system == name) {
            out.push(name.to_owned());
        }
    }
    out
}

/// The floor has one kind of its own; it is drawn in every panel.
fn series<'a>(rows: &'a [Row], system: &str, kind: &str) -> Vec<&'a Row> {
    let mut out: Vec<&Row> = rows
        .iter()
        .filter(|r| r.system == system && (r.kind == kind || system == "floor"))
        .collect();
    out.sort_by_key(|r| r.clients);
    out
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    keyhold_bench_peers::chart::use_font(&args.font)?;
    let text = std::fs::read_to_string(&args.results)
        .with_context(|| format!("cannot read {}", args.results.display()))?;
    let rows: Vec<Row> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("a results line does not parse")?;
    std::fs::create_dir_all(&args.out_dir)?;
    throughput(&rows, &args.out_dir.join("peers-throughput.png"))?;
    latency(&rows, &args.out_dir.join("peers-latency.png"))?;
    Ok(())
}

fn x_range(rows: &[Row]) -> std::ops::Range<f64> {
    let max = rows.iter().map(|r| r.clients).max().unwrap_or(64).max(2);
    0.8..(max as f64 * 1.25)
}

fn throughput(rows: &[Row], path: &PathBuf) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "Throughput (req/s) vs concurrent clients",
        ("sans-serif", 22),
    )?;
    let y_max = rows.iter().map(|r| r.per_second).fold(1.0, f64::max) * 1.15;
    for (panel, kind) in root.split_evenly((1, KINDS.len())).iter().zip(KINDS) {
        let mut chart = ChartBuilder::on(panel)
            .caption(kind, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(x_range(rows).log_scale(), 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("clients")
            .y_desc("req/s")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style(("sans-serif", 13))
            .draw()?;
        for system in systems(rows) {
            let points: Vec<(f64, f64)> = series(rows, &system, kind)
                .iter()
                .map(|r| (r.clients as f64, r.per_second))
                .collect();
            // A system without rows of this kind gets no legend entry here.
            if points.is_empty() {
                continue;
            }
            let c = color(&system);
            chart
                .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))?
                .label(system.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, c.filled())))?;
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 13))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

fn latency(rows: &[Row], path: &PathBuf) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "Latency vs concurrent clients: p50 (circles), p99 (triangles), ms, log scale",
        ("sans-serif", 22),
    )?;
    let ms = |us: Option<u64>| us.map(|u| (u as f64 / 1000.0).max(0.01));
    let y_max = rows.iter().filter_map(|r| ms(r.p99_us)).fold(1.0, f64::max) * 2.0;
    let y_min = rows
        .iter()
        .filter_map(|r| ms(r.p50_us))
        .fold(f64::MAX, f64::min)
        .min(y_max / 10.0)
        / 2.0;
    for (panel, kind) in root.split_evenly((1, KINDS.len())).iter().zip(KINDS) {
        let mut chart = ChartBuilder::on(panel)
            .caption(kind, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(x_range(rows).log_scale(), (y_min..y_max).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("clients")
            .y_desc("ms")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .label_style(("sans-serif", 13))
            .draw()?;
        for system in systems(rows) {
            let points = series(rows, &system, kind);
            if points.is_empty() {
                continue;
            }
            let c = color(&system);
            let p50: Vec<(f64, f64)> = points
                .iter()
                .filter_map(|r| ms(r.p50_us).map(|v| (r.clients as f64, v)))
                .collect();
            let p99: Vec<(f64, f64)> = points
                .iter()
                .filter_map(|r| ms(r.p99_us).map(|v| (r.clients as f64, v)))
                .collect();
            chart.draw_series(LineSeries::new(p50.clone(), c.stroke_width(1)))?;
            chart.draw_series(p50.iter().map(|p| Circle::new(*p, 4, c.filled())))?;
            chart
                .draw_series(LineSeries::new(p99.clone(), c.stroke_width(2)))?
                .label(system.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
            chart.draw_series(p99.iter().map(|p| TriangleMarker::new(*p, 5, c.filled())))?;
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 13))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
