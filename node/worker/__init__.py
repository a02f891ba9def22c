"""The worker role (`intellect-node join --pool ID`): `daemon` (the shell: stake, join, tasks, submit,
claims), `generation` (engine and policy versions), `accusations` (re-check and appeal), `state` (its
durable rollouts, claims, evidence and answers, named methods over sqlite), `rules` (pure)."""

from .daemon import CHEATS, Worker, WorkerConfig
from .generation import PolicyUnavailable
from .joining import Declined

__all__ = ["CHEATS", "Declined", "PolicyUnavailable", "Worker", "WorkerConfig"]
