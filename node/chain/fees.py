"""Transaction fee rules, pure: what a replacement must offer, and the fee settings from the environment."""

from __future__ import annotations

import math
import os

from .errors import ChainError

#: EIP-1559 replacement rule of geth, reth and anvil: a replacement must raise both the tip and the fee cap
#: by at least 10 %; we raise them by 12.5 % (plus 1 wei) so rounding never makes one "underpriced".
BUMP_NUM, BUMP_DEN = 9, 8
#: Default cap on `maxFeePerGas` (wei): 500 gwei, far above any L2's fees; `INTELLECT_MAX_FEE_GWEI`
#: sets another for every command and daemon.
DEFAULT_MAX_FEE = 500 * 10**9
#: The highest tip (wei) taken from a node's suggestion when the base fee is lower: 2 gwei.
MAX_TIP_FLOOR = 2 * 10**9
#: Default seconds a transaction may stay unmined before it is replaced (`INTELLECT_BUMP_AFTER`).
DEFAULT_BUMP_AFTER = 30.0


def env_number(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ChainError(f"{name}={text!r} is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise ChainError(f"{name} must be a positive finite number, not {text}")
    return value


def bumped_fees(max_fee: int, tip: int, suggested: tuple[int, int], cap: int) -> tuple[int, int] | None:
    """The fees of a replacement for a transaction priced (`max_fee`, `tip`): at least 12.5 % more on
    both, at least today's suggestion, `max_fee` at most `cap`. None when the cap leaves no valid
    replacement (the transaction then waits, re-broadcast as it is). Pure."""
    want_max = max(max_fee * BUMP_NUM // BUMP_DEN + 1, suggested[0])
    want_tip = max(tip * BUMP_NUM // BUMP_DEN + 1, suggested[1])
    new_max = min(want_max, cap)
    new_tip = min(want_tip, new_max)
    if new_max * 10 < max_fee * 11 or new_tip * 10 < tip * 11:
        return None
    return new_max, new_tip
