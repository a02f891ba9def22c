"""A model's calibrated thresholds: TOPLOC per-chunk bounds and sampling tolerances, loaded from a
shipped calibration (`node/thresholds/<model>.json`) or a file `intellect-node toploc calibrate` wrote."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .rollout.checks import SamplingTolerances
from .toploc import Thresholds

THRESHOLDS_DIR = Path(__file__).resolve().parent / "thresholds"


@dataclass(frozen=True)
class Calibrated:
    """Thresholds for one model: TOPLOC per-chunk bounds and sampling tolerances."""

    model: str
    toploc: Thresholds
    sampling: SamplingTolerances
    report: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "toploc": self.toploc.to_dict(),
            "sampling": self.sampling.to_dict(),
            "report": self.report,
        }

    def prefill_dtypes(self) -> tuple[str, ...]:
        """The validator prefill precisions these thresholds were calibrated against, preferred first: a
        calibration for any precision (`toploc calibrate --precision any`) checked honest work with both
        fp32 and bf16 prefills; one for a pool-mandated precision, and one that does not say, only fp32
        or only that precision. Another prefill would meet thresholds nobody measured for it."""
        precision = (self.report.get("config") or {}).get("precision", "fp32")
        return {"any": ("float32", "bfloat16"), "bf16": ("bfloat16",)}.get(precision, ("float32",))

    def prefill_dtype(self, wanted: str | None) -> str:
        """The prefill precision a validator runs: `wanted`, or the preferred one, refused when the
        calibration did not cover it (honest work could then fail thresholds measured for another)."""
        allowed = self.prefill_dtypes()
        if wanted is None:
            return allowed[0]
        if wanted not in allowed:
            raise ConfigError(
                f"the thresholds for {self.model} were not calibrated with a {wanted} prefill "
                f"(calibrated: {', '.join(allowed)})",
                f"use --prefill-dtype {allowed[0]}, or calibrate for it (`intellect-node toploc calibrate "
                "--precision any`) and pass the result with --thresholds",
            )
        return wanted

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibrated:
        return cls(
            str(d["model"]),
            Thresholds.from_dict(d["toploc"]),
            SamplingTolerances.from_dict(d["sampling"]),
            dict(d.get("report", {})),
        )

    @classmethod
    def for_spec(cls, spec: Any) -> Calibrated:
        """The shipped calibration for a pool's task spec (`node.taskspec.TaskSpec`): where the spec mandates
        one precision (`"precision": "fp32"` or `"bf16"`, for generation and prefill alike) and one is
        shipped for it (`<model>-<precision>.json`), that one, whose replay margin and steering rate are
        measured with nothing but that precision (near zero: far less freedom for a worker to steer);
        else the model's calibration for any precision."""
        precision = (getattr(spec, "extra", None) or {}).get("precision")
        if precision in ("fp32", "bf16") and (THRESHOLDS_DIR / f"{spec.model}-{precision}.json").is_file():
            return cls.load(f"{spec.model}-{precision}")
        return cls.load(spec.model)

    @classmethod
    def load(cls, name_or_path: str | Path) -> Calibrated:
        """A shipped calibration by model name (`tiny`, `smollm2`) or a thresholds file."""
        p = Path(name_or_path)
        if not p.exists():
            p = THRESHOLDS_DIR / f"{name_or_path}.json"
        try:
            return cls.from_dict(json.loads(p.read_text()))
        except FileNotFoundError:
            raise ConfigError(
                f"no thresholds file {str(name_or_path)!r} and no calibrated thresholds for a model of that name",
                "pass a thresholds file (`intellect-node toploc calibrate` writes one) or a shipped model name",
            ) from None
        except OSError as exc:
            raise ConfigError(f"cannot read thresholds file {p}: {exc.strerror or exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"thresholds file {p} is malformed ({exc!r})", "write it with `intellect-node toploc calibrate`"
            ) from None
