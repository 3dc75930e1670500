"""Multi-turn probes: conversations built under the model's chat template, a system prompt and
facts in the first user turn, a question about one of them at a later turn, generated offline
from a seed (docs/tasks.md, "Multi-turn probes")."""
