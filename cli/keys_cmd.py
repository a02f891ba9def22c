"""`keys`: make and show signing keys."""

from __future__ import annotations

import os
from pathlib import Path

import click

from node import keys

from ._common import Settings, common, output


@click.group("keys")
def keys_group() -> None:
    """Create and inspect keys."""


@keys_group.command("new")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Keystore file to write.")
@click.option("--overwrite", is_flag=True, help="Replace an existing file.")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def keys_new(out: str, overwrite: bool, as_json: bool) -> None:
    """Create a new key and save it as an encrypted V3 keystore."""
    password = os.environ.get(keys.PASSWORD_ENV)
    if password is None:
        password = click.prompt("New keystore password", hide_input=True, confirmation_prompt=True)
    acct = keys.new_keystore(out, password, overwrite=overwrite)
    s = Settings(None, "", None, as_json)
    output(s, {"address": acct.address, "keystore": str(Path(out).resolve())}, f"created {acct.address} in {out}")


@keys_group.command("show")
@common
def keys_show(s: Settings) -> None:
    """Print the address of the signing key."""
    acct = s.account()
    assert acct is not None
    output(s, {"address": acct.address}, acct.address)
