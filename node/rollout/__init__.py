"""Rollouts: the uploaded file format and the checks a validator runs beyond TOPLOC."""

from .checks import Reason, SamplingParams, SamplingTolerances, Verdict
from .file import RolloutFile, RolloutFormatError, RolloutHeader, RolloutSample, work_key

__all__ = [
    "Reason",
    "RolloutFile",
    "RolloutFormatError",
    "RolloutHeader",
    "RolloutSample",
    "SamplingParams",
    "SamplingTolerances",
    "Verdict",
    "work_key",
]
