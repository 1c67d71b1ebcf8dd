"""Machine CPU from /proc/stat (standard library only: used by `run` and the reference driver).

Busy time is the non-idle jiffies of the aggregate `cpu` line, user + nice + system + irq +
softirq + steal (guest time is already inside user), converted to milliseconds with CLK_TCK.
It counts every process on the machine: the servers, the workers, the client, and anything
else that happens to run, so a quiet machine matters."""

import os
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def busy_jiffies() -> int:
    with open("/proc/stat") as f:
        fields = f.readline().split()
    assert fields[0] == "cpu", fields
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return user + nice + system + irq + softirq + steal


def busy_ms(since: int, until: int) -> float:
    return (until - since) * 1000.0 / CLK_TCK


def background_load(seconds: float = 1.0) -> float:
    """Cores kept busy over `seconds` right now (0.0 = idle machine), before a measurement."""
    start, t = busy_jiffies(), time.monotonic()
    time.sleep(seconds)
    return busy_ms(start, busy_jiffies()) / 1000.0 / (time.monotonic() - t)


# The shared servers both sides use: PostgreSQL (its postmaster's reaped-children times hold the
# backends that have exited), Redis and RabbitMQ (the Erlang VM and its helpers).
SERVICES = {"postgres", "redis-server", "beam.smp", "erl_child_setup", "epmd", "inet_gethost"}


def services_ticks() -> int:
    """CPU ticks spent so far by the shared servers' processes (utime + stime + cutime + cstime)."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                data = f.read()
        except OSError:
            continue  # gone meanwhile
        if data[data.index("(") + 1:data.rindex(")")] not in SERVICES:
            continue
        fields = data[data.rindex(")") + 2:].split()
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total


class Attributed:
    """CPU of the processes a measurement involves, unlike machine CPU blind to unrelated work on
    the machine: the shared servers, plus every descendant of this process that has been waited
    for (os.times' children times). Take it around a child that has exited and been reaped."""

    def __init__(self):
        self.services0, self.children0 = services_ticks(), os.times()

    def ms(self) -> float:
        t = os.times()
        children = (t.children_user + t.children_system
                    - self.children0.children_user - self.children0.children_system)
        return (services_ticks() - self.services0) * 1000.0 / CLK_TCK + children * 1000.0


# --- processes: CPU by group and memory, for the load workload --------------------------------

def _stat(pid: str):
    """(comm, ppid, utime + stime + cutime + cstime) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return data[data.index("(") + 1:data.rindex(")")], int(fields[1]), sum(int(x) for x in fields[11:15])


def process_table() -> dict:
    """pid -> (comm, ppid, CPU ticks) of every process."""
    table = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            stat = _stat(pid)
            if stat:
                table[int(pid)] = stat
    return table


def tree(table: dict, root: int) -> set:
    """`root` and its descendants in a process table."""
    children = {}
    for pid, (_, ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in table and pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def rss_kib(pids) -> int:
    """The sum of the processes' VmRSS, in KiB (0 for one that is gone)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total


SERVER_GROUPS = {"postgres": {"postgres"}, "redis": {"redis-server"},
                 "rabbitmq": {"beam.smp", "erl_child_setup", "epmd", "inet_gethost"}}


class CpuGroups:
    """CPU ticks by group: the process trees of `roots` (name -> pid), the shared servers by
    process name, and this process itself (`own`, its threads, not its children)."""

    def __init__(self, roots: dict, own: str):
        self.roots, self.own = roots, own

    def snapshot(self) -> dict:
        table = process_table()
        ticks = {name: 0 for name in [*self.roots, *SERVER_GROUPS, self.own]}
        for name, root in self.roots.items():
            ticks[name] = sum(table[pid][2] for pid in tree(table, root))
        for comm, _, t in table.values():
            for name, comms in SERVER_GROUPS.items():
                if comm in comms:
                    ticks[name] += t
        me = os.times()
        ticks[self.own] = round((me.user + me.system) * CLK_TCK)
        return ticks

    @staticmethod
    def ms(before: dict, after: dict) -> dict:
        return {name: (after[name] - before[name]) * 1000.0 / CLK_TCK for name in after}


def established_on(port: int) -> int:
    """Established TCP connections (IPv4) whose local port is `port`: the server side of each."""
    local = f":{port:04X}"
    count = 0
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[1].endswith(local) and fields[3] == "01":
                    count += 1
    except OSError:
        pass
    return count
