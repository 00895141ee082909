"""RLVR's actor worker.

:class:`~roll.workers.roles.actor.ActorTrainWorker` already has everything RLVR needs (``train_with_metrics``
for the loss's own metrics, ``set_lr`` for a warm-up at its own rate, ``threads``); the name stays for readers.
"""

from __future__ import annotations

from roll.workers.roles.actor import ActorTrainWorker

RLVRActorWorker = ActorTrainWorker
