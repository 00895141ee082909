"""Helpers the offline training modes (sft, dpo, reward_model) share.

- :mod:`.feed`: :class:`~.feed.RowFeeder`, deterministic epoch-shuffled batches of row indices whose position
  is part of a checkpoint (light: no torch).
- :mod:`.data`: load, tokenize and clean rows, and turn rows into :class:`~roll.core.batch.Batch` objects.
- :mod:`.export`: the HF ``save_pretrained`` folder at the end of a run (model plus tokenizer).
- :mod:`.host`: :class:`~.host.PipelineHost`, what a part that starts clusters of its own (a teacher warm-up, an
  advantage transform) borrows from the pipeline running it.
"""
