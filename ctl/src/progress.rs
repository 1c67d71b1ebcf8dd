//! Progress on stderr: an indicatif bar (position, rate, ETA) when stderr is a terminal, plain
//! lines without escape codes otherwise (CI logs, pipes, files), nothing with `--quiet`.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

#[derive(Debug)]
pub enum Progress {
    Bar(ProgressBar),
    Plain {
        /// "submitted", "finished", …
        verb: &'static str,
        noun: &'static str,
        total: u64,
        pos: u64,
        /// Where the rate counts from (the position when the command started: a resumed
        /// submission's first, already-known chunks come back at once and would inflate it).
        start: Instant,
        last_printed: Option<u64>,
    },
    Hidden,
}

impl Progress {
    pub fn new(verb: &'static str, noun: &'static str, total: u64, quiet: bool) -> Progress {
        if quiet {
            return Progress::Hidden;
        }
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(&format!(
                "{verb} [{{bar:40.cyan/blue}}] {{pos}}/{{len}} {noun} ({{rate}}, eta {{eta}})"
            ))
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            // indicatif's own `per_sec` shows four decimals; whole runs a second read better.
            .with_key(
                "rate",
                |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(w, "{:.0}/s", state.per_sec());
                },
            )
            .progress_chars("=> ");
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            Progress::Bar(bar)
        } else {
            Progress::Plain {
                verb,
                noun,
                total,
                pos: 0,
                start: Instant::now(),
                last_printed: None,
            }
        }
    }

    /// Moves to `pos`; a plain line is printed only when the position changed.
    pub fn set(&mut self, new_pos: u64) {
        match self {
            Progress::Bar(bar) => bar.set_position(new_pos),
            Progress::Plain {
                verb,
                noun,
                total,
                pos,
                start,
                last_printed,
            } => {
                *pos = new_pos;
                if *last_printed == Some(new_pos) {
                    return;
                }
                *last_printed = Some(new_pos);
                let line = plain_line(verb, noun, new_pos, *total, start.elapsed());
                let mut err = std::io::stderr().lock();
                let _ = writeln!(err, "{line}");
            }
            Progress::Hidden => {}
        }
    }

    pub fn finish(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish();
        }
    }

    /// Prints a line above the bar (or plainly), so it does not tear the bar.
    pub fn println(&self, line: &str) {
        match self {
            Progress::Bar(bar) => bar.suspend(|| println!("{line}")),
            _ => println!("{line}"),
        }
    }
}

/// `submitted 1000/5000 runs (812/s, eta 5s)`.
pub fn plain_line(verb: &str, noun: &str, pos: u64, total: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 { pos as f64 / secs } else { 0.0 };
    let eta = if pos >= total {
        "0s".to_owned()
    } else if rate > 0.0 {
        human((total - pos) as f64 / rate)
    } else {
        "?".to_owned()
    };
    format!("{verb} {pos}/{total} {noun} ({rate:.0}/s, eta {eta})")
}

fn human(secs: f64) -> String {
    let s = secs.ceil() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_carry_rate_and_eta_and_no_escape_codes() {
        let l = plain_line("submitted", "runs", 1000, 5000, Duration::from_secs(2));
        assert_eq!(l, "submitted 1000/5000 runs (500/s, eta 8s)");
        assert!(!l.contains('\x1b'));
        let l = plain_line("finished", "runs", 5, 5, Duration::from_secs(1));
        assert!(l.ends_with("eta 0s)"), "{l}");
        assert!(plain_line("x", "y", 0, 5, Duration::ZERO).contains("eta ?"));
        assert_eq!(human(3725.0), "1h02m");
        assert_eq!(human(61.0), "1m01s");
    }
}
