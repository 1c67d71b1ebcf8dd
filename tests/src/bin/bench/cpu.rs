//! CPU used during a measured window, for the whole machine and per group of processes.
//!
//! Throughput on this machine is bounded by CPU (two cores shared by the client, the API, the
//! workers and the three servers), so "how many milliseconds of CPU does one run cost, and
//! where" says more than runs/s alone. Everything comes from `/proc`: the machine's non-idle
//! time from `/proc/stat`, each process's `utime + stime` from `/proc/<pid>/stat`.
//!
//! A snapshot is taken at each end of the window and the two are subtracted. A process seen
//! only at the end counts from zero (it started inside the window). A process seen only at
//! the start is dropped: it exited inside the window and what it used after the first snapshot
//! is missed (its time went to its parent's `cutime`, which is not counted, because the parent
//! of a Postgres backend is the postmaster, which also reaps backends of other sessions).
//! `CpuUsage::exited` says how many there were.

use std::collections::HashMap;
use std::process::Command;

/// Which processes make up a group.
#[derive(Clone, Debug)]
pub enum Members {
    /// Every process whose `comm` (the executable name, at most 15 bytes) starts with one of
    /// these.
    Named(&'static [&'static str]),
    /// Exactly these processes (the ones the benchmark spawned).
    Pids(Vec<u32>),
    /// The benchmark process itself.
    This,
    /// A process and its children (a postmaster and its backends).
    Tree(u32),
}

/// A named set of processes whose CPU is reported together.
#[derive(Clone, Debug)]
pub struct Group {
    pub name: &'static str,
    pub members: Members,
}

impl Group {
    pub fn named(name: &'static str, comms: &'static [&'static str]) -> Group {
        Group {
            name,
            members: Members::Named(comms),
        }
    }

    pub fn pids(name: &'static str, pids: Vec<u32>) -> Group {
        Group {
            name,
            members: Members::Pids(pids),
        }
    }

    pub fn this(name: &'static str) -> Group {
        Group {
            name,
            members: Members::This,
        }
    }

    // The shared servers are matched by name, so every process of a server counts, including
    // Postgres backends serving other databases: on a machine shared with other work, that
    // work lands in these groups too.

    /// The postmaster, its auxiliary processes and every backend; of the server whose
    /// postmaster is `postmaster` when known (another cluster on the machine is left out).
    pub fn postgres(postmaster: Option<u32>) -> Group {
        match postmaster {
            Some(pid) => Group {
                name: "postgres",
                members: Members::Tree(pid),
            },
            None => Group::named("postgres", &["postgres"]),
        }
    }

    pub fn redis() -> Group {
        Group::named("redis", &["redis-server"])
    }

    /// The Erlang VM, its port-program launcher, the name daemon and its DNS helper.
    pub fn rabbitmq() -> Group {
        Group::named(
            "rabbitmq",
            &["beam.smp", "erl_child_setup", "epmd", "inet_gethost"],
        )
    }
}

/// CPU counters at one instant, in clock ticks.
#[derive(Debug)]
pub struct CpuSnapshot {
    machine_ticks: u64,
    /// Per group: pid to `utime + stime`.
    groups: Vec<(&'static str, HashMap<u32, u64>)>,
}

/// What a window used, in milliseconds of CPU.
#[derive(Debug)]
pub struct CpuUsage {
    /// Non-idle time of all cores together.
    pub machine_ms: f64,
    /// Per group, in the order given.
    pub groups: Vec<(&'static str, f64)>,
    /// Processes of the groups that exited inside the window (their last part is missed).
    pub exited: usize,
}

impl CpuUsage {
    /// The machine's time not attributed to any group: the kernel's own threads, helpers such
    /// as shells the servers start, and anything else running on the machine (other people's
    /// builds and tests on a shared one).
    pub fn other_ms(&self) -> f64 {
        self.machine_ms - self.groups.iter().map(|(_, ms)| ms).sum::<f64>()
    }
}

/// Takes snapshots of a fixed list of groups; knows the length of a clock tick.
#[derive(Debug)]
pub struct CpuSampler {
    groups: Vec<Group>,
    ms_per_tick: f64,
}

impl CpuSampler {
    pub fn new(groups: Vec<Group>) -> CpuSampler {
        CpuSampler {
            groups,
            ms_per_tick: 1000.0 / clock_ticks_per_second() as f64,
        }
    }

    pub fn snapshot(&self) -> anyhow::Result<CpuSnapshot> {
        let machine_ticks = machine_busy_ticks(&std::fs::read_to_string("/proc/stat")?)?;
        let all = all_processes();
        let this = std::process::id();
        let groups = self
            .groups
            .iter()
            .map(|g| (g.name, members_of(&g.members, &all, this)))
            .collect();
        Ok(CpuSnapshot {
            machine_ticks,
            groups,
        })
    }

    /// What was used between `start` and `end` (two snapshots of this sampler).
    pub fn usage(&self, start: &CpuSnapshot, end: &CpuSnapshot) -> CpuUsage {
        let mut exited = 0;
        let groups = start
            .groups
            .iter()
            .zip(&end.groups)
            .map(|((name, before), (_, after))| {
                exited += before.keys().filter(|p| !after.contains_key(p)).count();
                (*name, group_delta(before, after) as f64 * self.ms_per_tick)
            })
            .collect();
        CpuUsage {
            machine_ms: end.machine_ticks.saturating_sub(start.machine_ticks) as f64
                * self.ms_per_tick,
            groups,
            exited,
        }
    }
}

/// Ticks used by the processes alive at the end, counting from zero those not seen at the
/// start.
fn group_delta(before: &HashMap<u32, u64>, after: &HashMap<u32, u64>) -> u64 {
    after
        .iter()
        .map(|(pid, t)| t.saturating_sub(before.get(pid).copied().unwrap_or(0)))
        .sum()
}

/// `sysconf(_SC_CLK_TCK)` without `libc` (not a dependency, and `unsafe` is forbidden here):
/// asked of `getconf` once per sampler; 100, the value on every common Linux build, if that
/// fails.
fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

/// The busy time of the `cpu` line of `/proc/stat`: user, nice, system, irq, softirq and
/// steal (idle and iowait are not busy; guest time is already inside user).
fn machine_busy_ticks(proc_stat: &str) -> anyhow::Result<u64> {
    let line = proc_stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or_else(|| anyhow::anyhow!("/proc/stat has no cpu line"))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    anyhow::ensure!(f.len() >= 8, "short cpu line in /proc/stat: {line}");
    let (user, nice, system, irq, softirq, steal) = (f[0], f[1], f[2], f[5], f[6], f[7]);
    Ok(user + nice + system + irq + softirq + steal)
}

/// One process as `/proc/<pid>/stat` describes it.
#[derive(Debug, PartialEq)]
struct ProcStat {
    comm: String,
    ppid: u32,
    ticks: u64,
}

/// Parses `/proc/<pid>/stat`: `pid (comm) state ppid ...`, where `comm` may contain spaces
/// and parentheses, so the fields are counted from the last `)`. `utime` and `stime` are
/// fields 14 and 15 (1-based), the 12th and 13th after the `)`.
fn parse_proc_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let ppid: u32 = rest.get(1)?.parse().ok()?;
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some(ProcStat {
        comm,
        ppid,
        ticks: utime + stime,
    })
}

/// Every process on the machine (those that vanish while being read are skipped).
fn all_processes() -> HashMap<u32, ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((pid, parse_proc_stat(&text)?))
        })
        .collect()
}

fn members_of(members: &Members, all: &HashMap<u32, ProcStat>, this: u32) -> HashMap<u32, u64> {
    let keep = |pid: &u32, p: &ProcStat| match members {
        Members::Named(prefixes) => prefixes.iter().any(|n| p.comm.starts_with(n)),
        Members::Pids(pids) => pids.contains(pid),
        Members::This => *pid == this,
        Members::Tree(root) => *pid == *root || p.ppid == *root,
    };
    all.iter()
        .filter(|(pid, p)| keep(pid, p))
        .map(|(pid, p)| (*pid, p.ticks))
        .collect()
}

/// Context switches of these processes so far, all their threads together: (voluntary,
/// involuntary). A voluntary switch is a thread going to sleep (a park, a blocking read), so
/// per unit of work it counts the wake-ups the work cost.
pub fn context_switches(pids: &[u32]) -> (u64, u64) {
    let mut total = (0, 0);
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.filter_map(Result::ok) {
            let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
                continue;
            };
            let (v, n) = switches_of(&status);
            total.0 += v;
            total.1 += n;
        }
    }
    total
}

fn switches_of(status: &str) -> (u64, u64) {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    (
        field("voluntary_ctxt_switches:"),
        field("nonvoluntary_ctxt_switches:"),
    )
}

/// The postmaster of the server `pool` uses: the parent of one of its backends.
pub async fn postmaster(pool: &sqlx::PgPool) -> Option<u32> {
    let backend: Option<(i32,)> = sqlx::query_as("SELECT pg_backend_pid()")
        .fetch_optional(pool)
        .await
        .ok()
        .flatten();
    backend.and_then(|(pid,)| parent_of(pid as u32))
}

/// The parent of process `pid` (a Postgres backend's parent is its postmaster).
pub fn parent_of(pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(parse_proc_stat(&text)?.ppid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_switches_are_read_from_a_threads_status() {
        let status =
            "Name:\tapi\nvoluntary_ctxt_switches:\t1234\nnonvoluntary_ctxt_switches:\t56\n";
        assert_eq!(switches_of(status), (1234, 56));
        assert_eq!(switches_of("Name:\tapi\n"), (0, 0));
        // A sleep is a voluntary switch of this thread, whichever thread the test runs on
        // (the process may not have blocked yet when the test starts).
        std::thread::sleep(std::time::Duration::from_millis(1));
        let (v, _) = context_switches(&[std::process::id()]);
        assert!(v > 0, "this process has slept at least once");
    }

    #[test]
    fn stat_fields_count_from_the_last_parenthesis() {
        let line =
            "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 37 5 0 0 20 0 1 0 1 2 3";
        assert_eq!(
            parse_proc_stat(line),
            Some(ProcStat {
                comm: "a (weird) name".into(),
                ppid: 1,
                ticks: 42
            })
        );
    }

    #[test]
    fn machine_busy_time_leaves_out_idle_and_iowait() {
        let stat = "cpu  100 2 30 5000 70 4 6 8 0 0\ncpu0 50 1 15 2500 35 2 3 4 0 0\n";
        assert_eq!(machine_busy_ticks(stat).unwrap(), 100 + 2 + 30 + 4 + 6 + 8);
    }

    #[test]
    fn processes_new_in_the_window_count_from_zero_and_exited_ones_drop_out() {
        let before = HashMap::from([(1, 10), (2, 50)]);
        let after = HashMap::from([(1, 15), (3, 7)]);
        assert_eq!(group_delta(&before, &after), 5 + 7);
    }
}
