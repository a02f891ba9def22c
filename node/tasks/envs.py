"""The environments a pool can name, and what pins one.

An environment is named and versioned and has a content hash: sha256 over its name, version, the source
of the modules that define it and its data (`data_hash`, e.g. HumanEval's file). A pool's task spec may
pin all three (`environment_version`, `environment_hash`); a node whose environment differs refuses the
pool (its rewards would differ from the others', and a reward mismatch is a verdict). Built in: `math`,
`thinking-budget`, `code`. Others install as Python packages that declare an entry point in the group
`intellect_node.environments` (name = environment name, value = `module:Class`); they are loaded by name.

Every environment offers: `name`, `version`, `problem(seed, index)`, `problems(seed, count, start)`,
`reward(problem, text, tokens)`, `rewards(items)`, `rewards_firm(items)` (each reward with whether
every machine gets it) and `prepare()` (set up what scoring needs, or raise: called before any work).
"""

from __future__ import annotations

import hashlib
import inspect
from importlib import metadata
from typing import Any

from node.errors import ConfigError

ENTRY_POINT_GROUP = "intellect_node.environments"
BUILT_IN = ("math", "thinking-budget", "code")


class EnvironmentMismatch(ConfigError):
    """This node's environment is not the one the pool's spec pins."""


def _plugins() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def env_names() -> list[str]:
    """Every environment this node can run: the built-in ones and the installed plug-ins."""
    return sorted({*BUILT_IN, *_plugins()})


def _build(name: str) -> Any:
    if name in ("math", "thinking-budget"):
        from .math import MathEnv, ThinkingBudgetEnv

        return MathEnv() if name == "math" else ThinkingBudgetEnv()
    if name == "code":
        from .code import CodeEnv

        return CodeEnv()
    ep = _plugins().get(name)
    if ep is None:
        raise ValueError(f"unknown task environment {name!r}; known: {', '.join(env_names())}")
    try:
        cls = ep.load()
        env = cls()
    except Exception as exc:  # a broken plug-in is the operator's to fix, with its name in the message
        raise ConfigError(f"environment plug-in {name!r} ({ep.value}) does not load: {exc!r}") from None
    if getattr(env, "name", None) != name:
        raise ConfigError(f"environment plug-in {ep.value} calls itself {getattr(env, 'name', None)!r}, not {name!r}")
    return env


def content_hash(env: Any) -> str:
    """sha256 (hex) over the environment's name, version, the source of every module its class and its
    bases are defined in (the project's and plug-ins', not the standard library's), and `data_hash`."""
    h = hashlib.sha256(f"{env.name}/{env.version}/".encode())
    seen: list[str] = []
    for cls in type(env).__mro__:
        if cls is object:
            continue
        try:
            path = inspect.getsourcefile(cls)
        except TypeError:
            continue
        if path and path not in seen:
            seen.append(path)
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    h.update(str(getattr(env, "data_hash", "")).encode())
    return h.hexdigest()


def get_env(name: str, *, version: str | None = None, pinned_hash: str | None = None) -> Any:
    """The environment called `name`, checked against a spec's pins where it has them."""
    env = _build(name)
    if version is not None and str(env.version) != version:
        raise EnvironmentMismatch(
            f"the pool pins environment {name!r} version {version}; this node has version {env.version}",
            "install the release (or plug-in) the pool's spec names",
        )
    if pinned_hash is not None:
        mine = content_hash(env)
        if mine != pinned_hash.lower():
            raise EnvironmentMismatch(
                f"the pool pins environment {name!r} with content hash {pinned_hash[:16]}..., this node's is "
                f"{mine[:16]}...: its rewards could differ from every other node's",
                "install the release (or plug-in) the pool's spec names; `intellect-node pool env-hash NAME` "
                "prints a node's hash",
            )
    return env
