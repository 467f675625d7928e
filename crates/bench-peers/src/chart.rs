//! What the chart binaries (`bench-charts`, `memory-chart`) share: the font
//! their labels are drawn with.

use plotters::style::{register_font, FontStyle};
use std::path::Path;

/// Registers the TrueType font at `path` as plotters' `sans-serif` (text is
/// drawn without a system font library, so a file is needed).
pub fn use_font(path: &Path) -> anyhow::Result<()> {
    let font = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("cannot read font {}: {e}", path.display()))?;
    // ab_glyph keeps the font for the whole run: leak it once.
    register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| anyhow::anyhow!("{} is not a usable font", path.display()))
}
