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
