"""Setup checks of distillation that need no model: teacher and student must tokenize identically.

A divergence compares the teacher's and the student's probability of token id ``i`` at each position, so both
must map ids to the same strings, and the sequences the teacher scores must be the ones the student trains on.
Vocabulary sizes that merely differ in padding rows are fine (models round ``vocab_size`` up); differing
tokenizers are not, and this check says which ids differ and which keys set the two tokenizers.
"""

from __future__ import annotations

from typing import Any

from roll.core.errors import ConfigError

_SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def tokenizer_differences(student: Any, teacher: Any, *, limit: int = 5) -> list[str]:
    """What differs between two tokenizers (vocabulary entries and special-token ids); empty when they match."""
    s_vocab: dict[str, int] = dict(student.get_vocab())
    t_vocab: dict[str, int] = dict(teacher.get_vocab())
    out: list[str] = []
    if len(s_vocab) != len(t_vocab):
        out.append(f"vocabulary sizes differ: student {len(s_vocab)}, teacher {len(t_vocab)}")
    diff = sorted(
        (tok for tok in s_vocab.keys() | t_vocab.keys() if s_vocab.get(tok) != t_vocab.get(tok)),
        key=lambda tok: min(s_vocab.get(tok, 1 << 62), t_vocab.get(tok, 1 << 62)),
    )
    if diff:
        shown = ", ".join(
            f"{tok!r}: student {s_vocab.get(tok)} / teacher {t_vocab.get(tok)}" for tok in diff[:limit]
        )
        out.append(f"{len(diff)} token(s) map to different ids (first: {shown})")
    for name in _SPECIAL:
        s_id, t_id = getattr(student, name, None), getattr(teacher, name, None)
        if s_id != t_id:
            out.append(f"{name} differs: student {s_id}, teacher {t_id}")
    return out


def check_same_tokenizer(
    student: Any, teacher: Any, *, student_ref: str, teacher_ref: str, student_key: str, teacher_key: str
) -> None:
    """Raise :class:`ConfigError` naming both model references and config keys when the tokenizers differ."""
    differences = tokenizer_differences(student, teacher)
    if not differences:
        return
    raise ConfigError(
        f"teacher and student tokenizers differ: {student_key}={student_ref!r} vs {teacher_key}={teacher_ref!r}: "
        f"{'; '.join(differences)}. Distillation compares the two models' distributions token id by token id, "
        f"so both need the same tokenizer: pick a teacher and a student of one model family, or point "
        f"{student_key} and {teacher_key} at the same tokenizer"
    )
