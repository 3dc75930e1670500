"""Long-context tasks: passkey retrieval, a RULER-style multi-key needle and
perplexity by token position, generated offline at a list of lengths (docs/tasks.md,
"Long-context tasks")."""

from qeval.tasks.longctx.config import FAMILIES, LongContextSpec

__all__ = ["FAMILIES", "LongContextSpec"]
