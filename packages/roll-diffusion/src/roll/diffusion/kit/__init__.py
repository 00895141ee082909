"""The offline tiny diffusion kit: rendered captioned shapes, a tiny text-to-image stack warmed on them, a tiny
colour/shape scorer, and a tiny video stack of the Wan family.

- :mod:`.shapes`: the captions (``"a red circle on blue"``), their parsing, and PIL rendering (no torch).
- :mod:`.tiny`: the tiny stack built from configs (``UNet2DConditionModel``, ``AutoencoderKL``,
  ``CLIPTextModel`` with a word-level tokenizer) and its warm-up, cached as a diffusers folder.
- :mod:`.video`: the tiny Wan stack (``WanTransformer3DModel``, ``AutoencoderKLWan``, a T5 encoder), unwarmed.
- :mod:`.paths`: ``model.path: tiny-sd`` (or ``tiny-wan``) works like a hub id:
  :func:`~roll.diffusion.kit.paths.resolve_diffusion_path` maps it to the cached folder.

Nothing here downloads anything. The package holds no code of its own, so a kit module's ``from roll.diffusion.kit
import shapes`` runs nothing but ``shapes``.
"""
