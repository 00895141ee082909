"""Image and video rewards of reward-feedback learning, found through the ``roll.diffusion_reward`` group.

Why a group of its own and not ``roll.reward``: a ``roll.reward`` plugin is a reward *worker* that scores text
responses against a ground truth (math, code, judges) for the RLVR scheduler, and its scores never carry a
gradient. A diffusion reward is a tensor function ``images [B, 3, H, W] in [0, 1], prompts -> rewards [B]`` that
runs inside the trainer's process, because DRaFT/ReFL/AlignProp backpropagate through it into the denoiser.
Putting both in one group would let ``rlvr`` pick ``jpeg_compressibility`` for text (and the diffusion pipeline
pick ``math`` for images), errors the group boundary now rules out at load time; ``roll list`` shows both.
The spec type is the same :class:`roll.core.types.RewardSpec` (name, ``build(config)``, config model).

Built in (specs in :mod:`.specs`, their config models in :mod:`.config`): ``shape_alignment`` (the kit's differentiable colour/shape scorer), ``jpeg_compressibility``
(DDPO's rule reward, not differentiable), ``clip`` (CLIP image-text similarity from a local folder or hub id,
differentiable). The objects ``build`` returns follow :class:`roll.diffusion.rewards.types.ImageReward`.
"""
