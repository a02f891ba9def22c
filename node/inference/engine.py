"""Inference engines: vLLM for the worker's rollouts (`VllmEngine`, here) and the validator's prefill
(`VllmPrefill` here, `HfPrefill` in `hf`); the data they exchange is in `types`.

TOPLOC proofs are built from the final hidden states (after the last RMSNorm) of the positions that
*produced* each generated token, and a validator recomputes those states with one prefill pass over
prompt + completion. So the worker's engine must hand out, for every completion, exactly those states:

* for a prompt of length P, generated token j (0-based) was sampled from the logits of position P-1+j,
  so `Completion.hidden[j]` is the state at position P-1+j, and `HfPrefill` returns the same rows;
* the state of the last generated token itself is never computed by the generator (no forward pass
  follows it) and is not part of the proof.

vLLM 0.32 has no public output for per-token hidden states during generation, so `VllmEngine` wraps the
V1 model runner's `_model_forward` inside the worker (via `LLM.collective_rpc`) and records, per internal
request, the positions and returned states of every forward step. Internal request ids are
`<our request id>-<8 hex>`; we add requests with our own ids, so the mapping back is a suffix strip.

Logprobs: `Completion.logprobs[j]` is vLLM's `raw_logprobs` mode (pinned explicitly): the log-softmax of
the model's raw logits at position P-1+j, i.e. temperature 1 with no top-k/top-p renormalization,
regardless of the sampling temperature. That is the quantity `HfPrefill.logprobs` recomputes, so a
validator can compare them directly (and RL losses that need the behaviour policy's tempered probability
must apply the temperature themselves).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from node.rollout.exact import sample_seed

if TYPE_CHECKING:
    from vllm import LLM


from .capture import _assemble_hidden, _eager_token_ranks, _install_capture, _pop_captured
from .hf import HfPrefill
from .lifetime import _configure_vllm_env, _open_llm, _shutdown_llm
from .types import _TORCH_DTYPES, Completion, ContextTooShort, DType, Prefill, SamplingSpec, completion_seed

# `node.inference.gumbel` (it imports vLLM, so vLLM loads it by name after the environment is set)
EXACT_PROCESSOR = "node.inference.gumbel:ExactSampler"
EXACT_KEY = "intellect_exact"


def _tokens_input(tokens: list[int]) -> Any:
    """A token-id prompt in vLLM's engine-input form (the raw {"prompt_token_ids"} dict is deprecated)."""
    try:
        from vllm.inputs.engine import tokens_input
    except ImportError:  # older vLLM
        return {"prompt_token_ids": tokens}
    return tokens_input(tokens)


def _gpu_available() -> bool:
    return torch.cuda.is_available()


# --- functions run inside the vLLM worker via collective_rpc (module level: picklable by reference) ---


class VllmEngine:
    """A real vLLM `LLM` that also returns each completion's final hidden states.

    `cpu_threads` (CPU only; None leaves torch's setting) is the process-wide torch intra-op thread
    count, set before vLLM starts: after start vLLM turns `torch.set_num_threads` into a no-op for the
    rest of the process.

    Prefer one engine per process (vLLM keeps process-global state; a second `LLM`, e.g. `VllmPrefill`,
    does work next to it on CPU). Speculative decoding must stay off (the capture assumes every
    computed position is kept). On CPU it runs in-process with eager execution and
    no prefix caching (prefix caching would skip the forward pass over shared prompt prefixes, which is
    harmless for the captured rows but makes timing and memory less predictable; and a reload must never
    serve KV computed with old weights). On a GPU machine the same class drives the `vllm` package with
    its defaults (CUDA graphs allowed, multiprocess engine core).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: DType = "float32",
        seed: int = 0,
        max_model_len: int = 2048,
        gpu: bool | None = None,
        enforce_eager: bool | None = None,
        gpu_memory_utilization: float = 0.85,
        max_num_seqs: int | None = None,
        cpu_threads: int | None = 1,
    ) -> None:
        if dtype not in _TORCH_DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_TORCH_DTYPES)}, got {dtype!r}")
        self.gpu = _gpu_available() if gpu is None else gpu
        _configure_vllm_env(self.gpu)
        if not self.gpu and cpu_threads is not None:
            # vLLM means to run CPU serving with 1 intra-op thread, but its in-process worker disables
            # torch.set_num_threads (replaced by a warning) before it gets to that, so the process keeps
            # one OpenMP thread per core. Each op then waits for its slowest thread: with anything else
            # busy on one of 2 cores, decoding ran 10-20x slower (tiny: 12 vs 226 tok/s). Set it first.
            torch.set_num_threads(cpu_threads)
        self.model_dir = Path(model_dir)
        self.dtype = dtype
        self.cpu_threads = cpu_threads
        kwargs: dict[str, Any] = {
            "model": str(self.model_dir),
            "dtype": dtype,
            "seed": seed,
            "max_model_len": max_model_len,
            "enforce_eager": (not self.gpu) if enforce_eager is None else enforce_eager,
            "enable_prefix_caching": False,
            "logprobs_mode": "raw_logprobs",
            "disable_log_stats": True,
            "logits_processors": [EXACT_PROCESSOR],  # exact sampling, for the requests that ask for it
        }
        if not self.gpu:
            # No partial prefills: when a step's token budget cuts a prompt, vLLM discards that
            # request's sampled token and rewinds its seeded generator, which CPU generators cannot
            # do ("CPU Generator does not use offset"), so a large seeded batch would crash.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(max_model_len, 8192)
        if self.gpu:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if max_num_seqs is not None:
            kwargs["max_num_seqs"] = max_num_seqs
        self._llm: LLM | None = _open_llm(**kwargs)  # after the environment is set
        model_config = self._llm.llm_engine.model_config
        self.hidden_size: int = int(model_config.get_hidden_size())
        self.vocab_size: int = int(model_config.get_vocab_size())
        self.max_model_len: int = int(model_config.max_model_len)
        if not self.gpu:
            self._llm.collective_rpc(_eager_token_ranks)
        self._llm.collective_rpc(_install_capture)
        self._calls = 0

    def _pin_threads(self) -> None:
        """Give the calling thread the engine's OpenMP thread count.

        The OpenMP thread count is per calling thread, and a daemon calls the engine from whichever
        worker thread `trio.to_thread` picks: vLLM's CPU attention checks that the count matches the one
        its metadata was built with ("thread_num == thread_num (2 vs. 1)") and aborts otherwise. vLLM
        replaced `torch.set_num_threads` with a no-op warning, so this uses the underlying setter."""
        if not self.gpu and self.cpu_threads is not None:
            torch._C.set_num_threads(self.cpu_threads)

    @property
    def llm(self) -> LLM:
        if self._llm is None:
            raise RuntimeError("engine is closed")
        return self._llm

    def _sampling_params(self, spec: SamplingSpec, seed: int) -> Any:
        """vLLM's parameters for one completion: its own seeded generator, or, for exact sampling, a
        greedy request whose every token the `ExactSampler` draws from `seed` (see `gumbel`)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        exact: dict[str, Any] | None = None
        if spec.exact:
            if spec.temperature <= 0:
                raise ValueError("exact sampling needs a positive temperature (greedy decoding is exact already)")
            exact = {"temperature": spec.temperature, "top_p": spec.top_p, "top_k": spec.top_k, "seed": seed}
        return SamplingParams(
            n=1,
            temperature=0.0 if exact else spec.temperature,
            top_p=1.0 if exact else spec.top_p,
            top_k=0 if exact or spec.top_k in (-1, 0) else spec.top_k,
            max_tokens=spec.max_tokens,
            seed=None if exact else seed,
            extra_args={EXACT_KEY: exact} if exact else None,
            stop_token_ids=list(spec.stop_token_ids) if spec.stop_token_ids else None,
            logprobs=0,  # just the sampled token's logprob
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def generate(self, prompts: list[list[int]], sampling: SamplingSpec, n: int = 1) -> list[list[Completion]]:
        """Sample `n` completions for each prompt (token ids in, token ids out), with hidden states.

        All prompts x samples go to vLLM as one batch of independent requests, completion (i, j) seeded
        with `completion_seed(sampling.seed, i, j)` (exact sampling: drawn with `sample_seed(sampling.seed,
        i, j)`, so prompt i must be the task's group i); the result is indexed [prompt][sample].
        """
        if n < 1:
            raise ValueError("n must be >= 1")
        from vllm import RequestOutput

        llm = self.llm
        self._pin_threads()
        self._calls += 1
        engine = llm.llm_engine
        tag = f"icn{self._calls}"
        order: dict[str, tuple[int, int]] = {}
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {i} is empty")
            if len(prompt) + sampling.max_tokens > self.max_model_len:
                # vLLM would stop at the context's end with finish 'length' before max_tokens: a truncated
                # completion, which validators judge as cheating; such work is not done at all
                raise ContextTooShort(
                    f"prompt {i} has {len(prompt)} tokens and up to {sampling.max_tokens} more may be generated; "
                    f"the engine's context is {self.max_model_len}"
                )
            if min(prompt) < 0 or max(prompt) >= self.vocab_size:
                raise ValueError(f"prompt {i} has token ids outside the vocabulary [0, {self.vocab_size})")
        outputs: list[RequestOutput] = []
        done = False
        try:
            for i, prompt in enumerate(prompts):
                for j in range(n):
                    rid = f"{tag}-{i}-{j}"
                    engine.add_request(
                        rid,
                        _tokens_input(list(prompt)),
                        self._sampling_params(
                            sampling,
                            sample_seed(sampling.seed, i, j)
                            if sampling.exact
                            else completion_seed(sampling.seed, i, j),
                        ),
                    )
                    order[rid] = (i, j)
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if isinstance(out, RequestOutput) and out.finished:
                        outputs.append(out)
            done = True
        finally:
            if not done and order:  # failed or interrupted: leave no requests behind for the next call
                engine.abort_request(list(order))
            captured = llm.collective_rpc(_pop_captured)[0]
        by_external: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for internal_id, pieces in captured.items():
            by_external.setdefault(internal_id.rsplit("-", 1)[0], []).extend(pieces)

        result: list[list[Completion | None]] = [[None] * n for _ in prompts]
        for out in outputs:
            if out.request_id not in order:
                continue
            i, j = order[out.request_id]
            seq = out.outputs[0]
            tokens = list(seq.token_ids)
            if seq.logprobs is None or len(seq.logprobs) != len(tokens):
                raise RuntimeError(f"vLLM returned no logprobs for request {out.request_id}")
            logprobs = [float(seq.logprobs[k][tok].logprob) for k, tok in enumerate(tokens)]
            p = len(prompts[i])
            hidden = (
                _assemble_hidden(by_external.get(out.request_id, []), p - 1, len(tokens), self.hidden_size)
                if tokens
                else torch.empty(0, self.hidden_size)
            )
            reason = seq.finish_reason or "length"
            result[i][j] = Completion(
                prompt_tokens=list(prompts[i]),
                tokens=tokens,
                logprobs=logprobs,
                finish_reason="length" if reason == "length" else "stop",
                hidden=hidden,
            )
        missing = [(i, j) for i, row in enumerate(result) for j, c in enumerate(row) if c is None]
        if missing:
            raise RuntimeError(f"vLLM returned no output for completions {missing[:8]}")
        return [[c for c in row if c is not None] for row in result]

    def reload_weights(self, weights: str | Path | Mapping[str, torch.Tensor]) -> None:
        """Replace the weights in place, without restarting the engine (~0.1 s for the tiny model).

        `weights` is a model folder with safetensors in HF checkpoint naming, a single .safetensors file,
        or a state dict (HF names). A folder goes to vLLM's own loader (`weights_path`); a state dict is
        streamed in-process (`weights_iterator`), or, with a multiprocess engine core that cannot receive
        an iterator, written to a temporary folder first. Prefix/KV caches are reset afterwards so no
        state computed with the old weights is reused.
        """
        llm = self.llm
        self._pin_threads()
        if isinstance(weights, (str, Path)):
            path = Path(weights)
            if path.is_dir():
                llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
                llm.reset_prefix_cache()
                return
            from safetensors.torch import load_file

            weights = load_file(str(path))
        state = dict(weights)
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0":
            llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items())})
        else:
            from safetensors.torch import save_file

            with tempfile.TemporaryDirectory(prefix="intellect-reload-") as tmp:
                save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, f"{tmp}/model.safetensors")
                llm.collective_rpc("reload_weights", kwargs={"weights_path": tmp})
        llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down and free its memory (KV cache, weights). Safe to call twice."""
        llm, self._llm = self._llm, None
        if llm is not None:
            _shutdown_llm(llm, self.gpu)

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class VllmPrefill:
    """The validator's recomputation with vLLM's pooling runner, where vLLM is installed.

    A second engine (`runner="pooling"`, per-token embeddings = final-norm hidden states, no activation)
    returns the states for every position in one pass. It yields hidden states only (no logits), so it
    serves TOPLOC checks; logprob checks use `HfPrefill`. Give it a process of its own: in-process vLLM
    engines share global parallel state, and closing one breaks any other engine in that process.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: DType = "float32",
        max_model_len: int = 1024,
        gpu: bool | None = None,
        cpu_threads: int | None = 1,
    ) -> None:
        self.gpu = _gpu_available() if gpu is None else gpu
        _configure_vllm_env(self.gpu)
        if not self.gpu and cpu_threads is not None:
            torch.set_num_threads(cpu_threads)  # see VllmEngine
        from vllm.config import PoolerConfig

        self._llm: LLM | None = _open_llm(
            model=str(model_dir),
            runner="pooling",
            convert="embed",
            pooler_config=PoolerConfig(task="token_embed", tok_pooling_type="ALL", use_activation=False),
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=not self.gpu,
            enable_prefix_caching=False,
            disable_log_stats=True,
        )

    def prefill_hidden(self, pairs: Iterable[tuple[Sequence[int], Sequence[int]]]) -> list[torch.Tensor]:
        """[T, H] float32 hidden states per (prompt, completion), rows as in `Completion.hidden`."""
        if self._llm is None:
            raise RuntimeError("engine is closed")
        items = [(list(p), list(c)) for p, c in pairs]
        prompts: list[Any] = [{"prompt_token_ids": p + c[:-1]} for p, c in items]
        outs = self._llm.encode(prompts, pooling_task="token_embed", use_tqdm=False)
        result = []
        for (p, c), out in zip(items, outs, strict=True):
            data = out.outputs.data
            result.append(data[len(p) - 1 : len(p) - 1 + len(c)].to(torch.float32).clone())
        return result

    def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            _shutdown_llm(llm, self.gpu)


__all__: list[str] = [
    "Completion",
    "ContextTooShort",
    "HfPrefill",
    "Prefill",
    "SamplingSpec",
    "VllmEngine",
    "VllmPrefill",
    "completion_seed",
]
