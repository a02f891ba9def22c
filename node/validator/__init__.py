"""The validator role (`intellect-node validate --pool ID`): `daemon` (the shell: follows the ledger,
checks, invalidates, sits on committees), `state` (its durable records and duties, named methods over
sqlite), `rules` (where a record goes next, pure)."""

from .daemon import Validator, ValidatorConfig

__all__ = ["Validator", "ValidatorConfig"]
