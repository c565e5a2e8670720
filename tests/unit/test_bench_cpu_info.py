"""Benchmarks say where they ran: the CPU model, its vendor, the cores and the vector features."""

from __future__ import annotations

import os
from pathlib import Path

from bench.bench_foundation import CPU_FLAGS, cpu_info


def test_cpu_info_names_this_machines_cpu_and_its_features():
    info = cpu_info()
    cpuinfo = Path("/proc/cpuinfo").read_text()
    line = next(line for line in cpuinfo.splitlines() if line.startswith("flags"))
    flags = set(line.split(":", 1)[1].split())
    assert info["model"] and info["model"] in cpuinfo
    assert info["cores"] == len(os.sched_getaffinity(0))
    assert info["flags"] == [flag for flag in CPU_FLAGS if flag in flags]
    assert info["vendor"] in ("GenuineIntel", "AuthenticAMD") or info["vendor"] in cpuinfo
