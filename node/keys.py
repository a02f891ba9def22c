"""Loading and creating keys: eth-account V3 keystores, or a hex key from the environment (development)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

from .chain.errors import KeyLoadError

PASSWORD_ENV = "INTELLECT_PASSWORD"
PRIVATE_KEY_ENV = "INTELLECT_PRIVATE_KEY"


def from_hex(key: str, source: str = PRIVATE_KEY_ENV) -> LocalAccount:
    text = key.strip()
    try:
        raw = bytes.fromhex(text.removeprefix("0x"))
        if len(raw) != 32:
            raise ValueError
        return Account.from_key(raw)
    except ValueError:
        raise KeyLoadError(
            f"{source} is not a 32-byte hex private key", "use 64 hex digits, optionally 0x-prefixed"
        ) from None


def load_keystore(
    path: str | os.PathLike[str], password: str | None = None, prompt: Callable[[str], str] | None = None
) -> LocalAccount:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise KeyLoadError(f"keystore {p} not found", "create one with `intellect-node keys new --out FILE`") from None
    except (OSError, ValueError) as exc:
        raise KeyLoadError(f"keystore {p} is unreadable ({exc})") from None
    if password is None:
        password = os.environ.get(PASSWORD_ENV)
    if password is None:
        if prompt is None:
            raise KeyLoadError(f"no password for keystore {p}", f"set {PASSWORD_ENV}")
        password = prompt(f"Password for {p}")
    try:
        key = Account.decrypt(data, password)
    except (ValueError, KeyError, TypeError):
        raise KeyLoadError(
            f"cannot decrypt keystore {p}: wrong password or corrupt file", f"check {PASSWORD_ENV}"
        ) from None
    return Account.from_key(key)


def load_account(
    keystore: str | os.PathLike[str] | None,
    *,
    env_var: str = PRIVATE_KEY_ENV,
    prompt: Callable[[str], str] | None = None,
) -> LocalAccount:
    """The signing key: a keystore if given, else the hex key in `env_var`."""
    if keystore:
        return load_keystore(keystore, prompt=prompt)
    hexkey = os.environ.get(env_var)
    if hexkey:
        return from_hex(hexkey, env_var)
    raise KeyLoadError("no signing key", f"pass --keystore FILE or set {env_var} (development only)")


def new_keystore(path: str | os.PathLike[str], password: str, *, overwrite: bool = False) -> LocalAccount:
    """Create a fresh key and write it as a V3 keystore (scrypt), readable by the owner only."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise KeyLoadError(f"{p} already exists", "choose another --out or delete it")
    if not password:
        raise KeyLoadError("refusing to write a keystore with an empty password", f"set {PASSWORD_ENV}")
    acct = Account.create()
    data = Account.encrypt(acct.key, password)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    return acct
