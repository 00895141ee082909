"""Every :class:`~roll.core.batch.Batch` column name, defined once.

A column's axes are in its name: ``B`` batch (rows), ``T`` tokens, ``K`` top-k, ``N`` generated positions.
Names without a suffix are non-tensor columns (one Python value per row). No other module defines a column
constant, and pipelines never spell a column as a bare string: they import this module as ``C``.

Sequences use the padded layout of the strategies (``roll.workers.types.MicroBatch``): :data:`INPUT_IDS` and
:data:`ATTENTION_MASK` hold prompt + response (left- or right-padded), :data:`RESPONSE_MASK` marks the tokens a
loss looks at. Per-token scores follow the strategies' log-prob convention: ``logp_BT[b, t]`` is the log-prob of
token ``t`` given the tokens before it, 0 where there is no prediction (padding, a row's first token).
"""

from __future__ import annotations

from typing import Final

# ---- sequences -------------------------------------------------------------------------------------------------
INPUT_IDS: Final = "input_ids_BT"
ATTENTION_MASK: Final = "attention_mask_BT"
RESPONSE_MASK: Final = "response_mask_BT"
"""The loss mask: 1 on the tokens the policy sampled (RL) or must learn (SFT on responses)."""
POSITION_IDS: Final = "position_ids_BT"
LABELS: Final = "labels_BT"
"""Unshifted targets: the token itself where the loss is taken, ``IGNORE_INDEX`` elsewhere (prompt, padding).
Since ``logp_BT[b, t]`` is the log-prob of token ``t``, ``labels_BT != IGNORE_INDEX`` is the loss mask."""
IGNORE_INDEX: Final = -100

# ---- per-token scores ------------------------------------------------------------------------------------------
LOGP: Final = "logp_BT"
"""Log-probs recomputed by a forward pass (``compute_logprobs``)."""
ENTROPY: Final = "entropy_BT"
INFER_LOGP: Final = "infer_logp_BT"
"""Log-probs the inference worker reported while sampling (0 outside the response)."""
OLD_LOGP: Final = "old_logp_BT"
"""The trainer's log-probs of the rollout policy, before the step's first optimizer step."""
REF_LOGP: Final = "ref_logp_BT"
"""The frozen reference model's per-token log-probs (KL)."""
TEACHER_LOGP: Final = "teacher_logp_BT"
"""The routed teacher's per-token log-probs (on-policy distillation)."""
VALUES: Final = "values_BT"
"""A value head's output (critic)."""
OLD_VALUES: Final = "old_values_BT"
"""The critic's values of the rollout, before the step trains it (GAE and value clipping)."""
RETURNS: Final = "returns_BT"
"""The critic's regression targets."""
ADVANTAGES: Final = "advantages_BT"
CARRIED_UNITS: Final = "carried_units_B"
"""Loss units (tokens or rows) of rows left out of a training batch because their gradient is exactly zero (every
advantage 0, no KL or entropy term), spread over the rows that stay: a loss adds them to its ``count_units``, so
the step is normalized as if those rows had been trained on."""
SEQ_UNITS: Final = "seq_units_B"
"""float: the share of one sequence a row is in the ``seq-mean-*`` loss modes: ``1/k`` for each of the ``k``
segment rows of an agentic trajectory that a chat template split. Absent: every row is one sequence."""
SEQ_TOKENS: Final = "seq_tokens_B"
"""float: the trained tokens of the sequence a row is part of (a split trajectory's, over all its segments), which
``seq-mean-token-mean`` divides the row's token sum by. Absent: each row's own."""
TOKEN_REWARDS: Final = "rewards_BT"
"""A row's reward placed on its last trained token, 0 elsewhere."""
TOPK_VALUES: Final = "topk_values_BTK"
"""Teacher logits of the ``k`` most likely next tokens at each position (raw logits, float32, descending)."""
TOPK_INDICES: Final = "topk_indices_BTK"
GENERATED_IDS: Final = "generated_ids_BN"
"""Greedy continuation tokens, ``[B, N]`` with ``N = max_new_tokens`` (stop tokens included, not cut)."""

# ---- per-row values --------------------------------------------------------------------------------------------
SCORES: Final = "scores_B"
"""A reward function's (or reward model's) score of each row."""
REWARDS: Final = "rewards_B"
"""The score after shaping (overlong penalty, clipping): what the advantage estimator sees."""
REF_SEQ_LOGP: Final = "ref_logp_B"
"""The reference model's summed response log-prob of each row (DPO)."""
DESIRABLE: Final = "desirable_B"
"""KTO: whether each row's completion is desirable (bool)."""
CORRECT: Final = "correct_B"
"""1 where the reward function judged the answer correct."""
REWARD_ERROR: Final = "reward_error_B"
"""1 where the reward function failed on the row (its score is then the domain's failure score)."""
PROMPT_INDEX: Final = "prompt_index_B"
PROMPT_SEED: Final = "prompt_seed_B"
"""int64: the seed that fixes a prompt row's samples, whatever else is generated with it or before it (see
:mod:`roll.core.seeding`)."""
SAMPLE_INDEX: Final = "sample_index_B"
"""Which of the ``n`` samples of its prompt a generated row is (0..n-1)."""
SAMPLE_ID: Final = "sample_id_B"
"""A globally unique row id; logits transfer matches teacher rows to student rows by it."""
GROUP_ID: Final = "group_id_B"
"""The group a row's advantage is normalized in (the samples of one prompt; the envs that shared a seed)."""
POLICY_VERSION: Final = "policy_version_B"
"""int64: the policy version of the weights that produced each generated row (with partial rollout, that of its
oldest token: :data:`RESPONSE_POLICY_VERSION` holds each token's)."""
SEGMENT_TOKENS: Final = "segment_tokens_B"
"""Partial rollout: the most tokens a generation request may add to each row before it hands the row back
unfinished (``finish_reason`` ``"abort"``), so a weight update can come in between (see
:mod:`roll.core.scheduler.partial`)."""
EPISODE_ID: Final = "episode_id_B"
SEGMENT: Final = "segment_B"
"""Agentic trajectory mode: which segment of its episode a row is (a chat template that rewrites history splits
a trajectory into segments; 0 otherwise)."""
STEP: Final = "step_B"
"""Agentic step mode: the turn a row is."""
ANCHOR_ID: Final = "anchor_id_B"
"""GiGPO: rows that saw the same environment state share an anchor id."""
STEP_RETURN: Final = "step_return_B"
EPISODE_RETURN: Final = "episode_return_B"

# ---- non-tensor columns ----------------------------------------------------------------------------------------
PROMPT_IDS: Final = "prompt_ids"
"""The prompt's token ids as ``list[int]``."""
PROMPT: Final = "prompt"
"""The prompt's text, as a reward function sees it."""
GROUND_TRUTH: Final = "ground_truth"
TAG: Final = "tag"
"""The row's domain: routes it to a reward domain, a teacher, or an env's metrics."""
RESPONSE_IDS: Final = "response_ids"
"""The generated token ids as ``list[int]`` (including the stop token that ended the sample)."""
RESPONSE_LOGP: Final = "response_logp"
"""``list[float]``, the log-prob of each generated token."""
FINISH_REASON: Final = "finish_reason"
"""``"stop"`` or ``"length"``; ``"abort"`` for a partial-rollout row cut at its segment (never trained on)."""
RESPONSE_POLICY_VERSION: Final = "response_policy_version"
"""``list[int]``, the policy version that sampled each generated token (partial rollout: a response continued
after a weight update spans versions)."""
RESPONSE_PREFIX_IDS: Final = "response_prefix_ids"
"""Partial rollout, sent to a generation request: the tokens a row already has (one row per sample); the request
continues it. Its log-probs and versions travel in :data:`RESPONSE_LOGP` and :data:`RESPONSE_POLICY_VERSION`."""
TEXT: Final = "text"
"""The decoded response (``None`` without a tokenizer)."""
REWARD_ERROR_REPORT: Final = "reward_error_report"
"""A :class:`~roll.core.failures.ErrorReport` where the reward could not score the row (``reward_error_B`` 1),
else ``None``; the driver shows the first of each kind with its traceback."""
REWARD_ANSWER: Final = "reward_answer"
"""The final answer the reward extracted from the response (its ``info["answer"]``, as text), else ``None``:
what a majority vote over samples (``maj@k``) counts."""
PROMPT_TRUNCATED: Final = "prompt_truncated"
"""True where the prompt was longer than ``tokenize.max_prompt_length`` (or ``max_length``) and was cut."""
SUCCESS: Final = "success"
"""Agentic: whether the episode reached the env's goal."""

# ---- images and videos (vision-language rows; ragged per row, so non-tensor columns) ---------------------------
IMAGES: Final = "images"
"""A row's images as given (PIL images, paths, bytes or ``{"bytes", "path"}`` dicts): what vLLM's
``multi_modal_data`` receives."""
VIDEOS: Final = "videos"
"""A row's videos as given: a list of videos, each a list of frames (any form :data:`IMAGES` takes) or the path
of a folder of frames or of an animated image (GIF); see :mod:`roll.data.video`."""
PIXEL_VALUES: Final = "pixel_values"
"""A row's image patches, all its images concatenated: a float tensor ``[patches, channels * patch area]`` as
the image processor flattens them (``None`` for a row without images). A model's ``pixel_values`` argument is
the concatenation over the rows of a micro-batch (:func:`roll.data.vision.collate_vision`)."""
IMAGE_GRID_THW: Final = "image_grid_thw"
"""A row's patch grid per image: a long tensor ``[images, 3]`` (temporal, height, width; ``None`` without
images). It fixes how many ``<|image_pad|>`` tokens each image fills and the 3-D rotary positions."""
PIXEL_VALUES_VIDEOS: Final = "pixel_values_videos"
"""A row's video patches, all its videos concatenated: a float tensor ``[patches, channels * temporal patch *
patch area]`` (``None`` for a row without videos); the model's ``pixel_values_videos`` argument."""
VIDEO_GRID_THW: Final = "video_grid_thw"
"""A row's patch grid per video: a long tensor ``[videos, 3]`` (``t`` = frames / temporal patch size, height,
width; ``None`` without videos). It fixes how many ``<|video_pad|>`` tokens each video fills."""
IMAGE_COLUMNS: Final = (PIXEL_VALUES, IMAGE_GRID_THW)
VIDEO_COLUMNS: Final = (PIXEL_VALUES_VIDEOS, VIDEO_GRID_THW)
VISION_COLUMNS: Final = IMAGE_COLUMNS + VIDEO_COLUMNS
"""The per-row columns a vision-language forward needs beside the token columns. A batch may hold only the image
pair (rows from a source without videos); readers treat a missing pair as ``None`` in every row."""
