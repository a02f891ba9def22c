"""The code sandbox: model-written programs run under bubblewrap with seccomp, rlimits, a wall-clock
deadline and output caps (`policy` says what a run may do; `runner` runs them)."""

from .policy import Limits
from .runner import RunResult, Sandbox, SandboxUnavailable, find_bwrap

__all__ = ["Limits", "RunResult", "Sandbox", "SandboxUnavailable", "find_bwrap"]
