"""Task environments: problems the coordinator hands out and the verifiers that score completions.

Pure and deterministic: a problem set is a function of a seed, so a validator rebuilds exactly the
prompt a worker was given and recomputes its reward.
"""

from .math import MathEnv, Problem, ThinkingBudgetEnv, get_env

__all__ = ["MathEnv", "Problem", "ThinkingBudgetEnv", "get_env"]
