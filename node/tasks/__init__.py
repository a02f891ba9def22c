"""Task environments: problems the coordinator hands out and the verifiers that score completions.

A problem set is a function of a seed, so a validator rebuilds exactly the prompt a worker was given and
recomputes its reward. `get_env` gives an environment by name (built-in or an installed plug-in), checked
against a spec's pins (`node.tasks.envs`).
"""

from .envs import EnvironmentMismatch, content_hash, env_names, get_env
from .math import MathEnv, Problem, ThinkingBudgetEnv

__all__ = ["EnvironmentMismatch", "MathEnv", "Problem", "ThinkingBudgetEnv", "content_hash", "env_names", "get_env"]
