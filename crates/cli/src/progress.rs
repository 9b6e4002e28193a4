//! Progress bars for long transfers (imports, exports), on stderr when it is a terminal.

use indicatif::{ProgressBar, ProgressStyle};

/// A byte-counting bar with a label.
pub fn bytes(label: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(label.to_owned());
    bar
}

/// A bar counting items, with a label.
pub fn count(label: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(label.to_owned());
    bar
}
