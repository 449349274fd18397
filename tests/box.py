"""The made-up machine that hand-built test runs say they were measured on."""

from __future__ import annotations

from attnbench.measure.record import Environment

BOX = Environment(
    hostname="box",
    python="3.11",
    torch="2.x",
    threads=1,
    cpu_model="cpu",
    cpu_count=2,
    device_name="cpu",
)
