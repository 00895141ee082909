"""The offline tokenizer: a small byte-level BPE trained here, deterministically, on the built-in task corpora.

No hub is reachable, so roll builds its own tokenizer for the tiny models (``build_tokenizer("roll-tiny")``) and
caches it under ``<cache>/tokenizers/<name>-<hash of its recipe>`` (see :mod:`roll.data._cache`).

Why it looks like Qwen2's: a saved tiny-model folder has ``config.json`` with ``model_type: qwen2``, and for that
``AutoTokenizer`` ignores ``tokenizer_class`` and instantiates ``Qwen2Tokenizer``, which rebuilds the backend
with *its own* normalizer (NFC), pre-tokenizer (the Qwen2 split regex, one digit per piece, then byte-level)
and decoder, keeping only our vocab and merges. Training with exactly that pipeline makes every loader produce
identical ids (tested), and the regex's ``\\p{N}`` alternative gives every digit its own token, which is what
makes arithmetic learnable by a tiny model.

Special tokens (ChatML style): ``<|endoftext|>`` (bos, document separator), ``<|im_start|>``, ``<|im_end|>`` (eos:
generation stops at the end of an assistant turn), ``<|pad|>`` (pad, distinct from eos so label masks never
hide the end of a turn), ``<|unk|>`` (never produced by byte-level BPE; declared because tooling expects one).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roll.core.errors import DataError
from roll.data._cache import build_once, cache_root, recipe_hash

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

# Copied from transformers' Qwen2Tokenizer; must stay identical to it (see the module docstring).
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

BOS, IM_START, IM_END, PAD, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>", "<|unk|>"
SPECIAL_TOKENS = [BOS, IM_START, IM_END, PAD, UNK]  # ids 0..4, in this order
RECIPE_FILE = "roll_recipe.json"  # written next to the tokenizer files, for people debugging a cache

# ChatML. The assistant's content and its closing <|im_end|> sit inside {% generation %}, so
# apply_chat_template(..., return_assistant_tokens_mask=True) marks exactly the tokens a model must learn to emit.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}"
    "{{- raise_exception('unknown chat role: ' + message['role']) -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}{{- message['content'] + '<|im_end|>' -}}{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Qwen3-like (written here, not copied): ChatML whose assistant turns keep their reasoning only after the last user
# query, as Qwen3's template does. An answer's reasoning is the text before its last ``</think>`` (after a
# ``<think>``); a turn after the last user query is rendered as ``<think>\n{reasoning}\n</think>\n\n{answer}``
# when it is the last message or has reasoning, every earlier turn as ``{answer}`` alone: the reasoning of past
# turns is dropped from the history. ``enable_thinking=False`` prefills an empty think block, as Qwen3's does.
# Tool results are user turns wrapped in <tool_response> that do not count as a query, as in Qwen3.
THINK_CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_query=messages|length - 1) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}"
    "{{- raise_exception('unknown chat role: ' + message['role']) -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- set content = message['content'] -%}"
    "{%- set reasoning = '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\n' -}}"
    "{%- generation -%}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}"
    "{{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}"
    "{%- else -%}{{- content -}}{%- endif -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endgeneration -%}"
    "{{- '\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}"
    "{%- endif -%}{%- endif -%}"
)
THINK_TOKENS = ("<think>", "</think>")
"""Added as single, non-special tokens (as Qwen3 has them): decoding keeps them, and they split BPE pieces."""
TEMPLATES = {"chatml": CHAT_TEMPLATE, "think": THINK_CHAT_TEMPLATE}

# General text so system prompts and instructions do not fall apart into single bytes.
_GENERAL_TEXT = """\
You are a helpful assistant. Answer the question. Think step by step, then give the final answer.
Solve the problem and put the answer at the end. Please answer with a number only. Let me think.
The answer is correct. The answer is wrong. Try again. Check your work. Show your reasoning.
What is the sum of these numbers? What is the result? Compute the value of the expression.
Which number is larger? Which number is smaller? Use the numbers to reach the target.
Each number may be used once. You may add, subtract, multiply or divide. Good job, well done.
The quick brown fox jumps over the lazy dog. A small model learns simple tasks from few examples.
"""

# Recipes by name. Everything that changes the result belongs here: the cache folder is named by its hash.
RECIPES: dict[str, dict[str, Any]] = {
    "roll-tiny": {
        "vocab_size": 512,
        "min_frequency": 2,
        "corpus": {
            "arithmetic": [[1, 150], [2, 400], [3, 400], [4, 400], [5, 400], [6, 400]],
            "compare": 400,
            "seed": 0,
        },
        "model_max_length": 2048,
        "padding_side": "right",
        "recipe_version": 1,
    },
    # The tiny VLM kit's: roll-tiny's corpus plus the shapes task, and Qwen2-VL's vision tokens as specials.
    "roll-tiny-vl": {
        "vocab_size": 576,
        "min_frequency": 2,
        "corpus": {
            "arithmetic": [[0, 80], [2, 300]],
            "compare": 100,
            "shapes": [[0, 200], [1, 200], [2, 300], [3, 300]],
            "seed": 0,
        },
        "vision": True,
        "model_max_length": 2048,
        "padding_side": "right",
        "recipe_version": 1,
    },
}
# roll-tiny's vocabulary with the Qwen3-like template and <think>/</think> tokens: a thinking model's kit.
RECIPES["roll-tiny-think"] = {**RECIPES["roll-tiny"], "template": "think"}


def _recipe(name: str) -> dict[str, Any]:
    if name not in RECIPES:
        raise DataError(f"unknown offline tokenizer {name!r}; known: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]


def _specials(name: str) -> list[str]:
    """The special tokens of tokenizer ``name``: ids 0..4 always :data:`SPECIAL_TOKENS`, then the vision tokens
    of a recipe with ``vision`` (Qwen2-VL's ``<|vision_start|>`` ..., see :mod:`roll.data.vision`)."""
    from roll.data.vision import VISION_TOKENS

    return SPECIAL_TOKENS + (list(VISION_TOKENS) if _recipe(name).get("vision") else [])


def _full_recipe(name: str) -> dict[str, Any]:
    """The recipe plus everything else that shapes the files (template, specials, library versions)."""
    return {
        "name": name,
        **_recipe(name),
        "specials": _specials(name),
        "regex": QWEN2_PRETOKENIZE_REGEX,
        "chat_template": _template(name),
        "general_text": _GENERAL_TEXT,
        "tokenizers": version("tokenizers"),
        "transformers": version("transformers"),
    }


def _template(name: str) -> str:
    """The chat template of tokenizer ``name`` (ChatML unless its recipe names another)."""
    return TEMPLATES[_recipe(name).get("template", "chatml")]


def tokenizer_path(name: str = "roll-tiny") -> Path:
    """Where the tokenizer ``name`` is (or will be) cached; nothing is built."""
    return cache_root() / "tokenizers" / f"{name}-{recipe_hash(_full_recipe(name))}"


def corpus(name: str = "roll-tiny") -> Iterator[str]:
    """The training texts of tokenizer ``name``, in a fixed order (BPE ties are then broken the same way)."""
    from roll.data.tasks import ArithmeticTask, CompareTask, ShapesTask, Task, problems

    spec = _recipe(name)["corpus"]
    # Texts are shaped like the chat template's turns ("<role>\n<content>"; the special markers are never
    # split, so they are left out) so that role names become single tokens.
    yield from (f"system\n{line}" for line in _GENERAL_TEXT.splitlines())
    yield from (f"tool\n{line}" for line in _GENERAL_TEXT.splitlines())
    jobs: list[tuple[Task, int]] = [
        (ArithmeticTask.level(level), count) for level, count in spec["arithmetic"]
    ]
    jobs.append((CompareTask(), spec["compare"]))
    jobs += [(ShapesTask.level(level), count) for level, count in spec.get("shapes", [])]
    for task, count in jobs:
        for problem in problems(task, count, seed=spec["seed"]):
            yield f"user\n{problem.prompt.replace('<image>', '')}"
            yield f"assistant\n{task.format_answer(problem.answer)}"


def _train_backend(name: str) -> Tokenizer:
    """Train the ``tokenizers`` backend with Qwen2's normalizer, pre-tokenizer and decoder."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    spec = _recipe(name)
    backend = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec["vocab_size"],
        min_frequency=spec["min_frequency"],
        special_tokens=_specials(name),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus(name), trainer=trainer)
    return backend


def _wrap(backend: Tokenizer, name: str) -> PreTrainedTokenizerFast:
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    spec = _recipe(name)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=[IM_START, *_specials(name)[len(SPECIAL_TOKENS) :]],
        chat_template=_template(name),
        model_max_length=spec["model_max_length"],
        padding_side=spec["padding_side"],  # saved only when passed here; the collator decides per use
        clean_up_tokenization_spaces=False,
    )
    if spec.get("template") == "think":
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return tokenizer


def train_tokenizer(name: str = "roll-tiny") -> PreTrainedTokenizerFast:
    """Train tokenizer ``name`` from scratch, in memory (no cache). Deterministic."""
    return _wrap(_train_backend(name), name)


def _save(tokenizer: PreTrainedTokenizerFast, folder: Path, name: str) -> None:
    tokenizer.save_pretrained(folder)
    (folder / RECIPE_FILE).write_text(json.dumps(_full_recipe(name), indent=2, sort_keys=True) + "\n")


def build_tokenizer(name: str = "roll-tiny") -> PreTrainedTokenizerFast:
    """The offline tokenizer ``name``, trained on first use and loaded from the cache afterwards.

    Always returns the object loaded from the cached folder, so the first call and every later one (and every
    process) see identical state.
    """
    from transformers import PreTrainedTokenizerFast

    path = ensure_tokenizer_files(name)
    tokenizer: PreTrainedTokenizerFast = PreTrainedTokenizerFast.from_pretrained(path)
    return tokenizer


def ensure_tokenizer_files(name: str = "roll-tiny") -> Path:
    """Make sure the cached folder of tokenizer ``name`` exists; return it."""
    return build_once(tokenizer_path(name), lambda tmp: _save(train_tokenizer(name), tmp, name))


def save_tokenizer_into(folder: Path, name: str = "roll-tiny") -> None:
    """Copy the cached tokenizer files of ``name`` into a model folder (``folder`` must exist)."""
    import shutil

    for file in ensure_tokenizer_files(name).iterdir():
        if file.is_file() and file.name != RECIPE_FILE:
            shutil.copy2(file, folder / file.name)
