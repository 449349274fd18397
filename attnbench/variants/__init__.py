"""Attention variants; the registry (:mod:`attnbench.registry`) lists the built-in ones."""

__all__: list[str] = []
