"""A backend made deliberately batch-dependent, for the noise floor's tests: transformers on the
real tiny model, with noise seeded by the batch size added to each continuation's log-likelihood.
Two setups at the same batch size get the same noise (their differences are the quantization's);
an A/A control at another batch size gets other noise, as a real engine's batch-dependent
numerics would give it. A test double for the runner's control flow, never a score's source."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from qeval.backends import BackendEntry
from qeval.backends.base import Backend, LoglikelihoodRequest, LoglikelihoodResult, Progress
from qeval.backends.hf.backend import HFBackend
from qeval.backends.hf.kv_rule import HeldKv
from qeval.config import RunConfig
from qeval.config.setups import Setup

#: nats of noise per continuation: enough to flip a multiple-choice answer now and then
NOISE = 4.0


class NoisyBackend(HFBackend):
    def loglikelihood(self, requests: list[LoglikelihoodRequest], progress: Progress) -> list[LoglikelihoodResult]:
        out = super().loglikelihood(requests, progress)
        rng = np.random.default_rng(self.batch_size)
        return [dataclasses.replace(r, logprob=r.logprob + float(rng.normal(0, NOISE))) for r in out]


def _create(cfg: RunConfig, setup: Setup, device: str) -> Backend:
    backend = NoisyBackend(cfg, setup, device)
    backend.name = "noisy"
    return backend


BACKEND = BackendEntry(
    "noisy",
    lambda setup, device: None,
    check_install=lambda cfg: None,
    worker_python=lambda cfg: sys.executable,
    create=_create,
    kv_accounting=lambda cfg, device: HeldKv(),
    control_fields=frozenset({"batch_size"}),
)
