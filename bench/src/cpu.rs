//! The CPU time the processes of a run used (user + system, from `/proc`): what each part
//! — the hosts, the database server, the bench's own clients — costs a turn. On one
//! machine they share the cores, so turns per second alone cannot tell a host's cost from
//! the database's; the CPU per turn can (docs/scaling-out.md#performance).

use std::collections::HashMap;

/// CPU ticks so far of each process of a group, by pid.
#[derive(Debug, Default, Clone)]
pub struct Sample(HashMap<u32, u64>);

impl Sample {
    /// The processes `pids`.
    pub fn of(pids: impl IntoIterator<Item = u32>) -> Sample {
        Sample(
            pids.into_iter()
                .filter_map(|pid| Some((pid, ticks(pid)?)))
                .collect(),
        )
    }

    /// Every process whose command name is `name` (e.g. `postgres`: the server and each
    /// connection's backend).
    pub fn named(name: &str) -> Sample {
        let pids = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == name)
            });
        Sample::of(pids)
    }

    /// Milliseconds of CPU used since `before`: a process that started since counts from
    /// zero; one that ended since is lost (a run's processes live until it is measured).
    pub fn ms_since(&self, before: &Sample) -> f64 {
        let ticks: u64 = self
            .0
            .iter()
            .map(|(pid, now)| now.saturating_sub(before.0.get(pid).copied().unwrap_or(0)))
            .sum();
        ticks as f64 * 1000.0 / ticks_per_second()
    }
}

/// User plus system ticks of process `pid` (fields 14 and 15 of `/proc/PID/stat`),
/// all its threads.
fn ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, field 2, is in parentheses and may hold spaces: count after it.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system; it has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_process_shows_its_cpu_time() {
        let me = std::process::id();
        let before = Sample::of([me]);
        let start = std::time::Instant::now();
        let mut used = 0.0;
        let mut x = 0u64;
        // Spin until 200 ms of CPU show, however busy the machine: a misread field (a
        // constant, or zero) never gets there.
        while used < 200.0 && start.elapsed() < std::time::Duration::from_secs(20) {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            used = Sample::of([me]).ms_since(&before);
        }
        assert!(used >= 200.0, "{used} ms of CPU after {:?}", start.elapsed());
        assert_eq!(Sample::named("no-such-process").ms_since(&Sample::default()), 0.0);
    }
}
