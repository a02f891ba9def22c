"""`toploc calibrate`, `rollout verify` and `eval`: the model-side commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from node.errors import ConfigError
from node.fsio import write_output

from ._common import Settings, output


@click.group("toploc")
def toploc_group() -> None:
    """TOPLOC proof thresholds."""


@toploc_group.command("calibrate")
@click.option("--model", default="tiny", show_default=True, help="tiny, smollm2, or a local model folder.")
@click.option("--out", type=click.Path(dir_okay=False), help="Thresholds file to write (default: print).")
@click.option("--prompts", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--samples", type=click.IntRange(min=1), default=2, show_default=True, help="Completions per prompt.")
@click.option("--max-tokens", type=click.IntRange(min=8), default=64, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--cache", type=click.Path(file_okay=False), help="Keep generated rollouts here and reuse them on a rerun."
)
@click.option(
    "--precision",
    type=click.Choice(["any", "fp32", "bf16"]),
    default="any",
    show_default=True,
    help="Honest precision the pool allows: any (fp32 and bf16), or one mandated precision.",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def toploc_calibrate(
    model: str,
    out: str | None,
    prompts: int,
    samples: int,
    max_tokens: int,
    seed: int,
    cache: str | None,
    precision: str,
    as_json: bool,
) -> None:
    """Measure honest and tampered rollouts on MODEL and write thresholds that separate them.

    Honest: fp32 and bf16 generation, batch sizes 1 and 8, checked by fp32 and bf16 prefills.
    Tampered: other weights, 1 % weight noise, fp8 weights, another system prompt, a changed prompt
    token, another model's tokens spliced in. Exits 1 if no thresholds separate them."""
    from node.calibrate import CalibrationConfig, calibrate

    say = (lambda m: None) if as_json else (lambda m: click.echo(m, err=True))
    result = calibrate(  # a failure is a `CalibrationFailed`: one line and exit 1, from the CLI's entry
        CalibrationConfig(model, prompts, samples, max_tokens, 1.0, seed, precision),
        progress=say,
        cache=Path(cache) if cache else None,
    )
    text = json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n"
    if out:
        write_output(Path(out), text.encode())
    t = result.toploc
    summary = [
        f"{model}: exponent mismatches <= {t.exp_mismatch_max}, mantissa error mean <= {t.mant_err_mean_max}, "
        f"median <= {t.mant_err_median_max}, sign mismatches <= {t.sign_mismatch_max}; "
        f"logprob error <= {result.sampling.logprob_max_abs}; exact-sampling replay margin {result.sampling.margin}",
    ]
    if out:
        summary.append(f"written to {out}")
    if as_json or not out:
        click.echo(text, nl=False)
    else:
        for line in summary:
            click.echo(line)


@click.group("rollout")
def rollout_group() -> None:
    """Inspect and verify rollout files."""


@rollout_group.command("verify")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--model", default=None, help="Model to prefill with (default: the file's model).")
@click.option("--thresholds", help="Thresholds file or model name (default: the model's shipped thresholds).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True)
@click.option(
    "--spec",
    "spec_file",
    type=click.Path(exists=True, dir_okay=False),
    help="The pool's task spec: check against its terms (default: the terms the file's header declares).",
)
@click.option(
    "--evidence",
    "evidence_file",
    type=click.Path(exists=True, dir_okay=False),
    help="A validator's evidence document on this file: each of its claims is compared with this check.",
)
@click.option(
    "--evidence-out",
    "evidence_out",
    type=click.Path(dir_okay=False, writable=True),
    help="Write this check's verdict as an evidence document (canonical JSON; its sha256 is the evidence "
    "hash `work invalidate` and `work challenge` put on chain).",
)
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def rollout_verify(
    file: str,
    model: str | None,
    thresholds: str | None,
    dtype: str,
    spec_file: str | None,
    evidence_file: str | None,
    evidence_out: str | None,
    as_json: bool,
) -> None:
    """Run the validator's checks on a rollout file; exits 1 if it fails. Without --spec the header's own
    sampling parameters are used (an inspection aid: a validator takes them from the pool's spec).
    With --evidence (a validator's evidence document, e.g. from its `evidence/` folder or a worker's
    appeal), each failure it claims is set against this check: "agree" or "DISPUTE" per claim."""
    from node.evidence import MAX_SERVED_EVIDENCE_BYTES, EvidenceError, compare, encode_evidence, parse_evidence
    from node.inference.engine import HfPrefill
    from node.inference.tools import model_tools
    from node.rollout.checks import SamplingParams
    from node.rollout.file import RolloutFile, RolloutFormatError, work_key
    from node.rollout.intake import check_sample_indices, check_terms
    from node.taskspec import TaskSpec, parse_spec
    from node.verify import Calibrated, FileChecks, verify_file

    data = Path(file).read_bytes()
    try:
        f = RolloutFile.from_bytes(data)
        h = f.header
        spec = (
            parse_spec(Path(spec_file).read_bytes())
            if spec_file
            else TaskSpec(h.model, h.env, dict(h.sampling))  # the header's own claims
        )
        wrong = check_terms(h, pool_id=h.pool_id, env=spec.env, model=spec.model, sampling=spec.sampling)
        if wrong is None and spec_file:  # the group size is the spec's (a header does not declare one)
            wrong = check_sample_indices(f, spec.group_size)
        if wrong is not None:
            raise ValueError(f"{wrong.reason}: {wrong.detail}")
        claims = None
        if evidence_file is not None:
            doc = Path(evidence_file).read_bytes()
            claims = parse_evidence(doc, work_key=work_key(data), max_bytes=MAX_SERVED_EVIDENCE_BYTES)
        params: SamplingParams = spec.sampling_params()
        name = model or spec.model
        cal = Calibrated.load(thresholds or name)
        env = spec.environment()
    except EvidenceError as exc:
        raise ConfigError(f"{evidence_file}: {exc}", "is it the evidence of this file?") from None
    except ConfigError:
        raise
    except (RolloutFormatError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{file}: {exc}") from None
    tools = model_tools(name)
    prefill = HfPrefill(tools.path, dtype=dtype)  # type: ignore[arg-type]

    def run_prefill(prompt: list[int], completion: list[int]) -> Any:
        p = prefill.prefill(prompt, completion)
        return p.hidden, p.logprobs

    checks = FileChecks(params, env, tools.encode, tools.decode, tools.stop_ids, cal, prefill.vocab_size)
    v = verify_file(f, run_prefill, checks)
    d = v.to_dict() | {"work_key": work_key(data), "units": f.units}
    line = f"{file}: {'valid' if v.ok else 'INVALID: ' + str(v.verdict.reason) + ' (' + v.verdict.detail + ')'}"
    if claims is not None:
        d["evidence"] = compare(claims, v.to_dict())
        line += "".join(f"\n  {c}" for c in d["evidence"])
    if evidence_out is not None:
        doc, d["evidence_hash"] = encode_evidence({"work_key": d["work_key"], "pool": h.pool_id, **v.to_dict()})
        write_output(Path(evidence_out), doc)
        line += f"\n  evidence document {evidence_out}: hash {d['evidence_hash']}"
    output(Settings(None, "", None, as_json), d, line)
    if not v.ok:
        sys.exit(1)


@click.command("eval")
@click.option("--model", default="tiny", show_default=True, help="The pool's base model (tiny, smollm2 or a folder).")
@click.option(
    "--checkpoint",
    "checkpoints",
    multiple=True,
    metavar="LABEL=FOLDER",
    help="A policy checkpoint folder (the coordinator's checkpoints/v<N>); repeatable. `base` is always first.",
)
@click.option(
    "--env",
    "env_name",
    type=click.Choice(["math", "thinking-budget", "code"]),
    default="thinking-budget",
    show_default=True,
)
@click.option("--problems", type=click.IntRange(min=2), default=32, show_default=True, help="Held-out problems.")
@click.option("--samples", type=click.IntRange(min=1), default=8, show_default=True, help="Completions per problem.")
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Use the budget the policy was trained with.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Which held-out set (and sampling seed).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def eval_cmd(
    model: str,
    checkpoints: tuple[str, ...],
    env_name: str,
    problems: int,
    samples: int,
    max_tokens: int,
    seed: int,
    as_json: bool,
) -> None:
    """Score the base model and policy checkpoints on the same held-out problems with the same sampling
    seeds (a paired comparison), and print each one's mean reward and its gain over the base model."""
    from pool.evaluate import evaluate

    cps: dict[str, Path | None] = {"base": None}
    for item in checkpoints:
        label, sep, folder = item.partition("=")
        if not sep or not label or not folder:
            raise click.BadParameter(f"{item!r} is not LABEL=FOLDER", param_hint="--checkpoint")
        if label in cps:
            raise click.BadParameter(f"label {label!r} given twice", param_hint="--checkpoint")
        cps[label] = Path(folder).expanduser()
    try:
        ev = evaluate(
            model, cps, env_name=env_name, problems=problems, samples=samples, max_tokens=max_tokens, seed=seed,
            progress=None if as_json else click.echo,
        )  # fmt: skip
    except FileNotFoundError as exc:
        raise ConfigError(str(exc), "pass the folder the coordinator saved (it holds model.safetensors)") from None
    data = ev.to_dict("base")
    lines = [f"{problems} held-out {env_name} problems x {samples} samples, {ev.seconds:.0f} s"]
    for label in cps:
        line = f"  {label:>10}: mean reward {ev.mean(label):+.3f}"
        if label in data["gain_over_base"]:
            g = data["gain_over_base"][label]
            line += f"  ({g['gain']:+.3f} +- {g['se']:.3f} over base)"
        lines.append(line)
    output(Settings(None, "", None, as_json), data, lines)
