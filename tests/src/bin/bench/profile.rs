//! A measured window of a section: CPU per process group (`cpu`) and the servers' own
//! operation counters (`ops`), divided by the runs the window completed and reported.

use crate::Report;
use crate::common::Ctx;
use crate::cpu::{CpuSampler, CpuSnapshot, CpuUsage};
use crate::ops::{self, Ops, OpsStart};

/// What a run may cost in machine CPU for 700 runs/s to fit in two cores with some room.
const MACHINE_MS_GOAL: f64 = 2.5;
/// The share of that Postgres may take.
const POSTGRES_MS_GOAL: f64 = 1.0;

/// An open window: the counters read at its start.
#[derive(Debug)]
pub struct Window {
    sampler: CpuSampler,
    ops: OpsStart,
    cpu: CpuSnapshot,
}

/// A closed window.
#[derive(Debug)]
pub struct Profile {
    runs: usize,
    cpu: CpuUsage,
    ops: Ops,
    /// Queries the benchmark itself sent to the benchmark's database to see completions.
    polls: u64,
}

impl Window {
    /// Reads the servers' counters, then takes the CPU snapshot last, so the reading is not
    /// inside the window.
    pub async fn open(ctx: &Ctx, sampler: CpuSampler) -> anyhow::Result<Window> {
        let ops = ops::start(ctx).await;
        let cpu = sampler.snapshot()?;
        Ok(Window { sampler, ops, cpu })
    }

    /// Takes the CPU snapshot first, then reads the servers' counters (which takes
    /// `ops::STATS_PUBLISH_DELAY` for the late ones).
    pub async fn close(self, ctx: &Ctx, runs: usize, polls: u64) -> anyhow::Result<Profile> {
        let end = self.sampler.snapshot()?;
        let cpu = self.sampler.usage(&self.cpu, &end);
        let ops = ops::finish(ctx, self.ops).await;
        Ok(Profile {
            runs,
            cpu,
            ops,
            polls,
        })
    }
}

impl Profile {
    /// Adds the rows of `section` and prints the CPU breakdown and the operation lists.
    pub fn report(&self, section: &str, report: &mut Report) {
        self.report_cpu(section, report);
        self.report_postgres(section, report);
        self.report_redis(section, report);
        self.report_rabbitmq(section, report);
    }

    fn per_run(&self, total: f64) -> f64 {
        total / self.runs.max(1) as f64
    }

    fn report_cpu(&self, section: &str, report: &mut Report) {
        let machine = self.per_run(self.cpu.machine_ms);
        report.add(
            section,
            "machine CPU per run",
            machine,
            "ms",
            Some(("goal <= 2.5 ms", machine <= MACHINE_MS_GOAL)),
        );
        let mut parts = Vec::new();
        for (name, ms) in &self.cpu.groups {
            let v = self.per_run(*ms);
            let goal = (*name == "postgres").then_some(("goal <= 1 ms", v <= POSTGRES_MS_GOAL));
            report.add(section, &format!("{name} CPU per run"), v, "ms", goal);
            parts.push(format!("{name} {v:.2} ms"));
        }
        let other = self.per_run(self.cpu.other_ms());
        report.add(section, "other CPU per run", other, "ms", None);
        parts.push(format!("other {other:.2} ms"));
        parts.push(format!("total {machine:.2} ms"));
        println!("cpu per run: {}", parts.join(" · "));
        if self.cpu.exited > 0 {
            println!(
                "cpu: {} process(es) of the named groups exited inside the window; \
                 what they used after its start is missed",
                self.cpu.exited
            );
        }
    }

    fn report_postgres(&self, section: &str, report: &mut Report) {
        if let Some(statements) = &self.ops.statements {
            let calls: i64 = statements.iter().map(|s| s.calls).sum();
            report.add(
                section,
                "postgres statements per run",
                self.per_run(calls as f64),
                "",
                None,
            );
            ops::print_statements(statements, self.runs);
        }
        if let Some(commits) = self.ops.commits {
            report.add(
                section,
                "postgres commits per run",
                self.per_run(commits as f64),
                "(bench polls included)",
                None,
            );
        }
        report.add(
            section,
            "bench polling queries per run",
            self.per_run(self.polls as f64),
            "",
            None,
        );
    }

    fn report_redis(&self, section: &str, report: &mut Report) {
        let Some(commands) = &self.ops.redis else {
            return;
        };
        let total: u64 = commands.iter().map(|(_, n)| n).sum();
        report.add(
            section,
            "redis commands per run",
            self.per_run(total as f64),
            "(whole server)",
            None,
        );
        let top: Vec<String> = commands
            .iter()
            .take(8)
            .map(|(name, n)| format!("{name} {:.2}", self.per_run(*n as f64)))
            .collect();
        println!("redis commands per run: {}", top.join(" · "));
    }

    fn report_rabbitmq(&self, section: &str, report: &mut Report) {
        let Some(c) = self.ops.rabbitmq else {
            return;
        };
        for (what, n) in [
            ("published", c.published),
            ("delivered", c.delivered),
            ("acked", c.acked),
        ] {
            report.add(
                section,
                &format!("rabbitmq messages {what} per run"),
                self.per_run(n as f64),
                "(whole broker)",
                None,
            );
        }
    }
}
