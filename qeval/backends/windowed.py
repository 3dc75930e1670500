"""What the vllm and openai backends share: both score by sending an engine whole prompts (context
plus the tokens to score) and reading its top-k log-probs, so a continuation and a rolling window
become results the same way; only how one batch of prompts is scored differs."""

from __future__ import annotations

import numpy as np

from qeval.backends.base import (
    LoglikelihoodRequest,
    LoglikelihoodResult,
    Progress,
    RollingRequest,
    RollingResult,
    document_windows,
    encoded_requests,
    window_result,
    window_results,
)
from qeval.backends.tokens import Conventions
from qeval.config import RunConfig
from qeval.config.setups import Setup

#: (prompt tokens, index of the first scored token, how many tokens are scored)
Prompt = tuple[list[int], int, int]


class WindowedBackend:
    """A backend that scores prompts whole on an engine: a subclass gives `_scored`, and its `load`
    sets `conv` (the tokeniser's conventions)."""

    conv: Conventions

    def __init__(self, cfg: RunConfig, setup: Setup, device: str) -> None:
        self.cfg, self.setup, self.device = cfg, setup, device
        self.max_length = cfg.model.max_context

    def _scored(self, prompts: list[Prompt], progress: Progress | None) -> list[tuple[np.ndarray, ...]]:
        """Each prompt's (token log-probs, top-k ids, top-k log-probs) over its scored tokens; one
        progress step per prompt where `progress` is given."""
        raise NotImplementedError

    def loglikelihood(self, requests: list[LoglikelihoodRequest], progress: Progress) -> list[LoglikelihoodResult]:
        """Each request's continuation scored after its context."""
        pairs = encoded_requests(self.conv, requests, self.max_length)
        outs = self._scored([(ctx + cont, len(ctx), len(cont)) for ctx, cont in pairs], progress)
        return [
            window_result(req, len(cont), *arrays) for req, (_, cont), arrays in zip(requests, pairs, outs, strict=True)
        ]

    def loglikelihood_rolling(self, requests: list[RollingRequest], progress: Progress) -> list[RollingResult]:
        """Each request's text scored whole, window by window."""
        # the engine is sent context + every predicted token (prompt_logprobs reads a token's log-prob
        # at its own position) and asked for one new token: two more than the windows' length. Windows
        # two shorter keep that within max_model_len (as lm-eval's vllm model does; a document of
        # max_context tokens was refused by the engine). Shorter documents get the hf backend's windows.
        windows = document_windows(self.conv, requests, self.max_length - 2)
        outs = self._scored([(ctx + pred, len(ctx), len(pred)) for _, ctx, pred in windows], None)
        progress(len(requests))
        return window_results(requests, windows, outs)
