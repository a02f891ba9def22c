"""Environments by name, version and content hash (`node.tasks.envs`), pinned by a pool's task spec, and
third-party environments installed as packages with an entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.errors import ConfigError
from node.tasks import EnvironmentMismatch, content_hash, env_names, get_env
from node.taskspec import TaskSpecError, parse_spec

PLUGIN = """
from node.tasks.math import MathEnv


class Doubler(MathEnv):
    name = "doubler"
    version = "{version}"

    def reward(self, problem, completion_text, completion_tokens):
        return 2.0 * super().reward(problem, completion_text, completion_tokens)
"""


def _install(site: Path, version: str = "1", name: str = "doubler") -> None:
    """A package installed the way pip leaves one: its module and a dist-info with the entry point."""
    (site / "doubler_env.py").write_text(PLUGIN.format(version=version))
    info = site / "doubler_env-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: doubler-env\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[intellect_node.environments]\n{name} = doubler_env:Doubler\n")


def _spec(**over: object) -> bytes:
    doc = {"model": "tiny", "environment": "math", "sampling": {"temperature": 1.0, "max_tokens": 8}, **over}
    return json.dumps(doc).encode()


def test_built_in_environments_have_names_versions_and_distinct_hashes() -> None:
    assert {"math", "thinking-budget", "code"} <= set(env_names())
    hashes = {n: content_hash(get_env(n)) for n in ("math", "thinking-budget", "code")}
    assert len(set(hashes.values())) == 3 and all(len(h) == 64 for h in hashes.values())
    assert content_hash(get_env("math")) == hashes["math"]  # stable
    with pytest.raises(ValueError, match="unknown task environment 'chess'"):
        get_env("chess")


def test_a_spec_pins_the_version_and_the_content() -> None:
    h = content_hash(get_env("math"))
    spec = parse_spec(_spec(environment_version="1", environment_hash=h))
    assert (spec.env_version, spec.env_hash) == ("1", h) and spec.environment().name == "math"
    with pytest.raises(EnvironmentMismatch, match="version 2"):
        parse_spec(_spec(environment_version="2")).environment()
    with pytest.raises(EnvironmentMismatch, match="content hash"):
        parse_spec(_spec(environment_hash="ab" * 32)).environment()
    assert parse_spec(_spec()).environment().name == "math"  # an unpinned spec takes this node's
    for bad in ({"environment_hash": "xyz"}, {"environment_version": 3}, {"environment": "chess"}):
        with pytest.raises(TaskSpecError):
            parse_spec(_spec(**bad))


def test_a_plug_in_installs_as_a_package_and_a_changed_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install(site)
    monkeypatch.syspath_prepend(str(site))
    assert "doubler" in env_names()
    env = get_env("doubler")
    p = env.problem(1, 0)
    assert env.reward(p, f"Answer: {p.answer}", 3) == 2.0 and env.rewards([(p, "no", 1)]) == [0.0]
    pinned = content_hash(env)
    spec = parse_spec(_spec(environment="doubler", environment_version="1", environment_hash=pinned))
    assert spec.environment().name == "doubler"

    # the same name, another release of the plug-in: its rewards may differ, so the pool is refused
    import sys

    sys.modules.pop("doubler_env", None)
    _install(site, version="1")
    (site / "doubler_env.py").write_text(PLUGIN.format(version="1").replace("2.0 *", "3.0 *"))
    with pytest.raises(EnvironmentMismatch, match="content hash"):
        spec.environment()
    sys.modules.pop("doubler_env", None)


def test_a_plug_in_that_lies_about_its_name_or_breaks_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    site = tmp_path / "site"
    site.mkdir()
    _install(site, name="tripler")  # the entry point says tripler, the class says doubler
    monkeypatch.syspath_prepend(str(site))
    sys.modules.pop("doubler_env", None)
    with pytest.raises(ConfigError, match="calls itself 'doubler'"):
        get_env("tripler")
    (site / "doubler_env.py").write_text("raise RuntimeError('broken plug-in')\n")
    sys.modules.pop("doubler_env", None)
    with pytest.raises(ConfigError, match="does not load"):
        get_env("tripler")
    sys.modules.pop("doubler_env", None)
