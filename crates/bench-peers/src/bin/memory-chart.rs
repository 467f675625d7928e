//! `memory-chart`: draws docs/img/store-memory.png from the output of the region
//! store's memory bench (`cargo bench -p keyhold-store --bench memory`): the
//! process's resident memory and the new-order rate against stored orders, one
//! line per sled cache setting. It reads the bench's table rows as printed
//! (`| cache MiB | stored orders | RSS MiB | ... |`), so the chart and the table
//! in docs/benchmarks.md come from the same text.

use anyhow::Context;
use clap::Parser;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Chart size in pixels.
const WIDTH_PX: u32 = 1300;
const HEIGHT_PX: u32 = 520;
/// Columns of a bench row (0-based, after the leading `|`).
const COLUMN_CACHE_MIB: usize = 0;
const COLUMN_STORED: usize = 1;
const COLUMN_RSS_MIB: usize = 2;
const COLUMN_ORDERS_PER_SECOND: usize = 6;

#[derive(Parser)]
struct Args {
    /// The bench's output (its stdout, as saved).
    #[arg(long)]
    results: PathBuf,
    /// The PNG to write (docs/img/store-memory.png).
    #[arg(long)]
    out: PathBuf,
    /// A TrueType font for the labels.
    #[arg(
        long,
        default_value = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    )]
    font: PathBuf,
}

/// One checkpoint of one run.
#[derive(Debug, Clone, Copy)]
struct Point {
    stored: f64,
    rss_mib: f64,
    per_second: f64,
}

/// One panel: its caption, the unit of its y axis and the value drawn.
type Metric = (&'static str, &'static str, fn(&Point) -> f64);

/// The bench's data rows by cache MiB; header and separator rows do not parse.
fn parse(text: &str) -> BTreeMap<u64, Vec<Point>> {
    let mut runs: BTreeMap<u64, Vec<Point>> = BTreeMap::new();
    for line in text.lines() {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let number = |i: usize| cells.get(i).and_then(|c| c.parse::<f64>().ok());
        let (Some(cache), Some(stored), Some(rss_mib), Some(per_second)) = (
            number(COLUMN_CACHE_MIB),
            number(COLUMN_STORED),
            number(COLUMN_RSS_MIB),
            number(COLUMN_ORDERS_PER_SECOND),
        ) else {
            continue;
        };
        runs.entry(cache as u64).or_default().push(Point {
            stored,
            rss_mib,
            per_second,
        });
    }
    runs
}

fn color(run: usize) -> RGBColor {
    [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0x7f, 0x7f, 0x7f),
    ][run % 4]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    keyhold_bench_peers::chart::use_font(&args.font)?;
    let text = std::fs::read_to_string(&args.results)
        .with_context(|| format!("cannot read {}", args.results.display()))?;
    let runs = parse(&text);
    anyhow::ensure!(
        !runs.is_empty(),
        "no bench rows in {}",
        args.results.display()
    );
    let points = || runs.values().flatten();
    let x_max = points().map(|p| p.stored).fold(1.0, f64::max) * 1.05;

    let root = BitMapBackend::new(&args.out, (WIDTH_PX, HEIGHT_PX)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "One region store filling up: memory and new orders against stored orders",
        ("sans-serif", 22),
    )?;
    let panels = root.split_evenly((1, 2));
    let metrics: [Metric; 2] = [
        ("resident memory (VmRSS)", "MiB", |p| p.rss_mib),
        ("new orders/s, 64 callers", "orders/s", |p| p.per_second),
    ];
    for (panel, (caption, unit, value)) in panels.iter().zip(metrics) {
        let y_max = points().map(value).fold(1.0, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("stored orders")
            .y_desc(unit)
            .x_label_formatter(&|x| format!("{:.0}k", x / 1000.0))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .label_style(("sans-serif", 13))
            .draw()?;
        for (run, (cache, points)) in runs.iter().enumerate() {
            let series: Vec<(f64, f64)> = points.iter().map(|p| (p.stored, value(p))).collect();
            let c = color(run);
            chart
                .draw_series(LineSeries::new(series.clone(), c.stroke_width(2)))?
                .label(format!("region tree cache {cache} MiB"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
            chart.draw_series(series.iter().map(|p| Circle::new(*p, 4, c.filled())))?;
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
