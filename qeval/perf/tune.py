"""The tuner of `qeval goodput` (docs/performance.md, "Serving the workload"): per setup, the
engine settings and request rate that give the highest goodput within the SLO with the KV
cache below its limit, in the spirit of vLLM's auto-tune (benchmarks/auto_tune/auto_tune.sh in
vLLM's repository: for each max-num-seqs x max-num-batched-tokens, start the server, load it,
keep the best goodput that meets the latency target).

The search: every engine setting (max_num_seqs x max_num_batched_tokens) is one engine start;
at each, the rates are swept upwards, and the sweep stops at the first level that breaks the SLO
or the KV limit (a higher rate only queues more: latency does not come back); a level whose
KV usage was not sampled (no /metrics scrape caught a request running) is judged on the SLO
alone: an unknown reading is not measured, never a failure. Its cost is
bounded before it starts: at most len(settings) restarts and len(settings) x len(rates) levels;
`exhaustive` runs every level (the comparison in docs/benchmarks.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Measured(Protocol):
    """What the tuner reads of a measured level."""

    goodput_rps: float
    meets_slo: bool
    kv_usage_peak: float | None


@dataclass(frozen=True)
class EngineSetting:
    """The engine flags one server start runs with."""

    max_num_seqs: int
    max_num_batched_tokens: int | None = None

    def label(self) -> str:
        tail = f", max-num-batched-tokens {self.max_num_batched_tokens}" if self.max_num_batched_tokens else ""
        return f"max-num-seqs {self.max_num_seqs}{tail}"


L = TypeVar("L", bound=Measured)
#: starts a server with a setting and yields the function that measures one rate on it
Engine = Callable[[EngineSetting], AbstractContextManager[Callable[[float], L]]]


@dataclass
class Search(Generic[L]):
    """Every level measured, in order, and the pick."""

    levels: list[tuple[EngineSetting, float, L]] = field(default_factory=list)
    restarts: int = 0
    bound_restarts: int = 0
    bound_levels: int = 0
    #: index into levels of the best admissible one, None when no level meets the SLO
    pick: int | None = None


def settings_of(max_num_seqs: list[int], max_num_batched_tokens: list[int | None]) -> list[EngineSetting]:
    """The grid, smallest first."""
    return [EngineSetting(s, b) for s in sorted(max_num_seqs) for b in max_num_batched_tokens]


def admissible(level: Measured, kv_limit: float) -> bool:
    """Meets the SLO with the KV cache's peak usage under `kv_limit`. A usage not sampled (None:
    every /metrics scrape missed the level's running requests) is not measured: the level is
    judged on the SLO alone, never failed for it."""
    return level.meets_slo and (level.kv_usage_peak is None or level.kv_usage_peak < kv_limit)


def best(levels: list[tuple[EngineSetting, float, L]], kv_limit: float) -> int | None:
    """The admissible level with the highest goodput; ties: fewer max-num-seqs (less memory), lower rate."""
    ok = [i for i, (_, _, lv) in enumerate(levels) if admissible(lv, kv_limit)]
    if not ok:
        return None
    return max(ok, key=lambda i: (levels[i][2].goodput_rps, -levels[i][0].max_num_seqs, -levels[i][1]))


def search(
    settings: list[EngineSetting],
    rates: list[float],
    engine: Engine[L],
    kv_limit: float,
    exhaustive: bool = False,
    on_level: Callable[[EngineSetting, float, L], None] | None = None,
) -> Search[L]:
    """Run the module docstring's search: `engine(setting)` starts a server and yields a
    function that measures one rate on it."""
    out: Search[L] = Search(bound_restarts=len(settings), bound_levels=len(settings) * len(rates))
    for setting in settings:
        out.restarts += 1
        with engine(setting) as measure:
            for rate in sorted(rates):
                level = measure(rate)
                out.levels.append((setting, rate, level))
                if on_level is not None:
                    on_level(setting, rate, level)
                if not exhaustive and not admissible(level, kv_limit):
                    break
    out.pick = best(out.levels, kv_limit)
    return out


def replay(table: dict[tuple[int, float], L]) -> Engine[L]:
    """An `engine` for `search` that answers from measured levels (keyed by max_num_seqs and
    rate): the tuner's pick on an exhaustive sweep's measurements, without measuring again."""
    from contextlib import contextmanager

    @contextmanager
    def engine(setting: EngineSetting) -> Iterator[Callable[[float], L]]:
        yield lambda rate: table[(setting.max_num_seqs, rate)]

    return engine
